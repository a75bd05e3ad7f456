-- Awa schema, version 14: a dead-lettered job keeps its unique key, so that a revive gives it
-- back. Moving a job to the DLQ still frees the key (the DLQ holds none: a new job with the
-- same key may be inserted meanwhile); reviving it takes the key again, and is refused as an
-- insert is (unique_violation on "idx_awa_jobs_unique") when another job holds it. Rows moved
-- before this version have no key and are revived without one, as before.
ALTER TABLE awa.jobs_dlq ADD COLUMN IF NOT EXISTS unique_key bytea;
ALTER TABLE awa.jobs_dlq ADD COLUMN IF NOT EXISTS unique_states smallint;
