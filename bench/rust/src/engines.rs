//! `engine_drain`: the same drain on either storage engine (issue 18's per-engine targets).
//!
//! `awa-bench engine_drain --engine canonical|queue_storage --url URL [--jobs N --workers W
//! --pickups K]` on a fresh database: migrate (and install queue storage in `awa` for
//! `queue_storage`), insert N no-op jobs, then, timed, drain them with the real runtime (the
//! same `Client`, queue and settings for both engines; only `Db::with_engine` differs),
//! recording the WAL the drain wrote and the dead tuples it left; then, with the runtime idle,
//! K pickups one at a time: the time from an insert's commit to its handler starting. Prints
//! one `BENCH_RESULT` line; `bench/engines.py` runs it per engine and round and reports the
//! figures side by side.

use awa_core::storage::engine::Engine;
use awa_core::storage::queue_storage::QueueStorage;
use awa_core::{
    Client, Db, EnqueueRequest, JobArgs, JobResult, NewJob, QueueConfig, RuntimeConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::Connection;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{AnyError, Opts};

const QUEUE: &str = "bench";

#[derive(Serialize, Deserialize)]
struct EngineNoop {
    i: i64,
}
impl JobArgs for EngineNoop {}

/// The pool handle on the engine asked for, installing queue storage when it is that one.
async fn engine_pool(o: &Opts, max: u32) -> Result<Db, AnyError> {
    let pool: Db = awa_core::pool_options()
        .max_connections(max)
        .connect(&o.url)
        .await?
        .into();
    awa_core::migrate(&pool).await?;
    Ok(match o.engine.as_str() {
        "canonical" => pool,
        "queue_storage" => {
            let slots = |name: &str, default: u32| {
                std::env::var(name)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(default)
            };
            let qs = QueueStorage::new(
                "awa",
                slots("AWA_BENCH_QUEUE_SLOTS", 16),
                slots("AWA_BENCH_LEASE_SLOTS", 8),
            )?;
            qs.install(&pool).await?;
            pool.with_engine(Engine::QueueStorage(Arc::new(qs)))
        }
        other => return Err(format!("unknown engine {other}").into()),
    })
}

fn prepare(i: i64) -> Result<NewJob, AnyError> {
    Ok(awa_core::storage::insert::prepare(
        &EnqueueRequest::new(EngineNoop { i }).queue(QUEUE),
    )?)
}

async fn enqueue(pool: &Db, jobs: &[NewJob]) -> Result<(), AnyError> {
    match pool.engine() {
        Engine::Canonical => {
            awa_core::insert_jobs(pool, jobs).await?;
        }
        Engine::QueueStorage(qs) => {
            qs.enqueue(pool, jobs).await?;
        }
    }
    Ok(())
}

/// Jobs of the bench queue not yet finalized.
async fn pending(pool: &Db) -> Result<i64, AnyError> {
    let sql = match pool.engine() {
        Engine::Canonical => format!(
            "SELECT count(*) FROM awa.jobs WHERE queue = '{QUEUE}' AND state IN ('available', 'running', 'scheduled', 'retryable')"
        ),
        // Every job was inserted before the drain and each was claimed (the handlers ran):
        // what is left to finalize holds a lease.
        Engine::QueueStorage(_) => "SELECT count(*) FROM awa.leases".to_string(),
    };
    Ok(sqlx::query_scalar(&sql).fetch_one(pool.pool()).await?)
}

async fn wal_lsn(pool: &Db) -> Result<i64, AnyError> {
    Ok(
        sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
            .fetch_one(pool.pool())
            .await?,
    )
}

/// Dead tuples in this database's tables, after the statistics of every backend have been
/// flushed (they report at most once a second while busy, and when they go idle).
async fn dead_tuples(pool: &Db) -> Result<i64, AnyError> {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(
        sqlx::query_scalar("SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables")
            .fetch_one(pool.pool())
            .await?,
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The drain queue's settings; probe knob `AWA_BENCH_CLAIMERS` sets its claim statements in
/// flight (default: `QueueConfig`'s).
fn queue_config(o: &Opts) -> QueueConfig {
    let qc = QueueConfig::new(o.workers);
    match std::env::var("AWA_BENCH_CLAIMERS").ok().and_then(|v| v.parse().ok()) {
        Some(n) => qc.claimers(n),
        None => qc,
    }
}

/// The drain's settings; probe knobs (not used by bench/engines.py):
/// `AWA_BENCH_LEASE_ROTATE_MS` and `AWA_BENCH_QUEUE_ROTATE_MS` override queue storage's
/// rotation intervals (and `AWA_BENCH_QUEUE_SLOTS` / `AWA_BENCH_LEASE_SLOTS` its slot counts,
/// in `engine_pool`).
fn runtime_config(o: &Opts) -> RuntimeConfig {
    let ms = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
    };
    let defaults = RuntimeConfig::default();
    RuntimeConfig {
        poll_interval: Duration::from_millis(o.poll_ms),
        lease_rotate_interval: ms("AWA_BENCH_LEASE_ROTATE_MS")
            .unwrap_or(defaults.lease_rotate_interval),
        queue_rotate_interval: ms("AWA_BENCH_QUEUE_ROTATE_MS")
            .unwrap_or(defaults.queue_rotate_interval),
        ..defaults
    }
}

pub(crate) async fn engine_drain(o: &Opts) -> Result<Value, AnyError> {
    let pool = engine_pool(o, o.pool_size).await?;
    let mut next = 0usize;
    while next < o.jobs {
        let end = (next + 5_000).min(o.jobs);
        let batch = (next..end)
            .map(|i| prepare(i as i64))
            .collect::<Result<Vec<_>, _>>()?;
        enqueue(&pool, &batch).await?;
        next = end;
    }
    let handled = Arc::new(AtomicUsize::new(0));
    let started: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (h, s) = (handled.clone(), started.clone());
    let client = Client::builder(pool.clone())
        .database_url(o.url.clone())
        .config(runtime_config(o))
        .queue(QUEUE, queue_config(o))
        .register::<EngineNoop, _, _>(move |_args, _ctx| {
            if let Ok(mut at) = s.lock() {
                *at = Some(Instant::now());
            }
            h.fetch_add(1, Ordering::Relaxed);
            async { Ok(JobResult::Completed) }
        })
        .build()?;
    let wal0 = wal_lsn(&pool).await?;
    let t0 = Instant::now();
    client.start().await?;
    let deadline = t0 + Duration::from_secs(900);
    while handled.load(Ordering::Relaxed) < o.jobs || pending(&pool).await? > 0 {
        if Instant::now() > deadline {
            return Err("timed out draining".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let wal = wal_lsn(&pool).await? - wal0;
    let dead = dead_tuples(&pool).await?;

    // Idle pickup: one job at a time, from its insert's commit to its handler's start.
    let mut pickups = Vec::with_capacity(o.pickups);
    // Probe knob `AWA_BENCH_PICKUPS_ALL`: every pickup in the result, in the order taken, with
    // its insert's commit time from the start of the pickups (to line tails up with the
    // maintenance passes in the server's log).
    let mut timeline = Vec::new();
    let pickups_t0 = Instant::now();
    for i in 0..o.pickups {
        let target = handled.load(Ordering::Relaxed) + 1;
        let job = prepare(-(i as i64) - 1)?;
        enqueue(&pool, std::slice::from_ref(&job)).await?;
        let committed = Instant::now();
        while handled.load(Ordering::Relaxed) < target {
            if committed.elapsed() > Duration::from_secs(10) {
                return Err("a pickup took over 10 s".into());
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let at = started.lock().map_err(|_| "poisoned")?.unwrap_or(committed);
        let ms = at.saturating_duration_since(committed).as_secs_f64() * 1000.0;
        pickups.push(ms);
        timeline.push(json!([
            committed.duration_since(pickups_t0).as_secs_f64() * 1000.0,
            ms
        ]));
        // Let the completion land and the runtime go idle again.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.shutdown(Duration::from_secs(5)).await;
    pickups.sort_by(|a, b| a.total_cmp(b));
    let db_bytes: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(pool.pool())
        .await?;
    pool.close().await;
    let mut out = json!({
        "engine": o.engine,
        "jobs": o.jobs,
        "workers": o.workers,
        "seconds": seconds,
        "jobs_per_s": o.jobs as f64 / seconds,
        "wal_bytes": wal,
        "wal_bytes_per_job": wal as f64 / o.jobs.max(1) as f64,
        "dead_tuples": dead,
        "dead_per_job": dead as f64 / o.jobs.max(1) as f64,
        "db_bytes_after": db_bytes,
        "pickup_ms": {
            "n": pickups.len(),
            "p50": percentile(&pickups, 0.5),
            "p99": percentile(&pickups, 0.99),
            "max": pickups.last().copied().unwrap_or(f64::NAN),
        },
        "settings": format!(
            "QueueConfig::new({}), RuntimeConfig {{ poll_interval: {} ms, ..default }}, pool {} connections; queue storage: 16 queue slots, 8 lease slots",
            o.workers, o.poll_ms, o.pool_size
        ),
    });
    if std::env::var_os("AWA_BENCH_PICKUPS_ALL").is_some() {
        out["pickup_ms"]["all"] = Value::Array(timeline);
    }
    Ok(out)
}

/// What bench/soak.py samples: dead and live tuples, vacuums, size and WAL position.
const SOAK_SAMPLE_SQL: &str =
    "SELECT coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(n_live_tup), 0)::bigint,
        coalesce(sum(autovacuum_count + vacuum_count), 0)::bigint,
        pg_database_size(current_database()),
        (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint
 FROM pg_stat_user_tables";

/// `soak`: bench/soak.py's protocol (bench/systems/common.py, `soak_loop`) on the Rust
/// runtime: a batch every 50 ms through the engine's insert, `--rate` jobs per second for
/// `--duration-s`, completed history kept `--retention-s` (canonical prunes it, queue storage
/// reclaims its slots), the database sampled every `--sample-s`.
pub(crate) async fn soak(o: &Opts) -> Result<Value, AnyError> {
    let pool = engine_pool(o, o.pool_size).await?;
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let client = Client::builder(pool.clone())
        .database_url(o.url.clone())
        .config(RuntimeConfig {
            completed_retention: Duration::from_secs_f64(o.retention_s),
            ..runtime_config(o)
        })
        .queue(QUEUE, QueueConfig::new(o.workers))
        .register::<EngineNoop, _, _>(move |_args, _ctx| {
            h.fetch_add(1, Ordering::Relaxed);
            async { Ok(JobResult::Completed) }
        })
        .build()?;
    client.start().await?;
    let mut monitor = sqlx::PgConnection::connect(&o.url).await?;
    let mut samples = Vec::new();
    let mut inserted = 0usize;
    let mut sample = |t: f64, row: (i64, i64, i64, i64, i64), inserted: usize| {
        let done = handled.load(Ordering::Relaxed);
        samples.push(json!({
            "t": (t * 1000.0).round() / 1000.0, "inserted": inserted, "handled": done,
            "backlog": inserted as i64 - done as i64,
            "dead_tuples": row.0, "live_tuples": row.1, "vacuums": row.2, "db_bytes": row.3,
            "wal_bytes": row.4,
        }));
    };
    let tick = Duration::from_millis(50);
    let per_tick = o.rate * tick.as_secs_f64();
    let mut owed = 0.0;
    let t0 = Instant::now();
    sample(
        0.0,
        sqlx::query_as(SOAK_SAMPLE_SQL)
            .fetch_one(&mut monitor)
            .await?,
        0,
    );
    let mut next_sample = o.sample_s;
    let mut ticks = 0u32;
    loop {
        let now = t0.elapsed().as_secs_f64();
        if now >= o.duration_s {
            break;
        }
        owed += per_tick;
        let n = owed as usize;
        if n > 0 {
            owed -= n as f64;
            let batch = (inserted..inserted + n)
                .map(|i| prepare(i as i64))
                .collect::<Result<Vec<_>, _>>()?;
            enqueue(&pool, &batch).await?;
            inserted += n;
        }
        if now >= next_sample {
            sample(
                now,
                sqlx::query_as(SOAK_SAMPLE_SQL)
                    .fetch_one(&mut monitor)
                    .await?,
                inserted,
            );
            next_sample += o.sample_s;
        }
        ticks += 1;
        tokio::time::sleep_until((t0 + tick * ticks).into()).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    sample(
        seconds,
        sqlx::query_as(SOAK_SAMPLE_SQL)
            .fetch_one(&mut monitor)
            .await?,
        inserted,
    );
    let done = handled.load(Ordering::Relaxed);
    client.shutdown(Duration::from_secs(5)).await;
    pool.close().await;
    Ok(json!({
        "rate": o.rate, "duration_s": o.duration_s, "seconds": seconds, "inserted": inserted,
        "handled": done, "offered_per_s": inserted as f64 / seconds,
        "handled_per_s": done as f64 / seconds, "retention_s": o.retention_s,
        "engine": o.engine, "samples": samples,
        "settings": format!(
            "QueueConfig::new({}), RuntimeConfig {{ poll_interval: {} ms, completed_retention: {} s, ..default }}, pool {} connections; engine {} (queue storage: 16 queue slots, 8 lease slots, rotation every 1 s / 50 ms)",
            o.workers, o.poll_ms, o.retention_s, o.pool_size, o.engine
        ),
    }))
}
