//! Foundation: migrations, inserts through any executor, validation, unique jobs.

mod common;

use awa_core::{
    get_job, insert, insert_many, insert_many_copy, insert_with, list_jobs, AwaError,
    EnqueueRequest, InsertOpts, JobArgs, JobFilter, JobState, NewJob, UniqueOpts, ValidationError,
};
use chrono::{Duration, TimeZone, Utc};
use common::TestDb;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct SendEmail {
    to: String,
}
impl JobArgs for SendEmail {}

#[derive(Debug, Serialize, Deserialize)]
struct HTMLToPDF {
    url: String,
}
impl JobArgs for HTMLToPDF {}

fn email(to: &str) -> SendEmail {
    SendEmail { to: to.into() }
}

#[tokio::test]
async fn insert_defaults_and_kind_derivation() {
    let db = TestDb::new().await;
    let job = insert(&db.pool, email("a")).await.expect("insert");
    assert_eq!(job.kind, "send_email");
    assert_eq!(
        (job.queue.as_str(), job.priority, job.max_attempts),
        ("default", 2, 25)
    );
    assert_eq!(job.state, JobState::Available);
    let pdf = insert(&db.pool, HTMLToPDF { url: "u".into() })
        .await
        .expect("insert");
    assert_eq!(pdf.kind, "html_to_pdf");
    let got = get_job(&db.pool, job.id).await.expect("get");
    assert_eq!(got.args, serde_json::json!({"to": "a"}));
    assert!(matches!(
        get_job(&db.pool, 999_999).await,
        Err(AwaError::JobNotFound(999_999))
    ));
}

#[tokio::test]
async fn future_run_at_schedules() {
    let db = TestDb::new().await;
    let later = Utc::now() + Duration::hours(1);
    let job = insert_with(&db.pool, EnqueueRequest::new(email("s")).run_at(later))
        .await
        .expect("insert");
    assert_eq!(job.state, JobState::Scheduled);
}

#[tokio::test]
async fn validation_rejects_before_the_database_and_writes_nothing() {
    let db = TestDb::new().await;
    let cases: Vec<(EnqueueRequest<SendEmail>, bool)> = vec![
        (EnqueueRequest::new(email("x")).priority(1), true),
        (EnqueueRequest::new(email("x")).priority(4), true),
        (EnqueueRequest::new(email("x")).priority(0), false),
        (EnqueueRequest::new(email("x")).priority(5), false),
        (EnqueueRequest::new(email("x")).max_attempts(1000), true),
        (EnqueueRequest::new(email("x")).max_attempts(1001), false),
        (EnqueueRequest::new(email("x")).queue("q".repeat(200)), true),
        (
            EnqueueRequest::new(email("x")).queue("q".repeat(201)),
            false,
        ),
        (
            EnqueueRequest::new(email("x")).tags((0..20).map(|i| i.to_string()).collect()),
            true,
        ),
        (
            EnqueueRequest::new(email("x")).tags((0..21).map(|i| i.to_string()).collect()),
            false,
        ),
        (
            EnqueueRequest::new(email("x"))
                .run_at(Utc.with_ymd_and_hms(9999, 12, 31, 0, 0, 0).unwrap()),
            true,
        ),
        (
            EnqueueRequest::new(email("x"))
                .run_at(Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap()),
            false,
        ),
        (
            EnqueueRequest::new(email("x")).run_at(Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap()),
            true,
        ),
        (
            EnqueueRequest::new(email("x"))
                .run_at(Utc.with_ymd_and_hms(0, 12, 31, 0, 0, 0).unwrap()),
            false,
        ),
        (EnqueueRequest::new(email("nul\u{0}")), false),
        (
            EnqueueRequest::new(email("x")).metadata(serde_json::json!({"k\u{0}": 1})),
            false,
        ),
        (
            EnqueueRequest::new(email("x")).metadata(serde_json::json!([1])),
            false,
        ),
    ];
    let mut accepted = 0;
    for (i, (req, ok)) in cases.into_iter().enumerate() {
        let result = insert_with(&db.pool, req).await;
        assert_eq!(result.is_ok(), ok, "case {i}: {result:?}");
        if ok {
            accepted += 1;
        } else {
            assert!(matches!(result, Err(AwaError::Validation(_))), "case {i}");
        }
    }
    let all = list_jobs(
        &db.pool,
        &JobFilter {
            limit: Some(1000),
            ..Default::default()
        },
    )
    .await
    .expect("list");
    assert_eq!(all.len(), accepted);
}

#[tokio::test]
async fn database_enforces_the_same_rules() {
    // Rows that bypass the validator are still rejected by CHECK constraints.
    let db = TestDb::new().await;
    for sql in [
        "INSERT INTO awa.jobs (kind, priority) VALUES ('k', 5)",
        "INSERT INTO awa.jobs (kind, max_attempts) VALUES ('k', 1001)",
        "INSERT INTO awa.jobs (kind) VALUES (repeat('k', 201))",
        "INSERT INTO awa.jobs (kind, queue) VALUES ('k', repeat('q', 201))",
        "INSERT INTO awa.jobs (kind, tags) VALUES ('k', array_fill('t'::text, ARRAY[21]))",
        "INSERT INTO awa.jobs (kind, run_at) VALUES ('k', '10000-01-01 00:00:00+00')",
    ] {
        let err = sqlx::query(sql).execute(&db.pool).await.expect_err(sql);
        let code = err
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.to_string());
        assert_eq!(code.as_deref(), Some("23514"), "{sql}: {err}");
    }
}

#[tokio::test]
async fn unique_options_and_release() {
    let db = TestDb::new().await;
    let uniq = |to: &str| EnqueueRequest::new(email(to)).unique(UniqueOpts::default());
    insert_with(&db.pool, uniq("a")).await.expect("first");
    assert!(matches!(
        insert_with(&db.pool, uniq("a")).await,
        Err(AwaError::UniqueConflict { .. })
    ));
    insert_with(&db.pool, uniq("b")).await.expect("other args");

    let by_queue = UniqueOpts {
        by_queue: true,
        ..Default::default()
    };
    insert_with(
        &db.pool,
        EnqueueRequest::new(email("q"))
            .queue("q1")
            .unique(by_queue.clone()),
    )
    .await
    .expect("q1");
    insert_with(
        &db.pool,
        EnqueueRequest::new(email("q")).queue("q2").unique(by_queue),
    )
    .await
    .expect("q2");

    let no_args = UniqueOpts {
        by_args: false,
        ..Default::default()
    };
    insert_with(
        &db.pool,
        EnqueueRequest::new(HTMLToPDF { url: "1".into() }).unique(no_args.clone()),
    )
    .await
    .expect("1");
    assert!(insert_with(
        &db.pool,
        EnqueueRequest::new(HTMLToPDF { url: "2".into() }).unique(no_args)
    )
    .await
    .is_err());

    // A row whose state leaves the mask releases the key.
    let mask = awa_core::states_mask(&[JobState::Available]);
    let only_available = UniqueOpts {
        states: mask,
        ..Default::default()
    };
    let first = insert_with(
        &db.pool,
        EnqueueRequest::new(email("m"))
            .queue("m")
            .unique(only_available.clone()),
    )
    .await
    .expect("first");
    assert!(insert_with(
        &db.pool,
        EnqueueRequest::new(email("m"))
            .queue("m")
            .unique(only_available.clone())
    )
    .await
    .is_err());
    sqlx::query("UPDATE awa.jobs SET state = 'completed' WHERE id = $1")
        .bind(first.id)
        .execute(&db.pool)
        .await
        .expect("update");
    insert_with(
        &db.pool,
        EnqueueRequest::new(email("m"))
            .queue("m")
            .unique(only_available),
    )
    .await
    .expect("released");
}

#[tokio::test]
async fn transactional_enqueue_follows_the_callers_transaction() {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.expect("begin");
    let gone = insert(&mut *tx, email("rollback")).await.expect("insert");
    tx.rollback().await.expect("rollback");
    assert!(get_job(&db.pool, gone.id).await.is_err());

    let mut tx = db.pool.begin().await.expect("begin");
    let kept = insert(&mut *tx, email("commit")).await.expect("insert");
    let many = insert_many(
        &mut *tx,
        vec![
            EnqueueRequest::new(email("m1")),
            EnqueueRequest::new(email("m2")),
        ],
    )
    .await
    .expect("insert_many");
    assert_eq!(many.len(), 2);
    tx.commit().await.expect("commit");
    assert_eq!(
        get_job(&db.pool, kept.id).await.expect("get").args["to"],
        "commit"
    );
}

#[tokio::test]
async fn insert_many_is_all_or_nothing() {
    let db = TestDb::new().await;
    insert_with(
        &db.pool,
        EnqueueRequest::new(email("dupe")).unique(UniqueOpts::default()),
    )
    .await
    .expect("seed");
    let batch = vec![
        EnqueueRequest::new(email("fresh")).unique(UniqueOpts::default()),
        EnqueueRequest::new(email("dupe")).unique(UniqueOpts::default()),
    ];
    assert!(matches!(
        insert_many(&db.pool, batch).await,
        Err(AwaError::UniqueConflict { .. })
    ));
    let bad = vec![
        EnqueueRequest::new(email("ok")),
        EnqueueRequest::new(email("bad")).priority(0),
    ];
    assert!(matches!(
        insert_many(&db.pool, bad).await,
        Err(AwaError::Validation(ValidationError::Priority { value: 0 }))
    ));
    let all = list_jobs(&db.pool, &JobFilter::default())
        .await
        .expect("list");
    assert_eq!(all.len(), 1);
}

#[tokio::test]
async fn concurrent_migrations_both_succeed() {
    let db = TestDb::empty().await;
    let (a, b) = (db.pool(2).await, db.pool(2).await);
    let (ra, rb) = tokio::join!(awa_core::migrate(&a), awa_core::migrate(&b));
    ra.expect("first migrate");
    rb.expect("second migrate");
    awa_core::migrate(&a).await.expect("idempotent");
    assert_eq!(
        awa_core::storage::migrations::current_version(&a)
            .await
            .expect("version"),
        awa_core::storage::migrations::latest_version()
    );
    insert(&a, email("after"))
        .await
        .expect("insert after migrate");
}

#[tokio::test]
async fn unmigrated_database_reports_schema_not_migrated() {
    let db = TestDb::empty().await;
    assert!(matches!(
        insert(&db.pool, email("x")).await,
        Err(AwaError::SchemaNotMigrated { .. })
    ));
}

#[tokio::test]
async fn insert_opts_default_matches_awa_pg() {
    let o = InsertOpts::default();
    assert_eq!(
        (o.queue.as_str(), o.priority, o.max_attempts),
        ("default", 2, 25)
    );
}

// ----- insert_many_copy: the COPY bulk path ------------------------------------------------

/// Validated jobs for the COPY tests, built through the shared validator.
fn new_job(kind: &str, args: serde_json::Value, opts: InsertOpts) -> NewJob {
    awa_core::model::validate(kind, args, &opts).expect("valid job")
}

async fn count_jobs<'e, E: sqlx::PgExecutor<'e>>(executor: E) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM awa.jobs")
        .fetch_one(executor)
        .await
        .expect("count")
}

fn all_jobs() -> JobFilter {
    JobFilter {
        limit: Some(100_000),
        ..Default::default()
    }
}

/// Strings that text and CSV COPY would need escaped, and some that JSON escapes.
fn awkward_args() -> serde_json::Value {
    serde_json::json!({
        "tab": "a\tb",
        "newline": "line1\nline2\r\nline3",
        "backslash": "C:\\path\\N and \\. and \\\\",
        "quotes": "\"double\" 'single' `back`",
        "copy_markers": "\\N",
        "csv": "a,b;\"c\"",
        "array_syntax": "{1,2} NULL",
        "control": "\u{1}\u{7}\u{1b}[0m",
        "unicode": "é 漢字 🎉 \u{2028}",
        "nested": [1, -2.5, 1e300, null, true, {"k": "v", "empty": {}}, []],
        "key with \"quote\" and \\": "ok",
    })
}

#[tokio::test]
async fn copy_rows_land_like_insert_jobs() {
    let db = TestDb::new().await;
    let opts = InsertOpts {
        queue: "copy q".into(),
        priority: 1,
        max_attempts: 7,
        tags: vec![
            "plain".into(),
            "with,comma".into(),
            "{brace}".into(),
            "\"quoted\"".into(),
            "back\\slash".into(),
            "NULL".into(),
            " spaced ".into(),
            "tab\there".into(),
        ],
        metadata: serde_json::json!({"trace": "x\ny", "n": 1, "deep": {"a": [1, "\\"]}}),
        unique: Some(UniqueOpts::default()),
        ordering_key: Some("order\t\\key".into()),
        ..Default::default()
    };
    let copied = vec![
        new_job("awkward", awkward_args(), opts.clone()),
        new_job("plain", serde_json::json!({}), InsertOpts::default()),
    ];
    let n = insert_many_copy(&mut db.pool.acquire().await.expect("conn"), &copied)
        .await
        .expect("copy");
    assert_eq!(n, 2);

    // The same jobs through insert_jobs (without the unique key, which would conflict) are the
    // reference for every column COPY sends or leaves to a default.
    let reference: Vec<NewJob> = copied
        .iter()
        .cloned()
        .map(|mut j| {
            j.unique_key = None;
            j.unique_states = None;
            j
        })
        .collect();
    let inserted = awa_core::insert_jobs(&db.pool, &reference)
        .await
        .expect("insert_jobs");
    let mut rows = list_jobs(&db.pool, &all_jobs()).await.expect("list");
    rows.sort_by_key(|r| r.id);
    assert_eq!(rows.len(), 4);
    for (row, (want, reference)) in rows[..2].iter().zip(copied.iter().zip(&inserted)) {
        assert_eq!(row.kind, want.kind);
        assert_eq!(row.queue, want.queue);
        assert_eq!(row.args, want.args);
        assert_eq!(row.priority, want.priority);
        assert_eq!(row.max_attempts, want.max_attempts);
        assert_eq!(row.tags, want.tags);
        assert_eq!(row.metadata, want.metadata);
        assert_eq!(row.unique_key, want.unique_key);
        assert_eq!(row.unique_states, want.unique_states.map(i16::from));
        assert_eq!(row.ordering_key, want.ordering_key);
        assert_eq!(row.state, JobState::Available);
        // Defaults the COPY leaves to the table match what insert_jobs stores.
        assert_eq!(
            (row.attempt, &row.errors, row.run_lease, &row.progress),
            (
                reference.attempt,
                &reference.errors,
                reference.run_lease,
                &reference.progress
            )
        );
        assert_eq!(
            (row.heartbeat_at, row.finalized_at, &row.callback_id),
            (None, None, &None)
        );
    }
    assert_eq!(rows[0].args, awkward_args(), "special characters survive");
    assert!(rows[0]
        .unique_key
        .as_ref()
        .is_some_and(|k| k.len() == awa_core::model::unique_key::KEY_LEN));
    // jsonb compares equal to the same document inserted as a parameter.
    let same: bool = sqlx::query_scalar("SELECT args = $1 FROM awa.jobs WHERE id = $2")
        .bind(awkward_args())
        .bind(rows[0].id)
        .fetch_one(&db.pool)
        .await
        .expect("compare");
    assert!(same);
}

#[tokio::test]
async fn copy_returning_gives_the_stored_rows_in_input_order() {
    let db = TestDb::new().await;
    // A row inserted first, so the drawn ids do not start at 1.
    insert(&db.pool, SendEmail { to: "first".into() })
        .await
        .expect("insert");
    let future = Utc::now() + Duration::hours(1);
    let jobs: Vec<NewJob> = (0..300)
        .map(|i| {
            let opts = InsertOpts {
                run_at: (i == 7).then_some(future),
                ..Default::default()
            };
            new_job("ret", serde_json::json!({ "i": i }), opts)
        })
        .collect();
    let mut conn = db.pool.acquire().await.expect("conn");
    let rows = awa_core::insert_many_copy_returning(&mut conn, &jobs)
        .await
        .expect("copy");
    let order: Vec<i64> = rows
        .iter()
        .map(|r| r.args["i"].as_i64().expect("i"))
        .collect();
    assert_eq!(order, (0..300).collect::<Vec<_>>(), "input order");
    assert_eq!(rows[7].state, JobState::Scheduled);
    assert_eq!(rows[0].state, JobState::Available);
    for row in [&rows[0], &rows[7], &rows[299]] {
        let stored = get_job(&db.pool, row.id).await.expect("get");
        assert_eq!(
            (
                stored.args.clone(),
                stored.state,
                stored.run_at,
                stored.created_at
            ),
            (row.args.clone(), row.state, row.run_at, row.created_at)
        );
    }
    // A conflict writes nothing and returns no rows.
    let unique = InsertOpts {
        unique: Some(UniqueOpts::default()),
        ..Default::default()
    };
    let twins = vec![
        new_job("twin", serde_json::json!({}), unique.clone()),
        new_job("twin", serde_json::json!({}), unique),
    ];
    assert!(matches!(
        awa_core::insert_many_copy_returning(&mut conn, &twins).await,
        Err(AwaError::UniqueConflict { .. })
    ));
    assert_eq!(
        list_jobs(&db.pool, &all_jobs()).await.expect("list").len(),
        301
    );
}

#[tokio::test]
async fn copy_schedules_future_run_at_and_defaults_run_at_to_now() {
    let db = TestDb::new().await;
    let at = |run_at| InsertOpts {
        run_at,
        ..Default::default()
    };
    let future = Utc::now() + Duration::hours(1);
    let past = Utc.with_ymd_and_hms(2001, 2, 3, 4, 5, 6).unwrap();
    // One batch mixing all three: the state and run_at columns are sent.
    let mixed = vec![
        new_job("later", serde_json::json!({}), at(Some(future))),
        new_job("past", serde_json::json!({}), at(Some(past))),
        new_job("now", serde_json::json!({}), at(None)),
    ];
    let mut conn = db.pool.acquire().await.expect("conn");
    assert_eq!(insert_many_copy(&mut conn, &mixed).await.expect("copy"), 3);
    // A batch without any run_at: state and run_at are the column defaults.
    let plain = vec![new_job("plain", serde_json::json!({}), at(None))];
    insert_many_copy(&mut conn, &plain).await.expect("copy");
    let db_now: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *conn)
        .await
        .expect("now");
    let rows = list_jobs(&db.pool, &all_jobs()).await.expect("list");
    let by_kind = |k: &str| rows.iter().find(|r| r.kind == k).expect(k);
    let later = by_kind("later");
    assert_eq!(later.state, JobState::Scheduled);
    assert_eq!(later.run_at.timestamp_micros(), future.timestamp_micros());
    assert_eq!(
        (by_kind("past").state, by_kind("past").run_at),
        (JobState::Available, past)
    );
    for k in ["now", "plain"] {
        let row = by_kind(k);
        assert_eq!(row.state, JobState::Available, "{k}");
        assert!(row.run_at <= db_now, "{k}: run_at is the database's now");
        assert!(db_now - row.run_at < Duration::seconds(30), "{k}");
    }
}

#[tokio::test]
async fn copy_unique_conflict_is_typed_and_writes_nothing() {
    let db = TestDb::new().await;
    let unique = |to: &str| {
        new_job(
            "send_email",
            serde_json::json!({"to": to}),
            InsertOpts {
                unique: Some(UniqueOpts::default()),
                ..Default::default()
            },
        )
    };
    insert_with(
        &db.pool,
        EnqueueRequest::new(email("dupe")).unique(UniqueOpts::default()),
    )
    .await
    .expect("seed");
    // A conflict with a stored row, after enough rows to span several chunks.
    let mut batch: Vec<NewJob> = (0..5_000).map(|i| unique(&format!("fresh{i}"))).collect();
    batch.push(unique("dupe"));
    let mut conn = db.pool.acquire().await.expect("conn");
    let err = insert_many_copy(&mut conn, &batch)
        .await
        .expect_err("conflict");
    assert!(
        matches!(&err, AwaError::UniqueConflict { kind } if kind == "send_email"),
        "{err:?}"
    );
    // A conflict within the batch itself.
    let err = insert_many_copy(&mut conn, &[unique("twin"), unique("twin")])
        .await
        .expect_err("conflict");
    assert!(matches!(err, AwaError::UniqueConflict { .. }), "{err:?}");
    // The same connection is usable afterwards, and only the seed is stored.
    assert_eq!(count_jobs(&mut *conn).await, 1);
    assert_eq!(
        insert_many_copy(&mut conn, &batch[..5_000])
            .await
            .expect("without the duplicate"),
        5_000
    );
    assert_eq!(count_jobs(&mut *conn).await, 5_001);
}

#[tokio::test]
async fn copy_follows_the_callers_transaction() {
    let db = TestDb::new().await;
    let jobs: Vec<NewJob> = (0..3)
        .map(|i| {
            new_job(
                "tx_copy",
                serde_json::json!({"i": i}),
                InsertOpts::default(),
            )
        })
        .collect();

    let mut tx = db.pool.begin().await.expect("begin");
    assert_eq!(insert_many_copy(&mut tx, &jobs).await.expect("copy"), 3);
    assert_eq!(
        count_jobs(&mut *tx).await,
        3,
        "visible inside the transaction"
    );
    assert_eq!(count_jobs(&db.pool).await, 0, "invisible outside it");
    tx.rollback().await.expect("rollback");
    assert_eq!(count_jobs(&db.pool).await, 0);

    let mut tx = db.pool.begin().await.expect("begin");
    insert(&mut *tx, email("own row")).await.expect("insert");
    insert_many_copy(&mut tx, &jobs).await.expect("copy");
    tx.commit().await.expect("commit");
    assert_eq!(count_jobs(&db.pool).await, 4);

    // A conflict aborts the caller's transaction, which then rolls back as a whole.
    let unique = InsertOpts {
        unique: Some(UniqueOpts::default()),
        ..Default::default()
    };
    let twins = vec![
        new_job("twin", serde_json::json!({}), unique.clone()),
        new_job("twin", serde_json::json!({}), unique),
    ];
    let mut tx = db.pool.begin().await.expect("begin");
    insert(&mut *tx, email("lost")).await.expect("insert");
    assert!(matches!(
        insert_many_copy(&mut tx, &twins).await,
        Err(AwaError::UniqueConflict { .. })
    ));
    tx.rollback().await.expect("rollback");
    assert_eq!(count_jobs(&db.pool).await, 4);
}

#[tokio::test]
async fn copy_wakes_listeners_once_per_queue() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url)
        .await
        .expect("listener");
    listener
        .listen_all(["awa:copy_a", "awa:copy_b", "awa:copy_later"])
        .await
        .expect("listen");
    let in_queue = |queue: &str, run_at| {
        new_job(
            "wake",
            serde_json::json!({}),
            InsertOpts {
                queue: queue.into(),
                run_at,
                ..Default::default()
            },
        )
    };
    let later = Some(Utc::now() + Duration::hours(1));
    let jobs = vec![
        in_queue("copy_a", None),
        in_queue("copy_a", None),
        in_queue("copy_b", None),
        in_queue("copy_later", later),
    ];
    insert_many_copy(&mut db.pool.acquire().await.expect("conn"), &jobs)
        .await
        .expect("copy");
    let mut channels = Vec::new();
    while let Ok(n) =
        tokio::time::timeout(std::time::Duration::from_millis(500), listener.recv()).await
    {
        channels.push(n.expect("notification").channel().to_string());
    }
    channels.sort();
    // The statement-level trigger fired once for the COPY: one NOTIFY per queue with due
    // available jobs, none for the queue whose only job is scheduled.
    assert_eq!(channels, ["awa:copy_a", "awa:copy_b"]);
}

#[tokio::test]
async fn copy_of_nothing_and_without_schema() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.expect("conn");
    assert_eq!(insert_many_copy(&mut conn, &[]).await.expect("empty"), 0);
    let bare = TestDb::empty().await;
    let mut conn = bare.pool.acquire().await.expect("conn");
    let job = new_job("k", serde_json::json!({}), InsertOpts::default());
    assert!(matches!(
        insert_many_copy(&mut conn, &[job]).await,
        Err(AwaError::SchemaNotMigrated { .. })
    ));
    sqlx::query("SELECT 1")
        .execute(&mut *conn)
        .await
        .expect("the connection is usable after a refused COPY");
}

/// `pool_options` skips sqlx's ping on a connection used a moment ago but still pings one that
/// sat idle: a backend that died while idle is replaced, and the insert succeeds.
#[tokio::test]
async fn pool_options_replace_a_connection_that_died_while_idle() {
    let db = TestDb::new().await;
    let pool = db.pool(1).await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("pid");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .expect("terminate");
    assert!(killed);
    tokio::time::sleep(
        awa_core::storage::pool::IDLE_PING_AFTER + std::time::Duration::from_millis(200),
    )
    .await;
    let row = insert(&pool, email("after-restart@example.com"))
        .await
        .expect("the idle ping finds the dead connection and the pool opens a new one");
    let new_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("pid");
    assert_ne!(new_pid, pid);
    assert_eq!(
        get_job(&pool, row.id).await.expect("get").state,
        JobState::Available
    );
}
