//! awa-bench: the Rust half of the benchmark (see bench/README.md).
//!
//! `awa-bench WORKLOAD --phase setup|run|verify|all --url URL [options]`, each phase printing
//! one JSON line prefixed with `BENCH_RESULT ` (the same protocol as bench/systems/common.py;
//! the orchestrator reads the database's statistics between the phases):
//! - `drain`: N no-op jobs worked by the real runtime (`Client`, one queue, W workers), timed
//!   from `start()` until the database shows nothing pending.
//! - `staging`: the same, but every handler stages one unique follow-up (ADR-046) onto a queue
//!   nobody works, so the follow-ups stay behind to be counted.
//! - `enqueue_single`: N single-row inserts (`awa_core::insert`, one commit each) on a pool, one
//!   after another: the same workload as the Python adapters', without the Python bridge.
//! - `floor`: no runtime at all: `claim_batch` + `complete_batch` in a tight loop on L
//!   connections, the rate PostgreSQL allows for our schema and statements on this machine.
//!
//! Options: `--jobs N --workers W --poll-ms P --batch B --loops L --pool-size S`.

use awa_core::finalizer::batched::complete_batch;
use awa_core::storage::claim::claim_batch;
use awa_core::{Client, EnqueueRequest, JobArgs, JobError, JobResult, QueueConfig, RuntimeConfig, UniqueOpts};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::postgres::PgConnection;
use sqlx::{Connection, PgPool, Row};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUEUE: &str = "bench";
const FOLLOW_UP_QUEUE: &str = "bench_followups";

#[derive(Serialize, Deserialize)]
struct Noop {
    i: i64,
}
impl JobArgs for Noop {}

#[derive(Serialize, Deserialize)]
struct StageJob {
    i: i64,
}
impl JobArgs for StageJob {}

#[derive(Serialize, Deserialize)]
struct FollowUp {
    i: i64,
}
impl JobArgs for FollowUp {}

type AnyError = Box<dyn std::error::Error + Send + Sync>;

struct Opts {
    workload: String,
    phase: String,
    url: String,
    jobs: usize,
    workers: usize,
    poll_ms: u64,
    batch: usize,
    loops: usize,
    pool_size: u32,
}

fn parse_opts() -> Result<Opts, AnyError> {
    let mut args = std::env::args().skip(1);
    let workload = args.next().ok_or("usage: awa-bench drain|staging|floor|enqueue_single [--phase P] --url URL [--jobs N] ...")?;
    let mut o = Opts {
        workload,
        phase: "all".into(),
        url: std::env::var("DATABASE_URL").unwrap_or_default(),
        jobs: 20_000,
        workers: 32,
        poll_ms: 50,
        batch: 32,
        loops: 2,
        pool_size: 20,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--phase" => o.phase = value,
            "--url" => o.url = value,
            "--jobs" => o.jobs = value.parse()?,
            "--workers" => o.workers = value.parse()?,
            "--poll-ms" => o.poll_ms = value.parse()?,
            "--batch" => o.batch = value.parse()?,
            "--loops" => o.loops = value.parse()?,
            "--pool-size" => o.pool_size = value.parse()?,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if o.url.is_empty() {
        return Err("--url (or DATABASE_URL) is required".into());
    }
    if !["setup", "run", "verify", "all"].contains(&o.phase.as_str()) {
        return Err(format!("unknown phase {}", o.phase).into());
    }
    Ok(o)
}

/// Migrate and insert `n` jobs (the setup phase, not timed).
async fn setup<A: JobArgs>(url: &str, n: usize, make: impl Fn(i64) -> A) -> Result<Value, AnyError> {
    let pool = awa_core::pool_options().max_connections(1).connect(url).await?;
    awa_core::migrate(&pool).await?;
    let mut next = 0usize;
    while next < n {
        let end = (next + 5_000).min(n);
        let batch: Vec<EnqueueRequest<A>> =
            (next..end).map(|i| EnqueueRequest::new(make(i as i64)).queue(QUEUE)).collect();
        awa_core::insert_many(&pool, batch).await?;
        next = end;
    }
    pool.close().await;
    Ok(json!({}))
}

async fn count(conn: &mut PgConnection, sql: &str) -> Result<i64, AnyError> {
    Ok(sqlx::query_scalar::<_, i64>(sql).fetch_one(conn).await?)
}

/// Wait until the handlers ran `n` times (in-process, no queries), then poll the database until
/// nothing of `queue` is pending. Returns the number of polls (each one transaction) and the
/// monitor connection.
async fn wait_drained(url: &str, handled: &AtomicUsize, n: usize, timeout: Duration) -> Result<(i64, PgConnection), AnyError> {
    let deadline = Instant::now() + timeout;
    let mut monitor = PgConnection::connect(url).await?;
    while handled.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            return Err(format!("timed out: {} of {n} jobs handled", handled.load(Ordering::Relaxed)).into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let sql = format!(
        "SELECT count(*) FROM awa.jobs WHERE queue = '{QUEUE}' AND state IN ('available', 'running', 'scheduled', 'retryable')"
    );
    let mut polls = 0;
    loop {
        polls += 1;
        if count(&mut monitor, &sql).await? == 0 {
            return Ok((polls, monitor));
        }
        if Instant::now() > deadline {
            return Err("timed out waiting for completions to land".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn runtime_config(o: &Opts) -> RuntimeConfig {
    let mut config = RuntimeConfig { poll_interval: Duration::from_millis(o.poll_ms), ..RuntimeConfig::default() };
    // Probe knob (not used by the orchestrator): AWA_BENCH_FINALIZERS overrides finalizer_concurrency.
    if let Some(n) = std::env::var("AWA_BENCH_FINALIZERS").ok().and_then(|v| v.parse().ok()) {
        config.finalizer_concurrency = n;
    }
    config
}

/// The run phase of `drain` and `staging`.
async fn drain(o: &Opts, staging: bool) -> Result<Value, AnyError> {
    let pool = awa_core::pool_options().max_connections(o.pool_size).connect(&o.url).await?;
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let builder = Client::builder(pool.clone())
        .database_url(o.url.clone())
        .config(runtime_config(o))
        .queue(QUEUE, QueueConfig::new(o.workers));
    let client = if staging {
        builder
            .register::<StageJob, _, _>(move |args, ctx| {
                let staged = ctx.enqueue_on_completion(
                    EnqueueRequest::new(FollowUp { i: args.i }).queue(FOLLOW_UP_QUEUE).unique(UniqueOpts::default()),
                );
                h.fetch_add(1, Ordering::Relaxed);
                async move {
                    staged.map_err(JobError::from)?;
                    Ok(JobResult::Completed)
                }
            })
            .build()?
    } else {
        builder
            .register::<Noop, _, _>(move |_args, _ctx| {
                h.fetch_add(1, Ordering::Relaxed);
                async { Ok(JobResult::Completed) }
            })
            .build()?
    };
    let t0 = Instant::now();
    client.start().await?;
    let (polls, monitor) = wait_drained(&o.url, &handled, o.jobs, Duration::from_secs(900)).await?;
    let seconds = t0.elapsed().as_secs_f64();
    client.shutdown(Duration::from_secs(5)).await;
    pool.close().await;
    monitor.close().await?;
    Ok(json!({
        "jobs": o.jobs,
        "workers": o.workers,
        "seconds": seconds,
        "jobs_per_s": o.jobs as f64 / seconds,
        "own_txns": polls,
        "settings": format!("QueueConfig::new({}), RuntimeConfig {{ poll_interval: {} ms, ..default }}, pool {} connections",
            o.workers, o.poll_ms, o.pool_size),
    }))
}

/// The verify phase of `drain`, `staging` and `floor`.
async fn verify(o: &Opts, staging: bool) -> Result<Value, AnyError> {
    let mut conn = PgConnection::connect(&o.url).await?;
    let completed =
        count(&mut conn, &format!("SELECT count(*) FROM awa.jobs WHERE queue = '{QUEUE}' AND state = 'completed'")).await?;
    let mut out = json!({ "completed": completed });
    if staging {
        let row = sqlx::query(&format!(
            "SELECT count(*), count(DISTINCT args->>'i') FROM awa.jobs WHERE queue = '{FOLLOW_UP_QUEUE}' AND kind = 'follow_up'"
        ))
        .fetch_one(&mut conn)
        .await?;
        let rows: i64 = row.try_get(0)?;
        let distinct: i64 = row.try_get(1)?;
        out["follow_ups"] = json!(rows);
        out["follow_ups_distinct"] = json!(distinct);
        out["exactly_once"] = json!(rows == o.jobs as i64 && distinct == o.jobs as i64);
    }
    conn.close().await?;
    Ok(out)
}

/// The run phase of `enqueue_single`.
async fn enqueue_single(o: &Opts) -> Result<Value, AnyError> {
    let pool = awa_core::pool_options().max_connections(4).connect(&o.url).await?;
    // Open the connection (and prepare the statement) outside the clock.
    awa_core::insert(&pool, Noop { i: -1 }).await?;
    let t0 = Instant::now();
    for i in 0..o.jobs {
        awa_core::insert_with(&pool, EnqueueRequest::new(Noop { i: i as i64 }).queue(QUEUE)).await?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    pool.close().await;
    Ok(json!({
        "jobs": o.jobs,
        "seconds": seconds,
        "jobs_per_s": o.jobs as f64 / seconds,
        "api": "awa_core::insert_with",
    }))
}

/// The run phase of `floor`: claim and complete with our own statements, no runtime around
/// them, on `loops` connections at once.
async fn floor(o: &Opts) -> Result<Value, AnyError> {
    let pool = awa_core::pool_options()
        .max_connections(o.loops as u32)
        .min_connections(o.loops as u32)
        .connect(&o.url)
        .await?;
    // Open the connections before the clock starts.
    let mut warm = Vec::with_capacity(o.loops);
    for _ in 0..o.loops {
        warm.push(pool.acquire().await?);
    }
    drop(warm);
    let claims = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..o.loops {
        let pool: PgPool = pool.clone();
        let batch = o.batch as i64;
        let claims = claims.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            loop {
                let jobs = claim_batch(&pool, QUEUE, batch, Duration::from_secs(1800)).await?;
                claims.fetch_add(1, Ordering::Relaxed);
                if jobs.is_empty() {
                    return Ok::<usize, awa_core::AwaError>(done);
                }
                let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
                let leases: Vec<i64> = jobs.iter().map(|j| j.run_lease).collect();
                done += complete_batch(&pool, &ids, &leases).await?.len();
            }
        }));
    }
    let mut completed = 0;
    for t in tasks {
        completed += t.await??;
    }
    let seconds = t0.elapsed().as_secs_f64();
    pool.close().await;
    Ok(json!({
        "jobs": o.jobs,
        "completed_in_run": completed,
        "loops": o.loops,
        "batch": o.batch,
        "claim_statements": claims.load(Ordering::Relaxed),
        "seconds": seconds,
        "jobs_per_s": completed as f64 / seconds,
        "own_txns": 0,
        "settings": format!("claim_batch(limit {}) + batched::complete_batch on {} connections", o.batch, o.loops),
    }))
}

async fn run(o: &Opts) -> Result<Value, AnyError> {
    let staging = o.workload == "staging";
    let mut out = json!({});
    let merge = |out: &mut Value, v: Value| {
        if let (Some(dst), Value::Object(src)) = (out.as_object_mut(), v) {
            dst.extend(src);
        }
    };
    if o.phase == "setup" || o.phase == "all" {
        let v = match o.workload.as_str() {
            "drain" | "floor" => setup(&o.url, o.jobs, |i| Noop { i }).await?,
            "enqueue_single" => setup(&o.url, 0, |i| Noop { i }).await?,
            "staging" => setup(&o.url, o.jobs, |i| StageJob { i }).await?,
            other => return Err(format!("unknown workload {other}").into()),
        };
        merge(&mut out, v);
    }
    if o.phase == "run" || o.phase == "all" {
        let v = match o.workload.as_str() {
            "drain" => drain(o, false).await?,
            "staging" => drain(o, true).await?,
            "floor" => floor(o).await?,
            "enqueue_single" => enqueue_single(o).await?,
            other => return Err(format!("unknown workload {other}").into()),
        };
        merge(&mut out, v);
        out["system"] = json!({"name": "awa-bench (Rust)", "version": env!("CARGO_PKG_VERSION")});
    }
    if (o.phase == "verify" || o.phase == "all") && o.workload != "enqueue_single" {
        merge(&mut out, verify(o, staging).await?);
    }
    Ok(out)
}

#[tokio::main]
async fn main() {
    let result = async {
        let o = parse_opts()?;
        run(&o).await
    }
    .await;
    match result {
        Ok(v) => println!("BENCH_RESULT {}", json!({"ok": true, "result": v})),
        Err(e) => {
            println!("BENCH_RESULT {}", json!({"ok": false, "error": e.to_string()}));
            std::process::exit(1);
        }
    }
}
