//! Unique keys across the upgrade to awa's BLAKE3 layout (migration 9), and the refusal of a
//! foreign `awa` schema (issue 13, items 6 and 8). The byte equality with awa-pg's keys is the
//! unit test `model::unique_key::tests::matches_awa_pg_vectors`; the real awa-pg schema is
//! refused in `tests/test_unique_keys.py`, which runs awa-pg 0.6.9's own migrate.

mod common;

use awa_core::model::unique_key::{self, KeyParts};
use awa_core::model::DEFAULT_UNIQUE_STATES;
use awa_core::storage::key_rewrite::legacy_key;
use awa_core::storage::migrations::{current_version, latest_version, migrate_to, pending_sql};
use awa_core::{insert_with, AwaError, EnqueueRequest, InsertOpts, JobArgs, JobRow, UniqueOpts};
use chrono::Utc;
use common::TestDb;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Debug, Serialize, Deserialize)]
struct SendEmail {
    to: String,
}
impl JobArgs for SendEmail {}

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    day: i64,
}
impl JobArgs for Report {}

#[derive(Debug, Serialize, Deserialize)]
struct Nightly {
    n: i64,
}
impl JobArgs for Nightly {}

#[derive(Debug, Serialize, Deserialize)]
struct OddPeriod {
    n: i64,
}
impl JobArgs for OddPeriod {}

/// Insert a row as the library did before migration 9: the SHA-256 key of these parts.
async fn insert_old(
    db: &TestDb,
    kind: &str,
    queue: &str,
    args: Value,
    parts: (bool, bool, Option<i64>),
    state: &str,
) -> i64 {
    let (by_queue, by_args, period) = parts;
    let bucket = period.map(|p| Utc::now().timestamp().div_euclid(p));
    let key = legacy_key(
        kind,
        by_queue.then_some(queue),
        by_args.then_some(&args),
        bucket,
    );
    sqlx::query_scalar(
        "INSERT INTO awa.jobs (kind, queue, args, state, unique_key, unique_states)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(kind)
    .bind(queue)
    .bind(&args)
    .bind(state)
    .bind(key)
    .bind(i16::from(DEFAULT_UNIQUE_STATES))
    .fetch_one(&db.pool)
    .await
    .expect("insert an old-form row")
}

async fn put<A: JobArgs>(
    pool: &awa_core::Db,
    args: A,
    opts: InsertOpts,
) -> Result<JobRow, AwaError> {
    insert_with(pool, EnqueueRequest::new(args).with_opts(opts)).await
}

fn unique(by_queue: bool, by_args: bool, by_period: Option<i64>) -> InsertOpts {
    InsertOpts {
        unique: Some(UniqueOpts {
            by_queue,
            by_args,
            by_period,
            ..UniqueOpts::default()
        }),
        ..InsertOpts::default()
    }
}

async fn key_of(db: &TestDb, id: i64) -> Vec<u8> {
    sqlx::query_scalar("SELECT unique_key FROM awa.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .expect("read the key")
}

fn is_conflict<T: std::fmt::Debug>(r: &Result<T, AwaError>) -> bool {
    matches!(r, Err(AwaError::UniqueConflict { .. }))
}

#[tokio::test]
async fn upgrade_rewrites_old_keys_and_keeps_uniqueness() {
    let db = TestDb::empty().await;
    migrate_to(&db.pool, 5).await.expect("migrate to version 5");
    db.isolate_ids().await;
    let email = insert_old(
        &db,
        "send_email",
        "default",
        json!({"to": "a"}),
        (false, true, None),
        "available",
    )
    .await;
    let report = insert_old(
        &db,
        "report",
        "reports",
        json!({"day": 1}),
        (true, true, None),
        "completed",
    )
    .await;
    let nightly = insert_old(
        &db,
        "nightly",
        "default",
        json!({"n": 1}),
        (false, false, Some(86_400)),
        "scheduled",
    )
    .await;
    let odd = insert_old(
        &db,
        "odd_period",
        "default",
        json!({"n": 1}),
        (false, false, Some(1234)),
        "available",
    )
    .await;

    awa_core::migrate(&db.pool).await.expect("upgrade");
    assert_eq!(current_version(&db.pool).await.unwrap(), latest_version());
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM awa.pending_steps")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pending, 0, "the rewrite step ran and was cleared");

    // Rewritten to exactly the key a new insert of the same parts computes.
    let new_email = unique_key::compute(KeyParts {
        kind: "send_email",
        queue: None,
        args: Some(&json!({"to": "a"})),
        period_bucket: None,
    });
    assert_eq!(key_of(&db, email).await, new_email);
    assert_eq!(key_of(&db, report).await.len(), unique_key::KEY_LEN);
    assert_eq!(key_of(&db, nightly).await.len(), unique_key::KEY_LEN);
    // A period the step does not try keeps its old key (documented).
    assert_eq!(key_of(&db, odd).await.len(), 32);

    // Conflicting inserts after the upgrade still conflict...
    let again = put(
        &db.pool,
        SendEmail { to: "a".into() },
        unique(false, true, None),
    )
    .await;
    assert!(is_conflict(&again), "{again:?}");
    let mut reports = unique(true, true, None);
    reports.queue = "reports".into();
    let again = put(&db.pool, Report { day: 1 }, reports.clone()).await;
    assert!(
        is_conflict(&again),
        "completed is a unique state: {again:?}"
    );
    let again = put(
        &db.pool,
        Nightly { n: 2 },
        unique(false, false, Some(86_400)),
    )
    .await;
    assert!(is_conflict(&again), "same day, kind only: {again:?}");
    // ...and non-conflicting ones do not.
    put(
        &db.pool,
        SendEmail { to: "b".into() },
        unique(false, true, None),
    )
    .await
    .expect("other args");
    put(&db.pool, Report { day: 2 }, reports)
        .await
        .expect("other args in the same queue");
    // The unresolved row no longer deduplicates against new inserts (documented limitation).
    put(
        &db.pool,
        OddPeriod { n: 1 },
        unique(false, false, Some(1234)),
    )
    .await
    .expect("an unresolved old key does not block a new one");

    // Idempotent: nothing pending, nothing changes.
    awa_core::migrate(&db.pool).await.expect("again");
    assert_eq!(key_of(&db, email).await, new_email);
}

#[tokio::test]
async fn a_schema_migrated_by_hand_gets_its_keys_rewritten_by_the_next_migrate() {
    let db = TestDb::empty().await;
    migrate_to(&db.pool, 5).await.expect("migrate to version 5");
    db.isolate_ids().await;
    let email = insert_old(
        &db,
        "send_email",
        "default",
        json!({"to": "x"}),
        (false, true, None),
        "available",
    )
    .await;
    let script = pending_sql(5);
    assert!(script.contains("pending_steps"), "{script}");
    sqlx::raw_sql(&script)
        .execute(&db.pool)
        .await
        .expect("the owner runs the SQL");
    assert_eq!(
        key_of(&db, email).await.len(),
        32,
        "SQL alone cannot rewrite"
    );
    awa_core::migrate(&db.pool)
        .await
        .expect("migrate runs the pending step");
    assert_eq!(key_of(&db, email).await.len(), unique_key::KEY_LEN);
    let again = put(
        &db.pool,
        SendEmail { to: "x".into() },
        unique(false, true, None),
    )
    .await;
    assert!(is_conflict(&again), "{again:?}");
}

#[tokio::test]
async fn new_inserts_store_the_blake3_key_of_their_parts() {
    let db = TestDb::new().await;
    let mut opts = unique(true, true, Some(3600));
    opts.queue = "mail".into();
    let run_at = Utc::now() + chrono::Duration::hours(5);
    opts.run_at = Some(run_at);
    let job = put(&db.pool, SendEmail { to: "é".into() }, opts)
        .await
        .expect("insert");
    let expect = unique_key::compute(KeyParts {
        kind: "send_email",
        queue: Some("mail"),
        args: Some(&json!({"to": "é"})),
        period_bucket: Some(unique_key::period_bucket(3600, Some(run_at))),
    });
    assert_eq!(job.unique_key, Some(expect));
}

/// The fingerprint alone (awa-pg's `schema_version.description` column, or its `jobs_hot`
/// table) is enough: migrate() refuses and changes nothing. The schema awa-pg 0.6.9 itself
/// creates is refused in tests/test_unique_keys.py.
#[tokio::test]
async fn a_foreign_schema_is_refused_and_left_alone() {
    for fingerprint in [
        "CREATE SCHEMA awa;
         CREATE TABLE awa.schema_version (version int PRIMARY KEY, description text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO awa.schema_version (version, description) VALUES (40, 'x');",
        "CREATE SCHEMA awa; CREATE TABLE awa.jobs_hot (id bigint);",
    ] {
        let db = TestDb::empty().await;
        sqlx::raw_sql(fingerprint).execute(&db.pool).await.unwrap();
        let err = awa_core::migrate(&db.pool).await.expect_err("refused");
        let AwaError::ForeignSchema {
            created_by,
            version,
            ours,
        } = &err
        else {
            panic!("not ForeignSchema: {err:?}");
        };
        assert_eq!(created_by, "awa-pg");
        assert_eq!(*ours, latest_version());
        let msg = err.to_string();
        assert!(
            msg.contains("awa-pg") && msg.contains("another database"),
            "{msg}"
        );
        if fingerprint.contains("40") {
            assert_eq!(*version, Some(40));
            assert!(msg.contains("schema version 40"), "{msg}");
        } else {
            assert_eq!(*version, None);
        }
        let tables: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'awa' AND c.relname IN ('jobs', 'canonical_jobs')",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(tables, 0, "nothing was created");
        // A client start is refused the same way.
        let client = awa_core::Client::builder(db.pool.clone())
            .queue("default", awa_core::QueueConfig::new(1))
            .build()
            .unwrap();
        let err = client.start().await.expect_err("start refused");
        assert!(matches!(err, AwaError::ForeignSchema { .. }), "{err:?}");
    }
}
