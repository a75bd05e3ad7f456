//! Rust futures as asyncio awaitables, with as few thread wake-ups as possible.
//!
//! pyo3-async-runtimes' `future_into_py` spawns the future on a tokio worker and, when it is
//! done, hands the result to a blocking-pool thread that takes the GIL and calls
//! `loop.call_soon_threadsafe`: three thread wake-ups per call. On this project's 2-core
//! machine that measured ~150 µs for a future that does nothing — a third of a single insert.
//! [`spawn`] instead:
//! 1. polls the future once on the calling thread (the event loop's, GIL released): a future
//!    that is ready at once (a batch of claimed jobs already waiting) never leaves the thread,
//!    and one that must wait has already sent its query when it moves to the runtime, so the
//!    worker's wake-up overlaps the database's work;
//! 2. when a spawned future finishes, the runtime thread pushes its result onto the loop's
//!    queue and writes one byte to a socket the loop watches (`add_reader`): runtime threads
//!    never take the GIL, and one wake-up carries every result that finished meanwhile;
//! 3. the loop thread converts each result to Python and resolves its asyncio future.
//!
//! Cancelling the asyncio future aborts the Rust task, as with `future_into_py`; a panic in the
//! Rust future becomes a `RuntimeError` instead of an awaitable that never resolves.

use futures_util::FutureExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::IntoPyObjectExt;
use std::any::Any;
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A finished future's output, turned into a Python object on the loop's thread.
type Convert = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// What a runtime thread leaves for the loop: the asyncio future and its result.
type Finished = (Py<PyAny>, Convert);

/// The part of a loop's bridge that runtime threads touch (no Python objects are used there).
struct Shared {
    finished: Mutex<Vec<Finished>>,
    /// Set while a wake-up byte is unread, so a burst of results costs one write.
    armed: AtomicBool,
    writer: UnixStream,
}

impl Shared {
    fn push(&self, item: Finished) {
        self.finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(item);
        if !self.armed.swap(true, Ordering::AcqRel) {
            // Non-blocking: a full socket already holds an unread wake-up.
            let _ = (&self.writer).write(&[1]);
        }
    }
}

/// One per event loop: the wake-up socket it watches and the queue of finished results.
#[pyclass(module = "awa._awa")]
pub struct LoopBridge {
    shared: Arc<Shared>,
    reader: UnixStream,
}

#[pymethods]
impl LoopBridge {
    /// The loop's reader callback: resolve every future whose result has arrived.
    fn drain(&self, py: Python<'_>) {
        let mut buf = [0u8; 64];
        while matches!((&self.reader).read(&mut buf), Ok(n) if n > 0) {}
        // Disarm before taking the queue: a push after the take writes a new wake-up.
        self.shared.armed.store(false, Ordering::Release);
        let items = std::mem::take(
            &mut *self
                .shared
                .finished
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for (future, convert) in items {
            resolve(py, future.bind(py), convert(py));
        }
    }
}

/// The asyncio future's done-callback: cancelling the awaitable aborts the Rust task.
#[pyclass(module = "awa._awa")]
struct AbortOnCancel {
    handle: tokio::task::AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.is_truthy()? {
            self.handle.abort();
        }
        Ok(())
    }
}

/// Run `fut` for the running event loop and return an asyncio future of its output.
pub fn spawn<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = pyo3_async_runtimes::get_running_loop(py)?;
    let future = event_loop.call_method0("create_future")?;
    let runtime = pyo3_async_runtimes::tokio::get_runtime();
    let mut work = Box::pin(AssertUnwindSafe(fut).catch_unwind());
    // The first poll, here. A waker is not needed: a future left pending is spawned, and the
    // runtime polls it again (registering its own waker) before it can miss anything.
    let first = py.detach(|| {
        let _context = runtime.enter();
        work.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    });
    if let Poll::Ready(out) = first {
        resolve(py, &future, convert(out)(py));
        return Ok(future);
    }
    let shared = bridge_for(py, &event_loop)?.borrow().shared.clone();
    let target = future.clone().unbind();
    let task = runtime.spawn(async move {
        let out = work.await;
        shared.push((target, convert(out)));
    });
    future.call_method1(
        "add_done_callback",
        (AbortOnCancel {
            handle: task.abort_handle(),
        },),
    )?;
    Ok(future)
}

fn convert<T>(out: Result<PyResult<T>, Box<dyn Any + Send>>) -> Convert
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    Box::new(move |py| match out {
        Ok(Ok(value)) => value.into_py_any(py),
        Ok(Err(err)) => Err(err),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(PyRuntimeError::new_err(format!(
                "awa: a native task panicked: {message}"
            )))
        }
    })
}

/// Set the result (or exception) unless the future is already done (cancelled).
fn resolve(py: Python<'_>, future: &Bound<'_, PyAny>, result: PyResult<Py<PyAny>>) {
    let done = future
        .call_method0("done")
        .and_then(|d| d.is_truthy())
        .unwrap_or(true);
    if done {
        return;
    }
    let set = match result {
        Ok(value) => future.call_method1("set_result", (value,)),
        Err(err) => future.call_method1("set_exception", (err.into_value(py),)),
    };
    if let Err(err) = set {
        err.write_unraisable(py, Some(future));
    }
}

/// The bridge of `event_loop`, created (and its socket registered) on first use.
fn bridge_for<'py>(
    py: Python<'py>,
    event_loop: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, LoopBridge>> {
    static BRIDGES: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let bridges = BRIDGES
        .get_or_try_init(py, || {
            py.import("weakref")?
                .getattr("WeakKeyDictionary")?
                .call0()
                .map(Bound::unbind)
        })?
        .bind(py);
    let known = bridges.call_method1("get", (event_loop,))?;
    if !known.is_none() {
        return Ok(known.cast_into::<LoopBridge>()?);
    }
    let (reader, writer) = UnixStream::pair()?;
    reader.set_nonblocking(true)?;
    writer.set_nonblocking(true)?;
    let fd = reader.as_raw_fd();
    let bridge = Bound::new(
        py,
        LoopBridge {
            shared: Arc::new(Shared {
                finished: Mutex::new(Vec::new()),
                armed: AtomicBool::new(false),
                writer,
            }),
            reader,
        },
    )?;
    event_loop.call_method1("add_reader", (fd, bridge.getattr("drain")?))?;
    bridges.set_item(event_loop, &bridge)?;
    Ok(bridge)
}
