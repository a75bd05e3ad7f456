//! Where new jobs go (issue 18): canonical's `awa.jobs`, or the queue-storage schema that
//! `awa.storage_transition_state` makes active (migration 12, [`crate::storage::transition`]).
//!
//! Every insert path of the public API asks [`route`], which reads the state at most once per
//! [`ROUTE_TTL`] per pool: a transition reaches every producer within that time, and a
//! per-insert read would cost a round trip on the hottest path. A stale route cannot strand a
//! job: the engine a transition closed refuses the write (SQLSTATE `AWR01`, migration 12's
//! guards, checked after the insert holds its table lock), the route is read again and the
//! insert retried once, on the engine now open.
//!
//! Reads (`get_job`, `list_jobs`) and operator actions (`cancel`, `retry`, `retry_failed`,
//! `discard_failed`, `drain_queue`) look at both engines while a queue-storage schema is
//! active or was routed to, so a job is found and changed wherever it lives.

use crate::error::{AwaError, Result};
use crate::model::job::JOB_COLUMNS;
use crate::model::{JobRow, NewJob};
use crate::storage::admin::{self, JobFilter};
use crate::storage::pool::Db;
use crate::storage::queue_storage::QueueStorage;
use sqlx::PgConnection;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a read route is used before it is read again.
pub const ROUTE_TTL: Duration = Duration::from_secs(1);

/// The engine new jobs go to.
#[derive(Debug, Clone)]
pub enum Route {
    Canonical,
    QueueStorage(Arc<QueueStorage>),
}

/// A pool's last read route and when it was read.
#[derive(Debug, Default)]
pub(crate) struct RouteCache(Mutex<Option<(Instant, Route)>>);

/// The ring sizes given to a [`QueueStorage`] handle built from a schema name alone: only
/// installing reads them, and routing never installs.
const HANDLE_SLOTS: (u32, u32) = (16, 8);

/// The queue-storage handle for a schema named by the state or the backends table.
fn handle(schema: String) -> Result<Arc<QueueStorage>> {
    Ok(Arc::new(QueueStorage::new(
        &schema,
        HANDLE_SLOTS.0,
        HANDLE_SLOTS.1,
    )?))
}

/// Read the route from the database (no cache).
pub async fn read_route<'e, E: sqlx::PgExecutor<'e>>(executor: E) -> Result<Route> {
    let schema: Option<String> = sqlx::query_scalar("SELECT awa.active_queue_storage_schema()")
        .fetch_one(executor)
        .await?;
    match schema {
        Some(s) => Ok(Route::QueueStorage(handle(s)?)),
        None => Ok(Route::Canonical),
    }
}

/// The route, read again when the cached one is older than [`ROUTE_TTL`].
pub async fn route(db: &Db) -> Result<Route> {
    if let Ok(guard) = db.route_cache().0.lock() {
        if let Some((at, route)) = guard.as_ref() {
            if at.elapsed() < ROUTE_TTL {
                return Ok(route.clone());
            }
        }
    }
    let fresh = match read_route(db).await {
        Ok(route) => route,
        // No storage state (a schema older than migration 12, or none at all): canonical is
        // the only engine there can be, and its insert reports what is missing precisely.
        Err(AwaError::SchemaNotMigrated { .. }) => return Ok(Route::Canonical),
        Err(e) => return Err(e),
    };
    if let Ok(mut guard) = db.route_cache().0.lock() {
        *guard = Some((Instant::now(), fresh.clone()));
    }
    Ok(fresh)
}

/// Make `db` believe new jobs go to `route` for the next [`ROUTE_TTL`]: the stale route a
/// producer holds across a transition, for the tests of the guards that catch it.
#[cfg(feature = "test-seams")]
pub fn pin_route(db: &Db, route: Route) {
    if let Ok(mut guard) = db.route_cache().0.lock() {
        *guard = Some((Instant::now(), route));
    }
}

/// Drop the cached route (after a write was refused as routed elsewhere).
pub fn forget(db: &Db) {
    if let Ok(mut guard) = db.route_cache().0.lock() {
        *guard = None;
    }
}

/// `result`, with the cached route dropped when the write was refused as routed elsewhere,
/// so that the next write (or the caller's retry) reads the route again.
fn settle<T>(db: &Db, result: Result<T>) -> Result<T> {
    if matches!(result, Err(AwaError::StorageRouteMoved(_))) {
        forget(db);
    }
    result
}

/// Insert validated jobs where the route says, returning them in input order; a write the
/// closed engine refused is retried once on the route read again.
pub async fn insert_jobs(db: &Db, jobs: &[NewJob]) -> Result<Vec<JobRow>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut retried = false;
    loop {
        let result = match route(db).await? {
            Route::Canonical => crate::storage::insert::insert_jobs(db, jobs).await,
            Route::QueueStorage(qs) => enqueue_rows(db, &qs, jobs).await,
        };
        match settle(db, result) {
            Err(AwaError::StorageRouteMoved(_)) if !retried => retried = true,
            other => return other,
        }
    }
}

/// Insert validated jobs on the caller's open transaction where the route says. A refused
/// write leaves the transaction failed (the caller retries it whole); the cached route is
/// dropped so the retry reads it again.
pub async fn insert_jobs_in(
    conn: &mut PgConnection,
    db: &Db,
    jobs: &[NewJob],
) -> Result<Vec<JobRow>> {
    let result = match route(db).await? {
        Route::Canonical => crate::storage::insert::insert_jobs(&mut *conn, jobs).await,
        Route::QueueStorage(qs) => enqueue_rows(conn, &qs, jobs).await,
    };
    settle(db, result)
}

/// What a routed COPY wrote.
pub enum Copied {
    Count(u64),
    Rows(Vec<JobRow>),
}

/// `insert_many_copy` on the caller's open transaction where the route says: canonical's
/// binary COPY, or queue storage's (due jobs by COPY into the current slot). With `returning`
/// on queue storage the jobs go through its insert function instead (COPY returns nothing,
/// and its rows carry no id to read back by).
pub async fn copy_in(
    conn: &mut PgConnection,
    db: &Db,
    jobs: &[NewJob],
    returning: bool,
) -> Result<Copied> {
    let result = match (route(db).await?, returning) {
        (Route::Canonical, false) => crate::storage::copy::insert_many_copy(conn, jobs)
            .await
            .map(Copied::Count),
        (Route::Canonical, true) => crate::storage::copy::insert_many_copy_returning(conn, jobs)
            .await
            .map(Copied::Rows),
        (Route::QueueStorage(qs), false) => qs.enqueue_copy(conn, jobs).await.map(|n| {
            // (canonical's COPY records its own)
            crate::metrics::series::record_each(
                jobs.iter().map(|j| (j.kind.as_str(), j.queue.as_str())),
                crate::metrics::series::JobEvent::Inserted,
            );
            Copied::Count(n)
        }),
        (Route::QueueStorage(qs), true) => enqueue_rows(conn, &qs, jobs).await.map(Copied::Rows),
    };
    settle(db, result)
}

/// Enqueue on queue storage and return the jobs as inserted, in input order: one statement,
/// which also returns its `now()`. Built from what was sent, the ids drawn and that `now()`
/// (what the insert stored) rather than read back: the view finds an entry by id only by
/// scanning, and canonical returns exactly these values for a new row.
async fn enqueue_rows<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    qs: &QueueStorage,
    jobs: &[NewJob],
) -> Result<Vec<JobRow>> {
    let refs: Vec<&NewJob> = jobs.iter().collect();
    let (ids, now) = qs.enqueue_stamped(executor, &refs).await?;
    crate::metrics::series::record_each(
        jobs.iter().map(|j| (j.kind.as_str(), j.queue.as_str())),
        crate::metrics::series::JobEvent::Inserted,
    );
    Ok(jobs
        .iter()
        .zip(ids)
        .map(|(job, id)| new_row(id, job, now))
        .collect())
}

/// The row of a job just inserted: due now it is available, else scheduled.
fn new_row(id: i64, job: &NewJob, now: chrono::DateTime<chrono::Utc>) -> JobRow {
    let run_at = job.run_at.unwrap_or(now);
    JobRow {
        id,
        kind: job.kind.clone(),
        queue: job.queue.clone(),
        args: job.args.clone(),
        state: if run_at <= now {
            crate::model::JobState::Available
        } else {
            crate::model::JobState::Scheduled
        },
        priority: job.priority,
        attempt: 0,
        max_attempts: job.max_attempts,
        run_at,
        heartbeat_at: None,
        deadline_at: None,
        attempted_at: None,
        finalized_at: None,
        created_at: now,
        errors: Vec::new(),
        metadata: job.metadata.clone(),
        tags: job.tags.clone(),
        unique_key: job.unique_key.clone(),
        unique_states: job.unique_states.map(i16::from),
        callback_id: None,
        callback_timeout_at: None,
        run_lease: 0,
        progress: None,
        ordering_key: job.ordering_key.clone(),
    }
}

/// The queue-storage schema whose jobs reads should include: the active one, else the one a
/// mixed transition routed to (kept in `awa.runtime_storage_backends`).
/// Through any executor: a caller holding a transaction asks on it (a pool of one
/// connection has no second one to ask on).
pub async fn readable_queue_storage<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
) -> Result<Option<Arc<QueueStorage>>> {
    let schema: Option<String> = sqlx::query_scalar("SELECT awa.readable_queue_storage_schema()")
        .fetch_one(executor)
        .await?;
    schema.map(handle).transpose()
}

/// One job by id, on whichever engine holds it.
pub async fn get_job(db: &Db, id: i64) -> Result<JobRow> {
    match admin::get_job(db, id).await {
        Err(AwaError::JobNotFound(_)) => {}
        other => return other,
    }
    let Some(qs) = readable_queue_storage(db).await? else {
        return Err(AwaError::JobNotFound(id));
    };
    qs.job(db, id).await
}

/// Jobs matching a filter on both engines, newest id first.
pub async fn list_jobs(db: &Db, filter: &JobFilter) -> Result<Vec<JobRow>> {
    let mut rows = admin::list_jobs(db, filter).await?;
    let Some(qs) = readable_queue_storage(db).await? else {
        return Ok(rows);
    };
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM {}.qs_jobs
         WHERE ($1::text IS NULL OR state = $1)
           AND ($2::text IS NULL OR kind = $2)
           AND ($3::text IS NULL OR queue = $3)
         ORDER BY id DESC LIMIT $4",
        qs.schema()
    );
    let limit = filter.limit.unwrap_or(100).max(0);
    let more = sqlx::query(&sql)
        .bind(filter.state.map(crate::model::JobState::as_str))
        .bind(filter.kind.as_deref())
        .bind(filter.queue.as_deref())
        .bind(limit)
        .fetch_all(db)
        .await?;
    for r in &more {
        rows.push(JobRow::from_row(r)?);
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.id));
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(rows)
}

/// Cancel a job on whichever engine holds it (see [`admin::cancel`]).
pub async fn cancel(db: &Db, id: i64) -> Result<JobRow> {
    match admin::cancel(db, id).await {
        Err(AwaError::JobNotFound(_)) => {}
        other => return other,
    }
    let Some(qs) = readable_queue_storage(db).await? else {
        return Err(AwaError::JobNotFound(id));
    };
    qs.cancel(db, id).await?;
    get_job(db, id).await
}

/// Cancel the unfinished job holding a unique key, on whichever engine holds it (see
/// [`admin::cancel_by_unique_key`]); `None` when no unfinished job holds it.
pub async fn cancel_by_unique_key(db: &Db, key: &[u8]) -> Result<Option<JobRow>> {
    if let Some(job) = admin::cancel_by_unique_key(db, key).await? {
        return Ok(Some(job));
    }
    let Some(qs) = readable_queue_storage(db).await? else {
        return Ok(None);
    };
    let holder: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT id FROM {}.unique_keys WHERE unique_key = $1",
        qs.schema()
    ))
    .bind(key)
    .fetch_optional(db)
    .await?;
    let Some(id) = holder else {
        return Ok(None);
    };
    // The key row may name a finished job (keys are taken over lazily): nothing to cancel.
    match qs.cancel(db, id).await? {
        Some(_) => Ok(Some(get_job(db, id).await?)),
        None => Ok(None),
    }
}

/// Retry a job now on whichever engine holds it (see [`admin::retry`]). A job of canonical's
/// retried while new jobs go to queue storage moves there (a runtime on queue storage no
/// longer works canonical's table), as a DLQ revive does. A unique key another job holds
/// meanwhile is refused as an insert's is ([`AwaError::UniqueConflict`]), changing nothing.
pub async fn retry(db: &Db, id: i64) -> Result<JobRow> {
    match retry_anywhere(db, id).await {
        Err(AwaError::Database(e)) if crate::error::is_unique_conflict(&e) => {
            let kind = get_job(db, id).await.map(|j| j.kind).unwrap_or_default();
            Err(AwaError::UniqueConflict { kind })
        }
        other => other,
    }
}

async fn retry_anywhere(db: &Db, id: i64) -> Result<JobRow> {
    let mut tx = db.begin().await?;
    // Read here, not from the pool's cache: a move another process just made must be seen.
    let to = read_route(&mut *tx).await?;
    match admin::retry(&mut *tx, id).await {
        Err(AwaError::JobNotFound(_)) => tx.rollback().await?,
        Err(e) => return Err(e),
        Ok(job) => {
            let job = match &to {
                Route::QueueStorage(qs) => {
                    let moved = moved_in(&mut tx, qs, &[id]).await?;
                    let id = moved.first().copied().ok_or(AwaError::JobNotFound(id))?;
                    qs.job(&mut *tx, id).await?
                }
                Route::Canonical => job,
            };
            tx.commit().await?;
            return Ok(job);
        }
    }
    let Some(qs) = readable_queue_storage(db).await? else {
        return Err(AwaError::JobNotFound(id));
    };
    // The job as retried is read before the commit: after it, a worker may claim it first.
    let mut tx = db.begin().await?;
    let job = match qs.retry(&mut *tx, id).await?.as_deref() {
        None => return Err(AwaError::JobNotFound(id)),
        Some("retried") => qs.job(&mut *tx, id).await?,
        Some(state) => return Err(admin::not_retryable(id, state)),
    };
    tx.commit().await?;
    Ok(job)
}

/// Move canonical jobs a retry just made available (`ids`) into queue storage `qs`, in the
/// caller's transaction: each becomes a ready entry of the current slot with the same id,
/// attempt, lease, errors and progress, and takes its unique key there (refused, the whole
/// transaction with it, when a live job of queue storage holds it). Returns the ids moved.
async fn moved_in(tx: &mut PgConnection, qs: &QueueStorage, ids: &[i64]) -> Result<Vec<i64>> {
    // The current slot in a statement of its own (it takes the ring's lock first).
    let (slot, generation): (i32, i64) = sqlx::query_as(&format!(
        "SELECT slot, generation FROM {}.qs_current_slot()",
        qs.schema()
    ))
    .fetch_one(&mut *tx)
    .await?;
    let (moved, queues): (Vec<i64>, Vec<String>) = sqlx::query_as(&format!(
        "WITH moved AS (
             DELETE FROM awa.canonical_jobs WHERE id = ANY($1) AND state = 'available' RETURNING *
         ), ready AS (
             INSERT INTO {s}.ready_entries (slot, generation, queue, priority, id, kind, args,
                 attempt, max_attempts, run_lease, run_at, created_at, metadata, tags, errors,
                 unique_key, unique_states, ordering_key, progress)
             SELECT $2, $3, m.queue, m.priority, m.id, m.kind, m.args, m.attempt, m.max_attempts,
                    m.run_lease, m.run_at, m.created_at, m.metadata, m.tags, m.errors,
                    m.unique_key, m.unique_states, m.ordering_key, m.progress
             FROM (SELECT * FROM moved ORDER BY id) m
             RETURNING id, queue
         )
         SELECT coalesce(array_agg(id ORDER BY id), '{{}}'),
                coalesce(array_agg(DISTINCT queue), '{{}}')
         FROM ready",
        s = qs.schema()
    ))
    .bind(ids)
    .bind(slot)
    .bind(generation)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query(&format!(
        "SELECT {s}.qs_take_key(e.unique_key, e.id, e.unique_states, 'available')
         FROM {s}.ready_entries e
         WHERE e.slot = $2 AND e.id = ANY($1) AND e.unique_key IS NOT NULL",
        s = qs.schema()
    ))
    .bind(&moved)
    .bind(slot)
    .execute(&mut *tx)
    .await?;
    sqlx::query("SELECT pg_notify(awa.queue_channel(q), '') FROM unnest($1::text[]) AS q")
        .bind(&queues)
        .execute(&mut *tx)
        .await?;
    Ok(moved)
}

/// Retry the failed jobs of a kind and/or queue on both engines (see
/// [`admin::retry_failed`]); the jobs come back in id order. Canonical's move to queue storage
/// when new jobs go there, as [`retry`]'s do. A unique key another job holds meanwhile refuses
/// the whole call ([`AwaError::UniqueConflict`]; nothing is retried).
pub async fn retry_failed(
    db: &Db,
    kind: Option<&str>,
    queue: Option<&str>,
    allow_all: bool,
) -> Result<admin::RetriedFailed> {
    match retry_failed_anywhere(db, kind, queue, allow_all).await {
        Err(AwaError::Database(e)) if crate::error::is_unique_conflict(&e) => {
            Err(AwaError::UniqueConflict {
                kind: kind.unwrap_or_default().to_string(),
            })
        }
        other => other,
    }
}

async fn retry_failed_anywhere(
    db: &Db,
    kind: Option<&str>,
    queue: Option<&str>,
    allow_all: bool,
) -> Result<admin::RetriedFailed> {
    // One transaction for both engines: a conflict anywhere retries nothing.
    let mut tx = db.begin().await?;
    let to = read_route(&mut *tx).await?;
    let mut out = admin::retry_failed(&mut *tx, kind, queue, allow_all).await?;
    if let Route::QueueStorage(qs) = &to {
        if !out.jobs.is_empty() {
            let ids: Vec<i64> = out.jobs.iter().map(|j| j.id).collect();
            let moved = moved_in(&mut tx, qs, &ids).await?;
            out.jobs = qs.jobs_by_id(&mut *tx, &moved).await?;
        }
    }
    let Some(qs) = readable_queue_storage(&mut *tx).await? else {
        tx.commit().await?;
        return Ok(out);
    };
    // One statement: the failed jobs matched, and the ids of those retried (a job another
    // caller retried or discarded meanwhile is matched but not retried).
    let (matched, retried): (i64, Vec<i64>) = sqlx::query_as(&format!(
        "WITH matched AS MATERIALIZED (
             SELECT id FROM {s}.qs_jobs WHERE state = 'failed'
               AND ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)),
         retried AS MATERIALIZED (SELECT id, {s}.qs_retry(id) AS state FROM matched)
         SELECT (SELECT count(*) FROM matched),
                coalesce((SELECT array_agg(id ORDER BY id) FROM retried WHERE state = 'retried'), '{{}}')",
        s = qs.schema()
    ))
    .bind(kind)
    .bind(queue)
    .fetch_one(&mut *tx)
    .await?;
    out.matched += matched;
    // Read before the commit, as canonical returns them: after it a worker may claim them.
    out.jobs.extend(qs.jobs_by_id(&mut *tx, &retried).await?);
    tx.commit().await?;
    out.jobs.sort_by_key(|j| j.id);
    Ok(out)
}

/// Delete the failed jobs of `kind` (optionally only in `queue`) on both engines; how many.
pub async fn discard_failed(db: &Db, kind: &str, queue: Option<&str>) -> Result<u64> {
    let mut n = admin::discard_failed(db, kind, queue).await?;
    if let Some(qs) = readable_queue_storage(db).await? {
        n += qs.discard_failed(db, kind, queue).await?.len() as u64;
    }
    Ok(n)
}

/// Cancel every job of a queue that has not started, on both engines; how many.
pub async fn drain_queue(db: &Db, queue: &str) -> Result<u64> {
    let mut n = admin::drain_queue(db, queue).await?;
    if let Some(qs) = readable_queue_storage(db).await? {
        let cancelled: i64 = sqlx::query_scalar(&format!(
            "WITH pending AS MATERIALIZED (
                 SELECT id FROM {s}.qs_jobs
                 WHERE queue = $1 AND state IN ('scheduled', 'available', 'retryable')),
             cancelled AS MATERIALIZED (SELECT {s}.qs_cancel(id) AS state FROM pending)
             SELECT count(*) FROM cancelled WHERE state = 'cancelled'",
            s = qs.schema()
        ))
        .bind(queue)
        .fetch_one(db)
        .await?;
        n += u64::try_from(cancelled).unwrap_or(0);
    }
    Ok(n)
}

/// Per-queue counts, throughput and lag over both engines (see [`admin::queue_stats`]).
pub async fn queue_stats(db: &Db) -> Result<Vec<admin::QueueStats>> {
    match readable_queue_storage(db).await? {
        None => admin::queue_stats(db).await,
        Some(qs) => {
            let source = format!(
                "(SELECT queue, state, run_at, finalized_at FROM awa.canonical_jobs
                  UNION ALL
                  SELECT queue, state, run_at, finalized_at FROM {}.qs_jobs) AS both_engines",
                qs.schema()
            );
            admin::queue_stats_of(db, &source).await
        }
    }
}
