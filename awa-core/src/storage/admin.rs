//! Admin reads and operator actions on jobs and queues.

use crate::error::{AwaError, Result};
use crate::model::job::JOB_COLUMNS;
use crate::model::{JobRow, JobState};
use sqlx::PgExecutor;

/// Fetch one job by id.
pub async fn get_job<'e, E: PgExecutor<'e>>(executor: E, id: i64) -> Result<JobRow> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM awa.canonical_jobs WHERE id = $1");
    let row = sqlx::query(&sql).bind(id).fetch_optional(executor).await?;
    match row {
        Some(r) => Ok(JobRow::from_row(&r)?),
        None => Err(AwaError::JobNotFound(id)),
    }
}

/// Filters for [`list_jobs`]; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub kind: Option<String>,
    pub queue: Option<String>,
    /// Defaults to 100.
    pub limit: Option<i64>,
}

/// List jobs matching a filter, newest id first.
pub async fn list_jobs<'e, E: PgExecutor<'e>>(
    executor: E,
    filter: &JobFilter,
) -> Result<Vec<JobRow>> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM awa.canonical_jobs
         WHERE ($1::text IS NULL OR state = $1)
           AND ($2::text IS NULL OR kind = $2)
           AND ($3::text IS NULL OR queue = $3)
         ORDER BY id DESC LIMIT $4"
    );
    let rows = sqlx::query(&sql)
        .bind(filter.state.map(JobState::as_str))
        .bind(filter.kind.as_deref())
        .bind(filter.queue.as_deref())
        .bind(filter.limit.unwrap_or(100).max(0))
        .fetch_all(executor)
        .await?;
    rows.iter()
        .map(|r| JobRow::from_row(r).map_err(AwaError::from))
        .collect()
}

/// The channel running workers listen on for cancellation requests (payload: job id).
pub const CANCEL_CHANNEL: &str = "awa:cancel";

/// Cancel a job. A job that has not started (scheduled, available, retryable, or parked in
/// waiting_external) is cancelled at once; a running job is signalled (`is_cancelled()` turns
/// true in its handler) and ends however its handler decides. Finished jobs are returned as is.
pub async fn cancel(pool: &crate::storage::pool::Db, id: i64) -> Result<JobRow> {
    let mut tx = pool.begin().await?;
    // Lock the row first: between reading a running job and recording the cancel request, a
    // release (claim-ahead at shutdown) or a rescue could otherwise make it available or
    // retryable, and the request would be dropped without a word.
    sqlx::query("SELECT 1 FROM awa.canonical_jobs WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let sql = format!(
        "UPDATE awa.canonical_jobs SET state = 'cancelled', finalized_at = now(), callback_id = NULL,
             callback_timeout_at = NULL, heartbeat_at = NULL
         WHERE id = $1 AND state IN ('scheduled', 'available', 'retryable', 'waiting_external')
         RETURNING {JOB_COLUMNS}"
    );
    if let Some(r) = sqlx::query(&sql).bind(id).fetch_optional(&mut *tx).await? {
        tx.commit().await?;
        return Ok(JobRow::from_row(&r)?);
    }
    let job = get_job(&mut *tx, id).await?;
    if job.state == JobState::Running {
        sqlx::query(
            "UPDATE awa.canonical_jobs SET cancel_requested_at = now() WHERE id = $1 AND state = 'running'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CANCEL_CHANNEL)
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(job)
}

/// Cancel the not-yet-finished job holding a unique key; `None` when no row holds it.
pub async fn cancel_by_unique_key(
    pool: &crate::storage::pool::Db,
    key: &[u8],
) -> Result<Option<JobRow>> {
    let id: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM awa.canonical_jobs WHERE unique_key = $1
           AND state NOT IN ('completed', 'failed', 'cancelled') ORDER BY id DESC LIMIT 1",
    )
    .bind(key)
    .fetch_optional(pool)
    .await?;
    match id {
        Some(id) => Ok(Some(cancel(pool, id).await?)),
        None => Ok(None),
    }
}

/// Retry a failed or cancelled job now. Completed jobs are never reopened: that is what makes
/// "one attempt's follow-ups" hold (ADR-046).
pub async fn retry<'e, E: PgExecutor<'e>>(executor: E, id: i64) -> Result<JobRow> {
    let sql = format!(
        "WITH target AS (SELECT id, state FROM awa.canonical_jobs WHERE id = $1 FOR UPDATE),
         updated AS (
             UPDATE awa.canonical_jobs j SET state = 'available', run_at = now(), finalized_at = NULL,
                 max_attempts = greatest(j.max_attempts, least(j.attempt + 1, 1000))
             FROM target t WHERE j.id = t.id AND t.state IN ('failed', 'cancelled', 'retryable', 'scheduled')
             RETURNING j.*)
         SELECT {JOB_COLUMNS}, true AS changed FROM updated
         UNION ALL
         SELECT {JOB_COLUMNS}, false AS changed FROM awa.canonical_jobs WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM updated)"
    );
    let row = sqlx::query(&sql).bind(id).fetch_optional(executor).await?;
    let Some(row) = row else {
        return Err(AwaError::JobNotFound(id));
    };
    let job = JobRow::from_row(&row)?;
    let changed: bool = sqlx::Row::try_get(&row, "changed")?;
    if !changed {
        return Err(not_retryable(id, job.state.as_str()));
    }
    Ok(job)
}

/// The error of a retry of a job in `state`, which cannot be retried (both engines).
pub(crate) fn not_retryable(id: i64, state: &str) -> AwaError {
    AwaError::State(format!(
        "job {id} is {state}; only failed, cancelled, retryable or scheduled jobs can be retried"
    ))
}

/// A per-queue setting stored in `awa.queue_meta` and shared by every client.
#[derive(Debug, Clone, Copy)]
enum QueueSetting {
    DlqEnabled,
}

async fn set_queue_flag<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    setting: QueueSetting,
    value: bool,
) -> Result<()> {
    let column = match setting {
        QueueSetting::DlqEnabled => "dlq_enabled",
    };
    sqlx::query(&format!(
        "INSERT INTO awa.queue_meta (queue, {column}) VALUES ($1, $2)
         ON CONFLICT (queue) DO UPDATE SET {column} = EXCLUDED.{column}, updated_at = now()"
    ))
    .bind(queue)
    .bind(value)
    .execute(executor)
    .await?;
    Ok(())
}

/// Pause or resume claiming from a queue (shared by every client). Resuming forgets who
/// paused it.
pub async fn set_queue_paused<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    paused: bool,
) -> Result<()> {
    if paused {
        return pause_queue(executor, queue, None).await;
    }
    sqlx::query(
        "INSERT INTO awa.queue_meta (queue, paused) VALUES ($1, false)
         ON CONFLICT (queue) DO UPDATE SET paused = false, paused_by = NULL, paused_at = NULL,
             updated_at = now()",
    )
    .bind(queue)
    .execute(executor)
    .await?;
    Ok(())
}

/// Pause claiming from a queue, recording who paused it (`paused_by`, free text) and when.
pub async fn pause_queue<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    paused_by: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO awa.queue_meta (queue, paused, paused_by, paused_at) VALUES ($1, true, $2, now())
         ON CONFLICT (queue) DO UPDATE SET paused = true, paused_by = EXCLUDED.paused_by,
             paused_at = now(), updated_at = now()",
    )
    .bind(queue)
    .bind(paused_by)
    .execute(executor)
    .await?;
    Ok(())
}

/// Record whether a queue's failed jobs move to the DLQ (read by rescue on any client).
pub async fn set_queue_dlq<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: &str,
    enabled: bool,
) -> Result<()> {
    set_queue_flag(executor, queue, QueueSetting::DlqEnabled, enabled).await
}

/// Cancel every job of a queue that has not started; returns how many.
pub async fn drain_queue<'e, E: PgExecutor<'e>>(executor: E, queue: &str) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE awa.canonical_jobs SET state = 'cancelled', finalized_at = now()
         WHERE queue = $1 AND state IN ('scheduled', 'available', 'retryable')",
    )
    .bind(queue)
    .execute(executor)
    .await?
    .rows_affected())
}

/// Per-queue counts by state, plus what awa-pg's `QueueStat` shows: completions in the last
/// hour and the age of the oldest available job.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueStats {
    pub queue: String,
    pub paused: bool,
    pub counts: std::collections::BTreeMap<String, i64>,
    pub completed_last_hour: i64,
    /// Seconds since the oldest available job became runnable; None when none is available.
    pub lag_seconds: Option<f64>,
}

pub async fn queue_stats<'e, E: PgExecutor<'e>>(executor: E) -> Result<Vec<QueueStats>> {
    queue_stats_of(executor, "awa.canonical_jobs").await
}

/// [`queue_stats`] over `source`: `awa.jobs`, or a relation with its `queue`, `state`,
/// `run_at` and `finalized_at` columns (`storage::routing` passes both engines' jobs).
pub(crate) async fn queue_stats_of<'e, E: PgExecutor<'e>>(
    executor: E,
    source: &str,
) -> Result<Vec<QueueStats>> {
    type Row = (String, Option<String>, Option<i64>, bool, i64, Option<f64>);
    let sql = format!(
        "WITH j AS MATERIALIZED (SELECT queue, state, run_at, finalized_at FROM {source}),
              counts AS (SELECT queue, state, count(*) AS n FROM j GROUP BY queue, state),
              recent AS (SELECT queue,
                                count(*) FILTER (WHERE state = 'completed'
                                                 AND finalized_at > now() - interval '1 hour') AS done,
                                extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'available'))::float8 AS lag
                         FROM j GROUP BY queue),
              queues AS (SELECT queue FROM counts UNION SELECT queue FROM awa.queue_meta)
         SELECT q.queue, c.state, c.n, coalesce(m.paused, false), coalesce(r.done, 0),
                CASE WHEN r.lag IS NOT NULL THEN greatest(r.lag, 0) END
         FROM queues q LEFT JOIN counts c ON c.queue = q.queue
              LEFT JOIN awa.queue_meta m ON m.queue = q.queue
              LEFT JOIN recent r ON r.queue = q.queue
         ORDER BY q.queue"
    );
    let rows: Vec<Row> = sqlx::query_as(&sql).fetch_all(executor).await?;
    let mut out: Vec<QueueStats> = Vec::new();
    for (queue, state, n, paused, done, lag) in rows {
        if out.last().map(|s| s.queue != queue).unwrap_or(true) {
            out.push(QueueStats {
                queue: queue.clone(),
                paused,
                counts: Default::default(),
                completed_last_hour: done,
                lag_seconds: lag,
            });
        }
        if let (Some(state), Some(n), Some(last)) = (state, n, out.last_mut()) {
            last.counts.insert(state, n);
        }
    }
    Ok(out)
}

/// What [`retry_failed`] did: the jobs it made available again, and how many failed jobs the
/// filter matched (`matched - jobs.len()` changed state meanwhile, e.g. were pruned).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RetriedFailed {
    pub jobs: Vec<JobRow>,
    pub matched: i64,
}

/// Retry the failed jobs of a kind and/or queue (every failed job only with `allow_all`).
pub async fn retry_failed<'e, E: PgExecutor<'e>>(
    executor: E,
    kind: Option<&str>,
    queue: Option<&str>,
    allow_all: bool,
) -> Result<RetriedFailed> {
    if kind.is_none() && queue.is_none() && !allow_all {
        return Err(AwaError::Config(
            "retry_failed requires kind or queue (or allow_all=True)".into(),
        ));
    }
    // The LEFT JOIN keeps one row (the count, no job) when nothing was updated.
    let sql = format!(
        "WITH matched AS (
             SELECT id FROM awa.canonical_jobs WHERE state = 'failed'
               AND ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)),
         updated AS (
             UPDATE awa.canonical_jobs j SET state = 'available', run_at = now(), finalized_at = NULL,
                 max_attempts = greatest(j.max_attempts, least(j.attempt + 1, 1000))
             FROM matched m WHERE j.id = m.id AND j.state = 'failed'
             RETURNING j.*)
         SELECT c.matched, u.id IS NOT NULL AS has_job, {cols}
         FROM (SELECT count(*) AS matched FROM matched) c LEFT JOIN updated u ON true
         ORDER BY u.id",
        cols = JOB_COLUMNS
            .split(", ")
            .map(|c| format!("u.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rows = sqlx::query(&sql)
        .bind(kind)
        .bind(queue)
        .fetch_all(executor)
        .await?;
    let mut out = RetriedFailed {
        jobs: Vec::with_capacity(rows.len()),
        matched: 0,
    };
    for row in &rows {
        out.matched = sqlx::Row::try_get(row, "matched")?;
        if sqlx::Row::try_get::<bool, _>(row, "has_job")? {
            out.jobs.push(JobRow::from_row(row)?);
        }
    }
    Ok(out)
}

/// Delete the failed jobs of `kind` (optionally only in `queue`); returns how many. The kind
/// is required: there is no call that deletes every failed job at once.
pub async fn discard_failed<'e, E: PgExecutor<'e>>(
    executor: E,
    kind: &str,
    queue: Option<&str>,
) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM awa.canonical_jobs WHERE state = 'failed' AND kind = $1 AND ($2::text IS NULL OR queue = $2)",
    )
    .bind(kind)
    .bind(queue)
    .execute(executor)
    .await?
    .rows_affected())
}
