//! What a handler returns, and the named transition the executor turns it into.

use crate::follow_ups::{SealedFollowUps, StageError};
use std::time::Duration;

/// A handler's successful outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum JobResult {
    /// Done. Staged follow-ups are inserted with the completion.
    Completed,
    /// Run again after this delay; burns an attempt.
    RetryAfter(Duration),
    /// Run again after this delay; does not burn an attempt.
    Snooze(Duration),
    /// Stop for good, recording the reason.
    Cancel(String),
    /// Park the job in `waiting_external` until the callback resolves; frees the worker slot.
    WaitForCallback(crate::executor::context::CallbackToken),
}

/// A handler's failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobError {
    /// Retry with backoff (or fail once attempts are exhausted).
    #[error("{0}")]
    Retryable(String),
    /// Fail now without retrying.
    #[error("{0}")]
    Terminal(String),
}

impl JobError {
    pub fn retryable(e: impl std::fmt::Display) -> Self {
        JobError::Retryable(e.to_string())
    }
    pub fn terminal(e: impl std::fmt::Display) -> Self {
        JobError::Terminal(e.to_string())
    }
}

impl From<StageError> for JobError {
    /// A staging error fails the attempt terminally by default; map `TooMany`/`TooLarge` to
    /// [`JobError::Retryable`] yourself when the fan-out varies between attempts.
    fn from(e: StageError) -> Self {
        JobError::Terminal(e.to_string())
    }
}

/// A handler's full return value.
pub type HandlerResult = Result<JobResult, JobError>;

/// What ended an attempt, as the executor reports it. Python handlers report the same set.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Returned(JobResult),
    Failed {
        error: JobError,
        traceback: Option<String>,
    },
    /// The handler panicked (Rust) or raised an unexpected exception (Python): retryable.
    Panicked {
        message: String,
        traceback: Option<String>,
    },
    /// The handler was abandoned (deadline or shutdown) before it returned: nothing is
    /// finalized; rescue re-runs the job.
    Abandoned {
        reason: String,
    },
}

/// What a handler hands over when it returns: its outcome, and its staging buffer sealed at
/// that instant (ADR-046, "Lifetime of the staging buffer"). Built by
/// [`crate::executor::sealed_on_return`] for Rust handlers and by the Python bridge's
/// `finish()`, on the event loop's thread, for Python ones.
#[derive(Debug)]
pub struct Returned {
    pub outcome: Outcome,
    pub follow_ups: SealedFollowUps,
}
