//! Fault-injection seams for tests (feature `test-seams`). Production builds compile every
//! check to nothing.
//!
//! A test arms a fault at a point of finalization for one job (or any job); the next time the
//! finalizer passes that point for a matching job, the fault fires once.
//!
//! A test can also force claim-ahead on a queue ([`force_claim_ahead`]): the dispatcher then
//! buffers a full batch whenever the queue has a backlog, whatever it measured, so a test can
//! hold handlers on a gate and still have jobs waiting in the buffer. Keyed by queue name,
//! like faults by job id, so tests running in parallel do not see each other's.

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

#[cfg(feature = "test-seams")]
mod imp {
    use super::Point;
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
pub use imp::{arm, force_claim_ahead, hits};

#[cfg(feature = "test-seams")]
pub(crate) use imp::{check, forced_claim_ahead};

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
