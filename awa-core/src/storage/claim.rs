//! Claiming: the dispatcher's one statement, and giving claimed jobs that never started back.

use crate::error::{is_transient, is_unique_conflict, AwaError, Result};
use crate::finalizer::MAX_FINALIZE_ATTEMPTS;
use crate::model::job::JOB_COLUMNS;
use crate::model::JobRow;
use sqlx::PgExecutor;
use std::time::Duration;

/// Claim up to `limit` available jobs of `queue` in priority, run_at, id order, skipping rows
/// locked by other claimers and doing nothing when the queue is paused. Each claimed row
/// becomes running with attempt + 1 and a new run lease (run_lease + 1), a fresh heartbeat
/// and its deadline.
pub async fn claim_batch<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    limit: i64,
    deadline: Duration,
) -> Result<Vec<JobRow>> {
    claim_where(executor, queue, None, limit, deadline, None).await
}

/// [`claim_batch`] with priority aging: a job is taken as if its priority were one better
/// (down to 1) for every `aging` interval it has been due (`run_at` in the past). The order
/// is computed per claim, so it cannot use the queue's index order: a cost that grows with
/// the number of available jobs in the queue, paid only by queues that ask for aging.
pub async fn claim_batch_aged<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    limit: i64,
    deadline: Duration,
    aging: Option<Duration>,
) -> Result<Vec<JobRow>> {
    claim_where(executor, queue, None, limit, deadline, aging).await
}

/// [`claim_batch`] restricted to one kind (the test harness claims the job it can run).
pub async fn claim_kind<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    kind: &str,
    limit: i64,
    deadline: Duration,
) -> Result<Vec<JobRow>> {
    claim_where(executor, queue, Some(kind), limit, deadline, None).await
}

async fn claim_where<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    kind: Option<&str>,
    limit: i64,
    deadline: Duration,
    aging: Option<Duration>,
) -> Result<Vec<JobRow>> {
    let order = if aging.is_some() {
        "GREATEST(1, priority - floor(extract(epoch FROM now() - run_at) / $5)::int), run_at, id"
    } else {
        "priority, run_at, id"
    };
    let sql = format!(
        "WITH picked AS (
             SELECT id FROM awa.canonical_jobs
             WHERE state = 'available' AND queue = $1 AND ($4::text IS NULL OR kind = $4)
               AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = $1 AND m.paused)
             ORDER BY {order}
             LIMIT $2
             FOR UPDATE SKIP LOCKED)
         UPDATE awa.canonical_jobs j
         SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
             attempted_at = now(), heartbeat_at = now(),
             deadline_at = now() + make_interval(secs => $3),
             callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL,
             cancel_requested_at = NULL
         FROM picked WHERE j.id = picked.id
         RETURNING {}",
        JOB_COLUMNS
            .replace("id, kind", "j.id, j.kind")
            .replace("callback_id::text", "j.callback_id::text")
    );
    let mut q = sqlx::query(&sql)
        .bind(queue)
        .bind(limit)
        .bind(deadline.as_secs_f64())
        .bind(kind);
    if let Some(a) = aging {
        q = q.bind(a.as_secs_f64());
    }
    let rows = q.fetch_all(executor).await?;
    let mut jobs = rows
        .iter()
        .map(|r| JobRow::from_row(r).map_err(AwaError::from))
        .collect::<Result<Vec<_>>>()?;
    jobs.sort_by_key(|j| (j.priority, j.run_at, j.id));
    Ok(jobs)
}

/// What [`release_claimed`] did with one claimed attempt that was still this worker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// Back to `available` with its attempt restored, as if it had never been claimed.
    Released,
    /// A cancel was requested while it waited: it must be finalized as cancelled, not
    /// released (a released job would run later and the request would be lost).
    CancelRequested,
    /// Its unique key is held by another row in a state where `available` would collide (a
    /// key mask that holds `available` but not `running` lets a duplicate in while it ran):
    /// it cannot go back, so it has to run.
    KeyTaken,
}

/// Give claimed attempts that never started back to the queue in one lease-guarded statement:
/// each `(id, run_lease)` still `running` under that lease becomes `available` again with
/// `attempt - 1` (the claim's increment undone), no heartbeat and no deadline. `run_lease` keeps
/// its increment so leases only grow; `run_at`, priority and id are untouched, so the job
/// keeps its place in the queue. `attempted_at` keeps the time of the released claim.
///
/// Pairs that match nothing (no longer this worker's) are left out of the result.
pub(crate) async fn release_claimed(
    pool: &crate::storage::pool::Db,
    ids: &[i64],
    leases: &[i64],
) -> Result<Vec<(i64, Release)>> {
    let mut attempt = 1;
    loop {
        let result = sqlx::query_as::<_, (i64, i16)>(
            "WITH mine AS (
                 SELECT j.id,
                        j.cancel_requested_at IS NOT NULL AS cancel_requested,
                        j.unique_key IS NOT NULL
                          AND (j.unique_states & awa.state_bit('available')) <> 0
                          AND EXISTS (
                              SELECT 1 FROM awa.canonical_jobs o
                              WHERE o.unique_key = j.unique_key AND o.id <> j.id
                                AND (o.unique_states & awa.state_bit(o.state)) <> 0) AS key_taken
                 FROM unnest($1::bigint[], $2::bigint[]) AS t(id, lease)
                 JOIN awa.canonical_jobs j ON j.id = t.id AND j.run_lease = t.lease AND j.state = 'running'
                 ORDER BY j.id
                 FOR UPDATE OF j),
             released AS (
                 UPDATE awa.canonical_jobs j
                 SET state = 'available', attempt = j.attempt - 1,
                     heartbeat_at = NULL, deadline_at = NULL
                 FROM mine
                 WHERE j.id = mine.id AND NOT mine.cancel_requested AND NOT mine.key_taken
                 RETURNING j.id)
             SELECT mine.id,
                    (CASE WHEN r.id IS NOT NULL THEN 0 WHEN mine.cancel_requested THEN 1 ELSE 2 END)::int2
             FROM mine LEFT JOIN released r ON r.id = mine.id",
        )
        .bind(ids)
        .bind(leases)
        .fetch_all(pool)
        .await;
        match result {
            Ok(rows) => {
                return Ok(rows
                    .into_iter()
                    .map(|(id, what)| {
                        let what = match what {
                            0 => Release::Released,
                            1 => Release::CancelRequested,
                            _ => Release::KeyTaken,
                        };
                        (id, what)
                    })
                    .collect())
            }
            // A duplicate committed between the check and the update, or the connection
            // broke: a new statement sees the committed rows (and replays as a no-op for
            // rows a lost acknowledgement already released).
            Err(e)
                if (is_transient(&e) || is_unique_conflict(&e))
                    && attempt < MAX_FINALIZE_ATTEMPTS =>
            {
                tracing::warn!(attempt, error = %e, "releasing claimed jobs failed; retrying");
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
