//! Finalize retries outlast a PostgreSQL restart (issue 12, item 6).
//!
//! The test starts a PRIVATE PostgreSQL cluster (initdb as the `postgres` user, a free loopback
//! port, a data directory under /tmp; the shared server is never touched), drains 3,000 jobs
//! through a running client whose handler counts its executions, and restarts the cluster
//! twice mid-drain with `pg_ctl restart -m fast`, then kills every connection of the database
//! (`pg_terminate_backend`) once more. Every third job stages a follow-up, so both
//! completion paths (batched and per-job) cross the restarts.
//!
//! Asserted: no job is lost (all 3,000 complete), every staging job has exactly one follow-up
//! (a lost acknowledgement replays as stale and inserts nothing twice), and no job executes
//! twice. Zero is the justified bound: a job runs again only if rescue takes it, which needs
//! its heartbeat to go stale (20 s here) or its finalization to give up (only once the
//! reconnect budget, 5 s by default, is spent without a working connection). A fast restart
//! takes well under a second, the runner keeps heartbeating every job until its finalization
//! ends, and the finalizer waits for the server instead of spending its three tries in
//! milliseconds. A job whose *claim* acknowledgement was lost is rescued once its heartbeat goes
//! stale and then runs for the first time, which is not a duplicate. The measured numbers are
//! printed (`cargo test --test restart_test -- --nocapture`).
//!
//! `AWA_RESTART_BUDGET_MS` overrides the reconnect budget; `0` reproduces the behaviour before
//! the fix (three immediate tries), which is how the "before" numbers in docs/guarantees.md
//! were measured.

use awa_core::storage::pool::Db;
use awa_core::{
    insert_many, Client, EnqueueRequest, JobArgs, JobResult, QueueConfig, RuntimeConfig,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const JOBS: i64 = 3_000;
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Drained {
    n: i64,
    stage: bool,
}
impl JobArgs for Drained {}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DrainedChild {
    parent: i64,
}
impl JobArgs for DrainedChild {}

/// A throwaway cluster, stopped and removed on drop.
struct PrivateCluster {
    dir: PathBuf,
    port: u16,
}

fn as_postgres(program: &str) -> Command {
    let path = format!("{PG_BIN}/{program}");
    // initdb refuses to run as root.
    if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &path]);
        c
    } else {
        Command::new(path)
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn run(mut c: Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PrivateCluster {
    fn start() -> Option<PrivateCluster> {
        if !Path::new(PG_BIN).join("initdb").exists() {
            // In CI the server programs are always there: a missing one is a failure, never a
            // silent skip.
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but there are no PostgreSQL server programs in {PG_BIN}"
            );
            eprintln!("skipping: no PostgreSQL server programs in {PG_BIN}");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = PathBuf::from(format!("/tmp/awa-restart-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("data dir");
        if running_as_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["postgres", dir.to_str().expect("utf-8 path")]);
                    c
                },
                "chown",
            );
        }
        let cluster = PrivateCluster { dir, port };
        let data = cluster.data();
        run(
            {
                let mut c = as_postgres("initdb");
                c.args(["-D", &data, "-U", "postgres", "-A", "trust"]);
                c
            },
            "initdb",
        );
        let opts = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {data} -c fsync=off -c max_connections=50"
        );
        run(
            {
                let mut c = as_postgres("pg_ctl");
                c.args([
                    "-D",
                    &data,
                    "-w",
                    "-l",
                    &format!("{data}/log"),
                    "-o",
                    &opts,
                    "start",
                ]);
                c
            },
            "pg_ctl start",
        );
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.to_str().expect("utf-8 path").to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl restart -m fast`: every backend is terminated (57P01), the server shuts down
    /// with a checkpoint and starts again with the same options. Returns how long it took.
    fn restart(&self) -> Duration {
        let started = Instant::now();
        let mut c = as_postgres("pg_ctl");
        c.args(["-D", &self.data(), "-w", "-m", "fast", "-l"])
            .arg(format!("{}/log", self.data()))
            .arg("restart");
        run(c, "pg_ctl restart");
        started.elapsed()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let mut c = as_postgres("pg_ctl");
        c.args(["-D", &self.data(), "-w", "-m", "immediate", "stop"]);
        let _ = c.output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn count(pool: &Db, sql: &str) -> Option<i64> {
    sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await.ok()
}

/// Poll `check` until it holds, for at most `limit`.
async fn until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finalizations_outlast_two_restarts_with_no_lost_and_no_duplicate_jobs() {
    let Some(cluster) = PrivateCluster::start() else {
        return;
    };
    let pool: Db = awa_core::pool_options()
        .max_connections(20)
        .connect(&cluster.url())
        .await
        .expect("connect to the private cluster")
        .into();
    awa_core::migrate(&pool).await.expect("migrate");

    let mut config = RuntimeConfig {
        poll_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(500),
        heartbeat_staleness: Duration::from_secs(20),
        heartbeat_rescue_interval: Duration::from_secs(1),
        deadline_rescue_interval: Duration::from_secs(1),
        promote_interval: Duration::from_millis(100),
        leader_election_interval: Duration::from_millis(500),
        ..RuntimeConfig::default()
    };
    if let Some(ms) = std::env::var("AWA_RESTART_BUDGET_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.finalize_reconnect_budget = Duration::from_millis(ms);
    }
    let budget = config.finalize_reconnect_budget;

    let executions: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let ran = Arc::new(AtomicUsize::new(0));
    let (execs, ran2) = (executions.clone(), ran.clone());
    let client = Client::builder(pool.clone())
        .queue("drain", QueueConfig::new(16))
        .config(config)
        .register::<Drained, _, _>(move |args, ctx| {
            *execs.lock().expect("lock").entry(ctx.job().id).or_insert(0) += 1;
            ran2.fetch_add(1, Ordering::SeqCst);
            let follow_ups = ctx.follow_ups();
            async move {
                // Some work, so that handlers are mid-flight when a restart hits.
                tokio::time::sleep(Duration::from_millis(2)).await;
                if args.stage {
                    follow_ups.enqueue_on_completion(
                        EnqueueRequest::new(DrainedChild { parent: args.n }).queue("sink"),
                    )?;
                }
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");

    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(500) {
        let requests = chunk
            .iter()
            .map(|&n| {
                EnqueueRequest::new(Drained {
                    n,
                    stage: n % 3 == 0,
                })
                .queue("drain")
            })
            .collect();
        insert_many(&pool, requests).await.expect("insert");
    }
    client.start().await.expect("start");

    // Restart when a third, then two thirds of the jobs have run (progress, not time); then,
    // at five sixths, kill every connection of the database from another session.
    let mut restarts = Vec::new();
    for at in [JOBS as usize / 3, 2 * JOBS as usize / 3] {
        until("the drain to progress", Duration::from_secs(120), || {
            ran.load(Ordering::SeqCst) >= at
        })
        .await;
        let mid_drain = ran.load(Ordering::SeqCst);
        assert!(mid_drain < JOBS as usize, "the restart must hit mid-drain");
        let took = tokio::task::block_in_place(|| cluster.restart());
        restarts.push(took);
    }
    until("the drain to progress", Duration::from_secs(120), || {
        ran.load(Ordering::SeqCst) >= 5 * JOBS as usize / 6
    })
    .await;
    let mut killer = <sqlx::PgConnection as sqlx::Connection>::connect(&cluster.url())
        .await
        .expect("connect the killer");
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t",
    )
    .fetch_one(&mut killer)
    .await
    .expect("terminate backends");
    drop(killer);

    // Every job completes: by its own finalization, or after rescue of one whose claim
    // acknowledgement was lost.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let done = count(
            &pool,
            "SELECT count(*) FROM awa.jobs WHERE kind = 'drained' AND state = 'completed'",
        )
        .await;
        if done == Some(JOBS) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timed out: {done:?} of {JOBS} completed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.shutdown(Duration::from_secs(10)).await;

    let counts = executions.lock().expect("lock").clone();
    let never_ran = JOBS as usize - counts.len();
    let duplicates: u32 = counts.values().map(|c| c - 1).sum();
    let children = count(
        &pool,
        "SELECT count(*) FROM awa.jobs WHERE kind = 'drained_child'",
    )
    .await
    .expect("count children");
    let distinct_children = count(
        &pool,
        "SELECT count(DISTINCT args->>'parent') FROM awa.jobs WHERE kind = 'drained_child'",
    )
    .await
    .expect("count children");
    let staging = (0..JOBS).filter(|n| n % 3 == 0).count() as i64;
    println!(
        "restart test: {JOBS} jobs, reconnect budget {budget:?}, restarts took {restarts:?}, \
         {killed} connections killed: duplicate executions {duplicates}, jobs never run {never_ran}, follow-ups \
         {children} ({distinct_children} distinct) of {staging}"
    );
    assert_eq!(never_ran, 0, "every job ran");
    assert_eq!(
        (children, distinct_children),
        (staging, staging),
        "every staging job has exactly one follow-up"
    );
    assert_eq!(
        duplicates, 0,
        "no job executed twice (restarts took {restarts:?}, budget {budget:?})"
    );
    pool.close().await;
    drop(cluster);
}
