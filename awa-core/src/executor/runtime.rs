//! The running client: what its tasks share, starting them, and graceful shutdown.

use crate::error::AwaError;
use crate::executor::config::{QueueConfig, RuntimeConfig};
use crate::executor::context::{CancelSignal, StateMap};
use crate::executor::inflight::InflightSet;
use crate::executor::pool::SharedPool;
use crate::executor::{callbacks::CallbackWaiters, dispatcher, heartbeat, listener, ErasedHandler};
use crate::finalizer::completer::{Completer, CompleterSettings, Settled};
use crate::finalizer::waker::Waker;
use crate::finalizer::RetryPolicy;
use crate::specs::Specs;
use crate::storage::pool::Db;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Everything the running tasks share.
pub(crate) struct Shared {
    pub pool: Db,
    pub config: RuntimeConfig,
    pub queues: HashMap<String, QueueConfig>,
    pub handlers: HashMap<String, Arc<dyn ErasedHandler>>,
    pub specs: Specs,
    pub state: StateMap,
    /// Shared with the completer, which reports each job settled once its finalization ended.
    pub inflight: Arc<InflightSet>,
    pub callbacks: CallbackWaiters,
    /// Stop claiming.
    pub stop_claiming: CancelSignal,
    /// Abandon running handlers (shutdown timeout).
    pub abandon: CancelSignal,
    /// Stop background loops (heartbeat, listener, maintenance).
    pub stop_background: CancelSignal,
    pub wake: HashMap<String, Arc<Notify>>,
    /// The one owner of completion: path choice, the batcher, per-job transactions, retries.
    pub completer: Arc<Completer>,
    /// Post-commit wake-ups of per-job finalizations, coalesced.
    pub waker: Arc<Waker>,
    pub is_leader: Arc<AtomicBool>,
    /// The overflow pool of the weighted queues (`executor::pool`), if any.
    pub overflow: Option<Arc<SharedPool>>,
    /// This client's runtime-registry row (docs/runtime-registry.md).
    pub instance: Arc<super::registry::Instance>,
}

/// Handles of the background tasks, joined on shutdown.
pub(crate) struct Running {
    pub shared: Arc<Shared>,
    pub dispatchers: Vec<JoinHandle<()>>,
    pub batcher: JoinHandle<()>,
    pub background: Vec<JoinHandle<()>>,
}

// One caller (`Client::start`), which hands over its fields one by one; a struct would only
// repeat them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    pool: Db,
    config: RuntimeConfig,
    queues: HashMap<String, QueueConfig>,
    handlers: HashMap<String, Arc<dyn ErasedHandler>>,
    specs: Specs,
    state: StateMap,
    url: Option<String>,
    catalogue: Arc<crate::storage::descriptors::Catalogue>,
) -> Result<Running, AwaError> {
    // Checked by `ClientBuilder::build` already; an error here is the same refusal.
    let overflow = crate::executor::pool::overflow_pool(config.global_max_workers, &queues)?;
    let wake = queues
        .keys()
        .map(|q| (q.clone(), Arc::new(Notify::new())))
        .collect();
    let inflight = Arc::new(InflightSet::default());
    let waker = Arc::new(Waker::default());
    let settled: Settled = {
        let inflight = inflight.clone();
        Arc::new(move |id| inflight.remove(id))
    };
    let (completer, batch_rx) = Completer::new(
        pool.clone(),
        specs.clone(),
        CompleterSettings {
            completion_batch: config.completion_batch,
            finalizer_concurrency: config.finalizer_concurrency,
            finalize_deadline: config.finalize_deadline,
            retry: RetryPolicy {
                reconnect_budget: config.finalize_reconnect_budget,
            }
            .within_staleness(config.heartbeat_staleness),
            batch_follow_ups: config.batch_follow_ups,
        },
        waker.clone(),
        settled,
    );
    let shared = Arc::new(Shared {
        pool,
        config,
        queues,
        handlers,
        specs,
        state,
        inflight,
        callbacks: CallbackWaiters::default(),
        stop_claiming: CancelSignal::default(),
        abandon: CancelSignal::default(),
        stop_background: CancelSignal::default(),
        wake,
        completer: completer.clone(),
        waker,
        is_leader: Arc::new(AtomicBool::new(false)),
        overflow,
        instance: Arc::default(),
    });
    let batcher = tokio::spawn(completer.run_batcher(batch_rx));
    let dispatchers = shared
        .queues
        .keys()
        .map(|q| tokio::spawn(dispatcher::dispatch(shared.clone(), q.clone())))
        .collect();
    let mut background = vec![
        tokio::spawn(heartbeat::run_heartbeat(shared.clone())),
        tokio::spawn(listener::run_listener(shared.clone())),
        tokio::spawn(
            shared
                .waker
                .clone()
                .run(shared.pool.clone(), shared.stop_background.clone()),
        ),
    ];
    background.push(tokio::spawn(super::registry::run(
        shared.pool.clone(),
        super::registry::registration(
            &shared.queues,
            shared.config.heartbeat_interval,
            &catalogue,
            (
                crate::storage::transition::capability(shared.pool.engine()),
                shared.config.transition_role.as_str(),
            ),
        ),
        catalogue,
        shared.instance.clone(),
        shared.is_leader.clone(),
        shared.stop_background.clone(),
    )));
    if shared.config.maintenance {
        background.push(tokio::spawn(crate::maintenance::run(
            shared.pool.clone(),
            url,
            shared.config.clone(),
            shared.specs.clone(),
            shared.stop_background.clone(),
            shared.is_leader.clone(),
            shared.instance.clone(),
        )));
    }
    Ok(Running {
        shared,
        dispatchers,
        batcher,
        background,
    })
}

/// Graceful shutdown: stop claiming, let running handlers finish and finalize within
/// `timeout`, then abandon the rest (their jobs are rescued later). Jobs a dispatcher claimed
/// ahead and never started are given back to the queue (attempt restored) as it stops, before
/// the wait for running handlers, rather than started: other workers can take them at once.
pub(crate) async fn shutdown(running: Running, timeout: Duration) {
    let shared = running.shared.clone();
    let deadline = tokio::time::Instant::now() + timeout;
    shared.stop_claiming.cancel();
    for d in running.dispatchers {
        let _ = d.await;
    }
    let all_done = tokio::time::timeout_at(
        deadline,
        shared.inflight.wait_until(|s| s.running_handlers() == 0),
    )
    .await;
    if all_done.is_err() {
        tracing::warn!(
            running = shared.inflight.running_handlers(),
            "shutdown timeout: abandoning running handlers"
        );
        shared.abandon.cancel();
        shared.inflight.cancel_all();
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            shared.inflight.wait_until(|s| s.running_handlers() == 0),
        )
        .await;
    }
    // Let queued finalizations land while time remains.
    let _ = tokio::time::timeout_at(
        deadline.max(tokio::time::Instant::now() + Duration::from_millis(100)),
        shared.inflight.wait_until(|s| s.len() == 0),
    )
    .await;
    shared.stop_background.cancel();
    running.batcher.abort();
    for b in running.background {
        let _ = b.await;
    }
    tracing::info!(left_running = shared.inflight.len(), "worker shut down");
}
