//! This client's row in the runtime registry (`awa.runtime_instances`,
//! docs/runtime-registry.md): registered when the runtime starts, refreshed every heartbeat
//! interval and at once when maintenance leadership changes, deleted when the runtime shuts
//! down cleanly. The SQL is in [`crate::storage::runtime_instances`]. The same refresh keeps
//! this client's queue and kind descriptors alive (`crate::storage::descriptors`).
//!
//! The registry is observability, never a dependency: a failed write is logged and retried on
//! the next refresh, and no job path waits on it.

use crate::executor::config::QueueConfig;
use crate::executor::context::CancelSignal;
use crate::storage::descriptors::{self, Catalogue, Subject};
use crate::storage::pool::Db;
use crate::storage::runtime_instances::{self as store, Registration};
use chrono::Utc;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;

/// What the rest of the runtime shares with the registry task.
#[derive(Default)]
pub(crate) struct Instance {
    /// Set once the row is inserted.
    pub id: OnceLock<String>,
    /// Notified by maintenance when leadership changes, so the row says so without waiting
    /// for the next heartbeat.
    pub leader_changed: Arc<Notify>,
    /// Notified once the first write of the row ended (inserted or failed), so `start()` can
    /// return with the row in place, as awa-pg's does.
    pub first_write: Notify,
}

/// The host's name, where the platform tells it without a system call: Linux's procfs, else
/// the usual environment variables; `None` otherwise.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// The queues and their settings as the row stores them, sorted by name.
fn queues_json(queues: &HashMap<String, QueueConfig>) -> serde_json::Value {
    let mut names: Vec<&String> = queues.keys().collect();
    names.sort();
    serde_json::Value::Array(
        names
            .into_iter()
            .map(|name| {
                let q = &queues[name];
                serde_json::json!({
                    "name": name,
                    "max_workers": q.max_workers,
                    "deadline_ms": u64::try_from(q.deadline.as_millis()).unwrap_or(u64::MAX),
                    "dlq": q.dlq,
                })
            })
            .collect(),
    )
}

pub(crate) fn registration(
    queues: &HashMap<String, QueueConfig>,
    interval: Duration,
    catalogue: &Catalogue,
    (storage_capability, transition_role): (&'static str, &'static str),
) -> Registration {
    Registration {
        storage_capability,
        transition_role,
        hostname: hostname(),
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        version: env!("CARGO_PKG_VERSION").to_string(),
        queues: queues_json(queues),
        interval,
        queue_descriptor_hashes: catalogue.declared_hashes(Subject::Queue),
        job_kind_descriptor_hashes: catalogue.declared_hashes(Subject::JobKind),
    }
}

/// Keep the row until `stop`, then delete it. Each refresh also refreshes this client's
/// queue and kind descriptors (`storage::descriptors`), so the catalogue's `last_seen_at` says
/// which of them a live client still works.
pub(crate) async fn run(
    pool: Db,
    registration: Registration,
    catalogue: Arc<Catalogue>,
    instance: Arc<Instance>,
    is_leader: Arc<AtomicBool>,
    stop: CancelSignal,
) {
    let started_at = Utc::now();
    let mut announced = false;
    loop {
        let leader = is_leader.load(Ordering::SeqCst);
        let written = match instance.id.get() {
            Some(id) => store::refresh(&pool, id, &registration, leader, started_at).await,
            None => store::register(&pool, &registration, leader)
                .await
                .map(|id| {
                    let _ = instance.id.set(id);
                }),
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "runtime registry update failed");
        }
        if !catalogue.is_empty() {
            if let Err(e) = descriptors::sync(&pool, &catalogue, registration.interval).await {
                tracing::warn!(error = %e, "descriptor refresh failed");
            }
        }
        if !announced {
            announced = true;
            // Stores a permit when start() is not waiting yet: the wake-up is never lost.
            instance.first_write.notify_one();
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = instance.leader_changed.notified() => {}
            _ = tokio::time::sleep(registration.interval) => {}
        }
    }
    if let Some(id) = instance.id.get() {
        if let Err(e) = store::deregister(&pool, id).await {
            tracing::warn!(error = %e, "could not remove this client from the runtime registry");
        }
    }
}
