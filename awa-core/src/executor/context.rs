//! `JobContext`: what a running handler can see and do.

use crate::follow_ups::{FollowUps, StageError};
use crate::model::{EnqueueRequest, JobArgs, JobRow};
use crate::storage::pool::Db;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Application state registered with `ClientBuilder::state`, readable with `ctx.extract()`.
#[derive(Default, Clone)]
pub struct StateMap(Arc<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl StateMap {
    pub(crate) fn with(mut self, value: Arc<dyn Any + Send + Sync>, id: TypeId) -> Self {
        Arc::make_mut(&mut self.0).insert(id, value);
        self
    }
    fn get<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.0
            .get(&TypeId::of::<T>())
            .cloned()
            .and_then(|v| v.downcast::<T>().ok())
    }
}

/// The cancellation signal of one attempt: set by `cancel(job_id)` (via `awa:cancel`), by the
/// local deadline, or by shutdown.
#[derive(Debug, Default, Clone)]
pub struct CancelSignal {
    flag: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl CancelSignal {
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
    /// Resolves once cancelled.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// Progress written by the handler and not yet flushed: the whole document is flushed with
/// heartbeats and with the state change.
#[derive(Debug, Default)]
pub struct ProgressBuffer {
    pub(crate) value: Option<serde_json::Value>,
    pub(crate) dirty: bool,
}

/// A callback token returned by `register_callback`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackToken(pub String);

/// The context of one attempt.
pub struct JobContext {
    // Shared with the finalization, so handing the outcome over copies no row.
    pub(crate) job: Arc<JobRow>,
    pub(crate) pool: Db,
    pub(crate) follow_ups: FollowUps,
    pub(crate) cancel: CancelSignal,
    pub(crate) progress: Arc<Mutex<ProgressBuffer>>,
    pub(crate) state: StateMap,
    pub(crate) callbacks: crate::executor::callbacks::CallbackWaiters,
}

impl JobContext {
    /// The job row as claimed (state running, this attempt's lease).
    pub fn job(&self) -> &JobRow {
        &self.job
    }

    /// The pool, for the handler's own queries.
    pub fn pool(&self) -> &Db {
        &self.pool
    }

    /// Whether this attempt was asked to stop (cancel, deadline or shutdown).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when this attempt is asked to stop.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// Registered application state of type `T`.
    pub fn extract<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.state.get::<T>()
    }

    /// A cloneable handle for staging follow-ups, usable from futures that cannot borrow the
    /// context.
    pub fn follow_ups(&self) -> FollowUps {
        self.follow_ups.clone()
    }

    /// Shorthand for `self.follow_ups().enqueue_on_completion(request)`.
    pub fn enqueue_on_completion<F: JobArgs>(
        &self,
        request: impl Into<EnqueueRequest<F>>,
    ) -> Result<(), StageError> {
        self.follow_ups.enqueue_on_completion(request)
    }

    /// A snapshot of the progress document (kept across retries; cleared on completion).
    pub fn progress(&self) -> Option<serde_json::Value> {
        let buf = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        buf.value.clone()
    }

    /// Set progress: `{"percent": p, "message": m}` merged into the progress document. As in
    /// awa-pg the percent is a whole number: clamped to 0..=100 and rounded (NaN is 0).
    pub fn set_progress(&self, percent: f64, message: Option<&str>) -> Result<(), crate::AwaError> {
        let mut patch = serde_json::Map::new();
        let whole = if percent.is_nan() {
            0
        } else {
            // In 0..=100 after the clamp, so the cast is exact.
            percent.clamp(0.0, 100.0).round() as i64
        };
        patch.insert("percent".into(), serde_json::json!(whole));
        if let Some(m) = message {
            patch.insert("message".into(), serde_json::Value::String(m.to_string()));
        }
        self.merge_progress(patch)
    }

    /// Shallow-merge keys into the progress document's `metadata` object (checkpoints).
    pub fn update_metadata(
        &self,
        values: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), crate::AwaError> {
        let mut buf = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let mut doc = buf.value.clone().unwrap_or_else(|| serde_json::json!({}));
        let meta = doc
            .as_object_mut()
            .map(|o| o.entry("metadata").or_insert_with(|| serde_json::json!({})));
        if let Some(serde_json::Value::Object(m)) = meta {
            m.extend(values);
        }
        check_progress_size(&doc)?;
        buf.value = Some(doc);
        buf.dirty = true;
        Ok(())
    }

    fn merge_progress(
        &self,
        patch: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), crate::AwaError> {
        let mut buf = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let mut doc = buf.value.clone().unwrap_or_else(|| serde_json::json!({}));
        if let Some(o) = doc.as_object_mut() {
            o.extend(patch);
        }
        check_progress_size(&doc)?;
        buf.value = Some(doc);
        buf.dirty = true;
        Ok(())
    }

    /// Write buffered progress now (lease-guarded), instead of waiting for the heartbeat.
    pub async fn flush_progress(&self) -> Result<(), crate::AwaError> {
        let value = {
            let mut buf = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            if !buf.dirty {
                return Ok(());
            }
            buf.dirty = false;
            buf.value.clone()
        };
        match (self.pool.engine(), value) {
            (crate::storage::engine::Engine::QueueStorage(qs), Some(value)) => {
                qs.set_progress(&self.pool, self.job.id, self.job.run_lease, &value)
                    .await?;
            }
            (crate::storage::engine::Engine::QueueStorage(_), None) => {}
            (crate::storage::engine::Engine::Canonical, value) => {
                sqlx::query(
                    "UPDATE awa.canonical_jobs SET progress = $3
                     WHERE id = $1 AND run_lease = $2 AND state = 'running'",
                )
                .bind(self.job.id)
                .bind(self.job.run_lease)
                .bind(value)
                .execute(&self.pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Register a callback for this attempt; returns the token to hand to the external system.
    pub async fn register_callback(
        &self,
        timeout: std::time::Duration,
    ) -> Result<CallbackToken, crate::AwaError> {
        crate::storage::callbacks::register_callback(
            &self.pool,
            self.job.id,
            self.job.run_lease,
            timeout,
        )
        .await
    }

    /// Register a callback with CEL rules for `resolve_callback` (see
    /// [`crate::model::callback_rules`]); a bad expression is refused before anything is
    /// registered.
    pub async fn register_callback_with(
        &self,
        timeout: std::time::Duration,
        rules: &crate::model::CallbackRules,
    ) -> Result<CallbackToken, crate::AwaError> {
        crate::storage::callbacks::register_callback_with(
            &self.pool,
            self.job.id,
            self.job.run_lease,
            timeout,
            rules,
        )
        .await
    }

    /// Wait, inside the handler, until `resume_external` delivers a payload for `token`.
    /// The handler and its staged follow-ups stay alive across the wait.
    pub async fn wait_for_callback(
        &self,
        token: CallbackToken,
    ) -> Result<serde_json::Value, crate::AwaError> {
        self.callbacks
            .wait(&self.pool, &self.job, &token, &self.cancel)
            .await
    }
}

/// Progress is bounded so a runaway handler cannot bloat its row.
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;

fn check_progress_size(doc: &serde_json::Value) -> Result<(), crate::AwaError> {
    let len = serde_json::to_vec(doc).map(|v| v.len()).unwrap_or(0);
    if len > MAX_PROGRESS_BYTES {
        return Err(crate::AwaError::Validation(
            crate::ValidationError::TooLong {
                field: "progress",
                len,
                limit: MAX_PROGRESS_BYTES,
            },
        ));
    }
    Ok(())
}

impl JobContext {
    /// A cloneable cancellation signal, for `'static` futures that cannot borrow the context.
    pub fn cancel_signal(&self) -> CancelSignal {
        self.cancel.clone()
    }
}
