//! The dead-letter queue: failed jobs moved out of `awa.jobs`, per-queue opt-in.

use crate::error::{AwaError, Result};
use crate::model::job::JOB_COLUMNS;
use crate::model::JobRow;
use crate::storage::pool::Db;
use serde::Serialize;
use sqlx::{PgConnection, PgExecutor, Row};

/// A dead-lettered job.
#[derive(Debug, Clone, Serialize)]
pub struct DlqJob {
    pub id: i64,
    pub kind: String,
    pub queue: String,
    pub args: serde_json::Value,
    pub priority: i16,
    pub attempt: i32,
    pub max_attempts: i32,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub errors: serde_json::Value,
    pub metadata: serde_json::Value,
    pub tags: Vec<String>,
    pub reason: String,
    pub original_run_lease: i64,
    pub dlq_at: chrono::DateTime<chrono::Utc>,
}

const DLQ_COLUMNS: &str =
    "id, kind, queue, args, priority, attempt, max_attempts, created_at, errors, \
    metadata, tags, reason, original_run_lease, dlq_at";

fn from_row(r: &sqlx::postgres::PgRow) -> std::result::Result<DlqJob, sqlx::Error> {
    Ok(DlqJob {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        queue: r.try_get("queue")?,
        args: r.try_get("args")?,
        priority: r.try_get("priority")?,
        attempt: r.try_get("attempt")?,
        max_attempts: r.try_get("max_attempts")?,
        created_at: r.try_get("created_at")?,
        errors: r.try_get("errors")?,
        metadata: r.try_get("metadata")?,
        tags: r.try_get("tags")?,
        reason: r.try_get("reason")?,
        original_run_lease: r.try_get("original_run_lease")?,
        dlq_at: r.try_get("dlq_at")?,
    })
}

/// Move failed jobs into the DLQ (inside the caller's transaction).
pub async fn move_to_dlq(conn: &mut PgConnection, ids: &[i64], reason: &str) -> Result<u64> {
    let done = sqlx::query(
        "WITH moved AS (DELETE FROM awa.jobs WHERE id = ANY($1) AND state = 'failed' RETURNING *)
         INSERT INTO awa.jobs_dlq (id, kind, queue, args, priority, attempt, max_attempts, created_at,
                                   errors, metadata, tags, ordering_key, progress, reason, original_run_lease)
         SELECT id, kind, queue, args, priority, attempt, max_attempts, created_at, errors, metadata,
                tags, ordering_key, progress, $2, run_lease FROM moved",
    )
    .bind(ids)
    .bind(reason)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Move every failed job of DLQ-enabled queues among `ids` (used by rescue).
pub async fn move_failed_where_enabled(
    conn: &mut PgConnection,
    ids: &[i64],
    reason: &str,
) -> Result<u64> {
    let enabled: Vec<i64> = sqlx::query_scalar(
        "SELECT j.id FROM awa.jobs j JOIN awa.queue_meta m ON m.queue = j.queue
         WHERE j.id = ANY($1) AND j.state = 'failed' AND m.dlq_enabled",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    if enabled.is_empty() {
        return Ok(0);
    }
    move_to_dlq(conn, &enabled, reason).await
}

pub async fn list_dlq<'e, E: PgExecutor<'e>>(
    executor: E,
    queue: Option<&str>,
    limit: i64,
) -> Result<Vec<DlqJob>> {
    let rows = sqlx::query(&format!(
        "SELECT {DLQ_COLUMNS} FROM awa.jobs_dlq WHERE ($1::text IS NULL OR queue = $1) ORDER BY dlq_at DESC, id DESC LIMIT $2"
    ))
    .bind(queue)
    .bind(limit)
    .fetch_all(executor)
    .await?;
    rows.iter()
        .map(|r| from_row(r).map_err(AwaError::from))
        .collect()
}

pub async fn get_dlq_job<'e, E: PgExecutor<'e>>(executor: E, id: i64) -> Result<DlqJob> {
    let row = sqlx::query(&format!(
        "SELECT {DLQ_COLUMNS} FROM awa.jobs_dlq WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(executor)
    .await?;
    row.map(|r| from_row(&r).map_err(AwaError::from))
        .unwrap_or(Err(AwaError::JobNotFound(id)))
}

pub async fn dlq_depth<'e, E: PgExecutor<'e>>(executor: E, queue: Option<&str>) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM awa.jobs_dlq WHERE ($1::text IS NULL OR queue = $1)",
    )
    .bind(queue)
    .fetch_one(executor)
    .await?)
}

/// Put a dead-lettered job back as a fresh available job (attempts reset, same id).
pub async fn retry_from_dlq(pool: &Db, id: i64) -> Result<JobRow> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(&format!(
        "WITH moved AS (DELETE FROM awa.jobs_dlq WHERE id = $1 RETURNING *)
         INSERT INTO awa.jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at,
                               created_at, errors, metadata, tags, ordering_key, progress, run_lease)
         SELECT id, kind, queue, args, 'available', priority, 0, max_attempts, now(), created_at,
                errors, metadata, tags, ordering_key, progress, original_run_lease FROM moved
         RETURNING {JOB_COLUMNS}"
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let job = match row {
        Some(r) => JobRow::from_row(&r)?,
        None => return Err(AwaError::JobNotFound(id)),
    };
    tx.commit().await?;
    Ok(job)
}

/// Delete dead-lettered jobs (all, or one queue's); returns how many.
pub async fn purge_dlq<'e, E: PgExecutor<'e>>(executor: E, queue: Option<&str>) -> Result<u64> {
    Ok(
        sqlx::query("DELETE FROM awa.jobs_dlq WHERE ($1::text IS NULL OR queue = $1)")
            .bind(queue)
            .execute(executor)
            .await?
            .rows_affected(),
    )
}
