-- Awa schema version 10: durable batch operations.
-- One row per operator request to change many queued jobs at once (set_priority, move_queue;
-- docs/batch-operations.md). The maintenance leader applies each in small chunks and keeps
-- its progress here, so a new leader resumes from `cursor` where the old one stopped. Column
-- names follow awa-pg's table of the same name, so tools written for it read the same keys.
CREATE TABLE IF NOT EXISTS awa.batch_operations (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    op_kind         text        NOT NULL,
    filter          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    spec            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state           text        NOT NULL DEFAULT 'pending',
    submitted_by    text,
    submitted_at    timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finalized_at    timestamptz,
    -- {"after_job_id": n, "max_job_id": m} once the leader has scanned the operation.
    cursor          jsonb,
    total_matched   bigint,
    processed       bigint      NOT NULL DEFAULT 0,
    skipped         bigint      NOT NULL DEFAULT 0,
    errored         bigint      NOT NULL DEFAULT 0,
    last_error      text,
    runner_instance text,
    retention_until timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- The highest job id when the operation was submitted: jobs inserted later are never
    -- part of it (the snapshot bound; not one of awa-pg's columns).
    snapshot_max_id bigint      NOT NULL DEFAULT 0,
    CONSTRAINT awa_batch_operations_op_kind_check
        CHECK (op_kind IN ('set_priority', 'move_queue')),
    CONSTRAINT awa_batch_operations_state_check CHECK (state IN ('pending', 'scanning',
        'running', 'cancelling', 'completed', 'cancelled', 'failed')),
    CONSTRAINT awa_batch_operations_finalized_check
        CHECK ((state IN ('completed', 'cancelled', 'failed')) = (finalized_at IS NOT NULL)),
    CONSTRAINT awa_batch_operations_filter_check CHECK (jsonb_typeof(filter) = 'object'),
    CONSTRAINT awa_batch_operations_spec_check CHECK (jsonb_typeof(spec) = 'object'),
    CONSTRAINT awa_batch_operations_counts_check
        CHECK (processed >= 0 AND skipped >= 0 AND errored >= 0)
);
-- The leader's pick: active operations, oldest first.
CREATE INDEX IF NOT EXISTS idx_awa_batch_operations_active ON awa.batch_operations (submitted_at)
    WHERE state IN ('pending', 'scanning', 'running', 'cancelling');
-- list_batch_operations(state=...), newest first.
CREATE INDEX IF NOT EXISTS idx_awa_batch_operations_state
    ON awa.batch_operations (state, submitted_at DESC);
-- purge_batch_operations(before) and the leader's retention prune.
CREATE INDEX IF NOT EXISTS idx_awa_batch_operations_finalized
    ON awa.batch_operations (finalized_at) WHERE finalized_at IS NOT NULL;
