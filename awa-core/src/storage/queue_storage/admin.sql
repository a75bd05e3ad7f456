-- Queue storage's operator actions and test-harness claim (issue 18): what canonical does with
-- an UPDATE or DELETE of `awa.jobs`, done without updating a ready entry in place.
--
-- `CREATE OR REPLACE`, and run by every install call (mod.rs): a substrate installed before a
-- function here existed gets it the next time the substrate is installed or prepared.
--
-- Two moves carry them:
-- - a finished attempt's done entry is deleted: its ready entry is then consumed with no lease,
--   receipt or done entry, which `qs_jobs` shows as nothing (the job's next entry, if any, is
--   what it shows). Only these admin paths delete a done entry; the hot path never does.
-- - a job is made available by appending a new ready entry (same id) to the current slot, as
--   promotion does.

-- Take unique key p_key for job p_id entering a state of its mask (p_state): refused as
-- canonical refuses it (unique_violation on "idx_awa_jobs_unique") when another job holds the
-- key in one of that job's unique states; nothing to do when the state is outside the mask.
CREATE OR REPLACE FUNCTION {s}.qs_take_key(p_key bytea, p_id bigint, p_mask smallint, p_state text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    holder {s}.unique_keys;
BEGIN
    IF p_key IS NULL OR (p_mask & awa.state_bit(p_state)) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO {s}.unique_keys (unique_key, id, unique_states) VALUES (p_key, p_id, p_mask)
    ON CONFLICT (unique_key) DO NOTHING;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO holder FROM {s}.unique_keys u WHERE u.unique_key = p_key FOR UPDATE;
    IF holder.id <> p_id AND {s}.qs_key_held(holder.id, holder.unique_states) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "idx_awa_jobs_unique"'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'idx_awa_jobs_unique';
    END IF;
    UPDATE {s}.unique_keys SET id = p_id, unique_states = p_mask WHERE unique_key = p_key;
END $$;

-- Retry a job now, as canonical's admin retry: a failed or cancelled job (its done entry goes)
-- or a scheduled or retryable one (its deferred row goes) is appended again, available now,
-- with max_attempts raised to allow one more attempt (at most 1000). Returns 'retried', else
-- the job's state (which cannot be retried: 'available' too, when a concurrent retry won), or
-- NULL when the substrate does not hold it.
CREATE OR REPLACE FUNCTION {s}.qs_retry(p_id bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    cur record;
    d {s}.deferred_jobs;
    e {s}.ready_entries;
    done {s}.done_entries;
    st text;
BEGIN
    SELECT * INTO cur FROM {s}.qs_current_slot();
    DELETE FROM {s}.deferred_jobs x WHERE x.id = p_id RETURNING x.* INTO d;
    IF FOUND THEN
        PERFORM {s}.qs_take_key(d.unique_key, d.id, d.unique_states, 'available');
        INSERT INTO {s}.ready_entries (slot, generation, queue, priority, id, kind, args,
            attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
            unique_key, unique_states, ordering_key, progress)
        VALUES (cur.slot, cur.generation, d.queue, d.priority, d.id, d.kind, d.args, d.attempt,
                greatest(d.max_attempts, least(d.attempt + 1, 1000)), d.run_lease, now(),
                d.created_at, d.metadata, d.tags, d.errors, d.unique_key, d.unique_states,
                d.ordering_key, d.progress);
        PERFORM pg_notify(awa.queue_channel(d.queue), '');
        RETURN 'retried';
    END IF;
    -- Failed or cancelled: the entry of its last attempt has a done entry. The delete is the
    -- guard against a concurrent retry (the second one finds nothing to delete).
    SELECT y.* INTO e FROM {s}.ready_entries y
    JOIN {s}.done_entries z ON z.slot = y.slot AND z.seq = y.seq
    WHERE y.id = p_id ORDER BY y.seq DESC LIMIT 1;
    IF FOUND THEN
        DELETE FROM {s}.done_entries z WHERE z.slot = e.slot AND z.seq = e.seq
        RETURNING z.* INTO done;
        IF FOUND THEN
            PERFORM {s}.qs_take_key(e.unique_key, e.id, e.unique_states, 'available');
            -- A finished attempt counts: attempt and run lease as `qs_jobs` showed them.
            INSERT INTO {s}.ready_entries (slot, generation, queue, priority, id, kind, args,
                attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
                unique_key, unique_states, ordering_key, progress)
            VALUES (cur.slot, cur.generation, e.queue, e.priority, e.id, e.kind, e.args,
                    e.attempt + done.ran::int,
                    greatest(e.max_attempts, least(e.attempt + done.ran::int + 1, 1000)),
                    e.run_lease + done.ran::int, now(), e.created_at, e.metadata, e.tags, done.errors,
                    e.unique_key, e.unique_states, e.ordering_key, done.progress);
            PERFORM pg_notify(awa.queue_channel(e.queue), '');
            RETURN 'retried';
        END IF;
    END IF;
    SELECT j.state INTO st FROM {s}.qs_jobs j WHERE j.id = p_id;
    RETURN st;
END $$;

-- Delete failed jobs of p_kind (optionally only in p_queue): their done entries go, and with
-- them the jobs. Returns the ids deleted.
CREATE OR REPLACE FUNCTION {s}.qs_discard_failed(p_kind text, p_queue text)
RETURNS SETOF bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM {s}.done_entries z USING {s}.ready_entries y
        WHERE z.state = 'failed' AND y.slot = z.slot AND y.seq = z.seq AND y.kind = p_kind
          AND (p_queue IS NULL OR y.queue = p_queue)
        RETURNING y.id
    ), keys AS (
        DELETE FROM {s}.unique_keys u USING gone g WHERE u.id = g.id
    )
    SELECT g.id FROM gone g
$$;

-- Claim the oldest available job of p_kind in p_queue (best priority first) for the test
-- harness (`work_one`): the entry is consumed and leased as a claim (`qs_claim_queue`) leases
-- it, without moving the lane's cursor (claims skip consumed entries; the cursor passes it
-- later).
CREATE OR REPLACE FUNCTION {s}.qs_claim_kind(p_queue text, p_kind text, p_deadline interval)
RETURNS TABLE (id bigint, kind text, queue text, args jsonb, state text, priority smallint,
               attempt integer, max_attempts integer, run_at timestamptz,
               heartbeat_at timestamptz, deadline_at timestamptz, attempted_at timestamptz,
               finalized_at timestamptz, created_at timestamptz, errors jsonb, metadata jsonb,
               tags text[], unique_key bytea, unique_states smallint, callback_id text,
               callback_timeout_at timestamptz, run_lease bigint, progress jsonb,
               ordering_key text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    e {s}.ready_entries;
    lslot integer;
    c bigint;
    t0 timestamptz := now();
BEGIN
    IF EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused) THEN
        RETURN;
    END IF;
    -- The lock order of qs_claim_queue: leases, then the lane.
    LOCK TABLE ONLY {s}.leases IN ROW EXCLUSIVE MODE;
    FOR pr IN 1 .. 4 LOOP
        c := {s}.qs_lane_cursor(p_queue, pr);
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM {s}.ready_entries y
            WHERE y.queue = p_queue AND y.priority = pr AND y.seq >= c AND y.kind = p_kind
              AND NOT EXISTS (SELECT 1 FROM {s}.claimed_entries x
                              WHERE x.queue = y.queue AND x.priority = y.priority
                                AND x.seq = y.seq));
        INSERT INTO {s}.lanes (queue, priority) VALUES (p_queue, pr) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM {s}.lanes l WHERE l.queue = p_queue AND l.priority = pr FOR UPDATE;
        -- Looked up again under the lane's lock: a claim may have taken it meanwhile (and
        -- moved the cursor past it without a claimed entry).
        c := {s}.qs_lane_cursor(p_queue, pr);
        SELECT y.* INTO e FROM {s}.ready_entries y
        WHERE y.queue = p_queue AND y.priority = pr AND y.seq >= c AND y.kind = p_kind
          AND NOT EXISTS (SELECT 1 FROM {s}.claimed_entries x
                          WHERE x.queue = y.queue AND x.priority = y.priority AND x.seq = y.seq)
        ORDER BY y.seq LIMIT 1;
        CONTINUE WHEN NOT FOUND;
        SELECT r.current INTO lslot FROM {s}.lease_ring_state r;
        INSERT INTO {s}.claimed_entries (slot, queue, priority, seq)
        VALUES (e.slot, e.queue, e.priority, e.seq);
        INSERT INTO {s}.leases (lease_slot, id, run_lease, queue, priority, slot, generation, seq,
                                attempt, heartbeat_at, deadline_at, attempted_at, progress)
        VALUES (lslot, e.id, e.run_lease + 1, e.queue, e.priority, e.slot, e.generation, e.seq,
                e.attempt + 1, t0, t0 + p_deadline, t0, e.progress);
        RETURN QUERY SELECT e.id, e.kind, e.queue, e.args, 'running'::text, e.priority,
            e.attempt + 1, e.max_attempts, e.run_at, t0, t0 + p_deadline, t0,
            NULL::timestamptz, e.created_at, e.errors, e.metadata, e.tags, e.unique_key,
            e.unique_states, NULL::text, NULL::timestamptz, e.run_lease + 1, e.progress,
            e.ordering_key;
        RETURN;
    END LOOP;
END $$;

-- Move the failed jobs among p_ids into the dead-letter queue (`awa.jobs_dlq`, shared with
-- canonical), their done entries deleted; with p_only_enabled, only those of queues whose
-- failed jobs go there (`awa.queue_meta.dlq_enabled`). The reason is p_reason, or when NULL
-- the job's last error. Returns the ids moved.
CREATE OR REPLACE FUNCTION {s}.qs_move_to_dlq(p_ids bigint[], p_reason text,
                                              p_only_enabled boolean DEFAULT false)
RETURNS SETOF bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM {s}.done_entries z USING {s}.ready_entries y
        WHERE z.state = 'failed' AND y.slot = z.slot AND y.seq = z.seq AND y.id = ANY (p_ids)
          AND (NOT p_only_enabled OR EXISTS (
                   SELECT 1 FROM awa.queue_meta m WHERE m.queue = y.queue AND m.dlq_enabled))
        RETURNING y.id, y.kind, y.queue, y.args, y.priority, y.attempt + z.ran::int AS attempt,
                  y.max_attempts, y.created_at, y.run_at, z.finalized_at, z.errors, y.metadata,
                  y.tags, y.ordering_key, y.run_lease + z.ran::int AS run_lease, z.progress,
                  y.unique_key, y.unique_states
    ), keys AS (
        DELETE FROM {s}.unique_keys u USING gone g WHERE u.id = g.id
    ), moved AS (
        INSERT INTO awa.jobs_dlq (id, kind, queue, args, priority, attempt, max_attempts,
                                  created_at, run_at, finalized_at, errors, metadata, tags,
                                  ordering_key, progress, reason, original_run_lease, unique_key,
                                  unique_states)
        SELECT g.id, g.kind, g.queue, g.args, g.priority, g.attempt, g.max_attempts,
               g.created_at, g.run_at, g.finalized_at, g.errors, g.metadata, g.tags,
               g.ordering_key, g.progress,
               coalesce(p_reason, g.errors -> -1 ->> 'error', 'failed'), g.run_lease,
               g.unique_key, g.unique_states
        FROM gone g
        RETURNING id
    )
    SELECT m.id FROM moved m
$$;

-- Put dead-lettered jobs back as fresh jobs on this engine (awa's revive: attempts reset,
-- same id, run lease and unique key: the key is taken again, refused as an insert's is when
-- another job holds it; rows dead-lettered before migration 14 have none), with the overrides given (NULL keeps
-- the stored queue and priority; the run time defaults to now, and a later one schedules
-- the job). Returns the ids revived.
CREATE OR REPLACE FUNCTION {s}.qs_revive(p_ids bigint[], p_run_at timestamptz,
                                         p_priority smallint, p_queue text)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur record;
    revived bigint[];
    queues text[];
    keyed jsonb;
    k jsonb;
BEGIN
    SELECT * INTO cur FROM {s}.qs_current_slot();
    WITH moved AS (
        DELETE FROM awa.jobs_dlq d WHERE d.id = ANY (p_ids) RETURNING d.*
    ), x AS (
        SELECT m.*, coalesce(p_queue, m.queue) AS to_queue,
               coalesce(p_priority, m.priority) AS to_priority,
               coalesce(p_run_at, now()) AS to_run_at
        FROM moved m
    ), ready AS (
        INSERT INTO {s}.ready_entries (slot, generation, queue, priority, seq, id, kind, args,
            attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
            unique_key, unique_states, ordering_key, progress)
        SELECT cur.slot, cur.generation, x.to_queue, x.to_priority, nextval('{s}.qs_seq'), x.id,
               x.kind, x.args, 0, x.max_attempts, x.original_run_lease, x.to_run_at,
               x.created_at, x.metadata, x.tags, x.errors, x.unique_key, x.unique_states,
               x.ordering_key, x.progress
        FROM (SELECT * FROM x WHERE x.to_run_at <= now() ORDER BY x.id) x
        RETURNING queue
    ), later AS (
        INSERT INTO {s}.deferred_jobs (id, state, queue, priority, kind, args, attempt,
            max_attempts, run_lease, run_at, created_at, metadata, tags, errors, unique_key,
            unique_states, ordering_key, progress)
        SELECT x.id, 'scheduled', x.to_queue, x.to_priority, x.kind, x.args, 0, x.max_attempts,
               x.original_run_lease, x.to_run_at, x.created_at, x.metadata, x.tags, x.errors,
               x.unique_key, x.unique_states, x.ordering_key, x.progress
        FROM x WHERE x.to_run_at > now()
    )
    SELECT coalesce((SELECT array_agg(x.id ORDER BY x.id) FROM x), '{}'),
           coalesce((SELECT array_agg(DISTINCT r.queue) FROM ready r), '{}'),
           (SELECT jsonb_agg(jsonb_build_object(
                       'id', x.id, 'key', encode(x.unique_key, 'hex'), 'mask', x.unique_states,
                       'state', CASE WHEN x.to_run_at > now() THEN 'scheduled' ELSE 'available' END)
                   ORDER BY x.id)
            FROM x WHERE x.unique_key IS NOT NULL)
    INTO revived, queues, keyed;
    -- The revived jobs take their keys back (in id order, as inserts take theirs).
    FOR k IN SELECT * FROM jsonb_array_elements(coalesce(keyed, '[]'))
    LOOP
        PERFORM {s}.qs_take_key(decode(k ->> 'key', 'hex'), (k ->> 'id')::bigint,
                                (k ->> 'mask')::smallint, k ->> 'state');
    END LOOP;
    PERFORM pg_notify(awa.queue_channel(q), '') FROM unnest(queues) AS q;
    RETURN QUERY SELECT unnest(revived);
END $$;

-- A durable batch operation's change (`set_priority`, `move_queue`) to the queued jobs among
-- p_ids: a scheduled job's deferred row is changed in place; an available job's entry is
-- consumed and appended again with the new queue and priority (same id, attempt and run
-- lease). Only jobs that really change are written. Lanes are locked in (queue, priority)
-- order, the order a claim takes a queue's lanes in, so a chunk and a claim cannot deadlock.
-- Returns each job changed with its queue and state.
CREATE OR REPLACE FUNCTION {s}.qs_requeue(p_ids bigint[], p_queue text, p_priority smallint)
RETURNS TABLE (id bigint, queue text, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur record;
    e {s}.ready_entries;
BEGIN
    SELECT * INTO cur FROM {s}.qs_current_slot();
    RETURN QUERY
    UPDATE {s}.deferred_jobs x
    SET queue = coalesce(p_queue, x.queue), priority = coalesce(p_priority, x.priority)
    WHERE x.id = ANY (p_ids) AND x.state = 'scheduled'
      AND ((p_queue IS NOT NULL AND x.queue <> p_queue)
           OR (p_priority IS NOT NULL AND x.priority <> p_priority))
    RETURNING x.id, x.queue, 'scheduled'::text;
    FOR e IN
        SELECT y.* FROM {s}.ready_entries y
        WHERE y.id = ANY (p_ids)
          AND ((p_queue IS NOT NULL AND y.queue <> p_queue)
               OR (p_priority IS NOT NULL AND y.priority <> p_priority))
          AND NOT EXISTS (SELECT 1 FROM {s}.claimed_entries c
                          WHERE c.slot = y.slot AND c.queue = y.queue
                            AND c.priority = y.priority AND c.seq = y.seq)
          AND y.seq >= {s}.qs_lane_cursor(y.queue, y.priority)
        ORDER BY y.queue, y.priority, y.seq
    LOOP
        INSERT INTO {s}.lanes (queue, priority) VALUES (e.queue, e.priority) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM {s}.lanes l WHERE l.queue = e.queue AND l.priority = e.priority FOR UPDATE;
        -- Under the lane's lock: a claim may have taken it meanwhile (a claimed entry, or the
        -- cursor moved past it).
        CONTINUE WHEN EXISTS (SELECT 1 FROM {s}.claimed_entries c
                              WHERE c.slot = e.slot AND c.queue = e.queue
                                AND c.priority = e.priority AND c.seq = e.seq)
                   OR e.seq < {s}.qs_lane_cursor(e.queue, e.priority);
        INSERT INTO {s}.claimed_entries (slot, queue, priority, seq)
        VALUES (e.slot, e.queue, e.priority, e.seq);
        INSERT INTO {s}.ready_entries (slot, generation, queue, priority, id, kind, args,
            attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
            unique_key, unique_states, ordering_key, progress)
        VALUES (cur.slot, cur.generation, coalesce(p_queue, e.queue),
                coalesce(p_priority, e.priority), e.id, e.kind, e.args, e.attempt,
                e.max_attempts, e.run_lease, e.run_at, e.created_at, e.metadata, e.tags,
                e.errors, e.unique_key, e.unique_states, e.ordering_key, e.progress);
        id := e.id;
        queue := coalesce(p_queue, e.queue);
        state := 'available';
        RETURN NEXT;
    END LOOP;
END $$;
