//! The maintenance leader: one client per database, elected with a session advisory lock held
//! on a dedicated connection. When that connection (or its process) dies, Postgres releases the
//! lock and another client's next election attempt takes over.

pub mod prune;
pub mod rescue;

use crate::executor::config::RuntimeConfig;
use crate::executor::context::CancelSignal;
use crate::specs::Specs;
use rescue::RescueKind;
use sqlx::{Connection, PgConnection, PgPool};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Advisory lock key of the maintenance leader ("awa_lead").
const LEADER_LOCK: i64 = 0x6177_615f_6c65_6164;

/// Run election and, while leader, the periodic duties, until `stop` fires.
pub(crate) async fn run(
    pool: PgPool,
    url: Option<String>,
    config: RuntimeConfig,
    specs: Specs,
    stop: CancelSignal,
    is_leader: Arc<AtomicBool>,
    leader_changed: Arc<tokio::sync::Notify>,
) {
    loop {
        if stop.is_cancelled() {
            return;
        }
        match try_lead(&pool, url.as_deref()).await {
            Ok(Some(conn)) => {
                is_leader.store(true, Ordering::SeqCst);
                leader_changed.notify_one();
                tracing::info!("became the maintenance leader");
                lead(&pool, conn, &config, &specs, &stop).await;
                is_leader.store(false, Ordering::SeqCst);
                leader_changed.notify_one();
                tracing::info!("stopped being the maintenance leader");
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "leader election failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.leader_election_interval) => {}
        }
    }
}

async fn try_lead(pool: &PgPool, url: Option<&str>) -> Result<Option<PgConnection>, sqlx::Error> {
    // A dedicated connection outside the pool: the lock lives exactly as long as it does.
    let mut conn = match url {
        Some(u) => PgConnection::connect(u).await?,
        None => PgConnection::connect_with(&pool.connect_options()).await?,
    };
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(LEADER_LOCK)
        .fetch_one(&mut conn)
        .await?;
    if got {
        Ok(Some(conn))
    } else {
        let _ = conn.close().await;
        Ok(None)
    }
}

async fn lead(
    pool: &PgPool,
    mut conn: PgConnection,
    config: &RuntimeConfig,
    specs: &Specs,
    stop: &CancelSignal,
) {
    let tick = [
        config.promote_interval,
        config.heartbeat_rescue_interval,
        config.deadline_rescue_interval,
        config.callback_rescue_interval,
    ]
    .into_iter()
    .min()
    .unwrap_or(Duration::from_millis(250))
    .max(Duration::from_millis(20));
    let mut last = [Instant::now() - Duration::from_secs(3600); 5];
    let mut cron = crate::cron::evaluate::Ticker::new();
    loop {
        let now = Instant::now();
        let due =
            |i: usize, every: Duration, last: &[Instant; 5]| now.duration_since(last[i]) >= every;
        if due(0, config.promote_interval, &last) {
            last[0] = now;
            if let Err(e) = rescue::promote_due(pool).await {
                tracing::warn!(error = %e, "promotion failed");
            }
        }
        let duties = [
            (
                1,
                config.heartbeat_rescue_interval,
                RescueKind::StaleHeartbeat,
            ),
            (
                2,
                config.deadline_rescue_interval,
                RescueKind::ExpiredDeadline,
            ),
            (
                3,
                config.callback_rescue_interval,
                RescueKind::CallbackTimeout,
            ),
        ];
        for (i, every, kind) in duties {
            if due(i, every, &last) {
                last[i] = now;
                if let Err(e) =
                    rescue::rescue_stale_with_specs(pool, kind, config.heartbeat_staleness, specs)
                        .await
                {
                    tracing::warn!(error = %e, ?kind, "rescue failed");
                }
            }
        }
        if due(4, config.prune_interval, &last) {
            last[4] = now;
            match prune::prune_terminal(pool, config.completed_retention, config.failed_retention)
                .await
            {
                Ok(n) if n > 0 => tracing::info!(deleted = n, "pruned finished jobs"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "prune failed"),
            }
            // Clients that died without shutting down (docs/runtime-registry.md).
            match crate::storage::runtime_instances::prune_stale(pool).await {
                Ok(n) if n > 0 => tracing::info!(deleted = n, "pruned stale runtime instances"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "runtime registry prune failed"),
            }
        }
        // Periodic jobs: enqueue due fires (rate-limited to about once a second inside).
        cron.tick(pool).await;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(tick) => {}
        }
        // Still holding the lock? A broken connection means another client may lead now.
        if sqlx::query("SELECT 1").execute(&mut conn).await.is_err() {
            tracing::warn!("leader connection lost");
            return;
        }
    }
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LEADER_LOCK)
        .execute(&mut conn)
        .await;
    let _ = conn.close().await;
}
