//! Recognising a schema named `awa` that another implementation created (issue 13, item 8).
//!
//! awa-pg (the `awa-pg` Python package and the `awa` Rust crates it wraps) also keeps its tables
//! in a schema named `awa`, with its own layout and version numbers (40 for awa-pg 0.6.9).
//! Before this check our `migrate()` read that version, found it above its own, applied
//! nothing, and every later call failed on a missing column. Now `migrate()` and the clients
//! recognise the schema and refuse it with [`AwaError::ForeignSchema`], naming what was found
//! and what to do; nothing of it is read or changed.
//!
//! The fingerprint is awa-pg's, not a version number (a newer version of *this* library may
//! legitimately find a higher version): awa-pg's `awa.schema_version` has a `description`
//! column ours never had, and its jobs live in `awa.jobs_hot` (ours in the table `awa.canonical_jobs` behind the view `awa.jobs`).
//! Either marks the schema as awa-pg's. One catalog query; no error when nothing exists.

use crate::error::{AwaError, Result};

/// What a foreign `awa` schema looks like, as far as the error message needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignSchema {
    /// Who created it, as far as the fingerprint tells ("awa-pg").
    pub created_by: &'static str,
    /// Its own `max(version)` from `awa.schema_version`, when that table exists.
    pub version: Option<i32>,
}

const FINGERPRINT_SQL: &str = "SELECT
    EXISTS (SELECT 1 FROM pg_attribute
            WHERE attrelid = to_regclass('awa.schema_version')
              AND attname = 'description' AND NOT attisdropped) AS described_versions,
    to_regclass('awa.jobs_hot') IS NOT NULL AS hot_jobs_table,
    to_regclass('awa.schema_version') IS NOT NULL AS has_versions";

/// The foreign schema in this database, if there is one. Read-only.
pub async fn detect<'e, E>(executor: E) -> Result<Option<ForeignSchema>>
where
    E: sqlx::PgExecutor<'e> + Copy,
{
    let (described, hot, has_versions): (bool, bool, bool) =
        sqlx::query_as(FINGERPRINT_SQL).fetch_one(executor).await?;
    if !(described || hot) {
        return Ok(None);
    }
    let version = if has_versions {
        sqlx::query_scalar("SELECT max(version) FROM awa.schema_version")
            .fetch_one(executor)
            .await?
    } else {
        None
    };
    Ok(Some(ForeignSchema {
        created_by: "awa-pg",
        version,
    }))
}

/// `Err(AwaError::ForeignSchema)` when the database holds a foreign `awa` schema.
pub async fn refuse_foreign<'e, E>(executor: E) -> Result<()>
where
    E: sqlx::PgExecutor<'e> + Copy,
{
    match detect(executor).await? {
        Some(found) => Err(AwaError::ForeignSchema {
            created_by: found.created_by.to_string(),
            version: found.version,
            ours: super::migrations::latest_version(),
        }),
        None => Ok(()),
    }
}
