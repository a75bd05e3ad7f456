-- Awa schema version 8: CEL rules of external callbacks.
-- register_callback(filter=, on_complete=, on_fail=, transform=) stores its expressions here
-- as {"callback_id": ..., "filter": ..., ...}; resolve_callback applies them only while
-- callback_rules->>'callback_id' is the job's current callback_id, so every path that clears
-- or replaces a callback (finalizing, rescue, cancel, a new registration) retires its rules
-- without having to clear this column.
ALTER TABLE awa.jobs ADD COLUMN IF NOT EXISTS callback_rules jsonb;
