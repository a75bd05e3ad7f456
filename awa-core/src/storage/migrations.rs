//! Embedded, versioned migrations applied by [`migrate`].
//!
//! Each migration runs in one transaction that first takes a transaction-scoped advisory lock,
//! so several processes may call `migrate()` at once: the first applies, the others wait and
//! then find nothing left to do.

use crate::error::Result;
use sqlx::{Executor, PgPool};

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
];

/// Advisory lock key serializing migrations ("awa_migrate" folded into an i64).
const MIGRATE_LOCK: i64 = 0x6177_615f_6d69_6772;

/// The newest schema version this library knows.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |(v, _)| *v)
}

/// Apply every pending migration. Idempotent and safe to run concurrently.
pub async fn migrate(pool: &PgPool) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *tx)
        .await?;
    // A plain &str runs under the simple protocol, which allows several statements.
    (&mut *tx)
        .execute(
            "CREATE SCHEMA IF NOT EXISTS awa;
             CREATE TABLE IF NOT EXISTS awa.schema_version (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now());",
        )
        .await?;
    let current: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM awa.schema_version")
        .fetch_one(&mut *tx)
        .await?;
    let current = current.unwrap_or(0);
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tracing::info!(version, "applying awa migration");
        (&mut *tx).execute(*sql).await?;
        sqlx::query("INSERT INTO awa.schema_version (version) VALUES ($1)")
            .bind(version)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The applied schema version, or 0 when the schema does not exist.
pub async fn current_version(pool: &PgPool) -> Result<i32> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('awa.schema_version') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(0);
    }
    let v: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM awa.schema_version")
        .fetch_one(pool)
        .await?;
    Ok(v.unwrap_or(0))
}
