//! The runtime registry's SQL (`awa.runtime_instances`, migration 7; docs/runtime-registry.md):
//! one row per running client, so operators, `health_check()` and tools can see which
//! processes work which queues, which one leads maintenance, and which went away.
//!
//! The executor owns the row's life ([`crate::executor::registry`]): inserted on start,
//! refreshed on each heartbeat and leadership change, deleted on clean shutdown. A client that
//! dies leaves its row behind; the maintenance leader prunes rows not refreshed for
//! [`STALE_INTERVALS`] of their own refresh interval, and at least [`MIN_STALE`].

use crate::error::Result;
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
use sqlx::Row;
use std::time::Duration;

/// A row is stale after this many of its own refresh intervals without a refresh.
pub const STALE_INTERVALS: i64 = 10;
/// ...and never sooner than this, whatever its interval.
pub const MIN_STALE: Duration = Duration::from_secs(60);

/// What a running client reports about itself.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub hostname: Option<String>,
    pub pid: i32,
    pub version: String,
    /// `[{"name", "max_workers", "deadline_ms", "dlq"}, ...]`, sorted by name.
    pub queues: serde_json::Value,
    pub interval: Duration,
    /// `{name: hash}` of the queue and job-kind descriptors this client declares
    /// (`storage::descriptors`), so the API can flag live clients that disagree.
    pub queue_descriptor_hashes: serde_json::Value,
    pub job_kind_descriptor_hashes: serde_json::Value,
    /// The engine it works, as `storage::transition::capability` names it.
    pub storage_capability: &'static str,
    /// Its `storage_transition_role`.
    pub transition_role: &'static str,
}

/// One row of the registry, as [`list`] reads it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RuntimeInstance {
    pub instance_id: String,
    pub hostname: Option<String>,
    pub pid: i32,
    pub version: String,
    pub queues: serde_json::Value,
    pub leader: bool,
    pub started_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// How often the client refreshes its row.
    pub snapshot_interval_ms: i64,
    /// Not refreshed for [`STALE_INTERVALS`] intervals (and [`MIN_STALE`]): the client is most
    /// likely gone; the next prune deletes the row.
    pub stale: bool,
    /// The engine it works (`queue_storage`, `canonical_drain_only`; `canonical` for a client
    /// that knows nothing of storage transitions) and its `storage_transition_role`.
    pub storage_capability: String,
    pub transition_role: String,
}

/// Milliseconds, at least 1 (the column's CHECK).
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// The staleness rule, shared by [`list`] and [`prune_stale`].
const STALE_SQL: &str = "last_seen_at < now() - greatest(make_interval(secs => $1), \
     make_interval(secs => snapshot_interval_ms * $2 / 1000.0))";

/// The opposite of [`STALE_SQL`] for a row aliased `r`, with its two parameters as `$2` and
/// `$3` (the minimum and the interval count), for statements that bind something else first.
pub(crate) const LIVE_SQL: &str = "r.last_seen_at >= now() - greatest(make_interval(secs => $2), \
     make_interval(secs => r.snapshot_interval_ms * $3 / 1000.0))";

/// Insert this client's row; returns its new instance id (a UUID made by PostgreSQL).
pub(crate) async fn register(pool: &Db, r: &Registration, leader: bool) -> Result<String> {
    let id: String = sqlx::query_scalar(
        "INSERT INTO awa.runtime_instances
             (hostname, pid, version, queues, leader, snapshot_interval_ms,
              queue_descriptor_hashes, job_kind_descriptor_hashes, storage_capability,
              transition_role)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING instance_id::text",
    )
    .bind(&r.hostname)
    .bind(r.pid)
    .bind(&r.version)
    .bind(&r.queues)
    .bind(leader)
    .bind(millis(r.interval))
    .bind(&r.queue_descriptor_hashes)
    .bind(&r.job_kind_descriptor_hashes)
    .bind(r.storage_capability)
    .bind(r.transition_role)
    .fetch_one(pool)
    .await?;
    Ok(id)
}

/// Refresh the row (heartbeat, leadership change). When the row is gone (pruned while this
/// process was paused or cut off), it is inserted again under the same id with its original
/// `started_at` lost, so a live client always has a row after its next refresh.
pub(crate) async fn refresh(
    pool: &Db,
    id: &str,
    r: &Registration,
    leader: bool,
    started_at: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO awa.runtime_instances
             (instance_id, hostname, pid, version, queues, leader, snapshot_interval_ms, started_at,
              queue_descriptor_hashes, job_kind_descriptor_hashes, storage_capability,
              transition_role)
         VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT (instance_id) DO UPDATE
             SET leader = excluded.leader, last_seen_at = now()",
    )
    .bind(id)
    .bind(&r.hostname)
    .bind(r.pid)
    .bind(&r.version)
    .bind(&r.queues)
    .bind(leader)
    .bind(millis(r.interval))
    .bind(started_at)
    .bind(&r.queue_descriptor_hashes)
    .bind(&r.job_kind_descriptor_hashes)
    .bind(r.storage_capability)
    .bind(r.transition_role)
    .execute(pool)
    .await?;
    Ok(())
}

/// Delete the row (clean shutdown).
pub(crate) async fn deregister(pool: &Db, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM awa.runtime_instances WHERE instance_id = $1::uuid")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Delete stale rows (clients that died without shutting down); returns how many.
pub async fn prune_stale(pool: &Db) -> Result<u64> {
    let done = sqlx::query(&format!(
        "DELETE FROM awa.runtime_instances WHERE {STALE_SQL}"
    ))
    .bind(MIN_STALE.as_secs_f64())
    .bind(STALE_INTERVALS)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Every registered client, the leader first, then by start time.
pub async fn list(pool: &Db) -> Result<Vec<RuntimeInstance>> {
    let rows = sqlx::query(&format!(
        "SELECT instance_id::text AS instance_id, hostname, pid, version, queues, leader,
                started_at, last_seen_at, snapshot_interval_ms, ({STALE_SQL}) AS stale,
                storage_capability, transition_role
         FROM awa.runtime_instances ORDER BY leader DESC, started_at, instance_id"
    ))
    .bind(MIN_STALE.as_secs_f64())
    .bind(STALE_INTERVALS)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(RuntimeInstance {
                instance_id: row.try_get("instance_id")?,
                hostname: row.try_get("hostname")?,
                pid: row.try_get("pid")?,
                version: row.try_get("version")?,
                queues: row.try_get("queues")?,
                leader: row.try_get("leader")?,
                started_at: row.try_get("started_at")?,
                last_seen_at: row.try_get("last_seen_at")?,
                snapshot_interval_ms: row.try_get("snapshot_interval_ms")?,
                stale: row.try_get("stale")?,
                storage_capability: row.try_get("storage_capability")?,
                transition_role: row.try_get("transition_role")?,
            })
        })
        .collect()
}
