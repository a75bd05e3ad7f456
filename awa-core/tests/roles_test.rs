//! Least privilege (design §7): a role holding only the grants of `docs/deploying.md` runs
//! workers, producers, maintenance and admin calls, and `migrate()` is a no-op for it when
//! the schema is current; when the schema is older it says who must migrate.

mod common;
mod support;

use awa_core::storage::migrations::{current_version, latest_version, pending_sql};
use awa_core::storage::{admin, callbacks, dlq};
use awa_core::{
    get_job, insert, insert_many, insert_many_copy_returning, list_jobs, AwaError, Client,
    EnqueueRequest, JobArgs, JobError, JobFilter, JobResult, JobState, NewJob, QueueConfig,
};
use awa_core::{HandlerResult, JobContext, Worker};
use common::{TestDb, TestRole};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use support::{eventually, fast_config, wait_for_state};

const T: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Chore {
    n: i64,
    mode: String,
}
impl JobArgs for Chore {}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    n: i64,
}
impl JobArgs for Receipt {}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Audit {
    n: i64,
}
impl JobArgs for Audit {}

fn chore(n: i64, mode: &str) -> Chore {
    Chore {
        n,
        mode: mode.into(),
    }
}

/// Every outcome and context call a handler makes, chosen by `mode`.
struct Chores;

impl Worker for Chores {
    fn kind(&self) -> String {
        Chore::kind()
    }

    fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let args: Chore =
                serde_json::from_value(ctx.job().args.clone()).map_err(JobError::terminal)?;
            let attempt = ctx.job().attempt;
            match args.mode.as_str() {
                "stage" => {
                    ctx.enqueue_on_completion(
                        EnqueueRequest::new(Receipt { n: args.n }).queue("sink"),
                    )
                    .map_err(JobError::terminal)?;
                    Ok(JobResult::Completed)
                }
                "park" => {
                    let token = ctx
                        .register_callback(Duration::from_secs(3600))
                        .await
                        .map_err(JobError::retryable)?;
                    Ok(JobResult::WaitForCallback(token))
                }
                "progress" => {
                    ctx.set_progress(50.0, Some("half"))
                        .map_err(JobError::terminal)?;
                    ctx.flush_progress().await.map_err(JobError::retryable)?;
                    Ok(JobResult::Completed)
                }
                "fail" => Err(JobError::Terminal("bad input".into())),
                "retry" if attempt == 1 => Ok(JobResult::RetryAfter(Duration::from_millis(1))),
                _ => Ok(JobResult::Completed),
            }
        })
    }
}

/// A migrated database and an application role holding exactly the documented grants.
async fn app_role(tag: &str) -> (TestDb, TestRole) {
    let db = TestDb::new().await;
    let role = TestRole::new(&db, tag).await;
    role.grant_documented(&db).await;
    (db, role)
}

#[tokio::test]
async fn migrate_is_a_no_op_for_the_application_role_when_the_schema_is_current() {
    let (db, role) = app_role("noop").await;
    let app = role.pool(2).await;
    awa_core::migrate(&app)
        .await
        .expect("migrate() as a role without CREATE rights, on a current schema");
    awa_core::migrate(&app).await.expect("and again");
    assert_eq!(
        current_version(&app).await.expect("version"),
        latest_version()
    );
    // It really is a role that could not have run DDL.
    let denied = sqlx::query("CREATE TABLE awa.not_allowed (x int)")
        .execute(&app)
        .await
        .expect_err("the application role may not create tables");
    assert_eq!(
        denied.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("42501")
    );
    app.close().await;
    drop(role);
    drop(db);
}

#[tokio::test]
async fn migrate_as_the_application_role_on_an_older_schema_says_the_owner_must_migrate() {
    let (db, role) = app_role("older").await;
    // The version before the newest (versions need not be contiguous).
    let all = awa_core::storage::migrations::migrations();
    let older = all.iter().rev().nth(1).map_or(0, |(v, _, _)| *v);
    // Pretend the newest migration has not been applied (its SQL is re-runnable).
    sqlx::query("DELETE FROM awa.schema_version WHERE version > $1")
        .bind(older)
        .execute(&db.pool)
        .await
        .expect("roll the version back");
    let app = role.pool(2).await;
    let err = awa_core::migrate(&app)
        .await
        .expect_err("the application role cannot apply a migration");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("version {older}"))
            && msg.contains(&format!("version {}", latest_version()))
            && msg.contains("owner must run"),
        "the error names both versions and who must migrate: {msg}"
    );
    assert!(
        !matches!(err, AwaError::Database(_)),
        "not a bare database error: {err:?}"
    );
    assert_eq!(current_version(&app).await.expect("version"), older);
    // The owner migrates; then the application role's migrate() is a no-op again.
    awa_core::migrate(&db.pool).await.expect("owner migrates");
    awa_core::migrate(&app)
        .await
        .expect("no-op after the owner migrated");
    assert_eq!(
        current_version(&app).await.expect("version"),
        latest_version()
    );
    app.close().await;
}

#[tokio::test]
async fn the_owner_can_run_the_migration_sql_by_hand() {
    let db = TestDb::empty().await;
    sqlx::raw_sql(&pending_sql(0))
        .execute(&db.pool)
        .await
        .expect("the whole schema as one script");
    assert_eq!(
        current_version(&db.pool).await.expect("version"),
        latest_version()
    );
    awa_core::migrate(&db.pool)
        .await
        .expect("migrate() finds nothing to do");
    insert(&db.pool, chore(1, "ok")).await.expect("insert");
    // From an intermediate version, only what is missing.
    let partial = pending_sql(latest_version() - 1);
    assert!(!partial.contains("CREATE TABLE awa.jobs "));
    assert!(partial.contains(&format!("VALUES ({})", latest_version())));
}

/// A worker, producers (single, batch, COPY, staged and spec follow-ups), the maintenance
/// leader (promotion, rescue, DLQ moves) and every admin call, all as the application role.
#[tokio::test]
async fn workers_producers_and_admin_calls_run_as_the_application_role() {
    let (db, role) = app_role("work").await;
    let app = role.pool(10).await;
    awa_core::migrate(&app).await.expect("no-op migrate");

    let client = Client::builder(app.clone())
        .queue("default", QueueConfig::new(4))
        .queue("dead", QueueConfig::new(1).dlq(true))
        .config(fast_config())
        .register_worker(Chores)
        .register::<Audit, _, _>(|_args, _ctx| async move { Ok(JobResult::Completed) })
        .on_completed_enqueue_with::<Chore, Audit, _>(|a, _job| {
            (a.mode == "spec").then(|| EnqueueRequest::new(Audit { n: a.n }).queue("sink"))
        })
        .build()
        .expect("build");
    client.start().await.expect("start as the application role");
    eventually("the maintenance leader", T, || async {
        client.is_leader().await.then_some(())
    })
    .await;

    // Producers: one insert, a batch, the COPY path, a transaction of the caller's.
    let ok = insert(&app, chore(1, "ok")).await.expect("insert");
    let batch = insert_many(
        &app,
        [
            chore(2, "stage"),
            chore(3, "spec"),
            chore(4, "retry"),
            chore(5, "progress"),
        ]
        .into_iter()
        .map(EnqueueRequest::new)
        .collect(),
    )
    .await
    .expect("insert_many");
    let new_job = |n: i64, mode: &str| -> NewJob {
        awa_core::storage::insert::prepare(&EnqueueRequest::new(chore(n, mode))).expect("new job")
    };
    let mut conn = app.acquire().await.expect("connection");
    let copied = insert_many_copy_returning(&mut conn, &[new_job(6, "ok"), new_job(7, "ok")])
        .await
        .expect("COPY as the application role");
    drop(conn);
    let mut tx = app.begin().await.expect("begin");
    let in_tx = insert(&mut *tx, chore(8, "ok"))
        .await
        .expect("insert in tx");
    tx.commit().await.expect("commit");
    let failing = awa_core::insert_with(&app, EnqueueRequest::new(chore(9, "fail")).queue("dead"))
        .await
        .expect("insert on the DLQ queue");
    let parked = insert(&app, chore(10, "park")).await.expect("insert");

    let mut done = vec![ok.id, in_tx.id];
    done.extend(batch.iter().map(|j| j.id));
    done.extend(copied.iter().map(|j| j.id));
    for id in done {
        wait_for_state(&db, id, &[JobState::Completed], T).await;
    }
    let parked_row = wait_for_state(&db, parked.id, &[JobState::WaitingExternal], T).await;
    eventually("the failed job in the DLQ", T, || async {
        let depth = dlq::dlq_depth(&app, Some("dead")).await.expect("dlq depth");
        (depth == 1).then_some(())
    })
    .await;
    eventually("the staged and the spec follow-ups", T, || async {
        let sink = list_jobs(
            &app,
            &JobFilter {
                queue: Some("sink".into()),
                ..Default::default()
            },
        )
        .await
        .expect("list");
        (sink.len() == 2).then_some(())
    })
    .await;

    // Callbacks, resolved by the application role.
    let token = parked_row.callback_id.expect("callback id");
    callbacks::heartbeat_callback(&app, &token, Duration::from_secs(60))
        .await
        .expect("heartbeat_callback");
    let resolved = client
        .complete_external(&token, Some(serde_json::json!({"ok": true})))
        .await
        .expect("complete_external");
    assert_eq!(resolved.state, JobState::Completed);

    // Admin calls.
    let health = client.health_check().await.expect("health check");
    assert_eq!(health.schema_version, latest_version());
    get_job(&app, ok.id).await.expect("get_job");
    admin::queue_stats(&app).await.expect("queue_stats");
    admin::set_queue_paused(&app, "idle", true)
        .await
        .expect("pause");
    let waiting = awa_core::insert_with(&app, EnqueueRequest::new(chore(11, "ok")).queue("idle"))
        .await
        .expect("insert on a paused queue");
    admin::cancel(&app, waiting.id).await.expect("cancel");
    admin::retry(&app, waiting.id).await.expect("retry");
    assert_eq!(admin::drain_queue(&app, "idle").await.expect("drain"), 1);
    admin::set_queue_paused(&app, "idle", false)
        .await
        .expect("resume");
    let dead_filter = dlq::DlqFilter {
        queue: Some("dead".into()),
        ..Default::default()
    };
    let dead = dlq::list_dlq(&app, &dead_filter, 10)
        .await
        .expect("list_dlq");
    assert_eq!(dead.len(), 1);
    dlq::get_dlq_job(&app, failing.id)
        .await
        .expect("get_dlq_job")
        .expect("in the dlq");
    dlq::retry_from_dlq(&app, failing.id, &dlq::RetryOverrides::default())
        .await
        .expect("retry_from_dlq")
        .expect("was in the dlq");
    eventually("the retried job back in the DLQ", T, || async {
        let depth = dlq::dlq_depth(&app, Some("dead")).await.expect("dlq depth");
        (depth == 1).then_some(())
    })
    .await;
    assert_eq!(
        dlq::purge_dlq(&app, &dead_filter, false)
            .await
            .expect("purge"),
        1
    );
    admin::retry_failed(&app, None, None, true)
        .await
        .expect("retry_failed");
    admin::discard_failed(&app, "failing", None)
        .await
        .expect("discard_failed");

    client.shutdown(Duration::from_secs(5)).await;
    app.close().await;
}

#[tokio::test]
async fn migrate_as_a_role_without_create_rights_on_an_empty_database_says_so() {
    let db = TestDb::empty().await;
    let role = TestRole::new(&db, "empty").await;
    let app = role.pool(1).await;
    let msg = awa_core::migrate(&app)
        .await
        .expect_err("a role without CREATE rights cannot create the schema")
        .to_string();
    assert!(
        msg.contains("does not exist (version 0)")
            && msg.contains(&format!("needs version {}", latest_version()))
            && msg.contains("owner must run"),
        "{msg}"
    );
    app.close().await;
}

#[tokio::test]
async fn queue_storage_claims_and_reclaims_as_the_application_role() {
    use awa_core::storage::queue_storage::QueueStorage;
    let (db, role) = app_role("qs").await;
    // Installed by the owner after the grants: the default privileges cover its objects.
    let qs = QueueStorage::new("awa", 4, 2).expect("config");
    awa_core::storage::transition::install_queue_storage(&db.pool, &qs, false)
        .await
        .expect("install as the owner");
    let app = role.pool(2).await;
    let jobs: Vec<NewJob> = (0..3)
        .map(|n| awa_core::storage::insert::prepare(&EnqueueRequest::new(chore(n, "ok"))))
        .collect::<Result<_, _>>()
        .expect("prepare");
    qs.enqueue(&app, &jobs)
        .await
        .expect("enqueue as the app role");
    // The claim reads the last seq drawn (USAGE on the sequence, not SELECT).
    let claimed = qs
        .claim_queue(&app, "default", 10, Some(Duration::from_secs(60)))
        .await
        .expect("claim as the app role");
    assert_eq!(claimed.len(), 3);
    let ids: Vec<i64> = claimed.iter().map(|j| j.id).collect();
    let leases: Vec<i64> = claimed.iter().map(|j| j.run_lease).collect();
    assert_eq!(
        qs.complete(&app, &ids, &leases)
            .await
            .expect("complete")
            .len(),
        3
    );
    // The leader's rotations: each lease slot with rows and, once the ring comes round, the
    // queue slot holding the finished jobs are emptied with TRUNCATE.
    let mut reclaimed = false;
    for _ in 0..8 {
        let turn = qs
            .rotate(&app, Duration::ZERO)
            .await
            .expect("rotate as the app role");
        reclaimed |= turn.carried.is_some();
    }
    assert!(reclaimed, "a slot was reclaimed");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM awa.ready_entries")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(left, 0, "the finished jobs' slot was truncated");
    app.close().await;
}
