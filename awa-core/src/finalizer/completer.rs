//! The completer: the one owner of completion in a running client.
//!
//! The executor hands it each attempt's [`Finalization`] (the transition with the follow-ups
//! already sealed) and forgets about it. The completer chooses the path — every `Completed`
//! joins the batched completer (with `batch_follow_ups` off, only a plain one: nothing staged,
//! no registered Completed specs), everything else gets a per-job transaction under the
//! finalize deadline — and reports each job as settled once its finalization ended, so the
//! executor keeps heartbeating it until then (retries included). A batch with follow-ups that
//! fails in a way its retries cannot fix hands each of its jobs to the per-job path.

use crate::finalizer::batched::{self, BatchFailed, Member};
use crate::finalizer::retry::RetryPolicy;
use crate::finalizer::waker::Waker;
use crate::finalizer::{finalize_with_retry_via, Finalization, Transition};
use crate::metrics;
use crate::seams::{self, Path};
use crate::specs::Specs;
use crate::storage::pool::Db;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// Longest the batched completer waits for more completions when its batch is small.
const COMPLETION_LINGER: Duration = Duration::from_millis(2);

/// Batches committing at once. More than one, so that a batch waiting on the database (a
/// lock, a slow trigger, a lost connection) does not hold up every other completion of the
/// client; few, so that under load batches stay large.
const BATCHES_IN_FLIGHT: usize = 2;

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
    /// Completions with follow-ups join the batch (`RuntimeConfig::batch_follow_ups`).
    pub batch_follow_ups: bool,
}

/// The completer of one running client.
pub(crate) struct Completer {
    pool: Db,
    specs: Specs,
    batch_tx: mpsc::Sender<Finalization>,
    per_job: Arc<Semaphore>,
    batches: Arc<Semaphore>,
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
    ) -> (Arc<Completer>, mpsc::Receiver<Finalization>) {
        let (batch_tx, batch_rx) = mpsc::channel(settings.completion_batch.max(1) * 4);
        let completer = Completer {
            per_job: Arc::new(Semaphore::new(settings.finalizer_concurrency.max(1))),
            batches: Arc::new(Semaphore::new(BATCHES_IN_FLIGHT)),
            pool,
            specs,
            batch_tx,
            waker,
            settings,
            settled,
        };
        (Arc::new(completer), batch_rx)
    }

    /// Take over one attempt's finalization: batched when it is a completion the batch
    /// takes, else a per-job transaction of its own (bounded by `finalizer_concurrency`; this
    /// waits for a permit, which pushes back on the runners when the database is slow).
    pub(crate) async fn submit(self: &Arc<Self>, fin: Finalization) {
        let batched = if self.settings.batch_follow_ups {
            fin.transition == Transition::Completed
        } else {
            fin.is_plain_completion(&self.specs)
        };
        if batched {
            let id = fin.job.id;
            seams::sent(id, Path::Batched);
            if self.batch_tx.send(fin).await.is_err() {
                // The batcher is gone (shutdown finished): the job stays running until rescue.
                (self.settled)(id);
            }
            return;
        }
        self.per_job(fin).await;
    }

    /// Finalize `fin` in a transaction of its own, spawned once a permit is free.
    async fn per_job(self: &Arc<Self>, fin: Finalization) {
        seams::sent(fin.job.id, Path::PerJob);
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
    /// them in one commit, repeat. Natural batching: the busier the queue, the bigger the
    /// batch. The jobs of a batch stay in flight (heartbeated) until its commit ended.
    pub(crate) async fn run_batcher(self: Arc<Self>, mut rx: mpsc::Receiver<Finalization>) {
        let max = self.settings.completion_batch.max(1);
        let mut batch: Vec<Finalization> = Vec::with_capacity(max);
        let mut last_len = 0usize;
        while let Some(fin) = rx.recv().await {
            batch.push(fin);
            let linger_until = tokio::time::Instant::now() + COMPLETION_LINGER;
            loop {
                while batch.len() < max {
                    match rx.try_recv() {
                        Ok(fin) => batch.push(fin),
                        Err(_) => break,
                    }
                }
                // Under load (the previous flush had company), wait a moment for more so one
                // commit covers many completions; on an idle queue a completion flushes at
                // once.
                if batch.len() >= max
                    || last_len <= 1
                    || tokio::time::Instant::now() >= linger_until
                {
                    break;
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            last_len = batch.len();
            let batch = std::mem::take(&mut batch);
            let permit = self.batches.clone().acquire_owned().await;
            let this = self.clone();
            tokio::spawn(async move {
                let _permit = permit;
                this.flush(batch).await;
            });
        }
    }

    /// Apply one batch: one statement when nothing in it inserts, else one transaction with
    /// the follow-ups; the jobs a failed batch hands back, and any whose registered spec
    /// failed to build, are finalized alone.
    ///
    /// The finalize deadline bounds a batch as it bounds a per-job finalization. A batch with
    /// follow-ups that passes it is dropped (its open transaction rolls back; a COMMIT already
    /// sent may land) and each of its jobs is finalized alone, where the lease guard makes a
    /// completion that did land replay as stale. A plain batch past the deadline is left to
    /// rescue, as before.
    async fn flush(self: &Arc<Self>, batch: Vec<Finalization>) {
        let deadline = self.settings.finalize_deadline;
        let mut members = Vec::with_capacity(batch.len());
        let mut alone = Vec::new();
        for (i, fin) in batch.iter().enumerate() {
            match Member::new(fin, &self.specs) {
                Ok(m) => members.push(m),
                Err(_) => alone.push(i),
            }
        }
        if members.iter().any(Member::has_follow_ups) {
            let tried = tokio::time::timeout(
                deadline,
                batched::complete_members(
                    &self.pool,
                    &members,
                    Some(&self.waker),
                    &self.settings.retry,
                ),
            )
            .await;
            match tried {
                Ok(Ok(_)) => {}
                // Logged inside; nothing of the batch committed.
                Ok(Err(BatchFailed::FallBack)) => alone = (0..batch.len()).collect(),
                // Logged and counted inside; its jobs stay running until rescue.
                Ok(Err(BatchFailed::GaveUp(_))) => {}
                Err(_) => {
                    tracing::warn!(
                        jobs = batch.len(),
                        ?deadline,
                        "batched completion passed its deadline; finalizing its jobs one by one"
                    );
                    alone = (0..batch.len()).collect();
                }
            }
        } else if !members.is_empty() {
            let ids: Vec<i64> = members.iter().map(|m| m.fin.job.id).collect();
            let leases: Vec<i64> = members.iter().map(|m| m.fin.job.run_lease).collect();
            let tried = tokio::time::timeout(
                deadline,
                batched::complete_batch_with(&self.pool, &ids, &leases, &self.settings.retry),
            )
            .await;
            if let Ok(Ok(done)) = &tried {
                // Each completed id once (a batch may hold two attempts of one job).
                let mut done: std::collections::HashSet<i64> = done.iter().copied().collect();
                for m in &members {
                    if done.remove(&m.fin.job.id) {
                        metrics::series::record(
                            &m.fin.job.kind,
                            &m.fin.job.queue,
                            metrics::series::JobEvent::Completed,
                            1,
                        );
                    }
                }
            }
            // A failure is logged and counted inside; its jobs stay running until rescue.
            if tried.is_err() {
                metrics::add(&metrics::FINALIZE_GAVE_UP, ids.len() as u64);
                tracing::error!(
                    jobs = ids.len(),
                    ?deadline,
                    "batched completion passed its deadline; the jobs stay running until rescue"
                );
            }
        }
        drop(members);
        let mut alone = alone.into_iter().peekable();
        for (i, fin) in batch.into_iter().enumerate() {
            if alone.next_if_eq(&i).is_some() {
                self.per_job(fin).await;
            } else {
                (self.settled)(fin.job.id);
            }
        }
    }
}
