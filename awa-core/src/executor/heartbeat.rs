//! Heartbeats: one lease-guarded statement renews every attempt of this process and flushes
//! buffered progress.

use crate::executor::inflight::InflightSet;
use crate::executor::runtime::Shared;
use crate::storage::pool::Db;
use std::sync::Arc;

/// Renew every attempt; returns how many rows matched. Attempts with a pending cancel request
/// are signalled here too, so a missed `awa:cancel` notification only delays cancellation.
pub(crate) async fn beat(pool: &Db, inflight: &InflightSet) -> crate::error::Result<u64> {
    let (ids, leases, progress) = inflight.heartbeat_batch();
    if ids.is_empty() {
        return Ok(0);
    }
    let rows = pool
        .engine()
        .heartbeat(pool, &ids, &leases, &progress)
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
