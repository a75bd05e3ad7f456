//! The native module `awa._awa`: thin bindings over `awa-core`.
//!
//! # Layout
//! - `callback_contract`: `X-Awa-Signature` signing/checking and receiver URLs (awa-pg's names).
//! - `bridge`: Rust futures as asyncio awaitables (one eager poll, one wake-up socket per loop).
//! - `errors`: exception classes and the one engine-error → exception mapping.
//! - `convert`: Python values ↔ SQL parameters and result rows.
//! - `client`: `NativeClient` (pool, migrate, insert, admin reads).
//! - `transaction`: `NativeTransaction` (caller-owned transactions).
//! - `driver`: `awa.bridge`'s validated insert statement for the application's own driver.
//! - `cron`: periodic jobs (registration checks, upsert at start, schedule operations).
//! - `start_config`: `start()`'s settings (JSON from the package) as engine configs.
//! - `worker`: the Python worker bridge (`NativeWorker`, `NativeJobContext`).
//! - `logging`: engine `tracing` events forwarded to Python's `logging`.
//! - `ops`: the embedded migration scripts for the `awa` command line.
//! - `telemetry`: the OTLP metrics export (`init_telemetry`) and the per-kind/queue series.

mod bridge;
mod callback_contract;
mod client;
mod convert;
mod cron;
mod driver;
mod errors;
mod logging;
mod ops;
mod start_config;
mod telemetry;
mod transaction;
mod worker;

use pyo3::prelude::*;

/// Snake-case kind for a class name (`SMTPEmail` → `smtp_email`).
#[pyfunction]
fn derive_kind(name: &str) -> String {
    awa_core::derive_kind(name)
}

/// Validate a staging request exactly as `enqueue_on_completion` would and return its
/// serialized size in bytes; used by `awa.testing.HandlerJob` without a database.
#[pyfunction]
fn stage_check(request: String) -> PyResult<usize> {
    let job = awa_core::model::UntypedRequest::from_json(&request)
        .and_then(awa_core::model::UntypedRequest::into_new_job)
        .map_err(|e| errors::StagingError::new_err(format!("invalid follow-up: {e}")))?;
    Ok(job.serialized_size())
}

/// Release the GIL briefly so that the logging forwarder (the one native thread that takes the
/// GIL; awaitables resolve on the loop's thread, see `bridge`) is done before the interpreter
/// finalizes. Registered with `atexit`
/// by the package: a native thread still inside the GIL when finalization starts aborts the
/// process.
#[pyfunction]
fn quiesce(py: Python<'_>, millis: u64) {
    py.detach(|| std::thread::sleep(std::time::Duration::from_millis(millis)));
}

#[pymodule]
fn _awa(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    callback_contract::register(m)?;
    cron::register(m)?;
    ops::register(m)?;
    telemetry::register(m)?;
    m.add_class::<client::NativeClient>()?;
    m.add_class::<transaction::NativeTransaction>()?;
    m.add_class::<worker::NativeWorker>()?;
    m.add_class::<worker::NativeJobContext>()?;
    m.add_class::<worker::NativeTestRun>()?;
    m.add_function(wrap_pyfunction!(logging::set_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(stage_check, m)?)?;
    m.add_function(wrap_pyfunction!(client::check_setting, m)?)?;
    m.add_function(wrap_pyfunction!(client::check_descriptor, m)?)?;
    m.add_function(wrap_pyfunction!(client::migrations, m)?)?;
    m.add_function(wrap_pyfunction!(client::migrations_range, m)?)?;
    m.add_function(wrap_pyfunction!(client::current_migration_version, m)?)?;
    m.add_function(wrap_pyfunction!(quiesce, m)?)?;
    m.add_function(wrap_pyfunction!(driver::driver_insert, m)?)?;
    m.add_function(wrap_pyfunction!(driver::driver_error, m)?)?;
    m.add(
        "MAX_STAGED_FOLLOW_UPS",
        awa_core::follow_ups::MAX_STAGED_FOLLOW_UPS,
    )?;
    m.add("MAX_STAGED_BYTES", awa_core::follow_ups::MAX_STAGED_BYTES)?;
    m.add("MAX_JSON_DEPTH", awa_core::model::MAX_JSON_DEPTH)?;
    m.add_function(wrap_pyfunction!(derive_kind, m)?)?;
    // The longest RetryAfter/Snooze delay, in seconds (awa_core's MAX_OUTCOME_DELAY).
    m.add(
        "MAX_OUTCOME_DELAY_SECONDS",
        awa_core::executor::result::MAX_OUTCOME_DELAY.as_secs(),
    )?;
    // Whether NativeJobContext.test_seam works (the `test-seams` feature).
    m.add("TEST_SEAMS", cfg!(feature = "test-seams"))?;
    m.add(
        "SCHEMA_VERSION",
        awa_core::storage::migrations::latest_version(),
    )?;
    Ok(())
}
