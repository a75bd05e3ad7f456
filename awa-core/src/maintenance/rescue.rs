//! Rescue: running jobs whose worker stopped heartbeating or whose deadline passed, and
//! parked jobs whose callback timed out. Each becomes retryable now, or failed (and
//! dead-lettered where enabled) when its attempts are exhausted.

use crate::error::Result;
use crate::metrics;
use crate::model::job::JOB_COLUMNS;
use crate::model::JobRow;
use crate::specs::{SpecEvent, Specs};
use crate::storage::dlq::move_failed_where_enabled;
use crate::storage::insert::insert_follow_up_in_tx;
use crate::storage::pool::Db;
use std::time::Duration;

/// What a rescue pass looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RescueKind {
    StaleHeartbeat,
    ExpiredDeadline,
    CallbackTimeout,
}

/// Rescue one kind of stuck job; returns the ids rescued.
pub async fn rescue_stale(pool: &Db, kind: RescueKind, staleness: Duration) -> Result<Vec<i64>> {
    rescue_stale_with_specs(pool, kind, staleness, &Specs::default()).await
}

/// [`rescue_stale`], firing the registered `on_exhausted` specs of jobs that rescue fails for
/// good, in the same transaction (the leader uses its client's specs).
pub async fn rescue_stale_with_specs(
    pool: &Db,
    kind: RescueKind,
    staleness: Duration,
    specs: &Specs,
) -> Result<Vec<i64>> {
    let (condition, reason) = match kind {
        RescueKind::StaleHeartbeat => (
            "state = 'running' AND heartbeat_at < now() - make_interval(secs => $1)",
            "rescued: heartbeat stale",
        ),
        RescueKind::ExpiredDeadline => (
            "state = 'running' AND deadline_at < now()",
            "rescued: deadline passed",
        ),
        RescueKind::CallbackTimeout => (
            "state IN ('waiting_external', 'running') AND callback_timeout_at < now()",
            "rescued: callback timed out",
        ),
    };
    let mut tx = pool.begin().await?;
    let rescued: Vec<(i64, String, String, String)> = sqlx::query_as(&format!(
        "WITH stuck AS (
             SELECT id FROM awa.canonical_jobs WHERE {condition} AND $1 >= 0
             ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
         UPDATE awa.canonical_jobs j SET
             state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                          WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'retryable' END,
             finalized_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                                   OR j.attempt >= j.max_attempts THEN now() END,
             run_at = now(), heartbeat_at = NULL, deadline_at = NULL,
             callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL,
             errors = j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(), 'error', $2::text))
         FROM stuck WHERE j.id = stuck.id
         RETURNING j.id, j.state, j.kind, j.queue"
    ))
    .bind(staleness.as_secs_f64())
    .bind(reason)
    .fetch_all(&mut *tx)
    .await?;
    let failed: Vec<i64> = rescued
        .iter()
        .filter(|(_, s, ..)| s == "failed")
        .map(|(id, ..)| *id)
        .collect();
    // A job whose cancel was requested while it ran is cancelled, not run again.
    let cancelled: Vec<i64> = rescued
        .iter()
        .filter(|(_, s, ..)| s == "cancelled")
        .map(|(id, ..)| *id)
        .collect();
    for (ids, event) in [
        (&failed, SpecEvent::Exhausted),
        (&cancelled, SpecEvent::Cancelled),
    ] {
        if ids.is_empty() || !specs.has_any(event) {
            continue;
        }
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM awa.canonical_jobs WHERE id = ANY($1) ORDER BY id"
        ))
        .bind(ids)
        .fetch_all(&mut *tx)
        .await?;
        for row in &rows {
            let job = JobRow::from_row(row)?;
            for follow_up in specs.follow_ups(&job, event)? {
                insert_follow_up_in_tx(&mut tx, &follow_up, false).await?;
            }
        }
    }
    if !failed.is_empty() {
        move_failed_where_enabled(&mut tx, &failed, reason).await?;
    }
    tx.commit().await?;
    crate::metrics::series::record_each(
        rescued.iter().map(|(_, _, k, q)| (k.as_str(), q.as_str())),
        crate::metrics::series::JobEvent::Rescued,
    );
    let ids: Vec<i64> = rescued.into_iter().map(|(id, ..)| id).collect();
    if !ids.is_empty() {
        metrics::add(&metrics::JOBS_RESCUED, ids.len() as u64);
        tracing::warn!(count = ids.len(), ?kind, "rescued stuck jobs");
    }
    Ok(ids)
}

/// Make due scheduled and retryable jobs available, waking their queues.
pub async fn promote_due(pool: &Db) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(
        "WITH due AS (
             SELECT id FROM awa.canonical_jobs j
             WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
               -- A job whose unique states hold 'available' but not its current state would
               -- take its key back on promotion: while another row holds that key it stays
               -- where it is, instead of failing the whole promotion statement every pass.
               AND (j.unique_key IS NULL
                    OR (j.unique_states & awa.state_bit(j.state)) <> 0
                    OR (j.unique_states & awa.state_bit('available')) = 0
                    OR NOT EXISTS (
                        SELECT 1 FROM awa.canonical_jobs o
                        WHERE o.unique_key = j.unique_key AND o.id <> j.id
                          AND (o.unique_states & awa.state_bit(o.state)) <> 0))
             ORDER BY run_at LIMIT 5000 FOR UPDATE SKIP LOCKED),
         promoted AS (
             UPDATE awa.canonical_jobs j SET state = 'available' FROM due WHERE j.id = due.id RETURNING j.queue),
         woken AS (SELECT pg_notify(awa.queue_channel(q.queue), '') FROM (SELECT DISTINCT queue FROM promoted) q)
         SELECT (SELECT count(*) FROM promoted) + 0 * (SELECT count(*) FROM woken)",
    )
    .fetch_one(pool)
    .await?;
    Ok(n as u64)
}
