-- Storage transition: which engine new jobs go to, and the live move from canonical to queue storage
-- (issue 18; docs/storage-transition.md). Table, column and function names and
-- the error texts follow awa-pg 0.6.9's, so operators' SQL and runbooks written for it work here.
--
-- States: 'canonical' (everything on awa.jobs), 'prepared' (a queue-storage schema is named and
-- may be installed; writes still go to canonical), 'mixed_transition' (new writes go to queue
-- storage; runtimes started earlier keep draining canonical), 'active' (queue storage only).
-- Two guards make a stale route fail instead of stranding a job: canonical refuses inserts once
-- queue storage is active (`awa_jobs_route_guard`), and a queue-storage schema refuses inserts
-- once a transition to it was aborted (`awa.storage_route_check`, called by its insert trigger).
-- Re-runnable.

CREATE TABLE IF NOT EXISTS awa.storage_transition_state (
    singleton        boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    current_engine   text        NOT NULL,
    prepared_engine  text,
    state            text        NOT NULL
        CHECK (state IN ('canonical', 'prepared', 'mixed_transition', 'active')),
    transition_epoch bigint      NOT NULL DEFAULT 0,
    details          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    entered_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finalized_at     timestamptz,
    CONSTRAINT storage_transition_prepared_engine CHECK (
        state NOT IN ('prepared', 'mixed_transition') OR prepared_engine IS NOT NULL)
);
INSERT INTO awa.storage_transition_state
    (singleton, current_engine, prepared_engine, state, transition_epoch, details)
VALUES (true, 'canonical', NULL, 'canonical', 0, '{}')
ON CONFLICT (singleton) DO NOTHING;

-- The schema each non-canonical backend lives in, once routing has reached it.
CREATE TABLE IF NOT EXISTS awa.runtime_storage_backends (
    backend     text        PRIMARY KEY,
    schema_name text        NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- What each running client can work and how it takes part in a transition.
ALTER TABLE awa.runtime_instances
    ADD COLUMN IF NOT EXISTS storage_capability text NOT NULL DEFAULT 'canonical',
    ADD COLUMN IF NOT EXISTS transition_role text NOT NULL DEFAULT 'auto';

-- The engine new writes go to.
CREATE OR REPLACE FUNCTION awa.active_storage_engine() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.state IN ('mixed_transition', 'active')
                THEN coalesce(s.prepared_engine, s.current_engine)
                ELSE s.current_engine END
    FROM awa.storage_transition_state s
$$;

-- The schema new writes go to when that engine is queue storage, else NULL.
CREATE OR REPLACE FUNCTION awa.active_queue_storage_schema() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN awa.active_storage_engine() = 'queue_storage'
                THEN coalesce(s.details ->> 'schema',
                              (SELECT b.schema_name FROM awa.runtime_storage_backends b
                               WHERE b.backend = 'queue_storage'),
                              'awa')
           END
    FROM awa.storage_transition_state s
$$;

-- Whether a runtime counts as live for a transition: refreshed within three of its intervals,
-- and at least 30 s.
CREATE OR REPLACE FUNCTION awa.storage_runtime_live(r awa.runtime_instances) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT r.last_seen_at + greatest(make_interval(secs => 3 * r.snapshot_interval_ms / 1000.0),
                                     interval '30 seconds') >= now()
$$;

-- Live runtimes by capability and role; NULL matches any.
CREATE OR REPLACE FUNCTION awa.storage_live_runtimes(p_capability text, p_role text DEFAULT NULL)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM awa.runtime_instances r
    WHERE awa.storage_runtime_live(r)
      AND (p_capability IS NULL OR r.storage_capability = p_capability)
      AND (p_role IS NULL OR r.transition_role = p_role)
$$;

-- Canonical jobs that still need a runtime: the backlog a finalize waits for.
CREATE OR REPLACE FUNCTION awa.canonical_live_backlog() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM awa.jobs
    WHERE state IN ('available', 'scheduled', 'retryable', 'running', 'waiting_external')
$$;

-- The state as `awa.storage_status()` and every transition step return it.
DO $$ BEGIN
    CREATE TYPE awa.storage_status_row AS (
        current_engine text, active_engine text, prepared_engine text, state text,
        transition_epoch bigint, details jsonb, entered_at timestamptz, updated_at timestamptz,
        finalized_at timestamptz);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

CREATE OR REPLACE FUNCTION awa.storage_status()
RETURNS SETOF awa.storage_status_row
LANGUAGE sql STABLE AS $$
    SELECT s.current_engine, awa.active_storage_engine(), s.prepared_engine, s.state,
           s.transition_epoch, s.details, s.entered_at, s.updated_at, s.finalized_at
    FROM awa.storage_transition_state s
$$;

-- Name the engine to move to (and its settings, e.g. {"schema": "awa"}); writes do not move yet.
CREATE OR REPLACE FUNCTION awa.storage_prepare(p_engine text, p_details jsonb DEFAULT '{}'::jsonb)
RETURNS SETOF awa.storage_status_row
LANGUAGE plpgsql AS $$
DECLARE
    cur awa.storage_transition_state;
BEGIN
    SELECT * INTO cur FROM awa.storage_transition_state FOR UPDATE;
    IF p_engine IS NULL OR btrim(p_engine) = '' THEN
        RAISE EXCEPTION 'storage engine must not be blank' USING ERRCODE = '22023';
    END IF;
    IF p_engine <> 'queue_storage' THEN
        RAISE EXCEPTION 'unknown storage engine "%" (expected "queue_storage")', p_engine
            USING ERRCODE = '22023';
    END IF;
    IF p_engine = cur.current_engine THEN
        RAISE EXCEPTION 'storage engine "%" is already active', p_engine USING ERRCODE = '55000';
    END IF;
    IF cur.state NOT IN ('canonical', 'prepared') THEN
        RAISE EXCEPTION 'storage prepare is only allowed from canonical or prepared state'
            USING ERRCODE = '55000';
    END IF;
    IF jsonb_typeof(coalesce(p_details, '{}'::jsonb)) <> 'object' THEN
        RAISE EXCEPTION 'storage prepare details must be a JSON object' USING ERRCODE = '22023';
    END IF;
    UPDATE awa.storage_transition_state
    SET prepared_engine = p_engine, state = 'prepared',
        details = coalesce(p_details, '{}'::jsonb),
        entered_at = CASE WHEN cur.state = 'prepared' THEN cur.entered_at ELSE now() END,
        updated_at = now();
    RETURN QUERY SELECT * FROM awa.storage_status();
END $$;

-- Route new writes to the prepared engine; runtimes started before keep draining canonical.
CREATE OR REPLACE FUNCTION awa.storage_enter_mixed_transition()
RETURNS SETOF awa.storage_status_row
LANGUAGE plpgsql AS $$
DECLARE
    cur awa.storage_transition_state;
    v_schema text;
    v_n bigint;
BEGIN
    SELECT * INTO cur FROM awa.storage_transition_state FOR UPDATE;
    IF cur.state <> 'prepared' THEN
        RAISE EXCEPTION 'storage enter-mixed-transition is only allowed from prepared state'
            USING ERRCODE = '55000';
    END IF;
    v_schema := coalesce(cur.details ->> 'schema', 'awa');
    IF to_regclass(format('%I.queue_ring_state', v_schema)) IS NULL
       OR to_regprocedure(format('%I.qs_jobs_live()', v_schema)) IS NULL THEN
        RAISE EXCEPTION 'queue storage schema "%" is not prepared', v_schema
            USING ERRCODE = '55000';
    END IF;
    v_n := awa.storage_live_runtimes('canonical');
    IF v_n > 0 THEN
        RAISE EXCEPTION 'cannot enter mixed transition while % canonical-only runtime(s) are still live', v_n
            USING ERRCODE = '55000';
    END IF;
    IF awa.storage_live_runtimes('queue_storage', 'queue_storage_target') = 0 THEN
        RAISE EXCEPTION 'cannot enter mixed transition without a live runtime running with transition_role=queue_storage_target; auto-role runtimes downgrade to drain-only after routing flips'
            USING ERRCODE = '55000';
    END IF;
    UPDATE awa.storage_transition_state
    SET state = 'mixed_transition', transition_epoch = cur.transition_epoch + 1,
        details = cur.details || jsonb_build_object('schema', v_schema),
        entered_at = now(), updated_at = now();
    INSERT INTO awa.runtime_storage_backends (backend, schema_name)
    VALUES (cur.prepared_engine, v_schema)
    ON CONFLICT (backend) DO UPDATE SET schema_name = excluded.schema_name, updated_at = now();
    RETURN QUERY SELECT * FROM awa.storage_status();
END $$;

-- Make queue storage the only engine once canonical holds nothing live. The SHARE lock on
-- awa.jobs waits for canonical inserts in flight and holds new ones until this commits, after
-- which the route guard turns them away: no job reaches canonical behind the backlog check.
CREATE OR REPLACE FUNCTION awa.storage_finalize()
RETURNS SETOF awa.storage_status_row
LANGUAGE plpgsql AS $$
DECLARE
    cur awa.storage_transition_state;
    v_n bigint;
BEGIN
    SELECT * INTO cur FROM awa.storage_transition_state FOR UPDATE;
    IF cur.state <> 'mixed_transition' THEN
        RAISE EXCEPTION 'storage finalize is only allowed from mixed_transition state'
            USING ERRCODE = '55000';
    END IF;
    LOCK TABLE awa.jobs IN SHARE MODE;
    v_n := awa.canonical_live_backlog();
    IF v_n > 0 THEN
        RAISE EXCEPTION 'cannot finalize while canonical live backlog is %', v_n
            USING ERRCODE = '55000';
    END IF;
    v_n := awa.storage_live_runtimes('canonical');
    IF v_n > 0 THEN
        RAISE EXCEPTION 'cannot finalize while % canonical-only runtime(s) are still live', v_n
            USING ERRCODE = '55000';
    END IF;
    UPDATE awa.storage_transition_state
    SET current_engine = cur.prepared_engine, state = 'active',
        transition_epoch = cur.transition_epoch + 1, entered_at = now(), updated_at = now(),
        finalized_at = now();
    RETURN QUERY SELECT * FROM awa.storage_status();
END $$;

-- Go back to canonical from prepared or mixed_transition. From mixed, only while queue storage
-- holds nothing live and no runtime works it (its tables are locked for the check, so an insert
-- in flight is either counted or, after this commits, refused by the schema's route check).
CREATE OR REPLACE FUNCTION awa.storage_abort()
RETURNS SETOF awa.storage_status_row
LANGUAGE plpgsql AS $$
DECLARE
    cur awa.storage_transition_state;
    v_schema text;
    v_n bigint;
BEGIN
    SELECT * INTO cur FROM awa.storage_transition_state FOR UPDATE;
    IF cur.state NOT IN ('prepared', 'mixed_transition') THEN
        RAISE EXCEPTION 'storage abort is only allowed from prepared or mixed_transition state'
            USING ERRCODE = '55000';
    END IF;
    IF cur.state = 'mixed_transition' THEN
        v_n := awa.storage_live_runtimes('queue_storage');
        IF v_n > 0 THEN
            RAISE EXCEPTION 'cannot abort mixed transition while % queue-storage runtime(s) are still live', v_n
                USING ERRCODE = '55000';
        END IF;
        v_schema := coalesce(cur.details ->> 'schema', 'awa');
        EXECUTE format('LOCK TABLE %I.ready_entries, %I.deferred_jobs IN SHARE MODE',
                       v_schema, v_schema);
        EXECUTE format('SELECT %I.qs_jobs_live()', v_schema) INTO v_n;
        IF v_n > 0 THEN
            RAISE EXCEPTION 'cannot abort mixed transition while queue storage contains % row(s)', v_n
                USING ERRCODE = '55000';
        END IF;
    END IF;
    UPDATE awa.storage_transition_state
    SET prepared_engine = NULL, state = 'canonical', details = '{}'::jsonb,
        transition_epoch = cur.transition_epoch
            + CASE WHEN cur.state = 'mixed_transition' THEN 1 ELSE 0 END,
        entered_at = now(), updated_at = now();
    DELETE FROM awa.runtime_storage_backends WHERE backend = 'queue_storage';
    RETURN QUERY SELECT * FROM awa.storage_status();
END $$;

-- Canonical takes no new jobs once queue storage is the only engine (SQLSTATE AWR01: the
-- client reads the route again and writes to queue storage).
CREATE OR REPLACE FUNCTION awa.jobs_route_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM awa.storage_transition_state
               WHERE state = 'active' AND current_engine <> 'canonical') THEN
        RAISE EXCEPTION 'awa.jobs takes no new jobs: the active storage engine is queue storage'
            USING ERRCODE = 'AWR01';
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS awa_jobs_route_guard ON awa.jobs;
CREATE TRIGGER awa_jobs_route_guard BEFORE INSERT ON awa.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa.jobs_route_guard();

-- A queue-storage schema takes new jobs unless routing has moved away from it: another schema
-- is active, or a transition to it was aborted (canonical after an epoch > 0). A schema used
-- directly, before any transition, is left alone (the engine's own tests do that).
CREATE OR REPLACE FUNCTION awa.storage_route_check(p_schema text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    cur awa.storage_transition_state;
BEGIN
    SELECT * INTO cur FROM awa.storage_transition_state;
    IF (cur.state IN ('mixed_transition', 'active')
        AND awa.active_queue_storage_schema() IS DISTINCT FROM p_schema)
       OR (cur.state = 'canonical' AND cur.transition_epoch > 0) THEN
        RAISE EXCEPTION 'queue storage schema "%" takes no new jobs: the active storage engine is %',
            p_schema, awa.active_storage_engine()
            USING ERRCODE = 'AWR01';
    END IF;
END $$;

-- One job from `awa.bridge` (the application's own connection and transaction), on the engine
-- new jobs go to: canonical's insert, or the active queue-storage schema's `qs_enqueue`. The
-- parameters are validated by the library first; returns the new job as JSON text with the
-- columns `id, kind, queue, args, state, priority, attempt, max_attempts, run_at, created_at,
-- metadata, tags` (on queue storage built from what was inserted: the view finds an entry by
-- id only by scanning).
CREATE OR REPLACE FUNCTION awa.driver_insert(p_kind text, p_queue text, p_args jsonb,
                                             p_priority smallint, p_max_attempts integer,
                                             p_run_at timestamptz, p_tags jsonb, p_metadata jsonb,
                                             p_unique_key bytea, p_unique_states smallint,
                                             p_ordering_key text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_schema text := awa.active_queue_storage_schema();
    v_id bigint;
    v_job text;
BEGIN
    IF v_schema IS NULL THEN
        INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, run_at, tags,
                              metadata, unique_key, unique_states, ordering_key)
        VALUES (p_kind, p_queue, p_args,
                CASE WHEN p_run_at IS NULL OR p_run_at <= now() THEN 'available' ELSE 'scheduled' END,
                p_priority, p_max_attempts, coalesce(p_run_at, now()),
                ARRAY(SELECT jsonb_array_elements_text(p_tags)), p_metadata, p_unique_key,
                p_unique_states, p_ordering_key)
        RETURNING CAST(json_build_object(
            'id', id, 'kind', kind, 'queue', queue, 'args', args, 'state', state,
            'priority', priority, 'attempt', attempt, 'max_attempts', max_attempts,
            'run_at', run_at, 'created_at', created_at, 'metadata', metadata, 'tags', tags) AS text)
        INTO v_job;
        RETURN v_job;
    END IF;
    EXECUTE format('SELECT * FROM %I.qs_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)',
                   v_schema)
    INTO v_id
    USING ARRAY[p_kind], ARRAY[p_queue], ARRAY[p_args], ARRAY[p_priority], ARRAY[p_max_attempts],
          ARRAY[p_run_at], ARRAY[p_tags], ARRAY[p_metadata], ARRAY[p_unique_key],
          ARRAY[p_unique_states], ARRAY[p_ordering_key];
    RETURN CAST(json_build_object(
        'id', v_id, 'kind', p_kind, 'queue', p_queue, 'args', p_args,
        'state', CASE WHEN p_run_at IS NULL OR p_run_at <= now() THEN 'available' ELSE 'scheduled' END,
        'priority', p_priority, 'attempt', 0, 'max_attempts', p_max_attempts,
        'run_at', coalesce(p_run_at, now()), 'created_at', now(), 'metadata', p_metadata,
        'tags', ARRAY(SELECT jsonb_array_elements_text(p_tags))) AS text);
END $$;
