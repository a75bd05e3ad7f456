//! Worker configuration that does what it says: weighted queues sharing a global pool, the
//! claim rate limit, claimers, claim batch size and the retention batch.
//!
//! Shares are measured by counting the handlers running per queue (each handler counts
//! itself in and waits on a gate the test opens), and rate limits from the claim timestamps
//! stored in the database; nothing waits for time to pass.

mod common;
mod support;

use awa_core::{insert_many, Client, EnqueueRequest, JobArgs, JobResult, QueueConfig};
use awa_core::{AwaError, RuntimeConfig};
use chrono::{DateTime, Utc};
use common::TestDb;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, fast_config, test_db};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Work {
    n: i64,
}
impl JobArgs for Work {}

const T: Duration = Duration::from_secs(30);

fn config() -> RuntimeConfig {
    RuntimeConfig {
        heartbeat_staleness: Duration::from_secs(60),
        ..fast_config()
    }
}

async fn insert(db: &TestDb, queue: &str, n: i64) {
    let jobs: Vec<_> = (0..n)
        .map(|n| EnqueueRequest::new(Work { n }).queue(queue))
        .collect();
    insert_many(&db.pool, jobs).await.expect("insert");
}

async fn completed(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM awa.jobs WHERE state = 'completed'")
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

/// Handlers running now per queue, the most ever running at once, and the gate they wait on.
#[derive(Default)]
struct Running {
    now: Mutex<HashMap<String, usize>>,
    total: AtomicUsize,
    peak: AtomicUsize,
}

impl Running {
    fn of(&self, queue: &str) -> usize {
        self.now
            .lock()
            .expect("lock")
            .get(queue)
            .copied()
            .unwrap_or(0)
    }
}

fn gated_client(
    db: &TestDb,
    rc: RuntimeConfig,
    queues: Vec<(&str, QueueConfig)>,
    running: Arc<Running>,
    gate: Arc<Semaphore>,
) -> Result<Client, AwaError> {
    let mut b = Client::builder(db.pool.clone()).config(rc);
    for (q, c) in queues {
        b = b.queue(q, c);
    }
    b.register::<Work, _, _>(move |_args, ctx| {
        let (running, gate) = (running.clone(), gate.clone());
        let queue = ctx.job().queue.clone();
        async move {
            *running
                .now
                .lock()
                .expect("lock")
                .entry(queue.clone())
                .or_default() += 1;
            let total = running.total.fetch_add(1, Ordering::SeqCst) + 1;
            running.peak.fetch_max(total, Ordering::SeqCst);
            // Each pass lets exactly one handler through (it is not given back).
            if let Ok(pass) = gate.acquire().await {
                pass.forget();
            }
            running.total.fetch_sub(1, Ordering::SeqCst);
            *running.now.lock().expect("lock").entry(queue).or_default() -= 1;
            Ok(JobResult::Completed)
        }
    })
    .build()
}

/// Two saturated weighted queues share the pool by weight: global 8, each with 1 slot of its
/// own, so the pool holds 6, split 4 : 2 by weights 2 : 1. Whatever the first claims grabbed,
/// once every handler has turned over once, a full pool is exactly 1 + 4 and 1 + 2.
#[tokio::test]
async fn two_saturated_weighted_queues_get_their_shares_of_the_pool() {
    let db = test_db().await;
    insert(&db, "heavy", 80).await;
    insert(&db, "light", 80).await;
    let running = Arc::new(Running::default());
    let gate = Arc::new(Semaphore::new(0));
    let rc = RuntimeConfig {
        global_max_workers: Some(8),
        ..config()
    };
    let client = gated_client(
        &db,
        rc,
        vec![
            ("heavy", QueueConfig::weighted(1, 2)),
            ("light", QueueConfig::weighted(1, 1)),
        ],
        running.clone(),
        gate.clone(),
    )
    .expect("build");
    client.start().await.expect("start");
    let full = |r: &Running| r.total.load(Ordering::SeqCst) == 8;
    eventually("the pool to fill", T, || async {
        full(&running).then_some(())
    })
    .await;
    let mut shares = Vec::new();
    for round in 1..=5i64 {
        // Let every running handler finish (the gate is FIFO: exactly the 8 waiting).
        gate.add_permits(8);
        eventually(
            "the round's jobs to complete and the pool to refill",
            T,
            || async { (completed(&db).await == 8 * round && full(&running)).then_some(()) },
        )
        .await;
        shares.push((running.of("heavy"), running.of("light")));
    }
    assert!(
        running.peak.load(Ordering::SeqCst) <= 8,
        "global_max_workers exceeded"
    );
    assert!(
        shares.iter().all(|s| *s == (5, 3)),
        "shares per round: {shares:?}"
    );
    gate.add_permits(10_000);
    client.shutdown(Duration::from_secs(10)).await;
}

/// An idle weighted queue's share goes to the busy one; its own minimum stays its own.
#[tokio::test]
async fn an_idle_weighted_queues_share_goes_to_the_busy_one() {
    let db = test_db().await;
    insert(&db, "busy", 40).await;
    let running = Arc::new(Running::default());
    let gate = Arc::new(Semaphore::new(0));
    let rc = RuntimeConfig {
        global_max_workers: Some(6),
        ..config()
    };
    let client = gated_client(
        &db,
        rc,
        vec![
            ("busy", QueueConfig::weighted(0, 1)),
            ("idle", QueueConfig::weighted(2, 5)),
        ],
        running.clone(),
        gate.clone(),
    )
    .expect("build");
    client.start().await.expect("start");
    // The pool is 6 - 2 = 4 and the idle queue has no work: busy gets all 4, never more.
    eventually("busy to take the whole pool", T, || async {
        (running.of("busy") == 4).then_some(())
    })
    .await;
    insert(&db, "idle", 2).await;
    eventually("idle to run on its own slots", T, || async {
        (running.of("idle") == 2).then_some(())
    })
    .await;
    assert_eq!(running.of("busy"), 4);
    assert!(running.peak.load(Ordering::SeqCst) <= 6);
    gate.add_permits(10_000);
    client.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn weighted_configs_that_cannot_work_are_refused() {
    let db = test_db().await;
    let build = |rc: RuntimeConfig, queues: Vec<(&str, QueueConfig)>| {
        gated_client(&db, rc, queues, Arc::default(), Arc::new(Semaphore::new(0)))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let global = |n| RuntimeConfig {
        global_max_workers: Some(n),
        ..config()
    };
    let e = build(config(), vec![("w", QueueConfig::weighted(1, 1))]);
    assert!(e.contains("global_max_workers is not set"), "{e}");
    let e = build(
        global(4),
        vec![
            ("a", QueueConfig::weighted(3, 1)),
            ("b", QueueConfig::weighted(3, 1)),
        ],
    );
    assert!(
        e.contains("sum of min_workers (6) exceeds global_max_workers (4)"),
        "{e}"
    );
    let e = build(
        global(4),
        vec![
            ("a", QueueConfig::weighted(1, 1)),
            ("b", QueueConfig::new(4)),
        ],
    );
    assert!(e.contains("(5) exceeds global_max_workers (4)"), "{e}");
    let e = build(global(4), vec![("a", QueueConfig::weighted(1, 0))]);
    assert!(e.contains("weight is 0"), "{e}");
    let e = build(global(0), vec![("a", QueueConfig::weighted(0, 1))]);
    assert!(e.contains("global_max_workers is 0"), "{e}");
    let e = build(
        config(),
        vec![("a", QueueConfig::new(1).rate_limit(0.0, 1))],
    );
    assert!(e.contains("rate_limit.max_rate is 0"), "{e}");
    let e = build(
        config(),
        vec![("a", QueueConfig::new(1).rate_limit(1.0, 0))],
    );
    assert!(e.contains("rate_limit.burst is 0"), "{e}");
    let e = build(config(), vec![("a", QueueConfig::new(1).claimers(0))]);
    assert!(e.contains("claimers is 0"), "{e}");
    let e = build(config(), vec![("a", QueueConfig::new(1).claim_batch(0))]);
    assert!(e.contains("claim_batch_size is 0"), "{e}");
    let e = build(
        RuntimeConfig {
            cleanup_batch: 0,
            ..config()
        },
        vec![("a", QueueConfig::new(1))],
    );
    assert!(e.contains("cleanup_batch_size is 0"), "{e}");
}

/// The claims of one queue as stored: `(attempted_at, jobs)` per claim statement, in order
/// (every job of one claim has the statement's `now()`).
async fn claims(db: &TestDb, queue: &str) -> Vec<(DateTime<Utc>, i64)> {
    sqlx::query_as(
        "SELECT attempted_at, count(*) FROM awa.jobs WHERE queue = $1
         GROUP BY attempted_at ORDER BY attempted_at",
    )
    .bind(queue)
    .fetch_all(&db.pool)
    .await
    .expect("claims")
}

/// The bucket's guarantee read from the database. With one claim statement in flight at a
/// time, claim `i`'s tokens were taken after claim `i-1` had started in the database (it
/// returned first) and claim `j`'s before claim `j` started, so claims `i..=j` took at most
/// `burst + rate × (t[j] - t[i-1])` tokens, with `t` the stored claim times. The first claim
/// takes at most `burst`. The tolerance (5 ms of refill) covers the database clock and the
/// runtime's monotonic clock drifting apart by a few hundred parts per million.
fn assert_within_bucket(claims: &[(DateTime<Utc>, i64)], rate: f64, burst: f64) {
    assert!(claims[0].1 as f64 <= burst, "first claim {claims:?}");
    for i in 1..claims.len() {
        let mut jobs = 0i64;
        for j in i..claims.len() {
            jobs += claims[j].1;
            let dt = (claims[j].0 - claims[i - 1].0)
                .num_microseconds()
                .unwrap_or(0) as f64
                / 1e6;
            let bound = burst + rate * (dt + 0.005);
            assert!(
                jobs as f64 <= bound,
                "claims {i}..={j} took {jobs} jobs in {dt} s: more than {bound}"
            );
        }
    }
}

#[tokio::test]
async fn a_rate_limited_queue_never_claims_faster_than_its_bucket() {
    let db = test_db().await;
    const JOBS: i64 = 45;
    const RATE: f64 = 20.0;
    const BURST: u32 = 5;
    insert(&db, "limited", JOBS).await;
    let client = Client::builder(db.pool.clone())
        .config(config())
        .queue(
            "limited",
            QueueConfig::new(8).rate_limit(RATE, BURST).claim_batch(4),
        )
        .register::<Work, _, _>(|_args, _ctx| async { Ok(JobResult::Completed) })
        .build()
        .expect("build");
    client.start().await.expect("start");
    eventually("every job to complete", T, || async {
        (completed(&db).await == JOBS).then_some(())
    })
    .await;
    client.shutdown(Duration::from_secs(5)).await;
    let claims = claims(&db, "limited").await;
    assert_eq!(claims.iter().map(|c| c.1).sum::<i64>(), JOBS);
    assert!(
        claims.iter().all(|c| c.1 <= 4),
        "claim_batch_size exceeded: {claims:?}"
    );
    assert_within_bucket(&claims, RATE, f64::from(BURST));
    // And the limit bit (not vacuous): by the bound for claims 1..=last, the jobs after the
    // first claim took at least (45 - first - 5) / 20 s from the first claim's time.
    let span = (claims[claims.len() - 1].0 - claims[0].0)
        .num_microseconds()
        .unwrap_or(0) as f64
        / 1e6;
    let least = (JOBS - claims[0].1 - i64::from(BURST)) as f64 / RATE - 0.005;
    assert!(
        span >= least,
        "all claimed within {span} s, less than {least} s"
    );
}

/// `claimers: 2` keeps two claim statements in flight over one set of slots: every job runs
/// exactly once and never more than `max_workers` at a time.
#[tokio::test]
async fn two_claimers_share_the_queues_slots() {
    let db = test_db().await;
    const JOBS: i64 = 300;
    insert(&db, "two_claimers", JOBS).await;
    let runs: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (r, n, p) = (runs.clone(), now.clone(), peak.clone());
    let client = Client::builder(db.pool.clone())
        .config(config())
        .queue(
            "two_claimers",
            QueueConfig::new(6).claimers(2).claim_batch(3),
        )
        .register::<Work, _, _>(move |_args, ctx| {
            let (runs, now, peak) = (r.clone(), n.clone(), p.clone());
            let id = ctx.job().id;
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(running, Ordering::SeqCst);
                *runs.lock().expect("lock").entry(id).or_default() += 1;
                tokio::task::yield_now().await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    client.start().await.expect("start");
    eventually("every job to complete", T, || async {
        (completed(&db).await == JOBS).then_some(())
    })
    .await;
    client.shutdown(Duration::from_secs(5)).await;
    {
        let runs = runs.lock().expect("lock");
        assert_eq!(runs.len(), JOBS as usize);
        assert!(runs.values().all(|n| *n == 1), "a job ran twice");
    }
    assert!(peak.load(Ordering::SeqCst) <= 6, "max_workers exceeded");
    let claims = claims(&db, "two_claimers").await;
    assert!(claims.iter().all(|c| c.1 <= 3), "claim_batch_size exceeded");
}

/// `cleanup_batch_size` bounds one retention pass.
#[tokio::test]
async fn one_retention_pass_deletes_at_most_the_cleanup_batch() {
    let db = test_db().await;
    insert(&db, "old", 7).await;
    sqlx::query(
        "UPDATE awa.jobs SET state = 'completed', finalized_at = now() - interval '2 days'",
    )
    .execute(&db.pool)
    .await
    .expect("finish");
    let day = Duration::from_secs(24 * 3600);
    let prune = |batch| awa_core::maintenance::prune::prune_terminal(&db.pool, day, day, batch);
    assert_eq!(prune(3).await.expect("prune"), 3);
    assert_eq!(prune(3).await.expect("prune"), 3);
    assert_eq!(prune(3).await.expect("prune"), 1);
}
