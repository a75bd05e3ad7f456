//! What a handler returns, and the named transition the executor turns it into.

use crate::follow_ups::{SealedFollowUps, StageError};
use std::time::Duration;

/// The longest delay a `RetryAfter` or `Snooze` outcome may ask for: 10 years (315,360,000
/// seconds). A longer one is not clamped: the attempt fails as a handler error naming the
/// limit (retried with backoff, like any handler error), so a unit mistake shows up at once
/// instead of parking a job for centuries. Python's `awa.RetryAfter`/`awa.Snooze` refuse such
/// values when constructed.
pub const MAX_OUTCOME_DELAY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A handler's successful outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum JobResult {
    /// Done. Staged follow-ups are inserted with the completion.
    Completed,
    /// Run again after this delay (at most [`MAX_OUTCOME_DELAY`]); burns an attempt.
    RetryAfter(Duration),
    /// Run again after this delay (at most [`MAX_OUTCOME_DELAY`]); does not burn an attempt.
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

/// Why an outcome's delay was refused (recorded on the job as the attempt's error).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OutcomeDelayError {
    /// Not a finite, non-negative number of seconds within the limit.
    #[error(
        "{field} must be a finite number of seconds from 0 to {limit} (10 years), got {got}",
        limit = MAX_OUTCOME_DELAY.as_secs()
    )]
    OutOfRange { field: &'static str, got: String },
}

/// Check an outcome's delay against [`MAX_OUTCOME_DELAY`].
pub fn check_outcome_delay(
    field: &'static str,
    delay: Duration,
) -> Result<Duration, OutcomeDelayError> {
    if delay > MAX_OUTCOME_DELAY {
        return Err(OutcomeDelayError::OutOfRange {
            field,
            got: format!("{} s", delay.as_secs()),
        });
    }
    Ok(delay)
}

/// An outcome's delay given as seconds (the Python boundary): finite, non-negative and within
/// [`MAX_OUTCOME_DELAY`], or refused.
pub fn outcome_delay_from_secs(
    field: &'static str,
    secs: f64,
) -> Result<Duration, OutcomeDelayError> {
    let refuse = || OutcomeDelayError::OutOfRange {
        field,
        got: format!("{secs}"),
    };
    if !secs.is_finite() || secs < 0.0 || secs > MAX_OUTCOME_DELAY.as_secs_f64() {
        return Err(refuse());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| refuse())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_beyond_the_limit_or_not_numbers_are_refused() {
        for bad in [
            1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -1.0,
            315_360_000.5,
        ] {
            let e = outcome_delay_from_secs("RetryAfter.seconds", bad).expect_err("refused");
            assert!(e.to_string().contains("RetryAfter.seconds"), "{e}");
            assert!(e.to_string().contains("315360000"), "{e}");
        }
        assert_eq!(
            outcome_delay_from_secs("Snooze.seconds", 315_360_000.0),
            Ok(MAX_OUTCOME_DELAY)
        );
        assert_eq!(
            outcome_delay_from_secs("Snooze.seconds", 0.0),
            Ok(Duration::ZERO)
        );
        assert!(check_outcome_delay("x", Duration::MAX).is_err());
        assert!(check_outcome_delay("x", MAX_OUTCOME_DELAY).is_ok());
    }
}
