-- Unique keys move from SHA-256 (32 bytes) to awa's BLAKE3 layout (16 bytes), so that a key
-- computed here equals awa-pg's for the same parts (docs/unique-keys.md).
--
-- PostgreSQL has no BLAKE3, so existing keys are recomputed by a Rust step: this migration only
-- records the step as pending, and migrate() runs it right after this SQL, in the same
-- transaction and under the same advisory lock. A schema brought up to date with the SQL of
-- pending_sql() (by hand) keeps the step pending until the next migrate() of any client; the step
-- is DML only, so the application role may run it. Re-runnable.
CREATE TABLE IF NOT EXISTS awa.pending_steps (
    step          text PRIMARY KEY,
    since_version integer NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO awa.pending_steps (step, since_version) VALUES ('rewrite_unique_keys_blake3', 9)
    ON CONFLICT (step) DO NOTHING;
