//! Job counters and timing histograms per `(kind, queue)`: what an operator slices by.
//!
//! The process-wide counters in [`super`] say how the engine behaves (finalize retries, stale
//! finalizations); these say what happened to whose jobs: inserted, claimed, completed, failed,
//! retried, cancelled, snoozed, parked for a callback, rescued, moved to the DLQ, and how long
//! handlers ran and due jobs waited for a worker. Prometheus (`/metrics`) and the OTLP export
//! (`crate::telemetry`) both read [`snapshot`].
//!
//! Cost on the hot path: one read-locked map lookup by `&str` and relaxed atomic adds; the
//! write lock is taken once per new `(kind, queue)`.

use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

/// Something that happened to jobs of one kind on one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEvent {
    Inserted,
    Claimed,
    Completed,
    /// Failed for good (terminal error, exhausted attempts), DLQ or not.
    Failed,
    Retried,
    Cancelled,
    Snoozed,
    WaitingExternal,
    Rescued,
    DlqMoved,
}

impl JobEvent {
    pub const ALL: [JobEvent; 10] = [
        JobEvent::Inserted,
        JobEvent::Claimed,
        JobEvent::Completed,
        JobEvent::Failed,
        JobEvent::Retried,
        JobEvent::Cancelled,
        JobEvent::Snoozed,
        JobEvent::WaitingExternal,
        JobEvent::Rescued,
        JobEvent::DlqMoved,
    ];

    /// The event's name: `awa_jobs_<name>_total` in Prometheus; awa-pg's OTLP names are in
    /// `crate::telemetry`.
    pub fn name(self) -> &'static str {
        match self {
            JobEvent::Inserted => "inserted",
            JobEvent::Claimed => "claimed",
            JobEvent::Completed => "completed",
            JobEvent::Failed => "failed",
            JobEvent::Retried => "retried",
            JobEvent::Cancelled => "cancelled",
            JobEvent::Snoozed => "snoozed",
            JobEvent::WaitingExternal => "waiting_external",
            JobEvent::Rescued => "rescued",
            JobEvent::DlqMoved => "dlq_moved",
        }
    }
}

/// A timed span of a job's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// The handler's run, from start to the outcome.
    Duration,
    /// From when the job was due (`run_at`, or its creation if later) to its claim.
    Wait,
}

impl Timing {
    pub const ALL: [Timing; 2] = [Timing::Duration, Timing::Wait];

    pub fn name(self) -> &'static str {
        match self {
            Timing::Duration => "duration",
            Timing::Wait => "wait",
        }
    }
}

/// Upper bounds of the histogram buckets, in seconds (an implicit `+Inf` follows). From a
/// millisecond (a no-op handler, an idle pickup) to ten minutes (a long batch job).
pub const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 600.0,
];

#[derive(Default)]
struct Histogram {
    /// Per bucket (not cumulative), the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        HistogramSnapshot {
            // Read the count from the buckets so count and buckets always agree.
            count: buckets.iter().sum(),
            bucket_counts: buckets,
            sum_seconds: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

#[derive(Default)]
struct Series {
    events: [AtomicU64; JobEvent::ALL.len()],
    timings: [Histogram; Timing::ALL.len()],
}

type Registry = RwLock<HashMap<String, HashMap<String, Arc<Series>>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

fn series(kind: &str, queue: &str) -> Arc<Series> {
    // A poisoned lock only means a panic elsewhere while holding it; the map is still whole.
    if let Some(s) = registry()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(kind)
        .and_then(|q| q.get(queue))
    {
        return s.clone();
    }
    registry()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(kind.to_owned())
        .or_default()
        .entry(queue.to_owned())
        .or_default()
        .clone()
}

/// Count `n` events of `kind` on `queue`.
pub fn record(kind: &str, queue: &str, event: JobEvent, n: u64) {
    if n == 0 {
        return;
    }
    let s = series(kind, queue);
    let i = JobEvent::ALL
        .iter()
        .position(|e| *e == event)
        .unwrap_or_default();
    // The export first: a reader that sees the count here knows the export has it too.
    #[cfg(feature = "otlp")]
    crate::telemetry::record(kind, queue, event, n);
    s.events[i].fetch_add(n, Ordering::Relaxed);
}

/// Count one `event` per `(kind, queue)` pair, runs of equal pairs counted at once (a bulk
/// insert is usually one kind on one queue).
pub fn record_each<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>, event: JobEvent) {
    let mut run: Option<((&str, &str), u64)> = None;
    for pair in pairs {
        match &mut run {
            Some((p, n)) if *p == pair => *n += 1,
            _ => {
                if let Some(((k, q), n)) = run.take() {
                    record(k, q, event, n);
                }
                run = Some((pair, 1));
            }
        }
    }
    if let Some(((k, q), n)) = run {
        record(k, q, event, n);
    }
}

/// Record one timing of `kind` on `queue`.
pub fn observe(kind: &str, queue: &str, timing: Timing, d: Duration) {
    let s = series(kind, queue);
    let i = Timing::ALL
        .iter()
        .position(|t| *t == timing)
        .unwrap_or_default();
    #[cfg(feature = "otlp")]
    crate::telemetry::observe(kind, queue, timing, d);
    s.timings[i].observe(d);
}

/// One histogram as read: per-bucket counts (not cumulative; one per [`BUCKETS`] bound, then
/// `+Inf`), their sum, and the sum of the observations.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HistogramSnapshot {
    pub bucket_counts: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

/// One `(kind, queue)` series as read.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SeriesSnapshot {
    pub kind: String,
    pub queue: String,
    /// Event name → count, every event (zeros included).
    pub events: Vec<(&'static str, u64)>,
    /// Timing name → histogram.
    pub timings: Vec<(&'static str, HistogramSnapshot)>,
}

/// Every series, sorted by kind then queue.
pub fn snapshot() -> Vec<SeriesSnapshot> {
    let map = registry().read().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    for (kind, queues) in map.iter() {
        for (queue, s) in queues {
            out.push(SeriesSnapshot {
                kind: kind.clone(),
                queue: queue.clone(),
                events: JobEvent::ALL
                    .iter()
                    .zip(&s.events)
                    .map(|(e, c)| (e.name(), c.load(Ordering::Relaxed)))
                    .collect(),
                timings: Timing::ALL
                    .iter()
                    .zip(&s.timings)
                    .map(|(t, h)| (t.name(), h.snapshot()))
                    .collect(),
            });
        }
    }
    out.sort_by(|a, b| (&a.kind, &a.queue).cmp(&(&b.kind, &b.queue)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(kind: &str, queue: &str) -> SeriesSnapshot {
        snapshot()
            .into_iter()
            .find(|s| s.kind == kind && s.queue == queue)
            .expect("series")
    }

    #[test]
    fn events_count_per_kind_and_queue() {
        record("series_t1", "a", JobEvent::Completed, 3);
        record("series_t1", "b", JobEvent::Completed, 1);
        record("series_t1", "a", JobEvent::Failed, 1);
        record("series_t1", "a", JobEvent::Failed, 0);
        record_each(
            [("series_t1", "a"), ("series_t1", "a"), ("series_t1", "b")],
            JobEvent::Inserted,
        );
        let a = find("series_t1", "a");
        let get = |s: &SeriesSnapshot, n: &str| s.events.iter().find(|e| e.0 == n).map(|e| e.1);
        assert_eq!(get(&a, "completed"), Some(3));
        assert_eq!(get(&a, "failed"), Some(1));
        assert_eq!(get(&a, "inserted"), Some(2));
        assert_eq!(get(&a, "claimed"), Some(0));
        assert_eq!(get(&find("series_t1", "b"), "completed"), Some(1));
    }

    #[test]
    fn observations_land_in_their_bucket() {
        observe(
            "series_t2",
            "q",
            Timing::Duration,
            Duration::from_micros(500),
        );
        observe("series_t2", "q", Timing::Duration, Duration::from_secs(2));
        observe(
            "series_t2",
            "q",
            Timing::Duration,
            Duration::from_secs(3600),
        );
        let s = find("series_t2", "q");
        let (_, h) = s
            .timings
            .iter()
            .find(|t| t.0 == "duration")
            .expect("duration");
        assert_eq!(h.count, 3);
        assert_eq!(h.bucket_counts[0], 1, "0.5 ms <= 1 ms");
        let two_and_a_half = BUCKETS.iter().position(|&b| b == 2.5).expect("bucket");
        assert_eq!(h.bucket_counts[two_and_a_half], 1, "2 s <= 2.5 s");
        assert_eq!(
            h.bucket_counts[BUCKETS.len()],
            1,
            "an hour is past the last bound"
        );
        assert!(
            (h.sum_seconds - 3602.0005).abs() < 1e-6,
            "{}",
            h.sum_seconds
        );
        let (_, w) = s.timings.iter().find(|t| t.0 == "wait").expect("wait");
        assert_eq!(w.count, 0);
    }
}
