-- Queue storage's functions (issue 18; docs/queue-storage-design.md): its hot path, rotation
-- and reclaim. `{s}` is the substrate schema (a checked identifier).
--
-- Run after `install.sql` by a fresh install, and again on its own by an install or a runtime
-- start that finds the substrate's functions older than this file (mod.rs
-- `SUBSTRATE_VERSION`, kept in `{s}.qs_substrate`): every function named in this file is
-- dropped first, whatever its arguments, and created again, so a changed signature leaves no
-- old overload behind. Keep every signature a running older runtime calls callable (add
-- parameters with defaults), and raise `SUBSTRATE_VERSION` with every change here.
--
-- Rules every function here keeps (correctness/storage/AwaQueueRotation.tla):
-- - a ready entry is never updated or deleted; a slot loses its rows only by TRUNCATE, after
--   carrying forward whatever in it is still live;
-- - a producer holds its transaction id before it draws a seq (`hold_xid` trigger), so the
--   claim cursor's stable point can be derived from the xmin horizon;
-- - a lease row is the attempt's guard: whatever deletes it owns the attempt's outcome.

-- The version of the functions below (the installer writes it after running this file).
CREATE TABLE IF NOT EXISTS {s}.qs_substrate (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   integer NOT NULL
);
-- Read by every runtime's start, whatever its role (an upgrade by the owner creates it after
-- the application role's grants, which default privileges cover only if they were set).
GRANT SELECT ON {s}.qs_substrate TO PUBLIC;

-- A producer holds its transaction id before it draws a seq (once per statement; COPY too),
-- and refuses to append once routing has moved away from this schema (migration 12's route
-- check: a producer that read the route before an abort must not strand a job here).
CREATE OR REPLACE FUNCTION {s}.qs_hold_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.storage_route_check('{s}');
    PERFORM pg_current_xact_id();
    RETURN NULL;
END $$;
-- Replaced in place, never dropped (an upgrade keeps trigger functions): dropping it would drop
-- the trigger, and creating that again locks ready_entries against every producer and claim.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'qs_hold_xid' AND tgrelid = '{s}.ready_entries'::regclass) THEN
        CREATE TRIGGER qs_hold_xid BEFORE INSERT ON {s}.ready_entries
            FOR EACH STATEMENT EXECUTE FUNCTION {s}.qs_hold_xid();
    END IF;
END $$;

-- A lane's cursor (0 for a lane never claimed). Every entry below it is consumed: a claim
-- moves the cursor only past entries it consumed or found consumed (the rotation model's
-- CursorNeverPassesWork), so a claim writes claimed entries only for what it takes at or
-- above the cursor it leaves, and every reader of "is this entry available" (this view,
-- carry-forward, cancel, the operator's moves, the harness's claim) asks both: no claimed
-- entry, and not below the cursor. In a drain behind committed producers the stable point
-- covers what a claim takes, so it writes no claimed entries at all (one insert per job less).
CREATE FUNCTION {s}.qs_lane_cursor(p_queue text, p_priority integer) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT l.cursor FROM {s}.lanes l
                     WHERE l.queue = p_queue AND l.priority = p_priority), 0)
$$;

-- Every job the substrate holds, one row each, in canonical's states: what `awa.jobs` will show
-- of this engine. One statement, so one snapshot: every state change above moves a job between
-- these parts in one statement (claim, complete, finalize, rescue, promote, carry-forward), so
-- the view never shows a job twice or loses one that has not aged out of the history.
-- `attempt` and `run_lease` are those of the job's latest attempt. The columns are
-- `JOB_COLUMNS`' (model::job), so a `JobRow` reads from it as from `awa.jobs`.
-- An entry is consumed when it has a claimed entry or lies below its lane's cursor (see
-- `qs_lane_cursor`); the others are available.
CREATE OR REPLACE VIEW {s}.qs_jobs AS
    SELECT e.id, e.kind, e.queue, e.args, 'available'::text AS state, e.priority, e.attempt,
           e.max_attempts, e.run_at, NULL::timestamptz AS heartbeat_at,
           NULL::timestamptz AS deadline_at, NULL::timestamptz AS attempted_at,
           NULL::timestamptz AS finalized_at, e.created_at, e.errors, e.metadata, e.tags,
           e.unique_key, e.unique_states, NULL::text AS callback_id,
           NULL::timestamptz AS callback_timeout_at, e.run_lease, e.progress,
           e.ordering_key
    FROM {s}.ready_entries e
    WHERE NOT EXISTS (SELECT 1 FROM {s}.claimed_entries c
                      WHERE c.slot = e.slot AND c.queue = e.queue AND c.priority = e.priority
                        AND c.seq = e.seq)
      -- (qs_lane_cursor, written out: a view that called it would keep an upgrade from
      -- dropping it)
      AND e.seq >= coalesce((SELECT l.cursor FROM {s}.lanes l
                             WHERE l.queue = e.queue AND l.priority = e.priority), 0)
    UNION ALL
    SELECT e.id, e.kind, e.queue, e.args,
           CASE WHEN l.waiting THEN 'waiting_external' ELSE 'running' END,
           -- A parked attempt shows no heartbeat or deadline, as canonical's (its lease keeps
           -- them, unused while it waits: the callback's timeout rules it).
           e.priority, l.attempt, e.max_attempts, e.run_at,
           CASE WHEN l.waiting THEN NULL ELSE l.heartbeat_at END,
           CASE WHEN l.waiting THEN NULL ELSE l.deadline_at END,
           l.attempted_at, NULL, e.created_at, e.errors,
           -- A payload delivered to a handler waiting in-process shows as canonical shows it.
           CASE WHEN l.callback_result IS NULL THEN e.metadata
                ELSE e.metadata || jsonb_build_object('_awa_callback_result',
                                                      l.callback_result->'payload') END,
           e.tags, e.unique_key,
           e.unique_states, l.callback_id::text, l.callback_timeout_at, l.run_lease, l.progress,
           e.ordering_key
    FROM {s}.leases l
    JOIN {s}.ready_entries e
      ON e.slot = l.slot AND e.queue = l.queue AND e.priority = l.priority AND e.seq = l.seq
    UNION ALL
    SELECT e.id, e.kind, e.queue, e.args, 'completed', e.priority, e.attempt + 1,
           e.max_attempts, e.run_at, NULL, NULL, NULL, r.finalized_at, e.created_at, e.errors,
           e.metadata, e.tags, e.unique_key, e.unique_states, NULL, NULL, e.run_lease + 1, NULL,
           e.ordering_key
    FROM {s}.receipts r
    CROSS JOIN LATERAL unnest(r.seqs) AS u(seq)
    JOIN {s}.ready_entries e ON e.slot = r.slot AND e.seq = u.seq
    UNION ALL
    SELECT e.id, e.kind, e.queue, e.args, d.state, e.priority, e.attempt + d.ran::int,
           e.max_attempts, e.run_at, NULL, NULL, NULL, d.finalized_at, e.created_at, d.errors,
           e.metadata, e.tags, e.unique_key, e.unique_states, NULL, NULL,
           e.run_lease + d.ran::int, d.progress, e.ordering_key
    FROM {s}.done_entries d
    JOIN {s}.ready_entries e ON e.slot = d.slot AND e.seq = d.seq
    UNION ALL
    SELECT d.id, d.kind, d.queue, d.args, d.state, d.priority, d.attempt, d.max_attempts,
           d.run_at, NULL, NULL, NULL, NULL, d.created_at, d.errors, d.metadata, d.tags,
           d.unique_key, d.unique_states, NULL, NULL, d.run_lease, d.progress, d.ordering_key
    FROM {s}.deferred_jobs d;

-- The ring's lock: every writer of ready entries holds it shared from before it reads the
-- current slot until it commits (`qs_current_slot`); a rotation takes it exclusively, so once it
-- has it, no transaction that could still append to the slot it closes is running, and none
-- can start appending there after it commits. That makes a closed slot's seq bound final.
-- (PL/pgSQL: a `LANGUAGE sql` function is planned again at every call on PostgreSQL 15.)
CREATE FUNCTION {s}.qs_ring_lock_shared() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('awa.qs_ring'), hashtext('{s}'));
END $$;

-- The last seq drawn (0 before the first: `pg_sequence_last_value` is NULL until then). Read
-- outside any snapshot: a sequence shows its current value to every transaction. Through the
-- function, which needs USAGE on the sequence (what nextval needs, and what the documented
-- grants give an application role), where reading the sequence as a relation needs SELECT.
CREATE FUNCTION {s}.qs_last_seq() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN coalesce(pg_sequence_last_value('{s}.qs_seq'), 0);
END $$;

-- The current queue slot and its generation (a producer appends there, and only there).
-- Taken under the ring's shared lock, read in a statement of its own (under READ COMMITTED a
-- new snapshot, which sees every rotation that committed before the lock was granted). A
-- REPEATABLE READ or SERIALIZABLE transaction keeps its first snapshot, which may predate a
-- rotation: it locks the ring's row, which fails with a serialization error (40001) when a
-- rotation changed it after that snapshot, so it never appends to a closed slot.
CREATE FUNCTION {s}.qs_current_slot(OUT slot integer, OUT generation bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.qs_ring_lock_shared();
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM 1 FROM {s}.queue_ring_state FOR KEY SHARE;
    END IF;
    SELECT r.current, s.generation INTO slot, generation FROM {s}.queue_ring_state r
    JOIN {s}.queue_ring_slots s ON s.slot = r.current;
END $$;

-- The slots a reader of a lane at p_cursor must open, as up to two ranges of slot numbers (a
-- range wraps the ring's end): from the oldest slot whose entries can be at or past p_cursor
-- to the current one. Written as ranges of plain values so that a generic plan prunes the
-- other slots' partitions at executor start-up (`slot = ANY(array)` would not prune), and the
-- claim neither locks nor opens them: each opened partition costs a claim about 25 us.
-- A set-returning SQL function, so that it is inlined into the claim's statements (no call,
-- no statements of its own); the claim runs with `jit = off`, since the ring tables' default
-- estimates (never analyzed) would otherwise price these plans past `jit_above_cost`.
CREATE FUNCTION {s}.qs_slot_window(p_cursor bigint)
RETURNS TABLE (lo1 integer, hi1 integer, lo2 integer, hi2 integer)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN r.current >= b.back THEN r.current - b.back ELSE 0 END,
           r.current,
           CASE WHEN r.current >= b.back THEN 1 ELSE r.current - b.back + r.slots END,
           CASE WHEN r.current >= b.back THEN 0 ELSE r.slots - 1 END
    FROM {s}.queue_ring_state r
    CROSS JOIN LATERAL (
        SELECT coalesce(max((r.current - s.slot + r.slots) % r.slots), 0) AS back
        FROM {s}.queue_ring_slots s
        WHERE s.slot = r.current OR s.seal_seq IS NULL OR s.seal_seq >= p_cursor) b
$$;

-- Insert jobs, one per element of the parallel arrays (validated by the caller, as every
-- insert path validates): a job due now (run_at NULL or not after now()) is a ready entry in
-- the current slot, a later one a scheduled row in deferred_jobs. Returns the ids in input
-- order. A job whose unique key another live job holds in one of that job's unique states is
-- refused as canonical refuses it (unique_violation on "idx_awa_jobs_unique", the whole call),
-- or with p_skip_held (follow-ups) skipped: NULL in its place, the others inserted.
CREATE FUNCTION {s}.qs_enqueue(p_kinds text[], p_queues text[], p_args jsonb[],
                               p_priorities smallint[], p_max_attempts integer[],
                               p_run_ats timestamptz[], p_tags jsonb[], p_metadata jsonb[],
                               p_unique_keys bytea[], p_unique_states smallint[],
                               p_ordering_keys text[], p_notify boolean DEFAULT true,
                               p_skip_held boolean DEFAULT false)
RETURNS SETOF bigint LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    cur record;
    n integer := coalesce(cardinality(p_kinds), 0);
    v_ids bigint[];
    v_keep boolean[];
    v_won bigint[];
    v_ords integer[];
    v_uks bytea[];
    v_uss smallint[];
    r record;
    holder {s}.unique_keys;
BEGIN
    SELECT * INTO cur FROM {s}.qs_current_slot();
    v_ids := ARRAY(SELECT nextval('awa.jobs_id_seq') FROM generate_series(1, n));
    v_keep := array_fill(true, ARRAY[n]);
    IF EXISTS (SELECT 1 FROM unnest(p_unique_keys) k WHERE k IS NOT NULL) THEN
        -- Every key whose first state is in its mask, in input order: free keys are taken in
        -- one statement; each taken one is looked at (the rare path).
        SELECT coalesce(array_agg(t.ord::integer ORDER BY t.ord), '{}'),
               coalesce(array_agg(t.uk ORDER BY t.ord), '{}'),
               coalesce(array_agg(t.us ORDER BY t.ord), '{}')
        INTO v_ords, v_uks, v_uss
        FROM unnest(p_unique_keys, p_unique_states, p_run_ats) WITH ORDINALITY AS t(uk, us, ra, ord)
        WHERE t.uk IS NOT NULL
          AND (t.us & awa.state_bit(CASE WHEN t.ra IS NULL OR t.ra <= now() THEN 'available'
                                         ELSE 'scheduled' END)) <> 0;
        -- A key a canonical job still holds (a mixed transition: its jobs drain while new ones
        -- come here) is held for this engine too: one probe of canonical's unique index each.
        FOR r IN SELECT k.ord FROM unnest(v_ords, v_uks) AS k(ord, uk)
                 WHERE EXISTS (SELECT 1 FROM awa.canonical_jobs c
                               WHERE c.unique_key = k.uk
                                 AND (c.unique_states & awa.state_bit(c.state)) <> 0)
                 ORDER BY k.ord
        LOOP
            IF NOT p_skip_held THEN
                RAISE EXCEPTION 'duplicate key value violates unique constraint "idx_awa_jobs_unique"'
                    USING ERRCODE = 'unique_violation', CONSTRAINT = 'idx_awa_jobs_unique';
            END IF;
            v_keep[r.ord] := false;
        END LOOP;
        SELECT coalesce(array_agg(k.ord ORDER BY k.ord), '{}'),
               coalesce(array_agg(k.uk ORDER BY k.ord), '{}'),
               coalesce(array_agg(k.us ORDER BY k.ord), '{}')
        INTO v_ords, v_uks, v_uss
        FROM unnest(v_ords, v_uks, v_uss) AS k(ord, uk, us) WHERE v_keep[k.ord];
        WITH won AS (
            INSERT INTO {s}.unique_keys (unique_key, id, unique_states)
            SELECT k.uk, v_ids[k.ord], k.us
            FROM unnest(v_ords, v_uks, v_uss) AS k(ord, uk, us) ORDER BY k.ord
            ON CONFLICT (unique_key) DO NOTHING
            RETURNING id)
        SELECT coalesce(array_agg(id), '{}') INTO v_won FROM won;
        FOR r IN SELECT k.* FROM unnest(v_ords, v_uks, v_uss) AS k(ord, uk, us)
                 WHERE v_ids[k.ord] <> ALL (v_won) ORDER BY k.ord
        LOOP
            SELECT * INTO holder FROM {s}.unique_keys u WHERE u.unique_key = r.uk FOR UPDATE;
            IF NOT FOUND THEN
                -- Released meanwhile (its slot reclaimed): take it.
                INSERT INTO {s}.unique_keys (unique_key, id, unique_states)
                VALUES (r.uk, v_ids[r.ord], r.us) ON CONFLICT (unique_key) DO NOTHING;
                IF FOUND THEN
                    CONTINUE;
                END IF;
                SELECT * INTO holder FROM {s}.unique_keys u WHERE u.unique_key = r.uk FOR UPDATE;
            END IF;
            IF holder.id = ANY (v_ids) OR {s}.qs_key_held(holder.id, holder.unique_states) THEN
                IF NOT p_skip_held THEN
                    RAISE EXCEPTION 'duplicate key value violates unique constraint "idx_awa_jobs_unique"'
                        USING ERRCODE = 'unique_violation', CONSTRAINT = 'idx_awa_jobs_unique';
                END IF;
                v_keep[r.ord] := false;
            ELSE
                UPDATE {s}.unique_keys SET id = v_ids[r.ord], unique_states = r.us
                WHERE unique_key = r.uk;
            END IF;
        END LOOP;
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT t.ord, v_ids[t.ord] AS id, t.k, t.q, t.a, t.p, t.m,
               coalesce(t.r, now()) AS run_at, t.r IS NULL OR t.r <= now() AS due,
               ARRAY(SELECT jsonb_array_elements_text(coalesce(t.tg, '[]'))) AS tags,
               coalesce(t.md, '{}') AS metadata, t.uk, t.us, t.ok
        FROM unnest(p_kinds, p_queues, p_args, p_priorities, p_max_attempts, p_run_ats, p_tags,
                    p_metadata, p_unique_keys, p_unique_states, p_ordering_keys)
             WITH ORDINALITY AS t(k, q, a, p, m, r, tg, md, uk, us, ok, ord)
        WHERE v_keep[t.ord]
    ), ready AS (
        INSERT INTO {s}.ready_entries (slot, generation, queue, priority, seq, id, kind, args,
            attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
            unique_key, unique_states, ordering_key)
        SELECT cur.slot, cur.generation, i.q, i.p, nextval('{s}.qs_seq'), i.id, i.k, i.a, 0, i.m,
               0, i.run_at, now(), i.metadata, i.tags, '[]', i.uk, i.us, i.ok
        FROM (SELECT * FROM input WHERE due ORDER BY ord) i
    ), later AS (
        INSERT INTO {s}.deferred_jobs (id, state, queue, priority, kind, args, attempt,
            max_attempts, run_lease, run_at, created_at, metadata, tags, errors, unique_key,
            unique_states, ordering_key)
        SELECT i.id, 'scheduled', i.q, i.p, i.k, i.a, 0, i.m, 0, i.run_at, now(), i.metadata,
               i.tags, '[]', i.uk, i.us, i.ok
        FROM input i WHERE NOT i.due
    )
    SELECT CASE WHEN v_keep[g.ord] THEN v_ids[g.ord] END FROM generate_series(1, n) AS g(ord)
    ORDER BY g.ord;
    -- The wake-up hint canonical sends (`awa:<queue>`), once per queue with a job due now,
    -- delivered at commit. Not from a completion's transaction (p_notify false): a notifying
    -- commit serializes with every other one, so completions wake the queues after they commit.
    PERFORM pg_notify(awa.queue_channel(w.q), '')
    FROM (SELECT DISTINCT t.q FROM unnest(p_queues, p_run_ats) AS t(q, r)
          WHERE p_notify AND (t.r IS NULL OR t.r <= now())) w;
END $$;

-- A claimed job as the claim returns it (the columns a job row is read from). Made again
-- with the functions that return it (an upgrade drops those first; a user's object that
-- depends on it makes the upgrade fail, as for the functions).
DROP TYPE IF EXISTS {s}.qs_claimed_job;
CREATE TYPE {s}.qs_claimed_job AS (
    id bigint, kind text, queue text, args jsonb, state text, priority smallint,
    attempt integer, max_attempts integer, run_at timestamptz, heartbeat_at timestamptz,
    deadline_at timestamptz, attempted_at timestamptz, finalized_at timestamptz,
    created_at timestamptz, errors jsonb, metadata jsonb, tags text[], unique_key bytea,
    unique_states smallint, callback_id text, callback_timeout_at timestamptz,
    run_lease bigint, progress jsonb, ordering_key text);

-- Claim up to p_n entries of a queue, best priority (1) first: each lane with work in turn
-- (only lane p_lane when given, whether it has work or not); each lease gets a deadline
-- p_deadline from now when given. A lane's claim: lock the lane, confirm its stable point if
-- the transactions below it have ended, take the lowest committed unclaimed entries at or
-- above the cursor, lease them in the current lease slot, advance the cursor over the consumed
-- prefix (never past the stable point), and record the next candidate stable point
-- (correctness/storage/AwaStablePoint.tla models these steps and their order).
--
-- One function, and as few statements as the protocol allows: a claim's cost is mostly its
-- statements' start-up over the partitioned tables (docs/queue-storage-design.md, "Where a
-- claim's time goes"), so an idle pickup runs four (the queue's state, the lanes' probe, the
-- lane's lock, and one that picks, leases and moves the cursor) after the lock on `leases`.
--
-- Its plans are generic (planned once per connection, whatever the parameters) and must not
-- depend on the statistics at that moment: with scans other than plain index scans disabled,
-- the pick and the probes walk the lane's index in seq order and stop at the first entries
-- they need. Left to its estimates the planner chose a bitmap scan and a sort, which read every
-- waiting entry of the lane at each claim: 10 ms per claim behind a backlog of 3,000 jobs.
CREATE FUNCTION {s}.qs_claim_queue(p_queue text, p_n integer, p_deadline interval DEFAULT NULL,
                                   p_aging interval DEFAULT NULL, p_lane smallint DEFAULT NULL)
RETURNS SETOF {s}.qs_claimed_job
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    got integer := 0;
    k integer;
    pr smallint;
    lanes smallint[] := ARRAY[1, 2, 3, 4];
    lo1 integer; hi1 integer; lo2 integer; hi2 integer;
    cursors bigint[];
    stuck boolean[];
    paused boolean;
    idle smallint[] := '{}';
    v_seq bigint;
    -- The lane being claimed: its row as locked, and what this claim reads under the lock.
    l_cursor bigint; l_stable bigint; l_cand bigint; l_xmax xid8;
    fresh boolean; confirmed boolean; lslot integer;
    w_lo1 integer; w_hi1 integer; w_lo2 integer; w_hi2 integer;
BEGIN
    -- Nothing to take: nothing to read or move (a cursor moved without reading would pass
    -- whatever is waiting).
    IF p_n <= 0 THEN
        RETURN;
    END IF;
    -- Lock order, everywhere: leases, then a queue slot's tables (reclaim_queue takes leases in
    -- EXCLUSIVE mode before its slot; a claim must not hold a slot's lock while it waits for
    -- leases). First, before any statement that reads the slots: a cached generic plan locks
    -- every partition it names, pruned or not (PostgreSQL 15), so the statements below lock
    -- every slot's tables. Taken after them, a reclaim that came between waited for this
    -- claim's slot locks while this claim waited for its lock on leases, until the reclaim's
    -- lock_timeout (100 ms) gave up: a pickup of 65 ms. The parent alone carries the order
    -- (every statement on leases locks the parent first), so a claim does not lock every lease
    -- slot, which would keep them from being truncated. (A table lock takes no xid.)
    LOCK TABLE ONLY {s}.leases IN ROW EXCLUSIVE MODE;
    -- Whether the queue is paused (awa.queue_meta, shared with canonical: a paused queue hands
    -- out nothing); each lane's cursor, 0 for a lane without a row (never claimed: its entries
    -- can be in any slot), and the slots the queue's least advanced lane may need (the probes
    -- below open only those). `stuck`: the lane keeps a sealed slot in that window (its cursor
    -- is at or below the highest seal), and a claim of it, though it finds nothing, would move
    -- it on: it has no row yet, or its cursor is behind its stable point, or its candidate
    -- stable point can be confirmed now, or that candidate is itself below the seal.
    -- Also the next candidate stable point's seq: the last seq drawn, read before this
    -- transaction holds an xid (the first lane's row lock below assigns it). Every producer of
    -- a seq at or below it held its xid before drawing (`hold_xid`), so before ours: once every
    -- xid below ours has ended, so has every such producer (a candidate's `cand_xmax` is our
    -- xid). NULL when the transaction already held an xid, and then this claim sets no new
    -- candidate (it still confirms the ones the lanes have). A snapshot's xmax would not do:
    -- it is one past the latest *completed* xid, and a producer that started after that one
    -- and is still running holds an xid at or above it.
    SELECT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused),
           c.cursors, c.stuck, w.lo1, w.hi1, w.lo2, w.hi2,
           CASE WHEN pg_current_xact_id_if_assigned() IS NULL THEN {s}.qs_last_seq() END
    INTO paused, cursors, stuck, lo1, hi1, lo2, hi2, v_seq
    FROM (SELECT array_agg(coalesce(l.cursor, 0) ORDER BY g.p) AS cursors,
                 array_agg(coalesce(l.cursor, 0) <= s.newest
                           AND (l.queue IS NULL OR l.cursor <= l.stable_seq
                                OR (l.cand_seq > l.stable_seq
                                    AND l.cand_xmax <= pg_snapshot_xmin(pg_current_snapshot()))
                                OR l.cand_seq < s.newest) ORDER BY g.p) AS stuck,
                 min(coalesce(l.cursor, 0)) AS least
          FROM generate_series(1, 4) AS g(p)
          LEFT JOIN {s}.lanes l ON l.queue = p_queue AND l.priority = g.p
          CROSS JOIN (SELECT coalesce(max(r.seal_seq), -1) AS newest
                      FROM {s}.queue_ring_slots r) s) c
    CROSS JOIN LATERAL {s}.qs_slot_window(c.least) w;
    IF paused THEN
        RETURN;
    END IF;
    IF p_lane IS NOT NULL THEN
        lanes := ARRAY[p_lane];
    ELSE
        IF p_aging IS NOT NULL AND p_aging > interval '0' THEN
            -- Priority aging (canonical's rule: one priority better, down to 1, for every
            -- p_aging a job has been due), applied to each lane's oldest waiting entry: the
            -- lanes are visited in the order of that entry's aged priority, then its run_at.
            SELECT array_agg(x.pr ORDER BY x.eff, x.run_at NULLS LAST, x.pr) INTO lanes
            FROM (
                SELECT p.pr, h.run_at,
                       CASE WHEN h.run_at IS NULL OR h.run_at > now() THEN p.pr
                            ELSE greatest(1, p.pr - floor(extract(epoch FROM now() - h.run_at)
                                                          / extract(epoch FROM p_aging))::int)
                       END AS eff
                FROM generate_series(1, 4) AS p(pr)
                LEFT JOIN {s}.lanes l ON l.queue = p_queue AND l.priority = p.pr
                LEFT JOIN LATERAL (
                    SELECT e.run_at FROM {s}.ready_entries e
                    WHERE (e.slot BETWEEN lo1 AND hi1 OR e.slot BETWEEN lo2 AND hi2)
                      AND e.queue = p_queue AND e.priority = p.pr
                      AND e.seq >= coalesce(l.cursor, 0)
                      AND NOT EXISTS (SELECT 1 FROM {s}.claimed_entries ce
                                      WHERE (ce.slot BETWEEN lo1 AND hi1
                                             OR ce.slot BETWEEN lo2 AND hi2)
                                        AND ce.slot = e.slot
                                        AND ce.queue = e.queue AND ce.priority = e.priority
                                        AND ce.seq = e.seq AND ce.seq >= coalesce(l.cursor, 0))
                    ORDER BY e.seq LIMIT 1) h ON true) x;
        END IF;
        -- Only lanes with an entry at or past their cursor (read without a lock: an entry
        -- committed after this read is found by the claim its wake-up starts), in the order
        -- above: a claim of an empty lane locks and upserts its lane row, and skipping them
        -- quarters an idle pickup. Each lane's probe is a subplan, opened once and rescanned
        -- per lane, so the slots' index scans are set up once, not once per lane.
        -- Then the `stuck` lanes found empty, which keep an old slot in every probe's window: a
        -- claim of one takes nothing, but creates the lane's row if it has none and moves its
        -- cursor up to the stable point, so the window narrows again as the ring turns. That
        -- is housekeeping, so it is done when this claim took nothing anyway (an idle poll),
        -- or when the window has grown past the current slot and the one before it; not by
        -- the claim that takes a job just woken up (three idle lanes' claims put about 1 ms on
        -- a pickup after every rotation). An idle lane is claimed (and writes its row) a few
        -- times per turn of the ring, and not at all while the xmin horizon holds its stable
        -- point back.
        SELECT coalesce(array_agg(t.pr ORDER BY t.o) FILTER (WHERE t.hit), '{}'),
               coalesce(array_agg(t.pr ORDER BY t.o) FILTER (WHERE NOT t.hit AND stuck[t.pr]),
                        '{}')
        INTO lanes, idle
        FROM (SELECT u.pr, u.o, EXISTS (
                  SELECT 1 FROM {s}.ready_entries e
                  WHERE (e.slot BETWEEN lo1 AND hi1 OR e.slot BETWEEN lo2 AND hi2)
                    AND e.queue = p_queue AND e.priority = u.pr
                    AND e.seq >= cursors[u.pr]
                  LIMIT 1) AS hit
              -- (OFFSET 0: not flattened, or each FILTER above would probe again)
              FROM unnest(lanes) WITH ORDINALITY AS u(pr, o) OFFSET 0) t;
    END IF;
    FOREACH pr IN ARRAY lanes || idle LOOP
        EXIT WHEN got >= p_n;
        -- The idle lanes come last: skipped when this claim took a job and the window is narrow.
        EXIT WHEN pr = ANY (idle) AND got > 0 AND hi1 - lo1 + 1 + greatest(hi2 - lo2 + 1, 0) <= 2;
        -- The lane's row lock (the first one assigns this transaction's xid, after v_seq was
        -- read). The confirmation, the lease ring's current slot and the slots that can hold
        -- entries at or past the cursor must be read with a snapshot from after the lock was
        -- granted, so that they see every claim of the lane that committed while this one
        -- waited. This statement's snapshot is from before: it serves when the row it locked
        -- is the one that snapshot sees (`fresh`: no claim of the lane changed it meanwhile,
        -- so the candidate it confirms was recorded, and its seq read, before that snapshot);
        -- otherwise a second statement reads them again. The window must come from a snapshot
        -- that confirms the stable point or a later one: every producer of a seq at or below
        -- it had ended before that snapshot, so the slot it appended to is current or sealed
        -- at or above its seq there. (Under READ COMMITTED a row lock that waited returns the
        -- row's newest version, re-evaluating this statement for it; the scalar subquery reads
        -- the version the snapshot sees.)
        SELECT l.cursor, l.stable_seq, l.cand_seq, l.cand_xmax,
               ROW(l.cursor, l.stable_seq, l.cand_seq, l.cand_xmax) IS NOT DISTINCT FROM
                   (SELECT ROW(v.cursor, v.stable_seq, v.cand_seq, v.cand_xmax)
                    FROM {s}.lanes v WHERE v.queue = p_queue AND v.priority = pr),
               l.cand_xmax <= pg_snapshot_xmin(pg_current_snapshot()), lr.current,
               w.lo1, w.hi1, w.lo2, w.hi2
        INTO l_cursor, l_stable, l_cand, l_xmax, fresh, confirmed, lslot,
             w_lo1, w_hi1, w_lo2, w_hi2
        FROM {s}.lanes l
        CROSS JOIN {s}.lease_ring_state lr
        CROSS JOIN LATERAL {s}.qs_slot_window(l.cursor) w
        WHERE l.queue = p_queue AND l.priority = pr
        FOR UPDATE OF l;
        IF NOT FOUND THEN
            -- Lanes are created by claimers, never by producers: a producer that created one
            -- would make every other producer of the lane wait for its commit (ON CONFLICT
            -- waits on an insert in progress). (Looked up first: an insert attempt on every
            -- claim costs a speculative insertion.)
            INSERT INTO {s}.lanes (queue, priority) VALUES (p_queue, pr) ON CONFLICT DO NOTHING;
            SELECT l.cursor, l.stable_seq, l.cand_seq, l.cand_xmax
            INTO l_cursor, l_stable, l_cand, l_xmax
            FROM {s}.lanes l WHERE l.queue = p_queue AND l.priority = pr FOR UPDATE;
            fresh := false;
        END IF;
        IF NOT fresh THEN
            SELECT l_xmax <= pg_snapshot_xmin(pg_current_snapshot()), lr.current,
                   w.lo1, w.hi1, w.lo2, w.hi2
            INTO confirmed, lslot, w_lo1, w_hi1, w_lo2, w_hi2
            FROM {s}.lease_ring_state lr CROSS JOIN LATERAL {s}.qs_slot_window(l_cursor) w;
        END IF;
        IF confirmed THEN
            l_stable := greatest(l_stable, l_cand);
            -- No seq drawn since the last candidate: keep it (an idle lane then writes nothing).
            IF v_seq > l_cand THEN
                l_cand := v_seq;
                l_xmax := pg_current_xact_id();
            END IF;
        END IF;
        -- One statement, so one snapshot from after the lock: it picks the lowest committed
        -- unclaimed entries at or above the cursor (the one read of the lane's slots: each
        -- statement over the partitioned tables opens an index scan per slot it may read, which
        -- is most of a claim's cost), consumes and leases them, and moves the cursor. Each
        -- candidate is probed in its own slot's claimed entries (a claimed entry shares its
        -- entry's slot): a nested probe per candidate, not an anti-join, whose plan a generic
        -- plan's estimates could turn into a scan of every claimed entry per candidate.
        -- The cursor, never past the first unclaimed committed entry nor past the stable point
        -- plus one (every seq at or below the stable point is committed or gone), comes from
        -- what the claim took: the picked entries are the lowest unclaimed ones this snapshot
        -- sees, and it sees every seq at or below the stable point (the lane lock waited for
        -- any other claim of the lane). Fewer than asked: none is left below the stable point.
        -- As many as asked: everything up to the last one taken is claimed now. An unchanged
        -- lane is not written (an idle poll then leaves no dead tuple). Only the entries taken
        -- at or above the new cursor get a claimed entry: those below it are consumed by the
        -- cursor itself (`qs_lane_cursor`). Behind a committed backlog that is all of them,
        -- and the claim writes a lease per job and nothing else per job (measured in a drain:
        -- the pick's time down by a third, WAL per job from 511 to 355 bytes).
        -- The per-candidate probe runs only when the lane has a claimed entry at or above its
        -- cursor at all (one probe of the window, an InitPlan of this statement, so the same
        -- snapshot): behind a committed backlog it has none, and the pick skips one index
        -- probe per candidate (measured in 40,000-job drains: the pick's mean from about 550
        -- to 410-470 us).
        RETURN QUERY
        WITH picked AS (
            SELECT e.*, e.run_lease + 1 AS next_lease, e.attempt + 1 AS next_attempt,
                   now() AS t0
            FROM {s}.ready_entries e
            LEFT JOIN LATERAL (
                SELECT true AS hit FROM {s}.claimed_entries c
                WHERE (SELECT EXISTS (
                           SELECT 1 FROM {s}.claimed_entries g
                           WHERE (g.slot BETWEEN w_lo1 AND w_hi1 OR g.slot BETWEEN w_lo2 AND w_hi2)
                             AND g.queue = p_queue AND g.priority = pr AND g.seq >= l_cursor))
                  AND (c.slot BETWEEN w_lo1 AND w_hi1 OR c.slot BETWEEN w_lo2 AND w_hi2)
                  AND c.slot = e.slot AND c.queue = p_queue AND c.priority = pr
                  AND c.seq = e.seq
                LIMIT 1) x ON true
            WHERE (e.slot BETWEEN w_lo1 AND w_hi1 OR e.slot BETWEEN w_lo2 AND w_hi2)
              AND e.queue = p_queue AND e.priority = pr AND e.seq >= l_cursor
              AND x.hit IS NULL
            ORDER BY e.seq
            LIMIT p_n - got
        ), cur AS (
            SELECT CASE WHEN count(*) < p_n - got THEN greatest(l_cursor, l_stable + 1)
                        ELSE greatest(l_cursor, least(max(p.seq) + 1, l_stable + 1))
                   END AS cursor
            FROM picked p
        ), consumed AS (
            INSERT INTO {s}.claimed_entries (slot, queue, priority, seq)
            SELECT p.slot, p_queue, pr, p.seq FROM picked p, cur WHERE p.seq >= cur.cursor
        ), leased AS (
            INSERT INTO {s}.leases (lease_slot, id, run_lease, queue, priority, slot, generation,
                                    seq, attempt, heartbeat_at, deadline_at, attempted_at, progress)
            SELECT lslot, p.id, p.next_lease, p_queue, pr, p.slot, p.generation, p.seq,
                   p.next_attempt, p.t0, p.t0 + p_deadline, p.t0, p.progress
            FROM picked p
        ), moved AS (
            UPDATE {s}.lanes l
            SET cursor = m.cursor, stable_seq = l_stable, cand_seq = l_cand, cand_xmax = l_xmax
            FROM cur m
            WHERE l.queue = p_queue AND l.priority = pr
              AND (l.cursor, l.stable_seq, l.cand_seq, l.cand_xmax)
                  IS DISTINCT FROM (m.cursor, l_stable, l_cand, l_xmax)
        )
        SELECT p.id, p.kind, p.queue, p.args, 'running'::text, p.priority, p.next_attempt,
               p.max_attempts, p.run_at, p.t0, p.t0 + p_deadline, p.t0, NULL::timestamptz,
               p.created_at, p.errors, p.metadata, p.tags, p.unique_key, p.unique_states,
               NULL::text, NULL::timestamptz, p.next_lease, p.progress, p.ordering_key
        FROM picked p ORDER BY p.seq;
        GET DIAGNOSTICS k = ROW_COUNT;
        got := got + k;
    END LOOP;
END $$;

-- Claim up to p_n entries of one lane in seq order, whether the probe would find work there
-- or not (tests and the harness use it to drive a lane's protocol step by step).
CREATE FUNCTION {s}.qs_claim(p_queue text, p_priority smallint, p_n integer,
                            p_deadline interval DEFAULT NULL)
RETURNS SETOF {s}.qs_claimed_job
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM {s}.qs_claim_queue(p_queue, p_n, p_deadline, NULL, p_priority);
END $$;

-- Heartbeat open attempts, storing the progress given for each (NULL keeps what is stored);
-- returns the ids whose lease is still open and whether a cancel was requested for each. A
-- lease a finalization holds locked is skipped, not waited for (as on canonical: one slow
-- completion must not delay every other attempt's heartbeat into rescue).
CREATE FUNCTION {s}.qs_heartbeat(p_ids bigint[], p_leases bigint[], p_progress jsonb[] DEFAULT NULL)
RETURNS TABLE (id bigint, cancel boolean) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH live AS (
        SELECT x.id, x.run_lease, t.progress
        FROM unnest(p_ids, p_leases, coalesce(p_progress, array_fill(NULL::jsonb,
                    ARRAY[cardinality(p_ids)]))) AS t(id, run_lease, progress)
        JOIN {s}.leases x ON x.id = t.id AND x.run_lease = t.run_lease
        FOR UPDATE OF x SKIP LOCKED
    )
    UPDATE {s}.leases l SET heartbeat_at = now(), progress = coalesce(live.progress, l.progress)
    FROM live WHERE l.id = live.id AND l.run_lease = live.run_lease
    RETURNING l.id, l.cancel_requested_at IS NOT NULL;
END $$;

-- Give claimed attempts that never started back: each lease still open and without a cancel
-- request is deleted and its job appended again to the current slot (same id and run lease,
-- the claim's attempt undone, a new seq: it goes to the back of its lane). Returns each pair
-- still open with what happened: 0 released, 1 a cancel was requested (left running for the
-- caller to finalize as cancelled).
CREATE FUNCTION {s}.qs_release(p_ids bigint[], p_leases bigint[])
RETURNS TABLE (id bigint, what smallint) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    cur record;
BEGIN
    LOCK TABLE ONLY {s}.leases IN ROW EXCLUSIVE MODE;
    SELECT * INTO cur FROM {s}.qs_current_slot();
    RETURN QUERY
    WITH mine AS (
        SELECT x.id, x.run_lease, x.cancel_requested_at IS NOT NULL AS cancel
        FROM unnest(p_ids, p_leases) AS t(id, run_lease)
        JOIN {s}.leases x ON x.id = t.id AND x.run_lease = t.run_lease
        FOR UPDATE OF x
    ), gone AS (
        DELETE FROM {s}.leases l USING mine m
        WHERE l.id = m.id AND l.run_lease = m.run_lease AND NOT m.cancel
        RETURNING l.*
    ), again AS (
        INSERT INTO {s}.ready_entries (slot, generation, queue, priority, seq, id, kind, args,
            attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
            unique_key, unique_states, ordering_key, progress)
        SELECT cur.slot, cur.generation, e.queue, e.priority, nextval('{s}.qs_seq'), e.id, e.kind,
               e.args, greatest(g.attempt - 1, 0), e.max_attempts, g.run_lease, e.run_at,
               e.created_at, e.metadata, e.tags, e.errors, e.unique_key, e.unique_states,
               e.ordering_key, g.progress
        FROM gone g JOIN {s}.ready_entries e
          ON e.slot = g.slot AND e.queue = g.queue AND e.priority = g.priority AND e.seq = g.seq
        ORDER BY g.id
        RETURNING queue
    ), woken AS (
        SELECT pg_notify(awa.queue_channel(q.queue), '') FROM (SELECT DISTINCT queue FROM again) q
    )
    SELECT m.id, (CASE WHEN m.cancel THEN 1 ELSE 0 END)::smallint FROM mine m
    WHERE (SELECT count(*) FROM woken) >= 0;
END $$;

-- Finalize one attempt on the per-job path, the outcomes canonical's finalizer writes:
-- 'completed' (a receipt), 'failed' and 'cancelled' (a done entry, with p_error appended to the
-- job's errors), 'retryable' (deferred to p_run_at, p_error appended when given) and 'snoozed'
-- (deferred as scheduled to p_run_at without burning the attempt). The lease delete is the
-- guard: false, and nothing written, when the attempt's lease is gone.
CREATE FUNCTION {s}.qs_finalize(p_id bigint, p_lease bigint, p_outcome text,
                                p_run_at timestamptz DEFAULT NULL, p_error jsonb DEFAULT NULL,
                                p_progress jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    l {s}.leases;
    e {s}.ready_entries;
    errs jsonb;
    prog jsonb;
BEGIN
    IF p_outcome NOT IN ('completed', 'failed', 'cancelled', 'retryable', 'snoozed') THEN
        RAISE EXCEPTION 'unknown outcome %', p_outcome USING ERRCODE = '22023';
    END IF;
    IF p_outcome IN ('retryable', 'snoozed') AND p_run_at IS NULL THEN
        RAISE EXCEPTION '% needs a run_at', p_outcome USING ERRCODE = '22023';
    END IF;
    DELETE FROM {s}.leases x WHERE x.id = p_id AND x.run_lease = p_lease RETURNING x.* INTO l;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_outcome = 'completed' THEN
        INSERT INTO {s}.receipts (slot, generation, seqs, finalized_at)
        VALUES (l.slot, l.generation, ARRAY[l.seq], now());
        RETURN true;
    END IF;
    SELECT * INTO e FROM {s}.ready_entries x
    WHERE x.slot = l.slot AND x.queue = l.queue AND x.priority = l.priority AND x.seq = l.seq;
    errs := e.errors || CASE WHEN p_error IS NULL THEN '[]'::jsonb ELSE jsonb_build_array(p_error) END;
    -- The progress given with the outcome, else the attempt's last (kept, as canonical keeps it).
    prog := coalesce(p_progress, l.progress);
    IF p_outcome IN ('failed', 'cancelled') THEN
        INSERT INTO {s}.done_entries (slot, generation, seq, state, errors, finalized_at, progress)
        VALUES (l.slot, l.generation, l.seq, p_outcome, errs, now(), prog);
    ELSE
        INSERT INTO {s}.deferred_jobs (id, state, queue, priority, kind, args, attempt,
            max_attempts, run_lease, run_at, created_at, metadata, tags, errors, unique_key,
            unique_states, ordering_key, progress)
        VALUES (e.id, CASE p_outcome WHEN 'retryable' THEN 'retryable' ELSE 'scheduled' END,
                e.queue, e.priority, e.kind, e.args,
                CASE p_outcome WHEN 'snoozed' THEN greatest(l.attempt - 1, 0) ELSE l.attempt END,
                e.max_attempts, l.run_lease, p_run_at, e.created_at, e.metadata, e.tags, errs,
                e.unique_key, e.unique_states, e.ordering_key, prog);
    END IF;
    RETURN true;
END $$;

-- Record an open attempt's progress; false when its lease is gone.
CREATE FUNCTION {s}.qs_set_progress(p_id bigint, p_lease bigint, p_progress jsonb)
RETURNS boolean LANGUAGE sql AS $$
    WITH u AS (
        UPDATE {s}.leases l SET progress = p_progress
        WHERE l.id = p_id AND l.run_lease = p_lease RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM u)
$$;

-- Park an attempt that returned "wait for the callback" (canonical's waiting_external): its
-- lease stays, no longer heartbeated, until the callback resolves or times out. False when the
-- lease is gone or the callback is not this attempt's.
CREATE FUNCTION {s}.qs_park(p_id bigint, p_lease bigint, p_callback_id text,
                            p_progress jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE sql AS $$
    WITH u AS (
        UPDATE {s}.leases l SET waiting = true, progress = coalesce(p_progress, l.progress)
        WHERE l.id = p_id AND l.run_lease = p_lease AND l.callback_id::text = p_callback_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM u)
$$;

-- Cancel a job, as canonical's cancel does: one that has not started (available, scheduled,
-- retryable) or is parked on a callback is cancelled at once; a running one is flagged (its
-- handler is told on `awa:cancel`) and ends as its handler decides, or cancelled if rescued.
-- Returns the state the job is left in, or NULL when the substrate does not hold it
-- unfinished.
CREATE FUNCTION {s}.qs_cancel(p_id bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    l {s}.leases;
    e {s}.ready_entries;
    d {s}.deferred_jobs;
    cur record;
BEGIN
    -- A cancel records no error (canonical's keeps `errors` as they were): the job's last
    -- error stays the one its attempts show.
    -- Parked on a callback: the lease goes, the attempt is cancelled.
    DELETE FROM {s}.leases x WHERE x.id = p_id AND x.waiting RETURNING x.* INTO l;
    IF FOUND THEN
        INSERT INTO {s}.done_entries (slot, generation, seq, state, errors, finalized_at, progress)
        SELECT l.slot, l.generation, l.seq, 'cancelled',
               y.errors,
               now(), l.progress
        FROM {s}.ready_entries y
        WHERE y.slot = l.slot AND y.queue = l.queue AND y.priority = l.priority AND y.seq = l.seq;
        RETURN 'cancelled';
    END IF;
    -- Running: flag it and tell its worker.
    UPDATE {s}.leases x SET cancel_requested_at = coalesce(x.cancel_requested_at, now())
    WHERE x.id = p_id RETURNING x.* INTO l;
    IF FOUND THEN
        PERFORM pg_notify('awa:cancel', p_id::text);
        RETURN 'running';
    END IF;
    -- Deferred: append its entry, consumed, with the cancellation. (Before the available
    -- case: a promotion that took the row first leaves the job available, which the next
    -- statement sees.)
    DELETE FROM {s}.deferred_jobs x WHERE x.id = p_id RETURNING x.* INTO d;
    IF FOUND THEN
        SELECT * INTO cur FROM {s}.qs_current_slot();
        WITH ins AS (
            INSERT INTO {s}.ready_entries (slot, generation, queue, priority, id, kind, args,
                attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
                unique_key, unique_states, ordering_key, progress)
            VALUES (cur.slot, cur.generation, d.queue, d.priority, d.id, d.kind, d.args,
                    d.attempt, d.max_attempts, d.run_lease, d.run_at, d.created_at, d.metadata,
                    d.tags, d.errors, d.unique_key, d.unique_states, d.ordering_key, d.progress)
            RETURNING slot, generation, queue, priority, seq, attempt, errors, progress
        ), consumed AS (
            INSERT INTO {s}.claimed_entries (slot, queue, priority, seq)
            SELECT i.slot, i.queue, i.priority, i.seq FROM ins i
        )
        INSERT INTO {s}.done_entries (slot, generation, seq, state, errors, finalized_at, ran,
                                      progress)
        SELECT i.slot, i.generation, i.seq, 'cancelled',
               i.errors,
               now(), false, i.progress
        FROM ins i;
        RETURN 'cancelled';
    END IF;
    -- Available: consume the entry and record it cancelled (an entry is never deleted). The
    -- lane's row is locked as a claim locks it, and the entry looked up again after, so a
    -- claim cannot take it meanwhile.
    SELECT y.* INTO e FROM {s}.ready_entries y WHERE y.id = p_id ORDER BY y.seq DESC LIMIT 1;
    IF FOUND THEN
        INSERT INTO {s}.lanes (queue, priority) VALUES (e.queue, e.priority) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM {s}.lanes x WHERE x.queue = e.queue AND x.priority = e.priority FOR UPDATE;
        SELECT y.* INTO e FROM {s}.ready_entries y
        WHERE y.id = p_id AND NOT EXISTS (
            SELECT 1 FROM {s}.claimed_entries c
            WHERE c.slot = y.slot AND c.queue = y.queue AND c.priority = y.priority
              AND c.seq = y.seq)
          AND y.seq >= {s}.qs_lane_cursor(y.queue, y.priority);
        IF FOUND THEN
            INSERT INTO {s}.claimed_entries (slot, queue, priority, seq)
            VALUES (e.slot, e.queue, e.priority, e.seq);
            INSERT INTO {s}.done_entries (slot, generation, seq, state, errors, finalized_at, ran,
                                          progress)
            VALUES (e.slot, e.generation, e.seq, 'cancelled',
                    e.errors,
                    now(), false, e.progress);
            RETURN 'cancelled';
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- Complete a batch: the lease delete is the guard; one receipt per queue slot for exactly the
-- leases deleted. Returns the (id, run_lease) pairs completed.
-- One lease slot at a time, the ring's current slot first (most attempts complete in the slot
-- they were leased in), then back round the ring until every pair given was found or every slot
-- was looked in; a lease deleted is gone for the slots after. Each slot has a statement of its
-- own that names only that slot's table (the branch between the two marks below is written out
-- once per lease slot when the functions are installed). A statement over the parent names
-- every slot, and a cached plan depends on, and locks, every table it names: each TRUNCATE of
-- any slot (the ring turns several times a second under load) made every connection plan it
-- again, at 0.7-0.9 ms a time, and each completion waited for the rotation's transaction to
-- commit. A slot's own statement is planned again only when that slot is truncated, and its
-- plan is one table's. The parent is locked first, as the claim locks it (the lock order
-- reclaim_queue relies on; a statement on a slot's table alone does not lock the parent).
-- The plan must not depend on the slot's statistics when it is made: a slot's statement is
-- planned again right after the slot's TRUNCATE, when it is empty, and left to its estimates
-- the planner then chose a sequential scan (or a full index scan) of the slot, read again at
-- every completion as the slot fills. So the pairs' ids are the index condition
-- (`id = ANY`), and the rows it finds are matched to the pairs in a hash join. (JIT off: the
-- disabled scans' cost on the ring's one-row table would otherwise make every call compile.)
CREATE FUNCTION {s}.qs_complete(p_ids bigint[], p_leases bigint[])
RETURNS TABLE (id bigint, run_lease bigint) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_nestloop = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    cur integer;
    slots integer;
    ls integer;
    k integer;
    done_n integer := 0;
    want integer := coalesce(cardinality(p_ids), 0);
BEGIN
    IF want = 0 THEN
        RETURN;
    END IF;
    LOCK TABLE ONLY {s}.leases IN ROW EXCLUSIVE MODE;
    SELECT r.current, r.slots INTO cur, slots FROM {s}.lease_ring_state r;
    FOR back IN 0 .. slots - 1 LOOP
        ls := (cur - back + slots) % slots;
        CASE ls
-- {each lease slot}
        WHEN {i} THEN
            RETURN QUERY
            WITH done AS (
                DELETE FROM {s}.leases_{i} l
                USING unnest(p_ids, p_leases) AS t(id, run_lease)
                WHERE l.id = ANY (p_ids) AND l.id = t.id AND l.run_lease = t.run_lease
                RETURNING l.id, l.run_lease, l.slot, l.generation, l.seq
            ), receipt AS (
                INSERT INTO {s}.receipts (slot, generation, seqs, finalized_at)
                SELECT d.slot, d.generation, array_agg(d.seq), now() FROM done d
                GROUP BY d.slot, d.generation
            )
            SELECT d.id, d.run_lease FROM done d;
-- {end each lease slot}
        END CASE;
        GET DIAGNOSTICS k = ROW_COUNT;
        done_n := done_n + k;
        -- A pair given twice is completed once: count the distinct pairs before looking on.
        IF back = 0 AND done_n < want THEN
            SELECT count(*) INTO want
            FROM (SELECT DISTINCT t.i, t.l FROM unnest(p_ids, p_leases) AS t(i, l)) u;
        END IF;
        EXIT WHEN done_n >= want;
    END LOOP;
END $$;

-- Rescue: running attempts whose heartbeat is older than p_stale or whose deadline has passed,
-- and callbacks past their timeout, lose their lease (so a late completion of that attempt
-- finds no guard); their jobs are deferred as retryable, or failed when out of attempts, or
-- cancelled when a cancel was requested while they ran. Returns the jobs rescued (with their
-- kind and queue, for the metrics).
CREATE FUNCTION {s}.qs_rescue(p_stale interval)
RETURNS TABLE (id bigint, kind text, queue text) LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM {s}.leases l
        WHERE (NOT l.waiting AND (l.heartbeat_at < now() - p_stale OR l.deadline_at < now()))
           OR l.callback_timeout_at < now()
        RETURNING l.id, l.run_lease, l.slot, l.generation, l.seq, l.attempt, l.queue, l.priority,
                  l.progress, l.cancel_requested_at IS NOT NULL AS cancel,
                  CASE WHEN l.callback_timeout_at < now() THEN 'rescued: callback timed out'
                       WHEN l.deadline_at < now() THEN 'rescued: deadline passed'
                       ELSE 'rescued: heartbeat stale' END AS reason
    ), rows AS (
        SELECT g.*, e.kind, e.args, e.max_attempts, e.created_at, e.metadata, e.tags,
               e.unique_key, e.unique_states, e.ordering_key,
               e.errors || jsonb_build_array(jsonb_build_object(
                   'attempt', g.attempt, 'error', g.reason, 'at', now())) AS errors
        FROM gone g JOIN {s}.ready_entries e
          ON e.slot = g.slot AND e.queue = g.queue AND e.priority = g.priority AND e.seq = g.seq
    ), retry AS (
        INSERT INTO {s}.deferred_jobs (id, state, queue, priority, kind, args, attempt,
            max_attempts, run_lease, run_at, created_at, metadata, tags, errors, unique_key,
            unique_states, ordering_key, progress)
        SELECT r.id, 'retryable', r.queue, r.priority, r.kind, r.args, r.attempt, r.max_attempts,
               r.run_lease, now(), r.created_at, r.metadata, r.tags, r.errors, r.unique_key,
               r.unique_states, r.ordering_key, r.progress
        FROM rows r WHERE r.attempt < r.max_attempts AND NOT r.cancel
    ), dead AS (
        -- Out of attempts: failed; a cancel was requested while it ran: cancelled.
        INSERT INTO {s}.done_entries (slot, generation, seq, state, errors, finalized_at, progress)
        SELECT r.slot, r.generation, r.seq, CASE WHEN r.cancel THEN 'cancelled' ELSE 'failed' END,
               r.errors, now(), r.progress
        FROM rows r WHERE r.attempt >= r.max_attempts OR r.cancel
    )
    SELECT r.id, r.kind, r.queue FROM rows r
$$;

-- Promote due deferred jobs: delete them and append a ready entry each (same id, attempt and
-- run lease) in the current slot.
CREATE FUNCTION {s}.qs_promote()
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    cur record;
    n bigint;
    queues bigint;
BEGIN
    SELECT * INTO cur FROM {s}.qs_current_slot();
    WITH due AS (
        DELETE FROM {s}.deferred_jobs d WHERE d.run_at <= now() RETURNING d.*
    ), ins AS (
        INSERT INTO {s}.ready_entries (slot, generation, queue, priority, seq, id, kind, args,
            attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
            unique_key, unique_states, ordering_key, progress)
        SELECT cur.slot, cur.generation, d.queue, d.priority, nextval('{s}.qs_seq'), d.id, d.kind,
               d.args, d.attempt, d.max_attempts, d.run_lease, d.run_at, d.created_at, d.metadata,
               d.tags, d.errors, d.unique_key, d.unique_states, d.ordering_key, d.progress
        FROM (SELECT * FROM due ORDER BY priority, run_at, id) d
        RETURNING queue
    ), woken AS (
        -- The wake-up hint, once per queue that received jobs.
        SELECT pg_notify(awa.queue_channel(q.queue), '') FROM (SELECT DISTINCT queue FROM ins) q
    )
    SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM woken) INTO n, queues;
    RETURN n;
END $$;

-- Whether a queue slot holds entries or history (a slot the ring may not move into).
CREATE FUNCTION {s}.qs_slot_busy(p_slot integer) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    busy boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM {s}.ready_entries_%1$s)'
                   ' OR EXISTS (SELECT 1 FROM {s}.done_entries_%1$s)'
                   ' OR EXISTS (SELECT 1 FROM {s}.receipts_%1$s)', p_slot) INTO busy;
    RETURN busy;
END $$;

-- Rotate the queue ring: when the next slot is empty (reclaimed), make it current under a new
-- generation. Returns the new current slot, or NULL when the next slot still holds rows.
CREATE FUNCTION {s}.qs_rotate_queue()
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    st {s}.queue_ring_state;
    nxt integer;
    saved_timeout text;
BEGIN
    -- Whether the next slot is free yet, checked first without a lock (on a full ring most
    -- passes end here) and again under the locks below.
    SELECT * INTO st FROM {s}.queue_ring_state;
    IF {s}.qs_slot_busy((st.current + 1) % st.slots) THEN
        RETURN NULL;
    END IF;
    -- The ring's lock first (a producer in REPEATABLE READ takes it, then the ring's row), and
    -- only for a moment: while we wait for producers still appending to the current slot,
    -- every new producer waits behind us, so a long transaction that appended costs this pass,
    -- not the producers' throughput.
    saved_timeout := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '50ms', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('awa.qs_ring'), hashtext('{s}'));
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', saved_timeout, true);
        RETURN NULL;
    END;
    PERFORM set_config('lock_timeout', saved_timeout, true);
    SELECT * INTO st FROM {s}.queue_ring_state FOR UPDATE;
    nxt := (st.current + 1) % st.slots;
    IF {s}.qs_slot_busy(nxt) THEN
        RETURN NULL;
    END IF;
    -- Every producer that read the closing slot as current has ended (they held the ring's
    -- lock shared), so every seq in it was drawn before now: seal it with the seq's value.
    UPDATE {s}.queue_ring_slots SET seal_seq = {s}.qs_last_seq() WHERE slot = st.current;
    UPDATE {s}.queue_ring_slots SET generation = st.generation + 1, opened_at = now(),
        seal_seq = NULL
    WHERE slot = nxt;
    UPDATE {s}.queue_ring_state SET current = nxt, generation = st.generation + 1;
    RETURN nxt;
END $$;

-- Whether a queue slot holds history (receipts, failed or cancelled attempts) finalized within
-- the last p_retention (completed jobs' retention): such a slot is not reclaimed yet. Failed
-- and cancelled jobs older than that but within their own, longer retention are carried
-- forward by the reclaim instead of holding the slot (which would hold every slot after it).
CREATE FUNCTION {s}.qs_slot_young(p_slot integer, p_retention interval)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    young boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM {s}.receipts_%1$s WHERE finalized_at > now() - $1)'
                   ' OR EXISTS (SELECT 1 FROM {s}.done_entries_%1$s WHERE finalized_at > now() - $1)', p_slot)
        INTO young USING p_retention;
    RETURN young;
END $$;

-- Reclaim the oldest queue slot (the one after the current): in one transaction holding
-- ACCESS EXCLUSIVE on its children, carry forward what is still live into the current slot
-- (unconsumed entries with a new seq; entries of open leases as consumed, the lease pointed at
-- the copy) and the failed and cancelled jobs finalized within p_failed_retention (their
-- entries as consumed, their done entries pointed at the copies; NULL: p_retention), then
-- TRUNCATE. Refused (NULL) while the slot is current or its completed history is younger than
-- p_retention. Returns the number of entries carried forward.
CREATE FUNCTION {s}.qs_reclaim_queue(p_retention interval, p_failed_retention interval DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    st {s}.queue_ring_state;
    old integer;
    cur record;
    young boolean;
    saved_timeout text;
    carried bigint := 0;
    n bigint;
BEGIN
    -- We append (carry-forward): the ring's lock shared, before the ring's row, in the
    -- order a rotation takes them.
    PERFORM {s}.qs_ring_lock_shared();
    SELECT * INTO st FROM {s}.queue_ring_state FOR UPDATE;
    old := (st.current + 1) % st.slots;
    IF old = st.current THEN
        RETURN NULL;
    END IF;
    -- Nothing was written to the slot since it was last truncated (or ever): nothing to reclaim.
    -- Checked by file size, without a lock: its TRUNCATE would only rewrite catalog rows and
    -- invalidate every backend's claim plans (the ring's empty slots met every pass: 10-14 ms,
    -- and 4-8 ms claims right after).
    IF pg_relation_size(format('{s}.ready_entries_%s', old)::regclass) = 0
       AND pg_relation_size(format('{s}.claimed_entries_%s', old)::regclass) = 0
       AND pg_relation_size(format('{s}.receipts_%s', old)::regclass) = 0
       AND pg_relation_size(format('{s}.done_entries_%s', old)::regclass) = 0 THEN
        RETURN NULL;
    END IF;
    -- Too young to reclaim? Checked first without a lock, so the passes that find history
    -- within its retention (most of them) stall nobody; checked again under the locks.
    young := {s}.qs_slot_young(old, p_retention);
    IF young THEN
        RETURN NULL;
    END IF;
    PERFORM pg_current_xact_id();  -- we draw seqs: hold an xid first, as producers do
    -- Leases first (completions delete leases, then write a receipt into the entry's slot),
    -- then the slot's tables. A reader (the qs_jobs view, a user's SQL) may hold one of the
    -- slot's tables while it waits for another that we already hold, in an order we do not
    -- control; so we wait at most a moment for our locks and otherwise give up this pass
    -- (well before PostgreSQL's deadlock check, which would otherwise cancel the reader).
    saved_timeout := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '100ms', true);
    BEGIN
        LOCK TABLE ONLY {s}.leases IN EXCLUSIVE MODE;
        EXECUTE format('LOCK TABLE {s}.ready_entries_%1$s, {s}.claimed_entries_%1$s,'
                       ' {s}.receipts_%1$s, {s}.done_entries_%1$s IN ACCESS EXCLUSIVE MODE', old);
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        PERFORM set_config('lock_timeout', saved_timeout, true);
        RETURN NULL;
    END;
    PERFORM set_config('lock_timeout', saved_timeout, true);
    young := {s}.qs_slot_young(old, p_retention);
    IF young THEN
        RETURN NULL;
    END IF;
    SELECT * INTO cur FROM {s}.qs_current_slot();

    -- Unconsumed entries: appended again with a new seq (nothing claimed them, nothing points
    -- at them).
    EXECUTE format($f$
        INSERT INTO {s}.ready_entries (slot, generation, queue, priority, seq, id, kind, args,
            attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
            unique_key, unique_states, ordering_key, progress)
        SELECT $1, $2, e.queue, e.priority, nextval('{s}.qs_seq'), e.id, e.kind, e.args,
               e.attempt, e.max_attempts, e.run_lease, e.run_at, e.created_at, e.metadata, e.tags,
               e.errors, e.unique_key, e.unique_states, e.ordering_key, e.progress
        FROM (SELECT * FROM {s}.ready_entries_%1$s o
              WHERE NOT EXISTS (SELECT 1 FROM {s}.claimed_entries_%1$s c
                                WHERE c.queue = o.queue AND c.priority = o.priority AND c.seq = o.seq)
                AND o.seq >= {s}.qs_lane_cursor(o.queue, o.priority)
              ORDER BY o.seq) e$f$, old) USING cur.slot, cur.generation;
    GET DIAGNOSTICS n = ROW_COUNT;
    carried := carried + n;

    -- Entries of open leases, and failed and cancelled jobs within their retention (canonical
    -- keeps them that long too; older ones go with the slot, as canonical's pruning deletes
    -- them): each entry appended again as consumed, and in the same statement the lease moved
    -- onto the copy (so no moment exists where the lease points at nothing), or the done entry
    -- written again against it.
    EXECUTE format($f$
        WITH kept AS (
            SELECT nextval('{s}.qs_seq') AS nseq, l.id AS lid, l.run_lease AS lrl,
                   NULL::text AS d_state, NULL::jsonb AS d_errors,
                   NULL::timestamptz AS d_finalized_at, NULL::boolean AS d_ran,
                   NULL::jsonb AS d_progress, e.*
            FROM {s}.leases l JOIN {s}.ready_entries_%1$s e
              ON e.queue = l.queue AND e.priority = l.priority AND e.seq = l.seq
            WHERE l.slot = %1$s
            UNION ALL
            SELECT nextval('{s}.qs_seq'), NULL, NULL, d.state, d.errors, d.finalized_at, d.ran,
                   d.progress, e.*
            FROM {s}.done_entries_%1$s d JOIN {s}.ready_entries_%1$s e ON e.seq = d.seq
            WHERE d.finalized_at > now() - $3
        ), copy AS (
            INSERT INTO {s}.ready_entries (slot, generation, queue, priority, seq, id, kind, args,
                attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
                unique_key, unique_states, ordering_key, progress)
            SELECT $1, $2, k.queue, k.priority, k.nseq, k.id, k.kind, k.args, k.attempt,
                   k.max_attempts, k.run_lease, k.run_at, k.created_at, k.metadata, k.tags,
                   k.errors, k.unique_key, k.unique_states, k.ordering_key, k.progress
            FROM kept k
        ), mark AS (
            INSERT INTO {s}.claimed_entries (slot, queue, priority, seq)
            SELECT $1, k.queue, k.priority, k.nseq FROM kept k
        ), moved AS (
            UPDATE {s}.leases l SET slot = $1, generation = $2, seq = k.nseq
            FROM kept k WHERE k.lid IS NOT NULL AND l.id = k.lid AND l.run_lease = k.lrl
            RETURNING 1
        ), done AS (
            INSERT INTO {s}.done_entries (slot, generation, seq, state, errors, finalized_at, ran,
                                          progress)
            SELECT $1, $2, k.nseq, k.d_state, k.d_errors, k.d_finalized_at, k.d_ran, k.d_progress
            FROM kept k WHERE k.d_state IS NOT NULL
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM moved) + (SELECT count(*) FROM done)$f$, old)
        INTO n USING cur.slot, cur.generation, coalesce(p_failed_retention, p_retention);
    carried := carried + n;

    -- Unique keys of jobs that live nowhere else (their history leaves with the slot) are
    -- given back; a key a live job holds stays.
    EXECUTE format($f$
        DELETE FROM {s}.unique_keys u USING {s}.ready_entries_%1$s e
        WHERE e.unique_key IS NOT NULL AND u.unique_key = e.unique_key AND u.id = e.id
          AND NOT EXISTS (SELECT 1 FROM {s}.leases l WHERE l.id = e.id)
          AND NOT EXISTS (SELECT 1 FROM {s}.deferred_jobs d WHERE d.id = e.id)
          AND NOT EXISTS (SELECT 1 FROM {s}.ready_entries o
                          WHERE o.id = e.id AND o.unique_key IS NOT NULL AND o.slot <> %1$s)$f$, old);

    EXECUTE format('TRUNCATE {s}.ready_entries_%1$s, {s}.claimed_entries_%1$s, {s}.receipts_%1$s,'
                   ' {s}.done_entries_%1$s', old);
    UPDATE {s}.queue_ring_slots SET seal_seq = -1 WHERE slot = old;
    RETURN carried;
END $$;

-- Move the lease ring on: the first slot after the current one that holds no lease is
-- truncated (its leases' dead tuples go with it) and becomes current, and every other slot
-- that holds no lease but has rows is truncated too. Returns the current slot.
-- A slot is locked in a subtransaction and waited for a moment at most (a completion locks the
-- slots it looks in, a heartbeat every slot, and a reader may hold lease slots in any order); a
-- busy or non-empty slot is released at once and the next one tried.
-- With p_min_bytes, only once the current slot's file holds at least that much (the runtime's
-- leader asks for a slot's worth, so a quiet ring is not truncated every pass: each TRUNCATE
-- rewrites catalog rows and costs every backend a cache refresh, which showed as 4-5 ms claims
-- right after it); until then it returns the current slot without a lock or a write.
CREATE FUNCTION {s}.qs_rotate_leases(p_min_bytes bigint DEFAULT 0)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    st {s}.lease_ring_state;
    i integer;
    moved integer;
    empty boolean;
    saved_timeout text;
BEGIN
    IF p_min_bytes > 0 THEN
        SELECT * INTO st FROM {s}.lease_ring_state;
        IF pg_relation_size(format('{s}.leases_%s', st.current)::regclass) < p_min_bytes THEN
            RETURN st.current;
        END IF;
    END IF;
    SELECT * INTO st FROM {s}.lease_ring_state FOR UPDATE;
    saved_timeout := current_setting('lock_timeout');
    -- Short: while we wait for a slot, every completion and heartbeat that needs it queues
    -- behind us (a heartbeat scans every lease slot).
    PERFORM set_config('lock_timeout', '10ms', true);
    -- The first empty slot becomes current; every other empty slot with rows is truncated in
    -- the same pass, so the dead leases of a turn wait one turn, not a whole trip of the ring.
    FOR k IN 1 .. st.slots - 1 LOOP
        i := (st.current + k) % st.slots;
        CONTINUE WHEN moved IS NOT NULL
                      AND pg_relation_size(format('{s}.leases_%s', i)::regclass) = 0;
        BEGIN
            EXECUTE format('LOCK TABLE {s}.leases_%s IN ACCESS EXCLUSIVE MODE', i);
            EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM {s}.leases_%s)', i) INTO empty;
            IF NOT empty THEN
                -- Roll the subtransaction back, so its lock goes too.
                RAISE EXCEPTION 'lease slot % is in use', i USING ERRCODE = 'AWQ01';
            END IF;
            -- A slot whose file is already empty needs no TRUNCATE: each one rewrites the
            -- catalog rows of the slot and its indexes, dead tuples in pg_class that only a
            -- vacuum of the catalog reclaims.
            IF pg_relation_size(format('{s}.leases_%s', i)::regclass) > 0 THEN
                EXECUTE format('TRUNCATE {s}.leases_%s', i);
            END IF;
            IF moved IS NULL THEN
                UPDATE {s}.lease_ring_state SET current = i;
                moved := i;
            END IF;
        EXCEPTION WHEN lock_not_available OR deadlock_detected OR SQLSTATE 'AWQ01' THEN
            NULL;
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', saved_timeout, true);
    RETURN coalesce(moved, st.current);
END $$;

-- Whether job p_id is now in a state of the mask p_mask (its unique key still held).
CREATE FUNCTION {s}.qs_key_held(p_id bigint, p_mask smallint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {s}.qs_jobs j
                   WHERE j.id = p_id AND j.unique_key IS NOT NULL
                     AND (p_mask & awa.state_bit(j.state)) <> 0)
$$;

-- How many jobs still need a runtime (what a transition's abort waits for).
CREATE FUNCTION {s}.qs_jobs_live() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM {s}.qs_jobs
    WHERE state IN ('available', 'scheduled', 'retryable', 'running', 'waiting_external')
$$;
