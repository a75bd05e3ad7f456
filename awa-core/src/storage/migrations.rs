//! Embedded, versioned migrations applied by [`migrate`].
//!
//! `migrate()` first reads the applied version without taking any lock or running any DDL,
//! so an application role that may only read and write Awa's tables (see
//! `docs/deploying.md`, "Roles and grants") can call it at start-up: when the schema is
//! current it is a no-op. Only when something is pending does it open a transaction, take a
//! transaction-scoped advisory lock, read the version again (another process may have
//! migrated meanwhile) and apply what is still missing. Several processes may therefore call
//! `migrate()` at once: the first applies, the others wait on the lock and then find nothing
//! left to do.
//!
//! A role that may not run DDL gets an error naming the version it found, the version this
//! library needs, and that the schema owner must run the migration ([`pending_sql`] gives
//! the owner the SQL to run by hand or from a migration tool).
//!
//! Before anything else `migrate()` checks that an existing `awa` schema is this library's:
//! awa-pg's schema (same name, another layout, version 40) is refused with
//! [`AwaError::ForeignSchema`] and never touched ([`super::foreign`]).
//!
//! Some upgrades need work SQL cannot do (migration 9 rewrites unique keys to BLAKE3, which
//! PostgreSQL cannot compute): such a migration records a row in `awa.pending_steps`, and
//! `migrate()` runs the Rust step in the same transaction, under the same lock, and deletes the
//! row. A schema migrated from [`pending_sql`] by hand keeps the row until the next
//! `migrate()`, which then runs the step (DML only, so the application role may).

use crate::error::{AwaError, Result};
use crate::storage::pool::Db;
use sqlx::Executor;

/// `(version, sql)`, in order. Never edit a released entry; add a new one.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../migrations/0001_canonical.sql")),
    (
        2,
        include_str!("../../migrations/0002_callbacks_and_cancel.sql"),
    ),
    (3, include_str!("../../migrations/0003_deferred_notify.sql")),
    (
        4,
        include_str!("../../migrations/0004_follow_up_insert.sql"),
    ),
    (5, include_str!("../../migrations/0005_cron.sql")),
    (6, include_str!("../../migrations/0006_admin_surface.sql")),
    (
        7,
        include_str!("../../migrations/0007_runtime_instances.sql"),
    ),
    (8, include_str!("../../migrations/0008_callback_rules.sql")),
    (
        9,
        include_str!("../../migrations/0009_unique_keys_blake3.sql"),
    ),
    (
        10,
        include_str!("../../migrations/0010_batch_operations.sql"),
    ),
    (11, include_str!("../../migrations/0011_descriptors.sql")),
    (
        12,
        include_str!("../../migrations/0012_storage_transition.sql"),
    ),
    (13, include_str!("../../migrations/0013_jobs_view.sql")),
    (
        14,
        include_str!("../../migrations/0014_dlq_unique_keys.sql"),
    ),
];

/// The first version with `awa.pending_steps`.
const PENDING_STEPS_SINCE: i32 = 9;

/// Every migration as `(version, description, sql)`, oldest first, as awa-pg's
/// `migrations()` lists them; the description is the file's first comment line.
pub fn migrations() -> Vec<(i32, String, &'static str)> {
    MIGRATIONS
        .iter()
        .map(|(v, sql)| (*v, describe(sql), *sql))
        .collect()
}

/// The migrations after `from` up to and including `to` (awa-pg's `migrations_range`).
pub fn migrations_range(from: i32, to: i32) -> Vec<(i32, String, &'static str)> {
    migrations()
        .into_iter()
        .filter(|(v, _, _)| *v > from && *v <= to)
        .collect()
}

fn describe(sql: &str) -> String {
    let first = sql.lines().next().unwrap_or_default();
    let text = first.trim_start_matches('-').trim();
    // "Awa schema version 5: periodic (cron) jobs." -> "periodic (cron) jobs"
    let text = text.split_once(": ").map_or(text, |(_, rest)| rest);
    text.trim_end_matches('.').to_string()
}

/// Advisory lock key serializing migrations ("awa_migrate" folded into an i64).
const MIGRATE_LOCK: i64 = 0x6177_615f_6d69_6772;

/// The schema and the version bookkeeping table; runs before any migration.
const BOOTSTRAP_SQL: &str = "CREATE SCHEMA IF NOT EXISTS awa;
CREATE TABLE IF NOT EXISTS awa.schema_version (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now());";

/// SQLSTATE `insufficient_privilege`.
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// The newest schema version this library knows.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |(v, _)| *v)
}

/// Apply every pending migration, then replace queue storage's functions where an older
/// library installed them ([`super::queue_storage::SUBSTRATE_VERSION`]). Idempotent and safe
/// to run concurrently; a no-op (a few reads, no lock, no DDL) when the schema is already at
/// [`latest_version`] or newer and queue storage's functions are current, so a role without
/// CREATE rights may call it.
pub async fn migrate(pool: &Db) -> Result<()> {
    super::foreign::refuse_foreign(pool).await?;
    let found = current_version(pool).await?;
    if found < latest_version() || steps_pending(pool, found).await? {
        apply_migrations(pool, latest_version(), true)
            .await
            .map_err(|e| explain_permission(e, found))?;
    }
    // Queue storage's functions are versioned on their own (a no-op read when current).
    super::queue_storage::upgrade_installed(pool).await
}

/// Apply the migrations up to `target` only (and no pending steps): how the tests build a
/// database "at an older version" to upgrade.
#[cfg(feature = "test-seams")]
pub async fn migrate_to(pool: &Db, target: i32) -> Result<()> {
    super::foreign::refuse_foreign(pool).await?;
    Ok(apply_migrations(pool, target, false).await?)
}

/// Whether a Rust step recorded by a migration still waits (read-only).
async fn steps_pending(pool: &Db, version: i32) -> Result<bool> {
    if version < PENDING_STEPS_SINCE {
        return Ok(false);
    }
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM awa.pending_steps)")
            .fetch_one(pool)
            .await?,
    )
}

/// Take the lock, re-read the version and apply what is still missing up to `target`, then
/// (with `steps`) the pending Rust steps, in one transaction.
async fn apply_migrations(
    pool: &Db,
    target: i32,
    steps: bool,
) -> std::result::Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *tx)
        .await?;
    // Another process may have migrated while this one waited for the lock: when the schema
    // is current now, end without any DDL (which this role may not be allowed to run). Read
    // pg_class with the statement's snapshot, not through to_regclass: this backend's catalog
    // cache may still hold "no such schema" from before the wait (no invalidation is processed
    // while waiting on an advisory lock), and would then re-run migration 1.
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = 'awa' AND c.relname = 'schema_version')",
    )
    .fetch_one(&mut *tx)
    .await?;
    let mut current = 0;
    if exists {
        current = version_in(&mut *tx).await?;
    }
    if current < target {
        // A plain &str runs under the simple protocol, which allows several statements.
        (&mut *tx).execute(BOOTSTRAP_SQL).await?;
        for (version, sql) in MIGRATIONS
            .iter()
            .filter(|(v, _)| *v > current && *v <= target)
        {
            tracing::info!(version, "applying awa migration");
            (&mut *tx).execute(*sql).await?;
            sqlx::query("INSERT INTO awa.schema_version (version) VALUES ($1)")
                .bind(version)
                .execute(&mut *tx)
                .await?;
        }
    }
    if steps && current.max(target) >= PENDING_STEPS_SINCE {
        run_pending_steps(&mut tx).await?;
    }
    tx.commit().await
}

/// Run each step a migration recorded, and delete its row; all in the migration's transaction,
/// so a failed step leaves both the step and the schema as they were. A step this library
/// does not know (recorded by a newer version) is left for that version.
async fn run_pending_steps(tx: &mut sqlx::PgConnection) -> std::result::Result<(), sqlx::Error> {
    let steps: Vec<String> =
        sqlx::query_scalar("SELECT step FROM awa.pending_steps ORDER BY since_version, step")
            .fetch_all(&mut *tx)
            .await?;
    for step in steps {
        if step != super::key_rewrite::STEP {
            tracing::warn!(step, "unknown pending upgrade step left in place");
            continue;
        }
        super::key_rewrite::rewrite(&mut *tx).await?;
        sqlx::query("DELETE FROM awa.pending_steps WHERE step = $1")
            .bind(&step)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// The server's message when `e` is a refusal for lack of rights (`insufficient_privilege`).
pub(crate) fn denied(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .filter(|db| db.code().as_deref() == Some(INSUFFICIENT_PRIVILEGE))
        .map(|db| db.message().to_string())
}

/// Turn a permission error from the DDL into one that says what to do; pass others through.
fn explain_permission(e: sqlx::Error, found: i32) -> AwaError {
    let Some(cause) = denied(&e) else {
        return e.into();
    };
    let found = if found == 0 {
        "the awa schema does not exist (version 0)".to_string()
    } else {
        format!("the awa schema is at version {found}")
    };
    // `State` until the error type has a variant of its own for this (its Display is the
    // message as is, and Python raises it as awa.AwaError).
    AwaError::State(format!(
        "{found} but this library needs version {needed}, and this database role may not \
         change the schema ({cause}); the schema owner must run migrate() (or the SQL from \
         awa_core::storage::migrations::pending_sql) first, see docs/deploying.md",
        needed = latest_version(),
    ))
}

async fn version_in<'e, E>(executor: E) -> std::result::Result<i32, sqlx::Error>
where
    E: Executor<'e, Database = sqlx::Postgres>,
{
    let v: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM awa.schema_version")
        .fetch_one(executor)
        .await?;
    Ok(v.unwrap_or(0))
}

/// The applied schema version, or 0 when the schema does not exist. Read-only. (On awa-pg's
/// schema this is awa-pg's version; [`migrate`] and the clients refuse that schema.)
pub async fn current_version(pool: &Db) -> Result<i32> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('awa.schema_version') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(0);
    }
    Ok(version_in(pool).await?)
}

/// The SQL that brings a schema at version `from` to [`latest_version`], as one script for
/// the schema owner to run (`psql -1 -f`, or a migration tool) where the application role
/// may not run DDL. `from = 0` gives the whole schema. It does what [`migrate`] does: takes
/// the same advisory lock and records each version in `awa.schema_version`.
pub fn pending_sql(from: i32) -> String {
    range_sql(from, latest_version())
}

/// Every migration as `(version, sql)`, in order (what `awa migrate --extract-to` writes out,
/// one file per version).
pub fn scripts() -> &'static [(i32, &'static str)] {
    MIGRATIONS
}

/// Like [`pending_sql`] for the migrations after `from` up to and including `to` (`awa migrate
/// --sql --from V --to W`): one transaction under the same advisory lock, each version recorded.
/// An empty range gives a script that only takes the lock and creates the bookkeeping table.
pub fn range_sql(from: i32, to: i32) -> String {
    let mut script = String::from("BEGIN;\n");
    script.push_str(&format!("SELECT pg_advisory_xact_lock({MIGRATE_LOCK});\n"));
    script.push_str(BOOTSTRAP_SQL);
    script.push('\n');
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > from && *v <= to) {
        script.push_str(&format!("\n-- awa migration {version}\n"));
        script.push_str(sql.trim_end());
        script.push_str(&format!(
            "\nINSERT INTO awa.schema_version (version) VALUES ({version});\n"
        ));
    }
    if from < PENDING_STEPS_SINCE {
        script.push_str(
            "\n-- Steps recorded in awa.pending_steps (the unique-key rewrite of migration 9) \
             need Rust:\n-- the next migrate() of any client runs them (docs/unique-keys.md).\n",
        );
    }
    script.push_str("COMMIT;\n");
    script
}
