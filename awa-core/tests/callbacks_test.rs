//! External callbacks (ADR-021): parking a job with `WaitForCallback`, resolving it from outside
//! (`complete_external`, `fail_external`, `retry_external`, `resume_external`,
//! `heartbeat_callback`), in-handler waits with `ctx.wait_for_callback`, and callback timeouts.

mod common;
mod support;

use awa_core::maintenance::rescue::{rescue_stale, RescueKind};
use awa_core::storage::dlq;
use awa_core::{
    get_job, insert, insert_with, AwaError, Client, EnqueueRequest, JobArgs, JobResult, JobState,
    QueueConfig,
};
use common::TestDb;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, fast_config, jobs_of_kind, test_db, wait_for_state, wait_idle};
use tokio::sync::{mpsc, Notify};

const T: Duration = Duration::from_secs(10);

/// A job whose handler registers a callback and parks (or waits in the handler).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Parked {
    n: i64,
}
impl JobArgs for Parked {}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Quick {
    n: i64,
}
impl JobArgs for Quick {}

/// Follow-up written by registered specs, on a queue no client works.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Notice {
    from: i64,
    event: String,
}
impl JobArgs for Notice {}

fn notice(from: i64, event: &str) -> EnqueueRequest<Notice> {
    EnqueueRequest::new(Notice {
        from,
        event: event.into(),
    })
    .queue("sink")
}

type Tokens = mpsc::UnboundedReceiver<(i64, String)>;

/// A client whose `Parked` handler registers a callback, reports `(job id, token)` and returns
/// `WaitForCallback` on its first run, and completes on any later run. `Quick` completes.
/// Registered specs write a `Notice` on Completed and Exhausted.
fn parking_client(
    db: &TestDb,
    workers: usize,
    timeout: Duration,
    config: awa_core::RuntimeConfig,
) -> (Client, Tokens, Arc<AtomicUsize>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(workers))
        .queue("dead_letters", QueueConfig::new(1).dlq(true))
        .config(config)
        .register::<Parked, _, _>(move |_args, ctx| {
            let tx = tx.clone();
            let ctx_job = ctx.job().clone();
            let pool = ctx.pool().clone();
            r.fetch_add(1, Ordering::SeqCst);
            async move {
                if ctx_job.attempt > 1 {
                    return Ok(JobResult::Completed);
                }
                let token = awa_core::storage::callbacks::register_callback(
                    &pool,
                    ctx_job.id,
                    ctx_job.run_lease,
                    timeout,
                )
                .await
                .map_err(awa_core::JobError::retryable)?;
                tx.send((ctx_job.id, token.0.clone()))
                    .expect("report token");
                Ok(JobResult::WaitForCallback(token))
            }
        })
        .register::<Quick, _, _>(|_args, _ctx| async move { Ok(JobResult::Completed) })
        .on_completed_enqueue::<Parked, Notice, _>(|a| notice(a.n, "completed"))
        .on_exhausted_enqueue::<Parked, Notice, _>(|a| notice(a.n, "exhausted"))
        .build()
        .expect("build");
    (client, rx, runs)
}

async fn next_token(rx: &mut Tokens) -> (i64, String) {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("a handler reported a token")
        .expect("channel open")
}

async fn notices(db: &TestDb) -> Vec<(i64, String)> {
    jobs_of_kind(db, "notice")
        .await
        .into_iter()
        .map(|j| {
            let n: Notice = serde_json::from_value(j.args).expect("notice args");
            (n.from, n.event)
        })
        .collect()
}

#[tokio::test]
async fn wait_for_callback_parks_the_job_frees_the_slot_and_complete_external_finishes_it() {
    let db = test_db().await;
    // One worker slot: the second job can only run if parking the first freed it.
    let (client, mut tokens, _) = parking_client(&db, 1, Duration::from_secs(3600), fast_config());
    let parked = insert(&db.pool, Parked { n: 1 }).await.expect("insert");
    client.start().await.expect("start");
    let (id, token) = next_token(&mut tokens).await;
    assert_eq!(id, parked.id);
    let row = wait_for_state(&db, parked.id, &[JobState::WaitingExternal], T).await;
    assert_eq!(row.callback_id.as_deref(), Some(token.as_str()));
    assert!(
        row.heartbeat_at.is_none() && row.deadline_at.is_none(),
        "a parked job is not heartbeated: {row:?}"
    );
    assert!(row.callback_timeout_at.is_some());

    let quick = insert(&db.pool, Quick { n: 2 }).await.expect("insert");
    wait_for_state(&db, quick.id, &[JobState::Completed], T).await;
    assert_eq!(
        get_job(&db.pool, parked.id).await.expect("get").state,
        JobState::WaitingExternal
    );
    assert!(
        notices(&db).await.is_empty(),
        "no spec fires while the job is parked"
    );

    let done = client
        .complete_external(&token, Some(serde_json::json!({"ok": true})))
        .await
        .expect("complete_external");
    assert_eq!(done.state, JobState::Completed);
    assert!(done.callback_id.is_none() && done.finalized_at.is_some());
    assert_eq!(
        notices(&db).await,
        vec![(1, "completed".to_string())],
        "the Completed spec fired with it"
    );

    // Already resolved: every resolution now reports CallbackNotFound and changes nothing.
    assert!(matches!(
        client.complete_external(&token, None).await,
        Err(AwaError::CallbackNotFound(_))
    ));
    assert!(matches!(
        client.fail_external(&token, "late").await,
        Err(AwaError::CallbackNotFound(_))
    ));
    assert!(matches!(
        client.resume_external(&token, None).await,
        Err(AwaError::CallbackNotFound(_))
    ));
    assert!(matches!(
        client.retry_external(&token).await,
        Err(AwaError::CallbackNotFound(_))
    ));
    assert_eq!(notices(&db).await.len(), 1);
    assert_eq!(
        get_job(&db.pool, parked.id).await.expect("get").state,
        JobState::Completed
    );
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn fail_external_fails_and_retry_external_runs_the_job_again() {
    let db = test_db().await;
    let (client, mut tokens, runs) =
        parking_client(&db, 4, Duration::from_secs(3600), fast_config());
    let to_fail = insert(&db.pool, Parked { n: 1 }).await.expect("insert");
    let to_retry = insert(&db.pool, Parked { n: 2 }).await.expect("insert");
    let to_dlq = insert_with(
        &db.pool,
        EnqueueRequest::new(Parked { n: 3 }).queue("dead_letters"),
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    let mut by_id = std::collections::HashMap::new();
    for _ in 0..3 {
        let (id, token) = next_token(&mut tokens).await;
        by_id.insert(id, token);
    }
    for id in [to_fail.id, to_retry.id, to_dlq.id] {
        wait_for_state(&db, id, &[JobState::WaitingExternal], T).await;
    }

    let failed = client
        .fail_external(&by_id[&to_fail.id], "the provider said no")
        .await
        .expect("fail_external");
    assert_eq!(failed.state, JobState::Failed);
    let stored = get_job(&db.pool, to_fail.id).await.expect("get");
    assert_eq!(stored.state, JobState::Failed);
    assert_eq!(
        stored.errors.last().map(|e| e.error.as_str()),
        Some("the provider said no")
    );
    assert!(stored.callback_id.is_none());

    let dead = client
        .fail_external(&by_id[&to_dlq.id], "gone for good")
        .await
        .expect("fail_external");
    assert_eq!(dead.id, to_dlq.id);
    let in_dlq = dlq::get_dlq_job(&db.pool, to_dlq.id)
        .await
        .expect("read the dlq")
        .expect("moved to the dlq");
    assert_eq!(in_dlq.reason, "gone for good");
    assert!(get_job(&db.pool, to_dlq.id).await.is_err(), "left awa.jobs");

    let retried = client
        .retry_external(&by_id[&to_retry.id])
        .await
        .expect("retry_external");
    assert_eq!(retried.state, JobState::Available);
    assert!(retried.callback_id.is_none());
    let done = wait_for_state(&db, to_retry.id, &[JobState::Completed], T).await;
    assert_eq!((done.attempt, done.run_lease), (2, 2), "a new attempt ran");
    assert_eq!(runs.load(Ordering::SeqCst), 4);

    let mut seen = notices(&db).await;
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (1, "exhausted".to_string()),
            (2, "completed".to_string()),
            (3, "exhausted".to_string())
        ],
        "fail_external fires Exhausted specs; the retried job fires Completed once it completes"
    );
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn unknown_callback_ids_are_not_found_and_malformed_ones_are_refused() {
    let db = TestDb::new().await;
    let (client, _tokens, _) = parking_client(&db, 1, Duration::from_secs(3600), fast_config());
    let unknown = "6f1c3a52-9a4b-4c51-8d7e-0123456789ab";
    // A well-formed id no job waits on is not found; a malformed one is a bad request
    // (awa.ValidationError in Python, as in awa-pg), checked before any lookup.
    for (id, malformed) in [(unknown, false), ("not-a-uuid", true), ("", true)] {
        let expected = |r: &Result<awa_core::JobRow, AwaError>| match r {
            Err(AwaError::CallbackNotFound(_)) => !malformed,
            Err(AwaError::Config(m)) => malformed && m.contains("invalid callback id"),
            _ => false,
        };
        let results = [
            client.complete_external(id, None).await,
            client.fail_external(id, "x").await,
            client.retry_external(id).await,
            client.resume_external(id, None).await,
            client.heartbeat_callback(id, Duration::from_secs(60)).await,
        ];
        for (i, r) in results.iter().enumerate() {
            assert!(expected(r), "{id:?} call {i}: {r:?}");
        }
    }
}

/// What an in-handler wait reported.
#[derive(Debug, Default)]
struct WaitReport {
    lease: i64,
    result: Option<Result<serde_json::Value, String>>,
}

/// A handler that waits inside itself. `register` closures return a `'static` future that
/// cannot borrow the context, so in-handler waits are written as a `Worker`, which has the
/// context for the whole attempt.
struct Waiter {
    tx: mpsc::UnboundedSender<(i64, String)>,
    report: Arc<Mutex<WaitReport>>,
    /// When set, the handler registers, reports its token, then waits for this before it
    /// starts waiting for the callback (so the test can resolve the callback first).
    gate: Option<Arc<Notify>>,
}

impl awa_core::Worker for Waiter {
    fn kind(&self) -> String {
        Parked::kind()
    }

    fn perform<'a>(
        &'a self,
        ctx: &'a awa_core::JobContext,
    ) -> futures_util::future::BoxFuture<'a, awa_core::HandlerResult> {
        Box::pin(async move {
            let token = ctx
                .register_callback(Duration::from_secs(3600))
                .await
                .map_err(awa_core::JobError::retryable)?;
            self.report.lock().expect("lock").lease = ctx.job().run_lease;
            self.tx
                .send((ctx.job().id, token.0.clone()))
                .expect("report token");
            if let Some(g) = &self.gate {
                g.notified().await;
            }
            let got = ctx.wait_for_callback(token).await;
            self.report.lock().expect("lock").result = Some(got.map_err(|e| e.to_string()));
            // Completed whatever the wait returned: after an external completion this finds
            // no running row.
            Ok(JobResult::Completed)
        })
    }
}

fn waiting_client(
    db: &TestDb,
    gate: Option<Arc<Notify>>,
) -> (Client, Tokens, Arc<Mutex<WaitReport>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let report: Arc<Mutex<WaitReport>> = Arc::default();
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(2))
        .config(fast_config())
        .register_worker(Waiter {
            tx,
            report: report.clone(),
            gate,
        })
        .on_completed_enqueue::<Parked, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    (client, rx, report)
}

fn wait_result(report: &Arc<Mutex<WaitReport>>) -> Option<Result<serde_json::Value, String>> {
    report.lock().expect("lock").result.clone()
}

#[tokio::test]
async fn resume_external_wakes_an_in_handler_wait_with_the_payload_under_the_same_lease() {
    let db = test_db().await;
    let (client, mut tokens, report) = waiting_client(&db, None);
    let job = insert(&db.pool, Parked { n: 7 }).await.expect("insert");
    client.start().await.expect("start");
    let (_, token) = next_token(&mut tokens).await;
    let payload = serde_json::json!({"answer": 42, "items": ["a", "b"]});
    let resumed = client
        .resume_external(&token, Some(payload.clone()))
        .await
        .expect("resume_external");
    assert_eq!(
        resumed.state,
        JobState::Running,
        "an in-handler wait keeps the attempt running"
    );
    assert_eq!(resumed.run_lease, 1);
    let done = wait_for_state(&db, job.id, &[JobState::Completed], T).await;
    assert_eq!(wait_result(&report), Some(Ok(payload)));
    assert_eq!(report.lock().expect("lock").lease, 1);
    assert_eq!(
        (done.attempt, done.run_lease),
        (1, 1),
        "the same attempt finished the job"
    );
    assert!(done.errors.is_empty() && done.callback_id.is_none());
    assert_eq!(notices(&db).await, vec![(7, "completed".to_string())]);
    // The callback was consumed by the resume.
    assert!(matches!(
        client.resume_external(&token, None).await,
        Err(AwaError::CallbackNotFound(_))
    ));
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_resume_that_arrives_before_the_handler_waits_is_still_delivered() {
    let db = test_db().await;
    let gate = Arc::new(Notify::new());
    let (client, mut tokens, report) = waiting_client(&db, Some(gate.clone()));
    let job = insert(&db.pool, Parked { n: 8 }).await.expect("insert");
    client.start().await.expect("start");
    let (_, token) = next_token(&mut tokens).await;
    // The handler is parked on the gate: it registered but has not started waiting.
    let resumed = client
        .resume_external(&token, Some(serde_json::json!("early")))
        .await
        .expect("resume_external");
    assert_eq!(resumed.state, JobState::Running);
    assert!(
        wait_result(&report).is_none(),
        "the handler has not waited yet"
    );
    gate.notify_one();
    let done = wait_for_state(&db, job.id, &[JobState::Completed], T).await;
    assert_eq!(wait_result(&report), Some(Ok(serde_json::json!("early"))));
    assert_eq!((done.attempt, done.run_lease), (1, 1));
    assert!(done.errors.is_empty());
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn complete_external_during_an_in_handler_wait_ends_the_wait_and_the_late_completion_is_stale(
) {
    let db = test_db().await;
    let (client, mut tokens, report) = waiting_client(&db, None);
    let job = insert(&db.pool, Parked { n: 9 }).await.expect("insert");
    client.start().await.expect("start");
    let (_, token) = next_token(&mut tokens).await;
    let done = client
        .complete_external(&token, None)
        .await
        .expect("complete_external");
    assert_eq!(done.state, JobState::Completed);
    let err = eventually("the waiting handler to get an error", T, || {
        let r = wait_result(&report);
        async move { r }
    })
    .await;
    let message = err.expect_err("wait_for_callback fails once the job was completed externally");
    assert!(message.contains(&token), "{message}");
    // The handler then returned Completed; let its finalization run.
    wait_idle(&client, T).await;
    let after = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!(after.state, JobState::Completed);
    assert_eq!(
        after.finalized_at, done.finalized_at,
        "the handler's late completion changed nothing"
    );
    assert_eq!(
        notices(&db).await,
        vec![(9, "completed".to_string())],
        "the Completed spec fired once, with the external completion; the handler's completion was stale"
    );
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn heartbeat_callback_extends_the_timeout() {
    let db = test_db().await;
    // No maintenance leader: rescue runs only when the test calls it.
    let (client, mut tokens, _) =
        parking_client(&db, 2, Duration::from_millis(300), support::quiet_config());
    let kept = insert(&db.pool, Parked { n: 1 }).await.expect("insert");
    let lapsed = insert(&db.pool, Parked { n: 2 }).await.expect("insert");
    client.start().await.expect("start");
    let mut by_id = std::collections::HashMap::new();
    for _ in 0..2 {
        let (id, token) = next_token(&mut tokens).await;
        by_id.insert(id, token);
    }
    for id in [kept.id, lapsed.id] {
        wait_for_state(&db, id, &[JobState::WaitingExternal], T).await;
    }
    let extended = client
        .heartbeat_callback(&by_id[&kept.id], Duration::from_secs(3600))
        .await
        .expect("heartbeat");
    let until = extended.callback_timeout_at.expect("a timeout is set");
    assert!(
        until > chrono::Utc::now() + chrono::Duration::minutes(50),
        "{until}"
    );
    assert_eq!(
        extended.callback_id.as_deref(),
        Some(by_id[&kept.id].as_str())
    );

    eventually("the unextended callback to time out", T, || async {
        let passed: bool =
            sqlx::query_scalar("SELECT callback_timeout_at < now() FROM awa.jobs WHERE id = $1")
                .bind(lapsed.id)
                .fetch_one(&db.pool)
                .await
                .expect("query");
        passed.then_some(())
    })
    .await;
    let rescued = rescue_stale(
        &db.pool,
        RescueKind::CallbackTimeout,
        Duration::from_secs(60),
    )
    .await
    .expect("rescue");
    assert_eq!(
        rescued,
        vec![lapsed.id],
        "only the callback that was not extended timed out"
    );
    assert_eq!(
        get_job(&db.pool, kept.id).await.expect("get").state,
        JobState::WaitingExternal
    );
    let r = get_job(&db.pool, lapsed.id).await.expect("get");
    assert_eq!(r.state, JobState::Retryable);
    assert!(
        r.errors[0].error.contains("callback timed out"),
        "{:?}",
        r.errors
    );
    assert!(matches!(
        client
            .heartbeat_callback(&by_id[&lapsed.id], Duration::from_secs(60))
            .await,
        Err(AwaError::CallbackNotFound(_))
    ));
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_timed_out_callback_is_retried_or_failed_when_attempts_are_exhausted() {
    let db = test_db().await;
    let (client, mut tokens, runs) =
        parking_client(&db, 2, Duration::from_millis(200), fast_config());
    let retried = insert(&db.pool, Parked { n: 1 }).await.expect("insert");
    let exhausted = insert_with(
        &db.pool,
        EnqueueRequest::new(Parked { n: 2 }).max_attempts(1),
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    for _ in 0..2 {
        next_token(&mut tokens).await;
    }
    let failed = wait_for_state(&db, exhausted.id, &[JobState::Failed], T).await;
    assert!(
        failed.errors[0].error.contains("callback timed out"),
        "{:?}",
        failed.errors
    );
    assert!(failed.callback_id.is_none() && failed.finalized_at.is_some());
    // The other one became retryable, ran again (the handler completes on attempt 2).
    let done = wait_for_state(&db, retried.id, &[JobState::Completed], T).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(done.errors.len(), 1);
    assert!(
        done.errors[0].error.contains("callback timed out"),
        "{:?}",
        done.errors
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_resume_that_arrives_before_the_job_is_parked_makes_it_runnable_again() {
    let db = test_db().await;
    let runs: Arc<Mutex<std::collections::HashMap<i64, usize>>> = Arc::default();
    let (tx, mut tokens) = mpsc::unbounded_channel();
    let r = runs.clone();
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(2))
        .config(fast_config())
        .register::<Parked, _, _>(move |args, ctx| {
            let (r, tx) = (r.clone(), tx.clone());
            let job = ctx.job().clone();
            let pool = ctx.pool().clone();
            async move {
                let run = {
                    let mut runs = r.lock().expect("lock");
                    let n = runs.entry(job.id).or_default();
                    *n += 1;
                    *n
                };
                if run > 1 {
                    return Ok(JobResult::Completed);
                }
                let token = awa_core::storage::callbacks::register_callback(
                    &pool,
                    job.id,
                    job.run_lease,
                    Duration::from_secs(3600),
                )
                .await
                .map_err(awa_core::JobError::retryable)?;
                if args.n == 1 {
                    // The external system answers before the executor has parked the job.
                    awa_core::storage::callbacks::resume_external(
                        &pool,
                        &token.0,
                        Some(serde_json::json!("fast")),
                    )
                    .await
                    .map_err(awa_core::JobError::retryable)?;
                }
                tx.send((job.id, token.0.clone())).expect("report token");
                Ok(JobResult::WaitForCallback(token))
            }
        })
        .build()
        .expect("build");
    let early = insert(&db.pool, Parked { n: 1 }).await.expect("insert");
    let normal = insert(&db.pool, Parked { n: 2 }).await.expect("insert");
    client.start().await.expect("start");
    let mut by_id = std::collections::HashMap::new();
    for _ in 0..2 {
        let (id, token) = next_token(&mut tokens).await;
        by_id.insert(id, token);
    }
    // The control: parked first, then resumed.
    wait_for_state(&db, normal.id, &[JobState::WaitingExternal], T).await;
    client
        .resume_external(&by_id[&normal.id], None)
        .await
        .expect("resume");

    for id in [early.id, normal.id] {
        let done = wait_for_state(&db, id, &[JobState::Completed], T).await;
        assert!(
            done.errors.is_empty(),
            "job {id} was resumed, not rescued: {:?}",
            done.errors
        );
        assert_eq!(
            (done.attempt, done.run_lease),
            (1, 2),
            "job {id}: a resume does not burn an attempt"
        );
    }
    assert_eq!(
        runs.lock()
            .expect("lock")
            .values()
            .copied()
            .collect::<Vec<_>>(),
        vec![2, 2]
    );
    client.shutdown(Duration::from_secs(5)).await;
}
