-- Awa schema version 11: queue and job-kind descriptors.
-- The catalogue the web UI and API show (docs/operating.md, "Descriptors").
-- One row per queue and per job kind a running client works or declares
-- (AsyncClient.queue_descriptor / job_kind_descriptor, awa-pg 0.6.9's API), written when the
-- client starts and refreshed with its runtime-registry row; the maintenance leader deletes
-- rows nobody refreshed for start(descriptor_retention_days=...) days. Tables and columns follow
-- awa-pg's of the same names, limits included. runtime_instances gains each client's
-- declared descriptor hashes, so the API can flag two live clients that disagree. Re-runnable.
CREATE TABLE IF NOT EXISTS awa.queue_descriptors (
    queue            text        PRIMARY KEY,
    display_name     text,
    description      text,
    owner            text,
    docs_url         text,
    tags             text[]      NOT NULL DEFAULT '{}',
    extra            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    descriptor_hash  text        NOT NULL,
    sync_interval_ms bigint      NOT NULL DEFAULT 10000,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queue_descriptors_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT queue_descriptors_display_length CHECK (length(display_name) <= 200),
    CONSTRAINT queue_descriptors_description_len CHECK (length(description) <= 2000),
    CONSTRAINT queue_descriptors_owner_length CHECK (length(owner) <= 200),
    CONSTRAINT queue_descriptors_docs_url_length CHECK (length(docs_url) <= 2048),
    CONSTRAINT queue_descriptors_tags_count CHECK (cardinality(tags) <= 20),
    CONSTRAINT queue_descriptors_hash_length CHECK (length(descriptor_hash) BETWEEN 1 AND 128),
    CONSTRAINT queue_descriptors_sync_interval_ms CHECK (sync_interval_ms > 0)
);
CREATE TABLE IF NOT EXISTS awa.job_kind_descriptors (
    kind             text        PRIMARY KEY,
    display_name     text,
    description      text,
    owner            text,
    docs_url         text,
    tags             text[]      NOT NULL DEFAULT '{}',
    extra            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    descriptor_hash  text        NOT NULL,
    sync_interval_ms bigint      NOT NULL DEFAULT 10000,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_kind_descriptors_kind_length CHECK (length(kind) BETWEEN 1 AND 200),
    CONSTRAINT job_kind_descriptors_display_length CHECK (length(display_name) <= 200),
    CONSTRAINT job_kind_descriptors_description_len CHECK (length(description) <= 2000),
    CONSTRAINT job_kind_descriptors_owner_length CHECK (length(owner) <= 200),
    CONSTRAINT job_kind_descriptors_docs_url_length CHECK (length(docs_url) <= 2048),
    CONSTRAINT job_kind_descriptors_tags_count CHECK (cardinality(tags) <= 20),
    CONSTRAINT job_kind_descriptors_hash_length CHECK (length(descriptor_hash) BETWEEN 1 AND 128),
    CONSTRAINT job_kind_descriptors_sync_interval_ms CHECK (sync_interval_ms > 0)
);
-- The retention prune's scan.
CREATE INDEX IF NOT EXISTS idx_awa_queue_descriptors_last_seen
    ON awa.queue_descriptors (last_seen_at);
CREATE INDEX IF NOT EXISTS idx_awa_job_kind_descriptors_last_seen
    ON awa.job_kind_descriptors (last_seen_at);
ALTER TABLE awa.runtime_instances
    ADD COLUMN IF NOT EXISTS queue_descriptor_hashes jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN IF NOT EXISTS job_kind_descriptor_hashes jsonb NOT NULL DEFAULT '{}'::jsonb;
