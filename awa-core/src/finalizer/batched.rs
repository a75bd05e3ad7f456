//! The batched completion path: many `Completed` jobs in one commit.
//!
//! - Plain completions (nothing to insert) are one statement ([`complete_batch`]).
//! - Completions with follow-ups (registered Completed specs, staged follow-ups, or a mix
//!   with plain ones) are one transaction ([`complete_batch_with_follow_ups`]): the guarded
//!   completion of every `(id, running, run_lease)` returning the rows that matched, then one
//!   insert of the follow-ups of exactly those rows, in batch order and, per job, registered
//!   specs first and then the staged follow-ups in staging order, duplicates skipped by
//!   `ON CONFLICT DO NOTHING` on `idx_awa_jobs_unique` (`storage::insert`). A row that
//!   matched nothing is stale: its follow-ups are not sent. A failure that a retry of the
//!   batch cannot fix (a non-duplicate insert error, or a conflict on every try) has rolled
//!   the whole batch back, and each of its jobs is then finalized alone on the per-job path,
//!   so one bad row costs the others one extra transaction, not their completion.
//!
//! Retries are those of the per-job path ([`retry`]): each try is a new transaction with the
//! same sealed follow-ups, borrowed, never drained; a batch whose commit landed but whose
//! acknowledgement was lost replays as stale (its rows are no longer `running`) and inserts
//! nothing. See docs/follow-ups.md for why this keeps every guarantee of ADR-046.

use crate::error::AwaError;
use crate::finalizer::per_job::{push_due_queues, record_insert};
use crate::finalizer::retry::{self, Failure, Ready, RetryPolicy};
use crate::finalizer::waker::Waker;
use crate::finalizer::{finalize_with_retry_via, Finalization, Finalized, MAX_FINALIZE_ATTEMPTS};
use crate::metrics;
use crate::model::NewJob;
use crate::seams::{self, Point};
use crate::specs::{SpecEvent, Specs};
use crate::storage::engine::Engine;
use crate::storage::pool::Db;
use crate::storage::wake_queues;
use sqlx::pool::PoolConnection;
use sqlx::{Acquire, PgConnection, Postgres};
use std::collections::HashSet;

/// Complete every `(id, run_lease)` pair that is still running under that lease; pairs that
/// match nothing are stale and ignored. Returns the ids that completed. Retries with the
/// default [`RetryPolicy`] (see [`complete_batch_with`]).
pub async fn complete_batch(pool: &Db, ids: &[i64], leases: &[i64]) -> Result<Vec<i64>, AwaError> {
    complete_batch_with(pool, ids, leases, &RetryPolicy::default()).await
}

/// [`complete_batch`] with an explicit retry policy.
///
/// Retries like a per-job finalization ([`retry`]): a deadlock at once, a lost connection once
/// the pool hands out a working connection again, at most [`MAX_FINALIZE_ATTEMPTS`] tries in
/// all. A batch whose commit landed but whose acknowledgement was lost replays as stale (its
/// rows are no longer `running`), so it is never applied twice.
pub async fn complete_batch_with(
    pool: &Db,
    ids: &[i64],
    leases: &[i64],
    policy: &RetryPolicy,
) -> Result<Vec<i64>, AwaError> {
    let reconnect = retry::Reconnect::start(policy);
    let mut conn: Option<PoolConnection<Postgres>> = None;
    let mut attempt = 1;
    loop {
        let result = match seams::check_any(Point::BeforeCommit, ids) {
            Err(e) => Err(e.into()),
            Ok(()) => complete_plain(pool, conn.take(), ids, leases).await,
        };
        let result = result.and_then(|done| {
            seams::check_any(Point::AfterCommit, ids)?;
            Ok(done)
        });
        let e = match result {
            Ok(done) => {
                metrics::add(&metrics::COMPLETION_BATCHES, 1);
                metrics::add(&metrics::JOBS_COMPLETED_BATCHED, done.len() as u64);
                let stale = ids.len() - done.len();
                if stale > 0 {
                    metrics::add(&metrics::FINALIZE_STALE, stale as u64);
                    tracing::debug!(stale, "batched completion skipped stale attempts");
                }
                return Ok(done);
            }
            Err(e) => e,
        };
        let failure = retry::classify(&e);
        if failure != Failure::Permanent && attempt < MAX_FINALIZE_ATTEMPTS {
            let ready = if failure == Failure::ConnectionLost {
                for id in ids {
                    seams::reconnecting(*id).await;
                }
                reconnect.working_connection(pool).await
            } else {
                Ready::Now
            };
            match ready {
                Ready::On(c) => conn = Some(c),
                Ready::Now => {}
                Ready::GaveUp => return Err(gave_up(ids.len(), e)),
            }
            metrics::add(&metrics::FINALIZE_RETRIES, 1);
            tracing::warn!(attempt, jobs = ids.len(), error = %e, "batched completion failed; retrying");
            attempt += 1;
            continue;
        }
        return Err(gave_up(ids.len(), e));
    }
}

/// One plain batch completion statement on the pool's engine (on `conn` when a retry passes
/// the connection that just answered a ping); the ids that completed.
async fn complete_plain(
    pool: &Db,
    conn: Option<PoolConnection<Postgres>>,
    ids: &[i64],
    leases: &[i64],
) -> Result<Vec<i64>, AwaError> {
    let done = match conn {
        Some(mut c) => pool.engine().complete_in(&mut *c, ids, leases).await?,
        None => pool.engine().complete_in(pool, ids, leases).await?,
    };
    Ok(done.into_iter().map(|(id, _)| id).collect())
}

fn gave_up(jobs: usize, e: impl Into<AwaError>) -> AwaError {
    let e = e.into();
    metrics::add(&metrics::FINALIZE_GAVE_UP, jobs as u64);
    tracing::error!(jobs, error = %e, "batched completion failed; the jobs stay running until rescue");
    e
}

/// One completion of a batch with follow-ups: its finalization and the registered Completed
/// specs' follow-ups, built once before the first try.
pub(crate) struct Member<'a> {
    pub fin: &'a Finalization,
    pub specs: Vec<NewJob>,
}

impl<'a> Member<'a> {
    /// Build the member of `fin`; an error of a spec closure is returned (the job is then
    /// finalized alone, where the same error is reported as on the per-job path).
    pub(crate) fn new(fin: &'a Finalization, specs: &Specs) -> Result<Self, AwaError> {
        let specs = if specs.has(&fin.job.kind, SpecEvent::Completed) {
            specs.follow_ups(&fin.job, SpecEvent::Completed)?
        } else {
            Vec::new()
        };
        Ok(Member { fin, specs })
    }

    /// Whether its completion inserts anything.
    pub(crate) fn has_follow_ups(&self) -> bool {
        !self.specs.is_empty() || !self.fin.follow_ups.is_empty()
    }

    /// What its completion inserts: registered specs first, then the staged follow-ups in
    /// staging order (ADR-046, "How they are inserted").
    fn follow_ups(&self) -> impl Iterator<Item = &NewJob> {
        self.specs
            .iter()
            .chain(self.fin.follow_ups.follow_ups.iter().map(|s| &s.job))
    }
}

/// Why a batch with follow-ups did not commit. Either way nothing of it committed (or, after
/// a lost acknowledgement, what committed replays as stale).
#[derive(Debug)]
pub(crate) enum BatchFailed {
    /// A try failed in a way another try of the batch cannot fix (a non-duplicate insert
    /// error, or a conflict on every try): finalize each job alone on the per-job path.
    FallBack,
    /// No working connection came back within the reconnect budget: the jobs stay running
    /// until rescue, as on the per-job path.
    GaveUp(AwaError),
}

/// Complete `members` and insert the follow-ups of those whose guard matched, in one
/// transaction, retrying like a per-job finalization. Returns the `(id, run_lease)` pairs
/// that completed; the others were stale and inserted nothing. The queues of the due
/// follow-ups are woken after the commit (through `waker` when given, else at once).
pub(crate) async fn complete_members(
    pool: &Db,
    members: &[Member<'_>],
    waker: Option<&Waker>,
    policy: &RetryPolicy,
) -> Result<Vec<(i64, i64)>, BatchFailed> {
    let ids: Vec<i64> = members.iter().map(|m| m.fin.job.id).collect();
    let leases: Vec<i64> = members.iter().map(|m| m.fin.job.run_lease).collect();
    let reconnect = retry::Reconnect::start(policy);
    let mut conn: Option<PoolConnection<Postgres>> = None;
    let mut attempt = 1;
    loop {
        let tried = async {
            let mut c = match conn.take() {
                Some(c) => c,
                None => pool.acquire().await?,
            };
            try_members(pool.engine(), &mut c, members, &ids, &leases).await
        }
        .await;
        let e = match tried {
            Ok((done, woken)) => {
                settle_members(members, &done, attempt == 1);
                wake(pool, waker, woken).await;
                return Ok(done);
            }
            Err(e) => e,
        };
        let failure = retry::classify(&e);
        if failure != Failure::Permanent && attempt < MAX_FINALIZE_ATTEMPTS {
            if failure == Failure::ConnectionLost {
                for id in &ids {
                    seams::reconnecting(*id).await;
                }
                match reconnect.working_connection(pool).await {
                    Ready::On(c) => conn = Some(c),
                    Ready::Now => {}
                    Ready::GaveUp => {
                        return Err(BatchFailed::GaveUp(gave_up(ids.len(), e)));
                    }
                }
            }
            metrics::add(&metrics::FINALIZE_RETRIES, 1);
            tracing::warn!(attempt, jobs = ids.len(), error = %e,
                "batched completion with follow-ups failed; retrying in a new transaction");
            attempt += 1;
            continue;
        }
        if failure == Failure::ConnectionLost {
            return Err(BatchFailed::GaveUp(gave_up(ids.len(), e)));
        }
        tracing::warn!(attempt, jobs = ids.len(), error = %e,
            "batched completion with follow-ups rolled back; finalizing its jobs one by one");
        return Err(BatchFailed::FallBack);
    }
}

/// One try: the guarded completion, the follow-ups of the rows that matched, the commit.
/// Returns the pairs that matched and the queues to wake.
async fn try_members(
    engine: &Engine,
    conn: &mut PgConnection,
    members: &[Member<'_>],
    ids: &[i64],
    leases: &[i64],
) -> Result<(Vec<(i64, i64)>, Vec<String>), AwaError> {
    let mut tx = conn.begin().await?;
    let done = engine.complete_in(&mut *tx, ids, leases).await?;
    let matched: HashSet<(i64, i64)> = done.iter().copied().collect();
    let live: Vec<&Member> = members
        .iter()
        .filter(|m| matched.contains(&(m.fin.job.id, m.fin.job.run_lease)))
        .collect();
    let jobs: Vec<&NewJob> = live.iter().flat_map(|m| m.follow_ups()).collect();
    let results = engine.insert_follow_ups_in_tx(&mut tx, &jobs).await?;
    seams::check_any(Point::BeforeCommit, ids)?;
    tx.commit().await?;
    seams::check_any(Point::AfterCommit, ids)?;
    let mut results = results.into_iter();
    for m in &live {
        let job = &m.fin.job;
        for (spec, result) in m.specs.iter().zip(results.by_ref()) {
            record_insert(job.id, spec, result);
        }
        for (staged, result) in m.fin.follow_ups.follow_ups.iter().zip(results.by_ref()) {
            tracing::debug_span!(parent: &staged.span, "awa.enqueue_follow_up",
                trigger_job_id = job.id, kind = %staged.job.kind)
            .in_scope(|| record_insert(job.id, &staged.job, result));
        }
    }
    let mut woken = Vec::new();
    push_due_queues(&mut woken, jobs.into_iter());
    Ok((done, woken))
}

/// Count what a committed batch did; the stale members' follow-ups were discarded (unless a
/// retry after a lost acknowledgement found its own commit).
fn settle_members(members: &[Member<'_>], done: &[(i64, i64)], first_try: bool) {
    metrics::add(&metrics::COMPLETION_BATCHES, 1);
    metrics::add(&metrics::JOBS_COMPLETED_BATCHED, done.len() as u64);
    let matched: HashSet<&(i64, i64)> = done.iter().collect();
    for m in members {
        if matched.contains(&(m.fin.job.id, m.fin.job.run_lease)) {
            metrics::series::record(
                &m.fin.job.kind,
                &m.fin.job.queue,
                metrics::series::JobEvent::Completed,
                1,
            );
        }
    }
    let stale: Vec<&Member> = members
        .iter()
        .filter(|m| !matched.contains(&(m.fin.job.id, m.fin.job.run_lease)))
        .collect();
    if stale.is_empty() {
        return;
    }
    metrics::add(&metrics::FINALIZE_STALE, stale.len() as u64);
    if first_try {
        let discarded: usize = stale
            .iter()
            .map(|m| m.fin.follow_ups.follow_ups.len())
            .sum();
        metrics::add(&metrics::STAGED_DISCARDED, discarded as u64);
    }
    for m in stale {
        tracing::debug!(
            job_id = m.fin.job.id,
            lease = m.fin.job.run_lease,
            "stale batched completion: the lease no longer runs this job"
        );
    }
}

/// Wake the queues that received follow-ups after a commit (through `waker` when given, else
/// with a NOTIFY of its own). Only a hint (polling is the safety net): a failure here must not
/// fail a committed finalization. Shared by both completion paths.
pub(super) async fn wake(pool: &Db, waker: Option<&Waker>, mut woken: Vec<String>) {
    if woken.is_empty() {
        return;
    }
    woken.sort_unstable();
    woken.dedup();
    match waker {
        Some(waker) => waker.request(&woken),
        None => {
            if let Err(e) = wake_queues(pool, &woken).await {
                tracing::debug!(error = %e, "follow-up wake-up failed; workers will find the jobs by polling");
            }
        }
    }
}

/// Finalize `Completed` finalizations together, as the runtime's batched completer does with
/// `batch_follow_ups` on: one transaction completes every job still running under its lease
/// and inserts exactly those jobs' follow-ups (registered specs from `specs`, then the staged
/// ones); a failure a retry cannot fix finalizes each job alone with
/// [`finalize_with_retry`](crate::finalizer::finalize_with_retry). Returns each
/// finalization's result in order, or an error when the batch lost its connection for good
/// (every job then stays running until rescue).
///
/// Every finalization must be `Completed`; any other is finalized alone.
pub async fn complete_batch_with_follow_ups(
    pool: &Db,
    fins: &[Finalization],
    specs: &Specs,
) -> Result<Vec<Result<Finalized, AwaError>>, AwaError> {
    let policy = RetryPolicy::default();
    let mut positions = Vec::with_capacity(fins.len());
    let mut batch = Vec::with_capacity(fins.len());
    let mut alone = Vec::new();
    for (i, fin) in fins.iter().enumerate() {
        let member = match fin.transition {
            crate::finalizer::Transition::Completed => Member::new(fin, specs).ok(),
            _ => None,
        };
        match member {
            Some(m) => {
                positions.push(i);
                batch.push(m);
            }
            None => alone.push(i),
        }
    }
    let mut results: Vec<Result<Finalized, AwaError>> = fins
        .iter()
        .map(|_| Err(AwaError::State("not finalized".into())))
        .collect();
    if !batch.is_empty() {
        match complete_members(pool, &batch, None, &policy).await {
            Ok(done) => {
                let matched: HashSet<(i64, i64)> = done.into_iter().collect();
                for (i, m) in positions.iter().zip(&batch) {
                    let applied = matched.contains(&(m.fin.job.id, m.fin.job.run_lease));
                    results[*i] = Ok(if applied {
                        Finalized::Applied
                    } else {
                        Finalized::Stale
                    });
                }
            }
            Err(BatchFailed::GaveUp(e)) => return Err(e),
            Err(BatchFailed::FallBack) => alone.extend(positions),
        }
    }
    alone.sort_unstable();
    for i in alone {
        results[i] = finalize_with_retry_via(pool, &fins[i], specs, None, &policy).await;
    }
    Ok(results)
}
