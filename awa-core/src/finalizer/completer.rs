//! The completer: the one owner of completion in a running client.
//!
//! The executor hands it each attempt's [`Finalization`] (the transition with the follow-ups
//! already sealed) and forgets about it. The completer chooses the path — a plain completion
//! (nothing staged, no registered Completed specs) joins the batched completer, everything
//! else gets a per-job transaction under the finalize deadline — and reports each job as
//! settled once its finalization ended, so the executor keeps heartbeating it until then
//! (retries included).

use crate::finalizer::retry::RetryPolicy;
use crate::finalizer::waker::Waker;
use crate::finalizer::{batched, finalize_with_retry_via, Finalization};
use crate::metrics;
use crate::specs::Specs;
use crate::storage::pool::Db;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// Longest the batched completer waits for more completions when its batch is small.
const COMPLETION_LINGER: Duration = Duration::from_millis(2);

/// Called with a job's id once its finalization ended (committed, stale, or given up): the
/// job leaves the executor's in-flight set and heartbeats stop covering it.
pub(crate) type Settled = Arc<dyn Fn(i64) + Send + Sync>;

/// How the completer runs.
#[derive(Debug, Clone)]
pub(crate) struct CompleterSettings {
    /// Most completions one batched statement applies.
    pub completion_batch: usize,
    /// Per-job finalizations running at once.
    pub finalizer_concurrency: usize,
    /// Longest one per-job finalization (with its retries) may take.
    pub finalize_deadline: Duration,
    /// Retries after deadlocks and lost connections.
    pub retry: RetryPolicy,
}

/// The completer of one running client.
pub(crate) struct Completer {
    pool: Db,
    specs: Specs,
    batch_tx: mpsc::Sender<(i64, i64)>,
    per_job: Arc<Semaphore>,
    waker: Arc<Waker>,
    settings: CompleterSettings,
    settled: Settled,
}

impl Completer {
    /// A completer and the receiving end of its batch channel (run it with
    /// [`Completer::run_batcher`]).
    pub(crate) fn new(
        pool: Db,
        specs: Specs,
        settings: CompleterSettings,
        waker: Arc<Waker>,
        settled: Settled,
    ) -> (Arc<Completer>, mpsc::Receiver<(i64, i64)>) {
        let (batch_tx, batch_rx) = mpsc::channel(settings.completion_batch.max(1) * 4);
        let completer = Completer {
            per_job: Arc::new(Semaphore::new(settings.finalizer_concurrency.max(1))),
            pool,
            specs,
            batch_tx,
            waker,
            settings,
            settled,
        };
        (Arc::new(completer), batch_rx)
    }

    /// Take over one attempt's finalization: batched when it is a plain completion, else a
    /// per-job transaction of its own (bounded by `finalizer_concurrency`; this waits for a
    /// permit, which pushes back on the runners when the database is slow).
    pub(crate) async fn submit(self: &Arc<Self>, fin: Finalization) {
        if fin.is_plain_completion(&self.specs) {
            if self
                .batch_tx
                .send((fin.job.id, fin.job.run_lease))
                .await
                .is_err()
            {
                // The batcher is gone (shutdown finished): the job stays running until rescue.
                (self.settled)(fin.job.id);
            }
            return;
        }
        let permit = self.per_job.clone().acquire_owned().await;
        let this = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            // The finalize deadline: a finalization still running after it is dropped. An open
            // transaction rolls back; a completion statement already sent runs to its end on
            // the server and commits with its follow-ups or not at all; a job left running is
            // rescued later (ADR-046, last row of the commit table).
            let deadline = this.settings.finalize_deadline;
            let attempt = finalize_with_retry_via(
                &this.pool,
                &fin,
                &this.specs,
                Some(&this.waker),
                &this.settings.retry,
            );
            if tokio::time::timeout(deadline, attempt).await.is_err() {
                metrics::add(&metrics::FINALIZE_GAVE_UP, 1);
                tracing::error!(job_id = fin.job.id, kind = %fin.job.kind, ?deadline,
                    "finalization passed its deadline; the job stays running until rescue");
            }
            (this.settled)(fin.job.id);
        });
    }

    /// The batched completer: take whatever completions are waiting (up to a batch), apply
    /// them in one statement, repeat. Natural batching: the busier the queue, the bigger the
    /// batch. The jobs of a batch stay in flight (heartbeated) until its statement ended.
    pub(crate) async fn run_batcher(self: Arc<Self>, mut rx: mpsc::Receiver<(i64, i64)>) {
        let max = self.settings.completion_batch.max(1);
        let mut ids = Vec::with_capacity(max);
        let mut leases = Vec::with_capacity(max);
        let mut last_len = 0usize;
        while let Some((id, lease)) = rx.recv().await {
            ids.push(id);
            leases.push(lease);
            let linger_until = tokio::time::Instant::now() + COMPLETION_LINGER;
            loop {
                while ids.len() < max {
                    match rx.try_recv() {
                        Ok((id, lease)) => {
                            ids.push(id);
                            leases.push(lease);
                        }
                        Err(_) => break,
                    }
                }
                // Under load (the previous flush had company), wait a moment for more so one
                // commit covers many completions; on an idle queue a completion flushes at
                // once.
                if ids.len() >= max || last_len <= 1 || tokio::time::Instant::now() >= linger_until
                {
                    break;
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            last_len = ids.len();
            // A failure is logged and counted inside; its jobs stay running until rescue.
            let _ =
                batched::complete_batch_with(&self.pool, &ids, &leases, &self.settings.retry).await;
            for id in ids.drain(..) {
                (self.settled)(id);
            }
            leases.clear();
        }
    }
}
