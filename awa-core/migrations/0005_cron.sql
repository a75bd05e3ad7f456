-- Awa schema version 5: periodic (cron) jobs.
-- One row per named schedule. Clients upsert their registrations at start; the maintenance
-- leader enqueues each due fire in the transaction that advances last_enqueued_at with a
-- compare-and-set, so one fire time is never enqueued twice (see docs/periodic.md).
-- Re-runnable (IF NOT EXISTS), like the migrations before it.

CREATE TABLE IF NOT EXISTS awa.cron_jobs (
    name               text        PRIMARY KEY,
    cron_expr          text        NOT NULL,
    timezone           text        NOT NULL DEFAULT 'UTC',
    kind               text        NOT NULL,
    queue              text        NOT NULL DEFAULT 'default',
    args               jsonb       NOT NULL DEFAULT '{}'::jsonb,
    priority           smallint    NOT NULL DEFAULT 2,
    max_attempts       integer     NOT NULL DEFAULT 25,
    tags               text[]      NOT NULL DEFAULT '{}',
    metadata           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    missed_fire_policy text        NOT NULL DEFAULT 'coalesce',
    paused             boolean     NOT NULL DEFAULT false,
    -- The newest fire time handled (enqueued, or collapsed by coalesce); NULL before the first.
    last_enqueued_at   timestamptz,
    -- When the leader next needs to look at this row (NULL: at its next evaluation).
    next_fire_at       timestamptz,
    created_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT awa_cron_jobs_name_check CHECK (char_length(name) BETWEEN 1 AND 200),
    CONSTRAINT awa_cron_jobs_kind_check CHECK (char_length(kind) BETWEEN 1 AND 200),
    CONSTRAINT awa_cron_jobs_queue_check CHECK (char_length(queue) BETWEEN 1 AND 200),
    CONSTRAINT awa_cron_jobs_priority_check CHECK (priority BETWEEN 1 AND 4),
    CONSTRAINT awa_cron_jobs_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT awa_cron_jobs_tags_check CHECK (cardinality(tags) <= 20),
    CONSTRAINT awa_cron_jobs_metadata_check CHECK (jsonb_typeof(metadata) = 'object'),
    CONSTRAINT awa_cron_jobs_policy_check CHECK (missed_fire_policy IN ('coalesce', 'catch_up'))
);
