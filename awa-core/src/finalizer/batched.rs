//! The batched completion path: many plain `Completed` jobs in one statement and one commit.

use crate::error::AwaError;
use crate::finalizer::retry::{self, Failure, Ready, RetryPolicy};
use crate::finalizer::MAX_FINALIZE_ATTEMPTS;
use crate::metrics;
use crate::storage::pool::Db;
use sqlx::pool::PoolConnection;
use sqlx::Postgres;

const COMPLETE_BATCH: &str = "UPDATE awa.jobs j
     SET state = 'completed', finalized_at = now(), progress = NULL, heartbeat_at = NULL,
         callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL
     FROM unnest($1::bigint[], $2::bigint[]) AS t(id, lease)
     WHERE j.id = t.id AND j.run_lease = t.lease AND j.state = 'running'
     RETURNING j.id";

/// Complete every `(id, run_lease)` pair that is still running under that lease; pairs that
/// match nothing are stale and ignored. Returns the ids that completed. Retries with the
/// default [`RetryPolicy`] (see [`complete_batch_with`]).
pub async fn complete_batch(pool: &Db, ids: &[i64], leases: &[i64]) -> Result<Vec<i64>, AwaError> {
    complete_batch_with(pool, ids, leases, &RetryPolicy::default()).await
}

/// [`complete_batch`] with an explicit retry policy.
///
/// Retries like a per-job finalization ([`retry`]): a deadlock at once, a lost connection once
/// the pool hands out a working connection again, at most [`MAX_FINALIZE_ATTEMPTS`] tries in
/// all. A batch whose commit landed but whose acknowledgement was lost replays as stale (its
/// rows are no longer `running`), so it is never applied twice.
pub async fn complete_batch_with(
    pool: &Db,
    ids: &[i64],
    leases: &[i64],
    policy: &RetryPolicy,
) -> Result<Vec<i64>, AwaError> {
    let reconnect = retry::Reconnect::start(policy);
    let mut conn: Option<PoolConnection<Postgres>> = None;
    let mut attempt = 1;
    loop {
        let query = sqlx::query_scalar::<_, i64>(COMPLETE_BATCH)
            .bind(ids)
            .bind(leases);
        let result = match conn.take() {
            Some(mut c) => query.fetch_all(&mut *c).await,
            None => query.fetch_all(pool).await,
        };
        let e = match result {
            Ok(done) => {
                metrics::add(&metrics::JOBS_COMPLETED_BATCHED, done.len() as u64);
                let stale = ids.len() - done.len();
                if stale > 0 {
                    metrics::add(&metrics::FINALIZE_STALE, stale as u64);
                    tracing::debug!(stale, "batched completion skipped stale attempts");
                }
                return Ok(done);
            }
            Err(e) => e,
        };
        let failure = retry::classify_sqlx(&e);
        if failure != Failure::Permanent && attempt < MAX_FINALIZE_ATTEMPTS {
            let ready = if failure == Failure::ConnectionLost {
                reconnect.working_connection(pool).await
            } else {
                Ready::Now
            };
            match ready {
                Ready::On(c) => conn = Some(c),
                Ready::Now => {}
                Ready::GaveUp => return Err(gave_up(ids.len(), e)),
            }
            metrics::add(&metrics::FINALIZE_RETRIES, 1);
            tracing::warn!(attempt, jobs = ids.len(), error = %e, "batched completion failed; retrying");
            attempt += 1;
            continue;
        }
        return Err(gave_up(ids.len(), e));
    }
}

fn gave_up(jobs: usize, e: sqlx::Error) -> AwaError {
    metrics::add(&metrics::FINALIZE_GAVE_UP, jobs as u64);
    tracing::error!(jobs, error = %e, "batched completion failed; the jobs stay running until rescue");
    e.into()
}
