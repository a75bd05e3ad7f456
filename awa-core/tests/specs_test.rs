//! Registered follow-up specs (ADR-029): inserted in the transaction of the outcome they are
//! registered for, skipped on a duplicate unique key, rolling the outcome back on any other
//! failure, and only sending kinds with Completed specs down the per-job completion path.

mod common;
mod support;

use awa_core::finalizer::{finalize_with_retry, Finalization, Finalized, Transition};
use awa_core::follow_ups::SealedFollowUps;
use awa_core::metrics;
use awa_core::seams::{self, Path, Point};
use awa_core::storage::claim::claim_batch;
use awa_core::{
    get_job, insert, insert_with, AwaError, Client, ClientBuilder, EnqueueRequest, JobArgs,
    JobError, JobResult, JobRow, JobState, QueueConfig, UniqueOpts,
};
use common::TestDb;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    eventually, fast_config, jobs_of_kind, metric, quiet_config, reject_inserts_of, test_db,
    wait_for_state, wait_idle,
};

const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    n: i64,
    mode: String,
}
impl JobArgs for Order {}

fn order(n: i64, mode: &str) -> Order {
    Order {
        n,
        mode: mode.into(),
    }
}

/// A kind without Completed specs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plain {
    n: i64,
}
impl JobArgs for Plain {}

/// The follow-up every spec here writes, on a queue no client works.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Notice {
    order: i64,
    event: String,
}
impl JobArgs for Notice {}

fn notice(order: i64, event: &str) -> EnqueueRequest<Notice> {
    EnqueueRequest::new(Notice {
        order,
        event: event.into(),
    })
    .queue("sink")
}

/// Ids of the jobs whose handler ran.
type Ran = Arc<Mutex<Vec<i64>>>;

fn builder(db: &TestDb) -> ClientBuilder {
    builder_recording(db, &Ran::default())
}

fn builder_recording(db: &TestDb, ran: &Ran) -> ClientBuilder {
    let ran = ran.clone();
    Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(8))
        .config(fast_config())
        .register::<Order, _, _>(move |args, ctx| {
            ran.lock().expect("lock").push(ctx.job().id);
            async move {
                match args.mode.as_str() {
                    "retry_after" => Ok(JobResult::RetryAfter(Duration::from_secs(3600))),
                    "snooze" => Ok(JobResult::Snooze(Duration::from_secs(3600))),
                    "cancel" => Ok(JobResult::Cancel("customer changed their mind".into())),
                    "retryable" | "exhausted" => {
                        Err(JobError::Retryable("payment gateway down".into()))
                    }
                    "terminal" => Err(JobError::Terminal("card declined".into())),
                    _ => Ok(JobResult::Completed),
                }
            }
        })
        .register::<Plain, _, _>(|_args, _ctx| async move { Ok(JobResult::Completed) })
}

async fn wait_until_ran(ran: &Ran, id: i64) {
    eventually("the handler to run", T, || {
        let seen = ran.lock().expect("lock").contains(&id);
        async move { seen.then_some(()) }
    })
    .await;
}

async fn notices(db: &TestDb) -> Vec<(i64, Notice)> {
    jobs_of_kind(db, "notice")
        .await
        .into_iter()
        .map(|j| (j.id, serde_json::from_value(j.args).expect("notice args")))
        .collect()
}

async fn claim_one(db: &TestDb, args: Order) -> Arc<JobRow> {
    let job = insert(&db.pool, args).await.expect("insert");
    let mut claimed = claim_batch(&db.pool, "default", 1, Duration::from_secs(300))
        .await
        .expect("claim");
    let row = claimed.pop().expect("claimed");
    assert_eq!(row.id, job.id);
    Arc::new(row)
}

fn completion(job: &Arc<JobRow>) -> Finalization {
    Finalization {
        job: job.clone(),
        transition: Transition::Completed,
        follow_ups: SealedFollowUps::default(),
        progress: None,
        dlq: false,
    }
}

#[tokio::test]
async fn completed_specs_are_inserted_with_the_completion() {
    let db = test_db().await;
    let client = builder(&db)
        .on_completed_enqueue::<Order, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    let before = metric(&metrics::FOLLOW_UPS_INSERTED);
    let ids: Vec<i64> =
        futures_util::future::join_all((1..=3).map(|n| insert(&db.pool, order(n, "ok"))))
            .await
            .into_iter()
            .map(|r| r.expect("insert").id)
            .collect();
    client.start().await.expect("start");
    for id in &ids {
        wait_for_state(&db, *id, &[JobState::Completed], T).await;
    }
    client.shutdown(Duration::from_secs(5)).await;
    let mut got: Vec<Notice> = notices(&db).await.into_iter().map(|(_, n)| n).collect();
    got.sort();
    assert_eq!(
        got,
        (1..=3)
            .map(|n| Notice {
                order: n,
                event: "completed".into()
            })
            .collect::<Vec<_>>()
    );
    for j in jobs_of_kind(&db, "notice").await {
        assert_eq!((j.queue.as_str(), j.state), ("sink", JobState::Available));
    }
    assert!(metric(&metrics::FOLLOW_UPS_INSERTED) - before >= 3);
}

#[tokio::test]
async fn a_completion_that_does_not_commit_leaves_no_follow_up() {
    let db = test_db().await;
    // Not started: the test claims and finalizes by hand with the client's specs.
    let client = builder(&db)
        .on_completed_enqueue::<Order, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    let job = claim_one(&db, order(1, "ok")).await;
    // Every try fails just before COMMIT: the finalizer gives up.
    seams::arm(Point::BeforeCommit, Some(job.id), 3);
    let err = finalize_with_retry(&db.pool, &completion(&job), client.specs()).await;
    assert!(err.is_err(), "three failed tries give up: {err:?}");
    assert_eq!(seams::hits(Point::BeforeCommit, job.id), 3);
    assert_eq!(
        get_job(&db.pool, job.id).await.expect("get").state,
        JobState::Running
    );
    assert!(
        notices(&db).await.is_empty(),
        "the follow-up rolled back with the completion"
    );
    // The same finalization later commits both.
    let done = finalize_with_retry(&db.pool, &completion(&job), client.specs())
        .await
        .expect("finalize");
    assert_eq!(done, Finalized::Applied);
    assert_eq!(
        get_job(&db.pool, job.id).await.expect("get").state,
        JobState::Completed
    );
    assert_eq!(notices(&db).await.len(), 1);
}

#[tokio::test]
async fn a_duplicate_follow_up_is_skipped_and_the_outcome_still_commits() {
    let db = test_db().await;
    // Orders 11, 12, 13 share receipt key 1; orders 21 and 22 share key 2.
    let client = builder(&db)
        .on_completed_enqueue::<Order, Notice, _>(|a| {
            notice(a.n / 10, "completed").unique(UniqueOpts::default())
        })
        .build()
        .expect("build");
    let existing = insert_with(
        &db.pool,
        notice(1, "completed").unique(UniqueOpts::default()),
    )
    .await
    .expect("insert");
    let skipped_before = metric(&metrics::FOLLOW_UPS_SKIPPED_DUPLICATE);
    let mut ids = Vec::new();
    for n in [11, 12, 13, 21, 22] {
        ids.push(insert(&db.pool, order(n, "ok")).await.expect("insert").id);
    }
    client.start().await.expect("start");
    for id in &ids {
        wait_for_state(&db, *id, &[JobState::Completed], T).await;
    }
    client.shutdown(Duration::from_secs(5)).await;
    let got = notices(&db).await;
    let keys: Vec<i64> = got.iter().map(|(_, n)| n.order).collect();
    assert_eq!(keys, vec![1, 2], "one follow-up per key: {got:?}");
    assert_eq!(
        got[0].0, existing.id,
        "the row that held key 1 is the one left"
    );
    assert!(metric(&metrics::FOLLOW_UPS_SKIPPED_DUPLICATE) - skipped_before >= 4);
}

#[tokio::test]
async fn a_rejected_follow_up_insert_rolls_the_outcome_back() {
    let db = test_db().await;
    // No maintenance: nothing rescues the job the failed completion leaves running.
    let ran = Ran::default();
    let client = builder_recording(&db, &ran)
        .config(quiet_config())
        .on_completed_enqueue::<Order, Notice, _>(|a| notice(a.n, "completed"))
        .build()
        .expect("build");
    reject_inserts_of(&db, "notice").await;
    let direct = insert_with(&db.pool, notice(0, "direct")).await;
    assert!(
        matches!(direct, Err(AwaError::Database(_))),
        "the trigger rejects notices: {direct:?}"
    );

    // By hand: finalize_with_retry reports the error and nothing changed.
    let job = claim_one(&db, order(1, "ok")).await;
    let err = finalize_with_retry(&db.pool, &completion(&job), client.specs())
        .await
        .expect_err("the insert fails");
    assert!(
        err.to_string().contains("test trigger rejects notice"),
        "{err}"
    );
    let row = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!(
        (row.state, row.run_lease),
        (JobState::Running, 1),
        "the completion rolled back"
    );

    // Through the runtime: the job stays running (until stale-heartbeat rescue).
    let second = insert(&db.pool, order(2, "ok")).await.expect("insert");
    client.start().await.expect("start");
    wait_until_ran(&ran, second.id).await;
    // The attempt is in flight from before its handler runs until its finalization ends.
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    let row = get_job(&db.pool, second.id).await.expect("get");
    assert_eq!((row.state, row.finalized_at), (JobState::Running, None));
    assert_eq!(support::count_kind(&db, "notice").await, 0);
}

#[tokio::test]
async fn a_with_closure_returning_none_inserts_nothing() {
    let db = test_db().await;
    let client = builder(&db)
        .on_completed_enqueue_with::<Order, Notice, _>(|a, job| {
            // The closure sees the job row as well as the args.
            (a.n % 2 == 1).then(|| notice(job.id, "odd"))
        })
        .build()
        .expect("build");
    let mut ids = Vec::new();
    for n in 1..=4 {
        ids.push(insert(&db.pool, order(n, "ok")).await.expect("insert").id);
    }
    client.start().await.expect("start");
    for id in &ids {
        wait_for_state(&db, *id, &[JobState::Completed], T).await;
    }
    client.shutdown(Duration::from_secs(5)).await;
    // Completions of the four jobs commit concurrently, so the notices' insert order is not
    // the orders' order: compare as a set.
    let mut got: Vec<Notice> = notices(&db).await.into_iter().map(|(_, n)| n).collect();
    got.sort_by_key(|n| n.order);
    assert_eq!(
        got,
        vec![
            Notice {
                order: ids[0],
                event: "odd".into()
            },
            Notice {
                order: ids[2],
                event: "odd".into()
            }
        ]
    );
}

#[tokio::test]
async fn a_panicking_spec_rolls_the_outcome_back() {
    let db = test_db().await;
    let ran = Ran::default();
    let client = builder_recording(&db, &ran)
        .config(quiet_config())
        .on_completed_enqueue::<Order, Notice, _>(|a| {
            assert!(a.mode != "boom", "spec refuses {}", a.n);
            notice(a.n, "completed")
        })
        .build()
        .expect("build");
    let job = claim_one(&db, order(1, "boom")).await;
    let err = finalize_with_retry(&db.pool, &completion(&job), client.specs())
        .await
        .expect_err("the spec panicked");
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(
        get_job(&db.pool, job.id).await.expect("get").state,
        JobState::Running
    );
    assert!(notices(&db).await.is_empty());

    // Through the runtime, the worker survives: the panicking job stays running, the next
    // job completes with its follow-up.
    let boom = insert(&db.pool, order(2, "boom")).await.expect("insert");
    let ok = insert(&db.pool, order(3, "ok")).await.expect("insert");
    client.start().await.expect("start");
    wait_for_state(&db, ok.id, &[JobState::Completed], T).await;
    wait_until_ran(&ran, boom.id).await;
    wait_idle(&client, T).await;
    client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        get_job(&db.pool, boom.id).await.expect("get").state,
        JobState::Running
    );
    let got: Vec<Notice> = notices(&db).await.into_iter().map(|(_, n)| n).collect();
    assert_eq!(
        got,
        vec![Notice {
            order: 3,
            event: "completed".into()
        }]
    );
}

/// With `batch_follow_ups` off, a kind with a registered Completed spec takes the per-job
/// completion path and every other kind (even one with specs for other outcomes) is batched;
/// with it on (the default), both are batched and the spec's follow-up commits in the batch.
/// Either way a try that fails before its commit is retried and the follow-up inserted once.
async fn completions_with_specs_take_the_configured_path(batch_follow_ups: bool) {
    let db = test_db().await;
    let client = builder(&db)
        .config(awa_core::RuntimeConfig {
            batch_follow_ups,
            ..fast_config()
        })
        .on_completed_enqueue::<Order, Notice, _>(|a| notice(a.n, "completed"))
        // Specs for other outcomes do not take a kind off the batched completion path.
        .on_exhausted_enqueue::<Plain, Notice, _>(|a| notice(a.n, "plain exhausted"))
        .build()
        .expect("build");
    let with_spec = insert(&db.pool, order(1, "ok")).await.expect("insert");
    let plain = insert(&db.pool, Plain { n: 2 }).await.expect("insert");
    seams::arm(Point::BeforeCommit, Some(with_spec.id), 1);
    client.start().await.expect("start");
    wait_for_state(&db, with_spec.id, &[JobState::Completed], T).await;
    wait_for_state(&db, plain.id, &[JobState::Completed], T).await;
    client.shutdown(Duration::from_secs(5)).await;
    let expected = if batch_follow_ups {
        Path::Batched
    } else {
        Path::PerJob
    };
    assert_eq!(seams::sent_on(with_spec.id), vec![expected]);
    assert_eq!(
        seams::sent_on(plain.id),
        vec![Path::Batched],
        "the kind without a Completed spec was batched"
    );
    assert_eq!(seams::hits(Point::BeforeCommit, with_spec.id), 1);
    let got: Vec<Notice> = notices(&db).await.into_iter().map(|(_, n)| n).collect();
    assert_eq!(
        got,
        vec![Notice {
            order: 1,
            event: "completed".into()
        }],
        "inserted once despite the retry"
    );
}

#[tokio::test]
async fn completions_with_specs_are_batched_with_batch_follow_ups_on() {
    completions_with_specs_take_the_configured_path(true).await;
}

#[tokio::test]
async fn only_kinds_with_completed_specs_take_the_per_job_path_with_batch_follow_ups_off() {
    completions_with_specs_take_the_configured_path(false).await;
}

#[tokio::test]
async fn outcome_specs_fire_on_their_own_outcomes() {
    let db = test_db().await;
    let client = builder(&db)
        .on_completed_enqueue::<Order, Notice, _>(|a| notice(a.n, "completed"))
        .on_exhausted_enqueue::<Order, Notice, _>(|a| notice(a.n, "exhausted"))
        .on_retried_enqueue_with::<Order, Notice, _>(|a, job| {
            Some(notice(
                a.n,
                &format!("retried after attempt {}", job.attempt),
            ))
        })
        .on_cancelled_enqueue::<Order, Notice, _>(|a| notice(a.n, "cancelled"))
        .build()
        .expect("build");
    let modes = [
        "ok",
        "terminal",
        "exhausted",
        "retry_after",
        "retryable",
        "cancel",
        "snooze",
    ];
    let mut ids = BTreeMap::new();
    for (i, mode) in modes.iter().enumerate() {
        let max_attempts = if *mode == "exhausted" { 1 } else { 25 };
        let job = insert_with(
            &db.pool,
            EnqueueRequest::new(order(i as i64, mode)).max_attempts(max_attempts),
        )
        .await
        .expect("insert");
        ids.insert(*mode, job.id);
    }
    client.start().await.expect("start");
    let want = [
        ("ok", JobState::Completed),
        ("terminal", JobState::Failed),
        ("exhausted", JobState::Failed),
        ("retry_after", JobState::Retryable),
        ("retryable", JobState::Retryable),
        ("cancel", JobState::Cancelled),
        ("snooze", JobState::Scheduled),
    ];
    for (mode, state) in want {
        wait_for_state(&db, ids[mode], &[state], T).await;
    }
    client.shutdown(Duration::from_secs(5)).await;
    let mut by_order: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (_, n) in notices(&db).await {
        by_order.entry(n.order).or_default().push(n.event);
    }
    let events = |mode: &str| {
        by_order
            .get(&(modes.iter().position(|m| *m == mode).expect("mode") as i64))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(events("ok"), vec!["completed"]);
    assert_eq!(events("terminal"), vec!["exhausted"]);
    assert_eq!(
        events("exhausted"),
        vec!["exhausted"],
        "running out of attempts is exhausted, not retried"
    );
    assert_eq!(events("retry_after"), vec!["retried after attempt 1"]);
    assert_eq!(events("cancel"), vec!["cancelled"]);
    assert_eq!(
        events("snooze"),
        Vec::<String>::new(),
        "a snooze fires nothing"
    );
    // The retryable job may have been retried more than once by now: one notice per retry.
    let retryable = get_job(&db.pool, ids["retryable"]).await.expect("get");
    let expected: Vec<String> = retryable
        .errors
        .iter()
        .map(|e| format!("retried after attempt {}", e.attempt))
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(events("retryable"), expected);
}
