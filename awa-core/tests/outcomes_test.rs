//! Outcome delays beyond the documented limit (`MAX_OUTCOME_DELAY`, 10 years) neither panic
//! nor silently become something else: the attempt fails as a handler error naming the limit
//! (issue 12, item 4).

mod common;
mod support;

use awa_core::executor::result::MAX_OUTCOME_DELAY;
use awa_core::specs::Specs;
use awa_core::testing::work_one;
use awa_core::{get_job, insert, Client, JobArgs, JobContext, JobResult, JobState, QueueConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use support::{fast_config, handler, test_db, wait_for_state};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Delayed {
    snooze: bool,
    secs: u64,
}
impl JobArgs for Delayed {}

fn outcome(args: &Delayed) -> JobResult {
    let d = if args.secs == u64::MAX {
        Duration::MAX
    } else {
        Duration::from_secs(args.secs)
    };
    if args.snooze {
        JobResult::Snooze(d)
    } else {
        JobResult::RetryAfter(d)
    }
}

/// `Duration::MAX` used to become one day; 10¹⁵ s overflowed chrono and panicked.
const BAD: [u64; 3] = [u64::MAX, 1_000_000_000_000_000, 315_360_001];

#[tokio::test]
async fn work_one_fails_an_attempt_whose_delay_is_beyond_the_limit() {
    let db = test_db().await;
    let h = handler(|ctx: Arc<JobContext>| {
        let args: Delayed = serde_json::from_value(ctx.job().args.clone()).expect("args");
        async move { Ok(outcome(&args)) }
    });
    for snooze in [false, true] {
        for secs in BAD {
            let job = insert(&db.pool, Delayed { snooze, secs })
                .await
                .expect("insert");
            let r = work_one(&db.pool, "default", h.clone(), &Specs::default())
                .await
                .expect("work_one");
            assert_eq!(r.outcome, "retryable", "{snooze} {secs}");
            let error = r.error.unwrap_or_default();
            let field = if snooze {
                "Snooze delay"
            } else {
                "RetryAfter delay"
            };
            assert!(
                error.contains("invalid outcome") && error.contains(field),
                "{error}"
            );
            assert!(
                error.contains(&MAX_OUTCOME_DELAY.as_secs().to_string())
                    && error.contains("10 years"),
                "{error}"
            );
            let row = get_job(&db.pool, job.id).await.expect("get");
            assert_eq!(row.state, JobState::Retryable);
            let soon = chrono::Utc::now() + chrono::Duration::days(2);
            assert!(
                row.run_at < soon,
                "the backoff of an error, not the refused delay"
            );
        }
    }
    // At the limit it is honoured.
    let job = insert(
        &db.pool,
        Delayed {
            snooze: true,
            secs: MAX_OUTCOME_DELAY.as_secs(),
        },
    )
    .await
    .expect("insert");
    let r = work_one(&db.pool, "default", h.clone(), &Specs::default())
        .await
        .expect("work_one");
    assert_eq!(r.outcome, "snoozed");
    let row = get_job(&db.pool, job.id).await.expect("get");
    assert!(row.run_at > chrono::Utc::now() + chrono::Duration::days(9 * 365));
}

#[tokio::test]
async fn the_runtime_fails_such_an_attempt_and_frees_its_slot() {
    let db = test_db().await;
    let client = Client::builder(db.pool.clone())
        .queue("default", QueueConfig::new(1))
        .config(awa_core::RuntimeConfig {
            // No stale-heartbeat rescue within the test: only a clean failure ends the attempt.
            heartbeat_staleness: Duration::from_secs(600),
            ..fast_config()
        })
        .register::<Delayed, _, _>(|args, _ctx| async move { Ok(outcome(&args)) })
        .build()
        .expect("build");
    let mut ids = Vec::new();
    for snooze in [false, true] {
        for secs in BAD {
            ids.push(
                insert(&db.pool, Delayed { snooze, secs })
                    .await
                    .expect("insert")
                    .id,
            );
        }
    }
    client.start().await.expect("start");
    for id in ids {
        let row = wait_for_state(&db, id, &[JobState::Retryable], Duration::from_secs(10)).await;
        assert!(
            row.errors[0].error.contains("10 years"),
            "{}",
            row.errors[0].error
        );
    }
    client.shutdown(Duration::from_secs(5)).await;
}
