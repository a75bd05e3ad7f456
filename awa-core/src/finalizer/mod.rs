//! The finalizer: turns each attempt's outcome into a lease-guarded state change.
//!
//! Two paths (design §2):
//! - **batched** ([`batched`]): `Completed` jobs, many per commit: plain ones in one
//!   statement ([`batched::complete_batch`]), and with `RuntimeConfig::batch_follow_ups` on
//!   (the default) also those that insert follow-ups, in one transaction with the follow-ups
//!   of exactly the rows whose guard matched ([`batched::complete_batch_with_follow_ups`]);
//! - **per-job transaction** ([`per_job::finalize_in_tx`]): every other outcome, the jobs of a
//!   batch that failed in a way its retries cannot fix, and with `batch_follow_ups` off any
//!   completion that inserts follow-ups (registered specs first, then staged ones).
//!
//! The completer (`completer.rs`) owns completion in a running client: the executor hands it each
//! attempt's sealed [`Finalization`], and it chooses the path and runs the batcher.
//!
//! Both paths retry (see [`retry`]): a deadlock, serialization failure or lost connection
//! re-runs the same finalization in a new transaction, up to [`MAX_FINALIZE_ATTEMPTS`]
//! attempts, and after a lost connection only once the pool hands out a working connection
//! again (bounded by [`RetryPolicy::reconnect_budget`]). The sealed follow-ups are borrowed by each attempt, never drained, so a retry
//! carries them; a commit whose acknowledgement was lost replays as stale because its guard
//! (`id, state = 'running', run_lease`) no longer matches.

pub mod batched;
pub(crate) mod completer;
pub mod per_job;
pub mod retry;
pub(crate) mod waker;

use crate::error::AwaError;
use crate::follow_ups::SealedFollowUps;
use crate::metrics;
use crate::model::{JobErrorEntry, JobRow};
use crate::specs::Specs;
use crate::storage::pool::Db;
use chrono::{DateTime, Utc};
use retry::{Failure, Ready};
pub use retry::{RetryPolicy, DEFAULT_RECONNECT_BUDGET};
use std::sync::Arc;

/// Attempts per finalization (the first try plus two retries).
pub const MAX_FINALIZE_ATTEMPTS: u32 = 3;

/// The named state change an attempt ends with.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    Completed,
    /// Retry at `run_at` (burns the attempt that just ran). `error` is `None` when the
    /// handler asked for the retry (`RetryAfter`): nothing failed, so, as in awa-pg, no
    /// entry is appended to `errors`.
    Retryable {
        error: Option<JobErrorEntry>,
        run_at: DateTime<Utc>,
    },
    /// Run again at `run_at` without burning an attempt.
    Snoozed {
        run_at: DateTime<Utc>,
    },
    Cancelled {
        reason: String,
    },
    /// Failed for good (terminal error, exhausted attempts, poisoned attempt).
    Failed {
        error: JobErrorEntry,
    },
    /// Parked until the callback resolves.
    WaitingExternal {
        callback_id: String,
    },
}

impl Transition {
    pub fn name(&self) -> &'static str {
        match self {
            Transition::Completed => "completed",
            Transition::Retryable { .. } => "retryable",
            Transition::Snoozed { .. } => "snoozed",
            Transition::Cancelled { .. } => "cancelled",
            Transition::Failed { .. } => "failed",
            Transition::WaitingExternal { .. } => "waiting_external",
        }
    }
}

/// One attempt's finalization: the job as claimed, its transition, its sealed follow-ups
/// (inserted only with a committed `Completed`), and the progress to store.
#[derive(Debug, Clone)]
pub struct Finalization {
    pub job: Arc<JobRow>,
    pub transition: Transition,
    pub follow_ups: SealedFollowUps,
    pub progress: Option<serde_json::Value>,
    /// Move to the dead-letter queue instead of leaving a failed row.
    pub dlq: bool,
}

impl Finalization {
    /// Whether this is a completion that inserts nothing (the only kind the batched path
    /// takes with `RuntimeConfig::batch_follow_ups` off).
    pub fn is_plain_completion(&self, specs: &Specs) -> bool {
        self.transition == Transition::Completed
            && self.follow_ups.is_empty()
            && !specs.has(&self.job.kind, crate::specs::SpecEvent::Completed)
    }
}

/// The result of a finalization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalized {
    /// The state change (and its follow-ups) committed.
    Applied,
    /// The lease guard matched no row: the attempt was rescued, cancelled, superseded or
    /// completed elsewhere, and nothing was written.
    Stale,
}

/// Run a per-job finalization, retrying deadlocks and lost connections in a new transaction
/// (see [`retry`]) with the default [`RetryPolicy`]. The queues that received follow-ups are
/// woken right after the commit.
pub async fn finalize_with_retry(
    pool: &Db,
    fin: &Finalization,
    specs: &Specs,
) -> Result<Finalized, AwaError> {
    finalize_with_retry_via(pool, fin, specs, None, &RetryPolicy::default()).await
}

/// [`finalize_with_retry`] with an explicit retry policy.
pub async fn finalize_with_policy(
    pool: &Db,
    fin: &Finalization,
    specs: &Specs,
    policy: &RetryPolicy,
) -> Result<Finalized, AwaError> {
    finalize_with_retry_via(pool, fin, specs, None, policy).await
}

/// [`finalize_with_retry`]; with a `waker`, the post-commit wake-ups go through it (the
/// runtime's, which coalesces them across finalizations).
pub(crate) async fn finalize_with_retry_via(
    pool: &Db,
    fin: &Finalization,
    specs: &Specs,
    waker: Option<&waker::Waker>,
    policy: &RetryPolicy,
) -> Result<Finalized, AwaError> {
    let reconnect = retry::Reconnect::start(policy);
    let mut conn = None;
    let mut attempt = 1;
    loop {
        let e = match per_job::finalize_once(pool, conn.take(), fin, specs, attempt == 1, waker)
            .await
        {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        let failure = retry::classify(&e);
        if failure != Failure::Permanent && attempt < MAX_FINALIZE_ATTEMPTS {
            if failure == Failure::ConnectionLost {
                crate::seams::reconnecting(fin.job.id).await;
                match reconnect.working_connection(pool).await {
                    Ready::On(c) => conn = Some(c),
                    Ready::Now => {}
                    Ready::GaveUp => {
                        return Err(gave_up(fin, attempt, e, "no working connection in time"))
                    }
                }
            }
            metrics::add(&metrics::FINALIZE_RETRIES, 1);
            tracing::warn!(job_id = fin.job.id, kind = %fin.job.kind, attempt, error = %e,
                "finalization failed; retrying in a new transaction");
            attempt += 1;
            continue;
        }
        return Err(gave_up(fin, attempt, e, "giving up"));
    }
}

fn gave_up(fin: &Finalization, attempt: u32, e: AwaError, why: &str) -> AwaError {
    metrics::add(&metrics::FINALIZE_GAVE_UP, 1);
    tracing::error!(job_id = fin.job.id, kind = %fin.job.kind, attempt, error = %e, why,
        "finalization failed; the job stays running until rescue");
    e
}

/// Backoff before retry `attempt` (1-based): attempt⁴ + 1 seconds plus up to 10 % jitter,
/// capped at a day.
pub fn retry_backoff(attempt: i32) -> std::time::Duration {
    let a = f64::from(attempt.max(1));
    let base = (a.powi(4) + 1.0).min(86_400.0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = f64::from(nanos % 1000) / 10_000.0;
    std::time::Duration::from_secs_f64(base * (1.0 + jitter))
}
