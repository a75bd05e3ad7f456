//! Helpers shared by the callback, progress, spec and staged follow-up tests.
#![allow(dead_code)]

use crate::common::TestDb;
use awa_core::executor::context::JobContext;
use awa_core::executor::result::Returned;
use awa_core::executor::sealed_on_return;
use awa_core::{get_job, ErasedHandler, HandlerResult, JobRow, JobState, Outcome, RuntimeConfig};
use futures_util::future::BoxFuture;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short intervals so rescue, promotion and heartbeats happen within a test.
pub fn fast_config() -> RuntimeConfig {
    RuntimeConfig {
        poll_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(100),
        // Well above the heartbeat interval: on a loaded machine a heartbeat can be late by
        // hundreds of milliseconds, and a live attempt taken for dead runs twice.
        heartbeat_staleness: Duration::from_secs(3),
        heartbeat_rescue_interval: Duration::from_millis(100),
        deadline_rescue_interval: Duration::from_millis(100),
        callback_rescue_interval: Duration::from_millis(100),
        promote_interval: Duration::from_millis(50),
        leader_election_interval: Duration::from_millis(200),
        ..Default::default()
    }
}

/// `fast_config` without the maintenance leader (no rescue, no promotion), for tests that
/// drive rescue by hand.
pub fn quiet_config() -> RuntimeConfig {
    RuntimeConfig {
        maintenance: false,
        ..fast_config()
    }
}

/// Kept for tests written before [`TestDb::new`] isolated ids itself: moves the ids to yet
/// another block of their own, which is harmless.
pub async fn isolate_ids(db: &TestDb) {
    db.isolate_ids().await;
}

/// A migrated database with job ids of its own (every [`TestDb::new`] isolates its ids, so
/// tests arming id-keyed fault seams cannot fire each other's faults).
pub async fn test_db() -> TestDb {
    TestDb::new().await
}

/// Poll until `check` returns `Some`, failing the test after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until `n` jobs are completed.
pub async fn wait_for_completed(db: &TestDb, n: i64, timeout: Duration) {
    eventually(&format!("{n} completed jobs"), timeout, || async {
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM awa.jobs WHERE state = 'completed'")
                .fetch_one(&db.pool)
                .await
                .expect("count");
        (done == n).then_some(())
    })
    .await
}

/// Wait until job `id` is in one of `states`.
pub async fn wait_for_state(
    db: &TestDb,
    id: i64,
    states: &[JobState],
    timeout: Duration,
) -> JobRow {
    let start = Instant::now();
    loop {
        let job = get_job(&db.pool, id).await.expect("get job");
        if states.contains(&job.state) {
            return job;
        }
        assert!(
            start.elapsed() < timeout,
            "job {id} stuck in {:?}, wanted {states:?}",
            job.state
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until the client has no attempt running or finalizing.
pub async fn wait_idle(client: &awa_core::Client, timeout: Duration) {
    let start = Instant::now();
    while client.in_flight().await > 0 {
        assert!(
            start.elapsed() < timeout,
            "client still has {} attempts in flight",
            client.in_flight().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows of `kind`, oldest id first.
pub async fn jobs_of_kind(db: &TestDb, kind: &str) -> Vec<JobRow> {
    let filter = awa_core::JobFilter {
        kind: Some(kind.to_string()),
        limit: Some(10_000),
        ..Default::default()
    };
    let mut rows = awa_core::list_jobs(&db.pool, &filter)
        .await
        .expect("list jobs");
    rows.reverse();
    rows
}

pub async fn count_kind(db: &TestDb, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM awa.jobs WHERE kind = $1")
        .bind(kind)
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

/// Make every insert of `kind` into `awa.jobs` fail with a trigger, as an application's own
/// trigger (or a database problem nobody could predict at staging time) would.
pub async fn reject_inserts_of(db: &TestDb, kind: &str) {
    sqlx::query(&format!(
        "CREATE FUNCTION awa.test_reject_insert() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.kind = '{kind}' THEN RAISE EXCEPTION 'test trigger rejects %', NEW.kind; END IF;
             RETURN NEW;
         END $$"
    ))
    .execute(&db.pool)
    .await
    .expect("create trigger function");
    sqlx::query(
        "CREATE TRIGGER test_reject_insert BEFORE INSERT ON awa.canonical_jobs
         FOR EACH ROW EXECUTE FUNCTION awa.test_reject_insert()",
    )
    .execute(&db.pool)
    .await
    .expect("create trigger");
}

pub fn metric(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::SeqCst)
}

/// A closure handler for `awa_core::testing::work_one`, which takes a type-erased handler.
pub struct FnHandler<F>(pub F);

impl<F, Fut> ErasedHandler for FnHandler<F>
where
    F: Fn(Arc<JobContext>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    fn run(&self, ctx: Arc<JobContext>) -> BoxFuture<'static, Returned> {
        let fut = (self.0)(ctx.clone());
        sealed_on_return(&ctx, async move {
            match fut.await {
                Ok(r) => Outcome::Returned(r),
                Err(error) => Outcome::Failed {
                    error,
                    traceback: None,
                },
            }
        })
    }
}

pub fn handler<F, Fut>(f: F) -> Arc<dyn ErasedHandler>
where
    F: Fn(Arc<JobContext>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    Arc::new(FnHandler(f))
}
