//! Handler-staged follow-ups (ADR-046): a handler stages follow-up jobs built from values it
//! computed; they are inserted in the transaction that completes the attempt under its run
//! lease, deduplicated by their own unique keys, and discarded on every other outcome.
//!
//! Each test follows a row of the ADR's "When staged follow-ups commit" table or one of its
//! "How they are inserted" rules.

mod common;
mod support;

use awa_core::finalizer::batched::complete_batch_with_follow_ups;
use awa_core::finalizer::{finalize_with_retry, Finalization, Finalized, Transition};
use awa_core::follow_ups::SealedFollowUps;
use awa_core::maintenance::rescue::{rescue_stale, RescueKind};
use awa_core::metrics;
use awa_core::seams::{self, Path, Point};
use awa_core::specs::Specs;
use awa_core::storage::claim::{claim_batch, claim_kind};
use awa_core::storage::dlq;
use awa_core::testing::work_one_on;
use awa_core::{
    get_job, insert, insert_many, insert_with, AwaError, Client, ClientBuilder, EnqueueRequest,
    FollowUps, HandlerResult, JobArgs, JobContext, JobError, JobResult, JobRow, JobState,
    QueueConfig, RuntimeConfig, StageError, UniqueOpts, Worker,
};
use common::TestDb;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    count_kind, eventually, fast_config, handler, jobs_of_kind, metric, quiet_config,
    reject_inserts_of, test_db, wait_for_state, wait_idle,
};
use tokio::sync::{mpsc, Notify};

const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StageA {
    n: i64,
    mode: String,
}
impl JobArgs for StageA {}

fn stage_a(n: i64, mode: &str) -> StageA {
    StageA {
        n,
        mode: mode.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct StageB {
    item_id: i64,
}
impl JobArgs for StageB {}

/// A follow-up whose args carry a marker that must never show up in a log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Labeled {
    label: String,
}
impl JobArgs for Labeled {}

const MARKER: &str = "ARG-MARKER-7f3a";

/// What registered specs write, on a queue no client works.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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

/// Stand-in for the handler's run-time computation (the ADR's `resolve_item`).
async fn resolve_item(args: &StageA) -> Result<i64, JobError> {
    tokio::task::yield_now().await;
    Ok(args.n % 3)
}

/// Every B row, oldest id first, with its args.
async fn bs(db: &TestDb) -> Vec<(JobRow, StageB)> {
    jobs_of_kind(db, "stage_b")
        .await
        .into_iter()
        .map(|j| {
            let b: StageB = serde_json::from_value(j.args.clone()).expect("stage_b args");
            (j, b)
        })
        .collect()
}

async fn b_items(db: &TestDb) -> Vec<i64> {
    bs(db).await.into_iter().map(|(_, b)| b.item_id).collect()
}

async fn notices(db: &TestDb) -> Vec<(JobRow, Notice)> {
    jobs_of_kind(db, "notice")
        .await
        .into_iter()
        .map(|j| {
            let n: Notice = serde_json::from_value(j.args.clone()).expect("notice args");
            (j, n)
        })
        .collect()
}

fn base(db: &TestDb, path: Path) -> ClientBuilder {
    Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(4))
        .config(config(path, fast_config()))
}

/// A sealed buffer holding `items` as staged B follow-ups.
fn sealed(items: &[i64]) -> SealedFollowUps {
    let f = FollowUps::new();
    for i in items {
        f.enqueue_on_completion(
            EnqueueRequest::new(StageB { item_id: *i }).unique(UniqueOpts::default()),
        )
        .expect("stage");
    }
    f.seal()
}

async fn claim_a(db: &TestDb, args: StageA) -> Arc<JobRow> {
    let job = insert(&db.pool, args).await.expect("insert");
    // Follow-ups of earlier steps may still be available in the queue: claim an A.
    let mut claimed = claim_kind(&db.pool, "default", "stage_a", 1, Duration::from_secs(300))
        .await
        .expect("claim");
    let row = claimed.pop().expect("claimed");
    assert_eq!(row.id, job.id);
    Arc::new(row)
}

fn completion(job: &Arc<JobRow>, follow_ups: SealedFollowUps) -> Finalization {
    Finalization {
        job: job.clone(),
        transition: Transition::Completed,
        follow_ups,
        progress: None,
        dlq: false,
    }
}

// ---------------------------------------------------------------------------------------------
// Both completion paths
// ---------------------------------------------------------------------------------------------

/// Every test below runs twice: `<test>::batched`, with `RuntimeConfig::batch_follow_ups` on
/// (completions with follow-ups share a transaction with the rest of their batch), and
/// `<test>::per_job`, with it off (ADR-046's per-job completion transaction). Tests that
/// finalize by hand use [`finalize`] and [`work`], which take the same two paths.
macro_rules! on_both_paths {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test]
            async fn batched() {
                super::$test(awa_core::seams::Path::Batched).await
            }
            #[tokio::test]
            async fn per_job() {
                super::$test(awa_core::seams::Path::PerJob).await
            }
        }
    )*};
}

/// `settings` with the completion path of `path`.
fn config(path: Path, settings: RuntimeConfig) -> RuntimeConfig {
    RuntimeConfig {
        batch_follow_ups: path == Path::Batched,
        ..settings
    }
}

/// Finalize `fin` by hand on `path`: `complete_batch_with_follow_ups` (a batch of one), or
/// `finalize_with_retry`.
async fn finalize(
    path: Path,
    pool: &awa_core::Db,
    fin: &Finalization,
    specs: &Specs,
) -> Result<Finalized, AwaError> {
    match path {
        Path::Batched => complete_batch_with_follow_ups(pool, std::slice::from_ref(fin), specs)
            .await?
            .pop()
            .expect("one result per finalization"),
        Path::PerJob => finalize_with_retry(pool, fin, specs).await,
    }
}

/// `work_one` finalizing on `path`.
async fn work(
    path: Path,
    pool: &awa_core::Db,
    queue: &str,
    handler: Arc<dyn awa_core::ErasedHandler>,
    specs: &Specs,
) -> awa_core::Result<awa_core::testing::WorkResult> {
    work_one_on(pool, queue, None, handler, specs, path == Path::Batched).await
}

/// The completion of `job_id`, which inserted follow-ups, was sent on `path` by the runtime.
fn assert_sent(path: Path, job_id: i64) {
    assert_eq!(
        seams::sent_on(job_id).last(),
        Some(&path),
        "job {job_id} completed on the wrong path: {:?}",
        seams::sent_on(job_id)
    );
}

// ---------------------------------------------------------------------------------------------
// Inserted with the completion
// ---------------------------------------------------------------------------------------------

async fn the_pipeline_example_runs_one_b_per_distinct_item(path: Path) {
    let db = test_db().await;
    let processed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let p = processed.clone();
    // The ADR's example, verbatim apart from the StageB handler.
    let client = base(&db, path)
        .register::<StageA, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            async move {
                let item_id = resolve_item(&args).await?;
                follow_ups.enqueue_on_completion(
                    EnqueueRequest::new(StageB { item_id }).unique(UniqueOpts::default()),
                )?;
                Ok(JobResult::Completed)
            }
        })
        .register::<StageB, _, _>(move |args, _ctx| {
            let p = p.clone();
            async move {
                p.lock().expect("lock").push(args.item_id);
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    // Nine A jobs resolve to three distinct items.
    let a_rows = insert_many(
        &db.pool,
        (0..9)
            .map(|n| EnqueueRequest::new(stage_a(n, "ok")))
            .collect(),
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    for a in &a_rows {
        wait_for_state(&db, a.id, &[JobState::Completed], T).await;
        assert_sent(path, a.id);
    }
    let b_rows = eventually("three completed Bs", T, || async {
        let rows = bs(&db).await;
        (rows.len() == 3 && rows.iter().all(|(j, _)| j.state == JobState::Completed))
            .then_some(rows)
    })
    .await;
    client.shutdown(Duration::from_secs(5)).await;

    let mut items: Vec<i64> = b_rows.iter().map(|(_, b)| b.item_id).collect();
    items.sort();
    assert_eq!(items, vec![0, 1, 2], "exactly one B per item");
    let mut ran = processed.lock().expect("lock").clone();
    ran.sort();
    assert_eq!(ran, vec![0, 1, 2], "each B ran once");
    // Each B was inserted by the transaction that completed one of its A jobs: now() is the
    // transaction's start time, so the B's created_at equals that A's finalized_at.
    let mut finals = Vec::new();
    for a in &a_rows {
        let row = get_job(&db.pool, a.id).await.expect("get");
        finals.push((
            row.finalized_at.expect("finalized"),
            a.id,
            row.args["n"].as_i64().expect("n") % 3,
        ));
    }
    for (b, args) in &b_rows {
        assert!(
            finals
                .iter()
                .any(|(at, _, item)| *at == b.created_at && *item == args.item_id),
            "B {} ({args:?}) was not created by an A completion: {finals:?}",
            b.id
        );
    }
}

async fn deduplication_uses_the_follow_ups_own_key_and_keeps_its_other_options(path: Path) {
    let db = test_db().await;
    let client = base(&db, path)
        .register::<StageA, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            let me = ctx.job().id;
            async move {
                let item_id = args.n % 2;
                // Context that must not affect deduplication goes into metadata.
                follow_ups.enqueue_on_completion(
                    EnqueueRequest::new(StageB { item_id })
                        .queue("b_queue")
                        .priority(3)
                        .tags(vec!["pipeline".into()])
                        .unique(UniqueOpts::default())
                        .metadata(json!({"from_a": me})),
                )?;
                // The same key staged twice in one attempt collapses to the first.
                follow_ups.enqueue_on_completion(
                    EnqueueRequest::new(StageB { item_id })
                        .queue("b_queue")
                        .unique(UniqueOpts::default())
                        .metadata(json!({"from_a": me, "second": true})),
                )?;
                if args.mode == "self" {
                    // A's own kind, args and unique options: collides with A itself.
                    follow_ups.enqueue_on_completion(
                        EnqueueRequest::new(args.clone()).unique(UniqueOpts::default()),
                    )?;
                }
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let mut a_ids = Vec::new();
    for n in 0..4 {
        a_ids.push(insert(&db.pool, stage_a(n, "ok")).await.expect("insert").id);
    }
    let selfish = insert_with(
        &db.pool,
        EnqueueRequest::new(stage_a(10, "self")).unique(UniqueOpts::default()),
    )
    .await
    .expect("insert");
    a_ids.push(selfish.id);
    client.start().await.expect("start");
    for id in &a_ids {
        wait_for_state(&db, *id, &[JobState::Completed], T).await;
    }
    client.shutdown(Duration::from_secs(5)).await;

    let rows = bs(&db).await;
    let mut items: Vec<i64> = rows.iter().map(|(_, b)| b.item_id).collect();
    items.sort();
    assert_eq!(items, vec![0, 1], "one B per item, whatever the metadata");
    for (b, _) in &rows {
        assert_eq!(
            (b.queue.as_str(), b.priority, b.tags.clone()),
            ("b_queue", 3, vec!["pipeline".to_string()])
        );
        assert_eq!(b.state, JobState::Available);
        assert!(
            b.metadata.get("second").is_none(),
            "the first staged request won: {}",
            b.metadata
        );
        let from = b.metadata["from_a"].as_i64().expect("from_a");
        let a = get_job(&db.pool, from)
            .await
            .expect("the A named in metadata");
        assert_eq!(
            a.finalized_at,
            Some(b.created_at),
            "B {} came from A {from}'s completion",
            b.id
        );
    }
    assert_eq!(
        count_kind(&db, "stage_a").await,
        5,
        "the self-colliding follow-up was skipped"
    );
}

async fn a_worker_stages_through_its_context(path: Path) {
    struct Direct;
    impl Worker for Direct {
        fn kind(&self) -> String {
            StageA::kind()
        }
        fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult> {
            Box::pin(async move {
                let args: StageA =
                    serde_json::from_value(ctx.job().args.clone()).map_err(JobError::terminal)?;
                ctx.enqueue_on_completion(StageB {
                    item_id: args.n * 10,
                })?;
                ctx.enqueue_on_completion(
                    EnqueueRequest::new(StageB {
                        item_id: args.n * 10 + 1,
                    })
                    .metadata(json!({"by": "worker"})),
                )?;
                Ok(JobResult::Completed)
            })
        }
    }
    let db = test_db().await;
    let client = base(&db, path)
        .register_worker(Direct)
        .build()
        .expect("build");
    let a = insert(&db.pool, stage_a(4, "ok")).await.expect("insert");
    client.start().await.expect("start");
    let done = wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_sent(path, a.id);
    let rows = bs(&db).await;
    assert_eq!(
        rows.iter().map(|(_, b)| b.item_id).collect::<Vec<_>>(),
        vec![40, 41],
        "in staging order"
    );
    assert_eq!(rows[1].0.metadata, json!({"by": "worker"}));
    assert!(rows
        .iter()
        .all(|(b, _)| Some(b.created_at) == done.finalized_at));
}

async fn fan_out_and_a_registered_spec_commit_in_one_completion_spec_first(path: Path) {
    let db = test_db().await;
    let client = base(&db, path)
        .register::<StageA, _, _>(|_args, ctx| {
            let follow_ups = ctx.follow_ups();
            async move {
                // The per-attempt maximum.
                for item_id in 0..16 {
                    follow_ups.enqueue_on_completion(
                        EnqueueRequest::new(StageB { item_id }).unique(UniqueOpts::default()),
                    )?;
                }
                Ok(JobResult::Completed)
            }
        })
        .on_completed_enqueue::<StageA, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    client.start().await.expect("start");
    let done = wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_sent(path, a.id);
    let at = done.finalized_at.expect("finalized");
    let spec = notices(&db).await;
    assert_eq!(spec.len(), 1);
    let rows = bs(&db).await;
    assert_eq!(
        rows.iter().map(|(_, b)| b.item_id).collect::<Vec<_>>(),
        (0..16).collect::<Vec<_>>(),
        "staging order"
    );
    assert!(
        rows.iter().all(|(b, _)| b.id > spec[0].0.id),
        "the registered spec's follow-up is inserted first"
    );
    assert!(rows.windows(2).all(|w| w[0].0.id < w[1].0.id));
    assert!(
        spec.iter()
            .map(|(j, _)| j.created_at)
            .chain(rows.iter().map(|(j, _)| j.created_at))
            .all(|c| c == at),
        "everything was inserted by the completion transaction"
    );
}

// ---------------------------------------------------------------------------------------------
// Discarded on every other outcome
// ---------------------------------------------------------------------------------------------

async fn staged_follow_ups_are_discarded_on_every_outcome_but_completed(path: Path) {
    let db = test_db().await;
    let client = base(&db, path)
        .queue("default", QueueConfig::new(8))
        .register::<StageA, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            let job = ctx.job().clone();
            let pool = ctx.pool().clone();
            async move {
                follow_ups.enqueue_on_completion(StageB { item_id: args.n })?;
                match args.mode.as_str() {
                    "retry_after" => Ok(JobResult::RetryAfter(Duration::from_secs(3600))),
                    "snooze" => Ok(JobResult::Snooze(Duration::from_secs(3600))),
                    "cancel" => Ok(JobResult::Cancel("no longer needed".into())),
                    "retryable" => Err(JobError::Retryable("flaky".into())),
                    "terminal" => Err(JobError::Terminal("bad input".into())),
                    "panic" => panic!("handler exploded after staging"),
                    "wait" => {
                        follow_ups.enqueue_on_completion(Labeled {
                            label: format!("{MARKER} {}", args.n),
                        })?;
                        let token = awa_core::storage::callbacks::register_callback(
                            &pool,
                            job.id,
                            job.run_lease,
                            Duration::from_secs(3600),
                        )
                        .await
                        .map_err(JobError::retryable)?;
                        Ok(JobResult::WaitForCallback(token))
                    }
                    other => Err(JobError::Terminal(format!("unknown mode {other}"))),
                }
            }
        })
        .build()
        .expect("build");
    let want = [
        ("retry_after", JobState::Retryable),
        ("snooze", JobState::Scheduled),
        ("cancel", JobState::Cancelled),
        ("retryable", JobState::Retryable),
        ("terminal", JobState::Failed),
        ("panic", JobState::Retryable),
        ("wait", JobState::WaitingExternal),
    ];
    let mut ids = Vec::new();
    for (n, (mode, _)) in want.iter().enumerate() {
        ids.push(
            insert(&db.pool, stage_a(n as i64, mode))
                .await
                .expect("insert")
                .id,
        );
    }
    let wfc_before = metric(&metrics::STAGED_DISCARDED_WAIT_FOR_CALLBACK);
    let discarded_before = metric(&metrics::STAGED_DISCARDED);
    // The test runs on a current-thread runtime, so the client's tasks log to this recorder.
    let recorder = trace::Recorder::default();
    let rec = recorder.0.clone();
    let guard = trace::record(recorder);
    client.start().await.expect("start");
    for (id, (mode, state)) in ids.iter().zip(want) {
        let row = wait_for_state(&db, *id, &[state], T).await;
        assert_eq!(row.state, state, "{mode}");
    }
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    drop(guard);
    assert_eq!(
        count_kind(&db, "stage_b").await,
        0,
        "nothing staged survived a non-completion: {:?}",
        b_items(&db).await
    );
    assert_eq!(count_kind(&db, "labeled").await, 0);
    // Only this test returns WaitForCallback with follow-ups staged (two of them), but it runs
    // on both paths at once; the warning below, recorded on this test's thread, pins the count.
    assert!(metric(&metrics::STAGED_DISCARDED_WAIT_FOR_CALLBACK) - wfc_before >= 2);
    assert!(metric(&metrics::STAGED_DISCARDED) - discarded_before >= 8);
    // Returning WaitForCallback with staged follow-ups is logged at warn with kind, job id and
    // count, never args.
    let events = rec.events.lock().expect("lock").clone();
    let wait_id = ids[6];
    let warned: Vec<_> = events
        .iter()
        .filter(|e| e.level == tracing::Level::WARN && e.fields.contains("WaitForCallback"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    for part in [
        format!("job_id={wait_id} "),
        "kind=stage_a ".to_string(),
        "count=2 ".to_string(),
    ] {
        assert!(
            warned[0].fields.contains(&part),
            "{part:?} missing from {:?}",
            warned[0].fields
        );
    }
    assert!(
        !events.iter().any(|e| e.fields.contains(MARKER)),
        "staged args reached a log"
    );
}

/// Stages B(1), waits in the handler, and on a resume stages B(payload.item); reports the
/// callback token and any error from the wait; always returns Completed.
struct WaitThenStage {
    tokens: mpsc::UnboundedSender<String>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Worker for WaitThenStage {
    fn kind(&self) -> String {
        StageA::kind()
    }
    fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            ctx.enqueue_on_completion(
                EnqueueRequest::new(StageB { item_id: 1 }).unique(UniqueOpts::default()),
            )?;
            let token = ctx
                .register_callback(Duration::from_secs(3600))
                .await
                .map_err(JobError::retryable)?;
            self.tokens.send(token.0.clone()).expect("send token");
            match ctx.wait_for_callback(token).await {
                Ok(payload) => {
                    let item_id = payload["item"]
                        .as_i64()
                        .ok_or_else(|| JobError::terminal("no item"))?;
                    ctx.enqueue_on_completion(
                        EnqueueRequest::new(StageB { item_id }).unique(UniqueOpts::default()),
                    )?;
                }
                Err(e) => self.errors.lock().expect("lock").push(e.to_string()),
            }
            Ok(JobResult::Completed)
        })
    }
}

fn waiting_client(
    db: &TestDb,
    path: Path,
) -> (
    Client,
    mpsc::UnboundedReceiver<String>,
    Arc<Mutex<Vec<String>>>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let client = base(db, path)
        .register_worker(WaitThenStage {
            tokens: tx,
            errors: errors.clone(),
        })
        .on_completed_enqueue::<StageA, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    (client, rx, errors)
}

async fn follow_ups_staged_around_an_in_handler_wait_are_inserted_when_the_handler_completes(
    path: Path,
) {
    let db = test_db().await;
    let (client, mut tokens, errors) = waiting_client(&db, path);
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    client.start().await.expect("start");
    let token = tokio::time::timeout(T, tokens.recv())
        .await
        .expect("token")
        .expect("open");
    assert_eq!(
        get_job(&db.pool, a.id).await.expect("get").state,
        JobState::Running
    );
    assert_eq!(
        count_kind(&db, "stage_b").await,
        0,
        "nothing is inserted while the handler waits"
    );
    client
        .resume_external(&token, Some(json!({"item": 2})))
        .await
        .expect("resume");
    let done = wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert!(errors.lock().expect("lock").is_empty());
    let rows = bs(&db).await;
    assert_eq!(
        rows.iter().map(|(_, b)| b.item_id).collect::<Vec<_>>(),
        vec![1, 2],
        "staged before and after the wait"
    );
    assert!(rows
        .iter()
        .all(|(b, _)| Some(b.created_at) == done.finalized_at));
    assert_eq!(notices(&db).await.len(), 1);
}

async fn complete_external_during_an_in_handler_wait_discards_the_staged_follow_ups(path: Path) {
    let db = test_db().await;
    let (client, mut tokens, errors) = waiting_client(&db, path);
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    client.start().await.expect("start");
    let token = tokio::time::timeout(T, tokens.recv())
        .await
        .expect("token")
        .expect("open");
    let done = client
        .complete_external(&token, None)
        .await
        .expect("complete_external");
    assert_eq!(done.state, JobState::Completed);
    eventually("the handler's wait to fail", T, || {
        let n = errors.lock().expect("lock").len();
        async move { (n > 0).then_some(()) }
    })
    .await;
    // The handler returned Completed with B(1) staged; its finalization finds no running row.
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        count_kind(&db, "stage_b").await,
        0,
        "the handler's staged follow-up was discarded"
    );
    let spec = notices(&db).await;
    assert_eq!(
        spec.len(),
        1,
        "the registered spec fired once, with the external completion"
    );
    assert_eq!(Some(spec[0].0.created_at), done.finalized_at);
    assert_eq!(
        get_job(&db.pool, a.id).await.expect("get").finalized_at,
        done.finalized_at
    );
}

async fn an_abandoned_attempt_leaves_nothing_and_only_the_completing_attempt_inserts(path: Path) {
    let db = test_db().await;
    let client = base(&db, path)
        .queue(
            "default",
            QueueConfig::new(2).deadline(Duration::from_millis(300)),
        )
        .register::<StageA, _, _>(|_args, ctx| {
            let follow_ups = ctx.follow_ups();
            let attempt = i64::from(ctx.job().attempt);
            async move {
                // Each attempt stages a different value.
                follow_ups.enqueue_on_completion(
                    EnqueueRequest::new(StageB { item_id: attempt }).unique(UniqueOpts::default()),
                )?;
                if attempt == 1 {
                    // Hangs past the deadline: abandoned locally, then rescued.
                    std::future::pending::<()>().await;
                }
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    client.start().await.expect("start");
    let done = wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.attempt, 2);
    assert!(
        done.errors[0].error.contains("deadline"),
        "{:?}",
        done.errors
    );
    assert_eq!(
        b_items(&db).await,
        vec![2],
        "only the attempt that completed inserted its follow-up"
    );
}

// ---------------------------------------------------------------------------------------------
// Poisoning and sealing
// ---------------------------------------------------------------------------------------------

async fn a_swallowed_staging_error_fails_the_attempt(path: Path) {
    let db = test_db().await;
    let client = base(&db, path)
        .queue("dead", QueueConfig::new(2).dlq(true))
        .register::<StageA, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            async move {
                match args.mode.as_str() {
                    "too_many" => {
                        for item_id in 0..16 {
                            follow_ups.enqueue_on_completion(StageB { item_id })?;
                        }
                        // The 17th is over the limit; the handler ignores the error.
                        let _ = follow_ups.enqueue_on_completion(StageB { item_id: 16 });
                    }
                    "invalid" => {
                        follow_ups.enqueue_on_completion(StageB { item_id: 1 })?;
                        let _ = follow_ups.enqueue_on_completion(
                            EnqueueRequest::new(StageB { item_id: 2 }).priority(9),
                        );
                    }
                    _ => {}
                }
                Ok(JobResult::Completed)
            }
        })
        .on_exhausted_enqueue::<StageA, Notice, _>(|a| notice(a.n, "exhausted"))
        .on_completed_enqueue::<StageA, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    let poisoned_before = metric(&metrics::ATTEMPTS_POISONED);
    let too_many = insert(&db.pool, stage_a(1, "too_many"))
        .await
        .expect("insert");
    let invalid = insert_with(
        &db.pool,
        EnqueueRequest::new(stage_a(2, "invalid")).queue("dead"),
    )
    .await
    .expect("insert");
    client.start().await.expect("start");
    let failed = wait_for_state(&db, too_many.id, &[JobState::Failed], T).await;
    let dead = eventually("the invalid one to reach the DLQ", T, || async {
        dlq::get_dlq_job(&db.pool, invalid.id).await.ok().flatten()
    })
    .await;
    client.shutdown(Duration::from_secs(5)).await;

    assert_eq!(failed.errors.len(), 1);
    let error = &failed.errors[0].error;
    assert!(
        error.contains("staging failed") && error.contains("too many staged follow-ups"),
        "{error}"
    );
    assert!(
        dead.reason.contains("staging failed") && dead.reason.contains("priority is 9"),
        "{}",
        dead.reason
    );
    assert!(
        get_job(&db.pool, invalid.id).await.is_err(),
        "moved out of awa.jobs"
    );
    assert_eq!(
        count_kind(&db, "stage_b").await,
        0,
        "a poisoned attempt inserts none of its follow-ups"
    );
    let mut events: Vec<Notice> = notices(&db).await.into_iter().map(|(_, n)| n).collect();
    events.sort();
    assert_eq!(
        events,
        vec![
            Notice {
                from: 1,
                event: "exhausted".into()
            },
            Notice {
                from: 2,
                event: "exhausted".into()
            }
        ],
        "the Exhausted specs fired, the Completed ones did not"
    );
    assert!(metric(&metrics::ATTEMPTS_POISONED) - poisoned_before >= 2);
}

async fn staging_after_the_handler_returned_is_refused(path: Path) {
    let db = test_db().await;
    let gate = Arc::new(Notify::new());
    let (tx, mut results) = mpsc::unbounded_channel::<Result<(), StageError>>();
    let g = gate.clone();
    let client = base(&db, path)
        .register::<StageA, _, _>(move |_args, ctx| {
            let follow_ups = ctx.follow_ups();
            let (g, tx) = (g.clone(), tx.clone());
            async move {
                // A task the handler spawns and does not await.
                tokio::spawn(async move {
                    g.notified().await;
                    tx.send(follow_ups.enqueue_on_completion(StageB { item_id: 5 }))
                        .expect("report");
                });
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    client.start().await.expect("start");
    wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    gate.notify_one();
    let late = tokio::time::timeout(T, results.recv())
        .await
        .expect("the task ran")
        .expect("open");
    assert_eq!(late, Err(StageError::Sealed));
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(count_kind(&db, "stage_b").await, 0);
    assert_eq!(
        get_job(&db.pool, a.id).await.expect("get").state,
        JobState::Completed
    );
}

/// Wait (bounded) until the runner of `follow_ups`' attempt waits at the after-return hold,
/// then try a late stage and let the runner go on.
async fn stage_once_held(follow_ups: FollowUps, item_id: i64) -> Result<(), StageError> {
    let deadline = tokio::time::Instant::now() + T;
    while !seams::is_held(&follow_ups) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let late = follow_ups.enqueue_on_completion(StageB { item_id });
    seams::release(&follow_ups);
    late
}

/// ADR-046, "Lifetime of the staging buffer": the buffer is sealed in the poll in which the
/// handler's future completes. The seam holds the runner right after the outcome is handed
/// over, so each spawned task's stage lands in exactly the window where a runner that sealed
/// later would still accept it: 200 of 200 must be Sealed, and no B may exist.
async fn a_stage_from_a_spawned_task_after_return_is_sealed_every_time(path: Path) {
    const N: i64 = 200;
    let db = test_db().await;
    let (tx, mut results) = mpsc::unbounded_channel::<Result<(), StageError>>();
    let client = base(&db, path)
        .register::<StageA, _, _>(move |args, ctx| {
            let follow_ups = ctx.follow_ups();
            seams::hold_after_return(&follow_ups);
            let tx = tx.clone();
            async move {
                // A task the handler spawns and does not await.
                tokio::spawn(async move {
                    let late = stage_once_held(follow_ups, args.n).await;
                    tx.send(late).expect("report");
                });
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let ids: Vec<i64> = insert_many(
        &db.pool,
        (0..N)
            .map(|n| EnqueueRequest::new(stage_a(n, "ok")))
            .collect(),
    )
    .await
    .expect("insert")
    .iter()
    .map(|j| j.id)
    .collect();
    client.start().await.expect("start");
    let mut sealed = 0;
    let mut accepted = 0;
    for _ in 0..N {
        let late = tokio::time::timeout(T, results.recv())
            .await
            .expect("every spawned task reported")
            .expect("open");
        match late {
            Err(StageError::Sealed) => sealed += 1,
            Ok(()) => accepted += 1,
            Err(other) => panic!("unexpected staging error {other}"),
        }
    }
    for id in &ids {
        wait_for_state(&db, *id, &[JobState::Completed], T).await;
    }
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        (sealed, accepted),
        (N, 0),
        "every stage after the handler returned is refused"
    );
    assert_eq!(count_kind(&db, "stage_b").await, 0);
}

/// The same for the `work_one` harness: it seals when the handler's future completes.
async fn work_one_seals_when_the_handler_returns(path: Path) {
    const N: i64 = 200;
    let db = test_db().await;
    let (tx, mut results) = mpsc::unbounded_channel::<Result<(), StageError>>();
    let h = handler(move |ctx: Arc<JobContext>| {
        let follow_ups = ctx.follow_ups();
        seams::hold_after_return(&follow_ups);
        let tx = tx.clone();
        let n = ctx.job().id;
        async move {
            tokio::spawn(async move {
                tx.send(stage_once_held(follow_ups, n).await)
                    .expect("report");
            });
            Ok(JobResult::Completed)
        }
    });
    let mut sealed = 0;
    for n in 0..N {
        insert(&db.pool, stage_a(n, "ok")).await.expect("insert");
        let r = work(path, &db.pool, "default", h.clone(), &Specs::default())
            .await
            .expect("work_one");
        assert_eq!(r.outcome, "completed");
        let late = tokio::time::timeout(T, results.recv())
            .await
            .expect("the spawned task reported")
            .expect("open");
        if late == Err(StageError::Sealed) {
            sealed += 1;
        }
    }
    assert_eq!(sealed, N, "every late stage is refused");
    assert_eq!(count_kind(&db, "stage_b").await, 0);
}

// ---------------------------------------------------------------------------------------------
// One transaction: rollback, finalize retries, stale leases, path selection
// ---------------------------------------------------------------------------------------------

/// Ids of the A jobs whose handler ran.
type Ran = Arc<Mutex<Vec<i64>>>;

fn staging_client(db: &TestDb, path: Path, settings: RuntimeConfig, ran: &Ran) -> Client {
    let ran = ran.clone();
    base(db, path)
        .config(config(path, settings))
        .register::<StageA, _, _>(move |args, ctx| {
            let follow_ups = ctx.follow_ups();
            ran.lock().expect("lock").push(ctx.job().id);
            async move {
                if args.mode != "none" {
                    follow_ups.enqueue_on_completion(
                        EnqueueRequest::new(StageB { item_id: args.n })
                            .unique(UniqueOpts::default()),
                    )?;
                }
                Ok(JobResult::Completed)
            }
        })
        .on_completed_enqueue::<StageA, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build")
}

/// Item 6 of issue 12: while a finalization waits for a working connection after a lost one,
/// its job stays in flight and keeps being heartbeated (so rescue cannot re-run it), and the
/// retry then commits the completion with its staged follow-up, once.
async fn a_finalization_waiting_to_reconnect_keeps_its_job_heartbeated(path: Path) {
    let db = test_db().await;
    let ran = Ran::default();
    let config = awa_core::RuntimeConfig {
        // Long enough that the reconnect budget (capped at half of it) is not the limit.
        heartbeat_staleness: Duration::from_secs(20),
        ..config(path, fast_config())
    };
    let client = staging_client(&db, path, config, &ran);
    let a = insert(&db.pool, stage_a(7, "ok")).await.expect("insert");
    // The first try loses its connection; the retry waits at the hold before reconnecting.
    seams::arm(Point::BeforeCommit, Some(a.id), 1);
    seams::hold_reconnect(a.id);
    client.start().await.expect("start");
    eventually("the finalization to wait for a connection", T, || async {
        seams::is_reconnect_held(a.id).then_some(())
    })
    .await;
    let before = get_job(&db.pool, a.id).await.expect("get");
    assert_eq!(before.state, JobState::Running);
    assert_eq!(client.in_flight().await, 1, "the job stays in flight");
    let beat = before.heartbeat_at;
    eventually("a heartbeat while the finalization waits", T, || async {
        let now = get_job(&db.pool, a.id).await.ok()?;
        (now.heartbeat_at > beat && seams::is_reconnect_held(a.id)).then_some(())
    })
    .await;
    seams::release_reconnect(a.id);
    wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        b_items(&db).await,
        vec![7],
        "the retry inserted the follow-up once"
    );
    assert_eq!(ran.lock().expect("lock").len(), 1, "the handler ran once");
}

async fn a_rejected_insert_rolls_the_whole_completion_back(path: Path) {
    let db = test_db().await;
    // No maintenance: nothing rescues what the failed completion leaves running.
    let ran = Ran::default();
    let client = staging_client(&db, path, quiet_config(), &ran);
    reject_inserts_of(&db, "stage_b").await;

    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    client.start().await.expect("start");
    eventually("the handler to run", T, || {
        let seen = ran.lock().expect("lock").contains(&a.id);
        async move { seen.then_some(()) }
    })
    .await;
    // The attempt is in flight from before its handler runs until its finalization ends.
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    let row = get_job(&db.pool, a.id).await.expect("get");
    assert_eq!(
        (row.state, row.finalized_at),
        (JobState::Running, None),
        "the completion rolled back"
    );
    assert_eq!(count_kind(&db, "stage_b").await, 0);
    assert_eq!(
        count_kind(&db, "notice").await,
        0,
        "the registered spec's insert rolled back too"
    );

    // By hand: finalize_with_retry reports the error; once the trigger is gone the same
    // sealed follow-ups commit with the completion.
    let job = claim_a(&db, stage_a(2, "ok")).await;
    let fin = completion(&job, sealed(&[2]));
    let err = finalize(path, &db.pool, &fin, client.specs())
        .await
        .expect_err("the insert is rejected");
    assert!(
        err.to_string().contains("test trigger rejects stage_b"),
        "{err}"
    );
    assert_eq!(
        get_job(&db.pool, job.id).await.expect("get").state,
        JobState::Running
    );
    sqlx::query("DROP TRIGGER test_reject_insert ON awa.canonical_jobs")
        .execute(&db.pool)
        .await
        .expect("drop trigger");
    assert_eq!(
        finalize(path, &db.pool, &fin, client.specs())
            .await
            .expect("finalize"),
        Finalized::Applied
    );
    assert_eq!(
        get_job(&db.pool, job.id).await.expect("get").state,
        JobState::Completed
    );
    assert_eq!(b_items(&db).await, vec![2]);
    assert_eq!(count_kind(&db, "notice").await, 1);
}

async fn a_unique_violation_on_another_index_rolls_the_completion_back(path: Path) {
    let db = test_db().await;
    let client = staging_client(&db, path, quiet_config(), &Ran::default());
    // An application's own unique index on the follow-up's table: only a conflict on
    // idx_awa_jobs_unique is a duplicate to skip; this one is an error like any other.
    sqlx::query(
        "CREATE UNIQUE INDEX test_item_unique ON awa.canonical_jobs ((args->>'item_id')) \
         WHERE kind = 'stage_b'",
    )
    .execute(&db.pool)
    .await
    .expect("create index");
    // Held by a row without a unique key, so idx_awa_jobs_unique has nothing to say.
    insert(&db.pool, StageB { item_id: 3 })
        .await
        .expect("insert");
    let job = claim_a(&db, stage_a(3, "ok")).await;
    let err = finalize(
        path,
        &db.pool,
        &completion(&job, sealed(&[3])),
        client.specs(),
    )
    .await
    .expect_err("the other unique index rejects the follow-up");
    assert!(err.to_string().contains("test_item_unique"), "{err}");
    let row = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!((row.state, row.finalized_at), (JobState::Running, None));
    assert_eq!(b_items(&db).await, vec![3], "only the row that was there");
    assert_eq!(
        count_kind(&db, "notice").await,
        0,
        "the registered spec's insert rolled back with it"
    );
}

async fn a_lost_acknowledgement_inserts_the_follow_up_once(path: Path) {
    let db = test_db().await;
    let client = staging_client(&db, path, fast_config(), &Ran::default());
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    // The completion commits, then the finalizer sees a broken connection and retries.
    seams::arm(Point::AfterCommit, Some(a.id), 1);
    client.start().await.expect("start");
    wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(seams::hits(Point::AfterCommit, a.id), 1);
    assert_sent(path, a.id);
    assert_eq!(
        b_items(&db).await,
        vec![1],
        "the replay was stale and inserted nothing"
    );
    assert_eq!(count_kind(&db, "notice").await, 1);

    // The same through finalize_with_retry directly: the retry reports the attempt stale.
    let job = claim_a(&db, stage_a(2, "ok")).await;
    seams::arm(Point::AfterCommit, Some(job.id), 1);
    let done = finalize(
        path,
        &db.pool,
        &completion(&job, sealed(&[2])),
        &Specs::default(),
    )
    .await
    .expect("finalize");
    assert_eq!(
        done,
        Finalized::Stale,
        "the retry found the commit already landed"
    );
    assert_eq!(seams::hits(Point::AfterCommit, job.id), 1);
    assert_eq!(
        get_job(&db.pool, job.id).await.expect("get").state,
        JobState::Completed
    );
    assert_eq!(b_items(&db).await, vec![1, 2]);
}

async fn a_failure_before_commit_is_retried_with_the_same_follow_ups(path: Path) {
    let db = test_db().await;
    let client = staging_client(&db, path, fast_config(), &Ran::default());
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    // Two tries fail before COMMIT; the third (the last allowed) commits.
    seams::arm(Point::BeforeCommit, Some(a.id), 2);
    client.start().await.expect("start");
    wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(seams::hits(Point::BeforeCommit, a.id), 2);
    assert_sent(path, a.id);
    assert_eq!(
        b_items(&db).await,
        vec![1],
        "the retries carried the sealed follow-up and inserted it once"
    );
    assert_eq!(count_kind(&db, "notice").await, 1);

    let job = claim_a(&db, stage_a(2, "ok")).await;
    seams::arm(Point::BeforeCommit, Some(job.id), 1);
    let done = finalize(
        path,
        &db.pool,
        &completion(&job, sealed(&[2, 3])),
        &Specs::default(),
    )
    .await
    .expect("finalize");
    assert_eq!(done, Finalized::Applied);
    assert_eq!(seams::hits(Point::BeforeCommit, job.id), 1);
    assert_eq!(b_items(&db).await, vec![1, 2, 3]);
}

async fn a_completion_under_a_superseded_lease_inserts_nothing(path: Path) {
    let db = test_db().await;
    let first = claim_a(&db, stage_a(1, "ok")).await;
    assert_eq!(first.run_lease, 1);
    // Rescue the attempt as if its worker had died, and claim it again (lease 2).
    sqlx::query("UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(first.id)
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
    assert_eq!(rescued, vec![first.id]);
    sqlx::query("UPDATE awa.jobs SET state = 'available' WHERE id = $1")
        .bind(first.id)
        .execute(&db.pool)
        .await
        .expect("promote");
    let mut reclaimed = claim_batch(&db.pool, "default", 1, Duration::from_secs(60))
        .await
        .expect("claim");
    let second = Arc::new(reclaimed.pop().expect("reclaimed"));
    assert_eq!(second.run_lease, 2);
    // The first attempt completes with what it staged: its lease is stale.
    let done = finalize(
        path,
        &db.pool,
        &completion(&first, sealed(&[1001])),
        &Specs::default(),
    )
    .await
    .expect("finalize");
    assert_eq!(done, Finalized::Stale);
    assert_eq!(
        count_kind(&db, "stage_b").await,
        0,
        "the superseded attempt inserted nothing"
    );
    let row = get_job(&db.pool, first.id).await.expect("get");
    assert_eq!(
        (row.state, row.run_lease),
        (JobState::Running, 2),
        "the new attempt is untouched"
    );
    // The current lease completes with its own, different, follow-up.
    let done = finalize(
        path,
        &db.pool,
        &completion(&second, sealed(&[1002])),
        &Specs::default(),
    )
    .await
    .expect("finalize");
    assert_eq!(done, Finalized::Applied);
    assert_eq!(b_items(&db).await, vec![1002]);
}

async fn a_superseded_handler_completing_through_the_runtime_inserts_nothing(path: Path) {
    let db = test_db().await;
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let (g, e) = (gate.clone(), entered.clone());
    let client = base(&db, path)
        .queue("default", QueueConfig::new(1))
        .config(config(
            path,
            awa_core::RuntimeConfig {
                // No heartbeat between the test aging the heartbeat and rescuing the job.
                heartbeat_interval: Duration::from_secs(3600),
                ..quiet_config()
            },
        ))
        .register::<StageA, _, _>(move |_args, ctx| {
            let follow_ups = ctx.follow_ups();
            let attempt = i64::from(ctx.job().attempt);
            let (g, e) = (g.clone(), e.clone());
            async move {
                follow_ups.enqueue_on_completion(StageB {
                    item_id: 1000 + attempt,
                })?;
                e.notify_one();
                g.notified().await;
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    client.start().await.expect("start");
    tokio::time::timeout(T, entered.notified())
        .await
        .expect("the handler started");
    sqlx::query("UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = $1")
        .bind(a.id)
        .execute(&db.pool)
        .await
        .expect("age heartbeat");
    assert_eq!(
        rescue_stale(
            &db.pool,
            RescueKind::StaleHeartbeat,
            Duration::from_secs(60)
        )
        .await
        .expect("rescue"),
        vec![a.id]
    );
    // Make the job available on another queue so that this client cannot claim it again.
    sqlx::query("UPDATE awa.jobs SET state = 'available', queue = 'elsewhere' WHERE id = $1")
        .bind(a.id)
        .execute(&db.pool)
        .await
        .expect("promote");
    let mut reclaimed = claim_batch(&db.pool, "elsewhere", 1, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(reclaimed.pop().expect("reclaimed").run_lease, 2);
    // The first attempt now returns Completed with B(1001) staged: its lease is stale.
    gate.notify_one();
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        count_kind(&db, "stage_b").await,
        0,
        "the superseded attempt inserted nothing"
    );
    let row = get_job(&db.pool, a.id).await.expect("get");
    assert_eq!(
        (row.state, row.run_lease, row.attempt),
        (JobState::Running, 2, 2)
    );
}

/// Path selection: with `batch_follow_ups` on, every completion joins the batch; off, only a
/// job that staged nothing does and one that staged takes the per-job transaction (ADR-046,
/// "Path selection is per job"). Either way a try that fails before its commit is retried
/// with the same sealed follow-ups.
async fn each_completion_takes_the_path_its_client_is_configured_for(path: Path) {
    let db = test_db().await;
    // No registered Completed spec: only staging and the setting decide the path.
    let client = base(&db, path)
        .register::<StageA, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            async move {
                if args.mode == "stage" {
                    follow_ups.enqueue_on_completion(StageB { item_id: args.n })?;
                }
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let quiet = insert(&db.pool, stage_a(1, "none")).await.expect("insert");
    let staging = insert(&db.pool, stage_a(2, "stage")).await.expect("insert");
    seams::arm(Point::BeforeCommit, Some(staging.id), 1);
    let (batched_before, per_job_before) = (
        metric(&metrics::JOBS_COMPLETED_BATCHED),
        metric(&metrics::JOBS_FINALIZED_PER_JOB),
    );
    client.start().await.expect("start");
    wait_for_state(&db, quiet.id, &[JobState::Completed], T).await;
    wait_for_state(&db, staging.id, &[JobState::Completed], T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        seams::sent_on(quiet.id),
        vec![Path::Batched],
        "a job that staged nothing is batched"
    );
    assert_eq!(seams::sent_on(staging.id), vec![path]);
    assert_eq!(
        seams::hits(Point::BeforeCommit, staging.id),
        1,
        "the failed try was retried"
    );
    assert!(metric(&metrics::JOBS_COMPLETED_BATCHED) > batched_before);
    if path == Path::PerJob {
        assert!(metric(&metrics::JOBS_FINALIZED_PER_JOB) > per_job_before);
    }
    assert_eq!(b_items(&db).await, vec![2], "inserted once");
}

// ---------------------------------------------------------------------------------------------
// The work_one harness
// ---------------------------------------------------------------------------------------------

async fn work_one_inserts_with_completion_applies_poisoning_and_discards_otherwise(path: Path) {
    let db = test_db().await;
    // Not started: only its specs are used.
    let client = Client::builder(db.pool.clone())
        .on_completed_enqueue::<StageA, Notice, _>(|a| notice(a.n, "completed"))
        .on_exhausted_enqueue::<StageA, Notice, _>(|a| notice(a.n, "exhausted"))
        .build()
        .expect("build");
    let h = handler(|ctx: Arc<JobContext>| {
        let follow_ups = ctx.follow_ups();
        let args: StageA = serde_json::from_value(ctx.job().args.clone()).expect("args");
        async move {
            follow_ups.enqueue_on_completion(
                EnqueueRequest::new(StageB { item_id: args.n })
                    .queue("b_queue")
                    .unique(UniqueOpts::default()),
            )?;
            match args.mode.as_str() {
                "poison" => {
                    let _ = follow_ups.enqueue_on_completion(
                        EnqueueRequest::new(StageB { item_id: -1 }).max_attempts(0),
                    );
                    Ok(JobResult::Completed)
                }
                "retry_after" => Ok(JobResult::RetryAfter(Duration::from_secs(3600))),
                "snooze" => Ok(JobResult::Snooze(Duration::from_secs(3600))),
                "cancel" => Ok(JobResult::Cancel("enough".into())),
                "terminal" => Err(JobError::Terminal("bad".into())),
                "retryable" => Err(JobError::Retryable("flaky".into())),
                "panic" => panic!("harness handler exploded"),
                _ => Ok(JobResult::Completed),
            }
        }
    });
    let cases = [
        ("ok", "completed"),
        ("poison", "failed"),
        ("retry_after", "retryable"),
        ("snooze", "snoozed"),
        ("cancel", "cancelled"),
        ("terminal", "failed"),
        ("retryable", "retryable"),
        ("panic", "retryable"),
    ];
    let mut results = BTreeMap::new();
    for (n, (mode, outcome)) in cases.iter().enumerate() {
        insert(&db.pool, stage_a(n as i64, mode))
            .await
            .expect("insert");
        let r = work(path, &db.pool, "default", h.clone(), client.specs())
            .await
            .expect("work_one");
        assert_eq!(r.outcome, *outcome, "{mode}: {r:?}");
        results.insert(*mode, r);
    }
    assert_eq!(
        work(path, &db.pool, "default", h.clone(), client.specs())
            .await
            .expect("work_one")
            .outcome,
        "no_job"
    );

    let ok = results["ok"].job.clone().expect("stored job");
    let rows = bs(&db).await;
    assert_eq!(
        rows.iter().map(|(_, b)| b.item_id).collect::<Vec<_>>(),
        vec![0],
        "only the completed job's follow-up"
    );
    assert_eq!(
        Some(rows[0].0.created_at),
        ok.finalized_at,
        "inserted in the completion's transaction"
    );
    let poisoned = &results["poison"];
    assert!(
        poisoned
            .error
            .as_deref()
            .is_some_and(|e| e.contains("staging failed")),
        "{poisoned:?}"
    );
    assert_eq!(
        poisoned.job.as_ref().map(|j| j.state),
        Some(JobState::Failed)
    );
    let mut events: Vec<Notice> = notices(&db).await.into_iter().map(|(_, n)| n).collect();
    events.sort();
    assert_eq!(
        events,
        vec![
            Notice {
                from: 0,
                event: "completed".into()
            },
            Notice {
                from: 1,
                event: "exhausted".into()
            },
            Notice {
                from: 5,
                event: "exhausted".into()
            },
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Trace context
// ---------------------------------------------------------------------------------------------

mod trace {
    //! A minimal subscriber that records spans (with their parents) and events (with the span
    //! current when they fired), for one thread only: the test runs on a current-thread runtime,
    //! where every task of the test runs on its thread.
    //!
    //! It is not installed with `set_default`. A scoped dispatcher races with tests on other
    //! threads: one that registers a callsite while the scoped dispatcher is being added caches
    //! that callsite as disabled for good (`rebuild_interest_cache` narrows the window but cannot
    //! close it), and the event is then never seen. Instead one process-wide [`Global`]
    //! subscriber is installed once; it answers "sometimes" for every callsite, so `enabled` is
    //! asked at each event, and it forwards to the recorder [`record`] put on the current thread.
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::fmt::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, Once};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata, Subscriber};

    thread_local! {
        static CURRENT: RefCell<Option<Recorder>> = const { RefCell::new(None) };
    }

    /// Stops this thread's recording when dropped.
    pub struct Recording(());

    impl Drop for Recording {
        fn drop(&mut self) {
            CURRENT.with(|c| c.borrow_mut().take());
        }
    }

    /// Records this thread's spans and events into `recorder` until the guard is dropped.
    pub fn record(recorder: Recorder) -> Recording {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            tracing::subscriber::set_global_default(Global)
                .expect("no other global subscriber in this test binary");
        });
        CURRENT.with(|c| *c.borrow_mut() = Some(recorder));
        Recording(())
    }

    fn current() -> Option<Recorder> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// The process-wide subscriber: every call goes to the current thread's recorder, if any.
    struct Global;

    impl Subscriber for Global {
        fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
            Interest::sometimes()
        }
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            CURRENT.with(|c| c.borrow().is_some())
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            match current() {
                Some(r) => r.new_span(attrs),
                // Unreachable in practice (`enabled` said no), but an id must be returned.
                None => Id::from_u64(u64::MAX),
            }
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            if let Some(r) = current() {
                r.event(event)
            }
        }
        fn enter(&self, id: &Id) {
            if let Some(r) = current() {
                r.enter(id)
            }
        }
        fn exit(&self, id: &Id) {
            if let Some(r) = current() {
                r.exit(id)
            }
        }
        fn current_span(&self) -> tracing_core::span::Current {
            match current() {
                Some(r) => r.current_span(),
                None => tracing_core::span::Current::none(),
            }
        }
    }

    #[derive(Debug, Clone)]
    pub struct SpanRec {
        pub id: u64,
        pub name: &'static str,
        pub parent: Option<u64>,
        pub fields: String,
    }

    #[derive(Debug, Clone)]
    pub struct EventRec {
        pub level: tracing::Level,
        pub target: String,
        pub fields: String,
        pub current: Option<u64>,
    }

    #[derive(Default)]
    pub struct Inner {
        next: AtomicU64,
        meta: Mutex<HashMap<u64, &'static Metadata<'static>>>,
        pub spans: Mutex<Vec<SpanRec>>,
        pub events: Mutex<Vec<EventRec>>,
        stack: Mutex<Vec<u64>>,
    }

    #[derive(Clone, Default)]
    pub struct Recorder(pub Arc<Inner>);

    struct Text<'a>(&'a mut String);
    impl Visit for Text<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, "{}={:?} ", field.name(), value);
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            let _ = write!(self.0, "{}={} ", field.name(), value);
        }
    }

    impl Inner {
        fn top(&self) -> Option<u64> {
            self.stack.lock().expect("lock").last().copied()
        }
    }

    impl Subscriber for Recorder {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            let id = self.0.next.fetch_add(1, Ordering::SeqCst) + 1;
            let parent = match attrs.parent() {
                Some(p) => Some(p.into_u64()),
                None if attrs.is_contextual() => self.0.top(),
                None => None,
            };
            let mut fields = String::new();
            attrs.record(&mut Text(&mut fields));
            self.0
                .meta
                .lock()
                .expect("lock")
                .insert(id, attrs.metadata());
            self.0.spans.lock().expect("lock").push(SpanRec {
                id,
                name: attrs.metadata().name(),
                parent,
                fields,
            });
            Id::from_u64(id)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let current = match event.parent() {
                Some(p) => Some(p.into_u64()),
                None if event.is_contextual() => self.0.top(),
                None => None,
            };
            let mut fields = String::new();
            event.record(&mut Text(&mut fields));
            self.0.events.lock().expect("lock").push(EventRec {
                level: *event.metadata().level(),
                target: event.metadata().target().to_string(),
                fields,
                current,
            });
        }
        fn enter(&self, id: &Id) {
            self.0.stack.lock().expect("lock").push(id.into_u64());
        }
        fn exit(&self, id: &Id) {
            let mut stack = self.0.stack.lock().expect("lock");
            if let Some(pos) = stack.iter().rposition(|s| *s == id.into_u64()) {
                stack.remove(pos);
            }
        }
        fn current_span(&self) -> tracing_core::span::Current {
            match self.0.top() {
                Some(id) => match self.0.meta.lock().expect("lock").get(&id) {
                    Some(meta) => tracing_core::span::Current::new(Id::from_u64(id), meta),
                    None => tracing_core::span::Current::none(),
                },
                None => tracing_core::span::Current::none(),
            }
        }
    }
}

async fn the_follow_up_span_is_a_child_of_the_span_current_when_staged(path: Path) {
    let db = test_db().await;
    let a = insert(&db.pool, stage_a(3, "ok")).await.expect("insert");
    // Make the follow-up's insert wait on the server, so other tasks run meanwhile.
    sqlx::query(
        "CREATE FUNCTION awa.test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.kind = 'stage_b' THEN PERFORM pg_sleep(0.05); END IF; RETURN NEW; END $$",
    )
    .execute(&db.pool)
    .await
    .expect("create function");
    sqlx::query("CREATE TRIGGER test_slow_insert BEFORE INSERT ON awa.canonical_jobs FOR EACH ROW EXECUTE FUNCTION awa.test_slow_insert()")
        .execute(&db.pool)
        .await
        .expect("create trigger");
    let recorder = trace::Recorder::default();
    let rec = recorder.0.clone();
    let guard = trace::record(recorder);
    // Unrelated work on the same thread while the completion runs: none of it may be
    // attributed to the follow-up's span.
    let ticker = tokio::spawn(async {
        loop {
            tracing::info!(target: "unrelated", "tick");
            tokio::task::yield_now().await;
        }
    });
    let h = handler(|ctx: Arc<JobContext>| {
        let follow_ups = ctx.follow_ups();
        async move {
            let span = tracing::info_span!("resolve_and_stage");
            span.in_scope(|| {
                follow_ups.enqueue_on_completion(EnqueueRequest::new(StageB { item_id: 42 }))
            })?;
            Ok(JobResult::Completed)
        }
    });
    let result = work(path, &db.pool, "default", h, &Specs::default())
        .await
        .expect("work_one");
    ticker.abort();
    drop(guard);
    assert!(result.is_completed(), "{result:?}");
    let b = bs(&db).await.pop().expect("B inserted").0;

    let spans = rec.spans.lock().expect("lock").clone();
    let events = rec.events.lock().expect("lock").clone();
    let staged = spans
        .iter()
        .find(|s| s.name == "resolve_and_stage")
        .expect("the staging span");
    let enqueue: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "awa.enqueue_follow_up")
        .collect();
    assert_eq!(enqueue.len(), 1, "{spans:?}");
    let enqueue = enqueue[0];
    assert_eq!(
        enqueue.parent,
        Some(staged.id),
        "the insert's span is a child of the span current when staged"
    );
    assert!(
        enqueue.fields.contains(&format!("trigger_job_id={}", a.id)),
        "{}",
        enqueue.fields
    );

    // The completion and the insert are one statement (per job) or one insert statement
    // after the batch's guarded completion (batched), sent once.
    let insert_statement = match path {
        Path::PerJob => "awa.complete_with_follow_ups(",
        Path::Batched => "ON CONFLICT (unique_key)",
    };
    let statements: Vec<_> = events
        .iter()
        .filter(|e| e.target.starts_with("sqlx::query") && e.fields.contains(insert_statement))
        .collect();
    assert_eq!(
        statements.len(),
        1,
        "one completion statement: {statements:?}"
    );
    assert!(
        events.iter().any(
            |e| e.current == Some(enqueue.id) && e.fields.contains(&format!("job_id={}", b.id))
        ),
        "the follow-up was recorded inside its span"
    );

    // Unrelated work that ran on the same thread while the completion waited on the database
    // is not attributed to the follow-up's span.
    let ticks: Vec<_> = events.iter().filter(|e| e.target == "unrelated").collect();
    assert!(!ticks.is_empty(), "the ticker ran");
    let misattributed = ticks
        .iter()
        .filter(|e| e.current == Some(enqueue.id))
        .count();
    assert_eq!(
        misattributed, 0,
        "unrelated events were attributed to the follow-up's span"
    );
}

async fn logs_name_kinds_and_job_ids_but_never_args(path: Path) {
    let db = test_db().await;
    let recorder = trace::Recorder::default();
    let rec = recorder.0.clone();
    let guard = trace::record(recorder);
    let h = handler(|ctx: Arc<JobContext>| {
        let follow_ups = ctx.follow_ups();
        let args: StageA = serde_json::from_value(ctx.job().args.clone()).expect("args");
        async move {
            let labeled = |label: String| {
                EnqueueRequest::new(Labeled { label })
                    .queue("sink")
                    .unique(UniqueOpts::default())
            };
            follow_ups.enqueue_on_completion(labeled(format!("{MARKER} staged")))?;
            if args.mode.starts_with("poison") {
                let _ = follow_ups
                    .enqueue_on_completion(labeled(format!("{MARKER} invalid")).priority(0));
            } else {
                // An existing row holds this key: skipped.
                follow_ups.enqueue_on_completion(labeled(format!("{MARKER} taken")))?;
            }
            Ok(JobResult::Completed)
        }
    });
    let taken = insert_with(
        &db.pool,
        EnqueueRequest::new(Labeled {
            label: format!("{MARKER} taken"),
        })
        .queue("sink")
        .unique(UniqueOpts::default()),
    )
    .await
    .expect("insert");
    let ok = insert(&db.pool, stage_a(1, &format!("ok {MARKER}")))
        .await
        .expect("insert");
    let ok_run = work(path, &db.pool, "default", h.clone(), &Specs::default())
        .await
        .expect("work_one");
    let poisoned = insert(&db.pool, stage_a(2, &format!("poison {MARKER}")))
        .await
        .expect("insert");
    let poison_run = work(path, &db.pool, "default", h, &Specs::default())
        .await
        .expect("work_one");
    drop(guard);
    assert_eq!(
        (ok_run.outcome.as_str(), poison_run.outcome.as_str()),
        ("completed", "failed")
    );
    let labeled = jobs_of_kind(&db, "labeled").await;
    assert_eq!(labeled.len(), 2);
    let inserted = labeled
        .iter()
        .find(|j| j.id != taken.id)
        .expect("the staged follow-up");

    let events = rec.events.lock().expect("lock").clone();
    let has = |level: tracing::Level, parts: &[String]| {
        events
            .iter()
            .any(|e| e.level == level && parts.iter().all(|p| e.fields.contains(p.as_str())))
    };
    assert!(
        has(
            tracing::Level::DEBUG,
            &[
                "follow-up inserted".into(),
                format!("trigger_job_id={} ", ok.id),
                "kind=labeled ".into(),
                format!("job_id={} ", inserted.id),
            ]
        ),
        "the insert is logged with kinds and ids"
    );
    assert!(
        has(
            tracing::Level::DEBUG,
            &[
                "follow-up skipped".into(),
                format!("trigger_job_id={} ", ok.id),
                "kind=labeled ".into(),
            ]
        ),
        "the skip is logged with kinds and ids"
    );
    assert!(
        has(
            tracing::Level::WARN,
            &[
                "poisoned".into(),
                format!("job_id={} ", poisoned.id),
                "kind=stage_a ".into()
            ]
        ),
        "the poisoned attempt is logged"
    );
    let leaked: Vec<_> = events
        .iter()
        .filter(|e| e.fields.contains(MARKER))
        .collect();
    assert!(
        leaked.is_empty(),
        "args reached a log: {:?}",
        leaked.first()
    );
}

// ---------------------------------------------------------------------------------------------
// Staging validates what the insert would reject; shutdown before finalization
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kind200 {
    x: String,
}
impl JobArgs for Kind200 {
    fn kind() -> String {
        "k".repeat(200)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kind201 {
    x: String,
}
impl JobArgs for Kind201 {
    fn kind() -> String {
        "k".repeat(201)
    }
}

fn year(y: i32) -> chrono::DateTime<chrono::Utc> {
    use chrono::TimeZone;
    chrono::Utc
        .with_ymd_and_hms(y, 12, 31, 23, 59, 59)
        .single()
        .expect("a valid date")
}

#[test]
fn staging_refuses_every_request_the_database_would_reject() {
    let b = || EnqueueRequest::new(StageB { item_id: 1 });
    let l = |label: &str| {
        EnqueueRequest::new(Labeled {
            label: label.into(),
        })
    };
    let long = |n: usize| "q".repeat(n);
    let cases: Vec<(&str, Result<(), StageError>)> = vec![
        (
            "priority 0",
            FollowUps::new().enqueue_on_completion(b().priority(0)),
        ),
        (
            "priority 5",
            FollowUps::new().enqueue_on_completion(b().priority(5)),
        ),
        (
            "max_attempts 0",
            FollowUps::new().enqueue_on_completion(b().max_attempts(0)),
        ),
        (
            "max_attempts 1001",
            FollowUps::new().enqueue_on_completion(b().max_attempts(1001)),
        ),
        (
            "empty queue",
            FollowUps::new().enqueue_on_completion(b().queue("")),
        ),
        (
            "queue of 201",
            FollowUps::new().enqueue_on_completion(b().queue(long(201))),
        ),
        (
            "queue with NUL",
            FollowUps::new().enqueue_on_completion(b().queue("a\0b")),
        ),
        (
            "kind of 201",
            FollowUps::new().enqueue_on_completion(Kind201 { x: "x".into() }),
        ),
        (
            "empty kind",
            FollowUps::new().enqueue_untyped("", json!({}), &Default::default()),
        ),
        (
            "21 tags",
            FollowUps::new()
                .enqueue_on_completion(b().tags((0..21).map(|i| format!("t{i}")).collect())),
        ),
        (
            "tag of 201",
            FollowUps::new().enqueue_on_completion(b().tags(vec![long(201)])),
        ),
        (
            "tag with NUL",
            FollowUps::new().enqueue_on_completion(b().tags(vec!["a\0".into()])),
        ),
        (
            "NUL in args",
            FollowUps::new().enqueue_on_completion(l("a\0b")),
        ),
        (
            "NUL in an args key",
            FollowUps::new().enqueue_untyped("labeled", json!({"a\u{0}": 1}), &Default::default()),
        ),
        (
            "NUL in metadata",
            FollowUps::new().enqueue_on_completion(b().metadata(json!({"k": ["ok", "x\0"]}))),
        ),
        (
            "metadata not an object",
            FollowUps::new().enqueue_on_completion(b().metadata(json!([1]))),
        ),
        (
            "run_at year 10000",
            FollowUps::new().enqueue_on_completion(b().run_at(year(10000))),
        ),
        (
            "run_at year 0",
            FollowUps::new().enqueue_on_completion(b().run_at(year(0))),
        ),
        (
            "ordering key of 201",
            FollowUps::new().enqueue_on_completion(b().with_opts(awa_core::InsertOpts {
                ordering_key: Some(long(201)),
                ..Default::default()
            })),
        ),
    ];
    for (what, result) in cases {
        assert!(
            matches!(result, Err(StageError::Invalid(_))),
            "{what}: {result:?}"
        );
    }
    // Each refusal poisons its attempt.
    let f = FollowUps::new();
    let _ = f.enqueue_on_completion(b().priority(0));
    assert!(matches!(f.seal().poison, Some(StageError::Invalid(_))));
}

async fn requests_at_every_limit_stage_and_commit(path: Path) {
    let db = test_db().await;
    let queue = "é".repeat(200); // 200 characters, 400 bytes
    let tags: Vec<String> = (0..20).map(|i| format!("{i:0>200}")).collect();
    let q = queue.clone();
    let t = tags.clone();
    let h = handler(move |ctx: Arc<JobContext>| {
        let follow_ups = ctx.follow_ups();
        let (q, t) = (q.clone(), t.clone());
        async move {
            follow_ups.enqueue_on_completion(
                EnqueueRequest::new(Kind200 { x: "edge".into() })
                    .queue(q.clone())
                    .priority(4)
                    .max_attempts(1000)
                    .tags(t)
                    .run_at(year(9999))
                    .unique(UniqueOpts::default()),
            )?;
            let mut now = EnqueueRequest::new(Kind200 { x: "now".into() })
                .queue(q)
                .priority(1)
                .max_attempts(1);
            now.opts.ordering_key = Some("o".repeat(200));
            follow_ups.enqueue_on_completion(now)?;
            Ok(JobResult::Completed)
        }
    });
    insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    let r = work(path, &db.pool, "default", h, &Specs::default())
        .await
        .expect("the completion commits");
    assert!(r.is_completed(), "{r:?}");
    let rows = jobs_of_kind(&db, &"k".repeat(200)).await;
    assert_eq!(rows.len(), 2);
    let (edge, now) = (&rows[0], &rows[1]);
    assert_eq!(
        (edge.queue.as_str(), edge.priority, edge.max_attempts),
        (queue.as_str(), 4, 1000)
    );
    assert_eq!(
        (edge.tags.clone(), edge.state, edge.run_at),
        (tags, JobState::Scheduled, year(9999))
    );
    assert!(edge.unique_key.is_some());
    assert_eq!(
        (now.priority, now.max_attempts, now.state),
        (1, 1, JobState::Available)
    );
    assert_eq!(
        now.ordering_key.as_deref().map(|k| k.chars().count()),
        Some(200)
    );
}

async fn a_handler_cancelled_by_shutdown_leaves_nothing_and_the_rescued_rerun_inserts_its_own(
    path: Path,
) {
    let db = test_db().await;
    let started = Arc::new(Notify::new());
    let make = |started: Arc<Notify>| {
        base(&db, path)
            .register::<StageA, _, _>(move |_args, ctx| {
                let follow_ups = ctx.follow_ups();
                let attempt = i64::from(ctx.job().attempt);
                let started = started.clone();
                async move {
                    follow_ups.enqueue_on_completion(
                        EnqueueRequest::new(StageB { item_id: attempt })
                            .unique(UniqueOpts::default()),
                    )?;
                    if attempt == 1 {
                        started.notify_one();
                        // Still running when shutdown gives up on it.
                        std::future::pending::<()>().await;
                    }
                    Ok(JobResult::Completed)
                }
            })
            .build()
            .expect("build")
    };
    let first = make(started.clone());
    let a = insert(&db.pool, stage_a(1, "ok")).await.expect("insert");
    first.start().await.expect("start");
    tokio::time::timeout(T, started.notified())
        .await
        .expect("the handler started");
    first.shutdown(Duration::from_millis(100)).await;
    let row = get_job(&db.pool, a.id).await.expect("get");
    assert_eq!(
        (row.state, row.attempt),
        (JobState::Running, 1),
        "abandoned, not finalized"
    );
    assert_eq!(count_kind(&db, "stage_b").await, 0);
    // Another worker rescues the stale attempt and runs it again.
    let second = make(Arc::new(Notify::new()));
    second.start().await.expect("start");
    let done = wait_for_state(&db, a.id, &[JobState::Completed], T).await;
    second.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.attempt, 2);
    assert!(
        done.errors[0].error.contains("heartbeat"),
        "{:?}",
        done.errors
    );
    assert_eq!(
        b_items(&db).await,
        vec![2],
        "only the attempt that completed inserted its follow-up"
    );
}

// ---------------------------------------------------------------------------------------------
// The batched path with follow-ups (issue 17): one transaction for many completions
// ---------------------------------------------------------------------------------------------

/// A sealed buffer holding one unique B, with `metadata`.
fn sealed_with(item_id: i64, metadata: serde_json::Value) -> SealedFollowUps {
    let f = FollowUps::new();
    f.enqueue_on_completion(
        EnqueueRequest::new(StageB { item_id })
            .unique(UniqueOpts::default())
            .metadata(metadata),
    )
    .expect("stage");
    f.seal()
}

/// One batch: the rows whose guard matched complete with their follow-ups, in batch order and
/// per job registered spec first, then the staged ones in staging order; a superseded
/// attempt in the same batch is stale and inserts nothing; of two jobs staging one key the
/// first in the batch inserts it and the second commits against it.
#[tokio::test]
async fn a_batch_inserts_the_follow_ups_of_exactly_the_rows_that_matched_in_order() {
    let db = test_db().await;
    let client = Client::builder(db.pool.clone())
        .on_completed_enqueue::<StageA, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    let first = claim_a(&db, stage_a(1, "ok")).await;
    let second = claim_a(&db, stage_a(2, "ok")).await;
    let plain = claim_a(&db, stage_a(3, "none")).await;
    let same_key = claim_a(&db, stage_a(4, "ok")).await;
    let mut superseded = (*claim_a(&db, stage_a(5, "ok")).await).clone();
    superseded.run_lease -= 1;
    let superseded = Arc::new(superseded);
    let fins = vec![
        completion(&first, sealed(&[10, 11])),
        completion(&superseded, sealed(&[50])),
        completion(&second, sealed_with(20, json!({"from": 2}))),
        completion(&plain, SealedFollowUps::default()),
        completion(&same_key, sealed_with(20, json!({"from": 4}))),
    ];
    let inserted_before = metric(&metrics::FOLLOW_UPS_INSERTED);
    let results = complete_batch_with_follow_ups(&db.pool, &fins, client.specs())
        .await
        .expect("the batch ran");
    let results: Vec<Finalized> = results.into_iter().map(|r| r.expect("finalized")).collect();
    use Finalized::{Applied, Stale};
    assert_eq!(results, vec![Applied, Stale, Applied, Applied, Applied]);
    let row = get_job(&db.pool, superseded.id).await.expect("get");
    assert_eq!(row.state, JobState::Running, "the newer lease is untouched");

    let done = get_job(&db.pool, first.id).await.expect("get");
    let rows = bs(&db).await;
    assert_eq!(
        rows.iter().map(|(_, b)| b.item_id).collect::<Vec<_>>(),
        vec![10, 11, 20],
        "nothing for the superseded attempt, one B for the shared key"
    );
    assert_eq!(
        rows[2].0.metadata,
        json!({"from": 2}),
        "the first in the batch won"
    );
    assert!(rows
        .iter()
        .all(|(b, _)| Some(b.created_at) == done.finalized_at));
    // Registered specs of every matched job (none for the superseded one), each before the
    // job's staged follow-ups, jobs in batch order.
    let mut ids: Vec<(i64, &str)> = notices(&db)
        .await
        .into_iter()
        .map(|(j, n)| (j.id, if n.from == 1 { "spec 1" } else { "spec" }))
        .collect();
    assert_eq!(ids.len(), 4, "specs of jobs 1, 2, 3 and 4: {ids:?}");
    ids.extend(
        rows.iter()
            .map(|(j, b)| (j.id, if b.item_id < 20 { "b 1" } else { "b 2" })),
    );
    ids.sort();
    let order: Vec<&str> = ids.iter().map(|(_, what)| *what).collect();
    assert_eq!(
        order,
        vec!["spec 1", "b 1", "b 1", "spec", "b 2", "spec", "spec"],
        "per job spec first, then staged; jobs in batch order"
    );
    assert!(metric(&metrics::FOLLOW_UPS_INSERTED) - inserted_before >= 7);
}

/// A lost acknowledgement of a batch replays as stale: every follow-up is inserted once.
#[tokio::test]
async fn a_batch_whose_acknowledgement_was_lost_replays_as_stale() {
    let db = test_db().await;
    let a = claim_a(&db, stage_a(1, "ok")).await;
    let b = claim_a(&db, stage_a(2, "ok")).await;
    seams::arm(Point::AfterCommit, Some(b.id), 1);
    let fins = vec![completion(&a, sealed(&[1])), completion(&b, sealed(&[2]))];
    let results = complete_batch_with_follow_ups(&db.pool, &fins, &Specs::default())
        .await
        .expect("the batch ran");
    assert_eq!(seams::hits(Point::AfterCommit, b.id), 1);
    for r in results {
        assert_eq!(
            r.expect("finalized"),
            Finalized::Stale,
            "the retry found the commit"
        );
    }
    for id in [a.id, b.id] {
        assert_eq!(
            get_job(&db.pool, id).await.expect("get").state,
            JobState::Completed
        );
    }
    assert_eq!(b_items(&db).await, vec![1, 2], "inserted once each");
}

/// A non-duplicate insert error rolls the whole batch back; each job is then finalized alone,
/// so only the job whose follow-up is rejected stays running (until rescue) and the others
/// complete with theirs.
#[tokio::test]
async fn a_rejected_insert_sends_each_job_of_the_batch_down_the_per_job_path() {
    let db = test_db().await;
    reject_inserts_of(&db, "labeled").await;
    let good = claim_a(&db, stage_a(1, "ok")).await;
    let bad = claim_a(&db, stage_a(2, "ok")).await;
    let plain = claim_a(&db, stage_a(3, "none")).await;
    let rejected = FollowUps::new();
    rejected
        .enqueue_on_completion(Labeled { label: "x".into() })
        .expect("stage");
    let fins = vec![
        completion(&good, sealed(&[1])),
        completion(&bad, rejected.seal()),
        completion(&plain, SealedFollowUps::default()),
    ];
    let per_job_before = metric(&metrics::JOBS_FINALIZED_PER_JOB);
    let results = complete_batch_with_follow_ups(&db.pool, &fins, &Specs::default())
        .await
        .expect("the batch ran");
    let [good_r, bad_r, plain_r] = <[_; 3]>::try_from(results).expect("three results");
    assert_eq!(good_r.expect("good"), Finalized::Applied);
    assert_eq!(plain_r.expect("plain"), Finalized::Applied);
    let err = bad_r.expect_err("the rejected follow-up fails its own completion");
    assert!(
        err.to_string().contains("test trigger rejects labeled"),
        "{err}"
    );
    assert!(metric(&metrics::JOBS_FINALIZED_PER_JOB) - per_job_before >= 2);
    let row = get_job(&db.pool, bad.id).await.expect("get");
    assert_eq!((row.state, row.finalized_at), (JobState::Running, None));
    assert_eq!(b_items(&db).await, vec![1]);
    assert_eq!(count_kind(&db, "labeled").await, 0);

    // Through the runtime: the job whose batch failed was sent on to the per-job path.
    let client = base(&db, Path::Batched)
        .config(config(Path::Batched, quiet_config()))
        .register::<StageA, _, _>(|args, ctx| {
            let follow_ups = ctx.follow_ups();
            async move {
                follow_ups.enqueue_on_completion(Labeled { label: args.mode })?;
                Ok(JobResult::Completed)
            }
        })
        .build()
        .expect("build");
    let a = insert(&db.pool, stage_a(9, "rejected"))
        .await
        .expect("insert");
    client.start().await.expect("start");
    eventually("the batch to fall back", T, || async {
        (seams::sent_on(a.id) == vec![Path::Batched, Path::PerJob]).then_some(())
    })
    .await;
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        get_job(&db.pool, a.id).await.expect("get").state,
        JobState::Running
    );
}

/// Two batches committing at once with follow-ups of one key: ON CONFLICT waits for the
/// other transaction and skips, so exactly one B exists and both completions commit.
#[tokio::test]
async fn concurrent_batches_staging_one_key_insert_it_once() {
    let db = test_db().await;
    for round in 0..5 {
        let a = claim_a(&db, stage_a(2 * round, "ok")).await;
        let b = claim_a(&db, stage_a(2 * round + 1, "ok")).await;
        let fa = vec![completion(&a, sealed(&[100 + round]))];
        let fb = vec![completion(&b, sealed(&[100 + round]))];
        let specs = Specs::default();
        let (ra, rb) = tokio::join!(
            complete_batch_with_follow_ups(&db.pool, &fa, &specs),
            complete_batch_with_follow_ups(&db.pool, &fb, &specs)
        );
        for r in [ra, rb] {
            let r = r.expect("the batch ran").pop().expect("one result");
            assert_eq!(r.expect("finalized"), Finalized::Applied);
        }
    }
    assert_eq!(b_items(&db).await, vec![100, 101, 102, 103, 104]);
}

on_both_paths!(
    the_pipeline_example_runs_one_b_per_distinct_item,
    deduplication_uses_the_follow_ups_own_key_and_keeps_its_other_options,
    a_worker_stages_through_its_context,
    fan_out_and_a_registered_spec_commit_in_one_completion_spec_first,
    staged_follow_ups_are_discarded_on_every_outcome_but_completed,
    follow_ups_staged_around_an_in_handler_wait_are_inserted_when_the_handler_completes,
    complete_external_during_an_in_handler_wait_discards_the_staged_follow_ups,
    an_abandoned_attempt_leaves_nothing_and_only_the_completing_attempt_inserts,
    a_swallowed_staging_error_fails_the_attempt,
    staging_after_the_handler_returned_is_refused,
    a_stage_from_a_spawned_task_after_return_is_sealed_every_time,
    work_one_seals_when_the_handler_returns,
    a_finalization_waiting_to_reconnect_keeps_its_job_heartbeated,
    a_rejected_insert_rolls_the_whole_completion_back,
    a_unique_violation_on_another_index_rolls_the_completion_back,
    a_lost_acknowledgement_inserts_the_follow_up_once,
    a_failure_before_commit_is_retried_with_the_same_follow_ups,
    a_completion_under_a_superseded_lease_inserts_nothing,
    a_superseded_handler_completing_through_the_runtime_inserts_nothing,
    each_completion_takes_the_path_its_client_is_configured_for,
    work_one_inserts_with_completion_applies_poisoning_and_discards_otherwise,
    the_follow_up_span_is_a_child_of_the_span_current_when_staged,
    logs_name_kinds_and_job_ids_but_never_args,
    requests_at_every_limit_stage_and_commit,
    a_handler_cancelled_by_shutdown_leaves_nothing_and_the_rescued_rerun_inserts_its_own,
);
