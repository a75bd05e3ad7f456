//! Periodic jobs against a real database: exactly one job per fire time across clients, leader
//! failover and injected crashes; missed-fire policies; operations; bad definitions.

mod common;
mod support;

use awa_core::cron::fault::{self, CronPoint};
use awa_core::cron::{self, MissedFirePolicy, PeriodicJob, Schedule, CATCH_UP_LIMIT};
use awa_core::storage::pool::Db;
use awa_core::{AwaError, Client, InsertOpts, JobArgs, JobResult, QueueConfig};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use common::TestDb;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use support::{eventually, fast_config};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick {
    n: i64,
}
impl JobArgs for Tick {}

/// A schedule whose jobs go to queue "cron", which no test client works, so they stay put.
fn every_second(name: &str) -> PeriodicJob {
    PeriodicJob::new(name, "* * * * * *", &Tick { n: 1 })
        .expect("args")
        .opts(InsertOpts {
            queue: "cron".into(),
            ..InsertOpts::default()
        })
}

fn client(pool: impl Into<Db>, job: PeriodicJob) -> Client {
    Client::builder(pool)
        .queue("other", QueueConfig::new(1))
        .config(fast_config())
        .register::<Tick, _, _>(|_a, _c| async move { Ok(JobResult::Completed) })
        .periodic(job)
        .build()
        .expect("build")
}

/// Fire times of the jobs a schedule enqueued (automatic fires only), in order, with
/// duplicates kept so a test can see them.
async fn fire_times(pool: &Db, name: &str) -> Vec<DateTime<Utc>> {
    let texts: Vec<String> = sqlx::query_scalar(
        "SELECT metadata->>'awa:cron_fire_at' FROM awa.jobs
         WHERE metadata->>'awa:cron_name' = $1 AND NOT metadata ? 'awa:cron_triggered'
         ORDER BY 1",
    )
    .bind(name)
    .fetch_all(pool)
    .await
    .expect("fire times");
    texts
        .iter()
        .map(|t| {
            DateTime::parse_from_rfc3339(t)
                .expect("rfc3339")
                .with_timezone(&Utc)
        })
        .collect()
}

/// Every fire time once, and no second missing between the first and the last.
fn assert_each_second_once(fires: &[DateTime<Utc>]) {
    let mut distinct = fires.to_vec();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        fires.len(),
        "a fire time enqueued twice: {fires:?}"
    );
    let span = (*fires.last().unwrap() - fires[0]).num_seconds() + 1;
    assert_eq!(span as usize, fires.len(), "a fire time lost: {fires:?}");
}

async fn wait_for_fires(pool: &Db, name: &str, n: usize) -> Vec<DateTime<Utc>> {
    eventually(
        &format!("{n} fires of {name}"),
        Duration::from_secs(20),
        || async {
            let f = fire_times(pool, name).await;
            (f.len() >= n).then_some(f)
        },
    )
    .await
}

#[tokio::test]
async fn two_clients_enqueue_one_job_per_fire_time() {
    let db = TestDb::new().await;
    let a = client(db.pool.clone(), every_second("tick"));
    let b = client(db.pool.clone(), every_second("tick"));
    a.start().await.expect("start a");
    b.start().await.expect("start b");
    wait_for_fires(&db.pool, "tick", 4).await;
    a.shutdown(Duration::from_secs(2)).await;
    b.shutdown(Duration::from_secs(2)).await;
    let fires = fire_times(&db.pool, "tick").await;
    assert_each_second_once(&fires);
    // Every fired job carries the schedule name and its fire time.
    let meta: serde_json::Value =
        sqlx::query_scalar("SELECT metadata FROM awa.jobs WHERE queue = 'cron' LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(meta["awa:cron_name"], "tick");
    assert!(meta["awa:cron_fire_at"].is_string());
}

#[tokio::test]
async fn concurrent_evaluations_enqueue_each_fire_once() {
    // Many evaluators at once, with the same clock: the compare-and-set lets one win per
    // schedule state; the losers roll back their inserts.
    let db = TestDb::new().await;
    let job = PeriodicJob::new("race", "* * * * * *", &Tick { n: 1 })
        .unwrap()
        .missed_fire_policy(MissedFirePolicy::CatchUp);
    cron::upsert(&db.pool, &[job]).await.unwrap();
    let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    set_last(&db.pool, "race", t0).await;
    for step in 1..=5 {
        let now = t0 + ChronoDuration::seconds(10 * step);
        let runs = (0..8).map(|_| {
            let pool = db.pool.clone();
            tokio::spawn(async move { cron::evaluate_at(&pool, now).await.unwrap() })
        });
        let total: usize = futures_util::future::join_all(runs)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .sum();
        assert_eq!(total, 10, "step {step}: ten new fires, enqueued once");
    }
    let fires = fire_times(&db.pool, "race").await;
    assert_eq!(fires.len(), 50);
    assert_each_second_once(&fires);
}

/// Run a client on a runtime of its own, in a thread, until told to die; then drop the
/// runtime, which ends its tasks mid-flight and closes its connections as a crash would.
fn crashable_client(
    url: String,
    job: PeriodicJob,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (kill, killed) = std::sync::mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let c = rt.block_on(async {
            let pool = awa_core::pool_options()
                .max_connections(4)
                .connect(&url)
                .await
                .expect("connect");
            let c = client(pool, job);
            c.start().await.expect("start");
            c
        });
        let _ = killed.recv();
        rt.shutdown_background();
        // Its pool belonged to the runtime that is gone: never run its destructor.
        std::mem::forget(c);
    });
    (kill, handle)
}

#[tokio::test]
async fn a_killed_leader_neither_double_fires_nor_loses_fires() {
    let db = TestDb::new().await;
    let (kill, a) = crashable_client(db.url.clone(), every_second("beat"));
    let before = wait_for_fires(&db.pool, "beat", 2).await.len();
    let b = client(db.pool.clone(), every_second("beat"));
    b.start().await.expect("start b");
    kill.send(()).unwrap();
    a.join().unwrap();
    // b takes over within its election interval and carries on from last_enqueued_at.
    wait_for_fires(&db.pool, "beat", before + 3).await;
    eventually("b leads", Duration::from_secs(10), || async {
        b.is_leader().await.then_some(())
    })
    .await;
    b.shutdown(Duration::from_secs(2)).await;
    assert_each_second_once(&fire_times(&db.pool, "beat").await);
}

#[tokio::test]
async fn a_crash_inside_the_fire_transaction_enqueues_nothing_and_the_next_pass_enqueues_once() {
    let db = TestDb::new().await;
    let job = PeriodicJob::new("crash", "*/10 * * * * *", &Tick { n: 1 }).unwrap();
    cron::upsert(&db.pool, &[job]).await.unwrap();
    let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    set_last(&db.pool, "crash", t0).await;
    let now = t0 + ChronoDuration::seconds(1);

    // Before COMMIT: the insert and the compare-and-set roll back together.
    let at = t0 + ChronoDuration::seconds(10);
    fault::arm(CronPoint::BeforeCommit, "crash");
    assert_eq!(cron::evaluate_at(&db.pool, at).await.unwrap(), 0);
    assert!(fire_times(&db.pool, "crash").await.is_empty());
    assert_eq!(last(&db.pool, "crash").await, Some(t0));
    assert_eq!(cron::evaluate_at(&db.pool, at).await.unwrap(), 1);
    assert_eq!(fire_times(&db.pool, "crash").await, [at]);

    // After COMMIT (the acknowledgement lost): the fire is in, and is not enqueued again.
    let at2 = at + ChronoDuration::seconds(10);
    fault::arm(CronPoint::AfterCommit, "crash");
    assert_eq!(cron::evaluate_at(&db.pool, at2).await.unwrap(), 0);
    assert_eq!(cron::evaluate_at(&db.pool, at2).await.unwrap(), 0);
    assert_eq!(fire_times(&db.pool, "crash").await, [at, at2]);
    assert!(now < at);
}

async fn set_last(pool: &Db, name: &str, at: DateTime<Utc>) {
    sqlx::query(
        "UPDATE awa.cron_jobs SET last_enqueued_at = $2, next_fire_at = NULL WHERE name = $1",
    )
    .bind(name)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
}

async fn last(pool: &Db, name: &str) -> Option<DateTime<Utc>> {
    cron::get(pool, name)
        .await
        .unwrap()
        .expect("schedule")
        .last_enqueued_at
}

#[tokio::test]
async fn coalesce_and_catch_up_after_the_leader_was_away() {
    let db = TestDb::new().await;
    let hourly = |name: &str, policy| {
        PeriodicJob::new(name, "0 * * * *", &Tick { n: 1 })
            .unwrap()
            .missed_fire_policy(policy)
    };
    cron::upsert(
        &db.pool,
        &[
            hourly("co", MissedFirePolicy::Coalesce),
            hourly("cu", MissedFirePolicy::CatchUp),
        ],
    )
    .await
    .unwrap();
    // The leader last evaluated at 05:30 and comes back at 10:30.
    let t0: DateTime<Utc> = "2026-01-01T05:30:00Z".parse().unwrap();
    let now: DateTime<Utc> = "2026-01-01T10:30:00Z".parse().unwrap();
    set_last(&db.pool, "co", t0).await;
    set_last(&db.pool, "cu", t0).await;
    assert_eq!(cron::evaluate_at(&db.pool, now).await.unwrap(), 6);
    let h = |s: &str| -> DateTime<Utc> { format!("2026-01-01T{s}:00:00Z").parse().unwrap() };
    assert_eq!(fire_times(&db.pool, "co").await, [h("10")]);
    assert_eq!(
        fire_times(&db.pool, "cu").await,
        [h("06"), h("07"), h("08"), h("09"), h("10")]
    );
    assert_eq!(last(&db.pool, "co").await, Some(h("10")));
    // Nothing more is due until 11:00.
    assert_eq!(cron::evaluate_at(&db.pool, now).await.unwrap(), 0);
}

#[tokio::test]
async fn catch_up_is_bounded_per_evaluation_and_resumes_in_order() {
    let db = TestDb::new().await;
    let job = every_second("many").missed_fire_policy(MissedFirePolicy::CatchUp);
    cron::upsert(&db.pool, &[job]).await.unwrap();
    let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    set_last(&db.pool, "many", t0).await;
    let now = t0 + ChronoDuration::seconds(250);
    assert_eq!(
        cron::evaluate_at(&db.pool, now).await.unwrap(),
        CATCH_UP_LIMIT
    );
    assert_eq!(
        cron::evaluate_at(&db.pool, now).await.unwrap(),
        CATCH_UP_LIMIT
    );
    assert_eq!(cron::evaluate_at(&db.pool, now).await.unwrap(), 50);
    assert_eq!(cron::evaluate_at(&db.pool, now).await.unwrap(), 0);
    let fires = fire_times(&db.pool, "many").await;
    assert_eq!(fires.len(), 250);
    assert_each_second_once(&fires);
}

#[tokio::test]
async fn a_real_leader_applies_the_policy_to_missed_fires() {
    // No injected clock: the leader evaluates against the database clock. The schedules fire
    // each 1 January; last_enqueued_at set five years back means five missed fires.
    let db = TestDb::new().await;
    let yearly = |name: &str, policy| {
        PeriodicJob::new(name, "0 0 1 1 *", &Tick { n: 1 })
            .unwrap()
            .missed_fire_policy(policy)
            .opts(InsertOpts {
                queue: "cron".into(),
                ..InsertOpts::default()
            })
    };
    cron::upsert(
        &db.pool,
        &[
            yearly("y_co", MissedFirePolicy::Coalesce),
            yearly("y_cu", MissedFirePolicy::CatchUp),
        ],
    )
    .await
    .unwrap();
    sqlx::query(
        "UPDATE awa.cron_jobs SET last_enqueued_at = now() - interval '5 years' + interval '1 day'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let after = last(&db.pool, "y_cu").await.unwrap();
    let c = Client::builder(db.pool.clone())
        .queue("other", QueueConfig::new(1))
        .config(fast_config())
        .register::<Tick, _, _>(|_a, _c| async move { Ok(JobResult::Completed) })
        .build()
        .unwrap();
    c.start().await.unwrap();
    let cu = wait_for_fires(&db.pool, "y_cu", 5).await;
    let co = wait_for_fires(&db.pool, "y_co", 1).await;
    c.shutdown(Duration::from_secs(2)).await;
    let oracle = Schedule::parse("0 0 1 1 *", "UTC")
        .unwrap()
        .fires_between(after, Utc::now(), 100);
    assert_eq!(cu, oracle);
    assert_eq!(co, [*oracle.last().unwrap()]);
}

#[tokio::test]
async fn bad_definitions_fail_at_build_naming_the_problem() {
    let db = TestDb::new().await;
    let build = |job: PeriodicJob| {
        Client::builder(db.pool.clone())
            .queue("other", QueueConfig::new(1))
            .periodic(job)
            .build()
    };
    let cases = [
        (
            PeriodicJob::new("e", "61 * * * *", &Tick { n: 1 }).unwrap(),
            "invalid cron expression \"61 * * * *\"",
        ),
        (
            PeriodicJob::new("f", "* * *", &Tick { n: 1 }).unwrap(),
            "got 3",
        ),
        (
            PeriodicJob::new("z", "* * * * *", &Tick { n: 1 })
                .unwrap()
                .timezone("Mars/Olympus"),
            "invalid timezone \"Mars/Olympus\"",
        ),
        (
            PeriodicJob::new("p", "* * * * *", &Tick { n: 1 })
                .unwrap()
                .opts(InsertOpts {
                    priority: 9,
                    ..InsertOpts::default()
                }),
            "priority is 9",
        ),
        (
            PeriodicJob::new("", "* * * * *", &Tick { n: 1 }).unwrap(),
            "name",
        ),
    ];
    for (job, needle) in cases {
        let name = job.name.clone();
        match build(job) {
            Err(AwaError::Config(msg)) => {
                assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
                assert!(
                    msg.contains(&format!("{name:?}")),
                    "{msg:?} names the schedule"
                );
            }
            Err(e) => panic!("{name}: unexpected error {e:?}"),
            Ok(_) => panic!("{name}: accepted"),
        }
    }
    assert!(matches!(
        MissedFirePolicy::parse("sometimes"),
        Err(AwaError::Config(m)) if m.contains("missed_fire_policy")
    ));
}

#[tokio::test]
async fn list_pause_resume_trigger_delete_and_upsert() {
    let db = TestDb::new().await;
    let job = PeriodicJob::new("ops", "0 * * * *", &Tick { n: 7 })
        .unwrap()
        .timezone("Europe/London")
        .opts(InsertOpts {
            queue: "cron".into(),
            priority: 3,
            tags: vec!["nightly".into()],
            metadata: serde_json::json!({"team": "data"}),
            ..InsertOpts::default()
        });
    let c = client(db.pool.clone(), job.clone());
    c.start().await.unwrap();
    let rows = c.list_cron_jobs().await.unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (
            row.name.as_str(),
            row.cron_expr.as_str(),
            row.timezone.as_str()
        ),
        ("ops", "0 * * * *", "Europe/London")
    );
    assert_eq!(
        (row.kind.as_str(), row.queue.as_str(), row.priority),
        ("tick", "cron", 3)
    );
    assert_eq!(row.args, serde_json::json!({"n": 7}));
    assert_eq!(row.missed_fire_policy, "coalesce");
    assert!(!row.paused);
    // The leader evaluates it and records the next fire.
    let next = eventually("next_fire_at", Duration::from_secs(10), || async {
        cron::get(&db.pool, "ops")
            .await
            .unwrap()
            .unwrap()
            .next_fire_at
    })
    .await;
    assert!(next > Utc::now() - ChronoDuration::seconds(5));
    c.shutdown(Duration::from_secs(2)).await;

    // Re-registering the same definition changes nothing; a changed one updates the row.
    let before = cron::get(&db.pool, "ops").await.unwrap().unwrap();
    cron::upsert(&db.pool, std::slice::from_ref(&job))
        .await
        .unwrap();
    assert_eq!(
        cron::get(&db.pool, "ops")
            .await
            .unwrap()
            .unwrap()
            .updated_at,
        before.updated_at
    );
    let changed = job.clone().missed_fire_policy(MissedFirePolicy::CatchUp);
    cron::upsert(&db.pool, &[changed]).await.unwrap();
    let after = cron::get(&db.pool, "ops").await.unwrap().unwrap();
    assert_eq!(after.missed_fire_policy, "catch_up");
    assert!(after.updated_at > before.updated_at);

    // Paused: no automatic fires; trigger still enqueues one now.
    let t0: DateTime<Utc> = "2026-01-01T05:30:00Z".parse().unwrap();
    set_last(&db.pool, "ops", t0).await;
    assert!(c.pause_cron_job("ops").await.unwrap());
    assert!(cron::get(&db.pool, "ops").await.unwrap().unwrap().paused);
    let now: DateTime<Utc> = "2026-01-01T08:30:00Z".parse().unwrap();
    assert_eq!(cron::evaluate_at(&db.pool, now).await.unwrap(), 0);
    let triggered = c.trigger_cron_job("ops").await.unwrap().expect("a job");
    assert_eq!(triggered.kind, "tick");
    assert_eq!(triggered.queue, "cron");
    assert_eq!(triggered.priority, 3);
    assert_eq!(triggered.tags, ["nightly"]);
    assert_eq!(triggered.metadata["team"], "data");
    assert_eq!(triggered.metadata["awa:cron_name"], "ops");
    assert_eq!(triggered.metadata["awa:cron_triggered"], true);
    assert_eq!(
        last(&db.pool, "ops").await,
        Some(t0),
        "trigger leaves the schedule alone"
    );

    // Resumed: the missed fires follow the policy (catch_up: 06:00, 07:00, 08:00).
    assert!(c.resume_cron_job("ops").await.unwrap());
    assert_eq!(cron::evaluate_at(&db.pool, now).await.unwrap(), 3);
    assert_eq!(fire_times(&db.pool, "ops").await.len(), 3);

    // Unknown names.
    assert!(!c.pause_cron_job("nope").await.unwrap());
    assert!(!c.resume_cron_job("nope").await.unwrap());
    assert!(c.trigger_cron_job("nope").await.unwrap().is_none());

    assert!(c.delete_cron_job("ops").await.unwrap());
    assert!(!c.delete_cron_job("ops").await.unwrap());
    assert!(c.list_cron_jobs().await.unwrap().is_empty());
}
