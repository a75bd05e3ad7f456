//! The runner: executes one attempt's handler with its context, seals the staging buffer the
//! moment the handler returns, maps the outcome to a named transition, and hands it to the
//! finalizer on the batched or the per-job path.

use crate::executor::claim_ahead::Slot;
use crate::executor::config::QueueConfig;
use crate::executor::context::{CancelSignal, JobContext, ProgressBuffer};
use crate::executor::inflight::{Inflight, InflightSet};
use crate::executor::result::{JobError, JobResult, Outcome};
use crate::executor::runtime::Shared;
use crate::finalizer::{self, batched, retry_backoff, Finalization, Transition};
use crate::follow_ups::{FollowUps, SealedFollowUps};
use crate::metrics;
use crate::model::{JobErrorEntry, JobRow};
use chrono::Utc;
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Longest the batched completer waits for more completions when its batch is small.
const COMPLETION_LINGER: Duration = Duration::from_millis(2);

/// The cancellation reason of a job whose cancel request arrived while it waited for a slot.
pub(crate) const CANCELLED_BEFORE_START: &str = "requested before the handler started";

/// A claimed attempt that has not started yet. It is in the in-flight set from the claim on,
/// so heartbeats renew it and a cancel request reaches its signal while it waits for a slot.
pub(crate) struct Claimed {
    pub(crate) job: JobRow,
    cancel: CancelSignal,
    progress: Arc<Mutex<ProgressBuffer>>,
    /// When the claim statement was sent; the database set `deadline_at` after this.
    pub(crate) claimed_at: Instant,
}

impl Claimed {
    pub(crate) fn register(inflight: &InflightSet, job: JobRow, claimed_at: Instant) -> Self {
        let cancel = CancelSignal::default();
        let progress = Arc::new(Mutex::new(ProgressBuffer {
            value: job.progress.clone(),
            dirty: false,
        }));
        inflight.register(
            job.id,
            Inflight {
                lease: job.run_lease,
                cancel: cancel.clone(),
                progress: progress.clone(),
            },
        );
        Claimed {
            job,
            cancel,
            progress,
            claimed_at,
        }
    }
}

/// Run one attempt and hand its outcome to the finalizer. The caller counted the handler as
/// started ([`InflightSet::handler_started`]); `slot` is released when the handler returns.
pub(crate) async fn run_job(shared: Arc<Shared>, qc: QueueConfig, claimed: Claimed, slot: Slot) {
    let Claimed {
        job,
        cancel,
        progress,
        claimed_at,
    } = claimed;
    let job_id = job.id;
    let ctx = Arc::new(JobContext {
        job: Arc::new(job),
        pool: shared.pool.clone(),
        follow_ups: FollowUps::new(),
        cancel: cancel.clone(),
        progress: progress.clone(),
        state: shared.state.clone(),
        callbacks: shared.callbacks.clone(),
    });
    // The local deadline counts from the claim, like `deadline_at`: time spent waiting for a
    // slot is not added to the attempt's time.
    let deadline = claimed_at.checked_add(qc.deadline);
    let outcome = if shared.abandon.is_cancelled() {
        Outcome::Abandoned {
            reason: "shutdown".into(),
        }
    } else if cancel.is_cancelled() {
        // Cancelled while it waited for a slot: it never runs.
        Outcome::Returned(JobResult::Cancel(CANCELLED_BEFORE_START.into()))
    } else {
        match shared.handlers.get(&ctx.job.kind) {
            // Named with its exception class, so `errors` reads like the traceback would.
            None => Outcome::Failed {
                error: JobError::Terminal(format!(
                    "UnknownJobKind: {}",
                    crate::error::AwaError::UnknownJobKind(ctx.job.kind.clone())
                )),
                traceback: None,
            },
            Some(handler) => {
                let fut = AssertUnwindSafe(handler.run(ctx.clone())).catch_unwind();
                tokio::select! {
                    r = match deadline {
                        Some(at) => tokio::time::timeout_at(at, fut),
                        None => tokio::time::timeout(qc.deadline, fut),
                    } => match r {
                        Ok(Ok(outcome)) => outcome,
                        Ok(Err(panic)) => Outcome::Panicked { message: panic_message(&panic), traceback: None },
                        Err(_) => {
                            cancel.cancel();
                            Outcome::Abandoned { reason: "deadline passed".into() }
                        }
                    },
                    _ = shared.abandon.cancelled() => {
                        cancel.cancel();
                        Outcome::Abandoned { reason: "shutdown".into() }
                    }
                }
            }
        }
    };
    // The handler returned: seal its buffer now, so later stages fail with Sealed.
    let sealed = ctx.follow_ups.seal();
    shared.inflight.handler_done();
    drop(slot);
    let progress_now = progress
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .value
        .clone();
    let job = ctx.job.clone();
    drop(ctx);
    match transition_for(&job, outcome, &sealed) {
        None => {
            metrics::add(&metrics::JOBS_ABANDONED, 1);
            shared.inflight.remove(job_id);
        }
        Some(transition) => {
            let fin = Finalization {
                job,
                transition,
                follow_ups: sealed,
                progress: progress_now,
                dlq: qc.dlq,
            };
            submit(&shared, fin).await;
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic".to_string()
    }
}

fn error_entry(job: &JobRow, error: String, traceback: Option<String>) -> JobErrorEntry {
    JobErrorEntry {
        attempt: job.attempt,
        at: Utc::now(),
        error,
        traceback,
    }
}

/// Map an outcome to its named transition (`None`: abandoned, nothing to finalize).
pub(crate) fn transition_for(
    job: &JobRow,
    outcome: Outcome,
    sealed: &SealedFollowUps,
) -> Option<Transition> {
    let exhausted = job.attempt >= job.max_attempts;
    let retry_or_fail = |error: String, traceback: Option<String>, delay: Duration| {
        if exhausted {
            Transition::Failed {
                error: error_entry(job, format!("{error} (attempts exhausted)"), traceback),
            }
        } else {
            let run_at = Utc::now()
                + chrono::Duration::from_std(delay).unwrap_or_else(|_| chrono::Duration::days(1));
            Transition::Retryable {
                error: error_entry(job, error, traceback),
                run_at,
            }
        }
    };
    let staged = sealed.follow_ups.len();
    let t = match outcome {
        Outcome::Returned(JobResult::Completed) => match &sealed.poison {
            Some(e) => {
                metrics::add(&metrics::ATTEMPTS_POISONED, 1);
                tracing::warn!(job_id = job.id, kind = %job.kind, "attempt poisoned by a failed stage; failing it");
                Transition::Failed {
                    error: error_entry(job, format!("staging failed: {e}"), None),
                }
            }
            None => Transition::Completed,
        },
        Outcome::Returned(JobResult::RetryAfter(d)) => {
            retry_or_fail("retry requested by the handler".into(), None, d)
        }
        Outcome::Returned(JobResult::Snooze(d)) => {
            let run_at = Utc::now()
                + chrono::Duration::from_std(d).unwrap_or_else(|_| chrono::Duration::days(1));
            Transition::Snoozed { run_at }
        }
        Outcome::Returned(JobResult::Cancel(reason)) => Transition::Cancelled { reason },
        Outcome::Returned(JobResult::WaitForCallback(token)) => {
            if staged > 0 {
                metrics::add(&metrics::STAGED_DISCARDED_WAIT_FOR_CALLBACK, staged as u64);
                tracing::warn!(job_id = job.id, kind = %job.kind, count = staged,
                    "handler returned WaitForCallback with staged follow-ups; they are discarded");
            }
            Transition::WaitingExternal {
                callback_id: token.0,
            }
        }
        Outcome::Failed {
            error: JobError::Terminal(e),
            traceback,
        } => Transition::Failed {
            error: error_entry(job, e, traceback),
        },
        Outcome::Failed {
            error: JobError::Retryable(e),
            traceback,
        } => retry_or_fail(e, traceback, retry_backoff(job.attempt)),
        Outcome::Panicked { message, traceback } => {
            retry_or_fail(message, traceback, retry_backoff(job.attempt))
        }
        Outcome::Abandoned { reason } => {
            tracing::warn!(job_id = job.id, kind = %job.kind, reason = %reason, "handler abandoned; rescue will re-run it");
            return None;
        }
    };
    if staged > 0 && t != Transition::Completed && !matches!(t, Transition::WaitingExternal { .. })
    {
        tracing::debug!(job_id = job.id, kind = %job.kind, count = staged, transition = t.name(),
            "staged follow-ups discarded");
    }
    Some(t)
}

/// Send a finalization down its path.
pub(crate) async fn submit(shared: &Arc<Shared>, fin: Finalization) {
    if fin.is_plain_completion(&shared.specs) {
        if shared
            .batch_tx
            .send((fin.job.id, fin.job.run_lease))
            .await
            .is_err()
        {
            // The batcher is gone (shutdown finished): the job stays running until rescue.
            shared.inflight.remove(fin.job.id);
        }
        return;
    }
    let permit = shared.per_job.clone().acquire_owned().await;
    let shared2 = shared.clone();
    tokio::spawn(async move {
        let _permit = permit;
        // The finalize deadline: a finalization still running after it is dropped. An open
        // transaction rolls back; a completion statement already sent runs to its end on the
        // server and commits with its follow-ups or not at all; a job left running is rescued
        // later (ADR-046, last row of the commit table).
        let deadline = shared2.config.finalize_deadline;
        let attempt = finalizer::finalize_with_retry_via(
            &shared2.pool,
            &fin,
            &shared2.specs,
            Some(&shared2.waker),
        );
        if tokio::time::timeout(deadline, attempt).await.is_err() {
            metrics::add(&metrics::FINALIZE_GAVE_UP, 1);
            tracing::error!(job_id = fin.job.id, kind = %fin.job.kind, ?deadline,
                "finalization passed its deadline; the job stays running until rescue");
        }
        shared2.inflight.remove(fin.job.id);
    });
}

/// The batched completer: take whatever completions are waiting (up to a batch), apply them
/// in one statement, repeat. Natural batching: the busier the queue, the bigger the batch.
pub(crate) async fn run_batcher(shared: Arc<Shared>, mut rx: mpsc::Receiver<(i64, i64)>) {
    let max = shared.config.completion_batch.max(1);
    let mut ids = Vec::with_capacity(max);
    let mut leases = Vec::with_capacity(max);
    let mut last_len = 0usize;
    while let Some((id, lease)) = rx.recv().await {
        ids.push(id);
        leases.push(lease);
        let linger_until = tokio::time::Instant::now() + COMPLETION_LINGER;
        loop {
            while ids.len() < max {
                match rx.try_recv() {
                    Ok((id, lease)) => {
                        ids.push(id);
                        leases.push(lease);
                    }
                    Err(_) => break,
                }
            }
            // Under load (the previous flush had company), wait a moment for more so one
            // commit covers many completions; on an idle queue a completion flushes at once.
            if ids.len() >= max || last_len <= 1 || tokio::time::Instant::now() >= linger_until {
                break;
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        last_len = ids.len();
        let _ = batched::complete_batch(&shared.pool, &ids, &leases).await;
        for id in ids.drain(..) {
            shared.inflight.remove(id);
        }
        leases.clear();
    }
}
