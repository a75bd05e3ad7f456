//! The executor: dispatchers claim jobs, runners execute handlers with a [`JobContext`], and
//! outcomes go to the finalizer.
//!
//! # Layout
//! - [`config`]: queue and runtime settings.
//! - [`context`]: what a handler sees (job, cancellation, progress, callbacks, staging).
//! - [`result`]: `JobResult`, `JobError`, and the executor's `Outcome`.
//! - `dispatcher`: one claim loop per queue; `claim_ahead`: when it claims, and how many
//!   beyond its free slots while the queue has a backlog.
//! - [`runner`]: runs one attempt (its buffer sealed the instant the handler returns, see
//!   [`sealed_on_return`]), maps the outcome to a transition and hands the [`Finalization`]
//!   to the finalizer's completer, which owns path choice and batching.
//!
//! [`Finalization`]: crate::finalizer::Finalization
//! - `listener`: LISTEN for wake-ups, cancel requests and callback resolutions.
//! - `heartbeat`, `inflight`, `callbacks`: bookkeeping for running attempts.
//! - `pool`: worker slots, and the global pool weighted queues share; `rate_limit`: a
//!   queue's claim token bucket.
//! - `runtime`: shared state, start and graceful shutdown.

pub mod callbacks;
pub(crate) mod claim_ahead;
pub mod config;
pub mod context;
pub(crate) mod dispatcher;
pub(crate) mod heartbeat;
pub(crate) mod inflight;
pub(crate) mod listener;
pub(crate) mod pool;
pub(crate) mod rate_limit;
pub(crate) mod registry;
pub mod result;
pub mod runner;
pub(crate) mod runtime;

use crate::model::JobArgs;
use context::JobContext;
use futures_util::future::BoxFuture;
use result::{HandlerResult, JobError, Outcome, Returned};
use std::future::Future;
use std::sync::Arc;

/// A handler written as a type (the alternative to a `register` closure). It can borrow the
/// context for the whole attempt, so it may call `ctx.enqueue_on_completion` directly.
pub trait Worker: Send + Sync + 'static {
    /// The kind this worker handles.
    fn kind(&self) -> String;
    /// Run one attempt.
    fn perform<'a>(&'a self, ctx: &'a JobContext) -> BoxFuture<'a, HandlerResult>;
}

/// A handler with its types erased: what the runtime stores per kind.
pub trait ErasedHandler: Send + Sync + 'static {
    /// Run one attempt. The future must seal `ctx`'s staging buffer at the instant the
    /// handler returns and hand its contents over in [`Returned`]: wrap the handler's future
    /// with [`sealed_on_return`] (the Python bridge seals in `finish()` instead).
    fn run(&self, ctx: Arc<JobContext>) -> BoxFuture<'static, Returned>;
}

/// `fut`'s outcome with `ctx`'s staging buffer sealed in the poll in which `fut` completes.
pub fn sealed_on_return(
    ctx: &JobContext,
    fut: impl Future<Output = Outcome> + Send + 'static,
) -> BoxFuture<'static, Returned> {
    let sealing = ctx.follow_ups.clone().seal_on_return(fut);
    Box::pin(async move {
        let (outcome, follow_ups) = sealing.await;
        Returned {
            outcome,
            follow_ups,
        }
    })
}

pub(crate) fn outcome_of(result: HandlerResult) -> Outcome {
    match result {
        Ok(r) => Outcome::Returned(r),
        Err(error) => Outcome::Failed {
            error,
            traceback: None,
        },
    }
}

/// A `register::<A, _, _>(|args, ctx| ...)` closure.
pub(crate) struct ClosureHandler<A, F> {
    f: F,
    _args: std::marker::PhantomData<fn() -> A>,
}

impl<A, F> ClosureHandler<A, F> {
    pub(crate) fn new(f: F) -> Self {
        ClosureHandler {
            f,
            _args: std::marker::PhantomData,
        }
    }
}

impl<A, F, Fut> ErasedHandler for ClosureHandler<A, F>
where
    A: JobArgs,
    F: Fn(A, &JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    fn run(&self, ctx: Arc<JobContext>) -> BoxFuture<'static, Returned> {
        match serde_json::from_value::<A>(ctx.job.args.clone()) {
            Ok(args) => {
                let fut = (self.f)(args, &ctx);
                sealed_on_return(&ctx, async move { outcome_of(fut.await) })
            }
            Err(e) => {
                let error = JobError::Terminal(format!("args do not decode as {}: {e}", A::kind()));
                sealed_on_return(&ctx, async move {
                    Outcome::Failed {
                        error,
                        traceback: None,
                    }
                })
            }
        }
    }
}

/// A [`Worker`] behind the erased interface.
pub(crate) struct WorkerHandler<W>(pub(crate) Arc<W>);

impl<W: Worker> ErasedHandler for WorkerHandler<W> {
    fn run(&self, ctx: Arc<JobContext>) -> BoxFuture<'static, Returned> {
        let w = self.0.clone();
        let inner = ctx.clone();
        sealed_on_return(&ctx, async move { outcome_of(w.perform(&inner).await) })
    }
}
