//! The dead-letter queue: failed jobs moved out of `awa.jobs`, per-queue opt-in or by an
//! operator, and the operator's calls on it (list with filters and a page cursor, revive with
//! overrides, purge).
//!
//! One DLQ table (`awa.jobs_dlq`) for both engines: the operator's moves take failed jobs from
//! canonical and from the readable queue-storage schema, and a revived job goes where new jobs
//! go (`storage::routing`).
//!
//! Every bulk call that changes or deletes rows refuses an empty filter unless the caller says
//! `allow_all`: a bare `purge_dlq()` typed at a console must not empty the whole DLQ.

use crate::error::{AwaError, Result};
use crate::model::job::JOB_COLUMNS;
use crate::model::validate::check_queue;
use crate::model::{JobRow, ValidationError};
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
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
    /// When the job was last due and when it failed (`None` for rows dead-lettered before
    /// schema version 6 recorded them).
    pub run_at: Option<chrono::DateTime<chrono::Utc>>,
    pub finalized_at: Option<chrono::DateTime<chrono::Utc>>,
    pub errors: serde_json::Value,
    pub metadata: serde_json::Value,
    pub tags: Vec<String>,
    pub ordering_key: Option<String>,
    pub progress: Option<serde_json::Value>,
    pub reason: String,
    pub original_run_lease: i64,
    pub dlq_at: chrono::DateTime<chrono::Utc>,
}

const DLQ_COLUMNS: &str =
    "id, kind, queue, args, priority, attempt, max_attempts, created_at, run_at, finalized_at, errors, \
    metadata, tags, ordering_key, progress, reason, original_run_lease, dlq_at";

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
        run_at: r.try_get("run_at")?,
        finalized_at: r.try_get("finalized_at")?,
        errors: r.try_get("errors")?,
        metadata: r.try_get("metadata")?,
        tags: r.try_get("tags")?,
        ordering_key: r.try_get("ordering_key")?,
        progress: r.try_get("progress")?,
        reason: r.try_get("reason")?,
        original_run_lease: r.try_get("original_run_lease")?,
        dlq_at: r.try_get("dlq_at")?,
    })
}

/// Move failed jobs into the DLQ (inside the caller's transaction).
pub async fn move_to_dlq(conn: &mut PgConnection, ids: &[i64], reason: &str) -> Result<u64> {
    let done = sqlx::query(
        "WITH moved AS (DELETE FROM awa.canonical_jobs WHERE id = ANY($1) AND state = 'failed' RETURNING *)
         INSERT INTO awa.jobs_dlq (id, kind, queue, args, priority, attempt, max_attempts, created_at,
                                   run_at, finalized_at, errors, metadata, tags, ordering_key,
                                   progress, reason, original_run_lease, unique_key, unique_states)
         SELECT id, kind, queue, args, priority, attempt, max_attempts, created_at, run_at,
                finalized_at, errors, metadata, tags, ordering_key, progress, $2, run_lease,
                unique_key, unique_states FROM moved",
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
        "SELECT j.id FROM awa.canonical_jobs j JOIN awa.queue_meta m ON m.queue = j.queue
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

/// Which DLQ rows a list or bulk call addresses; `None` matches everything. `tag` matches
/// rows carrying that tag. `before_id` / `before_dlq_at` are the page cursor of
/// [`list_dlq`] (rows strictly older than the last one seen, in its newest-first order); a
/// purge honours them too.
#[derive(Debug, Clone, Default)]
pub struct DlqFilter {
    pub kind: Option<String>,
    pub queue: Option<String>,
    pub tag: Option<String>,
    pub before_id: Option<i64>,
    pub before_dlq_at: Option<DateTime<Utc>>,
}

impl DlqFilter {
    /// True when neither kind, queue nor tag narrows the set (the cursor alone does not count:
    /// "everything older than X" is still nearly everything).
    fn is_unscoped(&self) -> bool {
        self.kind.is_none() && self.queue.is_none() && self.tag.is_none()
    }
}

/// The filter as SQL over `awa.jobs_dlq`, parameters `$1`..`$5` in [`bind_filter`]'s order.
const FILTER_SQL: &str = "($1::text IS NULL OR kind = $1)
      AND ($2::text IS NULL OR queue = $2)
      AND ($3::text IS NULL OR $3 = ANY(tags))
      AND (CASE WHEN $5::timestamptz IS NULL THEN ($4::bigint IS NULL OR id < $4)
                WHEN $4::bigint IS NULL THEN dlq_at < $5
                ELSE (dlq_at, id) < ($5, $4) END)";

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

fn bind_filter<'q>(query: PgQuery<'q>, filter: &'q DlqFilter) -> PgQuery<'q> {
    query
        .bind(filter.kind.as_deref())
        .bind(filter.queue.as_deref())
        .bind(filter.tag.as_deref())
        .bind(filter.before_id)
        .bind(filter.before_dlq_at)
}

/// The error of a bulk call given no filter and no `allow_all`.
fn unscoped(call: &str, filters: &str) -> AwaError {
    AwaError::Config(format!(
        "{call} requires at least one of {filters} (or allow_all=true)"
    ))
}

/// Dead-lettered jobs matching `filter`, newest first (`dlq_at`, then id, descending), at
/// most `limit` (0 to 10,000).
pub async fn list_dlq<'e, E: PgExecutor<'e>>(
    executor: E,
    filter: &DlqFilter,
    limit: i64,
) -> Result<Vec<DlqJob>> {
    if !(0..=10_000).contains(&limit) {
        return Err(AwaError::Config(format!(
            "limit is {limit}; it must be between 0 and 10000"
        )));
    }
    let sql = format!(
        "SELECT {DLQ_COLUMNS} FROM awa.jobs_dlq WHERE {FILTER_SQL}
         ORDER BY dlq_at DESC, id DESC LIMIT $6"
    );
    let rows = bind_filter(sqlx::query(&sql), filter)
        .bind(limit)
        .fetch_all(executor)
        .await?;
    rows.iter()
        .map(|r| from_row(r).map_err(AwaError::from))
        .collect()
}

/// One dead-lettered job, `None` when the id is not in the DLQ.
pub async fn get_dlq_job<'e, E: PgExecutor<'e>>(executor: E, id: i64) -> Result<Option<DlqJob>> {
    let row = sqlx::query(&format!(
        "SELECT {DLQ_COLUMNS} FROM awa.jobs_dlq WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(executor)
    .await?;
    row.map(|r| from_row(&r).map_err(AwaError::from))
        .transpose()
}

/// How many jobs are dead-lettered (in one queue, or in all).
pub async fn dlq_depth<'e, E: PgExecutor<'e>>(executor: E, queue: Option<&str>) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM awa.jobs_dlq WHERE ($1::text IS NULL OR queue = $1)",
    )
    .bind(queue)
    .fetch_one(executor)
    .await?)
}

/// `(queue, depth)` for every queue with dead-lettered jobs, deepest first.
pub async fn dlq_depth_by_queue<'e, E: PgExecutor<'e>>(executor: E) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT queue, count(*) AS n FROM awa.jobs_dlq GROUP BY queue ORDER BY n DESC, queue",
    )
    .fetch_all(executor)
    .await?)
}

/// What [`retry_from_dlq`] may change on the revived job; `None` keeps the stored value
/// (`run_at`: now).
#[derive(Debug, Clone, Default)]
pub struct RetryOverrides {
    pub run_at: Option<DateTime<Utc>>,
    pub priority: Option<i16>,
    pub queue: Option<String>,
}

impl RetryOverrides {
    fn check(&self) -> std::result::Result<(), ValidationError> {
        if let Some(p) = self.priority {
            if !(1..=4).contains(&p) {
                return Err(ValidationError::Priority { value: p.into() });
            }
        }
        if let Some(q) = &self.queue {
            check_queue(q)?;
        }
        Ok(())
    }
}

/// The queue-storage schema a revived job goes to, when new jobs go to queue storage.
async fn revive_to(
    db: &Db,
) -> Result<Option<std::sync::Arc<crate::storage::queue_storage::QueueStorage>>> {
    Ok(match crate::storage::routing::route(db).await? {
        crate::storage::routing::Route::QueueStorage(qs) => Some(qs),
        crate::storage::routing::Route::Canonical => None,
    })
}

/// The statement that moves DLQ rows selected by `selection` back into `awa.jobs` as fresh
/// jobs (attempts reset, same id, lease and unique key: the key's index refuses the revive
/// when another job holds it), `scheduled` when the run time is still ahead.
/// Parameters `$o`, `$o+1`, `$o+2` are the run_at, priority and queue overrides (NULL keeps
/// the stored value; run_at defaults to now).
fn revive_sql(selection: &str, o: usize) -> String {
    let (run_at, priority, queue) = (o, o + 1, o + 2);
    format!(
        "WITH moved AS (DELETE FROM awa.jobs_dlq WHERE {selection} RETURNING *)
         INSERT INTO awa.canonical_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at,
                               created_at, errors, metadata, tags, ordering_key, progress, run_lease,
                               unique_key, unique_states)
         SELECT id, kind, coalesce(${queue}::text, queue), args,
                CASE WHEN ${run_at}::timestamptz > now() THEN 'scheduled' ELSE 'available' END,
                coalesce(${priority}::smallint, priority), 0, max_attempts,
                coalesce(${run_at}::timestamptz, now()),
                created_at, errors, metadata, tags, ordering_key, progress, original_run_lease,
                unique_key, unique_states
         FROM moved"
    )
}

/// Put one dead-lettered job back as a fresh job (attempts reset, same id and unique key), with
/// the overrides applied; `None` when the id is not in the DLQ. A key another job took while
/// it was dead-lettered refuses the revive ([`AwaError::UniqueConflict`]; the row stays).
pub async fn retry_from_dlq(
    pool: &Db,
    id: i64,
    overrides: &RetryOverrides,
) -> Result<Option<JobRow>> {
    match revive_one(pool, id, overrides).await {
        Err(AwaError::Database(e)) if crate::error::is_unique_conflict(&e) => {
            let kind: Option<String> =
                sqlx::query_scalar("SELECT kind FROM awa.jobs_dlq WHERE id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?;
            Err(AwaError::UniqueConflict {
                kind: kind.unwrap_or_default(),
            })
        }
        other => other,
    }
}

async fn revive_one(pool: &Db, id: i64, overrides: &RetryOverrides) -> Result<Option<JobRow>> {
    overrides.check()?;
    if let Some(qs) = revive_to(pool).await? {
        // Read before the commit, as canonical's RETURNING: after it a worker may claim it.
        let mut tx = pool.begin().await?;
        let ids = qs
            .revive(
                &mut *tx,
                &[id],
                overrides.run_at,
                overrides.priority,
                overrides.queue.as_deref(),
            )
            .await?;
        let job = match ids.first() {
            Some(id) => Some(qs.job(&mut *tx, *id).await?),
            None => None,
        };
        tx.commit().await?;
        return Ok(job);
    }
    let sql = format!("{} RETURNING {JOB_COLUMNS}", revive_sql("id = $1", 2));
    let row = sqlx::query(&sql)
        .bind(id)
        .bind(overrides.run_at)
        .bind(overrides.priority)
        .bind(overrides.queue.as_deref())
        .fetch_optional(pool)
        .await?;
    row.map(|r| JobRow::from_row(&r).map_err(AwaError::from))
        .transpose()
}

/// Revive every dead-lettered job of a kind, queue and/or tag (all of them only with
/// `allow_all`); returns how many. A unique key another job holds refuses the whole call
/// ([`AwaError::UniqueConflict`]; nothing is revived).
pub async fn bulk_retry_from_dlq(db: &Db, filter: &DlqFilter, allow_all: bool) -> Result<u64> {
    match revive_many(db, filter, allow_all).await {
        Err(AwaError::Database(e)) if crate::error::is_unique_conflict(&e) => {
            Err(AwaError::UniqueConflict {
                kind: filter.kind.clone().unwrap_or_default(),
            })
        }
        other => other,
    }
}

async fn revive_many(db: &Db, filter: &DlqFilter, allow_all: bool) -> Result<u64> {
    if filter.is_unscoped() && !allow_all {
        return Err(unscoped("bulk_retry_from_dlq", "kind, queue, or tag"));
    }
    if let Some(qs) = revive_to(db).await? {
        let mut tx = db.begin().await?;
        let sql = format!("SELECT id FROM awa.jobs_dlq WHERE {FILTER_SQL} FOR UPDATE");
        let ids: Vec<i64> = bind_filter(sqlx::query(&sql), filter)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.try_get("id"))
            .collect::<std::result::Result<_, _>>()?;
        let revived = qs.revive(&mut *tx, &ids, None, None, None).await?;
        tx.commit().await?;
        return Ok(revived.len() as u64);
    }
    let executor = db;
    let done = bind_filter(sqlx::query(&revive_sql(FILTER_SQL, 6)), filter)
        .bind(None::<DateTime<Utc>>)
        .bind(None::<i16>)
        .bind(None::<&str>)
        .execute(executor)
        .await?;
    Ok(done.rows_affected())
}

/// Move the failed jobs among `ids` into the DLQ on both engines (canonical, and the
/// readable queue-storage schema), inside the caller's transaction; returns how many moved.
pub async fn move_to_dlq_anywhere(
    conn: &mut PgConnection,
    ids: &[i64],
    reason: &str,
) -> Result<u64> {
    let mut moved = move_to_dlq(&mut *conn, ids, reason).await?;
    if let Some(qs) = crate::storage::routing::readable_queue_storage(&mut *conn).await? {
        moved += qs
            .move_to_dlq(&mut *conn, ids, Some(reason), false)
            .await?
            .len() as u64;
    }
    Ok(moved)
}

/// Move one failed job into the DLQ by hand; `None` when no failed job has this id (it does
/// not exist, or is in another state: only failed jobs are dead-lettered).
pub async fn move_failed_to_dlq(pool: &Db, id: i64, reason: &str) -> Result<Option<DlqJob>> {
    let mut tx = pool.begin().await?;
    let moved = move_to_dlq_anywhere(&mut tx, &[id], reason).await?;
    let entry = if moved == 0 {
        None
    } else {
        get_dlq_job(&mut *tx, id).await?
    };
    tx.commit().await?;
    Ok(entry)
}

/// Move every failed job of a kind and/or queue into the DLQ (all failed jobs only with
/// `allow_all`), on both engines; returns how many.
pub async fn bulk_move_failed_to_dlq(
    db: &Db,
    kind: Option<&str>,
    queue: Option<&str>,
    reason: &str,
    allow_all: bool,
) -> Result<u64> {
    if kind.is_none() && queue.is_none() && !allow_all {
        return Err(unscoped("bulk_move_failed_to_dlq", "kind or queue"));
    }
    let mut tx = db.begin().await?;
    let done = sqlx::query(
        "WITH moved AS (DELETE FROM awa.canonical_jobs WHERE state = 'failed'
                          AND ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)
                        RETURNING *)
         INSERT INTO awa.jobs_dlq (id, kind, queue, args, priority, attempt, max_attempts, created_at,
                                   run_at, finalized_at, errors, metadata, tags, ordering_key,
                                   progress, reason, original_run_lease, unique_key, unique_states)
         SELECT id, kind, queue, args, priority, attempt, max_attempts, created_at, run_at,
                finalized_at, errors, metadata, tags, ordering_key, progress, $3, run_lease,
                unique_key, unique_states FROM moved",
    )
    .bind(kind)
    .bind(queue)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    let mut moved = done.rows_affected();
    if let Some(qs) = crate::storage::routing::readable_queue_storage(&mut *tx).await? {
        let ids: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT id FROM {}.qs_jobs WHERE state = 'failed'
               AND ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)",
            qs.schema()
        ))
        .bind(kind)
        .bind(queue)
        .fetch_all(&mut *tx)
        .await?;
        moved += qs
            .move_to_dlq(&mut *tx, &ids, Some(reason), false)
            .await?
            .len() as u64;
    }
    tx.commit().await?;
    Ok(moved)
}

/// Delete one dead-lettered job; `true` when it was there.
pub async fn purge_dlq_job<'e, E: PgExecutor<'e>>(executor: E, id: i64) -> Result<bool> {
    Ok(sqlx::query("DELETE FROM awa.jobs_dlq WHERE id = $1")
        .bind(id)
        .execute(executor)
        .await?
        .rows_affected()
        == 1)
}

/// Delete the dead-lettered jobs matching `filter` (every one only with `allow_all`);
/// returns how many.
pub async fn purge_dlq<'e, E: PgExecutor<'e>>(
    executor: E,
    filter: &DlqFilter,
    allow_all: bool,
) -> Result<u64> {
    if filter.is_unscoped() && !allow_all {
        return Err(unscoped("purge_dlq", "kind, queue, or tag"));
    }
    let sql = format!("DELETE FROM awa.jobs_dlq WHERE {FILTER_SQL}");
    Ok(bind_filter(sqlx::query(&sql), filter)
        .execute(executor)
        .await?
        .rows_affected())
}
