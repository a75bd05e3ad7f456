//! The LISTEN loop: queue wake-ups, cancellation requests and callback resolutions. It is only
//! a hint: dispatchers poll, heartbeats deliver missed cancel requests, waits re-read their row.

use crate::executor::runtime::Shared;
use crate::storage::admin::CANCEL_CHANNEL;
use crate::storage::callbacks::CALLBACK_CHANNEL;
use crate::storage::pool::PoolMode;
use sqlx::postgres::PgListener;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// LISTEN for queue wake-ups, cancellation requests and callback resolutions.
pub(crate) async fn run_listener(shared: Arc<Shared>) {
    if shared.pool.mode() == PoolMode::Transaction {
        // Behind PgBouncer in transaction mode a LISTEN would land on a session that serves
        // other clients a moment later; dispatchers poll, heartbeats carry cancel requests.
        tracing::info!("pool_mode=transaction: no LISTEN; dispatchers poll");
        return;
    }
    loop {
        if shared.stop_background.is_cancelled() {
            return;
        }
        match listen_once(&shared).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "listener failed; reconnecting");
                tokio::select! {
                    _ = shared.stop_background.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

async fn listen_once(shared: &Arc<Shared>) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(shared.pool.pool()).await?;
    let mut channels: HashMap<String, String> = HashMap::new();
    for q in shared.queues.keys() {
        let ch: String = sqlx::query_scalar("SELECT awa.queue_channel($1)")
            .bind(q)
            .fetch_one(&shared.pool)
            .await?;
        channels.insert(ch, q.clone());
    }
    let mut names: Vec<&str> = channels.keys().map(String::as_str).collect();
    names.push(CANCEL_CHANNEL);
    names.push(CALLBACK_CHANNEL);
    listener.listen_all(names).await?;
    // Anything inserted before LISTEN took effect is found by the next poll; wake once now.
    for n in shared.wake.values() {
        n.notify_one();
    }
    loop {
        let note = tokio::select! {
            n = listener.recv() => n?,
            _ = shared.stop_background.cancelled() => return Ok(()),
        };
        let channel = note.channel();
        if channel == CANCEL_CHANNEL {
            if let Ok(id) = note.payload().parse::<i64>() {
                if shared.inflight.signal_cancel(id) {
                    tracing::info!(job_id = id, "cancellation requested for a running job");
                }
            }
        } else if channel == CALLBACK_CHANNEL {
            shared.callbacks.wake(note.payload());
        } else if let Some(q) = channels.get(channel) {
            if let Some(n) = shared.wake.get(q) {
                n.notify_one();
            }
        }
    }
}
