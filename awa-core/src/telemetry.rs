//! OpenTelemetry metrics over OTLP/gRPC, with awa-pg's instrument names (feature `otlp`).
//!
//! [`init`] installs a meter provider that exports every `export_interval` to a collector's
//! gRPC endpoint (awa-pg's `init_telemetry` contract: `http://localhost:4317`, a service
//! name); from then on every job event and timing of [`crate::metrics::series`] is also
//! recorded on its OTel instrument, attributed `awa.job.kind` and `awa.job.queue` as awa-pg
//! attributes them. [`shutdown`] exports what is pending and stops. Without `init`, recording
//! costs one uncontended read lock.
//!
//! Why the official crates (`opentelemetry`, `opentelemetry_sdk`, `opentelemetry-otlp` with
//! tonic): OTLP/gRPC is HTTP/2 plus protobuf, far past hand-writing, and these are the
//! crates awa-pg itself exports with, so a collector sees the same wire format.

use crate::metrics::series::{JobEvent, Timing};
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid telemetry setting: {0}")]
    Invalid(String),
    #[error("failed to build the OTLP metric exporter for {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
}

/// awa-pg's instrument name of each job event.
fn instrument_name(event: JobEvent) -> &'static str {
    match event {
        JobEvent::Inserted => "awa.job.inserted",
        JobEvent::Claimed => "awa.job.claimed",
        JobEvent::Completed => "awa.job.completed",
        JobEvent::Failed => "awa.job.failed",
        JobEvent::Retried => "awa.job.retried",
        JobEvent::Cancelled => "awa.job.cancelled",
        JobEvent::Snoozed => "awa.job.snoozed",
        JobEvent::WaitingExternal => "awa.job.waiting_external",
        JobEvent::Rescued => "awa.maintenance.rescues",
        JobEvent::DlqMoved => "awa.job.dlq_moved",
    }
}

fn instrument_description(event: JobEvent) -> &'static str {
    match event {
        JobEvent::Inserted => "Number of jobs inserted",
        JobEvent::Claimed => "Number of jobs claimed for execution",
        JobEvent::Completed => "Number of jobs completed successfully",
        JobEvent::Failed => "Number of jobs that failed terminally",
        JobEvent::Retried => "Number of jobs marked retryable",
        JobEvent::Cancelled => "Number of jobs cancelled",
        JobEvent::Snoozed => "Number of jobs snoozed",
        JobEvent::WaitingExternal => "Number of jobs parked for external callback",
        JobEvent::Rescued => "Number of jobs rescued by maintenance",
        JobEvent::DlqMoved => "Number of jobs moved into the Dead Letter Queue",
    }
}

struct Instruments {
    provider: SdkMeterProvider,
    events: Vec<(JobEvent, Counter<u64>)>,
    duration: Histogram<f64>,
    wait: Histogram<f64>,
}

fn active() -> &'static RwLock<Option<Arc<Instruments>>> {
    static ACTIVE: RwLock<Option<Arc<Instruments>>> = RwLock::new(None);
    &ACTIVE
}

fn current() -> Option<Arc<Instruments>> {
    active().read().unwrap_or_else(|e| e.into_inner()).clone()
}

fn attributes(kind: &str, queue: &str) -> [KeyValue; 2] {
    [
        KeyValue::new("awa.job.kind", kind.to_owned()),
        KeyValue::new("awa.job.queue", queue.to_owned()),
    ]
}

/// Start exporting to `endpoint` (OTLP/gRPC) every `export_interval`, as `service_name`.
/// Must be called inside a Tokio runtime (the gRPC channel runs its connection there).
/// Replaces (and shuts down) a previous export. Returns `true` once the exporter is set up;
/// an unreachable collector is not an error here (exports retry each interval and are logged).
pub fn init(
    endpoint: &str,
    service_name: &str,
    export_interval: Duration,
) -> Result<bool, TelemetryError> {
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(TelemetryError::Invalid(format!(
            "endpoint must be an http:// or https:// URL, got {endpoint:?}"
        )));
    }
    if service_name.trim().is_empty() {
        return Err(TelemetryError::Invalid(
            "service_name must not be empty".into(),
        ));
    }
    if export_interval.is_zero() || export_interval > Duration::from_secs(24 * 3600) {
        return Err(TelemetryError::Invalid(format!(
            "export_interval_ms must be between 1 and 86400000, got {}",
            export_interval.as_millis()
        )));
    }
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    let reader = PeriodicReader::builder(exporter)
        .with_interval(export_interval)
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name.to_owned())
        .build();
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build();
    let meter = provider.meter("awa");
    let events = JobEvent::ALL
        .iter()
        .map(|&e| {
            let c = meter
                .u64_counter(instrument_name(e))
                .with_description(instrument_description(e))
                .with_unit("{job}")
                .build();
            (e, c)
        })
        .collect();
    let boundaries: Vec<f64> = crate::metrics::series::BUCKETS.to_vec();
    let duration = meter
        .f64_histogram("awa.job.duration")
        .with_description("Job execution duration")
        .with_unit("s")
        .with_boundaries(boundaries.clone())
        .build();
    let wait = meter
        .f64_histogram("awa.job.wait_duration")
        .with_description("Time from a job being due to its claim")
        .with_unit("s")
        .with_boundaries(boundaries)
        .build();
    let new = Arc::new(Instruments {
        provider,
        events,
        duration,
        wait,
    });
    let old = active()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .replace(new);
    if let Some(old) = old {
        stop(&old);
    }
    Ok(true)
}

/// Export what is pending and stop; a no-op when telemetry is not running.
pub fn shutdown() {
    let old = active().write().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(old) = old {
        stop(&old);
    }
}

/// Whether an export is running.
pub fn is_running() -> bool {
    current().is_some()
}

fn stop(i: &Instruments) {
    if let Err(e) = i.provider.force_flush() {
        tracing::warn!(error = %e, "telemetry: the last export failed");
    }
    if let Err(e) = i.provider.shutdown() {
        tracing::warn!(error = %e, "telemetry: shutdown failed");
    }
}

pub(crate) fn record(kind: &str, queue: &str, event: JobEvent, n: u64) {
    if let Some(i) = current() {
        if let Some((_, c)) = i.events.iter().find(|(e, _)| *e == event) {
            c.add(n, &attributes(kind, queue));
        }
    }
}

pub(crate) fn observe(kind: &str, queue: &str, timing: Timing, d: Duration) {
    if let Some(i) = current() {
        let h = match timing {
            Timing::Duration => &i.duration,
            Timing::Wait => &i.wait,
        };
        h.record(d.as_secs_f64(), &attributes(kind, queue));
    }
}
