//! `init_telemetry` / `shutdown_telemetry` (awa-pg's names and signatures) over
//! `awa_core::telemetry`, and `metric_series`, the per-kind/queue series for `/metrics`.

use crate::errors;
use awa_core::telemetry::TelemetryError;
use pyo3::prelude::*;
use std::time::Duration;

/// Export Awa's metrics over OTLP/gRPC to `endpoint` every `export_interval_ms`, as
/// `service_name`. Returns True once the exporter is set up (a collector that is not there
/// yet is retried each interval, not an error). Calling it again replaces the export.
#[pyfunction]
#[pyo3(signature = (endpoint, service_name, export_interval_ms = 5000))]
fn init_telemetry(
    py: Python<'_>,
    endpoint: String,
    service_name: String,
    export_interval_ms: i64,
) -> PyResult<bool> {
    let millis = u64::try_from(export_interval_ms).map_err(|_| {
        errors::ValidationError::new_err(format!(
            "export_interval_ms must be between 1 and 86400000, got {export_interval_ms}"
        ))
    })?;
    py.detach(|| {
        // The gRPC channel runs its connection on the runtime it was built in.
        let _guard = pyo3_async_runtimes::tokio::get_runtime().enter();
        awa_core::telemetry::init(&endpoint, &service_name, Duration::from_millis(millis))
    })
    .map_err(|e| match e {
        TelemetryError::Invalid(_) => errors::ValidationError::new_err(e.to_string()),
        TelemetryError::Exporter { .. } => errors::AwaError::new_err(e.to_string()),
    })
}

/// Export what is pending and stop (a no-op when nothing runs).
#[pyfunction]
fn shutdown_telemetry(py: Python<'_>) {
    py.detach(|| {
        let _guard = pyo3_async_runtimes::tokio::get_runtime().enter();
        awa_core::telemetry::shutdown();
    });
}

/// This process's job counters and timing histograms per (kind, queue), as JSON text.
#[pyfunction]
fn metric_series() -> PyResult<String> {
    serde_json::to_string(&serde_json::json!({
        "buckets": awa_core::metrics::series::BUCKETS,
        "series": awa_core::metrics::series::snapshot(),
    }))
    .map_err(|e| errors::AwaError::new_err(e.to_string()))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init_telemetry, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown_telemetry, m)?)?;
    m.add_function(wrap_pyfunction!(metric_series, m)?)?;
    Ok(())
}
