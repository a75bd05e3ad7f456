//! Queue storage's substrate (issue 18): the properties the rotation model checks
//! (`correctness/storage/AwaQueueRotation.tla`), held against the real SQL.
//!
//! - the cursor never passes a seq whose producer has not committed (CursorNeverPassesWork);
//! - reclaiming a slot carries forward its unclaimed entries and the entries of open leases,
//!   and a running attempt completes through its moved lease (NothingLost, LeaseHasEntry);
//! - a rescued attempt's lease is gone, so its late completion writes nothing
//!   (OnlyOpenLeaseCompletes);
//! - under concurrent producers, claimers, completers and rotation, every job is claimed
//!   exactly once per lease (OneClaimPerLease) and none is lost.

mod common;

use awa_core::storage::queue_storage::{Finish, QueueStorage};
use awa_core::{AwaError, JobRow, NewJob};
use common::TestDb;
use serde_json::json;
use sqlx::Connection;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LANE: (&str, i16) = ("q", 2);

async fn installed(db: &TestDb, queue_slots: u32, lease_slots: u32) -> QueueStorage {
    let qs = QueueStorage::new("awa_qs", queue_slots, lease_slots).expect("config");
    qs.install(&db.pool).await.expect("install");
    qs
}

fn jobs(queue: &str, priority: i16, n: usize, tag: &str) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob {
            kind: "k".into(),
            queue: queue.into(),
            args: json!({ "tag": tag, "i": i }),
            priority,
            max_attempts: 25,
            run_at: None,
            tags: vec![],
            metadata: json!({}),
            unique_key: None,
            unique_states: None,
            ordering_key: None,
        })
        .collect()
}

#[tokio::test]
async fn bad_settings_are_refused_with_the_setting_named() {
    for (schema, q, l, needle) in [
        ("Awa", 16, 8, "lower-case identifier"),
        ("awa; drop", 16, 8, "lower-case identifier"),
        ("1awa", 16, 8, "lower-case identifier"),
        ("awa", 1, 8, "queue_slot_count is 1"),
        ("awa", 16, 1000, "lease_slot_count is 1000"),
    ] {
        match QueueStorage::new(schema, q, l) {
            Err(AwaError::Config(msg)) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("{schema} {q} {l}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn install_is_idempotent() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    assert!(qs.installed(&db.pool).await.unwrap());
    qs.install(&db.pool)
        .await
        .expect("second install is a no-op");
}

/// A producer of one job of `LANE` that stays open: its transaction, the job's id, its seq and
/// the transaction's xid.
async fn open_producer(
    db: &TestDb,
    qs: &QueueStorage,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    Vec<i64>,
    i64,
    i64,
) {
    let (queue, priority) = LANE;
    let mut tx = db.pool.begin().await.unwrap();
    let ids = qs
        .enqueue(&mut *tx, &jobs(queue, priority, 1, "late"))
        .await
        .unwrap();
    let (seq, xid): (i64, i64) = sqlx::query_as(
        "SELECT seq, pg_current_xact_id()::text::bigint FROM awa_qs.ready_entries WHERE id = $1",
    )
    .bind(ids[0])
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    (tx, ids, seq, xid)
}

#[tokio::test]
async fn a_late_commit_is_claimed_and_the_cursor_never_passes_it() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;

    // A producer draws its seq first and commits last.
    let (late, late_ids, late_seq, _) = open_producer(&db, &qs).await;
    let early = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 2, "early"))
        .await
        .unwrap();

    let mut claimed = Vec::new();
    for _ in 0..4 {
        claimed.extend(qs.claim(&db.pool, queue, priority, 10).await.unwrap());
        let lane = &qs.lanes(&db.pool).await.unwrap()[0];
        assert!(
            lane.cursor <= late_seq,
            "the cursor ({}) passed seq {late_seq}, whose producer is still open",
            lane.cursor
        );
    }
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), early);

    late.commit().await.unwrap();
    let after = qs.claim(&db.pool, queue, priority, 10).await.unwrap();
    assert_eq!(after.iter().map(|c| c.id).collect::<Vec<_>>(), late_ids);
    // Nothing more, ever; and the cursor catches up once the stable point passes everything.
    // The stable point follows the cluster's xmin horizon, so a transaction of another test
    // (another database, same cluster) can hold it back for a moment: claim until it passes.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let more = qs.claim(&db.pool, queue, priority, 10).await.unwrap();
        assert!(more.is_empty(), "claimed again: {more:?}");
        let lane = &qs.lanes(&db.pool).await.unwrap()[0];
        if lane.cursor > late_seq {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cursor is stuck at {} below {late_seq}",
            lane.cursor
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn reclaim_carries_forward_unclaimed_and_running_entries() {
    let db = TestDb::new().await;
    let qs = installed(&db, 3, 2).await;
    let (queue, priority) = LANE;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 4, "a"))
        .await
        .unwrap();
    let running = qs.claim(&db.pool, queue, priority, 2).await.unwrap();
    assert_eq!(running.len(), 2);
    let done = qs
        .complete(&db.pool, &[running[0].id], &[running[0].run_lease])
        .await
        .unwrap();
    assert_eq!(done, vec![running[0].id]);

    // Slot 0 holds: a completed entry, a running one, two unclaimed. Move the ring on until
    // slot 0 is the oldest and is reclaimed.
    let mut carried = None;
    for _ in 0..3 {
        let r = qs.rotate(&db.pool, Duration::ZERO).await.unwrap();
        if r.carried.unwrap_or(0) > 0 {
            carried = r.carried;
        }
    }
    assert_eq!(
        carried,
        Some(3),
        "two unclaimed entries and one running one"
    );
    let in_slot_0: i64 = sqlx::query_scalar("SELECT count(*) FROM awa_qs.ready_entries_0")
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
    assert_eq!(in_slot_0, 0, "slot 0 was truncated");

    // The running attempt completes through its moved lease.
    let done = qs
        .complete(&db.pool, &[running[1].id], &[running[1].run_lease])
        .await
        .unwrap();
    assert_eq!(done, vec![running[1].id]);
    // The unclaimed ones are claimed once, from their copies.
    let rest = qs.claim(&db.pool, queue, priority, 10).await.unwrap();
    assert_eq!(rest.iter().map(|c| c.id).collect::<Vec<_>>(), ids[2..]);
    assert!(rest.iter().all(|c| c.run_lease == 1 && c.attempt == 1));
    assert!(qs
        .claim(&db.pool, queue, priority, 10)
        .await
        .unwrap()
        .is_empty());
}

/// How many claimed entries (consumption markers) the substrate holds.
async fn markers(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM awa_qs.claimed_entries")
        .fetch_one(db.pool.pool())
        .await
        .unwrap()
}

/// A claim that moves its lane's cursor past what it takes writes no claimed entries for it:
/// the cursor consumes them. Every reader of "available" (the view, cancel, the operator's
/// requeue, the harness's claim, carry-forward) sees them as consumed: none is shown,
/// cancelled, moved, claimed or carried forward as if it were waiting.
#[tokio::test]
async fn entries_below_the_cursor_are_consumed_without_a_claimed_entry() {
    let db = TestDb::new().await;
    let qs = installed(&db, 3, 2).await;
    let (queue, priority) = LANE;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 6, "m"))
        .await
        .unwrap();
    // The first claim of the lane: no stable point yet, so its entry gets a claimed entry;
    // it records the last seq drawn (every job above) as the lane's candidate stable point.
    let first = qs.claim(&db.pool, queue, priority, 1).await.unwrap();
    assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), [ids[0]]);
    assert_eq!(markers(&db).await, 1);
    // Wait (a condition, not a time) until every transaction older than that claim's has
    // ended, in any database of the cluster: then the next claim confirms the candidate.
    let mut waited = 0;
    while !sqlx::query_scalar::<_, bool>(
        "SELECT cand_xmax <= pg_snapshot_xmin(pg_current_snapshot()) FROM awa_qs.lanes
         WHERE queue = $1 AND priority = $2",
    )
    .bind(queue)
    .bind(priority)
    .fetch_one(db.pool.pool())
    .await
    .unwrap()
    {
        waited += 1;
        assert!(
            waited < 60_000,
            "the xmin horizon never passed the candidate"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let taken = qs.claim(&db.pool, queue, priority, 3).await.unwrap();
    assert_eq!(
        taken.iter().map(|c| c.id).collect::<Vec<_>>(),
        ids[1..4],
        "the next three, in order"
    );
    assert_eq!(
        markers(&db).await,
        1,
        "the cursor consumed them: no claimed entry"
    );
    let lane = qs.lanes(&db.pool).await.unwrap().remove(0);
    let seq_of = |id: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT seq FROM awa_qs.ready_entries WHERE id = $1")
                .bind(id)
                .fetch_one(pool.pool())
                .await
                .unwrap()
        }
    };
    assert_eq!(lane.cursor, seq_of(ids[3]).await + 1);

    // ids[1] completes; ids[2], ids[3] run; ids[4], ids[5] wait.
    qs.complete(&db.pool, &[taken[0].id], &[taken[0].run_lease])
        .await
        .unwrap();
    let states = |db: &TestDb| {
        let qs = qs.clone();
        let pool = db.pool.clone();
        async move {
            qs.jobs(&pool)
                .await
                .unwrap()
                .into_iter()
                .map(|j| (j.id, j.state.as_str().to_string()))
                .collect::<Vec<_>>()
        }
    };
    let expected = |moved: &str| {
        vec![
            (ids[0], "running".to_string()),
            (ids[1], "completed".to_string()),
            (ids[2], "running".to_string()),
            (ids[3], "running".to_string()),
            (ids[4], moved.to_string()),
            (ids[5], "available".to_string()),
        ]
    };
    assert_eq!(states(&db).await, expected("available"), "one row per job");
    // A completed job consumed by the cursor is not cancelled as if it were waiting.
    assert_eq!(qs.cancel(&db.pool, ids[1]).await.unwrap(), None);
    // Nor requeued: only the waiting job moves.
    let moved: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT * FROM awa_qs.qs_requeue($1, 'q2', NULL)")
            .bind([ids[1], ids[4]].as_slice())
            .fetch_all(db.pool.pool())
            .await
            .unwrap();
    assert_eq!(moved, [(ids[4], "q2".to_string(), "available".to_string())]);
    // Nor claimed by the harness's claim, which takes the oldest waiting job.
    let harness = qs
        .claim_kind(&db.pool, queue, "k", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(harness.iter().map(|c| c.id).collect::<Vec<_>>(), [ids[5]]);
    assert_eq!(states(&db).await[5], (ids[5], "running".to_string()));

    // Reclaim slot 0: the four running attempts' entries are carried forward (consumed, their
    // leases moved) and the requeued job's waiting entry; not the completed one.
    let mut carried = None;
    for _ in 0..3 {
        let r = qs.rotate(&db.pool, Duration::ZERO).await.unwrap();
        if r.carried.unwrap_or(0) > 0 {
            carried = r.carried;
        }
    }
    assert_eq!(carried, Some(5));
    assert!(
        qs.claim_queue(&db.pool, queue, 10, None)
            .await
            .unwrap()
            .is_empty(),
        "nothing of the lane is claimable again"
    );
    let again = qs.claim_queue(&db.pool, "q2", 10, None).await.unwrap();
    assert_eq!(again.iter().map(|c| c.id).collect::<Vec<_>>(), [ids[4]]);
    // Every running attempt completes through its moved lease; each job shows once.
    let running: Vec<(i64, i64)> = [&first[0], &taken[1], &taken[2], &harness[0], &again[0]]
        .iter()
        .map(|c| (c.id, c.run_lease))
        .collect();
    let (run_ids, leases): (Vec<i64>, Vec<i64>) = running.into_iter().unzip();
    let mut done = qs.complete(&db.pool, &run_ids, &leases).await.unwrap();
    done.sort();
    let mut want = run_ids.clone();
    want.sort();
    assert_eq!(done, want);
    // (The job completed before the reclaim left with its slot's history.)
    assert_eq!(
        states(&db).await,
        ids.iter()
            .filter(|id| **id != ids[1])
            .map(|id| (*id, "completed".to_string()))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn reclaim_waits_for_the_retention_of_completed_history() {
    let db = TestDb::new().await;
    let qs = installed(&db, 2, 2).await;
    let (queue, priority) = LANE;
    qs.enqueue(db.pool.pool(), &jobs(queue, priority, 1, "a"))
        .await
        .unwrap();
    let c = qs.claim(&db.pool, queue, priority, 1).await.unwrap();
    qs.complete(&db.pool, &[c[0].id], &[c[0].run_lease])
        .await
        .unwrap();
    // Ring of two: slot 1 becomes current, slot 0 (with a fresh receipt) is the oldest.
    let first = qs
        .rotate(&db.pool, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(first.queue_slot, Some(1));
    let second = qs
        .rotate(&db.pool, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        second.carried, None,
        "history younger than the retention is kept"
    );
    assert_eq!(
        second.queue_slot, None,
        "the ring cannot move into a slot with rows"
    );
    let third = qs.rotate(&db.pool, Duration::ZERO).await.unwrap();
    assert_eq!(third.carried, Some(0));
    assert_eq!(third.queue_slot, Some(0));
}

#[tokio::test]
async fn a_rescued_attempt_cannot_complete_and_runs_again() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 1, "a"))
        .await
        .unwrap();
    let first = qs.claim(&db.pool, queue, priority, 1).await.unwrap();
    assert_eq!(qs.rescue(&db.pool, Duration::ZERO).await.unwrap(), ids);
    let late = qs
        .complete(&db.pool, &[first[0].id], &[first[0].run_lease])
        .await
        .unwrap();
    assert!(late.is_empty(), "the rescued attempt's completion is stale");
    assert_eq!(qs.promote(&db.pool).await.unwrap(), 1);
    let second = qs.claim(&db.pool, queue, priority, 1).await.unwrap();
    assert_eq!(second[0].id, ids[0]);
    assert_eq!((second[0].run_lease, second[0].attempt), (2, 2));
    let done = qs
        .complete(&db.pool, &[second[0].id], &[second[0].run_lease])
        .await
        .unwrap();
    assert_eq!(done, ids);
    let errors: serde_json::Value = sqlx::query_scalar(
        "SELECT errors FROM awa_qs.ready_entries WHERE id = $1 AND run_lease = 1",
    )
    .bind(ids[0])
    .fetch_one(db.pool.pool())
    .await
    .unwrap();
    assert_eq!(
        errors[0]["attempt"], 1,
        "the rescue is in the job's errors: {errors}"
    );
}

/// Producers (several jobs per transaction, committing in any order), claimers, completers
/// and a rotating maintenance loop, all at once: every job is claimed exactly once (one lease
/// each) and completed, whatever the interleaving; the rings turn meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_is_claimed_once_under_concurrent_producers_claimers_and_rotation() {
    const PRODUCERS: usize = 3;
    const PER_PRODUCER: usize = 400;
    const TOTAL: usize = PRODUCERS * PER_PRODUCER;
    let db = TestDb::new().await;
    let qs = Arc::new(installed(&db, 4, 2).await);
    let pool = db.pool(16).await;
    let (queue, priority) = LANE;

    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let (qs, pool) = (qs.clone(), pool.clone());
        producers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for batch in 0..PER_PRODUCER / 8 {
                let mut tx = pool.begin().await.unwrap();
                for half in 0..2 {
                    let tag = format!("{p}-{batch}-{half}");
                    ids.extend(
                        qs.enqueue(&mut *tx, &jobs(queue, priority, 4, &tag))
                            .await
                            .unwrap(),
                    );
                    tokio::task::yield_now().await;
                }
                tx.commit().await.unwrap();
            }
            ids
        }));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let maintenance = {
        let (qs, pool, stop) = (qs.clone(), pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut turns = 0u32;
            while !stop.load(Ordering::SeqCst) {
                if qs
                    .rotate(&pool, Duration::ZERO)
                    .await
                    .unwrap()
                    .queue_slot
                    .is_some()
                {
                    turns += 1;
                }
                tokio::task::yield_now().await;
            }
            turns
        })
    };

    // A reader of the view throughout: no job is ever in two places (OnePlacePerJob).
    let checker = {
        let (qs, pool, stop) = (qs.clone(), pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut reads = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let rows = qs.jobs(&pool).await.unwrap();
                let mut seen = BTreeSet::new();
                for j in &rows {
                    assert!(
                        seen.insert(j.id),
                        "job {} is in two places (one is {})",
                        j.id,
                        j.state
                    );
                }
                reads += 1;
                tokio::task::yield_now().await;
            }
            reads
        })
    };
    let claimed_total = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let (qs, pool, total) = (qs.clone(), pool.clone(), claimed_total.clone());
        claimers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while total.load(Ordering::SeqCst) < TOTAL {
                assert!(
                    std::time::Instant::now() < deadline,
                    "jobs were lost: {} of {TOTAL} claimed",
                    total.load(Ordering::SeqCst)
                );
                let got = qs.claim(&pool, queue, priority, 16).await.unwrap();
                if got.is_empty() {
                    tokio::task::yield_now().await;
                    continue;
                }
                total.fetch_add(got.len(), Ordering::SeqCst);
                let ids: Vec<i64> = got.iter().map(|c| c.id).collect();
                let leases: Vec<i64> = got.iter().map(|c| c.run_lease).collect();
                let done = qs.complete(&pool, &ids, &leases).await.unwrap();
                assert_eq!(done.len(), ids.len(), "an open lease did not complete");
                mine.extend(got.into_iter().map(|c| (c.id, c.run_lease)));
            }
            mine
        }));
    }

    let mut inserted = BTreeSet::new();
    for p in producers {
        inserted.extend(p.await.unwrap());
    }
    let mut claims: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for c in claimers {
        for (id, lease) in c.await.unwrap() {
            claims.entry(id).or_default().push(lease);
        }
    }
    stop.store(true, Ordering::SeqCst);
    let turns = maintenance.await.unwrap();
    let reads = checker.await.unwrap();
    assert!(reads > 0, "the view was never read");

    assert_eq!(inserted.len(), TOTAL);
    let twice: Vec<_> = claims.iter().filter(|(_, l)| l.len() > 1).collect();
    assert!(twice.is_empty(), "claimed more than once: {twice:?}");
    assert_eq!(claims.keys().copied().collect::<BTreeSet<_>>(), inserted);
    assert!(turns > 0, "the queue ring never turned");
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM awa_qs.leases")
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
    assert_eq!(open, 0);
}

/// The substrate under a steady load, as `bench/soak.py` offers one to whole systems: producers
/// at `AWA_QS_SOAK_RATE` jobs/s (default 1000) for `AWA_QS_SOAK_SECS` (default 60), claimers
/// completing in batches, and a maintenance loop rotating the queue ring every second with a
/// 10 s retention and the lease ring every 250 ms. Prints dead tuples, live tuples and the
/// database's size every 10 s; checks that nothing was lost. Run with `cargo test -p awa-core --test queue_storage_test -- --ignored
/// --nocapture substrate_soak`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a soak: minutes long, prints figures"]
async fn substrate_soak() {
    let rate: f64 = std::env::var("AWA_QS_SOAK_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000.0);
    let secs: f64 = std::env::var("AWA_QS_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60.0);
    let db = TestDb::new().await;
    let qs = Arc::new(installed(&db, 16, 8).await);
    let pool = db.pool(16).await;
    let (queue, priority) = LANE;
    let stop = Arc::new(AtomicBool::new(false));
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));

    let maintenance = {
        let (qs, pool, stop) = (qs.clone(), pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut pass = 0u64;
            while !stop.load(Ordering::SeqCst) {
                // The queue ring every second, the lease ring every 250 ms (awa-pg's defaults).
                if pass % 4 == 0 {
                    qs.rotate(&pool, Duration::from_secs(10)).await.unwrap();
                } else {
                    qs.rotate_leases(&pool).await.unwrap();
                }
                pass += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let (qs, pool, stop, handled) = (qs.clone(), pool.clone(), stop.clone(), handled.clone());
        claimers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let got = qs.claim(&pool, queue, priority, 32).await.unwrap();
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                let ids: Vec<i64> = got.iter().map(|c| c.id).collect();
                let leases: Vec<i64> = got.iter().map(|c| c.run_lease).collect();
                let done = qs.complete(&pool, &ids, &leases).await.unwrap();
                handled.fetch_add(done.len(), Ordering::SeqCst);
            }
        }));
    }

    let sample = |t: f64, inserted: usize| {
        let (pool, handled) = (pool.clone(), handled.clone());
        async move {
            let (dead, live, size): (i64, i64, i64) = sqlx::query_as(
                "SELECT coalesce(sum(n_dead_tup), 0)::int8, coalesce(sum(n_live_tup), 0)::int8,
                        pg_database_size(current_database())
                 FROM pg_stat_user_tables",
            )
            .fetch_one(pool.pool())
            .await
            .unwrap();
            let h = handled.load(Ordering::SeqCst);
            println!(
                "t={t:>6.0}s inserted={inserted:>8} handled={h:>8} backlog={:>6} dead={dead:>7} live={live:>8} size={:.1} MiB",
                inserted - h,
                size as f64 / 1048576.0
            );
        }
    };
    let start = std::time::Instant::now();
    let per_tick = rate * 0.05;
    let (mut inserted, mut owed, mut ticks, mut next_sample) = (0usize, 0.0f64, 0u64, 0.0f64);
    while start.elapsed().as_secs_f64() < secs {
        owed += per_tick;
        let n = owed as usize;
        if n > 0 {
            owed -= n as f64;
            qs.enqueue(pool.pool(), &jobs(queue, priority, n, "soak"))
                .await
                .unwrap();
            inserted += n;
        }
        let t = start.elapsed().as_secs_f64();
        if t >= next_sample {
            sample(t, inserted).await;
            next_sample += 10.0;
        }
        ticks += 1;
        let due = Duration::from_millis(50 * ticks);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while handled.load(Ordering::SeqCst) < inserted {
        assert!(std::time::Instant::now() < deadline, "jobs were lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sample(start.elapsed().as_secs_f64(), inserted).await;
    stop.store(true, Ordering::SeqCst);
    maintenance.await.unwrap();
    for c in claimers {
        c.await.unwrap();
    }
    assert_eq!(handled.load(Ordering::SeqCst), inserted);
}

#[tokio::test]
async fn a_queue_is_claimed_best_priority_first() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let low = qs
        .enqueue(db.pool.pool(), &jobs("q", 3, 2, "low"))
        .await
        .unwrap();
    let high = qs
        .enqueue(db.pool.pool(), &jobs("q", 1, 2, "high"))
        .await
        .unwrap();
    let first = qs.claim_queue(&db.pool, "q", 3, None).await.unwrap();
    let ids: Vec<i64> = first.iter().map(|c| c.id).collect();
    assert_eq!(ids, [high[0], high[1], low[0]]);
    let rest = qs.claim_queue(&db.pool, "q", 3, None).await.unwrap();
    assert_eq!(rest.iter().map(|c| c.id).collect::<Vec<_>>(), [low[1]]);
    assert!(qs
        .claim_queue(&db.pool, "other", 3, None)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn per_job_outcomes_write_what_canonical_writes_behind_the_guard() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 5, "o"))
        .await
        .unwrap();
    let c = qs.claim(&db.pool, queue, priority, 5).await.unwrap();
    let now = chrono::Utc::now();
    let boom = json!({"attempt": 1, "at": now, "error": "boom"});
    // A stale attempt (wrong run lease) writes nothing.
    assert!(!qs
        .finalize(&db.pool, c[0].id, 99, &Finish::Completed)
        .await
        .unwrap());
    assert!(qs
        .finalize(&db.pool, c[0].id, c[0].run_lease, &Finish::Completed)
        .await
        .unwrap());
    assert!(qs
        .finalize(
            &db.pool,
            c[1].id,
            c[1].run_lease,
            &Finish::Failed {
                error: boom.clone()
            }
        )
        .await
        .unwrap());
    assert!(qs
        .finalize(
            &db.pool,
            c[2].id,
            c[2].run_lease,
            &Finish::Cancelled {
                error: json!({"attempt": 1, "at": now, "error": "cancelled: by test"})
            }
        )
        .await
        .unwrap());
    let retry = Finish::Retryable {
        run_at: now,
        error: Some(boom.clone()),
    };
    assert!(qs
        .finalize(&db.pool, c[3].id, c[3].run_lease, &retry)
        .await
        .unwrap());
    assert!(qs
        .finalize(
            &db.pool,
            c[4].id,
            c[4].run_lease,
            &Finish::Snoozed { run_at: now }
        )
        .await
        .unwrap());
    // Finalizing twice: the lease is gone, so the second is stale.
    assert!(!qs
        .finalize(&db.pool, c[1].id, c[1].run_lease, &Finish::Completed)
        .await
        .unwrap());

    let done: Vec<(i64, String, serde_json::Value)> = sqlx::query_as(
        "SELECT e.id, d.state, d.errors FROM awa_qs.done_entries d
         JOIN awa_qs.ready_entries e ON e.slot = d.slot AND e.seq = d.seq ORDER BY e.id",
    )
    .fetch_all(db.pool.pool())
    .await
    .unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!((done[0].0, done[0].1.as_str()), (ids[1], "failed"));
    assert_eq!(done[0].2, json!([boom]));
    assert_eq!((done[1].0, done[1].1.as_str()), (ids[2], "cancelled"));

    // The view shows each job once, in canonical's state names.
    let states: Vec<(i64, String)> = qs
        .jobs(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j.state.as_str().to_string()))
        .collect();
    let want: Vec<(i64, String)> = ids
        .iter()
        .zip(["completed", "failed", "cancelled", "retryable", "scheduled"])
        .map(|(id, s)| (*id, s.to_string()))
        .collect();
    assert_eq!(states, want);

    // The retried and the snoozed jobs come back: the retry as attempt 2, the snooze still 1.
    assert_eq!(qs.promote(&db.pool).await.unwrap(), 2);
    let again = qs.claim(&db.pool, queue, priority, 5).await.unwrap();
    let by_id: BTreeMap<i64, (i32, i64)> = again
        .iter()
        .map(|c| (c.id, (c.attempt, c.run_lease)))
        .collect();
    assert_eq!(by_id[&ids[3]], (2, 2));
    assert_eq!(by_id[&ids[4]], (1, 2));
    let errors: serde_json::Value = sqlx::query_scalar(
        "SELECT errors FROM awa_qs.ready_entries WHERE id = $1 AND run_lease = 1",
    )
    .bind(ids[3])
    .fetch_one(db.pool.pool())
    .await
    .unwrap();
    assert_eq!(errors, json!([boom]), "the retried entry carries its error");
}

#[tokio::test]
async fn a_heartbeat_keeps_an_attempt_from_rescue() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    qs.enqueue(db.pool.pool(), &jobs(queue, priority, 2, "h"))
        .await
        .unwrap();
    let c = qs.claim(&db.pool, queue, priority, 2).await.unwrap();
    // Both attempts last beat an hour ago; one beats now.
    sqlx::query("UPDATE awa_qs.leases SET heartbeat_at = now() - interval '1 hour'")
        .execute(db.pool.pool())
        .await
        .unwrap();
    let alive = qs
        .heartbeat(&db.pool, &[c[0].id], &[c[0].run_lease])
        .await
        .unwrap();
    assert_eq!(alive, [c[0].id]);
    let rescued = qs.rescue(&db.pool, Duration::from_secs(60)).await.unwrap();
    assert_eq!(rescued, [c[1].id]);
    // The rescued attempt's heartbeat finds no lease.
    assert!(qs
        .heartbeat(&db.pool, &[c[1].id], &[c[1].run_lease])
        .await
        .unwrap()
        .is_empty());
}

/// Updates of lease rows so far, and how many of them were in place (HOT), as this
/// connection's flushed statistics count them.
async fn lease_updates(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    flush_stats(conn).await;
    sqlx::query_as(
        "SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint
         FROM pg_stat_user_tables WHERE schemaname = 'awa_qs' AND relname LIKE 'leases\\_%'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// A heartbeat updates its lease in place (HOT): it changes no indexed column, so a running
/// job's beats leave no index entries behind, only versions its page prunes.
#[tokio::test]
async fn a_heartbeat_updates_its_lease_in_place() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    qs.enqueue(db.pool.pool(), &jobs(queue, priority, 1, "hot"))
        .await
        .unwrap();
    let c = qs.claim(&db.pool, queue, priority, 1).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let before = lease_updates(&mut conn).await;
    for _ in 0..5 {
        let open: Vec<(i64, bool)> =
            sqlx::query_as("SELECT * FROM awa_qs.qs_heartbeat($1, $2, NULL)")
                .bind([c[0].id].as_slice())
                .bind([c[0].run_lease].as_slice())
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(open, [(c[0].id, false)]);
    }
    let after = lease_updates(&mut conn).await;
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (5, 5),
        "five heartbeats, five updates in place"
    );
}

#[tokio::test]
async fn an_idle_poll_writes_nothing() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    qs.enqueue(db.pool.pool(), &jobs(queue, priority, 1, "i"))
        .await
        .unwrap();
    qs.claim(&db.pool, queue, priority, 1).await.unwrap();
    // Let the stable point settle, then poll an empty lane: the lane row is not rewritten.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let ctid = || async {
        sqlx::query_scalar::<_, String>("SELECT ctid::text FROM awa_qs.lanes")
            .fetch_one(db.pool.pool())
            .await
            .unwrap()
    };
    // Settled: the stable point has caught up with every seq drawn and the cursor with it.
    // (It follows the cluster's xmin horizon, which other tests' transactions hold back for
    // a moment.)
    loop {
        assert!(qs
            .claim(&db.pool, queue, priority, 1)
            .await
            .unwrap()
            .is_empty());
        let settled: bool = sqlx::query_scalar(
            "SELECT cursor = stable_seq + 1 AND stable_seq = cand_seq
                    AND cand_seq = (SELECT last_value FROM awa_qs.qs_seq)
             FROM awa_qs.lanes",
        )
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
        if settled {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lane never settled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Settled: from now on no poll writes.
    let settled = ctid().await;
    for _ in 0..5 {
        assert!(qs
            .claim(&db.pool, queue, priority, 1)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(ctid().await, settled, "an idle poll rewrote the lane");
    }
}

/// Make this connection's statistics visible to its next statement (another backend's arrive
/// up to seconds later).
async fn flush_stats(conn: &mut sqlx::PgConnection) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// Entries read so far from `table`'s partitions in the substrate (index entries, and rows of
/// sequential scans), as PostgreSQL's own statistics count them; `conn`'s pending counts are
/// flushed first (a backend sends them when it goes idle, at most once a second unless told
/// to).
async fn index_reads(conn: &mut sqlx::PgConnection, table: &str) -> i64 {
    flush_stats(conn).await;
    sqlx::query_scalar(
        "SELECT ((SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
                  WHERE schemaname = 'awa_qs' AND relname LIKE $1 || '\\_%')
               + (SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables
                  WHERE schemaname = 'awa_qs' AND relname LIKE $1 || '\\_%'))::bigint",
    )
    .bind(table)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// A claim behind a backlog reads the entries it takes, not the backlog. Its plans are generic
/// (made once per connection, whatever the parameters); left to the statistics of the moment,
/// the planner made the pick a bitmap scan and a sort of every waiting entry of the lane (and
/// the lanes' probe one too): 10 ms per claim behind 3,000 jobs, a drain that slowed with its
/// own backlog. Counted with the index reads PostgreSQL records, after statistics that
/// describe the backlog, on a connection that plans the claim afresh.
#[tokio::test]
async fn a_claim_behind_a_backlog_reads_what_it_takes() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    // Everything that reads the substrate runs on this one connection, whose counts are
    // flushed before each reading (another backend's arrive up to seconds later).
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    for part in 0..3 {
        qs.enqueue(&mut conn, &jobs("q", 2, 1000, &format!("b{part}")))
            .await
            .unwrap();
    }
    sqlx::query("ANALYZE awa_qs.ready_entries, awa_qs.claimed_entries")
        .execute(&mut conn)
        .await
        .unwrap();
    // A connection that plans the claim afresh, with these statistics (this one's counts
    // are flushed first: a closing backend's would arrive while the next one counts).
    index_reads(&mut conn, "ready_entries").await;
    conn.close().await.expect("close");
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    for round in 0..5 {
        let (ready, claimed) = (
            index_reads(&mut conn, "ready_entries").await,
            index_reads(&mut conn, "claimed_entries").await,
        );
        let got: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM awa_qs.qs_claim_queue('q', 10, NULL)")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(got.len(), 10, "round {round}");
        let read = index_reads(&mut conn, "ready_entries").await - ready;
        let probed = index_reads(&mut conn, "claimed_entries").await - claimed;
        // The probe's first entry, the ten taken, and those the cursor still lags behind:
        // at most the ones taken before (the stable point is confirmed a claim later, or
        // later still while another database's transactions hold the xmin horizon back);
        // never the 3,000 waiting.
        let bound = 10 * (round + 1) + 10;
        assert!(
            read <= bound,
            "round {round}: {read} ready entries read for 10 taken"
        );
        assert!(
            probed <= bound,
            "round {round}: {probed} claimed entries read"
        );
    }
}

/// A claim waits for `leases` before it touches a slot's tables (the lock order a reclaim
/// relies on: `leases` in EXCLUSIVE mode, then the slot's tables). The claim's plans lock
/// every slot's tables (a cached generic plan locks every partition it names), so a claim
/// that read the slots first and then waited for `leases` held a reclaim that wanted a slot
/// until the reclaim's lock_timeout gave up (a 65 ms pickup), or PostgreSQL's deadlock check
/// cancelled one of them.
#[tokio::test]
async fn a_claim_waiting_for_leases_holds_no_slot() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 1, "l"))
        .await
        .unwrap();
    // A reclaim's first lock.
    let mut reclaim = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    for sql in ["BEGIN", "LOCK TABLE ONLY awa_qs.leases IN EXCLUSIVE MODE"] {
        sqlx::query(sql).execute(&mut reclaim).await.expect(sql);
    }
    let mut claimer = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut claimer)
        .await
        .unwrap();
    let claim = tokio::spawn(async move {
        sqlx::query_scalar::<_, i64>("SELECT id FROM awa_qs.qs_claim_queue('q', 1, NULL)")
            .fetch_all(&mut claimer)
            .await
    });
    // Until the claim waits for a lock (which can only be the reclaim's on leases).
    let waiting = async {
        loop {
            let waits: bool = sqlx::query_scalar(
                "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false)
                 FROM pg_stat_activity WHERE pid = $1",
            )
            .bind(pid)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            if waits {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the claim waits for leases");
    // The reclaim's second lock: every slot's tables, granted at once (the deadlock check
    // would cancel one side after a second; the timeout is well past it).
    for sql in [
        "SET LOCAL lock_timeout = '10s'",
        "LOCK TABLE awa_qs.ready_entries, awa_qs.claimed_entries IN ACCESS EXCLUSIVE MODE",
        "ROLLBACK",
    ] {
        sqlx::query(sql)
            .execute(&mut reclaim)
            .await
            .expect("a claim waiting for leases holds no slot's lock");
    }
    let got = claim.await.expect("join").expect("claim");
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn a_paused_queue_hands_out_nothing() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs("q", 2, 2, "p"))
        .await
        .unwrap();
    sqlx::query("INSERT INTO awa.queue_meta (queue, paused) VALUES ('q', true)")
        .execute(db.pool.pool())
        .await
        .unwrap();
    assert!(qs
        .claim_queue(&db.pool, "q", 10, None)
        .await
        .unwrap()
        .is_empty());
    sqlx::query("UPDATE awa.queue_meta SET paused = false WHERE queue = 'q'")
        .execute(db.pool.pool())
        .await
        .unwrap();
    let got = qs.claim_queue(&db.pool, "q", 10, None).await.unwrap();
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), ids);
}

#[tokio::test]
async fn an_attempt_past_its_deadline_is_rescued_though_it_beats() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs("q", 2, 2, "d"))
        .await
        .unwrap();
    let short = qs
        .claim_queue(&db.pool, "q", 1, Some(Duration::ZERO))
        .await
        .unwrap();
    let long = qs
        .claim_queue(&db.pool, "q", 1, Some(Duration::from_secs(3600)))
        .await
        .unwrap();
    qs.heartbeat(&db.pool, &[short[0].id, long[0].id], &[1, 1])
        .await
        .unwrap();
    let rescued = qs
        .rescue(&db.pool, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(rescued, [ids[0]]);
    let errors: serde_json::Value =
        sqlx::query_scalar("SELECT errors FROM awa_qs.deferred_jobs WHERE id = $1")
            .bind(ids[0])
            .fetch_one(db.pool.pool())
            .await
            .unwrap();
    assert_eq!(errors[0]["error"], "rescued: deadline passed");
}

#[tokio::test]
async fn inserts_and_promotions_wake_the_queue() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener.listen("awa:q").await.unwrap();
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 1, "n"))
        .await
        .unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("no wake-up for the insert")
        .unwrap();
    assert_eq!(woke.channel(), "awa:q");
    // A retry promoted when due wakes the queue again.
    let c = qs.claim_queue(&db.pool, "q", 1, None).await.unwrap();
    let retry = Finish::Retryable {
        run_at: chrono::Utc::now(),
        error: None,
    };
    assert!(qs
        .finalize(&db.pool, c[0].id, c[0].run_lease, &retry)
        .await
        .unwrap());
    assert_eq!(qs.promote(&db.pool).await.unwrap(), 1);
    let woke = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("no wake-up for the promotion")
        .unwrap();
    assert_eq!(woke.channel(), "awa:q");
}

#[tokio::test]
async fn a_job_keeps_its_fields_and_a_later_one_waits_as_scheduled() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let mut now_job = jobs("q", 2, 1, "now").remove(0);
    now_job.tags = vec!["a".into(), "b\tc".into()];
    now_job.metadata = json!({"m": [1, 2], "s": "x\ny"});
    now_job.ordering_key = Some("order-1".into());
    now_job.unique_key = Some(vec![0, 1, 2, 255]);
    now_job.unique_states = Some(0b0000_0110);
    now_job.max_attempts = 3;
    let mut later = jobs("q", 2, 1, "later").remove(0);
    later.run_at = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    let ids = qs
        .enqueue(db.pool.pool(), &[now_job.clone(), later])
        .await
        .unwrap();

    let got = qs.claim_queue(&db.pool, "q", 10, None).await.unwrap();
    assert_eq!(got.len(), 1, "the later job is not claimable yet");
    let j = &got[0];
    assert_eq!(j.id, ids[0]);
    assert_eq!((j.kind.as_str(), j.queue.as_str()), ("k", "q"));
    assert_eq!(j.args, now_job.args);
    assert_eq!(j.tags, now_job.tags);
    assert_eq!(j.metadata, now_job.metadata);
    assert_eq!(j.ordering_key, now_job.ordering_key);
    assert_eq!(j.unique_key, now_job.unique_key);
    assert_eq!(j.unique_states, Some(6));
    assert_eq!((j.attempt, j.max_attempts, j.run_lease), (1, 3, 1));
    assert_eq!(j.state, awa_core::JobState::Running);
    assert!(j.attempted_at.is_some() && j.heartbeat_at.is_some());

    let all = qs.jobs(&db.pool).await.unwrap();
    let states: Vec<(i64, &str)> = all.iter().map(|j| (j.id, j.state.as_str())).collect();
    assert_eq!(states, [(ids[0], "running"), (ids[1], "scheduled")]);
    assert!(all[1].run_at > chrono::Utc::now());
}

/// A substrate with 4 queue slots and 3 lease slots holding `n` jobs of one lane: the first
/// `in_slot_0` claimed in lease slot 0, the ring turned, and the rest claimed in lease slot 1.
/// Returns the substrate, the ids and the two claims.
async fn leased_in_two_slots(
    db: &TestDb,
    n: usize,
    in_slot_0: i32,
) -> (QueueStorage, Vec<i64>, Vec<JobRow>, Vec<JobRow>) {
    let qs = installed(db, 4, 3).await;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs("q", 2, n, "l"))
        .await
        .unwrap();
    let old = qs
        .claim_queue(&db.pool, "q", in_slot_0, None)
        .await
        .unwrap();
    assert_eq!(qs.rotate_leases(&db.pool).await.unwrap(), 1);
    let rest = n as i32 - in_slot_0;
    let cur = qs.claim_queue(&db.pool, "q", rest, None).await.unwrap();
    (qs, ids, old, cur)
}

#[tokio::test]
async fn the_lease_ring_passes_over_slots_with_open_leases() {
    let db = TestDb::new().await;
    let (qs, ids, a, b) = leased_in_two_slots(&db, 2, 1).await;
    assert_eq!(qs.rotate_leases(&db.pool).await.unwrap(), 2);
    // Slots 0 and 1 each hold an open lease: the ring stays where it is.
    assert_eq!(qs.rotate_leases(&db.pool).await.unwrap(), 2);
    qs.complete(&db.pool, &[a[0].id], &[a[0].run_lease])
        .await
        .unwrap();
    // Slot 0 is empty now: truncated, and current again.
    assert_eq!(qs.rotate_leases(&db.pool).await.unwrap(), 0);
    let slot_of_b: i32 = sqlx::query_scalar("SELECT lease_slot FROM awa_qs.leases WHERE id = $1")
        .bind(ids[1])
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
    assert_eq!(slot_of_b, 1, "a lease never moves");
    let done = qs
        .complete(&db.pool, &[b[0].id], &[b[0].run_lease])
        .await
        .unwrap();
    assert_eq!(done, [ids[1]]);
}

/// A completion looks in the lease ring's current slot first and then, for what it did not
/// find there, back round the ring: a batch mixing both, a stale pair and a repeated pair completes
/// each open lease exactly once, with one receipt entry per job.
#[tokio::test]
async fn a_completion_finds_leases_in_the_current_slot_and_in_older_ones() {
    let db = TestDb::new().await;
    let (qs, ids, old, cur) = leased_in_two_slots(&db, 3, 2).await;
    let slots: Vec<i32> = sqlx::query_scalar("SELECT lease_slot FROM awa_qs.leases ORDER BY id")
        .fetch_all(db.pool.pool())
        .await
        .unwrap();
    assert_eq!(slots, [0, 0, 1]);
    // The current slot's lease, one older lease twice, and a pair no lease matches.
    let batch = [
        (cur[0].id, cur[0].run_lease),
        (old[0].id, old[0].run_lease),
        (old[0].id, old[0].run_lease),
        (old[1].id, old[1].run_lease + 7),
    ];
    let (bids, bleases): (Vec<i64>, Vec<i64>) = batch.iter().copied().unzip();
    let mut done = qs.complete(&db.pool, &bids, &bleases).await.unwrap();
    done.sort();
    assert_eq!(done, [ids[0], ids[2]]);
    let mut seqs: Vec<i64> = sqlx::query_scalar("SELECT unnest(seqs) FROM awa_qs.receipts")
        .fetch_all(db.pool.pool())
        .await
        .unwrap();
    seqs.sort();
    assert_eq!(
        seqs.len(),
        2,
        "one receipt entry per completed job: {seqs:?}"
    );
    seqs.dedup();
    assert_eq!(seqs.len(), 2);
    // The older lease left open is still there; completed ones are not completed again.
    let again = qs.complete(&db.pool, &bids, &bleases).await.unwrap();
    assert!(again.is_empty(), "{again:?}");
    let done = qs
        .complete(&db.pool, &[old[1].id], &[old[1].run_lease])
        .await
        .unwrap();
    assert_eq!(done, [ids[1]]);
    let all = qs.jobs(&db.pool).await.unwrap();
    let states: Vec<&str> = all.iter().map(|j| j.state.as_str()).collect();
    assert_eq!(states, ["completed"; 3]);
}

/// Complete `job`'s attempt in `tx`, left open for the caller (asserts it was completed).
async fn complete_one_in(tx: &mut sqlx::PgConnection, job: &JobRow) {
    let done: Vec<i64> = sqlx::query_scalar("SELECT id FROM awa_qs.qs_complete($1, $2)")
        .bind([job.id])
        .bind([job.run_lease])
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(done, [job.id]);
}

/// A completion locks the lease slots it looks in, not every slot: one still open (its
/// transaction not yet committed) does not keep the ring from turning into an empty slot.
/// (Through the parent, a completion's plan locked every slot, and the rotation's short lock
/// wait gave up on each of them.)
#[tokio::test]
async fn an_open_completion_does_not_hold_the_lease_ring_still() {
    let db = TestDb::new().await;
    let (qs, _, old, cur) = leased_in_two_slots(&db, 2, 1).await;
    let mut tx = db.pool.pool().begin().await.unwrap();
    complete_one_in(&mut tx, &cur[0]).await;
    // Slot 2 is empty and the completion never looked there: the ring moves into it.
    assert_eq!(qs.rotate_leases(&db.pool).await.unwrap(), 2);
    tx.commit().await.unwrap();
    // The lease of slot 0 is still found, from the new current slot, and only once.
    let done = qs
        .complete(
            &db.pool,
            &[old[0].id, old[0].id],
            &[old[0].run_lease, old[0].run_lease],
        )
        .await
        .unwrap();
    assert_eq!(done, [old[0].id]);
    let states: Vec<String> = qs
        .jobs(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|j| j.state.as_str().to_string())
        .collect();
    assert_eq!(states, ["completed", "completed"]);
}

/// A completion finds its leases through the index on the pairs' ids, whatever the slot's
/// statistics said when its statement was planned: here they say the slot is empty (analyzed
/// before the claims), where a plan left to its estimates reads every lease of the slot.
/// Counted in this transaction's table statistics, which no other backend changes.
#[tokio::test]
async fn a_completion_reads_only_its_own_leases_whatever_the_statistics() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 3).await;
    sqlx::query("ANALYZE awa_qs.leases_0")
        .execute(db.pool.pool())
        .await
        .unwrap();
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 60, "s"))
        .await
        .unwrap();
    let got = qs.claim_queue(&db.pool, "q", 60, None).await.unwrap(); // lease slot 0
    assert_eq!(got.len(), 60);
    let mut tx = db.pool.pool().begin().await.unwrap();
    complete_one_in(&mut tx, &got[7]).await;
    let (seq_read, idx_fetched): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(seq_tup_read, 0), coalesce(idx_tup_fetch, 0)
         FROM pg_stat_xact_user_tables WHERE schemaname = 'awa_qs' AND relname = 'leases_0'",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (seq_read, idx_fetched),
        (0, 1),
        "one lease looked up, not the slot's 60"
    );
}

#[tokio::test]
async fn copy_writes_every_field_and_defers_later_jobs() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let mut batch = jobs("q", 2, 300, "copy");
    for (i, j) in batch.iter_mut().enumerate() {
        j.args = json!({ "i": i, "s": "tab\there\\back\nline \"q\" é" });
        j.tags = vec!["t\t1".into(), format!("n{i}")];
        j.metadata = json!({ "m": i });
        j.ordering_key = (i % 2 == 0).then(|| format!("k{i}"));
        // (A batch with unique keys takes the row path, which takes its keys: see
        // unique_keys_are_held_in_their_states_and_given_back_outside_them.)
    }
    let mut later = jobs("q", 2, 1, "later").remove(0);
    later.run_at = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    batch.push(later);
    let mut conn = db.pool.acquire().await.unwrap();
    let written = qs.enqueue_copy(&mut conn, &batch).await.unwrap();
    assert_eq!(written, 301);

    let got = qs.claim_queue(&db.pool, "q", 1000, None).await.unwrap();
    assert_eq!(got.len(), 300, "the later job waits");
    for (j, want) in got.iter().zip(&batch) {
        assert_eq!(j.args, want.args);
        assert_eq!(j.tags, want.tags);
        assert_eq!(j.metadata, want.metadata);
        assert_eq!(j.ordering_key, want.ordering_key);
        assert_eq!(j.unique_key, want.unique_key);
        assert_eq!(j.unique_states, want.unique_states.map(i16::from));
        assert_eq!((j.attempt, j.run_lease), (1, 1));
    }
    let scheduled = qs
        .jobs(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.state == awa_core::JobState::Scheduled)
        .count();
    assert_eq!(scheduled, 1);
}

#[tokio::test]
async fn a_late_copy_is_claimed_and_the_cursor_never_passes_it() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let mut late = db.pool.begin().await.unwrap();
    qs.enqueue_copy(&mut late, &jobs("q", 2, 1, "late"))
        .await
        .unwrap();
    let late_seq: i64 =
        sqlx::query_scalar("SELECT seq FROM awa_qs.ready_entries WHERE args->>'tag' = 'late'")
            .fetch_one(&mut *late)
            .await
            .unwrap();
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 2, "early"))
        .await
        .unwrap();
    for _ in 0..4 {
        qs.claim(&db.pool, "q", 2, 10).await.unwrap();
        let lane = &qs.lanes(&db.pool).await.unwrap()[0];
        assert!(lane.cursor <= late_seq, "the cursor passed an open COPY");
    }
    late.commit().await.unwrap();
    let after = qs.claim(&db.pool, "q", 2, 10).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].args["tag"], "late");
}

/// ADR-046 on this engine's batched path: a follow-up is inserted if and only if its attempt's
/// lease-guarded completion commits: in the completion's transaction, for exactly the ids the
/// guard matched; a stale attempt's follow-up is never inserted, and a rolled-back completion
/// leaves the lease open and no follow-up.
#[tokio::test]
async fn follow_ups_are_inserted_with_exactly_the_completions_that_commit() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 3, "parent"))
        .await
        .unwrap();
    let c = qs.claim_queue(&db.pool, "q", 3, None).await.unwrap();
    // c[1]'s attempt is rescued (its lease deleted) before the batch completes.
    sqlx::query("DELETE FROM awa_qs.leases WHERE id = $1")
        .bind(c[1].id)
        .execute(db.pool.pool())
        .await
        .unwrap();
    let follow_up = |parent: i64| {
        let mut j = jobs("followups", 2, 1, "child").remove(0);
        j.args = json!({ "parent": parent });
        j
    };

    // A batch whose transaction rolls back: nothing happened.
    let mut tx = db.pool.begin().await.unwrap();
    let done = qs
        .complete_in(&mut *tx, &[c[0].id], &[c[0].run_lease])
        .await
        .unwrap();
    qs.enqueue(
        &mut *tx,
        &done.iter().map(|id| follow_up(*id)).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM awa_qs.leases WHERE id = $1")
        .bind(c[0].id)
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
    assert_eq!(open, 1, "the rolled-back completion left the lease open");

    // The batch that commits: the follow-ups of exactly the matched ids.
    let mut tx = db.pool.begin().await.unwrap();
    let ids: Vec<i64> = c.iter().map(|j| j.id).collect();
    let leases: Vec<i64> = c.iter().map(|j| j.run_lease).collect();
    let mut done = qs.complete_in(&mut *tx, &ids, &leases).await.unwrap();
    done.sort_unstable();
    assert_eq!(done, [c[0].id, c[2].id], "the rescued attempt is stale");
    qs.enqueue(
        &mut *tx,
        &done.iter().map(|id| follow_up(*id)).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let children = qs
        .claim_queue(&db.pool, "followups", 10, None)
        .await
        .unwrap();
    let mut parents: Vec<i64> = children
        .iter()
        .map(|j| j.args["parent"].as_i64().unwrap())
        .collect();
    parents.sort_unstable();
    assert_eq!(parents, [c[0].id, c[2].id]);
}

#[tokio::test]
async fn progress_and_callbacks_live_in_the_lease() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs("q", 2, 2, "cb"))
        .await
        .unwrap();
    let c = qs.claim_queue(&db.pool, "q", 2, None).await.unwrap();
    assert!(qs
        .set_progress(&db.pool, c[0].id, c[0].run_lease, &json!({"pct": 50}))
        .await
        .unwrap());
    assert!(!qs
        .set_progress(&db.pool, c[0].id, 99, &json!({"pct": 60}))
        .await
        .unwrap());
    // Job 0 waits on a callback for an hour; job 1 on one that has already timed out.
    let long = qs
        .register_callback(&db.pool, c[0].id, c[0].run_lease, Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("an open attempt");
    let short = qs
        .register_callback(&db.pool, c[1].id, c[1].run_lease, Duration::ZERO)
        .await
        .unwrap()
        .expect("an open attempt");
    assert!(!qs
        .park(&db.pool, c[0].id, c[0].run_lease, &short, None)
        .await
        .unwrap());
    assert!(qs
        .park(&db.pool, c[0].id, c[0].run_lease, &long, None)
        .await
        .unwrap());
    assert!(qs
        .park(&db.pool, c[1].id, c[1].run_lease, &short, None)
        .await
        .unwrap());
    let view = qs.jobs(&db.pool).await.unwrap();
    assert_eq!(view[0].state, awa_core::JobState::WaitingExternal);
    assert_eq!(view[0].progress, Some(json!({"pct": 50})));
    assert_eq!(view[0].callback_id.as_deref(), Some(long.as_str()));

    // A parked attempt is not heartbeated, so only its callback's timeout rescues it.
    let rescued = qs.rescue(&db.pool, Duration::ZERO).await.unwrap();
    assert_eq!(rescued, [ids[1]]);
    let errors: serde_json::Value =
        sqlx::query_scalar("SELECT errors FROM awa_qs.deferred_jobs WHERE id = $1")
            .bind(ids[1])
            .fetch_one(db.pool.pool())
            .await
            .unwrap();
    assert_eq!(errors[0]["error"], "rescued: callback timed out");
}

#[tokio::test]
async fn cancel_ends_a_job_in_every_state_it_can_be_in() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let mut batch = jobs("q", 2, 4, "c");
    let mut later = jobs("q", 2, 1, "later").remove(0);
    later.run_at = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    batch.push(later);
    let ids = qs.enqueue(db.pool.pool(), &batch).await.unwrap();
    // ids[0] running, ids[1] parked, ids[2] completed, ids[3] available, ids[4] scheduled.
    let c = qs.claim_queue(&db.pool, "q", 3, None).await.unwrap();
    let cb = qs
        .register_callback(&db.pool, c[1].id, c[1].run_lease, Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    assert!(qs
        .park(&db.pool, c[1].id, c[1].run_lease, &cb, None)
        .await
        .unwrap());
    qs.complete(&db.pool, &[c[2].id], &[c[2].run_lease])
        .await
        .unwrap();
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener.listen("awa:cancel").await.unwrap();

    let left: Vec<Option<String>> = {
        let mut out = Vec::new();
        for id in &ids {
            out.push(qs.cancel(&db.pool, *id).await.unwrap());
        }
        out
    };
    assert_eq!(
        left,
        [
            Some("running".to_string()),
            Some("cancelled".to_string()),
            None,
            Some("cancelled".to_string()),
            Some("cancelled".to_string()),
        ]
    );
    let told = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("the running job's worker is told")
        .unwrap();
    assert_eq!(told.payload(), ids[0].to_string());
    assert!(qs.cancel(&db.pool, 424242).await.unwrap().is_none());
    // Nothing cancelled is claimable; the running job, once rescued, is cancelled, not retried.
    assert!(qs
        .claim_queue(&db.pool, "q", 10, None)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(qs.promote(&db.pool).await.unwrap(), 0);
    assert_eq!(qs.rescue(&db.pool, Duration::ZERO).await.unwrap(), [ids[0]]);
    let states: Vec<&str> = qs
        .jobs(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|j| j.state.as_str())
        .collect();
    assert_eq!(
        states,
        [
            "cancelled",
            "cancelled",
            "completed",
            "cancelled",
            "cancelled"
        ]
    );
}

/// A job with unique key `key` and state mask `mask` (canonical's bits).
fn keyed(key: &[u8], mask: u8, tag: &str) -> NewJob {
    let mut job = jobs("q", 2, 1, tag).remove(0);
    job.unique_key = Some(key.to_vec());
    job.unique_states = Some(mask);
    job
}

/// The holder of each key in the substrate's unique-key table.
async fn key_rows(db: &TestDb) -> Vec<(Vec<u8>, i64)> {
    sqlx::query_as("SELECT unique_key, id FROM awa_qs.unique_keys ORDER BY unique_key")
        .fetch_all(db.pool.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn unique_keys_are_held_in_their_states_and_given_back_outside_them() {
    let db = TestDb::new().await;
    let qs = installed(&db, 2, 2).await;
    let all = awa_core::model::DEFAULT_UNIQUE_STATES; // scheduled..retryable, completed included
    let live_only: u8 = 0b0001_0111; // scheduled, available, running, retryable

    // Held while available and running: a second insert is the whole call's UniqueConflict,
    // so nothing of the call is written (its free job included).
    let first = qs
        .enqueue(db.pool.pool(), &[keyed(b"a", all, "1")])
        .await
        .unwrap();
    let refused = qs
        .enqueue(
            db.pool.pool(),
            &[keyed(b"free", all, "2"), keyed(b"a", all, "3")],
        )
        .await;
    assert!(
        matches!(refused, Err(AwaError::UniqueConflict { .. })),
        "{refused:?}"
    );
    // Two jobs of one call with one key: the second conflicts with the first.
    let twice = qs
        .enqueue(
            db.pool.pool(),
            &[keyed(b"b", all, "4"), keyed(b"b", all, "5")],
        )
        .await;
    assert!(
        matches!(twice, Err(AwaError::UniqueConflict { .. })),
        "{twice:?}"
    );
    assert_eq!(key_rows(&db).await, vec![(b"a".to_vec(), first[0])]);
    let c = qs.claim(&db.pool, "q", 2, 1).await.unwrap();
    assert!(
        qs.enqueue(db.pool.pool(), &[keyed(b"a", all, "6")])
            .await
            .is_err(),
        "held while running"
    );
    qs.complete(&db.pool, &[c[0].id], &[c[0].run_lease])
        .await
        .unwrap();
    assert!(
        qs.enqueue(db.pool.pool(), &[keyed(b"a", all, "7")])
            .await
            .is_err(),
        "completed is in the mask"
    );

    // Outside its mask the key is taken over: completed with a mask without completed,
    // cancelled with any default mask.
    let short = qs
        .enqueue(db.pool.pool(), &[keyed(b"c", live_only, "8")])
        .await
        .unwrap();
    assert!(qs
        .enqueue(db.pool.pool(), &[keyed(b"c", live_only, "9")])
        .await
        .is_err());
    let c = qs.claim(&db.pool, "q", 2, 1).await.unwrap();
    assert_eq!(c[0].id, short[0]);
    qs.complete(&db.pool, &[c[0].id], &[c[0].run_lease])
        .await
        .unwrap();
    let again = qs
        .enqueue(db.pool.pool(), &[keyed(b"c", live_only, "10")])
        .await
        .unwrap();
    let gone = qs
        .enqueue(db.pool.pool(), &[keyed(b"d", all, "11")])
        .await
        .unwrap();
    assert_eq!(
        qs.cancel(&db.pool, gone[0]).await.unwrap().as_deref(),
        Some("cancelled")
    );
    let after_cancel = qs
        .enqueue(db.pool.pool(), &[keyed(b"d", all, "12")])
        .await
        .unwrap();
    assert_eq!(
        key_rows(&db).await,
        vec![
            (b"a".to_vec(), first[0]),
            (b"c".to_vec(), again[0]),
            (b"d".to_vec(), after_cancel[0])
        ]
    );

    // A scheduled job holds a key whose mask has scheduled; COPY takes keys as rows do.
    let mut later = keyed(b"e", all, "13");
    later.run_at = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    qs.enqueue(db.pool.pool(), &[later]).await.unwrap();
    let mut conn = db.pool.pool().acquire().await.unwrap();
    let copied = qs.enqueue_copy(&mut conn, &[keyed(b"e", all, "14")]).await;
    assert!(
        matches!(copied, Err(AwaError::UniqueConflict { .. })),
        "{copied:?}"
    );
}

#[tokio::test]
async fn a_reclaimed_slot_gives_back_the_keys_of_its_finished_jobs_only() {
    let db = TestDb::new().await;
    let qs = installed(&db, 2, 2).await;
    let all = awa_core::model::DEFAULT_UNIQUE_STATES;
    let ids = qs
        .enqueue(
            db.pool.pool(),
            &[keyed(b"done", all, "1"), keyed(b"waiting", all, "2")],
        )
        .await
        .unwrap();
    let c = qs.claim(&db.pool, "q", 2, 1).await.unwrap();
    assert_eq!(c[0].id, ids[0]);
    qs.complete(&db.pool, &[c[0].id], &[c[0].run_lease])
        .await
        .unwrap();
    // Slot 0 holds both; the ring moves to slot 1, then slot 0 is reclaimed: the completed
    // job's history goes (and its key), the waiting job is carried forward (and keeps its key).
    qs.rotate(&db.pool, Duration::ZERO).await.unwrap();
    let reclaimed = qs.rotate(&db.pool, Duration::ZERO).await.unwrap();
    assert_eq!(reclaimed.carried, Some(1));
    assert_eq!(key_rows(&db).await, vec![(b"waiting".to_vec(), ids[1])]);
    assert!(qs
        .enqueue(db.pool.pool(), &[keyed(b"waiting", all, "3")])
        .await
        .is_err());
    qs.enqueue(db.pool.pool(), &[keyed(b"done", all, "4")])
        .await
        .unwrap();
}

/// `(id, state, errors)` of the jobs in queue storage's view, by id.
async fn history(db: &TestDb, ids: &[i64]) -> Vec<(i64, String, serde_json::Value)> {
    sqlx::query_as("SELECT id, state, errors FROM awa_qs.qs_jobs WHERE id = ANY($1) ORDER BY id")
        .bind(ids)
        .fetch_all(db.pool.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn failed_and_cancelled_jobs_outlive_their_slot_for_their_own_retention() {
    let db = TestDb::new().await;
    let qs = installed(&db, 2, 2).await;
    let (queue, priority) = LANE;
    let ids = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 3, "r"))
        .await
        .unwrap();
    let c = qs.claim(&db.pool, queue, priority, 3).await.unwrap();
    let boom = json!([{"attempt": 1, "error": "boom"}]);
    let finishes = [
        Finish::Completed,
        Finish::Failed {
            error: boom[0].clone(),
        },
        Finish::Cancelled {
            error: json!({"attempt": 1, "error": "cancelled: by test"}),
        },
    ];
    for (job, finish) in c.iter().zip(&finishes) {
        assert!(qs
            .finalize(&db.pool, job.id, job.run_lease, finish)
            .await
            .unwrap());
    }
    // A ring of two slots: every pass reclaims the slot the jobs are in. Completed history
    // older than its retention (none) goes with it; failed and cancelled jobs within theirs
    // (an hour) are carried into the other slot, pass after pass, unchanged.
    let mut carried = 0;
    for _ in 0..4 {
        let (n, _) = qs
            .rotate_queue_ring(&db.pool, Duration::ZERO, Duration::from_secs(3600))
            .await
            .unwrap();
        carried += n.unwrap_or(0);
    }
    assert!(carried >= 4, "carried at least twice: {carried}");
    let kept = history(&db, &ids).await;
    assert_eq!(
        kept.iter()
            .map(|(id, state, _)| (*id, state.as_str()))
            .collect::<Vec<_>>(),
        vec![(ids[1], "failed"), (ids[2], "cancelled")]
    );
    assert_eq!(kept[0].2[0]["error"], "boom");
    // A carried failed job is still a failed job: a retry finds it.
    assert_eq!(
        qs.retry(db.pool.pool(), ids[1]).await.unwrap().as_deref(),
        Some("retried")
    );
    assert_eq!(history(&db, &ids[1..2]).await[0].1, "available");
    // Past their retention they go with the slot, as canonical's pruning deletes them.
    for _ in 0..2 {
        qs.rotate_queue_ring(&db.pool, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap();
    }
    assert_eq!(
        history(&db, &ids)
            .await
            .iter()
            .map(|(id, state, _)| (*id, state.clone()))
            .collect::<Vec<_>>(),
        vec![(ids[1], "available".to_string())],
        "the cancelled job is gone; the retried one is live and carried"
    );
}

#[tokio::test]
async fn priority_aging_lets_an_old_low_priority_lane_go_first() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let mut old = jobs("aged", 4, 1, "old").remove(0);
    old.run_at = Some(chrono::Utc::now() - chrono::Duration::hours(1));
    let fresh = jobs("aged", 1, 1, "new").remove(0);
    let ids = qs.enqueue(db.pool.pool(), &[old, fresh]).await.unwrap();

    // Without aging the best priority goes first; an hour of 60 s intervals brings priority 4
    // to 1, and its job is older.
    let plain = qs.claim_queue(&db.pool, "aged", 1, None).await.unwrap();
    assert_eq!(plain[0].id, ids[1]);
    let mut again = jobs("aged", 1, 1, "newer").remove(0);
    again.run_at = None;
    qs.enqueue(db.pool.pool(), &[again]).await.unwrap();
    let aged = qs
        .claim_queue_aged(&db.pool, "aged", 1, None, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(aged[0].id, ids[0], "the old job's lane goes first");
    assert_eq!(aged[0].priority, 4, "its own priority is kept");
    // Aging too slow to matter within the hour: priority decides again.
    let slow = qs
        .claim_queue_aged(&db.pool, "aged", 1, None, Some(Duration::from_secs(86_400)))
        .await
        .unwrap();
    assert_eq!(slow[0].priority, 1);
}

/// The slots `qs_slot_window` tells a claim at `cursor` to open.
async fn window(db: &TestDb, cursor: i64) -> BTreeSet<i32> {
    let (lo1, hi1, lo2, hi2): (i32, i32, i32, i32) =
        sqlx::query_as("SELECT lo1, hi1, lo2, hi2 FROM awa_qs.qs_slot_window($1)")
            .bind(cursor)
            .fetch_one(db.pool.pool())
            .await
            .unwrap();
    (lo1..=hi1).chain(lo2..=hi2).collect()
}

/// One pass of the ring (nothing old enough to reclaim): the new current slot, if it moved.
async fn turn(qs: &QueueStorage, db: &TestDb) -> Option<i32> {
    qs.rotate(&db.pool, Duration::from_secs(3600))
        .await
        .unwrap()
        .queue_slot
}

/// A transaction that has taken its snapshot, at the isolation level given.
async fn snapshot_taken(
    db: &TestDb,
    isolation: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SET TRANSACTION ISOLATION LEVEL {isolation}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tx
}

async fn seal(db: &TestDb, slot: i32) -> Option<i64> {
    sqlx::query_scalar("SELECT seal_seq FROM awa_qs.queue_ring_slots WHERE slot = $1")
        .bind(slot)
        .fetch_one(db.pool.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_claim_opens_the_slots_past_its_cursor_and_finds_what_is_in_them() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    assert_eq!(
        window(&db, 0).await,
        BTreeSet::from([0]),
        "empty slots are not opened"
    );

    // Slot 0: one job claimed, one left waiting; the ring moves on to slot 1.
    let ids = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 2, "a"))
        .await
        .unwrap();
    let first = qs.claim(&db.pool, queue, priority, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    let r = qs
        .rotate(&db.pool, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(r.queue_slot, Some(1));
    let sealed = seal(&db, 0)
        .await
        .expect("slot 0 is sealed once the ring left it");
    assert_eq!(seal(&db, 1).await, None, "the current slot is open");
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM awa_qs.ready_entries_0 ORDER BY seq")
        .fetch_all(db.pool.pool())
        .await
        .unwrap();
    assert!(
        seqs.iter().all(|s| *s <= sealed),
        "{seqs:?} above the seal {sealed}"
    );
    // A cursor at or below the seal opens slot 0 too; one past it opens the current slot only.
    assert_eq!(window(&db, sealed).await, BTreeSet::from([0, 1]));
    assert_eq!(window(&db, sealed + 1).await, BTreeSet::from([1]));

    // Slot 1: a job; the waiting job of slot 0 is still claimed (its lane's cursor is at or
    // below it), before the newer one.
    let later = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 1, "b"))
        .await
        .unwrap();
    let got = qs.claim(&db.pool, queue, priority, 10).await.unwrap();
    assert_eq!(
        got.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![ids[1], later[0]]
    );

    // Around the ring (slots 2, 3, then 0 again once reclaimed): the window wraps the ring's
    // end and still finds every job.
    let mut all = Vec::new();
    for round in 0..6 {
        all.extend(
            qs.enqueue(db.pool.pool(), &jobs(queue, priority, 1, "c"))
                .await
                .unwrap(),
        );
        qs.rotate(&db.pool, Duration::ZERO).await.unwrap();
        if round % 2 == 1 {
            let got = qs.claim(&db.pool, queue, priority, 10).await.unwrap();
            let want: Vec<i64> = std::mem::take(&mut all);
            assert_eq!(
                got.iter().map(|c| c.id).collect::<Vec<_>>(),
                want,
                "round {round}"
            );
        }
    }
    let generation: i64 = sqlx::query_scalar("SELECT generation FROM awa_qs.queue_ring_state")
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
    assert!(
        generation > 4,
        "the ring went round (generation {generation})"
    );
}

#[tokio::test]
async fn a_rotation_waits_for_every_producer_of_the_slot_it_seals() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    let slot_of = |id: i64| {
        sqlx::query_as::<_, (i32, i64)>("SELECT slot, seq FROM awa_qs.ready_entries WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool.pool())
    };
    qs.enqueue(db.pool.pool(), &jobs(queue, priority, 1, "a"))
        .await
        .unwrap();

    // A producer that read the current slot holds the ring: no rotation until it ends.
    let mut open = snapshot_taken(&db, "READ COMMITTED").await;
    let held = qs
        .enqueue(&mut *open, &jobs(queue, priority, 1, "held"))
        .await
        .unwrap();
    assert_eq!(
        turn(&qs, &db).await,
        None,
        "the ring moved under an open producer"
    );
    assert_eq!(seal(&db, 0).await, None);
    open.commit().await.unwrap();
    assert_eq!(turn(&qs, &db).await, Some(1));
    let (_, held_seq) = slot_of(held[0]).await.unwrap();
    assert!(seal(&db, 0).await.expect("sealed") >= held_seq);

    // A READ COMMITTED producer whose transaction began before the rotation appends to the
    // new slot.
    let mut rc = snapshot_taken(&db, "READ COMMITTED").await;
    assert_eq!(turn(&qs, &db).await, Some(2));
    let rc_ids = qs
        .enqueue(&mut *rc, &jobs(queue, priority, 1, "rc"))
        .await
        .unwrap();
    rc.commit().await.unwrap();
    assert_eq!(slot_of(rc_ids[0]).await.unwrap().0, 2);

    // A REPEATABLE READ producer whose snapshot predates a rotation cannot append to the
    // slot it still sees as current: a serialization failure, nothing written.
    let mut rr = snapshot_taken(&db, "REPEATABLE READ").await;
    assert_eq!(turn(&qs, &db).await, Some(3));
    let refused = qs
        .enqueue(&mut *rr, &jobs(queue, priority, 1, "rr"))
        .await
        .expect_err("appended to a sealed slot");
    let code = match &refused {
        AwaError::Database(e) => e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.to_string()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("40001"), "{refused:?}");
    rr.rollback().await.unwrap();
    // A REPEATABLE READ producer whose snapshot is newer than the rotation appends as usual.
    let mut rr = snapshot_taken(&db, "REPEATABLE READ").await;
    let rr_ids = qs
        .enqueue(&mut *rr, &jobs(queue, priority, 1, "rr"))
        .await
        .unwrap();
    rr.commit().await.unwrap();
    assert_eq!(slot_of(rr_ids[0]).await.unwrap().0, 3);

    let claimed = qs.claim(&db.pool, queue, priority, 10).await.unwrap();
    let mut want = vec![held[0], rc_ids[0], rr_ids[0]];
    want.sort();
    let mut got: Vec<i64> = claimed.iter().map(|c| c.id).collect();
    got.retain(|id| want.contains(id));
    got.sort();
    assert_eq!(got, want);
    assert_eq!(claimed.len(), 4, "the first job, then the three producers'");
}

#[tokio::test]
async fn a_lane_never_claimed_is_found_after_other_lanes_pass_its_slot() {
    // A lane gets its row at its first claim. Until then its entries can be in any slot, and
    // a queue's probe must still open that slot after the ring has moved on and the queue's
    // busy lane has passed the slot's seal: the starved low-priority job is found, and once
    // the idle lanes have been claimed the window narrows to the current slot again.
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let low = qs
        .enqueue(db.pool.pool(), &jobs("q", 4, 1, "low"))
        .await
        .unwrap();
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 2, "busy"))
        .await
        .unwrap();
    assert_eq!(qs.claim(&db.pool, "q", 2, 10).await.unwrap().len(), 2);
    assert_eq!(turn(&qs, &db).await, Some(1));
    let sealed = seal(&db, 0).await.expect("sealed");
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 1, "busy"))
        .await
        .unwrap();
    // The busy lane's cursor passes slot 0's seal (its stable point follows the cluster's xmin
    // horizon, which another test's transaction can hold back for a moment).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        qs.claim(&db.pool, "q", 2, 10).await.unwrap();
        let cursor: i64 = sqlx::query_scalar(
            "SELECT cursor FROM awa_qs.lanes WHERE queue = 'q' AND priority = 2",
        )
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
        if cursor > sealed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the busy lane never passed the seal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = qs.claim_queue(&db.pool, "q", 10, None).await.unwrap();
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), low);

    // Idle now: a few more polls and every lane of the queue is past the seal, so a probe
    // opens the current slot only.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(qs
            .claim_queue(&db.pool, "q", 10, None)
            .await
            .unwrap()
            .is_empty());
        let behind: i64 = sqlx::query_scalar(
            "SELECT 4 - count(*) FILTER (WHERE cursor > $1) FROM awa_qs.lanes WHERE queue = 'q'",
        )
        .bind(sealed)
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
        if behind == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{behind} lanes stay behind the seal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(window(&db, sealed + 1).await, BTreeSet::from([1]));
}

#[tokio::test]
async fn claims_before_the_first_seq_is_drawn_do_not_pass_it() {
    // The seq's `last_value` is 1 before anything is drawn; a stable point taken from it
    // would let the cursor pass the first job ever appended.
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    for _ in 0..5 {
        assert!(qs
            .claim(&db.pool, queue, priority, 1)
            .await
            .unwrap()
            .is_empty());
        turn(&qs, &db).await;
    }
    let first = qs
        .enqueue(db.pool.pool(), &jobs(queue, priority, 1, "first"))
        .await
        .unwrap();
    let got = qs.claim_queue(&db.pool, queue, 10, None).await.unwrap();
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), first);
}

/// How many lanes of `queue` have a row (a lane gets one at its first claim).
async fn lane_rows(db: &TestDb, queue: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM awa_qs.lanes WHERE queue = $1")
        .bind(queue)
        .fetch_one(db.pool.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_claim_that_takes_jobs_leaves_idle_lanes_to_idle_polls() {
    // Claiming the idle lanes that keep a sealed slot in the probes' window only narrows the
    // window. A claim that takes a job does it once the window is wider than the current slot
    // and the one before it; until then idle polls do it, so a pickup right after a rotation
    // does not wait for three empty lanes' claims.
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let claim = |queue: &'static str| qs.claim_queue(&db.pool, queue, 10, None);
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 1, "a"))
        .await
        .unwrap();
    assert_eq!(claim("q").await.unwrap().len(), 1);
    assert_eq!(turn(&qs, &db).await, Some(1));
    // Lanes 1, 3 and 4 of q have no row (cursor 0): they keep slot 0 in q's window.
    qs.enqueue(db.pool.pool(), &jobs("q", 2, 1, "b"))
        .await
        .unwrap();
    assert_eq!(window(&db, 0).await, BTreeSet::from([0, 1]));
    assert_eq!(claim("q").await.unwrap().len(), 1);
    assert_eq!(
        lane_rows(&db, "q").await,
        1,
        "the pickup claimed idle lanes"
    );
    assert!(claim("q").await.unwrap().is_empty());
    assert_eq!(
        lane_rows(&db, "q").await,
        4,
        "the idle poll left idle lanes"
    );

    // Queue r's idle lanes keep slot 0 in its window while the ring turns twice more: the
    // window spans the whole ring, and the claim that takes r's jobs claims them too.
    qs.enqueue(db.pool.pool(), &jobs("r", 2, 1, "c"))
        .await
        .unwrap();
    assert_eq!(turn(&qs, &db).await, Some(2));
    assert_eq!(turn(&qs, &db).await, Some(3));
    qs.enqueue(db.pool.pool(), &jobs("r", 2, 1, "d"))
        .await
        .unwrap();
    assert_eq!(window(&db, 0).await, BTreeSet::from([0, 1, 2, 3]));
    assert_eq!(claim("r").await.unwrap().len(), 2);
    assert_eq!(
        lane_rows(&db, "r").await,
        4,
        "a wide window left idle lanes"
    );
}

#[tokio::test]
async fn the_newest_open_producer_holds_the_stable_point_back() {
    // A lane's candidate stable point is confirmed once every xid below its `cand_xmax` has
    // ended, so `cand_xmax` must be above the xid of every producer of a seq at or below
    // `cand_seq`. A snapshot's xmax is not: it is one past the latest *completed* xid, and a
    // producer that began after that transaction and is still open holds an xid at or above
    // it. A candidate taken that way was confirmed while the producer ran, and the cursor
    // passed its entry (found again only when its slot was reclaimed).
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let (queue, priority) = LANE;
    // The producer is the newest transaction: no transaction that began after it has ended
    // when the claims below take their candidate.
    let (late, late_ids, late_seq, late_xid) = open_producer(&db, &qs).await;
    for _ in 0..3 {
        assert!(qs
            .claim(&db.pool, queue, priority, 10)
            .await
            .unwrap()
            .is_empty());
        let (cursor, cand_seq, cand_xmax): (i64, i64, i64) = sqlx::query_as(
            "SELECT cursor, cand_seq, cand_xmax::text::bigint FROM awa_qs.lanes
             WHERE queue = $1 AND priority = $2",
        )
        .bind(queue)
        .bind(priority)
        .fetch_one(db.pool.pool())
        .await
        .unwrap();
        assert!(
            cand_seq < late_seq || cand_xmax > late_xid,
            "candidate (seq {cand_seq}, xmax {cand_xmax}) covers seq {late_seq} of open xid {late_xid}"
        );
        assert!(
            cursor <= late_seq,
            "the cursor ({cursor}) passed open seq {late_seq}"
        );
    }
    late.commit().await.unwrap();
    let after = qs.claim(&db.pool, queue, priority, 10).await.unwrap();
    assert_eq!(after.iter().map(|c| c.id).collect::<Vec<_>>(), late_ids);
}

/// What `pg_proc` holds for a function of the test schema: its signatures and comments.
async fn overloads(db: &TestDb, name: &str) -> Vec<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT p.oid::regprocedure::text, obj_description(p.oid, 'pg_proc')
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'awa_qs' AND p.proname = $1 ORDER BY 1",
    )
    .bind(name)
    .fetch_all(&db.pool)
    .await
    .expect("pg_proc")
}

/// Make `schema` look as an older library left it: no version kept, an overload of
/// `qs_claim` with an older signature (which makes a three-argument call ambiguous), and a
/// `qs_claim_queue` that hands out nothing.
async fn age_substrate_in(db: &TestDb, schema: &str) {
    for sql in [
        format!("DROP TABLE {schema}.qs_substrate"),
        format!(
            "CREATE FUNCTION {schema}.qs_claim(p_queue text, p_priority smallint, p_n integer)
             RETURNS SETOF bigint LANGUAGE sql AS 'SELECT NULL::bigint WHERE false'"
        ),
        // Another return type: dropped first, as an older install had it.
        format!(
            "DROP FUNCTION {schema}.qs_claim_queue(text, integer, interval, interval, smallint)"
        ),
        format!(
            "CREATE FUNCTION {schema}.qs_claim_queue(p_queue text, p_n integer,
                 p_deadline interval DEFAULT NULL, p_aging interval DEFAULT NULL)
             RETURNS SETOF {schema}.ready_entries LANGUAGE plpgsql AS 'BEGIN RETURN; END'"
        ),
    ] {
        sqlx::query(&sql).execute(&db.pool).await.expect(&sql);
    }
}

async fn age_substrate(db: &TestDb) {
    age_substrate_in(db, "awa_qs").await
}

#[tokio::test]
async fn an_older_substrate_gets_this_librarys_functions_and_keeps_its_jobs() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let ids = qs
        .enqueue(&db.pool, &jobs(LANE.0, LANE.1, 2, "old"))
        .await
        .expect("enqueue");
    let first = qs.claim(&db.pool, LANE.0, LANE.1, 1).await.expect("claim");
    assert_eq!(first.len(), 1);
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(awa_core::storage::queue_storage::SUBSTRATE_VERSION)
    );
    age_substrate(&db).await;
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(1)
    );
    assert_eq!(overloads(&db, "qs_claim").await.len(), 2);
    // On a new connection (the pool's may hold a plan naming the function they first found).
    let mut fresh = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let broken = sqlx::query("SELECT * FROM awa_qs.qs_claim('q', 2::smallint, 1)")
        .fetch_all(&mut fresh)
        .await
        .expect_err("the aged substrate is broken as set up");
    assert!(broken.to_string().contains("is not unique"), "{broken}");

    // Installing again (install_queue_storage without reset, or a transition's prepare)
    // replaces the functions and leaves every row where it was.
    qs.install(&db.pool)
        .await
        .expect("install over the old substrate");
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(awa_core::storage::queue_storage::SUBSTRATE_VERSION)
    );
    assert_eq!(
        overloads(&db, "qs_claim").await.len(),
        1,
        "the old overload is gone"
    );
    let trigger: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'awa_qs.ready_entries'::regclass
           AND tgname = 'qs_hold_xid'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("trigger");
    assert_eq!(trigger, 1, "the producers' trigger is kept, once");
    let second = qs
        .claim_queue(&db.pool, LANE.0, 5, None)
        .await
        .expect("claim after the upgrade");
    assert_eq!(
        second.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[1]]
    );
    let done = qs
        .complete(
            &db.pool,
            &[first[0].id, second[0].id],
            &[first[0].run_lease, second[0].run_lease],
        )
        .await
        .expect("complete");
    assert_eq!(
        done.len(),
        2,
        "the lease taken before the upgrade completes too"
    );
    let states: Vec<String> = qs
        .jobs(&db.pool)
        .await
        .expect("jobs")
        .into_iter()
        .map(|j| j.state.to_string())
        .collect();
    assert_eq!(states, vec!["completed", "completed"]);
    // A second install finds nothing to do.
    qs.install(&db.pool).await.expect("install again");
    assert_eq!(overloads(&db, "qs_claim").await.len(), 1);
}

#[tokio::test]
async fn a_current_or_newer_substrate_is_left_alone() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    let mark = |tag: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(&format!(
                "COMMENT ON FUNCTION awa_qs.qs_last_seq() IS '{tag}'"
            ))
            .execute(&pool)
            .await
            .expect("comment");
        }
    };
    mark("current").await;
    assert!(!qs.upgrade(&db.pool).await.expect("upgrade"));
    qs.install(&db.pool).await.expect("install");
    assert_eq!(
        overloads(&db, "qs_last_seq").await[0].1.as_deref(),
        Some("current"),
        "a current substrate's functions are not replaced"
    );
    let newer = awa_core::storage::queue_storage::SUBSTRATE_VERSION + 1;
    sqlx::query("UPDATE awa_qs.qs_substrate SET version = $1")
        .bind(newer)
        .execute(&db.pool)
        .await
        .expect("newer");
    mark("newer").await;
    // A newer library's operator functions (admin.sql) are kept too: they read what its
    // functions write.
    sqlx::query(
        "CREATE OR REPLACE FUNCTION awa_qs.qs_retry(p_id bigint) RETURNS text
         LANGUAGE sql AS $$ SELECT 'newer' $$",
    )
    .execute(&db.pool)
    .await
    .expect("newer retry");
    qs.install(&db.pool).await.expect("install");
    assert!(!qs.upgrade(&db.pool).await.expect("upgrade"));
    let retry: String = sqlx::query_scalar("SELECT awa_qs.qs_retry(0)")
        .fetch_one(db.pool.pool())
        .await
        .expect("retry");
    assert_eq!(
        retry, "newer",
        "an older install leaves a newer admin.sql alone"
    );
    assert_eq!(
        overloads(&db, "qs_last_seq").await[0].1.as_deref(),
        Some("newer"),
        "a newer library's functions are not replaced by an older one's"
    );
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(newer)
    );
    // Nothing installed: nothing to upgrade, and no error.
    let elsewhere = QueueStorage::new("awa_qs_none", 4, 2).expect("config");
    assert_eq!(
        elsewhere
            .installed_version(&db.pool)
            .await
            .expect("version"),
        None
    );
    assert!(!elsewhere.upgrade(&db.pool).await.expect("upgrade"));
}

/// The kind `jobs()` enqueues ("k").
#[derive(serde::Serialize, serde::Deserialize)]
struct K {}
impl awa_core::JobArgs for K {
    fn kind() -> String {
        "k".into()
    }
}

#[tokio::test]
async fn a_runtime_start_upgrades_an_older_substrate_before_it_claims() {
    use awa_core::storage::engine::Engine;
    use awa_core::{Client, JobResult, QueueConfig, RuntimeConfig};
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    age_substrate(&db).await;
    let pool = db
        .pool
        .with_engine(Engine::QueueStorage(Arc::new(qs.clone())));
    let client = Client::builder(pool.clone())
        .queue(LANE.0, QueueConfig::new(1))
        .config(RuntimeConfig {
            poll_interval: Duration::from_millis(50),
            ..RuntimeConfig::default()
        })
        .register::<K, _, _>(|_args, _ctx| async move { Ok(JobResult::Completed) })
        .build()
        .expect("build");
    client.start().await.expect("start");
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(awa_core::storage::queue_storage::SUBSTRATE_VERSION)
    );
    // The operator actions (admin.sql) and callbacks' resolution (callbacks.sql) are there
    // after the upgrade too.
    for name in ["qs_take_key", "qs_retry", "qs_discard_failed"] {
        assert_eq!(overloads(&db, name).await.len(), 1, "{name}");
    }
    // Straight into the substrate (the transition state still routes new jobs to canonical).
    let id = qs
        .enqueue(&db.pool, &jobs(LANE.0, LANE.1, 1, "after start"))
        .await
        .expect("enqueue")[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let state = qs
            .jobs(&db.pool)
            .await
            .expect("jobs")
            .into_iter()
            .find(|j| j.id == id)
            .map(|j| j.state.to_string());
        if state.as_deref() == Some("completed") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not completed: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn migrate_upgrades_the_installed_substrate() {
    let db = TestDb::new().await;
    let qs = QueueStorage::new("awa_qs", 4, 2).expect("config");
    awa_core::storage::transition::install_queue_storage(&db.pool, &qs, false)
        .await
        .expect("install");
    age_substrate(&db).await;
    awa_core::migrate(&db.pool).await.expect("migrate");
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(awa_core::storage::queue_storage::SUBSTRATE_VERSION)
    );
    assert_eq!(overloads(&db, "qs_claim").await.len(), 1);
}

#[tokio::test]
async fn a_role_that_may_not_replace_the_functions_is_told_what_to_do() {
    let db = TestDb::new().await;
    // Schema `awa`, which the documented grants cover.
    let qs = QueueStorage::new("awa", 4, 2).expect("config");
    awa_core::storage::transition::install_queue_storage(&db.pool, &qs, false)
        .await
        .expect("install");
    let role = common::TestRole::new(&db, "qsup").await;
    role.grant_documented(&db).await;
    let app = role.pool(2).await;
    // The version is readable without a grant of its own (an owner's upgrade may create the
    // table after the role's grants, which default privileges cover only if they were set).
    sqlx::query(&format!(
        "REVOKE ALL ON awa.qs_substrate FROM \"{}\"",
        role.name
    ))
    .execute(&db.pool)
    .await
    .expect("revoke");
    // Current: the application role's start and migrate() read and go on.
    assert!(!qs.upgrade_or_explain(&app).await.expect("current"));
    awa_core::migrate(&app)
        .await
        .expect("migrate as the application role");
    age_substrate_in(&db, "awa").await;
    for refused in [
        qs.upgrade_or_explain(&app).await.map(|_| ()),
        awa_core::migrate(&app).await,
    ] {
        match refused {
            Err(AwaError::State(m)) => {
                assert!(m.contains("are version 1 but"), "{m}");
                assert!(m.contains("the schema owner must run migrate()"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(1),
        "nothing changed"
    );
    app.close().await;
    awa_core::migrate(&db.pool)
        .await
        .expect("migrate as the owner");
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(awa_core::storage::queue_storage::SUBSTRATE_VERSION)
    );
}

#[tokio::test]
async fn an_upgrade_refuses_to_drop_a_users_object_and_changes_nothing() {
    let db = TestDb::new().await;
    let qs = installed(&db, 4, 2).await;
    sqlx::query("CREATE VIEW public.live_jobs AS SELECT awa_qs.qs_jobs_live() AS n")
        .execute(&db.pool)
        .await
        .expect("a user's view over a substrate function");
    sqlx::query("DROP TABLE awa_qs.qs_substrate")
        .execute(&db.pool)
        .await
        .expect("age");
    let refused = qs
        .install(&db.pool)
        .await
        .expect_err("the view depends on it");
    assert!(
        refused.to_string().contains("depend"),
        "PostgreSQL's own refusal: {refused}"
    );
    assert_eq!(
        qs.installed_version(&db.pool).await.expect("version"),
        Some(1),
        "nothing changed"
    );
    let n: i64 = sqlx::query_scalar("SELECT n FROM public.live_jobs")
        .fetch_one(&db.pool)
        .await
        .expect("the view is still there");
    assert_eq!(n, 0);
}
