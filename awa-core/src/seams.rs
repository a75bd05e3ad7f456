//! Fault-injection seams for tests (feature `test-seams`). Production builds compile every
//! check to nothing.
//!
//! A test arms a fault at a point of finalization for one job (or any job); the next time the
//! finalizer passes that point for a matching job, the fault fires once.
//!
//! A test can also force claim-ahead on a queue (`force_claim_ahead`): the dispatcher then
//! buffers a full batch whenever the queue has a backlog, whatever it measured, so a test can
//! hold handlers on a gate and still have jobs waiting in the buffer. Keyed by queue name,
//! like faults by job id, so tests running in parallel do not see each other's.
//!
//! A test can hold the runner at the instant a handler's outcome has been handed over
//! (`hold_after_return`): the runner (and `testing::work_one`) then waits there until the
//! test calls `release`, so a task the handler spawned can try to stage while the attempt is
//! known to be past its return and not yet finalized. Keyed by the attempt's staging buffer
//! (not by job id, which repeats across the test databases of one process).
//!
//! A test can also hold a per-job finalization that lost its connection just before it waits
//! for a working one (`hold_reconnect`, keyed by job id: use `isolate_ids`).
//!
//! The completer records which path each job's completion was sent on (`sent_on`), so a test
//! that runs on both completion paths can check it really took the one it asked for. The
//! fault points fire on both paths: a batched completion fails (or loses its
//! acknowledgement) as a whole when any of its jobs has a fault armed.

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Inside the completion transaction, just before COMMIT: the transaction is rolled back
    /// and the finalizer sees a lost connection.
    BeforeCommit,
    /// Just after COMMIT succeeded: the finalizer sees a lost connection, as if the
    /// acknowledgement was lost.
    AfterCommit,
}

/// The completion path a finalization was sent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The batched completer: many completions (and their follow-ups) per transaction.
    Batched,
    /// A transaction of its own (every non-`Completed` outcome, the fallback of a failed
    /// batch, and with `batch_follow_ups` off any completion with follow-ups).
    PerJob,
}

#[cfg(feature = "test-seams")]
mod imp {
    use super::{Path, Point};
    use std::sync::Mutex;

    struct Armed {
        point: Point,
        job_id: Option<i64>,
        remaining: u32,
    }

    static ARMED: Mutex<Vec<Armed>> = Mutex::new(Vec::new());
    static HITS: Mutex<Vec<(Point, i64)>> = Mutex::new(Vec::new());

    /// Fire `times` times at `point` for `job_id` (or any job when `None`).
    pub fn arm(point: Point, job_id: Option<i64>, times: u32) {
        ARMED.lock().unwrap_or_else(|p| p.into_inner()).push(Armed {
            point,
            job_id,
            remaining: times,
        });
    }

    /// How many times a fault fired at `point` for `job_id`.
    pub fn hits(point: Point, job_id: i64) -> usize {
        HITS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(p, j)| *p == point && *j == job_id)
            .count()
    }

    static CLAIM_AHEAD: Mutex<Vec<(String, std::time::Duration)>> = Mutex::new(Vec::new());

    /// Make dispatchers of `queue` started from now on claim a full batch ahead whenever the
    /// queue has a backlog, and release buffered jobs after `max_wait`.
    pub fn force_claim_ahead(queue: &str, max_wait: std::time::Duration) {
        CLAIM_AHEAD
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((queue.to_string(), max_wait));
    }

    pub(crate) fn forced_claim_ahead(queue: &str) -> Option<std::time::Duration> {
        CLAIM_AHEAD
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .rev()
            .find(|(q, _)| q == queue)
            .map(|(_, w)| *w)
    }

    /// One armed hold: `held` once the runner reached it, `go` gets a permit on release.
    struct Hold {
        key: usize,
        held: bool,
        go: std::sync::Arc<tokio::sync::Semaphore>,
    }

    static HOLDS: Mutex<Vec<Hold>> = Mutex::new(Vec::new());

    /// Longest a held runner waits for [`release`] before it goes on by itself (a test that
    /// forgot to release must not hang the suite).
    const HOLD_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

    fn key(f: &crate::follow_ups::FollowUps) -> usize {
        f.identity()
    }

    /// Reconnect holds are keyed by job id, kept apart from buffer addresses by the top bit.
    fn reconnect_key(job_id: i64) -> usize {
        (job_id as usize) | (1 << (usize::BITS - 1))
    }

    fn arm_hold(k: usize) {
        HOLDS.lock().unwrap_or_else(|p| p.into_inner()).push(Hold {
            key: k,
            held: false,
            go: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
        });
    }

    fn held(k: usize) -> bool {
        HOLDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|h| h.key == k && h.held)
    }

    fn release_key(k: usize) {
        for h in HOLDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|h| h.key == k)
        {
            h.go.add_permits(1);
        }
    }

    async fn wait_at(k: usize) {
        let go = {
            let mut holds = HOLDS.lock().unwrap_or_else(|p| p.into_inner());
            match holds.iter_mut().find(|h| h.key == k) {
                Some(h) => {
                    h.held = true;
                    h.go.clone()
                }
                None => return,
            }
        };
        let _ = tokio::time::timeout(HOLD_LIMIT, go.acquire()).await;
        HOLDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|h| h.key != k);
    }

    /// Hold the per-job finalization of `job_id` when, after a lost connection, it is about
    /// to wait for a working one, until [`release_reconnect`]: a test can then watch what
    /// happens to the job meanwhile (it stays in flight and keeps being heartbeated).
    pub fn hold_reconnect(job_id: i64) {
        arm_hold(reconnect_key(job_id));
    }

    /// Whether the finalization of `job_id` waits at the reconnect hold.
    pub fn is_reconnect_held(job_id: i64) -> bool {
        held(reconnect_key(job_id))
    }

    /// Let the finalization of `job_id` go on.
    pub fn release_reconnect(job_id: i64) {
        release_key(reconnect_key(job_id));
    }

    /// The finalizer's side of [`hold_reconnect`].
    pub(crate) async fn reconnecting(job_id: i64) {
        wait_at(reconnect_key(job_id)).await;
    }

    /// Hold the runner of the attempt owning `f` once its handler has returned, until
    /// [`release`].
    pub fn hold_after_return(f: &crate::follow_ups::FollowUps) {
        arm_hold(key(f));
    }

    /// Whether the runner of `f`'s attempt is waiting at the hold.
    pub fn is_held(f: &crate::follow_ups::FollowUps) -> bool {
        held(key(f))
    }

    /// Let the runner of `f`'s attempt go on.
    pub fn release(f: &crate::follow_ups::FollowUps) {
        release_key(key(f));
    }

    /// The runner's side: wait here if a hold is armed for `f`'s attempt.
    pub(crate) async fn after_return(f: &crate::follow_ups::FollowUps) {
        wait_at(key(f)).await;
    }

    static SENT: Mutex<Vec<(i64, Path)>> = Mutex::new(Vec::new());

    /// The completer's side of [`sent_on`].
    pub(crate) fn sent(job_id: i64, path: Path) {
        SENT.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((job_id, path));
    }

    /// The paths the completions of `job_id` were sent on, in order (a batch that fell back
    /// shows `[Batched, PerJob]`). Only completions that went through a running client's
    /// completer are recorded, not `finalize_with_retry` or `work_one` called directly.
    pub fn sent_on(job_id: i64) -> Vec<Path> {
        SENT.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(j, _)| *j == job_id)
            .map(|(_, p)| *p)
            .collect()
    }

    /// [`check`] for a batch: fires for the first of `job_ids` with a fault armed at `point`.
    pub(crate) fn check_any(point: Point, job_ids: &[i64]) -> Result<(), sqlx::Error> {
        job_ids.iter().try_for_each(|id| check(point, *id))
    }

    pub(crate) fn check(point: Point, job_id: i64) -> Result<(), sqlx::Error> {
        let mut armed = ARMED.lock().unwrap_or_else(|p| p.into_inner());
        let hit = armed
            .iter_mut()
            .find(|a| a.point == point && a.remaining > 0 && a.job_id.is_none_or(|j| j == job_id));
        if let Some(a) = hit {
            a.remaining -= 1;
            HITS.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((point, job_id));
            return Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                format!("injected fault at {point:?}"),
            )));
        }
        Ok(())
    }
}

#[cfg(feature = "test-seams")]
pub use imp::{
    arm, force_claim_ahead, hits, hold_after_return, hold_reconnect, is_held, is_reconnect_held,
    release, release_reconnect, sent_on,
};

#[cfg(feature = "test-seams")]
pub(crate) use imp::{after_return, check, check_any, forced_claim_ahead, reconnecting, sent};

#[cfg(not(feature = "test-seams"))]
#[inline(always)]
pub(crate) fn sent(_job_id: i64, _path: Path) {}

#[cfg(not(feature = "test-seams"))]
#[inline(always)]
pub(crate) fn check_any(_point: Point, _job_ids: &[i64]) -> Result<(), sqlx::Error> {
    Ok(())
}

#[cfg(not(feature = "test-seams"))]
#[inline(always)]
pub(crate) async fn after_return(_f: &crate::follow_ups::FollowUps) {}

#[cfg(not(feature = "test-seams"))]
#[inline(always)]
pub(crate) async fn reconnecting(_job_id: i64) {}

#[cfg(not(feature = "test-seams"))]
#[inline(always)]
pub(crate) fn forced_claim_ahead(_queue: &str) -> Option<std::time::Duration> {
    None
}

#[cfg(not(feature = "test-seams"))]
#[inline(always)]
pub(crate) fn check(_point: Point, _job_id: i64) -> Result<(), sqlx::Error> {
    Ok(())
}
