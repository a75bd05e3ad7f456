//! The batched completion path: many plain `Completed` jobs in one statement and one commit.

use crate::error::{is_transient, AwaError};
use crate::finalizer::MAX_FINALIZE_ATTEMPTS;
use crate::metrics;
use sqlx::PgPool;

/// Complete every `(id, run_lease)` pair that is still running under that lease; pairs that
/// match nothing are stale and ignored. Returns the ids that completed.
pub async fn complete_batch(
    pool: &PgPool,
    ids: &[i64],
    leases: &[i64],
) -> Result<Vec<i64>, AwaError> {
    let mut attempt = 1;
    loop {
        let result = sqlx::query_scalar::<_, i64>(
            "UPDATE awa.jobs j
             SET state = 'completed', finalized_at = now(), progress = NULL, heartbeat_at = NULL,
                 callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL
             FROM unnest($1::bigint[], $2::bigint[]) AS t(id, lease)
             WHERE j.id = t.id AND j.run_lease = t.lease AND j.state = 'running'
             RETURNING j.id",
        )
        .bind(ids)
        .bind(leases)
        .fetch_all(pool)
        .await;
        match result {
            Ok(done) => {
                metrics::add(&metrics::JOBS_COMPLETED_BATCHED, done.len() as u64);
                let stale = ids.len() - done.len();
                if stale > 0 {
                    metrics::add(&metrics::FINALIZE_STALE, stale as u64);
                    tracing::debug!(stale, "batched completion skipped stale attempts");
                }
                return Ok(done);
            }
            Err(e) if is_transient(&e) && attempt < MAX_FINALIZE_ATTEMPTS => {
                metrics::add(&metrics::FINALIZE_RETRIES, 1);
                tracing::warn!(attempt, error = %e, "batched completion failed; retrying");
                attempt += 1;
            }
            Err(e) => {
                metrics::add(&metrics::FINALIZE_GAVE_UP, ids.len() as u64);
                tracing::error!(jobs = ids.len(), error = %e,
                    "batched completion failed; the jobs stay running until rescue");
                return Err(e.into());
            }
        }
    }
}
