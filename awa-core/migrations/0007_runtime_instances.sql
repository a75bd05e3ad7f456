-- The runtime registry (docs/runtime-registry.md): one row per running client, inserted when it
-- starts, refreshed on each of its heartbeats and on each change of maintenance leadership,
-- deleted on clean shutdown; rows not refreshed for ten of their own intervals (and at least a
-- minute) are pruned by the maintenance leader. Column names follow awa-pg's table of the same
-- name, so tools written for it read the common columns. Re-runnable.
CREATE TABLE IF NOT EXISTS awa.runtime_instances (
    instance_id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    hostname             text,
    pid                  integer     NOT NULL,
    version              text        NOT NULL,
    queues               jsonb       NOT NULL DEFAULT '[]'::jsonb,
    leader               boolean     NOT NULL DEFAULT false,
    started_at           timestamptz NOT NULL DEFAULT now(),
    last_seen_at         timestamptz NOT NULL DEFAULT now(),
    snapshot_interval_ms bigint      NOT NULL,
    CONSTRAINT awa_runtime_instances_queues_check CHECK (jsonb_typeof(queues) = 'array'),
    CONSTRAINT awa_runtime_instances_interval_check CHECK (snapshot_interval_ms > 0)
);
CREATE INDEX IF NOT EXISTS idx_awa_runtime_instances_last_seen
    ON awa.runtime_instances (last_seen_at);
