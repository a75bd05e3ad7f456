//! In-handler callback waits: a waiter per token, woken by `awa:callback` notifications and
//! re-checked on a short poll as a safety net (notifications are only hints).

use crate::error::AwaError;
use crate::executor::context::{CallbackToken, CancelSignal};
use crate::model::JobRow;
use crate::storage::callbacks::{poll_wait, WaitState};
use crate::storage::pool::Db;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

const WAIT_POLL: Duration = Duration::from_millis(500);

/// Wake-ups for the callback waits of this process, by token.
#[derive(Default, Clone)]
pub struct CallbackWaiters {
    waiters: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
}

impl CallbackWaiters {
    /// Wake the waiter of `token`, if this process has one.
    pub(crate) fn wake(&self, token: &str) {
        let map = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get(token) {
            n.notify_one();
        }
    }

    pub(crate) async fn wait(
        &self,
        pool: &Db,
        job: &JobRow,
        token: &CallbackToken,
        cancel: &CancelSignal,
    ) -> Result<serde_json::Value, AwaError> {
        let notify = Arc::new(Notify::new());
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.0.clone(), notify.clone());
        let result = loop {
            // Check first: a resume that arrived before we started waiting is already stored.
            match poll_wait(pool, job.id, job.run_lease, &token.0).await {
                Ok(WaitState::Resumed(payload)) => break Ok(payload),
                Ok(WaitState::Gone(why)) => {
                    break Err(AwaError::CallbackNotFound(format!("{}: {why}", token.0)))
                }
                Ok(WaitState::Ready) => continue,
                Ok(WaitState::Pending) => {}
                Err(e) => break Err(e),
            }
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep(WAIT_POLL) => {}
                _ = cancel.cancelled() => break Err(AwaError::State("the attempt was cancelled while waiting for a callback".into())),
            }
        };
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token.0);
        result
    }
}
