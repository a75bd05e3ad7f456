//! Claim-ahead: a dispatcher with a backlog claims the next batch while the current one runs,
//! and the claimed jobs wait in a buffer for a slot. These tests hold handlers on a gate and
//! force claim-ahead on their queue (`seams::force_claim_ahead`) where they need jobs to sit
//! in the buffer, instead of relying on timing.

mod common;
mod support;

use awa_core::seams;
use awa_core::storage::admin;
use awa_core::{
    get_job, insert_many, Client, EnqueueRequest, JobArgs, JobResult, JobState, QueueConfig,
    RuntimeConfig,
};
use common::TestDb;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, fast_config, test_db, wait_for_state};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    n: i64,
}
impl JobArgs for Step {}

const T: Duration = Duration::from_secs(20);

/// Rescue is not under test: a loaded machine must not make a heartbeat look stale.
fn config() -> RuntimeConfig {
    RuntimeConfig {
        heartbeat_staleness: Duration::from_secs(60),
        ..fast_config()
    }
}

async fn insert_steps(db: &TestDb, queue: &str, n: i64) -> Vec<i64> {
    let jobs: Vec<_> = (0..n)
        .map(|n| EnqueueRequest::new(Step { n }).queue(queue))
        .collect();
    insert_many(&db.pool, jobs)
        .await
        .expect("insert")
        .into_iter()
        .map(|j| j.id)
        .collect()
}

async fn count(db: &TestDb, queue: &str, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM awa.jobs WHERE queue = $1 AND state = $2")
        .bind(queue)
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

/// A handler that records the jobs it ran and waits for the gate to open.
struct Gated {
    entered: Arc<Mutex<Vec<i64>>>,
    gate: Arc<Semaphore>,
}

impl Gated {
    fn new() -> Self {
        Gated {
            entered: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn client(&self, db: &TestDb, queue: &str, max_workers: usize) -> Client {
        let (entered, gate) = (self.entered.clone(), self.gate.clone());
        Client::builder(db.pool.clone())
            .queue(queue, QueueConfig::new(max_workers))
            .config(config())
            .register::<Step, _, _>(move |_args, ctx| {
                let (entered, gate) = (entered.clone(), gate.clone());
                let id = ctx.job().id;
                async move {
                    entered.lock().expect("lock").push(id);
                    let _pass = gate.acquire().await;
                    Ok(JobResult::Completed)
                }
            })
            .build()
            .expect("build")
    }

    fn entered(&self) -> Vec<i64> {
        self.entered.lock().expect("lock").clone()
    }

    fn open(&self) {
        self.gate.add_permits(10_000);
    }
}

/// Drain a backlog with two clients and check every job ran exactly once, no client ran more
/// handlers at once than its `max_workers`, and jobs really were claimed ahead (more rows
/// `running` in the database than handlers could be running).
async fn drain_exactly_once_within_max_workers(queue: &str) {
    let db = test_db().await;
    const JOBS: i64 = 800;
    const WORKERS: usize = 4;
    let runs: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let make = || {
        let runs = runs.clone();
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (n, p) = (now.clone(), peak.clone());
        let client = Client::builder(db.pool.clone())
            .queue(queue, QueueConfig::new(WORKERS))
            .config(config())
            .register::<Step, _, _>(move |_args, ctx| {
                let (runs, now, peak) = (runs.clone(), n.clone(), p.clone());
                let id = ctx.job().id;
                async move {
                    let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(running, Ordering::SeqCst);
                    *runs.lock().expect("lock").entry(id).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(JobResult::Completed)
                }
            })
            .build()
            .expect("build");
        (client, peak)
    };
    let (a, peak_a) = make();
    let (b, peak_b) = make();
    insert_steps(&db, queue, JOBS).await;
    a.start().await.expect("start a");
    b.start().await.expect("start b");
    let most_running = AtomicI64::new(0);
    eventually("the backlog to drain", Duration::from_secs(60), || async {
        most_running.fetch_max(count(&db, queue, "running").await, Ordering::SeqCst);
        (count(&db, queue, "completed").await == JOBS).then_some(())
    })
    .await;
    let most_running = most_running.load(Ordering::SeqCst);
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
    {
        let runs = runs.lock().expect("lock");
        assert_eq!(runs.len(), JOBS as usize);
        assert!(runs.values().all(|n| *n == 1), "a job ran twice");
    }
    let (pa, pb) = (peak_a.load(Ordering::SeqCst), peak_b.load(Ordering::SeqCst));
    assert!(
        pa <= WORKERS && pb <= WORKERS,
        "max_workers exceeded: {pa}, {pb}"
    );
    assert!(
        most_running > (2 * WORKERS) as i64,
        "never more running rows ({most_running}) than handlers: nothing was claimed ahead"
    );
    let leases: Vec<i64> = sqlx::query_scalar("SELECT DISTINCT run_lease FROM awa.jobs")
        .fetch_all(&db.pool)
        .await
        .expect("leases");
    assert_eq!(
        leases,
        vec![1],
        "every job was claimed exactly once (none released and re-claimed)"
    );
}

#[tokio::test]
async fn a_backlog_drains_exactly_once_within_max_workers() {
    // Claim-ahead as measured: 2 ms handlers, so a full batch is buffered.
    drain_exactly_once_within_max_workers("ahead_measured").await;
}

#[tokio::test]
async fn a_backlog_drains_exactly_once_within_max_workers_when_forced() {
    seams::force_claim_ahead("ahead_forced", Duration::from_secs(60));
    drain_exactly_once_within_max_workers("ahead_forced").await;
}

#[tokio::test]
async fn shutdown_releases_jobs_claimed_ahead() {
    let db = test_db().await;
    let queue = "ahead_shutdown";
    seams::force_claim_ahead(queue, Duration::from_secs(60));
    let gated = Gated::new();
    let client = gated.client(&db, queue, 2);
    let ids = insert_steps(&db, queue, 6).await;
    client.start().await.expect("start");
    // Two handlers hold both slots; two more jobs are claimed and wait for a slot.
    eventually("two running and two claimed ahead", T, || async {
        (gated.entered().len() == 2 && count(&db, queue, "running").await == 4).then_some(())
    })
    .await;
    let entered = gated.entered();
    let buffered: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM awa.jobs WHERE queue = $1 AND state = 'running' AND NOT (id = ANY($2)) ORDER BY id")
            .bind(queue)
            .bind(&entered)
            .fetch_all(&db.pool)
            .await
            .expect("buffered");
    assert_eq!(buffered.len(), 2);
    // A cancel request for one of them lands in the database before shutdown.
    admin::cancel(&db.pool, buffered[1])
        .await
        .expect("cancel buffered");
    let stopping = {
        let client = client.clone();
        tokio::spawn(async move { client.shutdown(Duration::from_secs(10)).await })
    };
    // The buffer is given back as the dispatcher stops, while the handlers still run.
    let released = wait_for_state(&db, buffered[0], &[JobState::Available], T).await;
    assert_eq!(
        (released.attempt, released.run_lease),
        (0, 1),
        "attempt restored, lease kept"
    );
    assert!(released.heartbeat_at.is_none() && released.deadline_at.is_none());
    assert!(released.errors.is_empty());
    let cancelled = wait_for_state(&db, buffered[1], &[JobState::Cancelled], T).await;
    assert!(
        cancelled.errors[0]
            .error
            .contains("requested before the handler started"),
        "{:?}",
        cancelled.errors
    );
    assert_eq!(
        count(&db, queue, "running").await,
        2,
        "the handlers still run"
    );
    gated.open();
    stopping.await.expect("shutdown");
    assert_eq!(
        count(&db, queue, "running").await,
        0,
        "nothing left running"
    );
    for id in &entered {
        assert_eq!(
            get_job(&db.pool, *id).await.expect("get").state,
            JobState::Completed
        );
    }
    assert_eq!(count(&db, queue, "available").await, 3);
    assert_eq!(gated.entered(), entered, "no released job ran");
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM awa.jobs WHERE id = ANY($1) AND attempt = 0 AND state = 'available'",
    )
    .bind(&ids)
    .fetch_one(&db.pool)
    .await
    .expect("count");
    assert_eq!(untouched, 3);
}

#[tokio::test]
async fn a_job_cancelled_while_claimed_ahead_never_runs() {
    let db = test_db().await;
    let queue = "ahead_cancel";
    seams::force_claim_ahead(queue, Duration::from_secs(60));
    let gated = Gated::new();
    let client = gated.client(&db, queue, 1);
    let ids = insert_steps(&db, queue, 3).await;
    client.start().await.expect("start");
    eventually("one running and one claimed ahead", T, || async {
        (gated.entered().len() == 1 && count(&db, queue, "running").await == 2).then_some(())
    })
    .await;
    let first = gated.entered()[0];
    let buffered: i64 = sqlx::query_scalar(
        "SELECT id FROM awa.jobs WHERE queue = $1 AND state = 'running' AND id <> $2",
    )
    .bind(queue)
    .bind(first)
    .fetch_one(&db.pool)
    .await
    .expect("buffered");
    let requested = admin::cancel(&db.pool, buffered).await.expect("cancel");
    assert_eq!(
        requested.state,
        JobState::Running,
        "a claimed job is running"
    );
    let requested_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT cancel_requested_at FROM awa.jobs WHERE id = $1")
            .bind(buffered)
            .fetch_one(&db.pool)
            .await
            .expect("requested at");
    // Heartbeats cover the waiting job, and each one signals a pending cancel request: once a
    // second beat after the request has committed, the first one's signal is set.
    let heartbeat = |after: chrono::DateTime<chrono::Utc>| {
        let pool = db.pool.clone();
        async move {
            eventually("a heartbeat of the waiting job", T, || {
                let pool = pool.clone();
                async move {
                    let at: Option<chrono::DateTime<chrono::Utc>> =
                        sqlx::query_scalar("SELECT heartbeat_at FROM awa.jobs WHERE id = $1")
                            .bind(buffered)
                            .fetch_one(&pool)
                            .await
                            .expect("heartbeat");
                    at.filter(|at| *at > after)
                }
            })
            .await
        }
    };
    let beat = heartbeat(requested_at).await;
    heartbeat(beat).await;
    gated.open();
    let done = wait_for_state(&db, buffered, &[JobState::Cancelled], T).await;
    assert!(
        done.errors[0]
            .error
            .contains("requested before the handler started"),
        "{:?}",
        done.errors
    );
    eventually("the other jobs to complete", T, || async {
        (count(&db, queue, "completed").await == 2).then_some(())
    })
    .await;
    client.shutdown(Duration::from_secs(5)).await;
    let entered: HashSet<i64> = gated.entered().into_iter().collect();
    let expected: HashSet<i64> = ids.iter().copied().filter(|id| *id != buffered).collect();
    assert_eq!(entered, expected, "the cancelled job never ran");
}

#[tokio::test]
async fn jobs_claimed_ahead_that_wait_too_long_are_released_and_claim_ahead_pauses() {
    let db = test_db().await;
    let queue = "ahead_expiry";
    seams::force_claim_ahead(queue, Duration::from_millis(300));
    let gated = Gated::new();
    let client = gated.client(&db, queue, 1);
    let ids = insert_steps(&db, queue, 3).await;
    client.start().await.expect("start");
    eventually("one running and one claimed ahead", T, || async {
        (gated.entered().len() == 1 && count(&db, queue, "running").await == 2).then_some(())
    })
    .await;
    let first = gated.entered()[0];
    // The waiting job is given back once it has waited 300 ms for the busy slot.
    eventually("the waiting job to be released", T, || async {
        let row: (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'available' AND run_lease = 1 AND attempt = 0),
                    count(*) FILTER (WHERE state = 'running')
             FROM awa.jobs WHERE queue = $1",
        )
        .bind(queue)
        .fetch_one(&db.pool)
        .await
        .expect("count");
        (row == (1, 1)).then_some(())
    })
    .await;
    // Claim-ahead pauses until a slot frees: the released job is not claimed again meanwhile.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let leases: Vec<i64> = sqlx::query_scalar(
        "SELECT run_lease FROM awa.jobs WHERE queue = $1 AND id <> $2 ORDER BY id",
    )
    .bind(queue)
    .bind(first)
    .fetch_all(&db.pool)
    .await
    .expect("leases");
    assert!(
        leases.iter().all(|l| *l <= 1),
        "re-claimed while no slot was free: {leases:?}"
    );
    gated.open();
    eventually("every job to complete", T, || async {
        (count(&db, queue, "completed").await == 3).then_some(())
    })
    .await;
    client.shutdown(Duration::from_secs(5)).await;
    let mut entered = gated.entered();
    entered.sort_unstable();
    assert_eq!(entered, ids, "every job ran exactly once");
    let released = sqlx::query_as::<_, (i32, i64)>(
        "SELECT attempt, run_lease FROM awa.jobs WHERE run_lease = 2",
    )
    .fetch_all(&db.pool)
    .await
    .expect("released");
    assert_eq!(
        released,
        vec![(1, 2)],
        "the released job ran once: one attempt, two claims"
    );
}
