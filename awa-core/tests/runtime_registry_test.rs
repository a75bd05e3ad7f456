//! The runtime registry (issue 13, item 7; docs/runtime-registry.md): a row per running
//! client, refreshed on heartbeats and leadership changes, deleted on clean shutdown, pruned
//! by the maintenance leader when stale.

mod common;
mod support;

use awa_core::storage::runtime_instances::{list, prune_stale, RuntimeInstance};
use awa_core::{Client, JobArgs, JobResult, QueueConfig, RuntimeConfig};
use common::TestDb;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use support::{eventually, fast_config};

const T: Duration = Duration::from_secs(20);

#[derive(Debug, Serialize, Deserialize)]
struct Noop {}
impl JobArgs for Noop {}

fn client(db: &TestDb, config: RuntimeConfig) -> Client {
    Client::builder(db.pool.clone())
        .queue("alpha", QueueConfig::new(3).dlq(true))
        .queue("beta", QueueConfig::new(1))
        .config(config)
        .register::<Noop, _, _>(|_args, _ctx| async move { Ok(JobResult::Completed) })
        .build()
        .expect("build")
}

async fn row_of(db: &TestDb, id: &str) -> Option<RuntimeInstance> {
    list(&db.pool)
        .await
        .expect("list")
        .into_iter()
        .find(|r| r.instance_id == id)
}

#[tokio::test]
async fn a_running_client_has_a_row_refreshed_by_heartbeats_and_removed_on_shutdown() {
    let db = TestDb::new().await;
    let c = client(&db, fast_config());
    assert_eq!(c.instance_id().await, None);
    c.start().await.expect("start");
    let id = eventually("the row is written", T, || async { c.instance_id().await }).await;
    let row = row_of(&db, &id).await.expect("registered");
    assert_eq!(row.pid, std::process::id() as i32);
    assert_eq!(row.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(row.snapshot_interval_ms, 100);
    assert!(!row.stale);
    assert_eq!(
        row.queues,
        serde_json::json!([
            {"name": "alpha", "max_workers": 3, "deadline_ms": 1_800_000, "dlq": true},
            {"name": "beta", "max_workers": 1, "deadline_ms": 1_800_000, "dlq": false},
        ])
    );
    assert!(row.hostname.as_deref().is_some_and(|h| !h.is_empty()));
    // The only client: it becomes the leader, and its row says so.
    eventually("the row shows leadership", T, || async {
        row_of(&db, &id).await.filter(|r| r.leader).map(|_| ())
    })
    .await;
    // Each heartbeat moves last_seen_at.
    let seen = row_of(&db, &id).await.expect("row").last_seen_at;
    eventually("a heartbeat refreshes the row", T, || async {
        row_of(&db, &id)
            .await
            .filter(|r| r.last_seen_at > seen)
            .map(|_| ())
    })
    .await;
    assert_eq!(c.runtime_instances().await.expect("list").len(), 1);
    c.shutdown(Duration::from_secs(5)).await;
    assert!(
        row_of(&db, &id).await.is_none(),
        "deleted on clean shutdown"
    );
    assert!(list(&db.pool).await.expect("list").is_empty());
}

#[tokio::test]
async fn leadership_moves_and_the_rows_follow() {
    let db = TestDb::new().await;
    let a = client(&db, fast_config());
    a.start().await.expect("start a");
    let a_id = eventually("a leads", T, || async {
        let id = a.instance_id().await?;
        row_of(&db, &id).await.filter(|r| r.leader).map(|_| id)
    })
    .await;
    let b = client(&db, fast_config());
    b.start().await.expect("start b");
    let b_id = eventually("b registered", T, || async { b.instance_id().await }).await;
    let rows = list(&db.pool).await.expect("list");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].instance_id, a_id, "the leader is listed first");
    assert!(!row_of(&db, &b_id).await.expect("b").leader);
    a.shutdown(Duration::from_secs(5)).await;
    eventually("b takes over and its row says so", T, || async {
        row_of(&db, &b_id).await.filter(|r| r.leader).map(|_| ())
    })
    .await;
    let rows = list(&db.pool).await.expect("list");
    assert_eq!(rows.len(), 1, "a's row went with a: {rows:?}");
    b.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_leader_prunes_stale_rows_and_keeps_live_ones() {
    let db = TestDb::new().await;
    // A client that died an hour ago (refreshing every 100 ms), and one that refreshes hourly
    // and was seen a minute ago: only the first is stale.
    sqlx::raw_sql(
        "INSERT INTO awa.runtime_instances (hostname, pid, version, snapshot_interval_ms,
                                            started_at, last_seen_at)
         VALUES ('gone', 1, 'x', 100, now() - interval '2 hours', now() - interval '1 hour'),
                ('slow', 2, 'x', 3600000, now() - interval '2 hours', now() - interval '1 minute')",
    )
    .execute(&db.pool)
    .await
    .expect("seed");
    let rows = list(&db.pool).await.expect("list");
    let stale: Vec<_> = rows.iter().map(|r| (r.hostname.clone(), r.stale)).collect();
    assert!(stale.contains(&(Some("gone".into()), true)), "{stale:?}");
    assert!(stale.contains(&(Some("slow".into()), false)), "{stale:?}");
    let c = client(
        &db,
        RuntimeConfig {
            prune_interval: Duration::from_millis(100),
            ..fast_config()
        },
    );
    c.start().await.expect("start");
    eventually("the leader prunes the dead client's row", T, || async {
        let rows = list(&db.pool).await.ok()?;
        let names: Vec<_> = rows.iter().filter_map(|r| r.hostname.clone()).collect();
        (!names.contains(&"gone".to_string())).then_some(names)
    })
    .await;
    let rows = list(&db.pool).await.expect("list");
    assert!(rows.iter().any(|r| r.hostname.as_deref() == Some("slow")));
    c.shutdown(Duration::from_secs(5)).await;
    assert_eq!(prune_stale(&db.pool).await.expect("prune"), 0);
}

#[tokio::test]
async fn a_pruned_live_client_registers_again_on_its_next_refresh() {
    let db = TestDb::new().await;
    let c = client(&db, fast_config());
    c.start().await.expect("start");
    let id = eventually("registered", T, || async { c.instance_id().await }).await;
    sqlx::query("DELETE FROM awa.runtime_instances")
        .execute(&db.pool)
        .await
        .expect("delete the row behind its back");
    eventually("the next refresh writes it again", T, || async {
        row_of(&db, &id).await.map(|_| ())
    })
    .await;
    c.shutdown(Duration::from_secs(5)).await;
    assert!(list(&db.pool).await.expect("list").is_empty());
}
