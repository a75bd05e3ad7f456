//! The per-job finalization transaction.

use crate::error::AwaError;
use crate::finalizer::waker::Waker;
use crate::finalizer::{Finalization, Finalized, Transition};
use crate::metrics;
use crate::model::JobErrorEntry;
use crate::model::NewJob;
use crate::seams::{self, Point};
use crate::specs::{SpecEvent, Specs};
use crate::storage::dlq::move_to_dlq;
use crate::storage::engine::Engine;
use crate::storage::insert::{insert_follow_up_in_tx, FollowUpInsert, JobColumns};
use crate::storage::pool::{Db, PoolMode};
use crate::storage::queue_storage::{Finish, QueueStorage};
use crate::storage::wake_queues;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres, Row};

/// One try, then wake the queues that received follow-ups (through `waker` when given, else
/// at once).
///
/// A `Completed` finalization is one statement ([`complete_with_follow_ups`]) in its own
/// implicit transaction: one round trip instead of BEGIN, UPDATE, the inserts and COMMIT,
/// which halves what a staging job costs the database. Every other transition runs in an
/// explicit transaction. The fault seams sit where a commit can fail: before the completion
/// statement is sent or before COMMIT (nothing is written), and after the commit (as if its
/// acknowledgement was lost).
///
/// The insert trigger's NOTIFY is deferred here: PostgreSQL serializes the commits of every
/// transaction that notifies (a database-wide lock held through the commit's WAL flush), which
/// capped completions with follow-ups at one commit at a time. The wake-up is sent after the
/// commit instead, in a statement of its own that writes nothing and so flushes nothing.
///
/// `first_try` is false on retries: a stale retry may follow a commit whose acknowledgement
/// was lost, so its follow-ups are not counted as discarded.
///
/// `conn`, when given, is the connection to run on (a retry after a lost connection passes the
/// one that just answered a ping); otherwise one is taken from the pool.
pub(crate) async fn finalize_once(
    pool: &Db,
    conn: Option<PoolConnection<Postgres>>,
    fin: &Finalization,
    specs: &Specs,
    first_try: bool,
    waker: Option<&Waker>,
) -> Result<Finalized, AwaError> {
    let mut woken = Vec::new();
    let mut conn = match conn {
        Some(c) => c,
        None => pool.acquire().await?,
    };
    // Behind PgBouncer in transaction mode every statement needs an explicit transaction
    // (see `storage::pool::Db`), so the one-statement completion runs in one too.
    // Queue storage's completion and its follow-ups are separate statements: a transaction.
    let one_statement = fin.transition == Transition::Completed
        && pool.mode() == PoolMode::Session
        && matches!(pool.engine(), Engine::Canonical);
    let done = if one_statement {
        seams::check(Point::BeforeCommit, fin.job.id)?;
        finalize_in_tx_with(&mut conn, fin, specs, Some(&mut woken)).await?
    } else {
        let mut tx = pool.begin_on(&mut conn).await?;
        let done = match pool.engine() {
            Engine::Canonical => finalize_in_tx_with(&mut tx, fin, specs, Some(&mut woken)).await?,
            Engine::QueueStorage(qs) => {
                finalize_queue_storage(qs, &mut tx, fin, specs, &mut woken).await?
            }
        };
        if done == Finalized::Stale {
            tx.rollback().await?;
        } else {
            seams::check(Point::BeforeCommit, fin.job.id)?;
            tx.commit().await?;
        }
        done
    };
    // Back to the pool before the wake-up below takes one of its own.
    drop(conn);
    if done == Finalized::Stale {
        metrics::add(&metrics::FINALIZE_STALE, 1);
        if first_try && !fin.follow_ups.is_empty() {
            metrics::add(
                &metrics::STAGED_DISCARDED,
                fin.follow_ups.follow_ups.len() as u64,
            );
        }
        tracing::debug!(
            job_id = fin.job.id,
            lease = fin.job.run_lease,
            transition = fin.transition.name(),
            "stale finalization: the lease no longer runs this job"
        );
        return Ok(Finalized::Stale);
    }
    seams::check(Point::AfterCommit, fin.job.id)?;
    metrics::add(&metrics::JOBS_FINALIZED_PER_JOB, 1);
    record_applied(fin);
    super::batched::wake(pool, waker, woken).await;
    Ok(Finalized::Applied)
}

/// Apply the lease-guarded state change and insert the outcome's follow-ups, all inside the
/// caller's transaction. Returns [`Finalized::Stale`] (having written nothing) when the guard
/// `(id, state = 'running', run_lease)` matches no row. For `Completed`, registered specs are
/// inserted first, then the staged follow-ups in staging order.
pub async fn finalize_in_tx(
    conn: &mut PgConnection,
    fin: &Finalization,
    specs: &Specs,
) -> Result<Finalized, AwaError> {
    finalize_in_tx_with(conn, fin, specs, None).await
}

/// [`finalize_in_tx`]; with `defer_wake`, the inserts do not NOTIFY and the queues to wake
/// after the commit are pushed there instead.
async fn finalize_in_tx_with(
    conn: &mut PgConnection,
    fin: &Finalization,
    specs: &Specs,
    defer_wake: Option<&mut Vec<String>>,
) -> Result<Finalized, AwaError> {
    if fin.transition == Transition::Completed {
        return complete_with_follow_ups(conn, fin, specs, defer_wake).await;
    }
    let job = &fin.job;
    let updated = run_guarded_update(conn, fin).await?;
    if !updated {
        return Ok(Finalized::Stale);
    }
    let spec_follow_ups = match spec_event(&fin.transition) {
        Some(event) => specs.follow_ups(job, event)?,
        None => Vec::new(),
    };
    let defer = defer_wake.is_some();
    if let Some(woken) = defer_wake {
        push_due_queues(woken, spec_follow_ups.iter());
    }
    for follow_up in &spec_follow_ups {
        record_insert(
            job.id,
            follow_up,
            insert_follow_up_in_tx(conn, follow_up, defer).await?,
        );
    }
    // Only a Completed outcome inserts what the handler staged (ADR-046's commit table).
    if !fin.follow_ups.is_empty() {
        metrics::add(
            &metrics::STAGED_DISCARDED,
            fin.follow_ups.follow_ups.len() as u64,
        );
    }
    if fin.dlq && matches!(fin.transition, Transition::Failed { .. }) {
        let reason = match &fin.transition {
            Transition::Failed { error } => error.error.clone(),
            _ => String::new(),
        };
        move_to_dlq(conn, &[job.id], &reason).await?;
    }
    Ok(Finalized::Applied)
}

/// A lease-guarded completion with its follow-ups — registered Completed specs first, then
/// the staged ones in staging order — as one statement (`awa.complete_with_follow_ups`,
/// migration 4). Each unique follow-up is inserted under a savepoint: a conflict on
/// `idx_awa_jobs_unique` skips it, any other error fails the statement and so the completion.
///
/// Each staged follow-up gets its producer span, a child of the span that was current when it
/// was staged (so B joins the trace of A's handler), opened when the completion has inserted it
/// and recording its id or the skip.
async fn complete_with_follow_ups(
    conn: &mut PgConnection,
    fin: &Finalization,
    specs: &Specs,
    defer_wake: Option<&mut Vec<String>>,
) -> Result<Finalized, AwaError> {
    let job = &fin.job;
    let spec_follow_ups = specs.follow_ups(job, SpecEvent::Completed)?;
    let staged = &fin.follow_ups.follow_ups;
    let all = spec_follow_ups.iter().chain(staged.iter().map(|s| &s.job));
    let sql = "SELECT awa.complete_with_follow_ups($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
               $11, $12, $13, $14)";
    let row = JobColumns::new(all.clone())
        .bind(sqlx::query(sql).bind(job.id).bind(job.run_lease))
        .bind(defer_wake.is_some())
        .fetch_one(&mut *conn)
        .await?;
    let ids: Option<Vec<Option<i64>>> = row.try_get(0)?;
    let Some(ids) = ids else {
        return Ok(Finalized::Stale);
    };
    if ids.len() != spec_follow_ups.len() + staged.len() {
        return Err(AwaError::State(format!(
            "completion of job {} reported {} follow-ups for {} sent",
            job.id,
            ids.len(),
            spec_follow_ups.len() + staged.len()
        )));
    }
    let (spec_ids, staged_ids) = ids.split_at(spec_follow_ups.len());
    for (follow_up, id) in spec_follow_ups.iter().zip(spec_ids) {
        record_insert(job.id, follow_up, (*id).into());
    }
    for (staged, id) in staged.iter().zip(staged_ids) {
        tracing::debug_span!(parent: &staged.span, "awa.enqueue_follow_up",
            trigger_job_id = job.id, kind = %staged.job.kind)
        .in_scope(|| record_insert(job.id, &staged.job, (*id).into()));
    }
    if let Some(woken) = defer_wake {
        push_due_queues(woken, all);
    }
    Ok(Finalized::Applied)
}

/// The per-job transaction on queue storage: the lease delete is the guard
/// (`qs_finalize`, `qs_park`), then the outcome's follow-ups — registered specs first, then,
/// for `Completed` only, the staged ones in staging order — in the same transaction. The
/// queues to wake after the commit are pushed to `woken`; a failed job of a queue with the DLQ
/// enabled moves there in the same transaction. The progress given with the outcome is kept
/// with a job that did not complete, as on canonical.
async fn finalize_queue_storage(
    qs: &QueueStorage,
    conn: &mut PgConnection,
    fin: &Finalization,
    specs: &Specs,
    woken: &mut Vec<String>,
) -> Result<Finalized, AwaError> {
    let job = &fin.job;
    let entry = |error: &JobErrorEntry| serde_json::to_value(error).map_err(AwaError::from);
    let finish = match &fin.transition {
        Transition::WaitingExternal { callback_id } => {
            let parked = qs
                .park(
                    &mut *conn,
                    job.id,
                    job.run_lease,
                    callback_id,
                    fin.progress.as_ref(),
                )
                .await?;
            return Ok(if parked {
                Finalized::Applied
            } else {
                Finalized::Stale
            });
        }
        Transition::Completed => Finish::Completed,
        Transition::Retryable { error, run_at } => Finish::Retryable {
            run_at: *run_at,
            error: error.as_ref().map(entry).transpose()?,
        },
        Transition::Snoozed { run_at } => Finish::Snoozed { run_at: *run_at },
        Transition::Cancelled { reason } => Finish::Cancelled {
            error: serde_json::json!({
                "attempt": job.attempt,
                "at": chrono::Utc::now(),
                "error": format!("cancelled: {reason}"),
            }),
        },
        Transition::Failed { error } => Finish::Failed {
            error: entry(error)?,
        },
    };
    if !qs
        .finalize_in(
            &mut *conn,
            job.id,
            job.run_lease,
            &finish,
            fin.progress.as_ref(),
        )
        .await?
    {
        return Ok(Finalized::Stale);
    }
    if let (true, Transition::Failed { error }) = (fin.dlq, &fin.transition) {
        qs.move_to_dlq(&mut *conn, &[job.id], Some(&error.error), false)
            .await?;
    }
    let spec_follow_ups = match spec_event(&fin.transition) {
        Some(event) => specs.follow_ups(job, event)?,
        None => Vec::new(),
    };
    let staged: &[crate::follow_ups::StagedFollowUp] = if fin.transition == Transition::Completed {
        &fin.follow_ups.follow_ups
    } else {
        if !fin.follow_ups.is_empty() {
            metrics::add(
                &metrics::STAGED_DISCARDED,
                fin.follow_ups.follow_ups.len() as u64,
            );
        }
        &[]
    };
    let all: Vec<&NewJob> = spec_follow_ups
        .iter()
        .chain(staged.iter().map(|s| &s.job))
        .collect();
    let mut results = qs
        .enqueue_follow_ups(&mut *conn, &all)
        .await?
        .into_iter()
        .map(FollowUpInsert::from);
    for (follow_up, result) in spec_follow_ups.iter().zip(results.by_ref()) {
        record_insert(job.id, follow_up, result);
    }
    for (s, result) in staged.iter().zip(results.by_ref()) {
        tracing::debug_span!(parent: &s.span, "awa.enqueue_follow_up",
            trigger_job_id = job.id, kind = %s.job.kind)
        .in_scope(|| record_insert(job.id, &s.job, result));
    }
    push_due_queues(woken, all.into_iter());
    Ok(Finalized::Applied)
}

/// The queues of the follow-ups that are due now (a scheduled one wakes nobody).
pub(super) fn push_due_queues<'a>(woken: &mut Vec<String>, jobs: impl Iterator<Item = &'a NewJob>) {
    let now = chrono::Utc::now();
    woken.extend(
        jobs.filter(|j| j.run_at.is_none_or(|t| t <= now))
            .map(|j| j.queue.clone()),
    );
}

/// The registered-spec event a transition fires.
fn spec_event(t: &Transition) -> Option<SpecEvent> {
    match t {
        Transition::Completed => Some(SpecEvent::Completed),
        Transition::Failed { .. } => Some(SpecEvent::Exhausted),
        Transition::Retryable { .. } => Some(SpecEvent::Retried),
        Transition::Cancelled { .. } => Some(SpecEvent::Cancelled),
        _ => None,
    }
}

pub(super) fn record_insert(trigger: i64, job: &NewJob, result: FollowUpInsert) {
    let kind = job.kind.as_str();
    match result {
        FollowUpInsert::Inserted(id) => {
            metrics::add(&metrics::FOLLOW_UPS_INSERTED, 1);
            metrics::series::record(kind, &job.queue, metrics::series::JobEvent::Inserted, 1);
            tracing::debug!(
                trigger_job_id = trigger,
                kind,
                job_id = id,
                "follow-up inserted"
            );
        }
        FollowUpInsert::SkippedDuplicate => {
            metrics::add(&metrics::FOLLOW_UPS_SKIPPED_DUPLICATE, 1);
            tracing::debug!(
                trigger_job_id = trigger,
                kind,
                "follow-up skipped: its unique key is held"
            );
        }
    }
}

/// The SET clause of each transition. Every statement binds the same parameters — $1 id,
/// $2 run lease, $3 progress, $4 run_at, $5 text (reason), $6 error entries — so one guarded
/// UPDATE serves them all.
fn set_clause(t: &Transition) -> &'static str {
    match t {
        Transition::Completed => "state = 'completed', finalized_at = now(), progress = NULL",
        Transition::Retryable { .. } => {
            "state = 'retryable', run_at = $4, errors = errors || coalesce($6, '[]'::jsonb), deadline_at = NULL, \
             progress = coalesce($3, progress)"
        }
        Transition::Snoozed { .. } => {
            "state = 'scheduled', run_at = $4, attempt = greatest(attempt - 1, 0), deadline_at = NULL, \
             progress = coalesce($3, progress)"
        }
        Transition::Cancelled { .. } => {
            "state = 'cancelled', finalized_at = now(), progress = coalesce($3, progress), \
             errors = errors || jsonb_build_array(jsonb_build_object( \
                 'attempt', attempt, 'at', now(), 'error', 'cancelled: ' || $5))"
        }
        Transition::Failed { .. } => {
            "state = 'failed', finalized_at = now(), errors = errors || $6, progress = coalesce($3, progress)"
        }
        // Parked separately (see park_waiting); never reaches the shared statement.
        Transition::WaitingExternal { .. } => "state = state",
    }
}

/// The guarded UPDATE for the transition; true when it matched the running row.
async fn run_guarded_update(conn: &mut PgConnection, fin: &Finalization) -> Result<bool, AwaError> {
    let job = &fin.job;
    let progress = fin.progress.clone();
    if let Transition::WaitingExternal { callback_id } = &fin.transition {
        return park_waiting(conn, job, callback_id, progress).await;
    }
    let (run_at, text, errors) = match &fin.transition {
        Transition::Retryable { error, run_at } => (
            Some(*run_at),
            None,
            error.as_ref().map(|e| serde_json::json!([e])),
        ),
        Transition::Snoozed { run_at } => (Some(*run_at), None, None),
        Transition::Cancelled { reason } => (None, Some(reason.as_str()), None),
        Transition::Failed { error } => (None, None, Some(serde_json::json!([error]))),
        _ => (None, None, None),
    };
    let sql = format!(
        "UPDATE awa.canonical_jobs SET {}, heartbeat_at = NULL,
             callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL
         WHERE id = $1 AND run_lease = $2 AND state = 'running'",
        set_clause(&fin.transition)
    );
    let result = sqlx::query(&sql)
        .bind(job.id)
        .bind(job.run_lease)
        .bind(progress)
        .bind(run_at)
        .bind(text)
        .bind(errors)
        .execute(&mut *conn)
        .await?;
    Ok(result.rows_affected() == 1)
}

/// Park the job in `waiting_external`.
async fn park_waiting(
    conn: &mut PgConnection,
    job: &crate::model::JobRow,
    callback_id: &str,
    progress: Option<serde_json::Value>,
) -> Result<bool, AwaError> {
    // The external system may already have answered before the handler returned:
    // `resume_external` on a still-running attempt clears `callback_id` and stores the
    // payload in `callback_result`. Requiring `callback_id = $3` alone would make that park
    // stale and leave the job running, unheartbeated, until rescue burned an attempt. Treat
    // it as a park immediately followed by the resume: the job becomes available again,
    // exactly as `resume_external` does for a parked job.
    let parked: Option<String> = sqlx::query_scalar(
        "UPDATE awa.canonical_jobs SET
             state = CASE WHEN callback_id IS NULL THEN 'available' ELSE 'waiting_external' END,
             run_at = CASE WHEN callback_id IS NULL THEN now() ELSE run_at END,
             attempt = CASE WHEN callback_id IS NULL THEN greatest(attempt - 1, 0) ELSE attempt END,
             heartbeat_at = NULL, deadline_at = NULL, progress = coalesce($4, progress)
         WHERE id = $1 AND run_lease = $2 AND state = 'running'
           AND (callback_id = $3::uuid
                OR (callback_id IS NULL AND callback_result->>'callback_id' = $3::text))
         RETURNING state",
    )
    .bind(job.id)
    .bind(job.run_lease)
    .bind(callback_id)
    .bind(progress)
    .fetch_optional(&mut *conn)
    .await?;
    if parked.as_deref() == Some("available") {
        wake_queues(&mut *conn, std::slice::from_ref(&job.queue)).await?;
    }
    Ok(parked.is_some())
}

/// Count a committed finalization as its job event (and a DLQ move where it went there).
pub(super) fn record_applied(fin: &Finalization) {
    use metrics::series::{record, JobEvent};
    let (kind, queue) = (fin.job.kind.as_str(), fin.job.queue.as_str());
    let event = match &fin.transition {
        Transition::Completed => JobEvent::Completed,
        Transition::Retryable { .. } => JobEvent::Retried,
        Transition::Snoozed { .. } => JobEvent::Snoozed,
        Transition::Cancelled { .. } => JobEvent::Cancelled,
        Transition::Failed { .. } => JobEvent::Failed,
        Transition::WaitingExternal { .. } => JobEvent::WaitingExternal,
    };
    record(kind, queue, event, 1);
    if fin.dlq && matches!(fin.transition, Transition::Failed { .. }) {
        record(kind, queue, JobEvent::DlqMoved, 1);
    }
}
