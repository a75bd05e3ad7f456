//! The worker runtime: outcomes, batched and per-job finalization, stale leases, finalize
//! retries, rescue, shutdown, leader failover, cancellation, DLQ.

mod common;
mod support;

use awa_core::executor::context::JobContext;
use awa_core::finalizer::{finalize_with_retry, Finalization, Finalized, Transition};
use awa_core::follow_ups::SealedFollowUps;
use awa_core::maintenance::rescue::{rescue_stale, RescueKind};
use awa_core::seams::{self, Point};
use awa_core::specs::Specs;
use awa_core::storage::{admin, claim::claim_batch, dlq};
use awa_core::{
    get_job, insert, insert_many, Client, EnqueueRequest, JobArgs, JobError, JobResult, JobState,
    QueueConfig, RuntimeConfig,
};
use common::TestDb;
use serde::{Deserialize, Serialize};
use sqlx::Connection;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, fast_config, wait_for_completed, wait_for_state};

const T: Duration = Duration::from_secs(15);
use tokio::sync::Notify;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Task {
    n: i64,
    mode: String,
}
impl JobArgs for Task {}

fn outcome_client(db: &TestDb, queue: QueueConfig) -> Client {
    Client::builder(db.pool.clone())
        .queue("default", queue)
        .config(fast_config())
        .register::<Task, _, _>(|args, _ctx| async move {
            match args.mode.as_str() {
                "ok" => Ok(JobResult::Completed),
                "retry_after" => Ok(JobResult::RetryAfter(Duration::from_secs(3600))),
                "snooze" => Ok(JobResult::Snooze(Duration::from_secs(3600))),
                "cancel" => Ok(JobResult::Cancel("not needed".into())),
                "retryable" => Err(JobError::Retryable("flaky".into())),
                "terminal" => Err(JobError::Terminal("bad input".into())),
                "panic" => panic!("handler exploded"),
                _ => Ok(JobResult::Completed),
            }
        })
        .build()
        .expect("build")
}

#[tokio::test]
async fn every_outcome_from_a_rust_handler() {
    let db = TestDb::new().await;
    let client = outcome_client(&db, QueueConfig::new(4));
    let mut ids = HashMap::new();
    for mode in [
        "ok",
        "retry_after",
        "snooze",
        "cancel",
        "retryable",
        "terminal",
        "panic",
    ] {
        let job = insert(
            &db.pool,
            Task {
                n: 0,
                mode: mode.into(),
            },
        )
        .await
        .expect("insert");
        ids.insert(mode, job.id);
    }
    client.start().await.expect("start");
    let t = Duration::from_secs(10);
    let done = wait_for_state(&db, ids["ok"], &[JobState::Completed], t).await;
    assert!(done.finalized_at.is_some());
    let r = wait_for_state(&db, ids["retry_after"], &[JobState::Retryable], t).await;
    assert_eq!(r.attempt, 1);
    assert!(r.run_at > chrono::Utc::now() + chrono::Duration::minutes(50));
    assert!(
        r.errors.is_empty(),
        "a requested retry is not an error: {:?}",
        r.errors
    );
    let s = wait_for_state(&db, ids["snooze"], &[JobState::Scheduled], t).await;
    assert_eq!(s.attempt, 0, "snooze does not burn an attempt");
    let c = wait_for_state(&db, ids["cancel"], &[JobState::Cancelled], t).await;
    assert!(c.errors[0].error.contains("not needed"));
    let re = wait_for_state(&db, ids["retryable"], &[JobState::Retryable], t).await;
    assert_eq!(re.errors[0].error, "flaky");
    assert!(!re.errors[0].terminal, "a retryable error is not terminal");
    // Relative to the failure, not to now: by the time the test reads the row the backoff
    // (2 s after attempt 1) may have run out on a loaded machine.
    assert!(
        re.run_at >= re.errors[0].at + chrono::Duration::seconds(1),
        "backoff schedules the retry after the failure: {:?} vs {:?}",
        re.run_at,
        re.errors[0].at
    );
    let te = wait_for_state(&db, ids["terminal"], &[JobState::Failed], t).await;
    assert_eq!(te.errors[0].error, "bad input");
    assert!(te.errors[0].terminal, "a terminal error's entry says so");
    let p = wait_for_state(&db, ids["panic"], &[JobState::Retryable], t).await;
    assert!(
        p.errors[0].error.contains("handler exploded"),
        "{:?}",
        p.errors
    );
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn exhausted_attempts_fail_or_move_to_the_dlq() {
    let db = TestDb::new().await;
    let client = outcome_client(&db, QueueConfig::new(2).dlq(true));
    let job = awa_core::insert_with(
        &db.pool,
        EnqueueRequest::new(Task {
            n: 1,
            mode: "retryable".into(),
        })
        .max_attempts(1),
    )
    .await
    .expect("insert");
    let terminal = insert(
        &db.pool,
        Task {
            n: 2,
            mode: "terminal".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    let start = std::time::Instant::now();
    while dlq::dlq_depth(&db.pool, None).await.expect("depth") < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "jobs never reached the DLQ"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.shutdown(Duration::from_secs(5)).await;
    let dead = dlq::get_dlq_job(&db.pool, job.id)
        .await
        .expect("read the dlq")
        .expect("in dlq");
    assert!(
        dead.reason.contains("attempts exhausted"),
        "{}",
        dead.reason
    );
    assert_eq!(dead.original_run_lease, 1);
    assert!(
        get_job(&db.pool, terminal.id).await.is_err(),
        "moved out of awa.jobs"
    );
    let back = dlq::retry_from_dlq(&db.pool, job.id, &dlq::RetryOverrides::default())
        .await
        .expect("retry from dlq")
        .expect("was in the dlq");
    assert_eq!((back.state, back.attempt), (JobState::Available, 0));
    assert_eq!(
        dlq::purge_dlq(&db.pool, &dlq::DlqFilter::default(), true)
            .await
            .expect("purge"),
        1
    );
}

#[tokio::test]
async fn plain_completions_take_the_batched_path() {
    let db = TestDb::new().await;
    let client = outcome_client(&db, QueueConfig::new(16));
    let jobs: Vec<_> = (0..300)
        .map(|n| {
            EnqueueRequest::new(Task {
                n,
                mode: "ok".into(),
            })
        })
        .collect();
    insert_many(&db.pool, jobs).await.expect("insert");
    let before = awa_core::metrics::JOBS_COMPLETED_BATCHED.load(Ordering::Relaxed);
    client.start().await.expect("start");
    wait_for_completed(&db, 300, Duration::from_secs(20)).await;
    client.shutdown(Duration::from_secs(5)).await;
    let after = awa_core::metrics::JOBS_COMPLETED_BATCHED.load(Ordering::Relaxed);
    assert!(
        after - before >= 300,
        "completions went through the batched path"
    );
}

#[tokio::test]
async fn two_clients_complete_every_job_exactly_once() {
    let db = TestDb::new().await;
    let runs: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let make = |runs: Arc<Mutex<HashMap<i64, usize>>>| {
        Client::builder(db.pool.clone())
            .queue("default", QueueConfig::new(8))
            // Rescue is not under test: a loaded machine must not make a heartbeat look stale.
            .config(RuntimeConfig {
                heartbeat_staleness: Duration::from_secs(60),
                ..fast_config()
            })
            .register::<Task, _, _>(move |_args, ctx| {
                let runs = runs.clone();
                let id = ctx.job().id;
                async move {
                    *runs.lock().expect("lock").entry(id).or_default() += 1;
                    Ok(JobResult::Completed)
                }
            })
            .build()
            .expect("build")
    };
    let (a, b) = (make(runs.clone()), make(runs.clone()));
    let jobs: Vec<_> = (0..2000)
        .map(|n| {
            EnqueueRequest::new(Task {
                n,
                mode: "ok".into(),
            })
        })
        .collect();
    insert_many(&db.pool, jobs).await.expect("insert");
    a.start().await.expect("start a");
    b.start().await.expect("start b");
    wait_for_completed(&db, 2000, Duration::from_secs(60)).await;
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
    {
        let runs = runs.lock().expect("lock");
        assert_eq!(runs.len(), 2000);
        assert!(runs.values().all(|n| *n == 1), "a job ran twice");
    }
    let leases: Vec<i64> = sqlx::query_scalar("SELECT DISTINCT run_lease FROM awa.jobs")
        .fetch_all(&db.pool)
        .await
        .expect("leases");
    assert_eq!(leases, vec![1], "every job was claimed exactly once");
}

#[tokio::test]
async fn a_stale_completion_is_rejected() {
    let db = TestDb::new().await;
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let (g, e) = (gate.clone(), entered.clone());
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(RuntimeConfig {
            maintenance: false,
            ..fast_config()
        })
        .register::<Task, _, _>(move |_args, _ctx| {
            let (g, e) = (g.clone(), e.clone());
            async move {
                e.notify_one();
                g.notified().await;
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Task {
            n: 1,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    entered.notified().await;
    // Rescue the paused attempt as if its worker had died, and let a new attempt claim it.
    sqlx::query("UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(job.id)
        .execute(&db.pool)
        .await
        .expect("age heartbeat");
    let rescued = rescue_stale(
        &db.pool,
        RescueKind::StaleHeartbeat,
        Duration::from_secs(60),
    )
    .await
    .expect("rescue");
    assert_eq!(rescued, vec![job.id]);
    sqlx::query("UPDATE awa.jobs SET state = 'available' WHERE id = $1")
        .bind(job.id)
        .execute(&db.pool)
        .await
        .expect("promote");
    let mut reclaimed = claim_batch(&db.pool, "default", 1, Duration::from_secs(60))
        .await
        .expect("claim");
    let second = reclaimed.pop().expect("reclaimed");
    assert_eq!(second.run_lease, 2);
    // The first attempt now returns Completed: its lease is stale, nothing changes.
    gate.notify_one();
    client.shutdown(Duration::from_secs(5)).await;
    let now = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!(
        (now.state, now.run_lease, now.attempt),
        (JobState::Running, 2, 2),
        "the new attempt is untouched"
    );
}

async fn claimed_job(db: &TestDb, mode: &str) -> Arc<awa_core::JobRow> {
    insert(
        &db.pool,
        Task {
            n: 0,
            mode: mode.into(),
        },
    )
    .await
    .expect("insert");
    let mut jobs = claim_batch(&db.pool, "default", 1, Duration::from_secs(60))
        .await
        .expect("claim");
    Arc::new(jobs.pop().expect("claimed"))
}

#[tokio::test]
async fn finalize_retry_after_a_dropped_connection_completes_once() {
    let db = TestDb::new().await;
    let job = claimed_job(&db, "ok").await;
    seams::arm(Point::BeforeCommit, Some(job.id), 1);
    let fin = Finalization {
        job: job.clone(),
        transition: Transition::Completed,
        follow_ups: SealedFollowUps::default(),
        progress: None,
        dlq: false,
    };
    let done = finalize_with_retry(&db.pool, &fin, &Specs::default())
        .await
        .expect("finalize");
    assert_eq!(done, Finalized::Applied);
    assert_eq!(
        seams::hits(Point::BeforeCommit, job.id),
        1,
        "the first try failed before commit"
    );
    assert_eq!(
        get_job(&db.pool, job.id).await.expect("get").state,
        JobState::Completed
    );
}

#[tokio::test]
async fn a_lost_acknowledgement_replays_as_stale() {
    let db = TestDb::new().await;
    let job = claimed_job(&db, "ok").await;
    seams::arm(Point::AfterCommit, Some(job.id), 1);
    let fin = Finalization {
        job: job.clone(),
        transition: Transition::Retryable {
            error: Some(awa_core::model::JobErrorEntry {
                attempt: 1,
                at: chrono::Utc::now(),
                error: "x".into(),
                traceback: None,
                terminal: false,
            }),
            run_at: chrono::Utc::now(),
        },
        follow_ups: SealedFollowUps::default(),
        progress: None,
        dlq: false,
    };
    let done = finalize_with_retry(&db.pool, &fin, &Specs::default())
        .await
        .expect("finalize");
    assert_eq!(
        done,
        Finalized::Stale,
        "the replay found the committed state"
    );
    let row = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!(row.state, JobState::Retryable);
    assert_eq!(row.errors.len(), 1, "the change was applied exactly once");
}

#[tokio::test]
async fn shutdown_with_jobs_in_flight_loses_nothing() {
    let db = TestDb::new().await;
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let make = |slow: bool, s: Arc<AtomicUsize>| {
        Client::builder(db.pool.clone())
            .queue("default", QueueConfig::new(4))
            .config(fast_config())
            .register::<Task, _, _>(move |_args, ctx| {
                let s = s.clone();
                let _ = ctx;
                async move {
                    s.fetch_add(1, Ordering::SeqCst);
                    if slow {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                    Ok(JobResult::Completed)
                }
            })
            .build()
            .expect("build")
    };
    let jobs: Vec<_> = (0..8)
        .map(|n| {
            EnqueueRequest::new(Task {
                n,
                mode: "ok".into(),
            })
        })
        .collect();
    insert_many(&db.pool, jobs).await.expect("insert");
    let slow = make(true, s.clone());
    slow.start().await.expect("start");
    while started.load(Ordering::SeqCst) < 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Shutdown times out: the four running handlers are abandoned, their jobs stay running.
    slow.shutdown(Duration::from_millis(200)).await;
    let running: i64 = sqlx::query_scalar("SELECT count(*) FROM awa.jobs WHERE state = 'running'")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(running, 4);
    // A healthy client rescues them (stale heartbeats) and finishes everything.
    let fast = make(false, s.clone());
    fast.start().await.expect("start");
    wait_for_completed(&db, 8, Duration::from_secs(20)).await;
    fast.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn graceful_shutdown_lets_handlers_finish() {
    let db = TestDb::new().await;
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(4))
        .config(fast_config())
        .register::<Task, _, _>(|_args, _ctx| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(JobResult::Completed)
        })
        .build()
        .expect("build");
    let jobs: Vec<_> = (0..4)
        .map(|n| {
            EnqueueRequest::new(Task {
                n,
                mode: "ok".into(),
            })
        })
        .collect();
    let rows = insert_many(&db.pool, jobs).await.expect("insert");
    client.start().await.expect("start");
    // Every job must have started: a job still available when shutdown begins
    // is rightly left for the next worker, which is not what this test is about. Running is
    // transient (300 ms): a job already completed has started too.
    for r in &rows {
        wait_for_state(
            &db,
            r.id,
            &[JobState::Running, JobState::Completed],
            Duration::from_secs(5),
        )
        .await;
    }
    client.shutdown(Duration::from_secs(5)).await;
    for r in rows {
        assert_eq!(
            get_job(&db.pool, r.id).await.expect("get").state,
            JobState::Completed
        );
    }
}

#[tokio::test]
async fn leader_failover_keeps_rescue_running() {
    let db = TestDb::new().await;
    let idle = |db: &TestDb| {
        Client::builder(db.pool.clone())
            .queue("idle", QueueConfig::new(1))
            .config(fast_config())
            .register::<Task, _, _>(|_a, _c| async move { Ok(JobResult::Completed) })
            .build()
            .expect("build")
    };
    let a = idle(&db);
    a.start().await.expect("start a");
    let start = std::time::Instant::now();
    while !a.is_leader().await {
        assert!(start.elapsed() < Duration::from_secs(5), "a never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = idle(&db);
    b.start().await.expect("start b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_leader().await, "only one leader");
    a.shutdown(Duration::from_secs(2)).await;
    // A job stuck running (its worker died) must still be rescued, now by b.
    let job = insert(
        &db.pool,
        Task {
            n: 1,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    sqlx::query("UPDATE awa.jobs SET state = 'running', attempt = 1, run_lease = 1, heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(job.id).execute(&db.pool).await.expect("stuck");
    let rescued = wait_for_state(
        &db,
        job.id,
        &[JobState::Retryable, JobState::Available],
        Duration::from_secs(10),
    )
    .await;
    assert!(rescued.errors[0].error.contains("heartbeat"));
    assert!(b.is_leader().await, "b took over");
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn cancel_signals_a_running_handler_and_cancels_waiting_jobs() {
    let db = TestDb::new().await;
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(fast_config())
        .register::<Task, _, _>(|_args, ctx: &JobContext| {
            let signal = ctx.cancel_signal();
            async move {
                signal.cancelled().await;
                Ok(JobResult::Cancel("stopped on request".into()))
            }
        })
        .build()
        .expect("build");
    let running = insert(
        &db.pool,
        Task {
            n: 1,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    wait_for_state(
        &db,
        running.id,
        &[JobState::Running],
        Duration::from_secs(5),
    )
    .await;
    let waiting = awa_core::insert_with(
        &db.pool,
        EnqueueRequest::new(Task {
            n: 2,
            mode: "ok".into(),
        })
        .queue("elsewhere"),
    )
    .await
    .expect("insert");
    assert_eq!(
        admin::cancel(&db.pool, waiting.id)
            .await
            .expect("cancel")
            .state,
        JobState::Cancelled
    );
    admin::cancel(&db.pool, running.id)
        .await
        .expect("cancel running");
    let done = wait_for_state(
        &db,
        running.id,
        &[JobState::Cancelled],
        Duration::from_secs(5),
    )
    .await;
    assert!(done.errors[0].error.contains("stopped on request"));
    client.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn unknown_kinds_fail_terminally_and_retry_refuses_completed_jobs() {
    let db = TestDb::new().await;
    let client = outcome_client(&db, QueueConfig::new(1));
    let stranger = awa_core::insert_untyped(
        &db.pool,
        "nobody_handles_me",
        serde_json::json!({}),
        &Default::default(),
    )
    .await
    .expect("insert");
    let ok = insert(
        &db.pool,
        Task {
            n: 1,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    let failed = wait_for_state(
        &db,
        stranger.id,
        &[JobState::Failed],
        Duration::from_secs(5),
    )
    .await;
    assert!(failed.errors[0].error.contains("no handler registered"));
    wait_for_state(&db, ok.id, &[JobState::Completed], Duration::from_secs(5)).await;
    client.shutdown(Duration::from_secs(2)).await;
    assert!(
        admin::retry(&db.pool, ok.id).await.is_err(),
        "completed jobs are never reopened"
    );
    let again = admin::retry(&db.pool, stranger.id)
        .await
        .expect("retry failed job");
    assert_eq!(again.state, JobState::Available);
}

#[tokio::test]
async fn scheduled_jobs_are_promoted_and_paused_queues_wait() {
    let db = TestDb::new().await;
    let client = outcome_client(&db, QueueConfig::new(2));
    admin::set_queue_paused(&db.pool, "default", true)
        .await
        .expect("pause");
    let soon = awa_core::insert_with(
        &db.pool,
        EnqueueRequest::new(Task {
            n: 1,
            mode: "ok".into(),
        })
        .run_at(chrono::Utc::now() + chrono::Duration::milliseconds(300)),
    )
    .await
    .expect("insert");
    assert_eq!(soon.state, JobState::Scheduled);
    client.start().await.expect("start");
    wait_for_state(&db, soon.id, &[JobState::Available], Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        get_job(&db.pool, soon.id).await.expect("get").state,
        JobState::Available,
        "paused"
    );
    admin::set_queue_paused(&db.pool, "default", false)
        .await
        .expect("resume");
    wait_for_state(&db, soon.id, &[JobState::Completed], Duration::from_secs(5)).await;
    client.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_handler_past_its_deadline_is_abandoned_and_rescued() {
    let db = TestDb::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let client = Client::builder(db.pool.clone())
        .queue(
            "default",
            QueueConfig::new(1).deadline(Duration::from_millis(300)),
        )
        .config(fast_config())
        .register::<Task, _, _>(move |_args, _ctx| {
            let r = r.clone();
            async move {
                if r.fetch_add(1, Ordering::SeqCst) == 0 {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Task {
            n: 1,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    let before = awa_core::metrics::JOBS_ABANDONED.load(Ordering::Relaxed);
    client.start().await.expect("start");
    // The first attempt overruns its deadline: abandoned locally, rescued, and run again.
    let done = wait_for_state(&db, job.id, &[JobState::Completed], Duration::from_secs(15)).await;
    client.shutdown(Duration::from_secs(2)).await;
    assert_eq!(done.attempt, 2);
    assert!(
        done.errors.iter().any(|e| e.error.contains("deadline")),
        "{:?}",
        done.errors
    );
    assert!(awa_core::metrics::JOBS_ABANDONED.load(Ordering::Relaxed) > before);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Alert {
    failed: i64,
}
impl JobArgs for Alert {}

#[tokio::test]
async fn rescue_that_exhausts_a_job_fires_its_exhausted_specs() {
    let db = TestDb::new().await;
    let client = Client::builder(db.pool.clone())
        .queue("idle", QueueConfig::new(1))
        .config(fast_config())
        .register::<Task, _, _>(|_a, _c| async move { Ok(JobResult::Completed) })
        .on_exhausted_enqueue::<Task, Alert, _>(|t| {
            EnqueueRequest::new(Alert { failed: t.n }).queue("alerts")
        })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Task {
            n: 42,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    // Its worker died on the last attempt.
    sqlx::query("UPDATE awa.jobs SET state = 'running', attempt = max_attempts, run_lease = 1, heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(job.id).execute(&db.pool).await.expect("stuck");
    client.start().await.expect("start");
    wait_for_state(&db, job.id, &[JobState::Failed], Duration::from_secs(10)).await;
    client.shutdown(Duration::from_secs(2)).await;
    let alerts: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT args FROM awa.jobs WHERE kind = 'alert'")
            .fetch_all(&db.pool)
            .await
            .expect("alerts");
    assert_eq!(
        alerts,
        vec![serde_json::json!({"failed": 42})],
        "inserted in the rescue transaction"
    );
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Slow {
    n: i64,
}
impl JobArgs for Slow {}

/// The application name of the client pool in the finalize-deadline test, so the test can
/// tell the client's backends from its own.
const GATED_CLIENT: &str = "awa_deadline_test_client";
/// The advisory lock the follow-up insert waits on in that test.
const INSERT_GATE: i64 = 4_604_604;

#[tokio::test]
async fn a_finalization_past_its_deadline_is_given_up_and_commits_all_or_nothing() {
    finalization_past_its_deadline(false).await;
}

/// The same on the batched path: the batch passes the deadline, its job is handed to the
/// per-job path, which passes it too (waiting on the batch's row lock, then at the gate).
#[tokio::test]
async fn a_batch_past_its_deadline_is_given_up_and_commits_all_or_nothing() {
    finalization_past_its_deadline(true).await;
}

async fn finalization_past_its_deadline(batch_follow_ups: bool) {
    let db = TestDb::new().await;
    // Inserting the follow-up waits inside the completion transaction until the test opens
    // the gate (an advisory lock the test holds), so the runtime's deadline passes for sure
    // and the test decides when the abandoned statement may go on.
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION gated_insert() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.kind = 'slow' THEN PERFORM pg_advisory_xact_lock_shared({INSERT_GATE}); END IF;
         RETURN NEW; END $$;
         CREATE TRIGGER gated_insert BEFORE INSERT ON awa.canonical_jobs FOR EACH ROW EXECUTE FUNCTION gated_insert();"
    ))
    .execute(&db.pool)
    .await
    .expect("trigger");
    let mut gate = sqlx::PgConnection::connect(&db.url)
        .await
        .expect("gate connection");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(INSERT_GATE)
        .execute(&mut gate)
        .await
        .expect("close the gate");
    let client_pool = awa_core::pool_options()
        .max_connections(5)
        .connect_with(
            db.url
                .parse::<sqlx::postgres::PgConnectOptions>()
                .expect("url")
                .application_name(GATED_CLIENT),
        )
        .await
        .expect("client pool");
    let client = Client::builder(client_pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(RuntimeConfig {
            maintenance: false,
            // Long enough that the completion statement surely reaches the gate before it.
            finalize_deadline: Duration::from_secs(3),
            batch_follow_ups,
            ..fast_config()
        })
        .register::<Task, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            async move {
                follow_ups.enqueue_on_completion(Slow { n: args.n })?;
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Task {
            n: 7,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    eventually("the follow-up insert to wait at the gate", T, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
             WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted",
        )
        .fetch_one(&db.pool)
        .await
        .expect("locks");
        (waiting == 1).then_some(())
    })
    .await;
    // The runtime gives up: it stops tracking the attempt while the insert is still held at
    // the gate (the client's own count, not the process-wide metric other tests bump too).
    eventually("the runtime to give up on the finalization", T, || async {
        (client.in_flight().await == 0).then_some(())
    })
    .await;
    let row = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!(
        row.state,
        JobState::Running,
        "nothing committed while the insert waits at the gate"
    );
    client.shutdown(Duration::from_secs(2)).await;
    // Open the gate and wait until every backend of the client has finished what it was
    // sent: idle (its transaction ended, committed or rolled back) or gone.
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(INSERT_GATE)
        .execute(&mut gate)
        .await
        .expect("open the gate");
    eventually("the abandoned statement to end", T, || async {
        let busy: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1 AND state <> 'idle'",
        )
        .bind(GATED_CLIENT)
        .fetch_one(&db.pool)
        .await
        .expect("activity");
        (busy == 0).then_some(())
    })
    .await;
    // Committed or not, the completion and its follow-up went together (ADR-046, the last row
    // of the commit table): read both in one statement, so one snapshot sees both or neither.
    let (state, slow): (String, i64) = sqlx::query_as(
        "SELECT (SELECT state::text FROM awa.jobs WHERE id = $1),
                (SELECT count(*) FROM awa.jobs WHERE kind = 'slow')",
    )
    .bind(job.id)
    .fetch_one(&db.pool)
    .await
    .expect("state and follow-ups");
    assert!(
        matches!((state.as_str(), slow), ("completed", 1) | ("running", 0)),
        "completion and follow-up commit together: {state} with {slow} follow-ups"
    );
    client_pool.close().await;
}

#[tokio::test]
async fn rescue_cancels_a_job_whose_cancel_was_requested_while_it_ran() {
    let db = TestDb::new().await;
    let job = insert(
        &db.pool,
        Task {
            n: 1,
            mode: "ok".into(),
        },
    )
    .await
    .expect("insert");
    let claimed = claim_batch(&db.pool, "default", 1, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    // Its worker is gone: the cancel is only recorded, nobody acts on it.
    let seen = admin::cancel(&db.pool, job.id).await.expect("cancel");
    assert_eq!(seen.state, JobState::Running);
    sqlx::query("UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(job.id)
        .execute(&db.pool)
        .await
        .expect("age heartbeat");
    let rescued = rescue_stale(
        &db.pool,
        RescueKind::StaleHeartbeat,
        Duration::from_secs(60),
    )
    .await
    .expect("rescue");
    assert_eq!(rescued, vec![job.id]);
    let row = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!(row.state, JobState::Cancelled, "not run again");
    assert!(row.finalized_at.is_some());
}

#[tokio::test]
async fn promotion_skips_a_job_whose_key_another_row_holds_and_promotes_the_rest() {
    let db = TestDb::new().await;
    // Held only while available or running, so a scheduled job does not hold its key.
    let key = awa_core::UniqueOpts {
        states: 0b0110,
        ..Default::default()
    };
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let waiting = awa_core::insert_with(
        &db.pool,
        EnqueueRequest::new(Task {
            n: 1,
            mode: "ok".into(),
        })
        .run_at(later)
        .unique(key.clone()),
    )
    .await
    .expect("insert");
    let holder = awa_core::insert_with(
        &db.pool,
        EnqueueRequest::new(Task {
            n: 1,
            mode: "ok".into(),
        })
        .unique(key),
    )
    .await
    .expect("the scheduled twin does not hold the key");
    let plain = insert_many(
        &db.pool,
        vec![EnqueueRequest::new(Task {
            n: 2,
            mode: "ok".into(),
        })
        .run_at(later)],
    )
    .await
    .expect("insert")
    .remove(0);
    sqlx::query("UPDATE awa.jobs SET run_at = now() - interval '1 second' WHERE id = ANY($1)")
        .bind(vec![waiting.id, plain.id])
        .execute(&db.pool)
        .await
        .expect("make due");
    let promoted = awa_core::maintenance::rescue::promote_due(&db.pool)
        .await
        .expect("promotion does not fail");
    assert_eq!(promoted, 1);
    assert_eq!(
        get_job(&db.pool, plain.id).await.expect("get").state,
        JobState::Available
    );
    assert_eq!(
        get_job(&db.pool, waiting.id).await.expect("get").state,
        JobState::Scheduled,
        "its key is held"
    );
    // The holder leaves the key's states: the waiting job is promoted on the next pass.
    admin::cancel(&db.pool, holder.id).await.expect("cancel");
    assert_eq!(
        awa_core::maintenance::rescue::promote_due(&db.pool)
            .await
            .expect("promote"),
        1
    );
    assert_eq!(
        get_job(&db.pool, waiting.id).await.expect("get").state,
        JobState::Available
    );
}

/// Fault seams are keyed by job id and process-wide: every test database must hand out ids
/// no other test database of this binary uses, or parallel tests fire each other's faults.
#[tokio::test]
async fn test_databases_never_share_job_ids() {
    let (a, b) = (TestDb::new().await, TestDb::new().await);
    let task = || Task {
        n: 1,
        mode: "ok".into(),
    };
    let in_a = insert(&a.pool, task()).await.expect("insert a");
    let in_b = insert(&b.pool, task()).await.expect("insert b");
    assert!(in_a.id >= common::ID_BLOCK && in_b.id >= common::ID_BLOCK);
    assert!(
        (in_a.id / common::ID_BLOCK) != (in_b.id / common::ID_BLOCK),
        "ids {} and {} come from the same block",
        in_a.id,
        in_b.id
    );
}
