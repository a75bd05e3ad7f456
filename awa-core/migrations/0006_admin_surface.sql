-- Who paused a queue and when (awa-pg's pause_queue(queue, paused_by)): recorded for the
-- operator tools; claiming only reads `paused`. Resuming clears both.
ALTER TABLE awa.queue_meta
    ADD COLUMN IF NOT EXISTS paused_by text,
    ADD COLUMN IF NOT EXISTS paused_at timestamptz;

-- A dead-lettered job keeps when it was due and when it failed, so a DLQ entry's job reads
-- like the row it was (NULL for rows moved before this migration).
ALTER TABLE awa.jobs_dlq
    ADD COLUMN IF NOT EXISTS run_at timestamptz,
    ADD COLUMN IF NOT EXISTS finalized_at timestamptz;

-- list_dlq / purge_dlq by kind, newest first.
CREATE INDEX IF NOT EXISTS idx_awa_jobs_dlq_kind ON awa.jobs_dlq (kind, dlq_at);
