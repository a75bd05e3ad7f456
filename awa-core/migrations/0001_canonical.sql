-- Awa canonical schema, version 1.
-- Every rule the insert validator checks is also enforced here, so nothing that bypasses the
-- validator (raw SQL, another client) can store a row the engine cannot handle.

CREATE TABLE awa.jobs (
    id                  bigserial PRIMARY KEY,
    kind                text        NOT NULL,
    queue               text        NOT NULL DEFAULT 'default',
    args                jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state               text        NOT NULL DEFAULT 'available',
    priority            smallint    NOT NULL DEFAULT 2,
    attempt             integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL DEFAULT 25,
    run_at              timestamptz NOT NULL DEFAULT now(),
    heartbeat_at        timestamptz,
    deadline_at         timestamptz,
    attempted_at        timestamptz,
    finalized_at        timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    errors              jsonb       NOT NULL DEFAULT '[]'::jsonb,
    metadata            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    tags                text[]      NOT NULL DEFAULT '{}',
    unique_key          bytea,
    unique_states       smallint,
    callback_id         uuid,
    callback_timeout_at timestamptz,
    run_lease           bigint      NOT NULL DEFAULT 0,
    progress            jsonb,
    ordering_key        text,
    CONSTRAINT awa_jobs_state_check CHECK (state IN ('scheduled', 'available', 'running',
        'completed', 'retryable', 'failed', 'cancelled', 'waiting_external')),
    CONSTRAINT awa_jobs_priority_check CHECK (priority BETWEEN 1 AND 4),
    CONSTRAINT awa_jobs_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT awa_jobs_kind_check CHECK (char_length(kind) BETWEEN 1 AND 200),
    CONSTRAINT awa_jobs_queue_check CHECK (char_length(queue) BETWEEN 1 AND 200),
    CONSTRAINT awa_jobs_ordering_key_check CHECK (char_length(ordering_key) <= 200),
    CONSTRAINT awa_jobs_tags_check CHECK (cardinality(tags) <= 20),
    CONSTRAINT awa_jobs_run_at_check
        CHECK (run_at >= '0001-01-01 00:00:00+00' AND run_at < '10000-01-01 00:00:00+00'),
    CONSTRAINT awa_jobs_metadata_check CHECK (jsonb_typeof(metadata) = 'object'),
    CONSTRAINT awa_jobs_unique_check CHECK ((unique_key IS NULL) = (unique_states IS NULL))
);

-- The bit of a state in a unique-states mask; the same numbering as awa_core::JobState::bit.
CREATE FUNCTION awa.state_bit(state text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE state
        WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2 WHEN 'running' THEN 4
        WHEN 'completed' THEN 8 WHEN 'retryable' THEN 16 WHEN 'failed' THEN 32
        WHEN 'cancelled' THEN 64 WHEN 'waiting_external' THEN 128 ELSE 0 END)::smallint
$$;

-- Deduplication: one row per unique key among rows whose state is in their own mask.
CREATE UNIQUE INDEX idx_awa_jobs_unique ON awa.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND (unique_states & awa.state_bit(state)) <> 0;

-- Claim order: priority, run_at, id among available jobs of a queue.
CREATE INDEX idx_awa_jobs_claim ON awa.jobs (queue, priority, run_at, id)
    WHERE state = 'available';
-- Promotion of due scheduled and retryable jobs.
CREATE INDEX idx_awa_jobs_promote ON awa.jobs (run_at) WHERE state IN ('scheduled', 'retryable');
-- Rescue of running jobs with stale heartbeats or passed deadlines.
CREATE INDEX idx_awa_jobs_running ON awa.jobs (heartbeat_at) WHERE state = 'running';
-- Callback lookups and timeouts.
CREATE UNIQUE INDEX idx_awa_jobs_callback ON awa.jobs (callback_id) WHERE callback_id IS NOT NULL;
-- Retention pruning and admin listing of finished jobs.
CREATE INDEX idx_awa_jobs_finalized ON awa.jobs (state, finalized_at)
    WHERE state IN ('completed', 'failed', 'cancelled');
CREATE INDEX idx_awa_jobs_kind ON awa.jobs (kind);

-- The LISTEN/NOTIFY channel of a queue: 'awa:<queue>', or 'awa:md5:<hash>' when that would
-- pass PostgreSQL's 63-byte identifier limit (queue names may have 200 characters).
CREATE FUNCTION awa.queue_channel(queue text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(queue) <= 59 THEN 'awa:' || queue ELSE 'awa:md5:' || md5(queue) END
$$;

-- Wake-up hint: one NOTIFY per queue that received due available jobs in a statement.
CREATE FUNCTION awa.notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_rows n WHERE n.state = 'available' LOOP
        PERFORM pg_notify(awa.queue_channel(q), '');
    END LOOP;
    RETURN NULL;
END
$$;
CREATE TRIGGER awa_jobs_notify AFTER INSERT ON awa.jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION awa.notify_inserted();

-- Per-queue settings shared by every client: pause flag and dead-letter opt-in.
CREATE TABLE awa.queue_meta (
    queue       text PRIMARY KEY,
    paused      boolean     NOT NULL DEFAULT false,
    dlq_enabled boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Dead-letter queue: failed jobs moved out of awa.jobs with why and under which lease.
CREATE TABLE awa.jobs_dlq (
    id                  bigint PRIMARY KEY,
    kind                text        NOT NULL,
    queue               text        NOT NULL,
    args                jsonb       NOT NULL,
    priority            smallint    NOT NULL,
    attempt             integer     NOT NULL,
    max_attempts        integer     NOT NULL,
    created_at          timestamptz NOT NULL,
    errors              jsonb       NOT NULL,
    metadata            jsonb       NOT NULL,
    tags                text[]      NOT NULL,
    ordering_key        text,
    progress            jsonb,
    reason              text        NOT NULL,
    original_run_lease  bigint      NOT NULL,
    dlq_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_awa_jobs_dlq_queue ON awa.jobs_dlq (queue, dlq_at);
