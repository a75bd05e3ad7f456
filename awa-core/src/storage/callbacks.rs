//! External callbacks (ADR-021): register, resolve from outside, and wake in-handler waits.
//!
//! A callback id belongs to one attempt: it is registered under the attempt's run lease and
//! cleared whenever the job leaves that attempt, so resolving it is implicitly lease-checked.
//! Every resolution publishes `awa:callback` so a handler waiting in `wait_for_callback` on any
//! worker re-reads its row at once.
//!
//! Both engines: registration and in-handler waits go to the engine of the attempt's pool
//! handle; a resolution from outside looks for the callback on canonical, then on the readable
//! queue-storage schema (`callbacks.sql`: the attempt's lease holds what canonical keeps in the
//! row), in one transaction.

use crate::error::{AwaError, Result};
use crate::executor::context::CallbackToken;
use crate::model::callback_rules::{self, CallbackRules, Decision, DefaultAction};
use crate::model::job::JOB_COLUMNS;
use crate::model::JobRow;
use crate::specs::{SpecEvent, Specs};
use crate::storage::engine::Engine;
use crate::storage::insert::insert_follow_up_in_tx;
use crate::storage::pool::Db;
use crate::storage::queue_storage::QueueStorage;
use crate::storage::routing::readable_queue_storage;
use crate::storage::wake_queues;
use sqlx::PgConnection;
use std::time::Duration;

/// The channel that wakes in-handler callback waits.
pub const CALLBACK_CHANNEL: &str = "awa:callback";

/// Register a callback for the running attempt `(job_id, lease)`.
pub async fn register_callback(
    pool: &Db,
    job_id: i64,
    lease: i64,
    timeout: Duration,
) -> Result<CallbackToken> {
    register_callback_with(pool, job_id, lease, timeout, &CallbackRules::default()).await
}

/// Register a callback with CEL `rules` for `resolve_callback` (compiled first: a bad
/// expression is [`AwaError::Config`], nothing is registered). The rules are stored with the
/// new callback id, so they apply to this callback only.
pub async fn register_callback_with(
    pool: &Db,
    job_id: i64,
    lease: i64,
    timeout: Duration,
    rules: &CallbackRules,
) -> Result<CallbackToken> {
    rules.validate()?;
    let rules_json = if rules.is_empty() {
        None
    } else {
        Some(serde_json::to_value(rules)?)
    };
    if let Engine::QueueStorage(qs) = pool.engine() {
        let id = qs
            .register_callback_with(pool, job_id, lease, timeout, rules_json.as_ref())
            .await?;
        return id.map(CallbackToken).ok_or_else(|| {
            AwaError::State(format!(
                "job {job_id} is no longer running under this attempt"
            ))
        });
    }
    let id: Option<String> = sqlx::query_scalar(
        "WITH new AS (SELECT gen_random_uuid() AS id)
         UPDATE awa.canonical_jobs SET callback_id = new.id, callback_result = NULL,
             callback_timeout_at = now() + make_interval(secs => $3),
             callback_rules = CASE WHEN $4::jsonb IS NULL THEN NULL
                 ELSE $4::jsonb || jsonb_build_object('callback_id', new.id::text) END
         FROM new
         WHERE awa.canonical_jobs.id = $1 AND run_lease = $2 AND state = 'running'
         RETURNING new.id::text",
    )
    .bind(job_id)
    .bind(lease)
    .bind(timeout.as_secs_f64())
    .bind(rules_json)
    .fetch_optional(pool)
    .await?;
    id.map(CallbackToken).ok_or_else(|| {
        AwaError::State(format!(
            "job {job_id} is no longer running under this attempt"
        ))
    })
}

/// A callback id must be a UUID (`8-4-4-4-12` hex digits); anything else is a bad request
/// ([`AwaError::Config`], `awa.ValidationError`), as in awa-pg, not an unknown callback.
fn parse_uuid_text(callback_id: &str) -> Result<&str> {
    let ok = callback_id.len() == 36
        && callback_id.chars().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    if ok {
        Ok(callback_id)
    } else {
        let shown: String = callback_id.chars().take(64).collect();
        Err(AwaError::Config(format!(
            "invalid callback id {shown:?}: expected a UUID (8-4-4-4-12 hex digits)"
        )))
    }
}

/// The second parameter of a resolution statement, when it has one.
enum Param2 {
    None,
    Json(Option<serde_json::Value>),
    Text(String),
    Float(f64),
}

/// Apply `SET {set}` to the job waiting on `id` (parked, or running and waiting in its
/// handler) and return it; no such job is [`AwaError::CallbackNotFound`].
async fn resolve(conn: &mut PgConnection, id: &str, set: &str, param: Param2) -> Result<JobRow> {
    let sql = format!(
        "UPDATE awa.canonical_jobs SET {set}
         WHERE callback_id = $1::uuid AND state IN ('waiting_external', 'running')
         RETURNING {JOB_COLUMNS}"
    );
    let q = sqlx::query(&sql).bind(id);
    let q = match param {
        Param2::None => q,
        Param2::Json(v) => q.bind(v),
        Param2::Text(t) => q.bind(t),
        Param2::Float(f) => q.bind(f),
    };
    match q.fetch_optional(&mut *conn).await? {
        Some(r) => Ok(JobRow::from_row(&r)?),
        None => Err(AwaError::CallbackNotFound(id.to_string())),
    }
}

/// Complete the job waiting on `callback_id`, firing registered Completed specs in the same
/// transaction. Staged follow-ups of an in-handler wait are not inserted: this process has no
/// handler context (ADR-046).
pub async fn complete_external(
    pool: &Db,
    specs: &Specs,
    callback_id: &str,
    payload: Option<serde_json::Value>,
) -> Result<JobRow> {
    let id = parse_uuid_text(callback_id)?;
    let mut tx = pool.begin().await?;
    let found = complete_in(&mut tx, specs, id, payload.clone()).await;
    let job = or_queue_storage(&mut tx, specs, id, Action::Complete(payload), found).await?;
    tx.commit().await?;
    Ok(job)
}

async fn complete_in(
    tx: &mut PgConnection,
    specs: &Specs,
    id: &str,
    payload: Option<serde_json::Value>,
) -> Result<JobRow> {
    let job = resolve(
        &mut *tx,
        id,
        "state = 'completed', finalized_at = now(), progress = NULL, heartbeat_at = NULL, \
         callback_id = NULL, callback_timeout_at = NULL, \
         callback_result = CASE WHEN $2::jsonb IS NULL THEN NULL \
             ELSE jsonb_build_object('callback_id', $1::text, 'payload', $2::jsonb) END",
        Param2::Json(payload),
    )
    .await?;
    for follow_up in specs.follow_ups(&job, SpecEvent::Completed)? {
        insert_follow_up_in_tx(&mut *tx, &follow_up, false).await?;
    }
    notify_callback(&mut *tx, id).await?;
    Ok(job)
}

/// Fail the job waiting on `callback_id` (moved to the DLQ when its queue enables it).
pub async fn fail_external(
    pool: &Db,
    specs: &Specs,
    callback_id: &str,
    error: &str,
) -> Result<JobRow> {
    let id = parse_uuid_text(callback_id)?;
    let mut tx = pool.begin().await?;
    let found = fail_in(&mut tx, specs, id, error).await;
    let job = or_queue_storage(&mut tx, specs, id, Action::Fail(error), found).await?;
    tx.commit().await?;
    Ok(job)
}

async fn fail_in(tx: &mut PgConnection, specs: &Specs, id: &str, error: &str) -> Result<JobRow> {
    let job = resolve(
        &mut *tx,
        id,
        "state = 'failed', finalized_at = now(), heartbeat_at = NULL, \
         callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL, \
         errors = errors || jsonb_build_array(jsonb_build_object(\
             'attempt', attempt, 'at', now(), 'error', $2::text))",
        Param2::Text(error.to_string()),
    )
    .await?;
    for follow_up in specs.follow_ups(&job, SpecEvent::Exhausted)? {
        insert_follow_up_in_tx(&mut *tx, &follow_up, false).await?;
    }
    crate::storage::dlq::move_failed_where_enabled(&mut *tx, &[job.id], error).await?;
    notify_callback(&mut *tx, id).await?;
    Ok(job)
}

/// What [`resolve_callback`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Resolution {
    /// `completed`, `failed` or `ignored`.
    pub outcome: &'static str,
    /// The job after the change; None when ignored.
    pub job: Option<JobRow>,
    /// What completion returned (after `transform`); None otherwise.
    pub payload: Option<serde_json::Value>,
    /// Why the payload was ignored.
    pub reason: Option<String>,
}

/// Resolve the callback with the CEL rules its handler registered
/// ([`callback_rules::decide`]): complete or fail the job exactly as `complete_external` /
/// `fail_external` do, or leave it waiting (ignored). The job row is locked while the rules
/// are evaluated, so two resolutions of one callback cannot both act.
pub async fn resolve_callback(
    pool: &Db,
    specs: &Specs,
    callback_id: &str,
    payload: Option<serde_json::Value>,
    default: DefaultAction,
) -> Result<Resolution> {
    let id = parse_uuid_text(callback_id)?;
    let mut tx = pool.begin().await?;
    let stored: Option<Option<serde_json::Value>> = sqlx::query_scalar(
        "SELECT CASE WHEN callback_rules->>'callback_id' = callback_id::text
                     THEN callback_rules - 'callback_id' END
         FROM awa.canonical_jobs
         WHERE callback_id = $1::uuid AND state IN ('waiting_external', 'running')
         FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    // Not a canonical job's: a queue-storage attempt's, if one waits on it.
    let (stored, canonical) = match stored {
        Some(stored) => (stored, true),
        None => {
            let qs = readable_queue_storage(&mut *tx).await?;
            let found = match &qs {
                Some(qs) => qs.callback_rules(&mut tx, id).await?,
                None => None,
            };
            match found {
                Some((_, rules)) => (rules, false),
                None => return Err(AwaError::CallbackNotFound(id.to_string())),
            }
        }
    };
    let rules: Option<CallbackRules> = stored.map(serde_json::from_value).transpose()?;
    let resolution = match callback_rules::decide(rules.as_ref(), payload.as_ref(), default) {
        Decision::Complete(result) => {
            let job = if canonical {
                complete_in(&mut tx, specs, id, result.clone()).await?
            } else {
                on_queue_storage(&mut tx, specs, id, Action::Complete(result.clone())).await?
            };
            Resolution {
                outcome: "completed",
                job: Some(job),
                payload: result,
                reason: None,
            }
        }
        Decision::Fail(error) => {
            let job = if canonical {
                fail_in(&mut tx, specs, id, &error).await?
            } else {
                on_queue_storage(&mut tx, specs, id, Action::Fail(&error)).await?
            };
            Resolution {
                outcome: "failed",
                job: Some(job),
                payload: None,
                reason: None,
            }
        }
        Decision::Ignore(reason) => Resolution {
            outcome: "ignored",
            job: None,
            payload: None,
            reason: Some(reason),
        },
    };
    tx.commit().await?;
    Ok(resolution)
}

/// Make the job waiting on `callback_id` retryable now (a new attempt will run).
pub async fn retry_external(pool: &Db, callback_id: &str) -> Result<JobRow> {
    let id = parse_uuid_text(callback_id)?;
    let mut tx = pool.begin().await?;
    let job = resolve(
        &mut tx,
        id,
        "state = 'available', run_at = now(), heartbeat_at = NULL, deadline_at = NULL, \
         callback_id = NULL, callback_timeout_at = NULL, callback_result = NULL",
        Param2::None,
    )
    .await;
    let job = match job {
        Err(AwaError::CallbackNotFound(_)) => {
            let specs = Specs::default();
            or_queue_storage(&mut tx, &specs, id, Action::Retry, job).await?
        }
        other => {
            let job = other?;
            wake_queues(&mut *tx, std::slice::from_ref(&job.queue)).await?;
            notify_callback(&mut tx, id).await?;
            job
        }
    };
    tx.commit().await?;
    Ok(job)
}

/// Deliver `payload` to the handler waiting on `callback_id`. A handler waiting in
/// `wait_for_callback` continues under the same lease (even if the resume arrived before it
/// started waiting): the job stays `running` with the payload under
/// `metadata["_awa_callback_result"]` (ADR-021) until the wait takes it. A job parked by
/// returning `WaitForCallback` becomes available again, the payload in the same key for its
/// next attempt.
pub async fn resume_external(
    pool: &Db,
    callback_id: &str,
    payload: Option<serde_json::Value>,
) -> Result<JobRow> {
    let id = parse_uuid_text(callback_id)?;
    let mut tx = pool.begin().await?;
    let job = resolve(&mut tx, id, "callback_result = jsonb_build_object(\
             'callback_id', $1::text, 'payload', coalesce($2::jsonb, 'null'::jsonb)), \
         metadata = metadata || jsonb_build_object('_awa_callback_result', coalesce($2::jsonb, 'null'::jsonb)), \
         callback_id = NULL, callback_timeout_at = NULL, \
         state = CASE WHEN state = 'waiting_external' THEN 'available' ELSE state END, \
         run_at = CASE WHEN state = 'waiting_external' THEN now() ELSE run_at END, \
         attempt = CASE WHEN state = 'waiting_external' THEN greatest(attempt - 1, 0) ELSE attempt END", Param2::Json(payload.clone())).await;
    let job = match job {
        Err(AwaError::CallbackNotFound(_)) => {
            let specs = Specs::default();
            or_queue_storage(&mut tx, &specs, id, Action::Resume(payload), job).await?
        }
        other => {
            let job = other?;
            if job.state == crate::JobState::Available {
                wake_queues(&mut *tx, std::slice::from_ref(&job.queue)).await?;
            }
            notify_callback(&mut tx, id).await?;
            job
        }
    };
    tx.commit().await?;
    Ok(job)
}

/// Extend a callback's timeout.
pub async fn heartbeat_callback(pool: &Db, callback_id: &str, timeout: Duration) -> Result<JobRow> {
    let id = parse_uuid_text(callback_id)?;
    // One statement, but in a transaction of its own so that it also works through
    // PgBouncer in transaction mode (see `storage::pool::Db`).
    let mut tx = pool.begin().await?;
    let job = resolve(
        &mut tx,
        id,
        "callback_timeout_at = now() + make_interval(secs => $2)",
        Param2::Float(timeout.as_secs_f64()),
    )
    .await;
    let specs = Specs::default();
    let job = or_queue_storage(&mut tx, &specs, id, Action::Heartbeat(timeout), job).await?;
    tx.commit().await?;
    Ok(job)
}

/// A resolution of an external callback, on queue storage (`qs_resolve_callback`).
enum Action<'a> {
    Complete(Option<serde_json::Value>),
    Fail(&'a str),
    Retry,
    Resume(Option<serde_json::Value>),
    Heartbeat(Duration),
}

/// `canonical`, the result of resolving callback `id` on canonical; when no canonical job
/// waits on it, the same resolution on queue storage ([`on_queue_storage`]).
async fn or_queue_storage(
    tx: &mut PgConnection,
    specs: &Specs,
    id: &str,
    action: Action<'_>,
    canonical: Result<JobRow>,
) -> Result<JobRow> {
    match canonical {
        Err(AwaError::CallbackNotFound(_)) => on_queue_storage(tx, specs, id, action).await,
        other => other,
    }
}

/// Resolve callback `id` on the readable queue-storage schema (in the caller's transaction),
/// with what canonical's resolution does around it: registered specs' follow-ups
/// (`Completed` on completion, `Exhausted` on failure), the DLQ where the queue enables it,
/// the queue's wake-up and `awa:callback`. No attempt waits on it there:
/// [`AwaError::CallbackNotFound`].
async fn on_queue_storage(
    tx: &mut PgConnection,
    specs: &Specs,
    id: &str,
    action: Action<'_>,
) -> Result<JobRow> {
    let not_found = || AwaError::CallbackNotFound(id.to_string());
    let Some(qs) = readable_queue_storage(&mut *tx).await? else {
        return Err(not_found());
    };
    let (name, payload, error, timeout) = match &action {
        Action::Complete(p) => ("complete", p.as_ref(), None, None),
        Action::Fail(e) => ("fail", None, Some(*e), None),
        Action::Retry => ("retry", None, None, None),
        Action::Resume(p) => ("resume", p.as_ref(), None, None),
        Action::Heartbeat(t) => ("heartbeat", None, None, Some(*t)),
    };
    let Some((job_id, wake)) = qs
        .resolve_callback(&mut *tx, id, name, payload, error, timeout)
        .await?
    else {
        return Err(not_found());
    };
    let job = qs.job(&mut *tx, job_id).await?;
    let event = match &action {
        Action::Complete(_) => Some(SpecEvent::Completed),
        Action::Fail(_) => Some(SpecEvent::Exhausted),
        _ => None,
    };
    if let Some(event) = event {
        let follow_ups = specs.follow_ups(&job, event)?;
        if !follow_ups.is_empty() {
            let refs: Vec<&crate::model::NewJob> = follow_ups.iter().collect();
            qs.enqueue_follow_ups(&mut *tx, &refs).await?;
        }
    }
    if let Action::Fail(error) = &action {
        qs.move_to_dlq(&mut *tx, &[job_id], Some(error), true)
            .await?;
    }
    if let Some(queue) = wake {
        wake_queues(&mut *tx, std::slice::from_ref(&queue)).await?;
    }
    if !matches!(action, Action::Heartbeat(_)) {
        notify_callback(&mut *tx, id).await?;
    }
    Ok(job)
}

async fn notify_callback(conn: &mut sqlx::PgConnection, id: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CALLBACK_CHANNEL)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// What an in-handler wait finds when it reads its row.
pub(crate) enum WaitState {
    Resumed(serde_json::Value),
    /// A payload arrived between two reads: read again at once.
    Ready,
    Pending,
    Gone(String),
}

/// Read the row of a waiting attempt: resumed (take the payload), still pending, or gone.
pub(crate) async fn poll_wait(
    pool: &Db,
    job_id: i64,
    lease: i64,
    token: &str,
) -> Result<WaitState> {
    if let Engine::QueueStorage(qs) = pool.engine() {
        return poll_wait_queue_storage(pool, qs, job_id, lease, token).await;
    }
    let taken: Option<serde_json::Value> = sqlx::query_scalar(
        "UPDATE awa.canonical_jobs j SET callback_result = NULL,
             metadata = j.metadata - '_awa_callback_result'
         FROM (SELECT id, callback_result AS old FROM awa.canonical_jobs WHERE id = $1 FOR UPDATE) o
         WHERE j.id = o.id AND j.run_lease = $2 AND j.state = 'running'
           AND o.old->>'callback_id' = $3
         RETURNING o.old->'payload'",
    )
    .bind(job_id)
    .bind(lease)
    .bind(token)
    .fetch_optional(pool)
    .await?;
    if let Some(payload) = taken {
        return Ok(WaitState::Resumed(payload));
    }
    // A resume that committed after the take above is still waiting in callback_result.
    let row: Option<(String, i64, Option<String>, bool, bool)> = sqlx::query_as(
        "SELECT state, run_lease, callback_id::text, coalesce(callback_timeout_at < now(), false),
                coalesce(callback_result->>'callback_id' = $2, false)
         FROM awa.canonical_jobs WHERE id = $1",
    )
    .bind(job_id)
    .bind(token)
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        None => WaitState::Gone("the job no longer exists".into()),
        Some((state, l, _, _, _)) if state != "running" || l != lease => {
            WaitState::Gone(format!("the job was finalized elsewhere (state {state})"))
        }
        Some((_, _, _, _, true)) => WaitState::Ready,
        Some((_, _, cb, _, _)) if cb.as_deref() != Some(token) => {
            WaitState::Gone("the callback is no longer registered for this attempt".into())
        }
        Some((_, _, _, true, _)) => WaitState::Gone("the callback timed out".into()),
        Some(_) => WaitState::Pending,
    })
}

/// [`poll_wait`] on queue storage: the attempt's lease holds the delivered payload.
async fn poll_wait_queue_storage(
    pool: &Db,
    qs: &QueueStorage,
    job_id: i64,
    lease: i64,
    token: &str,
) -> Result<WaitState> {
    if let Some(payload) = qs.take_callback_result(pool, job_id, lease, token).await? {
        return Ok(WaitState::Resumed(payload));
    }
    Ok(
        match qs.callback_wait_state(pool, job_id, lease, token).await? {
            None => match qs.job(pool, job_id).await {
                Ok(job) => WaitState::Gone(format!(
                    "the job was finalized elsewhere (state {})",
                    job.state
                )),
                Err(AwaError::JobNotFound(_)) => WaitState::Gone("the job no longer exists".into()),
                Err(e) => return Err(e),
            },
            Some((true, _, _, _)) => {
                WaitState::Gone("the job was finalized elsewhere (state waiting_external)".into())
            }
            Some((_, _, _, true)) => WaitState::Ready,
            Some((_, cb, _, _)) if cb.as_deref() != Some(token) => {
                WaitState::Gone("the callback is no longer registered for this attempt".into())
            }
            Some((_, _, true, _)) => WaitState::Gone("the callback timed out".into()),
            Some(_) => WaitState::Pending,
        },
    )
}
