//! `work_one`: claim one job of a kind and run it through the real executor and finalizer
//! path — staging, poisoning and discard behave exactly as in production.

use crate::error::{AwaError, Result};
use crate::executor::context::{CancelSignal, JobContext, ProgressBuffer, StateMap};
use crate::executor::result::{Outcome, Returned};
use crate::executor::runner::transition_for;
use crate::executor::{callbacks::CallbackWaiters, ErasedHandler};
use crate::finalizer::batched::complete_batch_with_follow_ups;
use crate::finalizer::{finalize_with_retry, Finalization, Finalized, Transition};
use crate::follow_ups::FollowUps;
use crate::model::{JobRow, JobState};
use crate::specs::Specs;
use crate::storage::claim::{claim_batch, claim_kind};
use crate::storage::engine::Engine;
use crate::storage::pool::Db;
use crate::storage::routing::{get_job, readable_queue_storage};
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

/// Claim one job of `queue` (of `kind` when given): from canonical, else from the readable
/// queue-storage schema (a mixed transition holds jobs on both). Returns the pool handle whose
/// engine holds the job, so its finalization goes where the claim came from.
async fn claim_one(
    pool: &Db,
    queue: &str,
    kind: Option<&str>,
    deadline: Duration,
) -> Result<(Db, Vec<JobRow>)> {
    let jobs = match kind {
        Some(k) => claim_kind(pool, queue, k, 1, deadline).await?,
        None => claim_batch(pool, queue, 1, deadline).await?,
    };
    if !jobs.is_empty() {
        return Ok((pool.with_engine(Engine::Canonical), jobs));
    }
    let Some(qs) = readable_queue_storage(pool).await? else {
        return Ok((pool.clone(), jobs));
    };
    let jobs = match kind {
        Some(k) => qs.claim_kind(pool, queue, k, deadline).await?,
        None => qs.claim_queue(pool, queue, 1, Some(deadline)).await?,
    };
    Ok((pool.with_engine(Engine::QueueStorage(qs)), jobs))
}

/// What happened to the job `work_one` ran.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkResult {
    /// The job as stored after finalization (`None` when no job was available).
    pub job: Option<JobRow>,
    /// completed, retryable, failed, cancelled, snoozed, waiting_external, no_job — or
    /// `stale` when the lease guard matched nothing, `abandoned` when nothing was finalized.
    pub outcome: String,
    /// The error recorded for this attempt, if any.
    pub error: Option<String>,
}

impl WorkResult {
    pub fn is_completed(&self) -> bool {
        self.outcome == "completed"
    }
}

/// Claim the next available job of `queue` and run `handler` on it, finalizing through
/// `finalize_with_retry` with `specs` (use `Specs::default()` for none).
pub async fn work_one(
    pool: &Db,
    queue: &str,
    handler: Arc<dyn ErasedHandler>,
    specs: &Specs,
) -> Result<WorkResult> {
    work_one_of_kind(pool, queue, None, handler, specs).await
}

/// [`work_one`] claiming only a job of `kind` (when given).
pub async fn work_one_of_kind(
    pool: &Db,
    queue: &str,
    kind: Option<&str>,
    handler: Arc<dyn ErasedHandler>,
    specs: &Specs,
) -> Result<WorkResult> {
    work_one_on(pool, queue, kind, handler, specs, false).await
}

/// [`work_one_of_kind`], finalizing a completion as the runtime's batched completer does
/// with `RuntimeConfig::batch_follow_ups` on (`complete_batch_with_follow_ups`, a batch of
/// one) when `batched`, else with `finalize_with_retry`.
pub async fn work_one_on(
    pool: &Db,
    queue: &str,
    kind: Option<&str>,
    handler: Arc<dyn ErasedHandler>,
    specs: &Specs,
    batched: bool,
) -> Result<WorkResult> {
    let deadline = Duration::from_secs(300);
    let (engine_pool, mut jobs) = claim_one(pool, queue, kind, deadline).await?;
    let pool = &engine_pool;
    let Some(job) = jobs.pop() else {
        return Ok(WorkResult {
            job: None,
            outcome: "no_job".into(),
            error: None,
        });
    };
    let ctx = Arc::new(JobContext {
        progress: Arc::new(std::sync::Mutex::new(ProgressBuffer {
            value: job.progress.clone(),
            dirty: false,
        })),
        job: Arc::new(job),
        pool: pool.clone(),
        follow_ups: FollowUps::new(),
        cancel: CancelSignal::default(),
        state: StateMap::default(),
        callbacks: CallbackWaiters::default(),
    });
    // As in the runner: the buffer is sealed the instant the handler returns (inside its
    // future, or by the Python bridge's `finish()`); a panic seals it here.
    let Returned {
        outcome,
        follow_ups: mut sealed,
    } = match AssertUnwindSafe(handler.run(ctx.clone()))
        .catch_unwind()
        .await
    {
        Ok(returned) => returned,
        Err(_) => Returned {
            outcome: Outcome::Panicked {
                message: "panic".into(),
                traceback: None,
            },
            follow_ups: ctx.follow_ups.seal(),
        },
    };
    let unsealed = ctx.follow_ups.seal();
    sealed.follow_ups.extend(unsealed.follow_ups);
    sealed.poison = sealed.poison.or(unsealed.poison);
    crate::seams::after_return(&ctx.follow_ups).await;
    let progress = ctx.progress();
    let job = ctx.job.clone();
    let Some(transition) = transition_for(&job, outcome, &sealed) else {
        return Ok(WorkResult {
            job: Some((*job).clone()),
            outcome: "abandoned".into(),
            error: None,
        });
    };
    let outcome_name = match &transition {
        Transition::Snoozed { .. } => "snoozed",
        other => other.name(),
    }
    .to_string();
    let error = match &transition {
        Transition::Retryable { error, .. } => error.as_ref().map(|e| e.error.clone()),
        Transition::Failed { error } => Some(error.error.clone()),
        Transition::Cancelled { reason } => Some(reason.clone()),
        _ => None,
    };
    let fin = Finalization {
        job: job.clone(),
        transition,
        follow_ups: sealed,
        progress,
        dlq: false,
    };
    let done = if batched && fin.transition == Transition::Completed {
        complete_batch_with_follow_ups(pool, std::slice::from_ref(&fin), specs)
            .await?
            .pop()
            .unwrap_or_else(|| Err(AwaError::State("the batch reported nothing".into())))?
    } else {
        finalize_with_retry(pool, &fin, specs).await?
    };
    let stored = match get_job(pool, job.id).await {
        Ok(j) => Some(j),
        Err(AwaError::JobNotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let outcome = if done == Finalized::Stale {
        "stale".to_string()
    } else {
        outcome_name
    };
    debug_assert!(
        stored.as_ref().is_none_or(|j| j.state != JobState::Running) || outcome == "stale"
    );
    Ok(WorkResult {
        job: stored,
        outcome,
        error,
    })
}
