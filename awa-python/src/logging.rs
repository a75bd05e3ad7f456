//! Engine `tracing` events → Python `logging` (logger `awa`).
//!
//! Events are formatted on the thread that emits them and handed to one forwarding thread,
//! which is the only place that takes the GIL for logging; no engine thread ever blocks on the
//! GIL while holding an engine lock. Args are never part of an engine event.

use pyo3::prelude::*;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// Python logging levels: 10 debug, 20 info, 30 warning, 40 error.
static MIN_LEVEL: AtomicU8 = AtomicU8::new(20);
static SENDER: OnceLock<mpsc::Sender<(u8, String)>> = OnceLock::new();

fn py_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        _ => 10,
    }
}

struct Fields(String, String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.1, " {}={:?}", field.name(), value);
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.1, " {}={}", field.name(), value);
        }
    }
}

struct PyLogLayer;

impl<S: Subscriber> Layer<S> for PyLogLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = py_level(event.metadata().level());
        if level < MIN_LEVEL.load(Ordering::Relaxed) {
            return;
        }
        let mut f = Fields(String::new(), String::new());
        event.record(&mut f);
        if let Some(tx) = SENDER.get() {
            let _ = tx.send((level, format!("{}{}", f.0, f.1)));
        }
    }
}

/// Install the layer (once per process) and set the minimum level forwarded.
pub fn install(min_level: u8) {
    MIN_LEVEL.store(min_level, Ordering::Relaxed);
    if SENDER.get().is_some() {
        return;
    }
    let (tx, rx) = mpsc::channel::<(u8, String)>();
    if SENDER.set(tx).is_err() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("awa-log".into())
        .spawn(move || {
            while let Ok((level, message)) = rx.recv() {
                // Not `attach`: an event sent while the interpreter shuts down (a script that
                // ended with a runtime still started) would make it panic on this thread.
                // Once Python is gone there is nowhere to log to, so the thread ends.
                let attached = Python::try_attach(|py| {
                    let logged = py
                        .import("logging")
                        .and_then(|m| m.call_method1("getLogger", ("awa",)))
                        .and_then(|l| l.call_method1("log", (level, message)));
                    if let Err(e) = logged {
                        e.print(py);
                    }
                });
                if attached.is_none() {
                    break;
                }
            }
        });
    let _ = tracing_subscriber::registry().with(PyLogLayer).try_init();
}

/// Forward engine events at or above `level` (a Python logging level) to logger `awa`.
#[pyfunction]
pub fn set_log_level(level: u8) {
    install(level);
}
