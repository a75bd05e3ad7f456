//! Durable batch operations executed step by step (`maintenance::batch_ops::step`): the
//! snapshot, chunking, the stored cursor a new runner resumes from, skipped jobs, cancel.

mod common;
mod support;

use awa_core::maintenance::batch_ops::{step, Step};
use awa_core::storage::batch_ops::{self, BatchRequest, Cursor};
use awa_core::{Client, JobArgs, JobResult, QueueConfig, RuntimeConfig};
use common::TestDb;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Duration;
use support::{eventually, fast_config};

#[derive(Debug, Serialize, Deserialize)]
struct Noop {}
impl JobArgs for Noop {}

/// Insert `n` jobs of kind `k` in `queue` with `state`; returns their ids in order.
async fn insert(db: &TestDb, n: i64, queue: &str, state: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "INSERT INTO awa.jobs (kind, queue, state, run_at, finalized_at)
         SELECT 'k', $1, $2,
                CASE WHEN $2 = 'scheduled' THEN now() + interval '1 hour' ELSE now() END,
                CASE WHEN $2 IN ('completed', 'failed', 'cancelled') THEN now() END
         FROM generate_series(1, $3) RETURNING id",
    )
    .bind(queue)
    .bind(state)
    .bind(n)
    .fetch_all(&db.pool)
    .await
    .expect("insert jobs")
}

async fn priorities(db: &TestDb, ids: &[i64]) -> Vec<(i16, String)> {
    sqlx::query_as("SELECT priority, queue FROM awa.jobs WHERE id = ANY($1) ORDER BY id")
        .bind(ids)
        .fetch_all(&db.pool)
        .await
        .expect("read jobs")
}

fn request(op_kind: &str, spec: serde_json::Value, filter: serde_json::Value) -> BatchRequest {
    BatchRequest::parse(op_kind, &spec, Some(&filter)).expect("a valid request")
}

#[tokio::test]
async fn chunks_resume_from_the_stored_cursor_under_a_new_runner() {
    let db = TestDb::new().await;
    let queued = insert(&db, 25, "q", "available").await;
    let running = insert(&db, 1, "q", "running").await;
    let done = insert(&db, 1, "q", "completed").await;
    let op = batch_ops::submit(
        &db.pool,
        &request(
            "set_priority",
            json!({"priority": 4}),
            json!({"queue": "q"}),
        ),
        Some("ops"),
        false,
    )
    .await
    .expect("submit");
    assert_eq!(op.state, "pending");
    assert_eq!(op.cursor, None);
    // Inserted after the submit: outside the snapshot, never touched.
    let later = insert(&db, 2, "q", "available").await;

    let scanned = step(&db.pool, Some("runner-a"), 10).await.expect("scan");
    assert_eq!(
        scanned,
        Step::Scanned {
            id: op.id.clone(),
            total_matched: 25
        }
    );
    let first = step(&db.pool, Some("runner-a"), 10).await.expect("chunk 1");
    let Step::Chunk {
        changed, cursor, ..
    } = first
    else {
        panic!("expected a chunk, got {first:?}");
    };
    assert_eq!(changed, 10);
    assert_eq!(
        cursor,
        Cursor {
            after_job_id: queued[9],
            max_job_id: queued[24]
        }
    );
    let row = batch_ops::get(&db.pool, &op.id).await.expect("get");
    assert_eq!(row.state, "running");
    assert_eq!(row.processed, 10);
    assert_eq!(
        row.cursor,
        Some(json!({"after_job_id": queued[9], "max_job_id": queued[24]}))
    );

    // The first runner is gone; one job of the rest starts running meanwhile.
    sqlx::query("UPDATE awa.jobs SET state = 'running' WHERE id = $1")
        .bind(queued[20])
        .execute(&db.pool)
        .await
        .expect("start a job");
    // A new runner, on a pool of its own, carries on from the stored cursor.
    let other = db.pool(2).await;
    let mut steps = 0;
    loop {
        steps += 1;
        assert!(steps < 10, "the operation did not finish");
        match step(&other, Some("runner-b"), 10).await.expect("step") {
            Step::Finished { state, .. } => {
                assert_eq!(state, "completed");
                break;
            }
            Step::Chunk { .. } => {}
            s => panic!("unexpected {s:?}"),
        }
    }
    let row = batch_ops::get(&db.pool, &op.id).await.expect("get");
    assert_eq!(row.state, "completed");
    assert_eq!(row.total_matched, Some(25));
    assert_eq!(row.processed, 24);
    assert_eq!(
        row.skipped, 1,
        "the job that started running counts as skipped"
    );
    assert_eq!(row.errored, 0);
    assert_eq!(row.runner_instance.as_deref(), Some("runner-a"));
    assert!(row.finalized_at.is_some() && row.retention_until > row.finalized_at);
    assert_eq!(
        row.cursor,
        Some(json!({"after_job_id": queued[24], "max_job_id": queued[24]}))
    );

    let changed: Vec<i64> = queued
        .iter()
        .copied()
        .filter(|id| *id != queued[20])
        .collect();
    assert!(priorities(&db, &changed).await.iter().all(|(p, _)| *p == 4));
    for untouched in [&running[..], &done[..], &later[..], &[queued[20]][..]] {
        assert!(
            priorities(&db, untouched)
                .await
                .iter()
                .all(|(p, _)| *p == 2),
            "{untouched:?} must keep its priority"
        );
    }
    assert_eq!(step(&db.pool, None, 10).await.expect("idle"), Step::Idle);
}

#[tokio::test]
async fn a_cancel_stops_a_running_operation_between_chunks() {
    let db = TestDb::new().await;
    let ids = insert(&db, 20, "src", "scheduled").await;
    let op = batch_ops::submit(
        &db.pool,
        &request(
            "move_queue",
            json!({"queue": "dst", "priority": 1}),
            json!({"queue": "src"}),
        ),
        None,
        false,
    )
    .await
    .expect("submit");
    step(&db.pool, None, 5).await.expect("scan");
    step(&db.pool, None, 5).await.expect("chunk");
    let cancelling = batch_ops::cancel(&db.pool, &op.id).await.expect("cancel");
    assert_eq!(cancelling.state, "cancelling");
    assert!(
        batch_ops::cancel(&db.pool, &op.id).await.is_err(),
        "already cancelling"
    );
    let finished = step(&db.pool, None, 5).await.expect("cancel step");
    assert_eq!(
        finished,
        Step::Finished {
            id: op.id.clone(),
            state: "cancelled".into()
        }
    );
    let row = batch_ops::get(&db.pool, &op.id).await.expect("get");
    assert_eq!((row.state.as_str(), row.processed), ("cancelled", 5));
    let jobs = priorities(&db, &ids).await;
    assert!(jobs[..5].iter().all(|(p, q)| *p == 1 && q == "dst"));
    assert!(jobs[5..].iter().all(|(p, q)| *p == 2 && q == "src"));
}

#[tokio::test]
async fn a_pending_operation_cancelled_never_runs() {
    let db = TestDb::new().await;
    let ids = insert(&db, 3, "q", "available").await;
    let op = batch_ops::submit(
        &db.pool,
        &request("set_priority", json!({"priority": 1}), json!({"ids": ids})),
        None,
        false,
    )
    .await
    .expect("submit");
    let cancelled = batch_ops::cancel(&db.pool, &op.id).await.expect("cancel");
    assert_eq!(cancelled.state, "cancelled");
    assert!(cancelled.finalized_at.is_some());
    assert_eq!(step(&db.pool, None, 10).await.expect("step"), Step::Idle);
    assert!(priorities(&db, &ids).await.iter().all(|(p, _)| *p == 2));
}

#[test]
fn requests_are_checked_before_anything_runs() {
    let bad = [
        ("bogus", json!({"priority": 1}), json!({"queue": "q"})),
        (
            "set_priority",
            json!({"priority": 5}),
            json!({"queue": "q"}),
        ),
        ("set_priority", json!({}), json!({"queue": "q"})),
        ("set_priority", json!({"priority": 1, "x": 1}), json!({})),
        ("move_queue", json!({"queue": ""}), json!({})),
        ("move_queue", json!({"queue": "x".repeat(201)}), json!({})),
        (
            "set_priority",
            json!({"priority": 1}),
            json!({"queeu": "q"}),
        ),
        (
            "set_priority",
            json!({"priority": 1}),
            json!({"state": "running"}),
        ),
        (
            "set_priority",
            json!({"priority": 1}),
            json!({"state": "nope"}),
        ),
        (
            "set_priority",
            json!({"priority": 1}),
            json!({"created_at_lt": "yesterday"}),
        ),
        (
            "set_priority",
            json!({"priority": 1}),
            json!({"ids": [1, "2"]}),
        ),
    ];
    for (kind, spec, filter) in bad {
        let e = BatchRequest::parse(kind, &spec, Some(&filter)).expect_err("refused");
        assert!(
            matches!(e, awa_core::AwaError::BatchOperation(_)),
            "{kind} {spec} {filter}: {e:?}"
        );
    }
    let ok = BatchRequest::parse(
        "move_queue",
        &json!({"queue": "q2"}),
        Some(&json!({"queue": null, "state": "scheduled"})),
    )
    .expect("valid");
    assert!(!ok.filter.is_unscoped());
    assert!(batch_ops::parse_op_id("nope").is_err());
    assert_eq!(
        batch_ops::parse_op_id("0123456789ABCDEF0123456789abcdef").expect("plain hex"),
        "01234567-89ab-cdef-0123-456789abcdef"
    );
    assert!(batch_ops::parse_op_id("0123456-789ab-cdef-0123-456789abcdef").is_err());
}

#[tokio::test]
async fn the_leader_runs_submitted_operations_and_prunes_expired_ones() {
    let db = TestDb::new().await;
    let ids = insert(&db, 3, "parked", "available").await;
    let op = batch_ops::submit(
        &db.pool,
        &request(
            "move_queue",
            json!({"queue": "dst"}),
            json!({"queue": "parked"}),
        ),
        None,
        false,
    )
    .await
    .expect("submit");
    // Two finished operations: one past its retention, one not.
    sqlx::raw_sql(
        "INSERT INTO awa.batch_operations (op_kind, spec, state, finalized_at, retention_until)
         VALUES ('set_priority', '{\"priority\": 1}', 'completed', now() - interval '91 days',
                 now() - interval '1 day'),
                ('set_priority', '{\"priority\": 2}', 'cancelled', now(), now() + interval '90 days')",
    )
    .execute(&db.pool)
    .await
    .expect("seed");
    let client = Client::builder(db.pool.clone())
        .queue("work", QueueConfig::new(1))
        .config(RuntimeConfig {
            prune_interval: Duration::from_millis(100),
            ..fast_config()
        })
        .register::<Noop, _, _>(|_args, _ctx| async move { Ok(JobResult::Completed) })
        .build()
        .expect("build");
    client.start().await.expect("start");
    let done = eventually(
        "the leader completes the operation",
        Duration::from_secs(20),
        || async {
            let row = batch_ops::get(&db.pool, &op.id).await.ok()?;
            (row.state == "completed").then_some(row)
        },
    )
    .await;
    assert_eq!((done.total_matched, done.processed), (Some(3), 3));
    assert_eq!(done.runner_instance, client.instance_id().await);
    assert!(priorities(&db, &ids).await.iter().all(|(_, q)| q == "dst"));
    eventually(
        "the expired operation is pruned",
        Duration::from_secs(20),
        || async {
            let expired: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM awa.batch_operations WHERE retention_until < now()",
            )
            .fetch_one(&db.pool)
            .await
            .ok()?;
            (expired == 0).then_some(())
        },
    )
    .await;
    let left = batch_ops::list(&db.pool, None, 10).await.expect("list");
    let mut states: Vec<&str> = left.iter().map(|o| o.state.as_str()).collect();
    states.sort_unstable();
    assert_eq!(
        states,
        ["cancelled", "completed"],
        "the expired row went, the rest stayed"
    );
    client.shutdown(Duration::from_secs(5)).await;
}
