//! The Python worker bridge.
//!
//! Rust owns claiming, heartbeats and finalizing. Each claimed job of a Python kind becomes a
//! `NativeJobContext` pushed onto a channel; the Python pump awaits `next_batch()` — one wake-up
//! of the asyncio loop for every batch of claimed jobs — and runs each handler as a task. The
//! handler's outcome comes back through `ctx.finish(...)`, a plain synchronous call that only
//! resolves a oneshot channel, so handing outcomes back never wakes anything on the Python side.
//! The runner then seals the staging buffer and finalizes entirely in Rust.

use crate::bridge;
use crate::errors::{to_py, IntoPyResult, StagingError};
use awa_core::executor::context::CallbackToken;
use awa_core::executor::result::{outcome_delay_from_secs, Returned};
use awa_core::model::UntypedRequest;
use awa_core::{AwaError, ErasedHandler, JobContext, JobError, JobResult, Outcome, StageError};
use futures_util::future::BoxFuture;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};

type Pending = (Arc<JobContext>, oneshot::Sender<Returned>);

/// The handler registered for every Python kind: hands the job to the pump, awaits the outcome.
pub struct PyBridge {
    tx: mpsc::UnboundedSender<Pending>,
}

impl ErasedHandler for PyBridge {
    fn run(&self, ctx: Arc<JobContext>) -> BoxFuture<'static, Returned> {
        let (done_tx, done_rx) = oneshot::channel();
        let follow_ups = ctx.follow_ups();
        let sent = self.tx.send((ctx, done_tx));
        Box::pin(async move {
            let abandoned = |reason: &str| Returned {
                outcome: Outcome::Abandoned {
                    reason: reason.into(),
                },
                follow_ups: follow_ups.seal(),
            };
            if sent.is_err() {
                return abandoned("the Python worker stopped");
            }
            match done_rx.await {
                // Sealed by `finish()` on the event loop's thread.
                Ok(returned) => returned,
                Err(_) => abandoned("the Python handler was dropped"),
            }
        })
    }
}

pub fn bridge() -> (Arc<PyBridge>, mpsc::UnboundedReceiver<Pending>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Arc::new(PyBridge { tx }), rx)
}

/// A started worker: the pump's source of jobs, and shutdown.
#[pyclass(module = "awa._awa")]
pub struct NativeWorker {
    pub(crate) client: awa_core::Client,
    pub(crate) rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>>,
    pub(crate) closed: Arc<Notify>,
    pub(crate) is_closed: Arc<std::sync::atomic::AtomicBool>,
}

#[pymethods]
impl NativeWorker {
    /// Wait for claimed jobs; returns up to `max` contexts with their jobs as one JSON array
    /// (serialized here on the runtime, not on the event loop's thread under the GIL, and
    /// decoded by one `json.loads` per batch), or None once shut down.
    fn next_batch<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyAny>> {
        let rx = self.rx.clone();
        let closed = self.closed.clone();
        let is_closed = self.is_closed.clone();
        bridge::spawn(py, async move {
            let mut rx = rx.lock().await;
            if is_closed.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(None);
            }
            let first = tokio::select! {
                p = rx.recv() => p,
                _ = closed.notified() => None,
            };
            let Some(first) = first else { return Ok(None) };
            let mut batch = vec![NativeJobContext::new(first)];
            while batch.len() < max.max(1) {
                match rx.try_recv() {
                    Ok(p) => batch.push(NativeJobContext::new(p)),
                    Err(_) => break,
                }
            }
            let jobs: Vec<&awa_core::JobRow> = batch.iter().map(|c| c.ctx.job()).collect();
            let jobs_json = serde_json::to_string(&jobs)
                .map_err(AwaError::from)
                .py_err()?;
            Ok(Some((batch, jobs_json)))
        })
    }

    /// Graceful shutdown (see `Client::shutdown`); afterwards `next_batch` returns None.
    fn shutdown<'py>(&self, py: Python<'py>, timeout_ms: u64) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        let closed = self.closed.clone();
        let is_closed = self.is_closed.clone();
        bridge::spawn(py, async move {
            client.shutdown(Duration::from_millis(timeout_ms)).await;
            is_closed.store(true, std::sync::atomic::Ordering::SeqCst);
            closed.notify_waiters();
            closed.notify_one();
            Ok(())
        })
    }

    fn health_check<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        bridge::spawn(py, async move {
            let h = client.health_check().await.py_err()?;
            serde_json::to_string(&h).map_err(AwaError::from).py_err()
        })
    }
}

/// One running attempt, as the Python handler sees it.
#[pyclass(module = "awa._awa")]
pub struct NativeJobContext {
    ctx: Arc<JobContext>,
    done: Mutex<Option<oneshot::Sender<Returned>>>,
}

impl NativeJobContext {
    fn new((ctx, done): Pending) -> Self {
        NativeJobContext {
            ctx,
            done: Mutex::new(Some(done)),
        }
    }
}

#[pymethods]
impl NativeJobContext {
    /// The job row as JSON text.
    fn job_json(&self) -> PyResult<String> {
        serde_json::to_string(self.ctx.job())
            .map_err(AwaError::from)
            .py_err()
    }

    #[getter]
    fn job_id(&self) -> i64 {
        self.ctx.job().id
    }

    #[getter]
    fn kind(&self) -> String {
        self.ctx.job().kind.clone()
    }

    fn is_cancelled(&self) -> bool {
        self.ctx.is_cancelled()
    }

    #[pyo3(signature = (percent, message = None))]
    fn set_progress(&self, percent: f64, message: Option<String>) -> PyResult<()> {
        self.ctx.set_progress(percent, message.as_deref()).py_err()
    }

    /// Shallow-merge a JSON object (text) into the progress metadata.
    fn update_metadata(&self, values_json: String) -> PyResult<()> {
        let values: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&values_json)
            .map_err(AwaError::from)
            .py_err()?;
        self.ctx.update_metadata(values).py_err()
    }

    fn progress_json(&self) -> PyResult<Option<String>> {
        self.ctx
            .progress()
            .map(|p| serde_json::to_string(&p).map_err(AwaError::from).py_err())
            .transpose()
    }

    fn flush_progress<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ctx = self.ctx.clone();
        bridge::spawn(py, async move { ctx.flush_progress().await.py_err() })
    }

    /// Register a callback (with optional CEL rules); resolves to the callback id.
    #[pyo3(signature = (timeout_seconds, filter = None, on_complete = None, on_fail = None, transform = None))]
    fn register_callback<'py>(
        &self,
        py: Python<'py>,
        timeout_seconds: f64,
        filter: Option<String>,
        on_complete: Option<String>,
        on_fail: Option<String>,
        transform: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ctx = self.ctx.clone();
        let timeout = outcome_delay_from_secs("timeout_seconds", timeout_seconds)
            .map_err(|e| crate::errors::ValidationError::new_err(e.to_string()))?;
        let rules = awa_core::model::CallbackRules {
            filter,
            on_complete,
            on_fail,
            transform,
        };
        // Compile before going async, so a bad expression raises at the call.
        rules.validate().py_err()?;
        bridge::spawn(py, async move {
            Ok(ctx
                .register_callback_with(timeout, &rules)
                .await
                .py_err()?
                .0)
        })
    }

    /// `flush_progress` blocking the calling thread (a handler's worker thread; never the
    /// runtime's own threads, which this is not called from).
    fn flush_progress_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let ctx = self.ctx.clone();
        py.detach(|| {
            pyo3_async_runtimes::tokio::get_runtime()
                .block_on(async move { ctx.flush_progress().await })
        })
        .py_err()
    }

    /// Wait inside the handler for `resume_external`; returns the payload as JSON text.
    fn wait_for_callback<'py>(
        &self,
        py: Python<'py>,
        token: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ctx = self.ctx.clone();
        bridge::spawn(py, async move {
            let payload = ctx.wait_for_callback(CallbackToken(token)).await.py_err()?;
            serde_json::to_string(&payload)
                .map_err(AwaError::from)
                .py_err()
        })
    }

    /// Stage a follow-up (request JSON built by the package); raises StagingError.
    fn enqueue_on_completion(&self, request: String) -> PyResult<()> {
        let follow_ups = self.ctx.follow_ups();
        let staged = UntypedRequest::from_json(&request)
            .and_then(|r| r.opts().map(|o| (r, o)))
            .map_err(|e| follow_ups.record_failure(StageError::Invalid(e.to_string())))
            .and_then(|(r, opts)| follow_ups.enqueue_untyped(&r.kind, r.args, &opts));
        // Invalid requests surface as ValidationError so the package can raise StagingError
        // chained from it; limits and sealing are StagingError directly.
        staged.map_err(|e| match e {
            StageError::Invalid(_) => crate::errors::ValidationError::new_err(e.to_string()),
            other => StagingError::new_err(other.to_string()),
        })
    }

    /// Record a request that failed in Python before reaching the engine (poisons the attempt).
    fn record_staging_failure(&self, message: String) -> String {
        self.ctx
            .follow_ups()
            .record_failure(StageError::Invalid(message))
            .to_string()
    }

    /// Test seams (wheel built with the `test-seams` feature; see `awa_core::seams`):
    /// `"hold"` holds this attempt's runner once the outcome is handed over, `"held"` says
    /// whether it waits there, `"release"` lets it go on. Raises RuntimeError otherwise.
    fn test_seam(&self, action: &str) -> PyResult<bool> {
        test_seam(&self.ctx.follow_ups(), action)
    }

    /// Hand the outcome back. `outcome` is one of completed, retry_after, snooze, cancel,
    /// wait_for_callback, terminal, error, abandoned. Later calls are ignored.
    #[pyo3(signature = (outcome, value = None, seconds = None, traceback = None))]
    fn finish(
        &self,
        outcome: &str,
        value: Option<String>,
        seconds: Option<f64>,
        traceback: Option<String>,
    ) -> PyResult<bool> {
        let text = || value.clone().unwrap_or_default();
        // A delay the package did not refuse (a mutated or subclassed RetryAfter/Snooze) fails
        // the attempt as a handler error naming the field and the limit: never a panic, and
        // never a job left running with its slot held.
        let delayed =
            |field: &'static str, make: fn(Duration) -> JobResult| match outcome_delay_from_secs(
                field,
                seconds.unwrap_or(0.0),
            ) {
                Ok(d) => Outcome::Returned(make(d)),
                Err(e) => Outcome::Panicked {
                    message: format!("invalid outcome: {e}"),
                    traceback: None,
                },
            };
        let out = match outcome {
            "completed" => Outcome::Returned(JobResult::Completed),
            "retry_after" => delayed("RetryAfter.seconds", JobResult::RetryAfter),
            "snooze" => delayed("Snooze.seconds", JobResult::Snooze),
            "cancel" => Outcome::Returned(JobResult::Cancel(text())),
            "wait_for_callback" => {
                Outcome::Returned(JobResult::WaitForCallback(CallbackToken(text())))
            }
            "terminal" => Outcome::Failed {
                error: JobError::Terminal(text()),
                traceback,
            },
            "error" => Outcome::Panicked {
                message: text(),
                traceback,
            },
            "abandoned" => Outcome::Abandoned { reason: text() },
            other => {
                return Err(to_py(AwaError::Config(format!(
                    "unknown outcome {other:?}"
                ))))
            }
        };
        let sender = self.done.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(match sender {
            Some(s) => {
                // Seal here, synchronously on the event loop's thread: the package calls
                // finish() with no await after the handler's coroutine returned, so no other
                // task has run since, and every later enqueue_on_completion gets Sealed.
                let follow_ups = self.ctx.follow_ups().seal();
                s.send(Returned {
                    outcome: out,
                    follow_ups,
                })
                .is_ok()
            }
            None => false,
        })
    }
}

#[cfg(feature = "test-seams")]
fn test_seam(follow_ups: &awa_core::FollowUps, action: &str) -> PyResult<bool> {
    use awa_core::seams;
    match action {
        "hold" => seams::hold_after_return(follow_ups),
        "held" => return Ok(seams::is_held(follow_ups)),
        "release" => seams::release(follow_ups),
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "unknown test seam action {other:?}"
            )))
        }
    }
    Ok(true)
}

#[cfg(not(feature = "test-seams"))]
fn test_seam(_follow_ups: &awa_core::FollowUps, _action: &str) -> PyResult<bool> {
    Err(pyo3::exceptions::PyRuntimeError::new_err(
        "this build of awa._awa has no test seams (build with --features test-seams)",
    ))
}

type WorkOne = tokio::task::JoinHandle<Result<awa_core::testing::WorkResult, AwaError>>;

/// One `work_one` run: the context for the Python handler, and the finalization result.
#[pyclass(module = "awa._awa")]
pub struct NativeTestRun {
    context: Mutex<Option<NativeJobContext>>,
    finished: Mutex<Option<awa_core::testing::WorkResult>>,
    handle: Arc<tokio::sync::Mutex<Option<WorkOne>>>,
}

impl NativeTestRun {
    pub fn finished(result: awa_core::testing::WorkResult) -> Self {
        NativeTestRun {
            context: Mutex::new(None),
            finished: Mutex::new(Some(result)),
            handle: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    pub fn running(pending: Option<Pending>, handle: WorkOne) -> Self {
        NativeTestRun {
            context: Mutex::new(pending.map(NativeJobContext::new)),
            finished: Mutex::new(None),
            handle: Arc::new(tokio::sync::Mutex::new(Some(handle))),
        }
    }
}

#[pymethods]
impl NativeTestRun {
    /// The context to run the handler with (None when no job was available).
    fn take_context(&self) -> Option<NativeJobContext> {
        self.context
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Await the finalization; returns the WorkResult as JSON text.
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let done = self
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let handle = self.handle.clone();
        bridge::spawn(py, async move {
            let result = match done {
                Some(r) => r,
                None => {
                    let h = handle.lock().await.take();
                    match h {
                        Some(h) => h
                            .await
                            .map_err(|e| AwaError::State(e.to_string()))
                            .and_then(|r| r)
                            .py_err()?,
                        None => {
                            return Err(to_py(AwaError::State(
                                "work_one result already taken".into(),
                            )))
                        }
                    }
                }
            };
            serde_json::to_string(&result)
                .map_err(AwaError::from)
                .py_err()
        })
    }
}
