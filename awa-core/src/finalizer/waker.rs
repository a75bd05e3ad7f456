//! Coalesced post-commit wake-ups for follow-ups.
//!
//! A per-job finalization that inserts follow-ups defers their NOTIFY (migration 3) and wakes
//! the queues after its commit. One `pg_notify` statement per completion costs a commit of its
//! own, and PostgreSQL wakes every listening backend of the database on every NOTIFY, whatever
//! the channel, each wake-up costing that backend a transaction: about two commits per staged
//! completion on top of the completion's own. The runtime's [`Waker`] gathers the queues of
//! every finalization and sends one statement for all that gathered while the previous one
//! was in flight, so under load many completions share a wake-up, and an idle queue is woken
//! at once.

use crate::executor::context::CancelSignal;
use crate::storage::pool::Db;
use crate::storage::wake_queues;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Collects queues to wake; [`Waker::run`] sends the wake-ups.
#[derive(Default)]
pub(crate) struct Waker {
    pending: Mutex<BTreeSet<String>>,
    ready: Notify,
}

impl Waker {
    /// Ask for `queues` to be woken (after the caller's commit).
    pub(crate) fn request(&self, queues: &[String]) {
        if queues.is_empty() {
            return;
        }
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(queues.iter().cloned());
        // Stores a permit when the loop is busy, so no request is missed.
        self.ready.notify_one();
    }

    /// Send wake-ups until `stop`, then flush what is left.
    pub(crate) async fn run(self: Arc<Self>, pool: Db, stop: CancelSignal) {
        loop {
            tokio::select! {
                _ = self.ready.notified() => self.flush(&pool).await,
                _ = stop.cancelled() => {
                    self.flush(&pool).await;
                    return;
                }
            }
        }
    }

    async fn flush(&self, pool: &Db) {
        let queues: Vec<String> =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        if queues.is_empty() {
            return;
        }
        // Only a hint (polling is the safety net): a failure loses nothing.
        if let Err(e) = wake_queues(pool, &queues).await {
            tracing::debug!(error = %e, "follow-up wake-up failed; workers will find the jobs by polling");
        }
    }
}
