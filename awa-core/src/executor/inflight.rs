//! The attempts this process is running: what heartbeats renew, what `awa:cancel` signals,
//! and what shutdown waits for.

use crate::executor::context::{CancelSignal, ProgressBuffer};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

pub(crate) struct Inflight {
    pub lease: i64,
    pub cancel: CancelSignal,
    pub progress: Arc<Mutex<ProgressBuffer>>,
}

/// Attempts from claim until their finalization commits (or is abandoned), including jobs
/// claimed ahead that wait for a slot: they are `running` in the database, so they are
/// heartbeated and can be cancelled like any other attempt.
#[derive(Default)]
pub(crate) struct InflightSet {
    map: Mutex<HashMap<i64, Inflight>>,
    /// Handlers started and not yet returned (claimed-ahead jobs count once they start).
    running_handlers: Mutex<usize>,
    changed: Notify,
}

impl InflightSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Inflight>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A claimed attempt: heartbeats cover it from now on.
    pub fn register(&self, id: i64, entry: Inflight) {
        self.lock().insert(id, entry);
    }

    /// A handler is about to run (counted before its task is spawned, so shutdown cannot
    /// miss it).
    pub fn handler_started(&self) {
        *self
            .running_handlers
            .lock()
            .unwrap_or_else(|p| p.into_inner()) += 1;
    }

    /// The handler of `id` returned (or was abandoned).
    pub fn handler_done(&self) {
        let mut n = self
            .running_handlers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        drop(n);
        self.changed.notify_waiters();
    }

    /// The attempt left this process (finalized, stale, or abandoned).
    pub fn remove(&self, id: i64) {
        self.lock().remove(&id);
        self.changed.notify_waiters();
    }

    pub fn running_handlers(&self) -> usize {
        *self
            .running_handlers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Wait until `pred` holds, re-checking whenever the set changes.
    pub async fn wait_until(&self, pred: impl Fn(&Self) -> bool) {
        loop {
            let changed = self.changed.notified();
            if pred(self) {
                return;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            }
        }
    }

    pub fn signal_cancel(&self, id: i64) -> bool {
        match self.lock().get(&id) {
            Some(e) => {
                e.cancel.cancel();
                true
            }
            None => false,
        }
    }

    pub fn cancel_all(&self) {
        for e in self.lock().values() {
            e.cancel.cancel();
        }
    }

    /// `(id, lease, progress-if-dirty)` of every attempt, for a heartbeat.
    pub fn heartbeat_batch(&self) -> (Vec<i64>, Vec<i64>, Vec<Option<serde_json::Value>>) {
        let map = self.lock();
        let mut ids = Vec::with_capacity(map.len());
        let mut leases = Vec::with_capacity(map.len());
        let mut progress = Vec::with_capacity(map.len());
        for (id, e) in map.iter() {
            ids.push(*id);
            leases.push(e.lease);
            let mut p = e.progress.lock().unwrap_or_else(|p| p.into_inner());
            progress.push(if p.dirty {
                p.dirty = false;
                p.value.clone()
            } else {
                None
            });
        }
        (ids, leases, progress)
    }
}
