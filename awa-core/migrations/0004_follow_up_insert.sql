-- Awa schema, version 4.
-- One follow-up insert inside a completion transaction, in one round trip.
--
-- A unique follow-up is inserted in a PL/pgSQL block with an exception handler, which
-- PostgreSQL runs as a subtransaction: exactly a savepoint, rolled back on a conflict on
-- idx_awa_jobs_unique (the follow-up is skipped, NULL is returned and the completion goes on)
-- and released otherwise. Any other error propagates and rolls the completion back. Done in
-- the client, the same savepoint costs three round trips (SAVEPOINT, INSERT, RELEASE) per
-- follow-up; here it is one. `p_defer_notify` sets awa.defer_notify for the transaction
-- first (migration 3), so the finalizer wakes the queues after its commit.
CREATE OR REPLACE FUNCTION awa.insert_follow_up(
    p_kind text, p_queue text, p_args jsonb, p_priority smallint, p_max_attempts integer,
    p_run_at timestamptz, p_tags text[], p_metadata jsonb, p_unique_key bytea,
    p_unique_states smallint, p_ordering_key text, p_defer_notify boolean
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_constraint text;
BEGIN
    IF p_defer_notify THEN
        PERFORM set_config('awa.defer_notify', 'on', true);
    END IF;
    IF p_unique_key IS NULL THEN
        INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, run_at, tags,
                              metadata, unique_key, unique_states, ordering_key)
        VALUES (p_kind, p_queue, p_args,
                CASE WHEN p_run_at IS NULL OR p_run_at <= now() THEN 'available' ELSE 'scheduled' END,
                p_priority, p_max_attempts, coalesce(p_run_at, now()), p_tags, p_metadata,
                NULL, NULL, p_ordering_key)
        RETURNING id INTO v_id;
        RETURN v_id;
    END IF;
    BEGIN
        INSERT INTO awa.jobs (kind, queue, args, state, priority, max_attempts, run_at, tags,
                              metadata, unique_key, unique_states, ordering_key)
        VALUES (p_kind, p_queue, p_args,
                CASE WHEN p_run_at IS NULL OR p_run_at <= now() THEN 'available' ELSE 'scheduled' END,
                p_priority, p_max_attempts, coalesce(p_run_at, now()), p_tags, p_metadata,
                p_unique_key, p_unique_states, p_ordering_key)
        RETURNING id INTO v_id;
        RETURN v_id;
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
        IF v_constraint IS DISTINCT FROM 'idx_awa_jobs_unique' THEN
            RAISE;
        END IF;
        RETURN NULL;
    END;
END
$$;

-- A Completed finalization with follow-ups as one statement: the lease-guarded completion,
-- then each follow-up through awa.insert_follow_up, in order (registered specs first, then
-- the staged ones, as the caller passes them). Run on its own it is one implicit transaction
-- and one round trip: the completion and its follow-ups commit together or not at all.
-- Returns NULL when the guard (id, run_lease, state = 'running') matches no row (a stale
-- attempt: nothing is written); otherwise one element per follow-up, its id or NULL when it
-- was skipped as a duplicate. `p_tags` holds each follow-up's tags as a JSON array.
CREATE OR REPLACE FUNCTION awa.complete_with_follow_ups(
    p_id bigint, p_lease bigint,
    p_kind text[], p_queue text[], p_args jsonb[], p_priority smallint[],
    p_max_attempts integer[], p_run_at timestamptz[], p_tags jsonb[], p_metadata jsonb[],
    p_unique_key bytea[], p_unique_states smallint[], p_ordering_key text[],
    p_defer_notify boolean
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[] := '{}';
BEGIN
    UPDATE awa.jobs
    SET state = 'completed', finalized_at = now(), progress = NULL, heartbeat_at = NULL,
        callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL
    WHERE id = p_id AND run_lease = p_lease AND state = 'running';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(p_kind), 0) LOOP
        v_ids := array_append(v_ids, awa.insert_follow_up(
            p_kind[i], p_queue[i], p_args[i], p_priority[i], p_max_attempts[i], p_run_at[i],
            ARRAY(SELECT jsonb_array_elements_text(p_tags[i])), p_metadata[i],
            p_unique_key[i], p_unique_states[i], p_ordering_key[i], p_defer_notify));
    END LOOP;
    RETURN v_ids;
END
$$;
