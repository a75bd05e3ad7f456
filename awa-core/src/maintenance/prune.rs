//! Retention: delete finished rows after their retention period. Pruning a completed row also
//! releases its unique key (ADR-046: the deduplication window is tied to terminal retention).

use crate::error::Result;
use crate::storage::pool::Db;
use std::time::Duration;

/// Delete completed rows older than `completed`, and failed or cancelled rows older than
/// `failed`; at most `batch` per call (`cleanup_batch_size`). Returns how many were deleted.
pub async fn prune_terminal(
    pool: &Db,
    completed: Duration,
    failed: Duration,
    batch: usize,
) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM awa.canonical_jobs WHERE id IN (
             SELECT id FROM awa.canonical_jobs
             WHERE (state = 'completed' AND finalized_at < now() - make_interval(secs => $1))
                OR (state IN ('failed', 'cancelled') AND finalized_at < now() - make_interval(secs => $2))
             LIMIT $3)",
    )
    .bind(completed.as_secs_f64())
    .bind(failed.as_secs_f64())
    .bind(i64::try_from(batch).unwrap_or(i64::MAX))
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
