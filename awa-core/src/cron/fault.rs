//! Fault injection for the evaluator (feature `test-seams`; no-ops otherwise), kept here
//! rather than in `crate::seams` because its faults are keyed by schedule name, not job id.
//!
//! A test arms a point for one schedule; the next evaluation of that schedule that passes the
//! point fails there once, as a leader whose connection dies at that moment would.

/// Where the evaluator can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CronPoint {
    /// After the compare-and-set and the inserts, before COMMIT: everything rolls back.
    BeforeCommit,
    /// After COMMIT: the fires are enqueued but the evaluator reports an error.
    AfterCommit,
}

#[cfg(feature = "test-seams")]
mod imp {
    use super::CronPoint;
    use std::sync::Mutex;

    static ARMED: Mutex<Vec<(CronPoint, String)>> = Mutex::new(Vec::new());

    /// Fail once at `point` for the schedule `name`.
    pub fn arm(point: CronPoint, name: &str) {
        ARMED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((point, name.to_string()));
    }

    pub(crate) fn check(point: CronPoint, name: &str) -> Result<(), sqlx::Error> {
        let mut armed = ARMED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = armed.iter().position(|(p, n)| *p == point && n == name) {
            armed.remove(i);
            return Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                format!("injected fault at {point:?} for schedule {name:?}"),
            )));
        }
        Ok(())
    }
}

#[cfg(feature = "test-seams")]
pub use imp::arm;

#[cfg(feature = "test-seams")]
pub(crate) use imp::check;

#[cfg(not(feature = "test-seams"))]
#[inline(always)]
pub(crate) fn check(_point: CronPoint, _name: &str) -> Result<(), sqlx::Error> {
    Ok(())
}
