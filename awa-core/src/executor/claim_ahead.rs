//! Claim-ahead: when a dispatcher claims and how many, so that on a queue with a backlog the
//! next claim's round trip overlaps the handlers already running instead of following them.
//!
//! While the last claim came back full, a dispatcher may claim more jobs than it has free
//! slots; the extra ones wait in a small local buffer and start as slots free. A buffered job
//! is `running` in the database from the moment it is claimed: it is in the in-flight set, so
//! heartbeats renew it and a cancel request reaches it, but its deadline (`deadline_at`, set by
//! the claim) is already running. So the buffer is kept short-lived rather than refreshed
//! (refreshing would cost a statement per start, the very round trip claim-ahead saves):
//!
//! - it holds only what the queue's handlers are expected to start within [`HORIZON`],
//!   measured from how long a handler holds its slot ([`Pace`]): a no-op queue buffers a full
//!   batch, a queue of minute-long jobs buffers nothing;
//! - it never holds more than `max_workers` jobs (the claim is sized so that even if no slot
//!   frees meanwhile, what arrives fits);
//! - a job that waits longer than [`max_wait`] anyway (the estimate was wrong: fast jobs
//!   followed by slow ones) is released back to the queue, and claim-ahead pauses until a
//!   slot frees;
//! - the handler's local deadline counts from the claim, so waiting never stretches an
//!   attempt past the `deadline_at` rescue goes by.
//!
//! Idle queues are untouched: with no backlog a dispatcher claims exactly its free slots, at
//! once, which is what keeps pickup latency low.

use crate::executor::pool::Permit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How far ahead the buffer reaches: it holds what the handlers should start within this.
const HORIZON: Duration = Duration::from_millis(25);

/// Longest a dispatcher waits for a fuller claim (more slots about to free) before claiming
/// what it has room for.
pub(crate) const COALESCE: Duration = Duration::from_millis(3);

/// The most any buffered job waits for a slot before it is released.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// The longest a buffered job of a queue with this deadline may wait for a slot: a tenth of
/// its deadline at most, so a handler always keeps nine tenths of its time.
pub(crate) fn max_wait(deadline: Duration) -> Duration {
    MAX_WAIT.min(deadline / 10)
}

/// An exponentially weighted moving average of durations (weight 1/8 for each new sample),
/// shared without a lock; zero means no sample yet.
#[derive(Default)]
pub(crate) struct Ewma(AtomicU64);

impl Ewma {
    pub(crate) fn record(&self, sample: Duration) {
        let s = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX).max(1);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    s
                } else {
                    ((u128::from(old) * 7 + u128::from(s)) / 8).max(1) as u64
                })
            });
    }

    pub(crate) fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }
}

/// What one queue's dispatcher measures: how long a handler holds its slot (from start to the
/// slot's release) and how long a claim takes.
#[derive(Default)]
pub(crate) struct Pace {
    pub(crate) slot: Ewma,
    pub(crate) claim: Ewma,
}

/// A worker slot held by one running attempt. Releasing it records how long it was held.
pub(crate) struct Slot {
    _permit: Permit,
    pace: Arc<Pace>,
    since: Instant,
}

impl Slot {
    pub(crate) fn new(permit: Permit, pace: Arc<Pace>) -> Self {
        Slot {
            _permit: permit,
            pace,
            since: Instant::now(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Recorded before the permit is released, so the dispatcher woken by the free slot
        // already sees this sample.
        self.pace.slot.record(self.since.elapsed());
    }
}

/// What the dispatcher knows when it decides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    pub(crate) max_workers: usize,
    /// Most jobs one claim statement takes (`RuntimeConfig::claim_batch`).
    pub(crate) claim_max: usize,
    /// Slots free with no job waiting for them (zero whenever the buffer holds jobs).
    pub(crate) free: usize,
    /// Claimed jobs waiting for a slot.
    pub(crate) buffered: usize,
    /// The last claim came back full.
    pub(crate) backlog: bool,
    /// Claim-ahead paused: buffered jobs waited too long, and no slot has freed since.
    pub(crate) suspended: bool,
    /// Tests: claim a full batch ahead whenever there is a backlog, whatever was measured.
    pub(crate) forced: bool,
    /// The dispatcher already waited [`COALESCE`] for a fuller claim.
    pub(crate) coalesced: bool,
    pub(crate) slot_time: Option<Duration>,
    pub(crate) claim_time: Option<Duration>,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Claim this many now.
    Claim(usize),
    /// More room is moments away: decide again when a slot frees, or claim what there is
    /// room for once [`COALESCE`] has passed.
    Coalesce,
    /// Nothing to do until a slot frees or a claim returns.
    Wait,
}

/// How many claimed jobs may wait for a slot: those the handlers will start within
/// [`HORIZON`], at most `max_workers`, and none without a backlog.
pub(crate) fn prefetch(v: &View) -> usize {
    if !v.backlog || v.suspended {
        return 0;
    }
    if v.forced {
        return v.max_workers;
    }
    match v.slot_time {
        // Slots free at max_workers / slot_time per second while the queue is saturated.
        Some(d) if !d.is_zero() => {
            let n = v.max_workers as f64 * HORIZON.as_secs_f64() / d.as_secs_f64();
            (n as usize).min(v.max_workers)
        }
        Some(_) => v.max_workers,
        // No handler has finished yet: nothing is known about how fast slots free.
        None => 0,
    }
}

/// Whether to claim now, and how many.
pub(crate) fn plan(v: &View) -> Plan {
    let p = prefetch(v);
    // Free slots plus the prefetch allowance, less what already waits. Every claim fits in
    // this, so even if no slot frees while it is in flight, at most `max_workers` wait.
    let room = (v.free + p).saturating_sub(v.buffered);
    if room == 0 {
        return Plan::Wait;
    }
    if !v.backlog {
        // Idle or just woken: claim the free slots at once (pickup latency).
        return Plan::Claim(room.min(v.claim_max).max(1));
    }
    let target = v.claim_max.min(v.max_workers + p).max(1);
    if room >= target {
        return Plan::Claim(target);
    }
    if v.coalesced {
        return Plan::Claim(room);
    }
    let d = match v.slot_time {
        Some(d) => d,
        None if v.forced => Duration::ZERO,
        None => return Plan::Claim(room),
    };
    let rtt = v.claim_time.unwrap_or(COALESCE);
    // Time for n slots to free (or n buffered jobs to start) while all are busy.
    let turnover = |n: usize| d.mul_f64(n as f64 / v.max_workers as f64);
    // A full claim is a fraction of a round trip away: one statement for the lot is cheaper
    // than two (fewer commits per job), and no slot idles for long.
    if turnover(target - room) <= rtt / 4 {
        return Plan::Coalesce;
    }
    if v.free > 0 {
        // Slots idle now and a fuller claim is far off.
        return Plan::Claim(room);
    }
    // Every slot is busy: claim before the buffer runs dry (a claim takes a round trip),
    // once there is room for a worthwhile batch: at least half a full claim (or the whole
    // prefetch allowance when that is smaller), as a claim of n costs 1/n commits per job.
    if turnover(v.buffered) <= rtt * 2 && room >= (target / 2).min(p).max(1) {
        return Plan::Claim(room);
    }
    Plan::Wait
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> View {
        View {
            max_workers: 32,
            claim_max: 64,
            free: 0,
            buffered: 0,
            backlog: true,
            suspended: false,
            forced: false,
            coalesced: false,
            slot_time: Some(Duration::from_micros(50)),
            claim_time: Some(Duration::from_millis(2)),
        }
    }

    #[test]
    fn without_a_backlog_only_free_slots_are_claimed_and_at_once() {
        let v = View {
            backlog: false,
            free: 32,
            ..view()
        };
        assert_eq!(prefetch(&v), 0);
        assert_eq!(plan(&v), Plan::Claim(32));
        assert_eq!(plan(&View { free: 1, ..v }), Plan::Claim(1));
        assert_eq!(plan(&View { free: 0, ..v }), Plan::Wait);
    }

    #[test]
    fn fast_handlers_get_a_full_batch_ahead() {
        let v = view();
        assert_eq!(prefetch(&v), 32);
        // Everything free and nothing waiting: a full claim (32 to run, 32 to wait).
        assert_eq!(plan(&View { free: 32, ..v }), Plan::Claim(64));
        // A batch just arrived: 32 running, 32 buffered; no room.
        assert_eq!(plan(&View { buffered: 32, ..v }), Plan::Wait);
        // Half of it started: the rest frees within microseconds, so wait for a full claim.
        assert_eq!(plan(&View { buffered: 16, ..v }), Plan::Coalesce);
        assert_eq!(
            plan(&View {
                buffered: 16,
                coalesced: true,
                ..v
            }),
            Plan::Claim(16)
        );
    }

    #[test]
    fn handlers_about_as_long_as_a_claim_overlap_it() {
        let v = View {
            slot_time: Some(Duration::from_millis(2)),
            ..view()
        };
        assert_eq!(prefetch(&v), 32);
        // 16 buffered start within 1 ms, less than two round trips, but 16 is not half a
        // full claim yet: wait for more room.
        assert_eq!(plan(&View { buffered: 16, ..v }), Plan::Wait);
        // The buffer ran empty: claim the room that has opened (32), which lands before the
        // running handlers finish.
        assert_eq!(plan(&View { buffered: 0, ..v }), Plan::Claim(32));
    }

    #[test]
    fn slow_handlers_get_a_small_buffer_or_none() {
        let medium = View {
            slot_time: Some(Duration::from_millis(100)),
            ..view()
        };
        // 32 slots × 25 ms / 100 ms: eight start within the horizon.
        assert_eq!(prefetch(&medium), 8);
        // All busy, nothing waiting: claim the eight now (they start within the horizon).
        assert_eq!(plan(&medium), Plan::Claim(8));
        let slow = View {
            slot_time: Some(Duration::from_secs(60)),
            ..view()
        };
        assert_eq!(prefetch(&slow), 0);
        assert_eq!(plan(&slow), Plan::Wait);
        assert_eq!(plan(&View { free: 3, ..slow }), Plan::Claim(3));
    }

    #[test]
    fn nothing_measured_or_suspended_means_no_prefetch() {
        let v = View {
            slot_time: None,
            ..view()
        };
        assert_eq!(prefetch(&v), 0);
        assert_eq!(plan(&View { free: 5, ..v }), Plan::Claim(5));
        let s = View {
            suspended: true,
            ..view()
        };
        assert_eq!(prefetch(&s), 0);
        assert_eq!(plan(&s), Plan::Wait);
    }

    #[test]
    fn what_waits_never_exceeds_max_workers() {
        // Whatever the state, a claim fits: if it lands with no slot freed meanwhile, the
        // buffer holds at most max_workers.
        for max_workers in [1usize, 2, 7, 32, 100] {
            for slot_ms in [0u64, 1, 2, 50, 1000] {
                for free in 0..=max_workers {
                    for buffered in 0..=max_workers {
                        if free > 0 && buffered > 0 {
                            continue; // buffered jobs take free slots at once
                        }
                        for coalesced in [false, true] {
                            for forced in [false, true] {
                                let v = View {
                                    max_workers,
                                    claim_max: 64,
                                    free,
                                    buffered,
                                    backlog: true,
                                    suspended: false,
                                    forced,
                                    coalesced,
                                    slot_time: Some(Duration::from_millis(slot_ms)),
                                    claim_time: Some(Duration::from_millis(2)),
                                };
                                if let Plan::Claim(n) = plan(&v) {
                                    assert!((1..=64).contains(&n), "{v:?} -> {n}");
                                    assert!(
                                        (buffered + n).saturating_sub(free) <= max_workers,
                                        "{v:?} -> {n}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_wait_bound_follows_short_deadlines() {
        assert_eq!(max_wait(Duration::from_secs(1800)), MAX_WAIT);
        assert_eq!(max_wait(Duration::from_secs(2)), Duration::from_millis(200));
    }

    #[test]
    fn ewma_starts_at_the_first_sample_and_moves_an_eighth() {
        let e = Ewma::default();
        assert_eq!(e.get(), None);
        e.record(Duration::from_nanos(800));
        assert_eq!(e.get(), Some(Duration::from_nanos(800)));
        e.record(Duration::from_nanos(1600));
        assert_eq!(e.get(), Some(Duration::from_nanos(900)));
    }
}
