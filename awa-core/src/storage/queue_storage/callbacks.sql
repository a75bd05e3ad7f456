-- Queue storage's external callbacks (ADR-021, issue 18): what canonical keeps in a job's row
-- (`callback_id`, its timeout, CEL rules and a delivered result) lives in the attempt's lease.
-- A lease row is the attempt's guard: whatever deletes it owns the attempt's outcome, so a
-- resolution that completes, fails or retries deletes the lease, as a completion does, and
-- the runtime's own late finalization of that attempt then finds nothing.
--
-- `CREATE OR REPLACE` and run by every install call, as admin.sql.

-- Substrates installed before the callbacks' columns existed get them (checked first: an
-- ALTER TABLE locks the leases out even when it has nothing to add).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = '{s}.leases'::regclass AND attname = 'callback_result'
                     AND NOT attisdropped) THEN
        ALTER TABLE {s}.leases ADD COLUMN callback_rules jsonb, ADD COLUMN callback_result jsonb;
    END IF;
END $$;

-- Register a callback for the running attempt (p_id, p_lease): a new callback id, its timeout,
-- and the CEL rules given (stored with the id, so they apply to this callback only). NULL when
-- the attempt is no longer running under that lease.
CREATE OR REPLACE FUNCTION {s}.qs_register_callback_with(p_id bigint, p_lease bigint,
                                                         p_timeout interval, p_rules jsonb)
RETURNS text LANGUAGE sql AS $$
    WITH new AS (SELECT gen_random_uuid() AS cid)
    UPDATE {s}.leases l SET callback_id = new.cid, callback_timeout_at = now() + p_timeout,
        callback_result = NULL,
        callback_rules = CASE WHEN p_rules IS NULL THEN NULL
                              ELSE p_rules || jsonb_build_object('callback_id', new.cid::text) END
    FROM new
    WHERE l.id = p_id AND l.run_lease = p_lease AND NOT l.waiting
    RETURNING new.cid::text
$$;

-- The CEL rules of the callback p_cid, locked for its resolution: (found, rules), rules NULL
-- when it has none; no row when no attempt waits on it.
CREATE OR REPLACE FUNCTION {s}.qs_callback_rules(p_cid uuid)
RETURNS TABLE (id bigint, rules jsonb) LANGUAGE sql AS $$
    SELECT l.id, CASE WHEN l.callback_rules->>'callback_id' = l.callback_id::text
                      THEN l.callback_rules - 'callback_id' END
    FROM {s}.leases l WHERE l.callback_id = p_cid
    FOR UPDATE
$$;

-- Resolve the callback p_cid: 'complete' (a receipt), 'fail' (a done entry with p_error),
-- 'retry' (the job available again, the attempt kept: the next claim counts the next one),
-- 'resume' (a parked job available again with the payload under
-- metadata._awa_callback_result and its attempt undone; a handler waiting in
-- `wait_for_callback` gets the payload in its lease and runs on), or 'heartbeat' (the timeout
-- moved to p_timeout from now). Returns the job's id and the queue to wake (NULL when none),
-- or no row when no attempt waits on p_cid.
CREATE OR REPLACE FUNCTION {s}.qs_resolve_callback(p_cid uuid, p_action text, p_payload jsonb,
                                                   p_error text, p_timeout interval)
RETURNS TABLE (id bigint, wake text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    l {s}.leases;
    e {s}.ready_entries;
    cur record;
BEGIN
    IF p_action NOT IN ('complete', 'fail', 'retry', 'resume', 'heartbeat') THEN
        RAISE EXCEPTION 'unknown callback action %', p_action USING ERRCODE = '22023';
    END IF;
    -- The lease parent first, as every statement on leases (the rings' lock order).
    LOCK TABLE ONLY {s}.leases IN ROW EXCLUSIVE MODE;
    SELECT x.* INTO l FROM {s}.leases x WHERE x.callback_id = p_cid FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_action = 'heartbeat' THEN
        UPDATE {s}.leases x SET callback_timeout_at = now() + p_timeout
        WHERE x.id = l.id AND x.run_lease = l.run_lease;
        RETURN QUERY SELECT l.id, NULL::text;
        RETURN;
    END IF;
    IF p_action = 'resume' AND NOT l.waiting THEN
        -- A handler waits in-process: the payload goes to its lease; it runs on.
        UPDATE {s}.leases x SET callback_result = jsonb_build_object(
                'callback_id', p_cid::text, 'payload', coalesce(p_payload, 'null'::jsonb)),
            callback_id = NULL, callback_timeout_at = NULL
        WHERE x.id = l.id AND x.run_lease = l.run_lease;
        RETURN QUERY SELECT l.id, NULL::text;
        RETURN;
    END IF;
    DELETE FROM {s}.leases x WHERE x.id = l.id AND x.run_lease = l.run_lease;
    SELECT y.* INTO e FROM {s}.ready_entries y
    WHERE y.slot = l.slot AND y.queue = l.queue AND y.priority = l.priority AND y.seq = l.seq;
    IF p_action = 'complete' THEN
        INSERT INTO {s}.receipts (slot, generation, seqs, finalized_at)
        VALUES (l.slot, l.generation, ARRAY[l.seq], now());
        RETURN QUERY SELECT l.id, NULL::text;
        RETURN;
    END IF;
    IF p_action = 'fail' THEN
        INSERT INTO {s}.done_entries (slot, generation, seq, state, errors, finalized_at, progress)
        VALUES (l.slot, l.generation, l.seq, 'failed',
                e.errors || jsonb_build_array(jsonb_build_object(
                    'attempt', l.attempt, 'at', now(), 'error', p_error)),
                now(), l.progress);
        RETURN QUERY SELECT l.id, NULL::text;
        RETURN;
    END IF;
    -- 'retry', or 'resume' of a parked job: appended again, available now.
    SELECT * INTO cur FROM {s}.qs_current_slot();
    INSERT INTO {s}.ready_entries (slot, generation, queue, priority, id, kind, args, attempt,
        max_attempts, run_lease, run_at, created_at, metadata, tags, errors, unique_key,
        unique_states, ordering_key, progress)
    VALUES (cur.slot, cur.generation, e.queue, e.priority, e.id, e.kind, e.args,
            CASE WHEN p_action = 'retry' THEN l.attempt ELSE greatest(l.attempt - 1, 0) END,
            e.max_attempts, l.run_lease, now(), e.created_at,
            CASE WHEN p_action = 'resume'
                 THEN e.metadata || jsonb_build_object('_awa_callback_result',
                                                       coalesce(p_payload, 'null'::jsonb))
                 ELSE e.metadata END,
            e.tags, e.errors, e.unique_key, e.unique_states, e.ordering_key, l.progress);
    RETURN QUERY SELECT l.id, e.queue;
END $$;

-- An in-handler wait of attempt (p_id, p_lease) on callback p_cid takes its delivered payload:
-- the payload (a JSON value, 'null' included) when one was waiting, else no row.
CREATE OR REPLACE FUNCTION {s}.qs_take_callback_result(p_id bigint, p_lease bigint, p_cid text)
RETURNS TABLE (payload jsonb) LANGUAGE sql AS $$
    WITH o AS (
        SELECT x.id, x.run_lease, x.callback_result AS old FROM {s}.leases x
        WHERE x.id = p_id AND x.run_lease = p_lease AND NOT x.waiting
          AND x.callback_result->>'callback_id' = p_cid
        FOR UPDATE
    )
    UPDATE {s}.leases l SET callback_result = NULL FROM o
    WHERE l.id = o.id AND l.run_lease = o.run_lease
    RETURNING o.old->'payload'
$$;
