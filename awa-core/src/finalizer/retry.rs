//! When and how a failed finalization is tried again.
//!
//! Two kinds of failure are worth another try, in a new transaction with the same sealed
//! follow-ups (ADR-046, "Finalize retries reuse the same follow-ups"):
//! - a **conflict** (deadlock `40P01`, serialization failure `40001`): PostgreSQL aborted the
//!   transaction; it is retried at once;
//! - a **lost connection** (I/O error, pool timeout, a server that is shutting down or
//!   starting: `57P01`–`57P03`, SQLSTATE class `08`): the server may be restarting, so the
//!   retry first waits until the pool hands out a connection that answers a ping, with
//!   bounded exponential backoff, and then runs on that very connection.
//!
//! Either way a finalization is tried at most [`MAX_FINALIZE_ATTEMPTS`] times. The time spent
//! waiting for a connection is bounded by [`RetryPolicy::reconnect_budget`] per finalization
//! (default [`DEFAULT_RECONNECT_BUDGET`]), which the runtime keeps below half the heartbeat
//! staleness window: the jobs stay in the in-flight set, and so keep being heartbeated, until
//! their finalization ends, and a wait that outlived the window would let rescue re-run an
//! attempt that already executed. A commit whose acknowledgement was lost replays as stale:
//! its guard `(id, state = 'running', run_lease)` no longer matches, so nothing is inserted
//! twice.
//!
//! [`MAX_FINALIZE_ATTEMPTS`]: crate::finalizer::MAX_FINALIZE_ATTEMPTS

use crate::error::AwaError;
use crate::storage::pool::Db;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Postgres};
use std::time::Duration;
use tokio::time::Instant;

/// Default [`RetryPolicy::reconnect_budget`]: enough for a fast PostgreSQL restart or a
/// fail-over of a local replica, far below the default heartbeat staleness (90 s).
pub const DEFAULT_RECONNECT_BUDGET: Duration = Duration::from_secs(5);

/// First pause between two connection attempts; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// Longest pause between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Longest one connection attempt (acquire and ping) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How a finalization retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total time one finalization may spend waiting for the pool to hand out a working
    /// connection after lost connections. Zero: retry at once, without waiting.
    pub reconnect_budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            reconnect_budget: DEFAULT_RECONNECT_BUDGET,
        }
    }
}

impl RetryPolicy {
    /// The policy for a runtime whose heartbeats go stale after `staleness`: the budget is
    /// capped at half of it.
    pub(crate) fn within_staleness(self, staleness: Duration) -> Self {
        RetryPolicy {
            reconnect_budget: self.reconnect_budget.min(staleness / 2),
        }
    }
}

/// What a failure means for a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Deadlock or serialization failure: retry at once.
    Conflict,
    /// The connection broke (or none could be had): wait for a working one, then retry.
    ConnectionLost,
    /// Anything else: do not retry.
    Permanent,
}

/// Classify a database error.
pub(crate) fn classify_sqlx(e: &sqlx::Error) -> Failure {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => Failure::ConnectionLost,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("40P01") | Some("40001") => Failure::Conflict,
            // admin_shutdown, crash_shutdown, cannot_connect_now; connection exceptions.
            Some("57P01") | Some("57P02") | Some("57P03") => Failure::ConnectionLost,
            Some(code) if code.starts_with("08") => Failure::ConnectionLost,
            _ => Failure::Permanent,
        },
        _ => Failure::Permanent,
    }
}

/// Classify an engine error (only database errors are retried).
pub(crate) fn classify(e: &AwaError) -> Failure {
    match e {
        AwaError::Database(e) => classify_sqlx(e),
        _ => Failure::Permanent,
    }
}

/// What a retry after a lost connection runs on.
pub(crate) enum Ready {
    /// A connection that just answered a ping.
    On(PoolConnection<Postgres>),
    /// No budget: retry at once on whatever the pool hands out.
    Now,
    /// The budget is spent without a working connection: give up.
    GaveUp,
}

/// The reconnect budget of one finalization, spent across its retries.
pub(crate) struct Reconnect {
    until: Instant,
    budget: Duration,
}

impl Reconnect {
    pub(crate) fn start(policy: &RetryPolicy) -> Self {
        Reconnect {
            until: Instant::now() + policy.reconnect_budget,
            budget: policy.reconnect_budget,
        }
    }

    /// Wait until the pool hands out a connection that answers a ping, backing off
    /// exponentially, and return it for the retry to run on.
    pub(crate) async fn working_connection(&self, pool: &Db) -> Ready {
        if self.budget.is_zero() {
            return Ready::Now;
        }
        let mut backoff = FIRST_BACKOFF;
        loop {
            let left = self.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ready::GaveUp;
            }
            let attempt = async {
                let mut conn = pool.acquire().await?;
                match conn.ping().await {
                    Ok(()) => Ok(conn),
                    Err(e) => {
                        // Dead: let the pool open a replacement instead of handing it out.
                        let _ = conn.close().await;
                        Err(e)
                    }
                }
            };
            match tokio::time::timeout(left.min(CONNECT_TIMEOUT), attempt).await {
                Ok(Ok(conn)) => return Ready::On(conn),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "waiting for a working database connection")
                }
                Err(_) => tracing::debug!("waiting for a working database connection: timed out"),
            }
            let left = self.until.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff.min(left)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
