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
//! - `floor`: no runtime at all: the engine's own `claim_batch` + `complete_batch` statements in
//!   a tight loop, swept over claim sizes, connection counts and pipelining (`--sweep
//!   32x2,256x4p,...`), each point on a freshly filled table; the best point is the floor, an
//!   upper bound on what any runtime can drain with our SQL on this machine.
//!
//! - `engine_drain`: the drain on either storage engine, with its WAL, dead tuples and idle
//!   pickup latency (`--engine canonical|queue_storage --pickups K`; see `engines.rs`).
//! - `soak`: bench/soak.py's steady offered load (`--rate --duration-s --sample-s
//!   --retention-s`) on the Rust runtime, on the engine `AWA_BENCH_ENGINE` names.
//!
//! Options: `--jobs N --workers W --poll-ms P --pool-size S --sweep POINTS` (`--batch B --loops L`:
//! the floor's single point when `--sweep` is not given).

mod engines;

use awa_core::finalizer::batched::complete_batch;
use awa_core::storage::claim::claim_batch;
use awa_core::{
    Client, EnqueueRequest, JobArgs, JobError, JobResult, QueueConfig, RuntimeConfig, UniqueOpts,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};
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
    sweep: String,
    engine: String,
    pickups: usize,
    rate: f64,
    duration_s: f64,
    sample_s: f64,
    retention_s: f64,
}

fn parse_opts() -> Result<Opts, AnyError> {
    let mut args = std::env::args().skip(1);
    let workload = args.next().ok_or(
        "usage: awa-bench drain|staging|floor|enqueue_single|engine_drain|soak [--phase P] --url URL [--jobs N] ...",
    )?;
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
        sweep: String::new(),
        // bench/soak.py passes the engine of a Rust system in its environment.
        engine: std::env::var("AWA_BENCH_ENGINE").unwrap_or_else(|_| "canonical".into()),
        pickups: 100,
        rate: 1000.0,
        duration_s: 60.0,
        sample_s: 10.0,
        retention_s: 10.0,
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
            "--sweep" => o.sweep = value,
            "--engine" => o.engine = value,
            "--pickups" => o.pickups = value.parse()?,
            "--rate" => o.rate = value.parse()?,
            "--duration-s" => o.duration_s = value.parse()?,
            "--sample-s" => o.sample_s = value.parse()?,
            "--retention-s" => o.retention_s = value.parse()?,
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
async fn setup<A: JobArgs>(
    url: &str,
    n: usize,
    make: impl Fn(i64) -> A,
) -> Result<Value, AnyError> {
    let pool = awa_core::pool_options()
        .max_connections(1)
        .connect(url)
        .await?;
    awa_core::migrate(&pool.clone().into()).await?;
    let mut next = 0usize;
    while next < n {
        let end = (next + 5_000).min(n);
        let batch: Vec<EnqueueRequest<A>> = (next..end)
            .map(|i| EnqueueRequest::new(make(i as i64)).queue(QUEUE))
            .collect();
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
async fn wait_drained(
    url: &str,
    handled: &AtomicUsize,
    n: usize,
    timeout: Duration,
) -> Result<(i64, PgConnection), AnyError> {
    let deadline = Instant::now() + timeout;
    let mut monitor = PgConnection::connect(url).await?;
    while handled.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            return Err(format!(
                "timed out: {} of {n} jobs handled",
                handled.load(Ordering::Relaxed)
            )
            .into());
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
    let mut config = RuntimeConfig {
        poll_interval: Duration::from_millis(o.poll_ms),
        ..RuntimeConfig::default()
    };
    // Probe knob (not used by the orchestrator): AWA_BENCH_FINALIZERS overrides finalizer_concurrency.
    if let Some(n) = std::env::var("AWA_BENCH_FINALIZERS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.finalizer_concurrency = n;
    }
    // Probe knob (not used by the orchestrator): AWA_BENCH_BATCH_FOLLOW_UPS=0 gives every
    // completion with a follow-up its own transaction (RuntimeConfig::batch_follow_ups).
    if let Ok(v) = std::env::var("AWA_BENCH_BATCH_FOLLOW_UPS") {
        config.batch_follow_ups = v != "0";
    }
    config
}

/// The run phase of `drain` and `staging`.
async fn drain(o: &Opts, staging: bool) -> Result<Value, AnyError> {
    let pool = awa_core::pool_options()
        .max_connections(o.pool_size)
        .connect(&o.url)
        .await?;
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
                    EnqueueRequest::new(FollowUp { i: args.i })
                        .queue(FOLLOW_UP_QUEUE)
                        .unique(UniqueOpts::default()),
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
    let before = engine_counters();
    let t0 = Instant::now();
    client.start().await?;
    let (polls, monitor) = wait_drained(&o.url, &handled, o.jobs, Duration::from_secs(900)).await?;
    let seconds = t0.elapsed().as_secs_f64();
    client.shutdown(Duration::from_secs(5)).await;
    pool.close().await;
    monitor.close().await?;
    let after = engine_counters();
    let per_job = |name: &str| {
        let d = after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
        d as f64 / o.jobs.max(1) as f64
    };
    Ok(json!({
        "engine": {
            "claims_per_job": per_job("CLAIM_STATEMENTS"),
            "completion_batches_per_job": per_job("COMPLETION_BATCHES"),
            "per_job_finalizations_per_job": per_job("JOBS_FINALIZED_PER_JOB"),
        },
        "jobs": o.jobs,
        "workers": o.workers,
        "seconds": seconds,
        "jobs_per_s": o.jobs as f64 / seconds,
        "own_txns": polls,
        "settings": format!("QueueConfig::new({}), RuntimeConfig {{ poll_interval: {} ms, ..default }}, pool {} connections",
            o.workers, o.poll_ms, o.pool_size),
    }))
}

/// The engine's process-wide counters by name (claims and completion commits: where the
/// commits per job go).
fn engine_counters() -> std::collections::HashMap<&'static str, i64> {
    awa_core::metrics::snapshot()
        .into_iter()
        .map(|(k, v)| (k, i64::try_from(v).unwrap_or(i64::MAX)))
        .collect()
}

/// The verify phase of `drain`, `staging` and `floor`.
async fn verify(o: &Opts, staging: bool) -> Result<Value, AnyError> {
    let mut conn = PgConnection::connect(&o.url).await?;
    let completed = count(
        &mut conn,
        &format!("SELECT count(*) FROM awa.jobs WHERE queue = '{QUEUE}' AND state = 'completed'"),
    )
    .await?;
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
    let pool = awa_core::pool_options()
        .max_connections(4)
        .connect(&o.url)
        .await?;
    // Open the connection (and prepare the statement) outside the clock.
    awa_core::insert(&pool, Noop { i: -1 }).await?;
    let t0 = Instant::now();
    for i in 0..o.jobs {
        awa_core::insert_with(
            &pool,
            EnqueueRequest::new(Noop { i: i as i64 }).queue(QUEUE),
        )
        .await?;
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

/// One point of the floor's sweep: `batch` jobs per claim on `conns` claiming loops, in one of
/// three shapes (the suffix of its label):
/// - none: each loop claims, completes that batch, claims again;
/// - `p` (pipelined): each loop claims the next batch while the previous one's completion is
///   in flight (two statements in flight per loop, on two pooled connections);
/// - `d` (decoupled, the runtime's own shape without handlers): the loops only claim and hand
///   what they claimed to one completer, which gathers whatever is waiting into completions of
///   up to `4 × batch` rows, two in flight at once, each on a connection of its own.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Serial,
    Pipelined,
    Decoupled,
}

#[derive(Clone, Copy)]
struct FloorPoint {
    batch: usize,
    conns: usize,
    shape: Shape,
}

/// Completions in flight at once in a decoupled point (as the runtime's batched completer).
const DECOUPLED_COMPLETIONS: usize = 2;

impl FloorPoint {
    /// `BxK`, `BxKp` or `BxKd` (for example `256x4p`).
    fn parse(text: &str) -> Result<FloorPoint, AnyError> {
        let t = text.trim();
        let (body, shape) = if let Some(b) = t.strip_suffix('p') {
            (b, Shape::Pipelined)
        } else if let Some(b) = t.strip_suffix('d') {
            (b, Shape::Decoupled)
        } else {
            (t, Shape::Serial)
        };
        let (b, k) = body
            .split_once('x')
            .ok_or_else(|| format!("floor point {t:?}: expected BxK, BxKp or BxKd"))?;
        let point = FloorPoint {
            batch: b.parse()?,
            conns: k.parse()?,
            shape,
        };
        if point.batch == 0 || point.conns == 0 {
            return Err(
                format!("floor point {t:?}: batch and connections must be at least 1").into(),
            );
        }
        Ok(point)
    }

    fn label(&self) -> String {
        let suffix = match self.shape {
            Shape::Serial => "",
            Shape::Pipelined => "p",
            Shape::Decoupled => "d",
        };
        format!("{}x{}{}", self.batch, self.conns, suffix)
    }

    /// Connections the point keeps open.
    fn pool_size(&self) -> u32 {
        let n = match self.shape {
            Shape::Serial => self.conns,
            Shape::Pipelined => self.conns * 2,
            Shape::Decoupled => self.conns + DECOUPLED_COMPLETIONS,
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// Empty the table and insert `n` fresh jobs, then VACUUM ANALYZE, so every point of the sweep
/// starts from the same table (not timed).
async fn refill(url: &str, n: usize) -> Result<(), AnyError> {
    let pool = awa_core::pool_options()
        .max_connections(1)
        .connect(url)
        .await?;
    sqlx::query("TRUNCATE awa.canonical_jobs")
        .execute(&pool)
        .await?;
    let mut next = 0usize;
    while next < n {
        let end = (next + 5_000).min(n);
        let batch: Vec<EnqueueRequest<Noop>> = (next..end)
            .map(|i| EnqueueRequest::new(Noop { i: i as i64 }).queue(QUEUE))
            .collect();
        awa_core::insert_many(&pool, batch).await?;
        next = end;
    }
    sqlx::query("VACUUM ANALYZE awa.canonical_jobs")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

/// Drain the table with the engine's own claim and completion statements
/// (`storage::claim::claim_batch`, `finalizer::batched::complete_batch`) and nothing else.
async fn floor_point(url: &str, p: FloorPoint) -> Result<Value, AnyError> {
    let size = p.pool_size();
    let pool = awa_core::pool_options()
        .max_connections(size)
        .min_connections(size)
        .connect(url)
        .await?;
    // Open every connection (and so every backend) before the clock starts.
    let mut warm = Vec::with_capacity(size as usize);
    for _ in 0..size {
        warm.push(pool.acquire().await?);
    }
    drop(warm);
    let statements = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let completed = if p.shape == Shape::Decoupled {
        decoupled(pool.clone().into(), p, statements.clone()).await?
    } else {
        looped(pool.clone().into(), p, statements.clone()).await?
    };
    let seconds = t0.elapsed().as_secs_f64();
    pool.close().await;
    let statements = statements.load(Ordering::Relaxed);
    Ok(json!({
        "point": p.label(),
        "batch": p.batch,
        "connections": p.conns,
        "pipelined": p.shape == Shape::Pipelined,
        "decoupled": p.shape == Shape::Decoupled,
        "completed": completed,
        "seconds": seconds,
        "jobs_per_s": completed as f64 / seconds,
        "statements": statements,
        // Every statement is its own (autocommit) transaction: statements = commits.
        "commits_per_job": statements as f64 / completed.max(1) as f64,
    }))
}

/// Serial and pipelined points: `conns` loops, each claiming and completing its own batches.
async fn looped(
    pool: awa_core::Db,
    p: FloorPoint,
    statements: Arc<AtomicUsize>,
) -> Result<usize, AnyError> {
    let mut tasks = Vec::new();
    for _ in 0..p.conns {
        let pool = pool.clone();
        let statements = statements.clone();
        let batch = p.batch as i64;
        let pipelined = p.shape == Shape::Pipelined;
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            let mut in_flight: Option<tokio::task::JoinHandle<Result<usize, awa_core::AwaError>>> =
                None;
            loop {
                let jobs = claim_batch(&pool, QUEUE, batch, Duration::from_secs(1800)).await?;
                statements.fetch_add(1, Ordering::Relaxed);
                if let Some(h) = in_flight.take() {
                    done += h.await??;
                }
                if jobs.is_empty() {
                    return Ok::<usize, AnyError>(done);
                }
                let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
                let leases: Vec<i64> = jobs.iter().map(|j| j.run_lease).collect();
                statements.fetch_add(1, Ordering::Relaxed);
                if pipelined {
                    let pool = pool.clone();
                    in_flight = Some(tokio::spawn(async move {
                        Ok(complete_batch(&pool, &ids, &leases).await?.len())
                    }));
                } else {
                    done += complete_batch(&pool, &ids, &leases).await?.len();
                }
            }
        }));
    }
    let mut completed = 0;
    for t in tasks {
        completed += t.await??;
    }
    Ok(completed)
}

/// A decoupled point: `conns` loops only claim; one completer gathers what they claimed into
/// completions of up to `4 × batch` rows, [`DECOUPLED_COMPLETIONS`] in flight.
async fn decoupled(
    pool: awa_core::Db,
    p: FloorPoint,
    statements: Arc<AtomicUsize>,
) -> Result<usize, AnyError> {
    type Claimed = (Vec<(i64, i64)>, tokio::sync::OwnedSemaphorePermit);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Claimed>();
    // Jobs claimed and not yet completed, at most two claims' worth per loop: a runtime's
    // workers bound it the same way. Unbounded, the loops claim the whole table ahead of the
    // completer and every claim then wades through the dead index entries of the rows claimed
    // before it (measured: 656 jobs/s at 64x2).
    let outstanding = Arc::new(tokio::sync::Semaphore::new(p.batch * p.conns * 2));
    let mut claimers = Vec::new();
    for _ in 0..p.conns {
        let pool = pool.clone();
        let statements = statements.clone();
        let tx = tx.clone();
        let outstanding = outstanding.clone();
        let batch = p.batch;
        claimers.push(tokio::spawn(async move {
            loop {
                let permit = outstanding
                    .clone()
                    .acquire_many_owned(u32::try_from(batch)?)
                    .await?;
                let jobs =
                    claim_batch(&pool, QUEUE, batch as i64, Duration::from_secs(1800)).await?;
                statements.fetch_add(1, Ordering::Relaxed);
                if jobs.is_empty() {
                    return Ok::<(), AnyError>(());
                }
                let claimed = jobs.iter().map(|j| (j.id, j.run_lease)).collect();
                if tx.send((claimed, permit)).is_err() {
                    return Err("the completer stopped".into());
                }
            }
        }));
    }
    drop(tx);
    let most = p.batch * 4;
    let slots = Arc::new(tokio::sync::Semaphore::new(DECOUPLED_COMPLETIONS));
    let mut completions = Vec::new();
    while let Some((first, held)) = rx.recv().await {
        let mut rows = first;
        let mut claims = vec![held];
        while rows.len() < most {
            match rx.try_recv() {
                Ok((more, held)) => {
                    rows.extend(more);
                    claims.push(held);
                }
                Err(_) => break,
            }
        }
        let permit = slots.clone().acquire_owned().await?;
        statements.fetch_add(1, Ordering::Relaxed);
        let pool = pool.clone();
        completions.push(tokio::spawn(async move {
            let _permit = permit;
            let _claims = claims; // released once these jobs are completed
            let (ids, leases): (Vec<i64>, Vec<i64>) = rows.into_iter().unzip();
            Ok::<usize, AnyError>(complete_batch(&pool, &ids, &leases).await?.len())
        }));
    }
    for c in claimers {
        c.await??;
    }
    let mut completed = 0;
    for c in completions {
        completed += c.await??;
    }
    Ok(completed)
}

/// The run phase of `floor`: every point of the sweep on a freshly filled table; the result is
/// the best point (the floor: the most any runtime could get out of our SQL on this machine),
/// with every point listed.
async fn floor(o: &Opts) -> Result<Value, AnyError> {
    let mut points = Vec::new();
    for text in o.sweep.split(',').filter(|t| !t.trim().is_empty()) {
        points.push(FloorPoint::parse(text)?);
    }
    if points.is_empty() {
        points.push(FloorPoint {
            batch: o.batch,
            conns: o.loops,
            shape: Shape::Serial,
        });
    }
    let mut results = Vec::new();
    for p in points {
        refill(&o.url, o.jobs).await?;
        let r = floor_point(&o.url, p).await?;
        if r["completed"].as_u64() != Some(o.jobs as u64) {
            return Err(format!(
                "floor point {}: completed {} of {} jobs",
                p.label(),
                r["completed"],
                o.jobs
            )
            .into());
        }
        eprintln!(
            "floor {}: {:.0} jobs/s",
            p.label(),
            r["jobs_per_s"].as_f64().unwrap_or(0.0)
        );
        results.push(r);
    }
    let best = results
        .iter()
        .max_by(|a, b| {
            a["jobs_per_s"]
                .as_f64()
                .unwrap_or(0.0)
                .total_cmp(&b["jobs_per_s"].as_f64().unwrap_or(0.0))
        })
        .cloned()
        .ok_or("empty sweep")?;
    Ok(json!({
        "jobs": o.jobs,
        "completed": o.jobs,
        "jobs_per_s": best["jobs_per_s"],
        "best": best,
        "sweep": results,
        "own_txns": 0,
        "settings": format!(
            "best of the sweep {} (BxK: B jobs per claim_batch, K claiming loops; p: each loop claims the next batch while the previous complete_batch is in flight; d: the loops only claim, one completer gathers their jobs into complete_batch calls of up to 4B rows, two in flight); table refilled and VACUUM ANALYZEd before each point",
            o.sweep
        ),
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
            "drain" => setup(&o.url, o.jobs, |i| Noop { i }).await?,
            // The floor fills the table itself before each point of its sweep.
            "enqueue_single" | "floor" => setup(&o.url, 0, |i| Noop { i }).await?,
            // Inserts through the engine under test, as part of its run.
            "engine_drain" | "soak" => json!({}),
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
            "engine_drain" => engines::engine_drain(o).await?,
            "soak" => engines::soak(o).await?,
            other => return Err(format!("unknown workload {other}").into()),
        };
        merge(&mut out, v);
        out["system"] = json!({"name": "awa-bench (Rust)", "version": env!("CARGO_PKG_VERSION")});
    }
    if (o.phase == "verify" || o.phase == "all")
        && o.workload != "enqueue_single"
        && o.workload != "floor"
        && o.workload != "engine_drain"
        && o.workload != "soak"
    {
        merge(&mut out, verify(o, staging).await?);
    }
    Ok(out)
}

/// CPU seconds (user + system, every thread) this process has used so far, from
/// `/proc/self/stat`; `None` where that is not readable. The orchestrator prefers this over
/// the whole subprocess's time: it leaves out start-up, as the Python adapters' figure does.
fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 2..)?
        .split_whitespace()
        .collect();
    // fields[0] is field 3 of stat(5); utime and stime are fields 14 and 15, in clock ticks
    // (100 per second on Linux).
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

#[tokio::main]
async fn main() {
    let cpu0 = process_cpu_s();
    let result = async {
        let o = parse_opts()?;
        let mut v = run(&o).await?;
        if o.phase == "run" {
            if let (Some(a), Some(b), Some(obj)) = (cpu0, process_cpu_s(), v.as_object_mut()) {
                obj.insert("cpu_s".into(), json!(b - a));
            }
        }
        Ok::<_, AnyError>(v)
    }
    .await;
    match result {
        Ok(v) => println!("BENCH_RESULT {}", json!({"ok": true, "result": v})),
        Err(e) => {
            println!(
                "BENCH_RESULT {}",
                json!({"ok": false, "error": e.to_string()})
            );
            std::process::exit(1);
        }
    }
}
