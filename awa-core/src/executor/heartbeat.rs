//! Heartbeats: one lease-guarded statement renews every attempt of this process and flushes
//! buffered progress.

use crate::executor::inflight::InflightSet;
use crate::executor::runtime::Shared;
use crate::storage::pool::Db;
use std::sync::Arc;

/// Renew every attempt; returns how many rows matched. Attempts with a pending cancel request
/// are signalled here too, so a missed `awa:cancel` notification only delays cancellation.
pub(crate) async fn beat(pool: &Db, inflight: &InflightSet) -> Result<u64, sqlx::Error> {
    let (ids, leases, progress) = inflight.heartbeat_batch();
    if ids.is_empty() {
        return Ok(0);
    }
    let rows: Vec<(i64, bool)> = sqlx::query_as(
        // Rows locked by a finalization in flight are skipped rather than waited for: one slow
        // completion transaction must not delay every other attempt's heartbeat into rescue.
        "WITH live AS (
             SELECT x.id, t.progress
             FROM unnest($1::bigint[], $2::bigint[], $3::jsonb[]) AS t(id, lease, progress)
             JOIN awa.jobs x ON x.id = t.id AND x.run_lease = t.lease AND x.state = 'running'
             FOR UPDATE OF x SKIP LOCKED)
         UPDATE awa.jobs j SET heartbeat_at = now(), progress = coalesce(live.progress, j.progress)
         FROM live WHERE j.id = live.id
         RETURNING j.id, j.cancel_requested_at IS NOT NULL",
    )
    .bind(&ids)
    .bind(&leases)
    .bind(&progress)
    .fetch_all(pool)
    .await?;
    for (id, cancel) in &rows {
        if *cancel {
            inflight.signal_cancel(*id);
        }
    }
    Ok(rows.len() as u64)
}

pub(crate) async fn run_heartbeat(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = shared.stop_background.cancelled() => return,
            _ = tokio::time::sleep(shared.config.heartbeat_interval) => {}
        }
        if let Err(e) = beat(&shared.pool, &shared.inflight).await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
    }
}
