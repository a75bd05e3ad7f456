//! The maintenance leader: one client per database and engine, elected with an advisory lock
//! held on a dedicated connection. When that connection (or its process) dies, Postgres releases the
//! lock and another client's next election attempt takes over.
//!
//! On a session connection (PostgreSQL directly) the lock is a session lock. Behind PgBouncer
//! in transaction pooling mode ([`PoolMode::Transaction`]) a session lock would stay on a
//! server session PgBouncer hands to other clients, so the leader instead opens one
//! transaction, takes `pg_try_advisory_xact_lock` in it and keeps that transaction open while
//! it leads: PgBouncer keeps the server session assigned to the leader for exactly that long,
//! and the lock ends with the transaction (leaving, a lost connection, or the server's
//! `idle_in_transaction_session_timeout` if it is shorter than the maintenance tick). The
//! transaction only holds the lock and runs `SELECT 1`; it takes no snapshot between
//! statements and writes nothing, so it holds back no vacuum.

pub mod batch_ops;
pub mod prune;
pub mod rescue;

use crate::executor::config::RuntimeConfig;
use crate::executor::context::CancelSignal;
use crate::executor::registry::Instance;
use crate::specs::Specs;
use crate::storage::engine::Engine;
use crate::storage::pool::Db;
use crate::storage::pool::{ConnectTarget, PoolMode};
use crate::storage::queue_storage::QueueStorage;
use rescue::RescueKind;
use sqlx::{Connection, Executor, PgConnection};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Advisory lock key of the maintenance leader ("awa_lead").
const LEADER_LOCK: i64 = 0x6177_615f_6c65_6164;

/// Run election and, while leader, the periodic duties, until `stop` fires.
pub(crate) async fn run(
    pool: Db,
    url: Option<String>,
    config: RuntimeConfig,
    specs: Specs,
    stop: CancelSignal,
    is_leader: Arc<AtomicBool>,
    instance: Arc<Instance>,
) {
    loop {
        if stop.is_cancelled() {
            return;
        }
        match try_lead(&pool, url.as_deref()).await {
            Ok(Some(lease)) => {
                is_leader.store(true, Ordering::SeqCst);
                instance.leader_changed.notify_one();
                tracing::info!("became the maintenance leader");
                lead(&pool, lease, &config, &specs, &stop, &instance).await;
                is_leader.store(false, Ordering::SeqCst);
                instance.leader_changed.notify_one();
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

/// The leader's dedicated connection and how its lock is held.
struct Lease {
    conn: PgConnection,
    mode: PoolMode,
    /// The advisory lock's key (one per engine), so the unlock names the lock taken.
    key: i64,
}

async fn try_lead(pool: &Db, url: Option<&str>) -> crate::error::Result<Option<Lease>> {
    // A dedicated connection outside the pool: the lock lives exactly as long as it does (or,
    // in transaction mode, as long as its transaction).
    let target = match url {
        Some(u) => ConnectTarget::parse(u)?,
        None => pool.target().clone(),
    };
    let mut conn = target.connect().await?;
    let mode = target.mode();
    let lock = match mode {
        PoolMode::Session => "SELECT pg_try_advisory_lock($1)",
        PoolMode::Transaction => {
            conn.execute("BEGIN; DEALLOCATE ALL").await?;
            "SELECT pg_try_advisory_xact_lock($1)"
        }
    };
    // One leader per engine: during a storage transition canonical's leader promotes and
    // rescues its jobs while queue storage's rotates its rings (both write only their own).
    let key = match pool.engine() {
        Engine::Canonical => LEADER_LOCK,
        Engine::QueueStorage(_) => LEADER_LOCK + 1,
    };
    let got: bool = sqlx::query_scalar(lock)
        .bind(key)
        .fetch_one(&mut conn)
        .await?;
    if got {
        Ok(Some(Lease { conn, mode, key }))
    } else {
        let _ = conn.close().await;
        Ok(None)
    }
}

/// A lease slot is worth truncating once its file holds this much (about 1,500 leases and
/// their dead versions): the ring then turns every second or two at 1,000 jobs/s rather than at
/// every pass (each TRUNCATE rewrites catalog rows and costs every backend a cache refresh).
const LEASE_SLOT_BYTES: i64 = 256 * 1024;
/// ... or once it has been current this long, whatever it holds, so a quiet ring's dead leases
/// do not linger.
const LEASE_SLOT_MAX_AGE: Duration = Duration::from_secs(10);

/// The leader's duties on queue storage, each when its interval is due (`last` holds when
/// each last ran: 0 promotion, 1–3 rescue, 5 the queue ring, 6 the lease ring; and 7 when the
/// lease ring last moved to `lease_slot`). One rescue statement covers stale heartbeats,
/// passed deadlines and callback timeouts.
async fn queue_storage_duties(
    pool: &Db,
    qs: &QueueStorage,
    config: &RuntimeConfig,
    specs: &Specs,
    now: Instant,
    last: &mut [Instant; 8],
    lease_slot: &mut Option<i32>,
) {
    let mut due = |i: usize, every: Duration| {
        let yes = now.duration_since(last[i]) >= every;
        if yes {
            last[i] = now;
        }
        yes
    };
    if due(0, config.promote_interval) {
        if let Err(e) = qs.promote(pool).await {
            tracing::warn!(error = %e, "promotion failed");
        }
    }
    let rescue_every = config
        .heartbeat_rescue_interval
        .min(config.deadline_rescue_interval)
        .min(config.callback_rescue_interval);
    if due(1, rescue_every) {
        if let Err(e) = qs
            .rescue_with_specs(pool, config.heartbeat_staleness, specs)
            .await
        {
            tracing::warn!(error = %e, "rescue failed");
        }
    }
    if due(5, config.queue_rotate_interval) {
        if let Err(e) = qs
            .rotate_queue_ring(pool, config.completed_retention, config.failed_retention)
            .await
        {
            tracing::warn!(error = %e, "queue ring rotation failed");
        }
    }
    if due(6, config.lease_rotate_interval) {
        let min_bytes = if now.duration_since(last[7]) >= LEASE_SLOT_MAX_AGE {
            1
        } else {
            LEASE_SLOT_BYTES
        };
        match qs.rotate_leases_over(pool, min_bytes).await {
            Ok(slot) if *lease_slot != Some(slot) => {
                *lease_slot = Some(slot);
                last[7] = now;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "lease ring rotation failed"),
        }
    }
}

async fn lead(
    pool: &Db,
    lease: Lease,
    config: &RuntimeConfig,
    specs: &Specs,
    stop: &CancelSignal,
    instance: &Instance,
) {
    let queue_storage = match pool.engine() {
        Engine::QueueStorage(qs) => Some(qs.clone()),
        Engine::Canonical => None,
    };
    let rotations = match &queue_storage {
        Some(_) => vec![config.queue_rotate_interval, config.lease_rotate_interval],
        None => Vec::new(),
    };
    let tick = [
        config.promote_interval,
        config.heartbeat_rescue_interval,
        config.deadline_rescue_interval,
        config.callback_rescue_interval,
    ]
    .into_iter()
    .chain(rotations)
    .min()
    .unwrap_or(Duration::from_millis(250))
    .max(Duration::from_millis(20));
    // "Long ago", so every duty is due at the first pass; `Instant` cannot go below the
    // monotonic clock's origin (a machine up for less than an hour), so then "now" instead
    // (the duties wait one interval) rather than a panic.
    let start = Instant::now();
    let mut last = [start
        .checked_sub(Duration::from_secs(3600))
        .unwrap_or(start); 8];
    let mut lease_slot = None;
    let mut cron = crate::cron::evaluate::Ticker::new();
    let Lease {
        mut conn,
        mode,
        key,
    } = lease;
    loop {
        let now = Instant::now();
        let due =
            |i: usize, every: Duration, last: &[Instant; 8]| now.duration_since(last[i]) >= every;
        if let Some(qs) = &queue_storage {
            queue_storage_duties(pool, qs, config, specs, now, &mut last, &mut lease_slot).await;
        }
        if queue_storage.is_none() && due(0, config.promote_interval, &last) {
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
            if queue_storage.is_none() && due(i, every, &last) {
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
            // Canonical's finished rows (queue storage's history goes with its slots).
            match prune::prune_terminal(
                pool,
                config.completed_retention,
                config.failed_retention,
                config.cleanup_batch,
            )
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
            // Finished batch operations past their retention_until.
            match crate::storage::batch_ops::prune_expired(pool, config.cleanup_batch).await {
                Ok(n) if n > 0 => tracing::info!(deleted = n, "pruned finished batch operations"),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "batch operation prune failed"),
            }
            // Descriptors no live client refreshed for descriptor_retention_days.
            if let Some(retention) = config.descriptor_retention {
                match crate::storage::descriptors::prune_stale(pool, retention).await {
                    Ok(n) if n > 0 => tracing::info!(deleted = n, "pruned stale descriptors"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "descriptor prune failed"),
                }
            }
        }
        // Durable batch operations: a bounded slice of work per tick (docs/batch-operations.md).
        batch_ops::tick(pool, instance.id.get().map(String::as_str)).await;
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
    let _ = match mode {
        PoolMode::Session => sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut conn)
            .await
            .map(|_| ()),
        // Ending the transaction ends the transaction-scoped lock.
        PoolMode::Transaction => conn.execute("ROLLBACK").await.map(|_| ()),
    };
    let _ = conn.close().await;
}
