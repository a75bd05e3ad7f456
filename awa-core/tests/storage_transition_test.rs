//! The route guards of a storage transition (issue 18; migration 12; `storage::routing`): a
//! producer whose cached route is stale writes to the engine a transition closed, the engine
//! refuses (SQLSTATE AWR01), and the insert is retried on the engine now open, so no job is
//! stranded where no runtime will look. The stale route is pinned with the `test-seams` hook
//! rather than raced against the cache's one-second lifetime.

mod common;

use awa_core::model::validate;
use awa_core::model::InsertOpts;
use awa_core::storage::routing::{self, Route};
use awa_core::storage::transition;
use awa_core::{AwaError, Db, NewJob};
use common::TestDb;
use serde_json::json;

fn job(n: i64) -> NewJob {
    validate("routed", json!({ "n": n }), &InsertOpts::default()).expect("valid job")
}

async fn canonical_ids(db: &TestDb) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM awa.canonical_jobs ORDER BY id")
        .fetch_all(db.pool.pool())
        .await
        .expect("read canonical")
}

/// A second handle on the same pool with a route cache of its own (a producer process).
fn producer(db: &TestDb) -> Db {
    Db::from(db.pool.pool().clone())
}

/// Step one of a transition to schema `awa`: prepared, and the substrate installed there.
async fn prepare_awa(ops: &Db) -> awa_core::storage::queue_storage::QueueStorage {
    transition::step(ops, "prepare", Some("awa"))
        .await
        .expect("prepare");
    let qs = transition::queue_storage("awa", 4, 2).expect("config");
    transition::prepare_queue_storage_schema(ops, &qs)
        .await
        .expect("prepare schema");
    qs
}

/// A live queue-storage target, as a runtime started with that role registers itself.
async fn fake_target(ops: &Db) {
    sqlx::query(
        "INSERT INTO awa.runtime_instances
             (pid, version, snapshot_interval_ms, storage_capability, transition_role)
         VALUES (1, 'test', 1000, 'queue_storage', 'queue_storage_target')",
    )
    .execute(ops.pool())
    .await
    .expect("fake target");
}

#[tokio::test]
async fn a_canonical_route_gone_stale_by_an_install_lands_the_job_in_queue_storage() {
    let db = TestDb::new().await;
    let qs = transition::queue_storage("awa", 4, 2).expect("config");
    transition::install_queue_storage(&db.pool, &qs, false)
        .await
        .expect("install");
    let p = producer(&db);
    routing::pin_route(&p, Route::Canonical);

    let rows = routing::insert_jobs(&p, &[job(1)]).await.expect("insert");

    assert!(canonical_ids(&db).await.is_empty(), "canonical refused it");
    let in_qs: Vec<i64> = qs
        .jobs(&db.pool)
        .await
        .expect("qs jobs")
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(in_qs, vec![rows[0].id]);
    // Inside a caller's transaction the refusal is the caller's to retry (the transaction is
    // failed), typed, and the stale route is dropped for the retry.
    routing::pin_route(&p, Route::Canonical);
    let mut tx = p.begin().await.expect("begin");
    let refused = routing::insert_jobs_in(&mut tx, &p, &[job(2)]).await;
    assert!(
        matches!(refused, Err(AwaError::StorageRouteMoved(_))),
        "{refused:?}"
    );
    drop(tx);
    let mut tx = p.begin().await.expect("begin");
    routing::insert_jobs_in(&mut tx, &p, &[job(2)])
        .await
        .expect("retried insert");
    tx.commit().await.expect("commit");
    assert_eq!(qs.jobs(&db.pool).await.expect("qs jobs").len(), 2);
}

#[tokio::test]
async fn a_queue_storage_route_gone_stale_by_an_abort_lands_the_job_in_canonical() {
    let db = TestDb::new().await;
    let ops = &db.pool;
    let qs = prepare_awa(ops).await;
    fake_target(ops).await;
    let mixed = transition::step(ops, "enter_mixed_transition", None)
        .await
        .expect("enter mixed");
    assert_eq!(mixed["state"], "mixed_transition");
    sqlx::query("DELETE FROM awa.runtime_instances")
        .execute(ops.pool())
        .await
        .expect("target gone");
    let back = transition::step(ops, "abort", None).await.expect("abort");
    assert_eq!(back["state"], "canonical");

    let p = producer(&db);
    routing::pin_route(&p, Route::QueueStorage(std::sync::Arc::new(qs.clone())));
    let rows = routing::insert_jobs(&p, &[job(1)]).await.expect("insert");

    assert_eq!(canonical_ids(&db).await, vec![rows[0].id]);
    assert!(
        qs.jobs(ops).await.expect("qs jobs").is_empty(),
        "queue storage refused it"
    );
}

#[tokio::test]
async fn finalize_waits_for_the_canonical_backlog_and_steps_are_refused_out_of_order() {
    let db = TestDb::new().await;
    let ops = &db.pool;
    for (step, message) in [
        (
            "enter_mixed_transition",
            "storage enter-mixed-transition is only allowed from prepared state",
        ),
        (
            "finalize",
            "storage finalize is only allowed from mixed_transition state",
        ),
        (
            "abort",
            "storage abort is only allowed from prepared or mixed_transition state",
        ),
    ] {
        match transition::step(ops, step, None).await {
            Err(AwaError::Storage(m)) => assert_eq!(m, message),
            other => panic!("{step}: {other:?}"),
        }
    }
    match transition::step(ops, "prepare", Some("Bad-Name")).await {
        Err(AwaError::InvalidStorage(m)) => assert_eq!(m, "invalid SQL identifier: Bad-Name"),
        other => panic!("{other:?}"),
    }
    routing::insert_jobs(ops, &[job(1)])
        .await
        .expect("canonical job");
    transition::step(ops, "prepare", None)
        .await
        .expect("prepare");
    match transition::step(ops, "enter_mixed_transition", None).await {
        Err(AwaError::Storage(m)) => assert_eq!(m, "queue storage schema \"awa\" is not prepared"),
        other => panic!("{other:?}"),
    }
    let status = transition::status(ops).await.expect("status");
    assert_eq!(status["canonical_live_backlog"], 1);
    assert_eq!(status["prepared_schema_ready"], false);
}

/// The shape `awa.jobs` has now (migration 13 records it as the view's comment).
async fn view_shape(db: &TestDb) -> String {
    sqlx::query_scalar("SELECT obj_description('awa.jobs'::regclass, 'pg_class')")
        .fetch_one(db.pool.pool())
        .await
        .expect("read the view's shape")
}

async fn view_ids(db: &TestDb) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT id, state FROM awa.jobs ORDER BY id")
        .fetch_all(db.pool.pool())
        .await
        .expect("read awa.jobs")
}

#[tokio::test]
async fn awa_jobs_is_a_view_of_every_job_on_either_engine() {
    let db = TestDb::new().await;
    let ops = &db.pool;
    let sql = db.pool.pool();
    // Canonical only: a plain view over canonical's table, written through as the table was.
    assert_eq!(view_shape(&db).await, "canonical");
    let c = routing::insert_jobs(ops, &[job(1)]).await.expect("insert")[0].id;
    let id: i64 =
        sqlx::query_scalar("INSERT INTO awa.jobs (kind, args) VALUES ('adhoc', '{}') RETURNING id")
            .fetch_one(sql)
            .await
            .expect("insert through the view");
    let done = sqlx::query("UPDATE awa.jobs SET priority = 1 WHERE id = ANY($1)")
        .bind(vec![c, id])
        .execute(sql)
        .await
        .expect("update through the view");
    assert_eq!(done.rows_affected(), 2);
    sqlx::query("DELETE FROM awa.jobs WHERE id = $1")
        .bind(id)
        .execute(sql)
        .await
        .expect("delete through the view");

    // A live transition: new jobs go to queue storage, and the view shows both engines.
    let qs = prepare_awa(ops).await;
    assert_eq!(
        view_shape(&db).await,
        "canonical",
        "nothing is routed there yet"
    );
    fake_target(ops).await;
    transition::step(ops, "enter_mixed_transition", None)
        .await
        .expect("enter mixed");
    assert_eq!(view_shape(&db).await, "canonical+queue_storage:awa");
    let p = producer(&db);
    let q = routing::insert_jobs(&p, &[job(2)]).await.expect("insert")[0].id;
    assert_eq!(
        qs.jobs(ops).await.expect("qs jobs")[0].id,
        q,
        "the job went to queue storage"
    );
    assert_eq!(
        view_ids(&db).await,
        vec![(c, "available".to_string()), (q, "available".to_string())]
    );
    // Ad-hoc writes reach canonical's rows and are refused, typed, on queue storage's.
    let done = sqlx::query("UPDATE awa.jobs SET priority = 3 WHERE id = $1 RETURNING priority")
        .bind(c)
        .fetch_one(sql)
        .await
        .expect("update a canonical job through the view");
    assert_eq!(sqlx::Row::get::<i16, _>(&done, "priority"), 3);
    let refused = sqlx::query("UPDATE awa.jobs SET priority = 3 WHERE id = $1")
        .bind(q)
        .execute(sql)
        .await
        .expect_err("queue storage's jobs are not written through awa.jobs");
    let e = refused.as_database_error().expect("a database error");
    assert_eq!(e.code().as_deref(), Some("55000"));
    assert!(
        e.message().contains("is on queue storage"),
        "{}",
        e.message()
    );
    let refused = sqlx::query("DELETE FROM awa.jobs WHERE id = $1")
        .bind(q)
        .execute(sql)
        .await
        .expect_err("nor deleted through it");
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("55000")
    );
    assert_eq!(view_ids(&db).await.len(), 2, "nothing was lost");

    // Back to canonical: once queue storage is no longer readable the view is plain again.
    sqlx::query("DELETE FROM awa.runtime_instances")
        .execute(sql)
        .await
        .expect("target gone");
    qs.cancel(ops, q)
        .await
        .expect("cancel the queue-storage job");
    transition::step(ops, "abort", None).await.expect("abort");
    assert_eq!(view_shape(&db).await, "canonical");
    assert_eq!(view_ids(&db).await, vec![(c, "available".to_string())]);
}

/// During a mixed transition a unique key a canonical job still holds is held for queue
/// storage too: a duplicate is refused, and once the canonical job
/// leaves its unique states the key is free on queue storage.
#[tokio::test]
async fn a_unique_key_held_on_canonical_is_held_on_queue_storage_during_a_mixed_transition() {
    let db = TestDb::new().await;
    let ops = &db.pool;
    let unique = || {
        let opts = InsertOpts {
            unique: Some(awa_core::model::UniqueOpts::default()),
            ..Default::default()
        };
        validate("keyed", json!({ "n": 1 }), &opts).expect("valid job")
    };
    let held = routing::insert_jobs(ops, &[unique()])
        .await
        .expect("canonical job")[0]
        .id;
    let qs = prepare_awa(ops).await;
    fake_target(ops).await;
    transition::step(ops, "enter_mixed_transition", None)
        .await
        .expect("mixed");
    let p = producer(&db);
    match routing::insert_jobs(&p, &[unique()]).await {
        Err(AwaError::UniqueConflict { kind }) => assert_eq!(kind, "keyed"),
        other => panic!("a duplicate of a canonical job's key went in: {other:?}"),
    }
    let job = unique();
    assert!(
        qs.enqueue_refs(ops, &[&job]).await.is_err(),
        "the substrate's own enqueue refuses it too"
    );
    assert!(qs.jobs(ops).await.expect("jobs").is_empty());
    routing::cancel(ops, held).await.expect("cancel the holder");
    let rows = routing::insert_jobs(&p, &[unique()])
        .await
        .expect("key free");
    assert_ne!(rows[0].id, held);
    assert_eq!(
        qs.jobs(ops).await.expect("jobs").len(),
        1,
        "on queue storage"
    );
}
