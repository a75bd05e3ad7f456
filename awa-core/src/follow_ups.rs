//! Handler-staged follow-up jobs (ADR-046).
//!
//! A handler stages follow-ups on its context while it runs. Each request is validated in full
//! when staged (serialization, the insert rules, the unique key, the limits), so nothing
//! predictable can fail inside the completion transaction. The executor seals the buffer the
//! moment the handler returns and hands the sealed contents to the finalizer, which inserts them
//! in the transaction that completes the attempt — or drops them on every other outcome.
//!
//! A failed stage *poisons* the attempt: if the handler still returns `Completed`, the executor
//! fails the attempt terminally with the staging error, so a swallowed error cannot let the job
//! complete without the follow-up it asked for.

use crate::model::{validate, EnqueueRequest, InsertOpts, JobArgs, NewJob};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

/// At most this many follow-ups per attempt (see the ADR's subtransaction-cache argument).
pub const MAX_STAGED_FOLLOW_UPS: usize = 16;
/// At most this many bytes of serialized requests per attempt.
pub const MAX_STAGED_BYTES: usize = 64 * 1024;

/// Why a follow-up could not be staged. Converts to a terminal job error by default.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// The args or metadata would not serialize or failed validation.
    #[error("invalid follow-up: {0}")]
    Invalid(String),
    /// This attempt already staged the maximum number of follow-ups.
    #[error("too many staged follow-ups: the limit is {limit} per attempt")]
    TooMany { limit: usize },
    /// This request would take the attempt's staged bytes past the limit.
    #[error("staged follow-ups too large: the limit is {limit_bytes} bytes per attempt")]
    TooLarge { limit_bytes: usize },
    /// The handler already returned; its follow-ups were taken when it did.
    #[error("the handler already returned; follow-ups can no longer be staged")]
    Sealed,
}

/// One validated follow-up, plus the span that was current when it was staged so that the
/// insert (and job B) joins the trace of A's handler.
#[derive(Debug, Clone)]
pub struct StagedFollowUp {
    pub job: NewJob,
    pub span: tracing::Span,
}

/// What the executor takes from the buffer when the handler returns.
#[derive(Debug, Default, Clone)]
pub struct SealedFollowUps {
    pub follow_ups: Vec<StagedFollowUp>,
    /// The first staging error of the attempt, if any.
    pub poison: Option<StageError>,
}

impl SealedFollowUps {
    pub fn is_empty(&self) -> bool {
        self.follow_ups.is_empty()
    }
}

#[derive(Debug, Default)]
struct Inner {
    staged: Vec<StagedFollowUp>,
    bytes: usize,
    sealed: bool,
    poison: Option<StageError>,
}

/// The per-attempt staging buffer. Created with the attempt's context and sealed once.
#[derive(Debug, Default)]
pub struct StagingBuffer {
    inner: Mutex<Inner>,
}

impl StagingBuffer {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave Inner half-updated (every update is a
        // single push or assignment), so a poisoned mutex is still safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stage a prepared request, or record why it could not be staged.
    fn stage(&self, prepared: Result<NewJob, StageError>) -> Result<(), StageError> {
        let mut inner = self.lock();
        if inner.sealed {
            return Err(StageError::Sealed);
        }
        let result = prepared.and_then(|job| {
            if inner.staged.len() >= MAX_STAGED_FOLLOW_UPS {
                return Err(StageError::TooMany {
                    limit: MAX_STAGED_FOLLOW_UPS,
                });
            }
            let size = job.serialized_size();
            if inner.bytes + size > MAX_STAGED_BYTES {
                return Err(StageError::TooLarge {
                    limit_bytes: MAX_STAGED_BYTES,
                });
            }
            inner.bytes += size;
            inner.staged.push(StagedFollowUp {
                job,
                span: tracing::Span::current(),
            });
            Ok(())
        });
        if let Err(e) = &result {
            if inner.poison.is_none() {
                inner.poison = Some(e.clone());
            }
        }
        result
    }

    /// Seal the buffer and take its contents. Later stages fail with [`StageError::Sealed`].
    pub fn seal(&self) -> SealedFollowUps {
        let mut inner = self.lock();
        inner.sealed = true;
        inner.bytes = 0;
        SealedFollowUps {
            follow_ups: std::mem::take(&mut inner.staged),
            poison: inner.poison.take(),
        }
    }

    /// Number staged so far (for diagnostics).
    pub fn len(&self) -> usize {
        self.lock().staged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A cloneable handle to the attempt's staging buffer, usable from futures that cannot
/// borrow the context.
#[derive(Debug, Clone, Default)]
pub struct FollowUps {
    buffer: Arc<StagingBuffer>,
}

impl FollowUps {
    /// A handle to a new, empty buffer.
    pub fn new() -> Self {
        FollowUps::default()
    }

    /// Stage a typed follow-up, inserted if and only if this attempt's completion commits.
    pub fn enqueue_on_completion<F: JobArgs>(
        &self,
        request: impl Into<EnqueueRequest<F>>,
    ) -> Result<(), StageError> {
        let request = request.into();
        let prepared = serde_json::to_value(&request.args)
            .map_err(|e| StageError::Invalid(format!("args do not serialize: {e}")))
            .and_then(|args| {
                validate(&F::kind(), args, &request.opts)
                    .map_err(|e| StageError::Invalid(e.to_string()))
            });
        self.buffer.stage(prepared)
    }

    /// Stage an untyped follow-up (kind and JSON args); what the Python binding calls.
    pub fn enqueue_untyped(
        &self,
        kind: &str,
        args: serde_json::Value,
        opts: &InsertOpts,
    ) -> Result<(), StageError> {
        let prepared = validate(kind, args, opts).map_err(|e| StageError::Invalid(e.to_string()));
        self.buffer.stage(prepared)
    }

    /// Record a request that failed before it reached the engine (for example Python args that
    /// did not convert to JSON), so it poisons the attempt like any other failed stage.
    pub fn record_failure(&self, error: StageError) -> StageError {
        match self.buffer.stage(Err(error)) {
            Err(e) => e,
            Ok(()) => StageError::Invalid("staging failure recorded".into()),
        }
    }

    /// Seal the buffer and take its contents (the executor does this the instant the handler
    /// returns; a second call returns nothing).
    pub fn seal(&self) -> SealedFollowUps {
        self.buffer.seal()
    }

    /// Wrap a handler's future so that the buffer is sealed in the very poll in which the
    /// future completes: no task the handler spawned can stage between its return and the
    /// seal, whichever thread it runs on and however long the outcome takes to reach the
    /// finalizer.
    pub async fn seal_on_return<F: Future>(self, fut: F) -> (F::Output, SealedFollowUps) {
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| fut.as_mut().poll(cx).map(|out| (out, self.seal()))).await
    }

    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// An identity of the attempt's buffer, shared by every clone (keys the test seams).
    #[cfg_attr(not(feature = "test-seams"), allow(dead_code))]
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.buffer) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct StageB {
        item_id: i64,
        pad: String,
    }
    impl JobArgs for StageB {}

    fn b(i: i64) -> StageB {
        StageB {
            item_id: i,
            pad: String::new(),
        }
    }

    #[test]
    fn sixteen_fit_and_the_seventeenth_poisons() {
        let f = FollowUps::new();
        for i in 0..16 {
            f.enqueue_on_completion(b(i)).expect("within the limit");
        }
        assert_eq!(
            f.enqueue_on_completion(b(16)),
            Err(StageError::TooMany { limit: 16 })
        );
        let sealed = f.seal();
        assert_eq!(sealed.follow_ups.len(), 16);
        assert_eq!(sealed.poison, Some(StageError::TooMany { limit: 16 }));
    }

    #[test]
    fn exactly_64_kib_fits_and_one_byte_more_does_not() {
        // kind "stage_b" (7) + queue "default" (7) + args + metadata "{}" (2).
        let fixed = 7 + 7 + 2 + serde_json::to_vec(&b(1)).map(|v| v.len()).unwrap_or(0);
        let pad = "x".repeat(MAX_STAGED_BYTES - fixed);
        let f = FollowUps::new();
        f.enqueue_on_completion(StageB {
            item_id: 1,
            pad: pad.clone(),
        })
        .expect("exactly at the limit");
        assert!(f.seal().poison.is_none());

        let g = FollowUps::new();
        let over = StageB {
            item_id: 1,
            pad: format!("{pad}x"),
        };
        assert_eq!(
            g.enqueue_on_completion(over),
            Err(StageError::TooLarge {
                limit_bytes: MAX_STAGED_BYTES
            })
        );
        let sealed = g.seal();
        assert!(sealed.follow_ups.is_empty());
        assert!(sealed.poison.is_some());
    }

    #[test]
    fn invalid_requests_poison_and_sealed_buffers_refuse() {
        let f = FollowUps::new();
        let bad = EnqueueRequest::new(b(1)).priority(9);
        assert!(matches!(
            f.enqueue_on_completion(bad),
            Err(StageError::Invalid(_))
        ));
        f.enqueue_on_completion(b(2))
            .expect("a later valid stage still stages");
        let sealed = f.seal();
        assert_eq!(sealed.follow_ups.len(), 1);
        assert!(matches!(sealed.poison, Some(StageError::Invalid(_))));
        assert_eq!(f.enqueue_on_completion(b(3)), Err(StageError::Sealed));
        assert!(f.seal().follow_ups.is_empty());
    }

    #[test]
    fn clones_share_one_buffer() {
        let f = FollowUps::new();
        let g = f.clone();
        g.enqueue_on_completion(b(1)).expect("stage");
        assert_eq!(f.len(), 1);
    }
}
