//! The dispatcher: one claim loop per queue, woken by `LISTEN awa:<queue>` and polling.
//!
//! It reacts to events (a slot frees, a claim returns, a wake-up, a timer) and keeps at most
//! one claim in flight. With a backlog it claims ahead (see [`claim_ahead`]): the next batch
//! is claimed while the current one runs and waits in a small buffer, and handlers start from
//! the buffer as slots free, so a claim's round trip no longer leaves every slot idle. On
//! shutdown the jobs still in the buffer go back to the queue in one lease-guarded statement.
//!
//! [`claim_ahead`]: crate::executor::claim_ahead

use crate::error::Result;
use crate::executor::claim_ahead::{self, Pace, Plan, Slot, View};
use crate::executor::config::QueueConfig;
use crate::executor::runner::{run_job, Claimed, CANCELLED_BEFORE_START};
use crate::executor::runtime::Shared;
use crate::finalizer::{Finalization, Transition};
use crate::follow_ups::SealedFollowUps;
use crate::metrics;
use crate::model::JobRow;
use crate::storage::claim::{claim_batch, release_claimed, Release};
use futures_util::future::BoxFuture;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Longest the release of unstarted jobs may take; after it they are left to rescue.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Claim loop of one queue.
pub(crate) async fn dispatch(shared: Arc<Shared>, queue: String) {
    let Some(qc) = shared.queues.get(&queue).cloned() else {
        return;
    };
    Dispatcher::new(shared, queue, qc).run().await;
}

/// A claim statement in flight.
struct PendingClaim {
    result: BoxFuture<'static, Result<Vec<JobRow>>>,
    wanted: usize,
    sent: Instant,
}

/// What woke the loop.
enum Event {
    Stop,
    Claimed(Result<Vec<JobRow>>),
    SlotFreed(OwnedSemaphorePermit),
    /// A notification for the queue while it was idle.
    Woken,
    /// The poll interval, the end of a back-off, coalescing or a buffered job's
    /// wait: decide again.
    Tick,
}

struct Dispatcher {
    shared: Arc<Shared>,
    queue: String,
    qc: QueueConfig,
    slots: Arc<Semaphore>,
    /// Free slots, taken out of the semaphore; each starts one job.
    free: Vec<OwnedSemaphorePermit>,
    /// Claimed jobs waiting for a slot, oldest first (empty whenever `free` is not).
    buffer: VecDeque<Claimed>,
    pace: Arc<Pace>,
    wake: Arc<Notify>,
    /// Tests: claim ahead whatever was measured (see `seams::force_claim_ahead`).
    forced: bool,
    /// The longest a buffered job waits for a slot before it is released.
    max_wait: Duration,
    /// The last claim came back full.
    backlog: bool,
    /// Buffered jobs were released for waiting too long: no claim-ahead until a slot frees.
    suspended: bool,
    /// The queue came back short: no claim before a wake-up or this poll time.
    idle_until: Option<Instant>,
    /// A claim failed: none before this.
    backoff_until: Option<Instant>,
    /// Since when the dispatcher has been waiting for a fuller claim.
    coalescing_since: Option<Instant>,
    claim: Option<PendingClaim>,
}

impl Dispatcher {
    fn new(shared: Arc<Shared>, queue: String, qc: QueueConfig) -> Self {
        let forced = crate::seams::forced_claim_ahead(&queue);
        Dispatcher {
            slots: Arc::new(Semaphore::new(qc.max_workers)),
            free: Vec::with_capacity(qc.max_workers),
            buffer: VecDeque::new(),
            pace: Arc::default(),
            wake: shared.wake.get(&queue).cloned().unwrap_or_default(),
            forced: forced.is_some(),
            max_wait: forced.unwrap_or_else(|| claim_ahead::max_wait(qc.deadline)),
            backlog: false,
            suspended: false,
            idle_until: None,
            backoff_until: None,
            coalescing_since: None,
            claim: None,
            shared,
            queue,
            qc,
        }
    }

    async fn run(mut self) {
        loop {
            self.start_buffered();
            if self.release_expired().await {
                continue;
            }
            self.expire_waits();
            self.decide();
            match self.next_event().await {
                Event::Stop => break,
                Event::Claimed(result) => {
                    if let Some(claim) = self.claim.take() {
                        self.claimed(claim.wanted, claim.sent, result);
                    }
                }
                Event::SlotFreed(permit) => {
                    self.free.push(permit);
                    self.suspended = false;
                }
                Event::Woken | Event::Tick => {}
            }
        }
        self.stop().await;
    }

    /// Clear the waits whose time has come (before deciding, so a poll that is due claims).
    fn expire_waits(&mut self) {
        let now = Instant::now();
        if self.idle_until.is_some_and(|t| t <= now) {
            self.idle_until = None;
        }
        if self.backoff_until.is_some_and(|t| t <= now) {
            self.backoff_until = None;
        }
    }

    async fn next_event(&mut self) -> Event {
        let coalesce = self.coalescing_since.map(|t| t + claim_ahead::COALESCE);
        let expiry = self.buffer.front().map(|c| c.claimed_at + self.max_wait);
        let timer = [self.idle_until, self.backoff_until, coalesce, expiry]
            .into_iter()
            .flatten()
            .min();
        let idle = self.idle_until.is_some();
        // Disjoint borrows: the claim is polled in place while the other branches wait.
        let (claim, stop, wake) = (&mut self.claim, &self.shared.stop_claiming, &self.wake);
        let slots = self.slots.clone();
        let event = tokio::select! {
            biased;
            _ = stop.cancelled() => Event::Stop,
            r = async {
                match claim.as_mut() {
                    Some(c) => (&mut c.result).await,
                    None => std::future::pending().await,
                }
            } => Event::Claimed(r),
            p = slots.acquire_owned() => match p {
                Ok(p) => Event::SlotFreed(p),
                Err(_) => Event::Stop,
            },
            _ = wake.notified(), if idle => Event::Woken,
            _ = async {
                match timer {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => Event::Tick,
        };
        if matches!(event, Event::Woken) {
            self.idle_until = None;
        }
        event
    }

    /// Hand free slots to buffered jobs.
    fn start_buffered(&mut self) {
        while let Ok(p) = self.slots.clone().try_acquire_owned() {
            self.free.push(p);
            self.suspended = false;
        }
        while !self.buffer.is_empty() && !self.free.is_empty() {
            if let (Some(claimed), Some(permit)) = (self.buffer.pop_front(), self.free.pop()) {
                self.start(claimed, permit);
            }
        }
    }

    fn start(&self, claimed: Claimed, permit: OwnedSemaphorePermit) {
        self.shared.inflight.handler_started();
        let slot = Slot::new(permit, self.pace.clone());
        tokio::spawn(run_job(self.shared.clone(), self.qc.clone(), claimed, slot));
    }

    /// Start a claim if the plan says so.
    fn decide(&mut self) {
        if self.claim.is_some()
            || self.idle_until.is_some()
            || self.backoff_until.is_some()
            || self.shared.stop_claiming.is_cancelled()
        {
            return;
        }
        let now = Instant::now();
        let view = View {
            max_workers: self.qc.max_workers,
            claim_max: self.shared.config.claim_batch.max(1),
            free: self.free.len(),
            buffered: self.buffer.len(),
            backlog: self.backlog,
            suspended: self.suspended,
            forced: self.forced,
            coalesced: self
                .coalescing_since
                .is_some_and(|t| now >= t + claim_ahead::COALESCE),
            slot_time: self.pace.slot.get(),
            claim_time: self.pace.claim.get(),
        };
        match claim_ahead::plan(&view) {
            Plan::Claim(n) => {
                self.coalescing_since = None;
                let (pool, queue, deadline) = (
                    self.shared.pool.clone(),
                    self.queue.clone(),
                    self.qc.deadline,
                );
                self.claim = Some(PendingClaim {
                    result: Box::pin(async move {
                        claim_batch(&pool, &queue, n as i64, deadline).await
                    }),
                    wanted: n,
                    sent: now,
                });
            }
            Plan::Coalesce => {
                self.coalescing_since.get_or_insert(now);
            }
            Plan::Wait => self.coalescing_since = None,
        }
    }

    fn claimed(&mut self, wanted: usize, sent: Instant, result: Result<Vec<JobRow>>) {
        let jobs = match result {
            Ok(jobs) => jobs,
            Err(e) => {
                // Back off on errors (database down, schema missing) instead of spinning.
                tracing::warn!(queue = %self.queue, error = %e, "claim failed");
                self.backoff_until = Some(
                    Instant::now() + self.shared.config.poll_interval.max(Duration::from_secs(1)),
                );
                return;
            }
        };
        self.pace.claim.record(sent.elapsed());
        let n = jobs.len();
        self.backlog = n == wanted;
        if n < wanted {
            // Queue drained: wait for a notification or the poll interval.
            self.idle_until = Some(Instant::now() + self.shared.config.poll_interval);
        }
        if n == 0 {
            return;
        }
        metrics::add(&metrics::JOBS_CLAIMED, n as u64);
        // Jobs that find no free slot wait (free slots exist only while the buffer is empty).
        let ahead = n.saturating_sub(self.free.len());
        if ahead > 0 {
            metrics::add(&metrics::JOBS_CLAIMED_AHEAD, ahead as u64);
        }
        tracing::debug!(queue = %self.queue, claimed = n, ahead, slot_time = ?self.pace.slot.get(),
            claim_time = ?self.pace.claim.get(), "claimed jobs");
        for job in jobs {
            let claimed = Claimed::register(&self.shared.inflight, job, sent);
            self.buffer.push_back(claimed);
        }
    }

    /// Release buffered jobs that waited past `max_wait` (the slot-time estimate was wrong),
    /// and pause claim-ahead until a slot frees. Returns whether any were released.
    async fn release_expired(&mut self) -> bool {
        let now = Instant::now();
        let n = self
            .buffer
            .iter()
            .take_while(|c| c.claimed_at + self.max_wait <= now)
            .count();
        if n == 0 {
            return false;
        }
        tracing::info!(queue = %self.queue, jobs = n, max_wait = ?self.max_wait,
            "claimed-ahead jobs waited too long for a slot; releasing them");
        self.suspended = true;
        let expired: Vec<Claimed> = self.buffer.drain(..n).collect();
        self.release(expired).await;
        true
    }

    /// Shutdown: take the jobs of a claim in flight (it may commit whatever we do), then give
    /// every unstarted job back to the queue rather than leave it `running` until rescue.
    async fn stop(mut self) {
        if let Some(mut claim) = self.claim.take() {
            let result = (&mut claim.result).await;
            self.claimed(claim.wanted, claim.sent, result);
        }
        let unstarted: Vec<Claimed> = self.buffer.drain(..).collect();
        self.release(unstarted).await;
    }

    /// Give unstarted jobs back in one lease-guarded statement. A job with a cancel request is
    /// finalized as cancelled instead; one whose unique key another row took meanwhile cannot
    /// go back and runs when a slot frees.
    async fn release(&mut self, jobs: Vec<Claimed>) {
        if jobs.is_empty() {
            return;
        }
        let ids: Vec<i64> = jobs.iter().map(|c| c.job.id).collect();
        let leases: Vec<i64> = jobs.iter().map(|c| c.job.run_lease).collect();
        let result = tokio::time::timeout(
            RELEASE_TIMEOUT,
            release_claimed(&self.shared.pool, &ids, &leases),
        )
        .await;
        let what: HashMap<i64, Release> = match result {
            Ok(Ok(rows)) => rows.into_iter().collect(),
            Ok(Err(e)) => {
                tracing::warn!(queue = %self.queue, jobs = jobs.len(), error = %e,
                    "releasing unstarted jobs failed; they stay running until rescue");
                HashMap::new()
            }
            Err(_) => {
                tracing::warn!(queue = %self.queue, jobs = jobs.len(),
                    "releasing unstarted jobs timed out; they stay running until rescue");
                HashMap::new()
            }
        };
        let mut released = 0u64;
        for claimed in jobs {
            let id = claimed.job.id;
            match what.get(&id) {
                Some(Release::Released) => {
                    released += 1;
                    self.shared.inflight.remove(id);
                }
                Some(Release::CancelRequested) => self.finalize_cancelled(claimed).await,
                Some(Release::KeyTaken) => self.run_when_free(claimed),
                // No longer this worker's (or the release failed): nothing to write.
                None => self.shared.inflight.remove(id),
            }
        }
        if released > 0 {
            metrics::add(&metrics::JOBS_RELEASED, released);
            tracing::debug!(queue = %self.queue, released, "released unstarted jobs");
            self.shared.waker.request(std::slice::from_ref(&self.queue));
        }
    }

    /// A cancel request reached a job that never started: finalize it as cancelled through
    /// the per-job path (lease-guarded, firing its Cancelled specs).
    async fn finalize_cancelled(&mut self, claimed: Claimed) {
        let fin = Finalization {
            job: Arc::new(claimed.job),
            transition: Transition::Cancelled {
                reason: CANCELLED_BEFORE_START.into(),
            },
            follow_ups: SealedFollowUps::default(),
            progress: None,
            dlq: self.qc.dlq,
        };
        self.shared.completer.submit(fin).await;
    }

    /// Run a job that could not be released once a slot frees (its own task, so shutdown does
    /// not wait on the dispatcher; it waits on the handler like any other, and abandons it
    /// with the rest when the shutdown window closes).
    fn run_when_free(&self, claimed: Claimed) {
        let (shared, qc, slots, pace) = (
            self.shared.clone(),
            self.qc.clone(),
            self.slots.clone(),
            self.pace.clone(),
        );
        shared.inflight.handler_started();
        tokio::spawn(async move {
            let permit = tokio::select! {
                p = slots.acquire_owned() => p.ok(),
                _ = shared.abandon.cancelled() => None,
            };
            match permit {
                Some(p) => run_job(shared, qc, claimed, Slot::new(p, pace)).await,
                None => {
                    metrics::add(&metrics::JOBS_ABANDONED, 1);
                    shared.inflight.handler_done();
                    shared.inflight.remove(claimed.job.id);
                }
            }
        });
    }
}
