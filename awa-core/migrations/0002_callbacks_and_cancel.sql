-- Awa schema, version 2.

-- resume_external's payload for a handler waiting in wait_for_callback:
-- {"callback_id": ..., "payload": ...}, taken (cleared) by the waiting attempt.
ALTER TABLE awa.jobs ADD COLUMN IF NOT EXISTS callback_result jsonb;

-- Set by cancel() on a running job, so heartbeats deliver the request even when the
-- awa:cancel notification was missed; cleared when the job is claimed again.
ALTER TABLE awa.jobs ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;
