//! Progress (ADR-014): what a handler records with `set_progress` / `update_metadata` is
//! flushed by `flush_progress` and heartbeats, survives retries, and is cleared on completion.

mod common;
mod support;

use awa_core::executor::context::MAX_PROGRESS_BYTES;
use awa_core::{
    get_job, insert, AwaError, Client, EnqueueRequest, HandlerResult, JobArgs, JobContext,
    JobError, JobResult, JobState, QueueConfig, RuntimeConfig, ValidationError, Worker,
};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, fast_config, quiet_config, test_db, wait_for_state};
use tokio::sync::{mpsc, Notify};

const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report {
    n: i64,
    /// "plain", "staging" or "park".
    mode: String,
}
impl JobArgs for Report {}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Downstream {
    n: i64,
}
impl JobArgs for Downstream {}

fn map(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

async fn stored_progress(ctx: &JobContext) -> Option<Value> {
    sqlx::query_scalar("SELECT progress FROM awa.jobs WHERE id = $1")
        .bind(ctx.job().id)
        .fetch_one(ctx.pool())
        .await
        .expect("read progress")
}

/// Per attempt: `(ctx.job().progress, ctx.progress())` as the attempt started.
type Seen = Arc<Mutex<HashMap<i32, (Option<Value>, Option<Value>)>>>;

/// Attempt 1 records progress and fails (retryable); attempt 2 records what it saw and
/// completes.
struct Checkpointing {
    seen: Seen,
}

impl Worker for Checkpointing {
    fn kind(&self) -> String {
        Report::kind()
    }
    fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let attempt = ctx.job().attempt;
            self.seen
                .lock()
                .expect("lock")
                .insert(attempt, (ctx.job().progress.clone(), ctx.progress()));
            if attempt == 1 {
                ctx.set_progress(40.0, Some("halfway"))
                    .map_err(JobError::terminal)?;
                ctx.update_metadata(map(json!({"cursor": 17})))
                    .map_err(JobError::terminal)?;
                return Err(JobError::Retryable("connection dropped".into()));
            }
            ctx.update_metadata(map(json!({"cursor": 18, "resumed": true})))
                .map_err(JobError::terminal)?;
            Ok(JobResult::Completed)
        })
    }
}

#[tokio::test]
async fn progress_survives_a_retry_and_is_cleared_when_the_job_completes() {
    let db = test_db().await;
    let seen: Seen = Arc::default();
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(fast_config())
        .register_worker(Checkpointing { seen: seen.clone() })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Report {
            n: 1,
            mode: "plain".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    // Wait for the first attempt's failure, not for `retryable`: that state lasts only the
    // 2 s backoff, which a loaded machine can let pass before the test looks.
    let failed = eventually("the first attempt to fail", T, || async {
        let row = get_job(&db.pool, job.id).await.expect("get");
        (!row.errors.is_empty()).then_some(row)
    })
    .await;
    let expected = json!({"percent": 40, "message": "halfway", "metadata": {"cursor": 17}});
    // (Once the second attempt runs, its heartbeats may already store its own progress.)
    if matches!(failed.state, JobState::Retryable | JobState::Available) {
        assert_eq!(
            failed.progress,
            Some(expected.clone()),
            "the failed attempt's progress is stored"
        );
    }
    // Skip the backoff (if it is still running).
    sqlx::query("UPDATE awa.jobs SET run_at = now() WHERE id = $1 AND state = 'retryable'")
        .bind(job.id)
        .execute(&db.pool)
        .await
        .expect("due");
    let done = wait_for_state(&db, job.id, &[JobState::Completed], T).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(done.progress, None, "completion clears progress");
    client.shutdown(Duration::from_secs(5)).await;

    let seen = seen.lock().expect("lock");
    assert_eq!(
        seen.get(&1),
        Some(&(None, None)),
        "the first attempt starts without progress"
    );
    assert_eq!(
        seen.get(&2),
        Some(&(Some(expected.clone()), Some(expected))),
        "the retry sees the earlier attempt's progress in job().progress and progress()"
    );
}

/// Sets progress, flushes it, reports what the row holds, then ends as `mode` says.
struct FlushThenFinish {
    before_completion: Arc<Mutex<HashMap<i64, Option<Value>>>>,
    tokens: mpsc::UnboundedSender<String>,
}

impl Worker for FlushThenFinish {
    fn kind(&self) -> String {
        Report::kind()
    }
    fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let args: Report =
                serde_json::from_value(ctx.job().args.clone()).map_err(JobError::terminal)?;
            ctx.set_progress(99.0, Some(&format!("finishing {}", args.mode)))
                .map_err(JobError::terminal)?;
            ctx.flush_progress().await.map_err(JobError::retryable)?;
            let stored = stored_progress(ctx).await;
            self.before_completion
                .lock()
                .expect("lock")
                .insert(args.n, stored);
            match args.mode.as_str() {
                "staging" => {
                    ctx.enqueue_on_completion(
                        EnqueueRequest::new(Downstream { n: args.n }).queue("sink"),
                    )?;
                    Ok(JobResult::Completed)
                }
                "park" => {
                    let token = ctx
                        .register_callback(Duration::from_secs(3600))
                        .await
                        .map_err(JobError::retryable)?;
                    self.tokens.send(token.0.clone()).expect("send token");
                    Ok(JobResult::WaitForCallback(token))
                }
                _ => Ok(JobResult::Completed),
            }
        })
    }
}

#[tokio::test]
async fn every_completion_path_clears_progress() {
    let db = test_db().await;
    let before: Arc<Mutex<HashMap<i64, Option<Value>>>> = Arc::default();
    let (tx, mut tokens) = mpsc::unbounded_channel();
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(4))
        .config(fast_config())
        .register_worker(FlushThenFinish {
            before_completion: before.clone(),
            tokens: tx,
        })
        .build()
        .expect("build");
    let plain = insert(
        &db.pool,
        Report {
            n: 1,
            mode: "plain".into(),
        },
    )
    .await
    .expect("insert");
    let staging = insert(
        &db.pool,
        Report {
            n: 2,
            mode: "staging".into(),
        },
    )
    .await
    .expect("insert");
    let park = insert(
        &db.pool,
        Report {
            n: 3,
            mode: "park".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    for id in [plain.id, staging.id] {
        let done = wait_for_state(&db, id, &[JobState::Completed], T).await;
        assert_eq!(done.progress, None, "job {id}");
    }
    let token = tokio::time::timeout(T, tokens.recv())
        .await
        .expect("token")
        .expect("open");
    let parked = wait_for_state(&db, park.id, &[JobState::WaitingExternal], T).await;
    assert_eq!(
        parked.progress,
        Some(json!({"percent": 99, "message": "finishing park"})),
        "parking keeps progress"
    );
    let done = client
        .complete_external(&token, None)
        .await
        .expect("complete_external");
    assert_eq!(done.progress, None);
    assert_eq!(
        get_job(&db.pool, park.id).await.expect("get").progress,
        None
    );
    client.shutdown(Duration::from_secs(5)).await;

    let before = before.lock().expect("lock");
    for (n, mode) in [(1, "plain"), (2, "staging"), (3, "park")] {
        assert_eq!(
            before.get(&n),
            Some(&Some(
                json!({"percent": 99, "message": format!("finishing {mode}")})
            )),
            "flush_progress stored the progress of {mode} before it completed"
        );
    }
}

/// Writes progress in two steps, reporting after each and waiting for the test in between.
struct Stepper {
    step: mpsc::UnboundedSender<u8>,
    gate: Arc<Notify>,
    flush_first: bool,
}

impl Worker for Stepper {
    fn kind(&self) -> String {
        Report::kind()
    }
    fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            ctx.set_progress(10.0, Some("first"))
                .map_err(JobError::terminal)?;
            if self.flush_first {
                ctx.flush_progress().await.map_err(JobError::retryable)?;
            }
            self.step.send(1).expect("step");
            self.gate.notified().await;
            ctx.update_metadata(map(json!({"page": 2})))
                .map_err(JobError::terminal)?;
            self.step.send(2).expect("step");
            self.gate.notified().await;
            Ok(JobResult::Completed)
        })
    }
}

async fn row_progress(db: &common::TestDb, id: i64) -> Option<Value> {
    get_job(&db.pool, id).await.expect("get").progress
}

#[tokio::test]
async fn flush_progress_writes_at_once_and_unflushed_progress_waits_for_a_heartbeat() {
    let db = test_db().await;
    let gate = Arc::new(Notify::new());
    let (tx, mut steps) = mpsc::unbounded_channel();
    // Heartbeats every hour (and no rescue): only flush_progress can write during the test.
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(RuntimeConfig {
            heartbeat_interval: Duration::from_secs(3600),
            ..quiet_config()
        })
        .register_worker(Stepper {
            step: tx,
            gate: gate.clone(),
            flush_first: true,
        })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Report {
            n: 1,
            mode: "plain".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    assert_eq!(
        tokio::time::timeout(T, steps.recv()).await.expect("step 1"),
        Some(1)
    );
    assert_eq!(
        row_progress(&db, job.id).await,
        Some(json!({"percent": 10, "message": "first"}))
    );
    gate.notify_one();
    assert_eq!(
        tokio::time::timeout(T, steps.recv()).await.expect("step 2"),
        Some(2)
    );
    assert_eq!(
        row_progress(&db, job.id).await,
        Some(json!({"percent": 10, "message": "first"})),
        "unflushed progress is not written before a heartbeat"
    );
    gate.notify_one();
    let done = wait_for_state(&db, job.id, &[JobState::Completed], T).await;
    assert_eq!(done.progress, None);
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn heartbeats_flush_buffered_progress() {
    let db = test_db().await;
    let gate = Arc::new(Notify::new());
    let (tx, mut steps) = mpsc::unbounded_channel();
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(fast_config())
        .register_worker(Stepper {
            step: tx,
            gate: gate.clone(),
            flush_first: false,
        })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Report {
            n: 1,
            mode: "plain".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    assert_eq!(
        tokio::time::timeout(T, steps.recv()).await.expect("step 1"),
        Some(1)
    );
    eventually("a heartbeat to flush the first progress", T, || async {
        (row_progress(&db, job.id).await == Some(json!({"percent": 10, "message": "first"})))
            .then_some(())
    })
    .await;
    gate.notify_one();
    assert_eq!(
        tokio::time::timeout(T, steps.recv()).await.expect("step 2"),
        Some(2)
    );
    eventually(
        "a heartbeat to flush the metadata checkpoint",
        T,
        || async {
            (row_progress(&db, job.id).await
                == Some(json!({"percent": 10, "message": "first", "metadata": {"page": 2}})))
            .then_some(())
        },
    )
    .await;
    gate.notify_one();
    let done = wait_for_state(&db, job.id, &[JobState::Completed], T).await;
    assert_eq!(done.progress, None);
    client.shutdown(Duration::from_secs(5)).await;
}

/// Tries to store oversize progress and reports what happened, then fails retryably so the
/// row keeps whatever progress the attempt ended with.
struct Oversize {
    results: Arc<Mutex<Vec<Result<(), String>>>>,
    after: Arc<Mutex<Option<Value>>>,
}

fn is_progress_too_long(e: &AwaError) -> bool {
    matches!(e, AwaError::Validation(ValidationError::TooLong { field: "progress", limit, .. }) if *limit == MAX_PROGRESS_BYTES)
}

impl Worker for Oversize {
    fn kind(&self) -> String {
        Report::kind()
    }
    fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            ctx.set_progress(5.0, Some("small"))
                .map_err(JobError::terminal)?;
            let huge = "x".repeat(MAX_PROGRESS_BYTES);
            let mut results = Vec::new();
            for r in [
                ctx.update_metadata(map(json!({"blob": huge.clone()}))),
                ctx.set_progress(6.0, Some(&huge)),
            ] {
                results.push(match r {
                    Ok(()) => Ok(()),
                    Err(e) if is_progress_too_long(&e) => Err("too long".to_string()),
                    Err(e) => Err(format!("unexpected error: {e}")),
                });
            }
            // Just under the limit is accepted.
            let fits = "y".repeat(MAX_PROGRESS_BYTES - 200);
            results.push(
                ctx.update_metadata(map(json!({"fits": fits})))
                    .map_err(|e| e.to_string()),
            );
            *self.results.lock().expect("lock") = results;
            *self.after.lock().expect("lock") = ctx.progress();
            ctx.flush_progress().await.map_err(JobError::retryable)?;
            Ok(JobResult::RetryAfter(Duration::from_secs(3600)))
        })
    }
}

#[tokio::test]
async fn oversize_progress_is_rejected_and_leaves_the_document_unchanged() {
    let db = test_db().await;
    let results: Arc<Mutex<Vec<Result<(), String>>>> = Arc::default();
    let after: Arc<Mutex<Option<Value>>> = Arc::default();
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(fast_config())
        .register_worker(Oversize {
            results: results.clone(),
            after: after.clone(),
        })
        .build()
        .expect("build");
    let job = insert(
        &db.pool,
        Report {
            n: 1,
            mode: "plain".into(),
        },
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    let row = wait_for_state(&db, job.id, &[JobState::Retryable], T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        *results.lock().expect("lock"),
        vec![
            Err("too long".to_string()),
            Err("too long".to_string()),
            Ok(())
        ]
    );
    let fits = "y".repeat(MAX_PROGRESS_BYTES - 200);
    let expected = json!({"percent": 5, "message": "small", "metadata": {"fits": fits}});
    assert_eq!(
        *after.lock().expect("lock"),
        Some(expected.clone()),
        "the rejected writes left no trace"
    );
    assert_eq!(row.progress, Some(expected));
}
