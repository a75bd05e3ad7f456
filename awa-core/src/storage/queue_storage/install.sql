-- Queue storage (issue 18; docs/queue-storage-design.md): the append-only substrate's tables.
-- `{s}` is the substrate schema (a checked identifier), `{q}` the number of queue slots, `{l}`
-- the number of lease slots; children are created by the installer. The functions that work
-- on these tables are in `functions.sql`, which an install runs after this script and an
-- upgrade runs again on its own (mod.rs `SUBSTRATE_VERSION`): nothing here is ever replaced,
-- so a change to a table needs a migration of its own.

CREATE SCHEMA IF NOT EXISTS {s};

-- One seq for every lane: order within a lane; gaps (other lanes, rolled-back producers) are
-- passed like consumed entries.
CREATE SEQUENCE {s}.qs_seq;

CREATE TABLE {s}.queue_ring_state (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    current    integer NOT NULL,
    slots      integer NOT NULL,
    generation bigint  NOT NULL
);
-- `seal_seq`: NULL while the slot is current; once the ring has moved past it, a seq no entry
-- of the slot is above (the rotation's `qs_seq` value: no producer can append to a slot that
-- is no longer current, see `qs_current_slot`); -1 while it is empty (never used, or
-- reclaimed). A claim reads only the slots whose entries can be at or past its cursor.
CREATE TABLE {s}.queue_ring_slots (
    slot       integer PRIMARY KEY,
    generation bigint  NOT NULL,
    opened_at  timestamptz,
    seal_seq   bigint
);
CREATE TABLE {s}.lease_ring_state (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    current    integer NOT NULL,
    slots      integer NOT NULL
);

-- Ready entries: appended, never updated. A lane is (queue, priority).
CREATE TABLE {s}.ready_entries (
    slot         integer     NOT NULL,
    generation   bigint      NOT NULL,
    queue        text        NOT NULL,
    priority     smallint    NOT NULL,
    seq          bigint      NOT NULL DEFAULT nextval('{s}.qs_seq'),
    id           bigint      NOT NULL DEFAULT nextval('awa.jobs_id_seq'),
    kind         text        NOT NULL,
    args         jsonb       NOT NULL,
    attempt      integer     NOT NULL,
    max_attempts integer     NOT NULL,
    run_lease    bigint      NOT NULL,
    run_at       timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    metadata     jsonb       NOT NULL,
    tags         text[]      NOT NULL,
    errors       jsonb       NOT NULL,
    unique_key   bytea,
    unique_states smallint,
    ordering_key text,
    -- The progress the job's earlier attempts left (kept across retries, as canonical keeps
    -- it); NULL for a new job.
    progress     jsonb
) PARTITION BY LIST (slot);

-- What claims consumed: one narrow row per claimed entry. (Not ranges: a range between two
-- claimed seqs could cover an entry whose producer commits after the claim.)
CREATE TABLE {s}.claimed_entries (
    slot     integer  NOT NULL,
    queue    text     NOT NULL,
    priority smallint NOT NULL,
    seq      bigint   NOT NULL
) PARTITION BY LIST (slot);

-- The claim cursor of each lane and its stable point: every seq at or below `stable_seq` is
-- committed or gone. `cand_*` is the next stable point, confirmed once every transaction that
-- could hold a seq at or below `cand_seq` has ended (`cand_xmax` <= the xmin horizon):
-- `cand_xmax` is the xid of the claim that read `cand_seq`, assigned after that read.
CREATE TABLE {s}.lanes (
    queue      text     NOT NULL,
    priority   smallint NOT NULL,
    cursor     bigint   NOT NULL DEFAULT 0,
    stable_seq bigint   NOT NULL DEFAULT 0,
    cand_seq   bigint   NOT NULL DEFAULT 0,
    cand_xmax  xid8     NOT NULL DEFAULT '0'::xid8,
    PRIMARY KEY (queue, priority)
) WITH (fillfactor = 50);

-- One row per running attempt, in the lease ring.
CREATE TABLE {s}.leases (
    lease_slot   integer     NOT NULL,
    id           bigint      NOT NULL,
    run_lease    bigint      NOT NULL,
    queue        text        NOT NULL,
    priority     smallint    NOT NULL,
    slot         integer     NOT NULL,
    generation   bigint      NOT NULL,
    seq          bigint      NOT NULL,
    attempt      integer     NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    deadline_at  timestamptz,
    attempted_at timestamptz NOT NULL,
    progress     jsonb,
    callback_id  uuid,
    callback_timeout_at timestamptz,
    waiting      boolean     NOT NULL DEFAULT false,
    cancel_requested_at timestamptz,
    -- A callback's CEL rules, and a payload delivered to a handler waiting in-process
    -- (callbacks.sql).
    callback_rules  jsonb,
    callback_result jsonb
) PARTITION BY LIST (lease_slot);

-- Completions: one narrow row per batched completion statement and queue slot.
CREATE TABLE {s}.receipts (
    slot         integer     NOT NULL,
    generation   bigint      NOT NULL,
    seqs         bigint[]    NOT NULL,
    finalized_at timestamptz NOT NULL
) PARTITION BY LIST (slot);

-- Failed and cancelled jobs (narrow: the entry keeps the payload). `ran` is false for a job
-- cancelled before a claim leased its entry: no attempt was made, so none is counted.
CREATE TABLE {s}.done_entries (
    slot         integer     NOT NULL,
    generation   bigint      NOT NULL,
    seq          bigint      NOT NULL,
    state        text        NOT NULL,
    errors       jsonb       NOT NULL,
    finalized_at timestamptz NOT NULL,
    ran          boolean     NOT NULL DEFAULT true,
    progress     jsonb
) PARTITION BY LIST (slot);

-- Scheduled, retryable and snoozed jobs: whole rows, few at a time.
CREATE TABLE {s}.deferred_jobs (
    id           bigint PRIMARY KEY,
    state        text        NOT NULL,
    queue        text        NOT NULL,
    priority     smallint    NOT NULL,
    kind         text        NOT NULL,
    args         jsonb       NOT NULL,
    attempt      integer     NOT NULL,
    max_attempts integer     NOT NULL,
    run_lease    bigint      NOT NULL,
    run_at       timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    metadata     jsonb       NOT NULL,
    tags         text[]      NOT NULL,
    errors       jsonb       NOT NULL,
    unique_key   bytea,
    unique_states smallint,
    ordering_key text,
    progress     jsonb
);
CREATE INDEX ON {s}.deferred_jobs (run_at);

-- Unique keys (canonical's BLAKE3 keys and state masks): one row per key, naming the job that
-- took it. A row is a claim, checked lazily: an insert whose key is taken looks at the holder's
-- current state (`qs_key_held`) and takes the key over when that state is outside the holder's
-- mask, so no state change of the hot path writes here. Rows of jobs whose history leaves with
-- a reclaimed slot are deleted then (`qs_reclaim_queue`), which keeps the table small.
CREATE TABLE {s}.unique_keys (
    unique_key    bytea    PRIMARY KEY,
    id            bigint   NOT NULL,
    unique_states smallint NOT NULL
);


-- The `qs_jobs` view (every job the substrate holds) is created by `functions.sql`, which an
-- upgrade runs again: it changes with the functions that write what it reads.

-- Indexes (on the parents: every child gets its own).
CREATE INDEX ON {s}.ready_entries (queue, priority, seq);
-- A key holder's entries, by id (only entries with a key: the hot path's appends skip it).
CREATE INDEX ON {s}.ready_entries (id) WHERE unique_key IS NOT NULL;
CREATE INDEX ON {s}.claimed_entries (queue, priority, seq);
CREATE INDEX ON {s}.leases (id);
-- No index on heartbeat_at: rescue's condition (a stale heartbeat, or a passed deadline, or a
-- callback's timeout) reads every lease slot anyway, and with none, a heartbeat changes no
-- indexed column and updates its lease in place (HOT, in the room fillfactor 50 leaves). A
-- substrate installed before version 4 keeps its index (dropping it would lock every lease
-- slot against claims and completions); it costs only the index writes.

-- The children of both rings, and the rings' state: slot 0 is current, generation 1.
DO $$
BEGIN
    FOR i IN 0 .. {q} - 1 LOOP
        EXECUTE format('CREATE TABLE {s}.ready_entries_%1$s PARTITION OF {s}.ready_entries FOR VALUES IN (%1$s)', i);
        EXECUTE format('CREATE TABLE {s}.claimed_entries_%1$s PARTITION OF {s}.claimed_entries FOR VALUES IN (%1$s)', i);
        EXECUTE format('CREATE TABLE {s}.receipts_%1$s PARTITION OF {s}.receipts FOR VALUES IN (%1$s)', i);
        EXECUTE format('CREATE TABLE {s}.done_entries_%1$s PARTITION OF {s}.done_entries FOR VALUES IN (%1$s)', i);
    END LOOP;
    FOR i IN 0 .. {l} - 1 LOOP
        EXECUTE format('CREATE TABLE {s}.leases_%1$s PARTITION OF {s}.leases FOR VALUES IN (%1$s) WITH (fillfactor = 50)', i);
    END LOOP;
END $$;
INSERT INTO {s}.queue_ring_state (current, slots, generation) VALUES (0, {q}, 1);
INSERT INTO {s}.queue_ring_slots (slot, generation, opened_at, seal_seq)
SELECT g, CASE WHEN g = 0 THEN 1 ELSE 0 END, CASE WHEN g = 0 THEN now() END,
       CASE WHEN g = 0 THEN NULL ELSE -1 END
FROM generate_series(0, {q} - 1) g;
INSERT INTO {s}.lease_ring_state (current, slots) VALUES (0, {l});
