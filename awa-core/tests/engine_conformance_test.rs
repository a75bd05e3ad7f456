//! One suite, both storage engines (issue 18, item 2): each scenario runs the real runtime
//! (`Client`: dispatcher, heartbeats, both completion paths, the maintenance leader) against
//! canonical storage and against queue storage, through the same public Rust API, and checks
//! the same observable outcomes. The engine is chosen by the pool handle
//! (`Db::with_engine`); jobs are inserted and read through the engine under test.
//!
//! `AWA_ENGINE=canonical|queue_storage` restricts a run to one engine (both by default), so
//! `.ci/run` can run the legs separately once the whole suite runs on both.

mod common;
mod support;

use awa_core::storage::engine::Engine;
use awa_core::storage::queue_storage::QueueStorage;
use awa_core::{
    get_job, insert_jobs, Client, EnqueueRequest, JobArgs, JobError, JobResult, JobRow, JobState,
    NewJob, QueueConfig, RuntimeConfig,
};
use common::TestDb;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, fast_config, wait_idle};

const T: Duration = Duration::from_secs(30);

/// The engines this run covers.
fn engines() -> Vec<&'static str> {
    match std::env::var("AWA_ENGINE").as_deref() {
        Ok("canonical") => vec!["canonical"],
        Ok("queue_storage") => vec!["queue_storage"],
        _ => vec!["canonical", "queue_storage"],
    }
}

/// A migrated database and a pool handle on `engine` (queue storage installed in `awa`, the
/// schema awa-pg installs it in, next to canonical's tables).
async fn setup(engine: &str) -> (TestDb, awa_core::Db) {
    let db = TestDb::new().await;
    let pool = match engine {
        "canonical" => db.pool.clone(),
        _ => {
            let qs = QueueStorage::new("awa", 16, 8).expect("queue storage config");
            awa_core::storage::transition::install_queue_storage(&db.pool, &qs, false)
                .await
                .expect("install queue storage");
            db.pool.with_engine(Engine::QueueStorage(Arc::new(qs)))
        }
    };
    (db, pool)
}

async fn enqueue(pool: &awa_core::Db, jobs: &[NewJob]) -> Vec<i64> {
    match pool.engine() {
        Engine::Canonical => insert_jobs(pool, jobs)
            .await
            .expect("insert")
            .into_iter()
            .map(|j| j.id)
            .collect(),
        Engine::QueueStorage(qs) => qs.enqueue(pool, jobs).await.expect("enqueue"),
    }
}

fn job<A: JobArgs>(
    args: A,
    configure: impl FnOnce(EnqueueRequest<A>) -> EnqueueRequest<A>,
) -> NewJob {
    awa_core::storage::insert::prepare(&configure(EnqueueRequest::new(args))).expect("valid job")
}

/// Every job the engine holds, by id.
async fn all_jobs(pool: &awa_core::Db) -> HashMap<i64, JobRow> {
    let rows = match pool.engine() {
        Engine::Canonical => {
            let filter = awa_core::JobFilter {
                limit: Some(100_000),
                ..Default::default()
            };
            awa_core::list_jobs(pool, &filter).await.expect("list")
        }
        Engine::QueueStorage(qs) => qs.jobs(pool).await.expect("jobs"),
    };
    rows.into_iter().map(|j| (j.id, j)).collect()
}

async fn one_job(pool: &awa_core::Db, id: i64) -> JobRow {
    match pool.engine() {
        Engine::Canonical => get_job(pool, id).await.expect("get"),
        Engine::QueueStorage(_) => all_jobs(pool)
            .await
            .remove(&id)
            .unwrap_or_else(|| panic!("job {id} not found")),
    }
}

async fn wait_state(pool: &awa_core::Db, id: i64, state: JobState) -> JobRow {
    eventually(&format!("job {id} {state:?}"), T, || async {
        let j = one_job(pool, id).await;
        (j.state == state).then_some(j)
    })
    .await
}

/// Wait until every job of `kind` is in `state` and there are `n` of them.
async fn wait_all(pool: &awa_core::Db, kind: &str, n: usize, state: JobState) -> Vec<JobRow> {
    eventually(&format!("{n} {kind} jobs {state:?}"), T, || async {
        let jobs: Vec<JobRow> = all_jobs(pool)
            .await
            .into_values()
            .filter(|j| j.kind == kind)
            .collect();
        (jobs.len() == n && jobs.iter().all(|j| j.state == state)).then_some(jobs)
    })
    .await
}

/// Run `scenario` once per engine of this run.
macro_rules! both_engines {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn canonical() {
                    if super::engines().contains(&"canonical") {
                        super::$name("canonical").await;
                    }
                }
                #[tokio::test]
                async fn queue_storage() {
                    if super::engines().contains(&"queue_storage") {
                        super::$name("queue_storage").await;
                    }
                }
            }
        )*
    };
}

both_engines!(
    drains_every_job_exactly_once,
    staged_follow_ups_commit_with_the_completion_on_the_batched_path,
    staged_follow_ups_commit_with_the_completion_on_the_per_job_path,
    every_outcome_ends_where_it_should,
    a_rescued_attempt_runs_again_and_its_late_completion_is_stale,
    a_cancel_request_reaches_the_running_handler,
    shutdown_gives_back_the_jobs_claimed_ahead,
    operator_actions_change_jobs_as_on_canonical,
    failed_jobs_go_to_the_dlq_where_enabled,
    rescue_fires_the_exhausted_specs_of_the_jobs_it_fails,
    external_callbacks_resolve_parked_and_waiting_attempts,
    progress_survives_retries_and_stays_with_a_failed_job,
);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Work {
    n: i64,
}
impl JobArgs for Work {}

async fn drains_every_job_exactly_once(engine: &str) {
    let (_db, pool) = setup(engine).await;
    let runs: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let r = runs.clone();
    let client = Client::builder(pool.clone())
        .queue("default", QueueConfig::new(8))
        .config(RuntimeConfig {
            heartbeat_staleness: Duration::from_secs(60),
            ..fast_config()
        })
        .register::<Work, _, _>(move |_args, ctx| {
            let r = r.clone();
            let id = ctx.job().id;
            async move {
                *r.lock().expect("lock").entry(id).or_default() += 1;
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let jobs: Vec<NewJob> = (0..300)
        .map(|n| job(Work { n }, |r| r.priority((n % 4 + 1) as i16)))
        .collect();
    let ids = enqueue(&pool, &jobs).await;
    client.start().await.expect("start");
    let done = wait_all(&pool, "work", 300, JobState::Completed).await;
    client.shutdown(T).await;
    let runs = runs.lock().expect("lock");
    for id in &ids {
        assert_eq!(
            runs.get(id),
            Some(&1),
            "job {id} ran {:?} times",
            runs.get(id)
        );
    }
    assert!(done.iter().all(|j| j.attempt == 1 && j.errors.is_empty()));
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Parent {
    n: i64,
}
impl JobArgs for Parent {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Child {
    parent: i64,
    part: i64,
}
impl JobArgs for Child {}

/// Parents stage two children each, computed at run time; every child is inserted once, with
/// its parent's completion, and runs.
async fn staged_follow_ups(engine: &str, batch_follow_ups: bool) {
    let (_db, pool) = setup(engine).await;
    let client = Client::builder(pool.clone())
        .queue("default", QueueConfig::new(4))
        .config(RuntimeConfig {
            batch_follow_ups,
            heartbeat_staleness: Duration::from_secs(60),
            ..fast_config()
        })
        .register::<Parent, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            async move {
                for part in 0..2 {
                    follow_ups
                        .enqueue_on_completion(Child {
                            parent: args.n,
                            part: args.n * 10 + part,
                        })
                        .map_err(JobError::terminal)?;
                }
                Ok(JobResult::Completed)
            }
        })
        .register::<Child, _, _>(|_args, _ctx| async move { Ok(JobResult::Completed) })
        .build()
        .expect("build");
    let parents: Vec<NewJob> = (0..20).map(|n| job(Parent { n }, |r| r)).collect();
    enqueue(&pool, &parents).await;
    client.start().await.expect("start");
    wait_all(&pool, "parent", 20, JobState::Completed).await;
    let children = wait_all(&pool, "child", 40, JobState::Completed).await;
    client.shutdown(T).await;
    let mut seen: Vec<Child> = children
        .iter()
        .map(|j| serde_json::from_value(j.args.clone()).expect("child args"))
        .collect();
    seen.sort();
    let mut want: Vec<Child> = (0..20)
        .flat_map(|n| {
            (0..2).map(move |p| Child {
                parent: n,
                part: n * 10 + p,
            })
        })
        .collect();
    want.sort();
    assert_eq!(seen, want, "each child exactly once");
}

async fn staged_follow_ups_commit_with_the_completion_on_the_batched_path(engine: &str) {
    staged_follow_ups(engine, true).await;
}

async fn staged_follow_ups_commit_with_the_completion_on_the_per_job_path(engine: &str) {
    staged_follow_ups(engine, false).await;
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mode {
    mode: String,
}
impl JobArgs for Mode {}

fn mode(m: &str) -> Mode {
    Mode { mode: m.into() }
}

/// A retry after a delay, a snooze, a terminal error, a cancel and an exhausted retryable
/// error each end as on canonical: same state, attempt and error history.
async fn every_outcome_ends_where_it_should(engine: &str) {
    let (_db, pool) = setup(engine).await;
    let client = Client::builder(pool.clone())
        .queue("default", QueueConfig::new(4))
        .config(fast_config())
        .register::<Mode, _, _>(|args, ctx| {
            let attempt = ctx.job().attempt;
            // Due at its creation the first time; after the snooze, 50 ms later.
            let first_run = ctx.job().run_at <= ctx.job().created_at;
            async move {
                match (args.mode.as_str(), attempt) {
                    ("retry_after", 1) => Ok(JobResult::RetryAfter(Duration::from_millis(50))),
                    ("snooze", _) if first_run => Ok(JobResult::Snooze(Duration::from_millis(50))),
                    ("terminal", _) => Err(JobError::terminal("bad input")),
                    ("cancel", _) => Ok(JobResult::Cancel("not needed".into())),
                    ("exhaust", _) => Err(JobError::retryable("flaky")),
                    _ => Ok(JobResult::Completed),
                }
            }
        })
        .build()
        .expect("build");
    let jobs = vec![
        job(mode("retry_after"), |r| r),
        job(mode("snooze"), |r| r),
        job(mode("terminal"), |r| r),
        job(mode("cancel"), |r| r),
        job(mode("exhaust"), |r| r.max_attempts(1)),
    ];
    let ids = enqueue(&pool, &jobs).await;
    client.start().await.expect("start");
    let retried = wait_state(&pool, ids[0], JobState::Completed).await;
    assert_eq!(retried.attempt, 2, "a retry burns the attempt");
    assert!(retried.errors.is_empty(), "RetryAfter records no error");
    let snoozed = wait_state(&pool, ids[1], JobState::Completed).await;
    assert_eq!(snoozed.attempt, 1, "a snooze does not burn the attempt");
    let terminal = wait_state(&pool, ids[2], JobState::Failed).await;
    assert_eq!(terminal.errors.len(), 1);
    assert_eq!(terminal.errors[0].error, "bad input");
    let cancelled = wait_state(&pool, ids[3], JobState::Cancelled).await;
    assert!(
        cancelled
            .errors
            .last()
            .is_some_and(|e| e.error.contains("not needed")),
        "{:?}",
        cancelled.errors
    );
    let exhausted = wait_state(&pool, ids[4], JobState::Failed).await;
    assert_eq!(exhausted.attempt, 1);
    assert_eq!(exhausted.errors.len(), 1);
    assert_eq!(exhausted.errors[0].error, "flaky (attempts exhausted)");
    client.shutdown(T).await;
}

/// An attempt that outlives its deadline is rescued and runs again; the first attempt's
/// completion, if it arrives, finds no lease and writes nothing.
async fn a_rescued_attempt_runs_again_and_its_late_completion_is_stale(engine: &str) {
    let (_db, pool) = setup(engine).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let second_ran = Arc::new(tokio::sync::Notify::new());
    let (rel, second) = (release.clone(), second_ran.clone());
    let client = Client::builder(pool.clone())
        .queue(
            "default",
            QueueConfig::new(2).deadline(Duration::from_millis(300)),
        )
        .config(fast_config())
        .register::<Work, _, _>(move |_args, ctx| {
            let (rel, second) = (rel.clone(), second.clone());
            let attempt = ctx.job().attempt;
            async move {
                if attempt == 1 {
                    // Ignores its deadline until the second attempt has completed.
                    rel.notified().await;
                } else {
                    second.notify_one();
                }
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let ids = enqueue(&pool, &[job(Work { n: 1 }, |r| r)]).await;
    client.start().await.expect("start");
    second_ran.notified().await;
    let done = wait_state(&pool, ids[0], JobState::Completed).await;
    assert_eq!(done.attempt, 2);
    assert!(
        done.errors.iter().any(|e| e.error.contains("deadline")),
        "{:?}",
        done.errors
    );
    // The first attempt returns now; whatever the runtime does with its completion is
    // over once nothing is in flight.
    release.notify_one();
    wait_idle(&client, T).await;
    let after = one_job(&pool, ids[0]).await;
    assert_eq!(after.state, JobState::Completed);
    assert_eq!(after.attempt, 2, "the stale attempt wrote nothing");
    client.shutdown(T).await;
}

/// A cancel requested while the handler runs reaches it (through `awa:cancel` or the
/// heartbeat), and the job ends cancelled.
async fn a_cancel_request_reaches_the_running_handler(engine: &str) {
    let (db, pool) = setup(engine).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let s = started.clone();
    let client = Client::builder(pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(RuntimeConfig {
            heartbeat_staleness: Duration::from_secs(60),
            ..fast_config()
        })
        .register::<Work, _, _>(move |_args, ctx| {
            let s = s.clone();
            let signal = ctx.cancel_signal();
            async move {
                s.notify_one();
                signal.cancelled().await;
                Ok(JobResult::Cancel("asked to stop".into()))
            }
        })
        .build()
        .expect("build");
    let ids = enqueue(&pool, &[job(Work { n: 1 }, |r| r)]).await;
    client.start().await.expect("start");
    started.notified().await;
    match pool.engine() {
        Engine::Canonical => {
            awa_core::storage::admin::cancel(&db.pool, ids[0])
                .await
                .expect("cancel");
        }
        Engine::QueueStorage(qs) => {
            assert_eq!(
                qs.cancel(&pool, ids[0]).await.expect("cancel").as_deref(),
                Some("running")
            );
        }
    }
    let done = wait_state(&pool, ids[0], JobState::Cancelled).await;
    assert!(
        done.errors
            .iter()
            .any(|e| e.error.contains("asked to stop")),
        "{:?}",
        done.errors
    );
    client.shutdown(T).await;
}

/// Jobs claimed ahead that never started go back to the queue when the client stops (the
/// claim's attempt undone), and the next client runs each of them once.
async fn shutdown_gives_back_the_jobs_claimed_ahead(engine: &str) {
    let (_db, pool) = setup(engine).await;
    // Seams are per process and keyed by queue: one queue per engine.
    let queue = format!("ahead_{engine}");
    awa_core::seams::force_claim_ahead(&queue, Duration::from_secs(60));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runs: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let build = |gate: Arc<tokio::sync::Semaphore>| {
        let runs = runs.clone();
        Client::builder(pool.clone())
            .queue(queue.clone(), QueueConfig::new(2))
            .config(RuntimeConfig {
                heartbeat_staleness: Duration::from_secs(60),
                claim_batch: 2,
                ..fast_config()
            })
            .register::<Work, _, _>(move |_args, ctx| {
                let (gate, runs) = (gate.clone(), runs.clone());
                let id = ctx.job().id;
                async move {
                    *runs.lock().expect("lock").entry(id).or_default() += 1;
                    gate.acquire().await.map_err(JobError::terminal)?.forget();
                    Ok(JobResult::Completed)
                }
            })
            .build()
            .expect("build")
    };
    let client = build(gate.clone());
    let jobs: Vec<NewJob> = (0..6)
        .map(|n| job(Work { n }, |r| r.queue(queue.clone())))
        .collect();
    let ids = enqueue(&pool, &jobs).await;
    client.start().await.expect("start");
    // Two handlers hold both slots; two more jobs are claimed and wait for a slot.
    let buffered: Vec<i64> = eventually("two running and two claimed ahead", T, || async {
        let running: Vec<i64> = all_jobs(&pool)
            .await
            .into_values()
            .filter(|j| j.state == JobState::Running)
            .map(|j| j.id)
            .collect();
        let entered: Vec<i64> = runs.lock().expect("lock").keys().copied().collect();
        (entered.len() == 2 && running.len() == 4).then(|| {
            running
                .into_iter()
                .filter(|id| !entered.contains(id))
                .collect()
        })
    })
    .await;
    let stopping = {
        let client = client.clone();
        tokio::spawn(async move { client.shutdown(T).await })
    };
    // The buffer is given back as the dispatcher stops, while the handlers still run.
    for id in &buffered {
        let back = wait_state(&pool, *id, JobState::Available).await;
        assert_eq!(back.attempt, 0, "the claim's attempt is undone");
    }
    gate.add_permits(2);
    stopping.await.expect("shutdown");
    let next = build(Arc::new(tokio::sync::Semaphore::new(100)));
    next.start().await.expect("start again");
    wait_all(&pool, "work", 6, JobState::Completed).await;
    next.shutdown(T).await;
    let runs = runs.lock().expect("lock");
    for id in &ids {
        assert_eq!(
            runs.get(id),
            Some(&1),
            "job {id} ran {:?} times",
            runs.get(id)
        );
    }
}

/// The operator's actions (`storage::routing`: retry, retry_failed, discard_failed,
/// drain_queue, cancel) leave the same states, attempts and errors on both engines, refuse
/// what canonical refuses, and a job retried twice at once is retried once.
async fn operator_actions_change_jobs_as_on_canonical(engine: &str) {
    use awa_core::storage::routing;
    let (_db, pool) = setup(engine).await;
    let client = Client::builder(pool.clone())
        .queue("default", QueueConfig::new(2))
        .config(fast_config())
        .register::<Mode, _, _>(|args, ctx| {
            let attempt = ctx.job().attempt;
            async move {
                match (args.mode.as_str(), attempt) {
                    ("fail_once", 1) | ("fail", _) => Err(JobError::terminal("bad input")),
                    _ => Ok(JobResult::Completed),
                }
            }
        })
        .build()
        .expect("build");
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let jobs = vec![
        job(mode("fail_once"), |r| r.max_attempts(1)),
        job(mode("fail"), |r| r),
        job(mode("fail"), |r| r),
        job(mode("scheduled"), |r| r.run_at(later)),
        job(mode("idle"), |r| r.queue("idle")),
        job(mode("idle"), |r| r.queue("idle").run_at(later)),
    ];
    let ids = enqueue(&pool, &jobs).await;
    client.start().await.expect("start");
    for id in &ids[..3] {
        wait_state(&pool, *id, JobState::Failed).await;
    }

    // A failed job runs again, its attempt and errors kept, with one more attempt allowed.
    let again = routing::retry(&pool, ids[0]).await.expect("retry");
    assert_eq!(again.state, JobState::Available, "{again:?}");
    assert_eq!((again.attempt, again.max_attempts), (1, 2));
    assert_eq!(again.errors.len(), 1);
    let done = wait_state(&pool, ids[0], JobState::Completed).await;
    assert_eq!((done.attempt, done.errors.len()), (2, 1));
    let refused = routing::retry(&pool, ids[0])
        .await
        .expect_err("completed is final");
    assert!(
        refused
            .to_string()
            .contains("is completed; only failed, cancelled"),
        "{refused}"
    );
    assert!(matches!(
        routing::retry(&pool, i64::MAX).await,
        Err(awa_core::AwaError::JobNotFound(_))
    ));

    // Two retries of one failed job at once: one retries it, the other is refused (the queue
    // paused meanwhile, so no claim fails it again in between).
    awa_core::storage::admin::set_queue_paused(&pool, "default", true)
        .await
        .expect("pause");
    let (a, b) = tokio::join!(routing::retry(&pool, ids[1]), routing::retry(&pool, ids[1]));
    let refusals: Vec<String> = [&a, &b]
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(
        refusals.len() == 1 && refusals[0].contains("only failed, cancelled"),
        "{a:?} {b:?}"
    );
    awa_core::storage::admin::set_queue_paused(&pool, "default", false)
        .await
        .expect("resume");
    wait_state(&pool, ids[1], JobState::Failed).await;

    // A scheduled job is due at once; a job cancelled before it ran counts no attempt.
    let due = routing::retry(&pool, ids[3])
        .await
        .expect("retry scheduled");
    assert!(due.state == JobState::Available && due.run_at <= chrono::Utc::now());
    wait_state(&pool, ids[3], JobState::Completed).await;
    let cancelled = routing::cancel(&pool, ids[4]).await.expect("cancel");
    assert_eq!(
        (cancelled.state, cancelled.attempt),
        (JobState::Cancelled, 0)
    );
    let back = routing::retry(&pool, ids[4])
        .await
        .expect("retry cancelled");
    assert_eq!(
        (back.state, back.attempt, back.run_lease),
        (JobState::Available, 0, 0)
    );

    // Draining cancels what has not started; discarding deletes failed jobs of a kind.
    assert_eq!(routing::drain_queue(&pool, "idle").await.expect("drain"), 2);
    assert_eq!(one_job(&pool, ids[5]).await.state, JobState::Cancelled);
    let retried = routing::retry_failed(&pool, Some("mode"), None, false)
        .await
        .expect("retry_failed");
    let retried_ids: Vec<i64> = retried.jobs.iter().map(|j| j.id).collect();
    assert_eq!((retried.matched, retried_ids), (2, vec![ids[1], ids[2]]));
    wait_state(&pool, ids[1], JobState::Failed).await;
    wait_state(&pool, ids[2], JobState::Failed).await;
    assert_eq!(
        routing::discard_failed(&pool, "mode", Some("elsewhere"))
            .await
            .expect("discard"),
        0
    );
    assert_eq!(
        routing::discard_failed(&pool, "mode", None)
            .await
            .expect("discard"),
        2
    );
    assert!(matches!(
        routing::get_job(&pool, ids[1]).await,
        Err(awa_core::AwaError::JobNotFound(_))
    ));
    client.shutdown(T).await;
}

/// A queue with the DLQ on sends its failed jobs there, from the per-job finalizer and from
/// rescue (a job out of attempts past its deadline), each with its reason; a revived job
/// runs again on the engine new jobs go to.
async fn failed_jobs_go_to_the_dlq_where_enabled(engine: &str) {
    use awa_core::storage::dlq;
    let (_db, pool) = setup(engine).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let rel = release.clone();
    let client = Client::builder(pool.clone())
        .queue(
            "dead",
            QueueConfig::new(2)
                .dlq(true)
                .deadline(Duration::from_millis(300)),
        )
        .config(fast_config())
        .register::<Mode, _, _>(move |args, ctx| {
            let rel = rel.clone();
            let first = ctx.job().attempt == 1;
            // A revived job keeps its errors and starts at attempt 1 again.
            let revived = !ctx.job().errors.is_empty();
            async move {
                match args.mode.as_str() {
                    "terminal" if !revived => Err(JobError::terminal("bad input")),
                    // Outlives its deadline on the first attempt, until the test lets it go.
                    "hang" if first => {
                        rel.notified().await;
                        Ok(JobResult::Completed)
                    }
                    _ => Ok(JobResult::Completed),
                }
            }
        })
        .build()
        .expect("build");
    let jobs = vec![
        job(mode("terminal"), |r| r.queue("dead")),
        job(mode("hang"), |r| r.queue("dead").max_attempts(1)),
    ];
    let ids = enqueue(&pool, &jobs).await;
    client.start().await.expect("start");
    let entries = eventually("both jobs dead-lettered", T, || async {
        let a = dlq::get_dlq_job(&pool, ids[0]).await.expect("dlq read");
        let b = dlq::get_dlq_job(&pool, ids[1]).await.expect("dlq read");
        a.zip(b)
    })
    .await;
    assert_eq!(entries.0.reason, "bad input");
    assert_eq!(entries.0.attempt, 1);
    assert!(
        entries.1.reason.contains("deadline"),
        "{}",
        entries.1.reason
    );
    for id in &ids {
        assert!(matches!(
            awa_core::storage::routing::get_job(&pool, *id).await,
            Err(awa_core::AwaError::JobNotFound(_))
        ));
    }
    release.notify_one();
    let revived = dlq::retry_from_dlq(&pool, ids[0], &Default::default())
        .await
        .expect("revive")
        .expect("in the DLQ");
    assert_eq!((revived.state, revived.attempt), (JobState::Available, 0));
    let done = wait_state(&pool, ids[0], JobState::Completed).await;
    assert_eq!(done.attempt, 1);
    client.shutdown(T).await;
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Alert {
    failed: i64,
}
impl JobArgs for Alert {}

/// A job that rescue fails for good (out of attempts past its deadline) fires its registered
/// `on_exhausted` spec in the rescue's transaction (ADR-046's registered follow-ups), once.
async fn rescue_fires_the_exhausted_specs_of_the_jobs_it_fails(engine: &str) {
    let (_db, pool) = setup(engine).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let rel = release.clone();
    let client = Client::builder(pool.clone())
        .queue(
            "default",
            QueueConfig::new(2).deadline(Duration::from_millis(300)),
        )
        .config(fast_config())
        .register::<Work, _, _>(move |_args, _ctx| {
            let rel = rel.clone();
            async move {
                rel.notified().await;
                Ok(JobResult::Completed)
            }
        })
        .on_exhausted_enqueue::<Work, Alert, _>(|w| {
            EnqueueRequest::new(Alert { failed: w.n }).queue("alerts")
        })
        .build()
        .expect("build");
    let ids = enqueue(&pool, &[job(Work { n: 42 }, |r| r.max_attempts(1))]).await;
    client.start().await.expect("start");
    let failed = wait_state(&pool, ids[0], JobState::Failed).await;
    assert!(
        failed.errors.iter().any(|e| e.error.contains("deadline")),
        "{:?}",
        failed.errors
    );
    let alerts = wait_all(&pool, "alert", 1, JobState::Available).await;
    assert_eq!(alerts[0].args, serde_json::json!({"failed": 42}));
    assert_eq!(alerts[0].queue, "alerts");
    release.notify_waiters();
    wait_idle(&client, T).await;
    client.shutdown(T).await;
    assert_eq!(
        all_jobs(&pool)
            .await
            .values()
            .filter(|j| j.kind == "alert")
            .count(),
        1
    );
}

/// External callbacks on either engine: a parked job completed from outside (its Completed
/// spec fired), another failed (its Exhausted spec fired), one retried (it runs again), a
/// handler waiting in-process resumed with the payload, a heartbeat extending a timeout, and
/// an unknown callback refused.
async fn external_callbacks_resolve_parked_and_waiting_attempts(engine: &str) {
    use awa_core::storage::callbacks;
    let (_db, pool) = setup(engine).await;
    let tokens: Arc<Mutex<HashMap<i64, String>>> = Arc::default();
    let resumed: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let client = Client::builder(pool.clone())
        .queue("default", QueueConfig::new(4))
        .config(fast_config())
        .register_worker(Caller {
            tokens: tokens.clone(),
            resumed: resumed.clone(),
        })
        .on_completed_enqueue::<Mode, Alert, _>(|_| {
            EnqueueRequest::new(Alert { failed: 0 }).queue("alerts")
        })
        .on_exhausted_enqueue::<Mode, Alert, _>(|_| {
            EnqueueRequest::new(Alert { failed: 1 }).queue("alerts")
        })
        .build()
        .expect("build");
    let ids = enqueue(
        &pool,
        &[
            job(mode("park_complete"), |r| r),
            job(mode("park_fail"), |r| r),
            job(mode("park_retry"), |r| r),
            job(mode("wait_inline"), |r| r),
        ],
    )
    .await;
    client.start().await.expect("start");
    for id in &ids[..3] {
        wait_state(&pool, *id, JobState::WaitingExternal).await;
    }
    let token_of = |id: i64| tokens.lock().expect("lock").get(&id).cloned();
    let inline = eventually("the in-handler wait's token", T, || async {
        token_of(ids[3])
    })
    .await;
    let specs = client.specs().clone();

    let timeout_before = one_job(&pool, ids[0]).await.callback_timeout_at;
    let beat = callbacks::heartbeat_callback(
        &pool,
        &token_of(ids[0]).expect("token"),
        Duration::from_secs(3600),
    )
    .await
    .expect("heartbeat");
    assert!(beat.callback_timeout_at > timeout_before, "{beat:?}");
    let done = callbacks::complete_external(&pool, &specs, &token_of(ids[0]).expect("token"), None)
        .await
        .expect("complete");
    assert_eq!((done.id, done.state), (ids[0], JobState::Completed));
    let failed =
        callbacks::fail_external(&pool, &specs, &token_of(ids[1]).expect("token"), "declined")
            .await
            .expect("fail");
    assert_eq!(failed.state, JobState::Failed);
    assert_eq!(
        failed.errors.last().map(|e| e.error.as_str()),
        Some("declined")
    );
    let again = callbacks::retry_external(&pool, &token_of(ids[2]).expect("token"))
        .await
        .expect("retry");
    assert_eq!(again.id, ids[2]);
    wait_state(&pool, ids[2], JobState::Completed).await;
    let running = callbacks::resume_external(&pool, &inline, Some(serde_json::json!({"ok": true})))
        .await
        .expect("resume");
    assert_eq!(running.state, JobState::Running);
    wait_state(&pool, ids[3], JobState::Completed).await;
    assert_eq!(
        resumed.lock().expect("lock").clone(),
        vec![serde_json::json!({"ok": true})]
    );
    assert!(matches!(
        callbacks::complete_external(&pool, &specs, &inline, None).await,
        Err(awa_core::AwaError::CallbackNotFound(_))
    ));
    // Completed specs: the parked job's, the retried job's and the resumed one's; Exhausted:
    // the failed job's.
    let mut alerts: Vec<i64> = wait_all(&pool, "alert", 4, JobState::Available)
        .await
        .into_iter()
        .map(|j| j.args["failed"].as_i64().unwrap_or(-1))
        .collect();
    alerts.sort_unstable();
    assert_eq!(alerts, vec![0, 0, 0, 1]);
    client.shutdown(T).await;
}

/// The handler of the callback scenario: registers a callback, reports its token, then parks
/// (`WaitForCallback`) or, for `wait_inline`, waits in-process; a retried job completes.
struct Caller {
    tokens: Arc<Mutex<HashMap<i64, String>>>,
    resumed: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl awa_core::Worker for Caller {
    fn kind(&self) -> String {
        Mode::kind()
    }

    fn perform<'a>(
        &'a self,
        ctx: &'a awa_core::JobContext,
    ) -> futures_util::future::BoxFuture<'a, awa_core::HandlerResult> {
        Box::pin(async move {
            if ctx.job().attempt > 1 {
                return Ok(JobResult::Completed);
            }
            let token = ctx
                .register_callback(Duration::from_secs(600))
                .await
                .map_err(JobError::retryable)?;
            self.tokens
                .lock()
                .expect("lock")
                .insert(ctx.job().id, token.0.clone());
            let inline = ctx.job().args["mode"] == "wait_inline";
            if !inline {
                return Ok(JobResult::WaitForCallback(token));
            }
            let payload = ctx
                .wait_for_callback(token)
                .await
                .map_err(JobError::terminal)?;
            self.resumed.lock().expect("lock").push(payload);
            Ok(JobResult::Completed)
        })
    }
}

/// Progress a handler records is kept across a retry (the next attempt starts from it), kept
/// with a job that fails, and cleared by completion, as canonical keeps it.
async fn progress_survives_retries_and_stays_with_a_failed_job(engine: &str) {
    let (_db, pool) = setup(engine).await;
    let seen: Arc<Mutex<Vec<Option<serde_json::Value>>>> = Arc::default();
    let s = seen.clone();
    let client = Client::builder(pool.clone())
        .queue("default", QueueConfig::new(2))
        .config(fast_config())
        .register::<Mode, _, _>(move |args, ctx| {
            let attempt = ctx.job().attempt;
            s.lock().expect("lock").push(ctx.progress());
            let set = ctx.set_progress(f64::from(attempt) * 10.0, Some(&args.mode));
            async move {
                set.map_err(JobError::terminal)?;
                match (args.mode.as_str(), attempt) {
                    ("retry_once", 1) => Err(JobError::retryable("again")),
                    ("fail", _) => Err(JobError::terminal("no")),
                    _ => Ok(JobResult::Completed),
                }
            }
        })
        .build()
        .expect("build");
    let ids = enqueue(
        &pool,
        &[job(mode("retry_once"), |r| r), job(mode("fail"), |r| r)],
    )
    .await;
    client.start().await.expect("start");
    let done = wait_state(&pool, ids[0], JobState::Completed).await;
    assert_eq!(done.progress, None, "completion clears the progress");
    let failed = wait_state(&pool, ids[1], JobState::Failed).await;
    let kept = failed.progress.expect("a failed job keeps its progress");
    assert_eq!(kept["percent"], serde_json::json!(10));
    client.shutdown(T).await;
    let seen = seen.lock().expect("lock").clone();
    let second = seen
        .iter()
        .flatten()
        .find(|p| p["message"] == "retry_once")
        .expect("the retry saw the first attempt's progress");
    assert_eq!(second["percent"], serde_json::json!(10));
}
