//! The runner: executes one attempt's handler with its context and hands the outcome to the
//! finalizer's completer as a [`Finalization`].
//!
//! The staging buffer is sealed the instant the handler returns — in the poll in which the
//! handler's future completes (Rust, [`sealed_on_return`]) or inside `finish()` on the event
//! loop's thread (Python) — so the runner receives the outcome with the sealed follow-ups and
//! nothing can be staged afterwards however long it takes to get here. It maps the outcome to
//! a named transition and hands the finalization over; path choice, batching and retries are
//! the completer's (`finalizer::completer`).
//!
//! [`sealed_on_return`]: crate::executor::sealed_on_return

use crate::executor::claim_ahead::Slot;
use crate::executor::config::QueueConfig;
use crate::executor::context::{CancelSignal, JobContext, ProgressBuffer};
use crate::executor::inflight::{Inflight, InflightSet};
use crate::executor::result::{
    check_outcome_delay, JobError, JobResult, Outcome, Returned, MAX_OUTCOME_DELAY,
};
use crate::executor::runtime::Shared;
use crate::finalizer::{retry_backoff, Finalization, Transition};
use crate::follow_ups::{FollowUps, SealedFollowUps};
use crate::metrics;
use crate::model::{JobErrorEntry, JobRow};
use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

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
    let started = std::time::Instant::now();
    let returned = if shared.abandon.is_cancelled() {
        sealed_now(
            &ctx,
            Outcome::Abandoned {
                reason: "shutdown".into(),
            },
        )
    } else if cancel.is_cancelled() {
        // Cancelled while it waited for a slot: it never runs.
        sealed_now(
            &ctx,
            Outcome::Returned(JobResult::Cancel(CANCELLED_BEFORE_START.into())),
        )
    } else {
        match shared.handlers.get(&ctx.job.kind) {
            // Named with its exception class, so `errors` reads like the traceback would.
            None => sealed_now(
                &ctx,
                Outcome::Failed {
                    error: JobError::Terminal(format!(
                        "UnknownJobKind: {}",
                        crate::error::AwaError::UnknownJobKind(ctx.job.kind.clone())
                    )),
                    traceback: None,
                },
            ),
            Some(handler) => {
                let fut = AssertUnwindSafe(handler.run(ctx.clone())).catch_unwind();
                tokio::select! {
                    r = match deadline {
                        Some(at) => tokio::time::timeout_at(at, fut),
                        None => tokio::time::timeout(qc.deadline, fut),
                    } => match r {
                        Ok(Ok(returned)) => returned,
                        Ok(Err(panic)) => sealed_now(&ctx, Outcome::Panicked { message: panic_message(&panic), traceback: None }),
                        Err(_) => {
                            cancel.cancel();
                            sealed_now(&ctx, Outcome::Abandoned { reason: "deadline passed".into() })
                        }
                    },
                    _ = shared.abandon.cancelled() => {
                        cancel.cancel();
                        sealed_now(&ctx, Outcome::Abandoned { reason: "shutdown".into() })
                    }
                }
            }
        }
    };
    let Returned {
        outcome,
        follow_ups: mut sealed,
    } = returned;
    // A handler that broke the `ErasedHandler` contract and did not seal: seal now and keep
    // what it staged, rather than let it stage on.
    let unsealed = ctx.follow_ups.seal();
    if !unsealed.is_empty() || unsealed.poison.is_some() {
        tracing::warn!(
            job_id,
            "handler returned without sealing its staging buffer"
        );
        sealed.follow_ups.extend(unsealed.follow_ups);
        sealed.poison = sealed.poison.or(unsealed.poison);
    }
    crate::seams::after_return(&ctx.follow_ups).await;
    metrics::series::observe(
        &ctx.job.kind,
        &ctx.job.queue,
        metrics::series::Timing::Duration,
        started.elapsed(),
    );
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
            shared.completer.submit(fin).await;
        }
    }
}

/// An outcome the runner decided itself (the handler's future panicked, or was dropped at the
/// deadline or shutdown): seal the buffer at once; a task the handler spawned gets Sealed.
fn sealed_now(ctx: &JobContext, outcome: Outcome) -> Returned {
    Returned {
        outcome,
        follow_ups: ctx.follow_ups.seal(),
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
        terminal: false,
    }
}

/// The entry of an attempt the handler failed for good (`TerminalError`, a failed stage).
fn terminal_entry(job: &JobRow, error: String, traceback: Option<String>) -> JobErrorEntry {
    JobErrorEntry {
        terminal: true,
        ..error_entry(job, error, traceback)
    }
}

/// Now plus `delay`. Delays reaching here are at most [`MAX_OUTCOME_DELAY`] (checked) or a
/// backoff of at most a day, so this cannot overflow; saturate anyway rather than panic.
fn after(delay: Duration) -> DateTime<Utc> {
    let now = Utc::now();
    chrono::Duration::from_std(delay.min(MAX_OUTCOME_DELAY))
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(now)
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
            Transition::Retryable {
                error: Some(error_entry(job, error, traceback)),
                run_at: after(delay),
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
                    error: terminal_entry(job, format!("staging failed: {e}"), None),
                }
            }
            None => Transition::Completed,
        },
        Outcome::Returned(JobResult::RetryAfter(d)) => {
            match check_outcome_delay("RetryAfter delay", d) {
                // A requested retry is not an error: no entry unless it exhausts the job.
                Ok(d) if !exhausted => Transition::Retryable {
                    error: None,
                    run_at: after(d),
                },
                Ok(d) => retry_or_fail("retry requested by the handler".into(), None, d),
                Err(e) => retry_or_fail(
                    format!("invalid outcome: {e}"),
                    None,
                    retry_backoff(job.attempt),
                ),
            }
        }
        Outcome::Returned(JobResult::Snooze(d)) => match check_outcome_delay("Snooze delay", d) {
            Ok(d) => Transition::Snoozed { run_at: after(d) },
            Err(e) => retry_or_fail(
                format!("invalid outcome: {e}"),
                None,
                retry_backoff(job.attempt),
            ),
        },
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
            error: terminal_entry(job, e, traceback),
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
