//! The dispatcher: one claim loop per queue, woken by `LISTEN awa:<queue>` and polling.
//!
//! It reacts to events (a slot frees, a claim returns, a wake-up, a timer) and keeps at most
//! one claim in flight. With a backlog it claims ahead (see [`claim_ahead`]): the next batch
//! is claimed while the current one runs and waits in a small buffer, and handlers start from
//! the buffer as slots free, so a claim's round trip no longer leaves every slot idle. On
//! shutdown the jobs still in the buffer go back to the queue in one lease-guarded statement.
//!
//! A queue's slots are its own semaphore, plus, for a weighted queue, slots of the client's
//! overflow pool (see [`pool`]), which it asks for only while it has work and no free slot.
//! A rate-limited queue never claims more jobs than its token bucket holds (see
//! [`rate_limit`]). Weighted and rate-limited queues claim exactly for the slots they hold
//! (no claim-ahead), so their slot accounting and claim counts are exact. With `claimers > 1`
//! up to that many claim statements are in flight at once, each sized from the slots not
//! already promised to the others.
//!
//! [`claim_ahead`]: crate::executor::claim_ahead
//! [`pool`]: crate::executor::pool
//! [`rate_limit`]: crate::executor::rate_limit

use crate::error::Result;
use crate::executor::claim_ahead::{self, Pace, Plan, Slot, View};
use crate::executor::config::QueueConfig;
use crate::executor::pool::{Permit, SharedPool};
use crate::executor::rate_limit::TokenBucket;
use crate::executor::runner::{run_job, Claimed, CANCELLED_BEFORE_START};
use crate::executor::runtime::Shared;
use crate::finalizer::{Finalization, Transition};
use crate::follow_ups::SealedFollowUps;
use crate::metrics;
use crate::model::JobRow;
use crate::storage::claim::Release;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
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

/// A claim statement's outcome, with what was asked and when.
struct ClaimDone {
    result: Result<Vec<JobRow>>,
    wanted: usize,
    sent: Instant,
}

/// What woke the loop.
enum Event {
    Stop,
    Claimed(ClaimDone),
    SlotFreed(Permit),
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
    /// Free slots, taken out of the semaphore (or the overflow pool); each starts one job.
    free: Vec<Permit>,
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
    /// Claim statements in flight (at most `qc.claimers`), and the jobs they asked for.
    claims: FuturesUnordered<BoxFuture<'static, ClaimDone>>,
    reserved: usize,
    /// The weighted queue's overflow pool and its index there.
    overflow: Option<(Arc<SharedPool>, usize)>,
    /// Whether this queue told the pool it has work.
    demanding: bool,
    bucket: Option<TokenBucket>,
    /// The rate limit left no whole token: no claim before this.
    tokens_at: Option<Instant>,
    /// Claim exactly for the slots held (weighted or rate-limited queues).
    exact: bool,
}

impl Dispatcher {
    fn new(shared: Arc<Shared>, queue: String, qc: QueueConfig) -> Self {
        let forced = crate::seams::forced_claim_ahead(&queue);
        let overflow = shared
            .overflow
            .as_ref()
            .and_then(|p| p.index(&queue).map(|i| (p.clone(), i)));
        let bucket = qc
            .rate_limit
            .map(|r| TokenBucket::new(r.max_rate, r.burst, Instant::now()));
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
            claims: FuturesUnordered::new(),
            reserved: 0,
            exact: overflow.is_some() || bucket.is_some(),
            overflow,
            demanding: false,
            bucket,
            tokens_at: None,
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
                Event::Claimed(done) => self.claimed(done),
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
        if self.tokens_at.is_some_and(|t| t <= now) {
            self.tokens_at = None;
        }
    }

    /// A weighted queue has work (or is finding out whether it has) unless its last claim
    /// came back short and it waits for a wake-up or the poll, backs off after an error, or
    /// stops (see `executor::pool`). Holding free slots does not change it, so it is stable
    /// while the queue is saturated.
    fn update_demand(&mut self) {
        let Some((pool, i)) = &self.overflow else {
            return;
        };
        let demanding = self.idle_until.is_none()
            && self.backoff_until.is_none()
            && !self.shared.stop_claiming.is_cancelled();
        if demanding != self.demanding {
            self.demanding = demanding;
            pool.set_demand(*i, demanding);
        }
        if !demanding {
            // No work known: hold no overflow slot a job does not need.
            self.return_overflow();
        }
    }

    /// Ask the overflow pool for a slot: a weighted queue with work, nothing free and nothing
    /// waiting, and a claim statement to spare.
    fn wants_overflow(&self) -> bool {
        self.overflow.is_some()
            && self.demanding
            && self.free.is_empty()
            && self.buffer.is_empty()
            && self.claims.len() < self.qc.claimers
            && self.tokens_at.is_none()
    }

    /// Give back the overflow slots this queue holds beyond the jobs waiting for a slot and
    /// those the claims in flight may bring.
    fn return_overflow(&mut self) {
        if self.overflow.is_none() {
            return;
        }
        let needed = self.buffer.len() + self.reserved;
        let mut spare = self.free.len().saturating_sub(needed);
        self.free.retain(|p| {
            if spare > 0 && !p.is_local() {
                spare -= 1;
                false
            } else {
                true
            }
        });
    }

    /// A free slot, the queue's own first (so overflow slots are the ones left to give back).
    fn take_permit(&mut self) -> Option<Permit> {
        match self.free.iter().position(Permit::is_local) {
            Some(i) => Some(self.free.swap_remove(i)),
            None => self.free.pop(),
        }
    }

    async fn next_event(&mut self) -> Event {
        let coalesce = self.coalescing_since.map(|t| t + claim_ahead::COALESCE);
        let expiry = self.buffer.front().map(|c| c.claimed_at + self.max_wait);
        let timer = [
            self.idle_until,
            self.backoff_until,
            coalesce,
            expiry,
            self.tokens_at,
        ]
        .into_iter()
        .flatten()
        .min();
        let idle = self.idle_until.is_some();
        let overflow = if self.wants_overflow() {
            self.overflow.clone()
        } else {
            None
        };
        // Disjoint borrows: the claims are polled in place while the other branches wait.
        let (claims, stop, wake) = (&mut self.claims, &self.shared.stop_claiming, &self.wake);
        let slots = self.slots.clone();
        let event = tokio::select! {
            biased;
            _ = stop.cancelled() => Event::Stop,
            Some(done) = claims.next(), if !claims.is_empty() => Event::Claimed(done),
            p = slots.acquire_owned() => match p {
                Ok(p) => Event::SlotFreed(Permit::Local(p)),
                Err(_) => Event::Stop,
            },
            p = async {
                match &overflow {
                    Some((pool, i)) => pool.acquire(*i).await,
                    None => std::future::pending().await,
                }
            } => Event::SlotFreed(Permit::Shared(p)),
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
            self.free.push(Permit::Local(p));
            self.suspended = false;
        }
        while !self.buffer.is_empty() && !self.free.is_empty() {
            if let Some(permit) = self.take_permit() {
                if let Some(claimed) = self.buffer.pop_front() {
                    self.start(claimed, permit);
                }
            }
        }
        // A weighted queue with work takes as many overflow slots as the pool gives it now
        // (up to a full claim), so one claim serves them all.
        self.update_demand();
        if let Some((pool, i)) = self.overflow.clone() {
            if self.demanding
                && self.buffer.is_empty()
                && self.tokens_at.is_none()
                && self.claims.len() < self.qc.claimers
            {
                let limit = self.claim_max();
                while self.free.len() < limit {
                    match pool.try_acquire(i) {
                        Some(p) => self.free.push(Permit::Shared(p)),
                        None => break,
                    }
                }
            }
        }
    }

    fn claim_max(&self) -> usize {
        self.qc
            .claim_batch
            .unwrap_or(self.shared.config.claim_batch)
            .max(1)
    }

    fn start(&self, claimed: Claimed, permit: Permit) {
        self.shared.inflight.handler_started();
        let slot = Slot::new(permit, self.pace.clone());
        tokio::spawn(run_job(self.shared.clone(), self.qc.clone(), claimed, slot));
    }

    /// Start claims while the plan says so and a claim statement is to spare.
    fn decide(&mut self) {
        self.update_demand();
        while self.claims.len() < self.qc.claimers.max(1) {
            if !self.decide_one() {
                break;
            }
        }
        if self.tokens_at.is_some() {
            // Waiting for tokens: hold no overflow slot no claim can use meanwhile.
            self.return_overflow();
        }
        self.update_demand();
    }

    /// Start one claim if the plan says so; whether one was started.
    fn decide_one(&mut self) -> bool {
        if self.idle_until.is_some()
            || self.backoff_until.is_some()
            || self.tokens_at.is_some()
            || self.shared.stop_claiming.is_cancelled()
        {
            return false;
        }
        let now = Instant::now();
        // Slots promised to the claims in flight are not free; beyond the free slots they
        // count as jobs already waiting.
        let free = self.free.len();
        let max_workers = match &self.overflow {
            Some((pool, _)) => self.qc.max_workers + pool.capacity(),
            None => self.qc.max_workers,
        };
        let view = View {
            max_workers: max_workers.max(1),
            claim_max: self.claim_max(),
            free: free.saturating_sub(self.reserved),
            buffered: self.buffer.len() + self.reserved.saturating_sub(free),
            backlog: self.backlog,
            suspended: self.suspended || self.exact,
            forced: self.forced && !self.exact,
            coalesced: self
                .coalescing_since
                .is_some_and(|t| now >= t + claim_ahead::COALESCE),
            slot_time: self.pace.slot.get(),
            claim_time: self.pace.claim.get(),
        };
        match claim_ahead::plan(&view) {
            Plan::Claim(mut n) => {
                if let Some(bucket) = self.bucket.as_mut() {
                    let tokens = bucket.available(now);
                    if tokens == 0 {
                        self.tokens_at = Some(bucket.next_token_at(now));
                        return false;
                    }
                    n = n.min(tokens);
                    bucket.take(n, now);
                }
                self.coalescing_since = None;
                let (pool, queue, deadline, aging) = (
                    self.shared.pool.clone(),
                    self.queue.clone(),
                    self.qc.deadline,
                    self.qc.priority_aging,
                );
                self.reserved += n;
                self.claims.push(Box::pin(async move {
                    let result = pool.engine().claim(&pool, &queue, n, deadline, aging).await;
                    ClaimDone {
                        result,
                        wanted: n,
                        sent: now,
                    }
                }));
                true
            }
            Plan::Coalesce => {
                self.coalescing_since.get_or_insert(now);
                false
            }
            Plan::Wait => {
                self.coalescing_since = None;
                false
            }
        }
    }

    fn claimed(&mut self, done: ClaimDone) {
        let ClaimDone {
            result,
            wanted,
            sent,
        } = done;

        self.reserved = self.reserved.saturating_sub(wanted);
        let got = result.as_ref().map_or(0, Vec::len);
        if let Some(bucket) = self.bucket.as_mut() {
            bucket.refund(wanted.saturating_sub(got));
        }
        let jobs = match result {
            Ok(jobs) => jobs,
            Err(e) => {
                // Back off on errors (database down, schema missing) instead of spinning.
                tracing::warn!(queue = %self.queue, error = %e, "claim failed");
                self.backoff_until = Some(
                    Instant::now() + self.shared.config.poll_interval.max(Duration::from_secs(1)),
                );
                self.return_overflow();
                return;
            }
        };
        metrics::add(&metrics::CLAIM_STATEMENTS, 1);
        self.pace.claim.record(sent.elapsed());
        let n = jobs.len();
        self.backlog = n == wanted;
        if n < wanted {
            // Queue drained: wait for a notification or the poll interval.
            self.idle_until = Some(Instant::now() + self.shared.config.poll_interval);
        }
        if n == 0 {
            if self.claims.is_empty() {
                self.return_overflow();
            }
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
            record_claim(&job);
            let claimed = Claimed::register(&self.shared.inflight, job, sent);
            self.buffer.push_back(claimed);
        }
        if n < wanted && self.claims.is_empty() {
            self.return_overflow();
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
        while let Some(done) = self.claims.next().await {
            self.claimed(done);
        }
        let unstarted: Vec<Claimed> = self.buffer.drain(..).collect();
        self.release(unstarted).await;
        self.update_demand();
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
            self.shared
                .pool
                .engine()
                .release(&self.shared.pool, &ids, &leases),
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
    fn run_when_free(&mut self, claimed: Claimed) {
        if let Some(permit) = self.take_permit() {
            self.start(claimed, permit);
            return;
        }
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
                Some(p) => run_job(shared, qc, claimed, Slot::new(Permit::Local(p), pace)).await,
                None => {
                    metrics::add(&metrics::JOBS_ABANDONED, 1);
                    shared.inflight.handler_done();
                    shared.inflight.remove(claimed.job.id);
                }
            }
        });
    }
}

/// Count a claim and how long the job waited, due, for it: from `run_at` (or its creation, if
/// later) to the claim, both read from the database's clock.
fn record_claim(job: &crate::model::JobRow) {
    use crate::metrics::series::{observe, record, JobEvent, Timing};
    record(&job.kind, &job.queue, JobEvent::Claimed, 1);
    if let Some(claimed) = job.attempted_at {
        let due = job.run_at.max(job.created_at);
        if let Ok(waited) = (claimed - due).to_std() {
            observe(&job.kind, &job.queue, Timing::Wait, waited);
        } else {
            observe(
                &job.kind,
                &job.queue,
                Timing::Wait,
                std::time::Duration::ZERO,
            );
        }
    }
}
