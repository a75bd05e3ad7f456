//! The storage engine the runtime's statements go to (issue 18).
//!
//! Two implementations: **canonical** (`awa.jobs`, one row per job, updated in place at every
//! state change) and **queue storage** (append-only entries, leases and receipts in rings of
//! partitions reclaimed by `TRUNCATE`; [`crate::storage::queue_storage`]). One enum rather
//! than a trait object: both implementations are known at compile time, each operation is a
//! `match`, and the hot path boxes nothing.
//!
//! The engine travels with the pool handle ([`Db::engine`], set with [`Db::with_engine`]), so
//! every path that already takes a `Db` — the dispatcher's claims and releases, heartbeats,
//! both completion paths and their follow-ups, and the maintenance leader's promotion, rescue
//! and rotation — reaches the right one without a second parameter threaded through.
//!
//! **What runs on queue storage so far** (docs/queue-storage-design.md, "Status"): claims
//! (best priority first, with priority aging by lane), heartbeats with progress and cancel
//! requests, releases of unstarted jobs, batched completion with follow-ups in the same
//! transaction, every per-job outcome (completed with follow-ups, retryable, snoozed, failed,
//! cancelled, parked on a callback), rescue, promotion and both rings' rotation, unique
//! keys (`unique_keys`, checked lazily: functions.sql), and the public insert paths
//! (`storage::routing`), the DLQ (the finalizer's and rescue's moves). Operator actions on
//! jobs of either engine are `storage::routing`'s and `storage::dlq`'s. Rescue fires registered specs'
//! follow-ups. Batch operations change both engines' jobs
//! (`storage::batch_ops`); external callbacks resolve on either (`storage::callbacks`,
//! the lease holding what canonical keeps in the row).

use crate::error::Result;
use crate::model::{JobRow, NewJob};
use crate::storage::claim::{claim_batch_aged, release_claimed, Release};
use crate::storage::pool::Db;
use crate::storage::queue_storage::QueueStorage;
use std::sync::Arc;
use std::time::Duration;

/// Which engine a [`Db`] handle's runtime statements go to.
#[derive(Debug, Clone, Default)]
pub enum Engine {
    /// `awa.jobs`: one row per job, updated in place.
    #[default]
    Canonical,
    /// The append-only engine installed in the given substrate.
    QueueStorage(Arc<QueueStorage>),
}

impl Engine {
    /// `canonical` or `queue_storage` (awa-pg's names for its backends).
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Canonical => "canonical",
            Engine::QueueStorage(_) => "queue_storage",
        }
    }

    /// Claim up to `n` jobs of `queue`, each with the attempt deadline `deadline` from now,
    /// with priority aging when `aging` is given (per job on canonical, per lane head on
    /// queue storage).
    pub(crate) async fn claim(
        &self,
        pool: &Db,
        queue: &str,
        n: usize,
        deadline: Duration,
        aging: Option<Duration>,
    ) -> Result<Vec<JobRow>> {
        match self {
            Engine::Canonical => claim_batch_aged(pool, queue, n as i64, deadline, aging).await,
            Engine::QueueStorage(qs) => {
                let n = i32::try_from(n).unwrap_or(i32::MAX);
                qs.claim_queue_aged(pool, queue, n, Some(deadline), aging)
                    .await
            }
        }
    }

    /// Give claimed attempts that never started back (see [`release_claimed`]).
    pub(crate) async fn release(
        &self,
        pool: &Db,
        ids: &[i64],
        leases: &[i64],
    ) -> Result<Vec<(i64, Release)>> {
        match self {
            Engine::Canonical => release_claimed(pool, ids, leases).await,
            Engine::QueueStorage(qs) => Ok(qs
                .release(pool, ids, leases)
                .await?
                .into_iter()
                .map(|(id, released)| {
                    let what = if released {
                        Release::Released
                    } else {
                        Release::CancelRequested
                    };
                    (id, what)
                })
                .collect()),
        }
    }

    /// Renew the attempts `(ids[i], leases[i])`, storing the progress given for each; returns
    /// each attempt still open with whether a cancel was requested for it.
    pub(crate) async fn heartbeat(
        &self,
        pool: &Db,
        ids: &[i64],
        leases: &[i64],
        progress: &[Option<serde_json::Value>],
    ) -> Result<Vec<(i64, bool)>> {
        match self {
            Engine::Canonical => Ok(sqlx::query_as(
                // Rows locked by a finalization in flight are skipped rather than waited for:
                // one slow completion transaction must not delay every other attempt's
                // heartbeat into rescue.
                "WITH live AS (
                     SELECT x.id, t.progress
                     FROM unnest($1::bigint[], $2::bigint[], $3::jsonb[]) AS t(id, lease, progress)
                     JOIN awa.canonical_jobs x ON x.id = t.id AND x.run_lease = t.lease AND x.state = 'running'
                     FOR UPDATE OF x SKIP LOCKED)
                 UPDATE awa.canonical_jobs j SET heartbeat_at = now(), progress = coalesce(live.progress, j.progress)
                 FROM live WHERE j.id = live.id
                 RETURNING j.id, j.cancel_requested_at IS NOT NULL",
            )
            .bind(ids)
            .bind(leases)
            .bind(progress)
            .fetch_all(pool)
            .await?),
            Engine::QueueStorage(qs) => {
                qs.heartbeat_with(pool, ids, leases, Some(progress))
                    .await
            }
        }
    }

    /// The guarded completion of a batch: every `(ids[i], leases[i])` still running under
    /// that lease completes; returns the pairs that did (the others are stale and wrote
    /// nothing). Through any executor: the pool for a plain batch, a caller's transaction
    /// for one with follow-ups.
    pub(crate) async fn complete_in<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        ids: &[i64],
        leases: &[i64],
    ) -> Result<Vec<(i64, i64)>> {
        match self {
            Engine::Canonical => Ok(sqlx::query_as(CANONICAL_COMPLETE_BATCH)
                .bind(ids)
                .bind(leases)
                .fetch_all(executor)
                .await?),
            Engine::QueueStorage(qs) => qs.complete_leases_in(executor, ids, leases).await,
        }
    }

    /// Insert follow-ups inside the caller's open transaction, in the order given; one
    /// result per job. Both engines skip a follow-up whose unique key is held.
    pub(crate) async fn insert_follow_ups_in_tx(
        &self,
        conn: &mut sqlx::PgConnection,
        jobs: &[&NewJob],
    ) -> Result<Vec<crate::storage::insert::FollowUpInsert>> {
        match self {
            Engine::Canonical => crate::storage::insert::insert_follow_ups_in_tx(conn, jobs).await,
            Engine::QueueStorage(qs) => {
                if jobs.is_empty() {
                    return Ok(Vec::new());
                }
                let ids = qs.enqueue_follow_ups(&mut *conn, jobs).await?;
                Ok(ids
                    .into_iter()
                    .map(crate::storage::insert::FollowUpInsert::from)
                    .collect())
            }
        }
    }
}

/// Canonical's guarded batch completion, returning the lease too: a batch may hold a
/// superseded attempt and the current one of the same job, and only the follow-ups of the one
/// that matched are sent.
const CANONICAL_COMPLETE_BATCH: &str = "UPDATE awa.canonical_jobs j
     SET state = 'completed', finalized_at = now(), progress = NULL, heartbeat_at = NULL,
         callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL
     FROM unnest($1::bigint[], $2::bigint[]) AS t(id, lease)
     WHERE j.id = t.id AND j.run_lease = t.lease AND j.state = 'running'
     RETURNING j.id, j.run_lease";
