//! Worker slots: a queue's own (hard-reserved) slots, and the global pool weighted queues
//! share.
//!
//! With `global_max_workers` set, a weighted queue (`min_workers`, `weight`) owns
//! `min_workers` slots outright, as a hard-reserved queue owns its `max_workers`. What is left
//! of `global_max_workers` once every queue's own slots are counted is the shared **overflow
//! pool** of capacity `C`. Overflow slots go to the weighted queues that have work, in
//! proportion to their weights:
//!
//! 1. **Guaranteed minimums first.** A queue's own slots are never lent out, so a queue gets
//!    its `min_workers` however busy the others are.
//! 2. **The rest by weight among queues with work.** A queue *has work* (is *demanding*)
//!    unless its last claim came back short and it waits for a wake-up or its next poll (or it
//!    backs off after a claim error, or stops); a queue that polls is demanding for the one
//!    claim that finds out. Its quota is its largest-remainder share of `C` by weight among the
//!    demanding queues ([`quotas`]): the shares are whole slots and add up to `C` exactly.
//! 3. **Work-conserving, never pre-emptive.** A queue takes an overflow slot when one is free
//!    and it holds fewer than its quota. Running handlers are never stopped: a queue that took
//!    more while the others were idle keeps them until they finish, and each slot it frees
//!    then goes to a queue under its quota. So once every demanding queue has turned its
//!    slots over, each holds exactly its quota, and an idle queue's quota is spread over the
//!    busy ones.
//!
//! Slots of either kind are a [`Permit`]: dropping it frees the slot.

use crate::error::AwaError;
use crate::executor::config::QueueConfig;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, OwnedSemaphorePermit};

/// Check the queues against `global_max_workers` and build the overflow pool: `None` when no
/// queue is weighted. Every queue's own slots (`max_workers`, or `min_workers` when weighted)
/// count against the global limit, so the client never runs more than `global_max_workers`
/// handlers; what is left is the pool's capacity.
pub(crate) fn overflow_pool(
    global_max_workers: Option<usize>,
    queues: &HashMap<String, QueueConfig>,
) -> Result<Option<Arc<SharedPool>>, AwaError> {
    let mut weighted: Vec<(String, u32)> = queues
        .iter()
        .filter_map(|(q, c)| c.weight.map(|w| (q.clone(), w)))
        .collect();
    weighted.sort();
    let Some(global) = global_max_workers else {
        return match weighted.first() {
            Some((q, _)) => Err(AwaError::Config(format!(
                "queue {q:?} is weighted (min_workers, weight) but global_max_workers is not set"
            ))),
            None => Ok(None),
        };
    };
    let own: usize = queues.values().map(|c| c.max_workers).sum();
    if own > global {
        let what = if queues.values().all(|c| c.weight.is_some()) {
            "min_workers"
        } else {
            "min_workers and max_workers"
        };
        return Err(AwaError::Config(format!(
            "sum of {what} ({own}) exceeds global_max_workers ({global})"
        )));
    }
    if weighted.is_empty() {
        return Ok(None);
    }
    Ok(Some(SharedPool::new(global - own, weighted)))
}

/// One worker slot, held by a running attempt (or by a dispatcher about to claim for it).
pub(crate) enum Permit {
    /// One of the queue's own slots (`max_workers`, or `min_workers` when weighted).
    Local(#[allow(dead_code)] OwnedSemaphorePermit),
    /// A slot of the global overflow pool.
    Shared(#[allow(dead_code)] SharedPermit),
}

impl Permit {
    pub(crate) fn is_local(&self) -> bool {
        matches!(self, Permit::Local(_))
    }
}

/// A slot of the overflow pool; dropping it gives the slot back and wakes the queues waiting
/// for one.
pub(crate) struct SharedPermit {
    pool: Arc<SharedPool>,
    queue: usize,
}

impl Drop for SharedPermit {
    fn drop(&mut self) {
        self.pool.release(self.queue);
    }
}

struct PoolState {
    held: Vec<usize>,
    demand: Vec<bool>,
}

/// The overflow pool shared by the weighted queues of one client.
pub(crate) struct SharedPool {
    capacity: usize,
    weights: Vec<u64>,
    names: Vec<String>,
    state: Mutex<PoolState>,
    changed: Notify,
}

impl SharedPool {
    /// A pool of `capacity` slots for the weighted queues `(name, weight)`; a queue is
    /// addressed by its index in this list.
    pub(crate) fn new(capacity: usize, queues: Vec<(String, u32)>) -> Arc<Self> {
        let n = queues.len();
        let (names, weights) = queues.into_iter().map(|(q, w)| (q, u64::from(w))).unzip();
        Arc::new(SharedPool {
            capacity,
            weights,
            names,
            state: Mutex::new(PoolState {
                held: vec![0; n],
                demand: vec![false; n],
            }),
            changed: Notify::new(),
        })
    }

    /// The index of a queue of this pool.
    pub(crate) fn index(&self, queue: &str) -> Option<usize> {
        self.names.iter().position(|q| q == queue)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Say whether `queue` has work (see the module docs); a change moves every quota.
    pub(crate) fn set_demand(&self, queue: usize, demanding: bool) {
        let mut s = self.lock();
        if let Some(d) = s.demand.get_mut(queue) {
            if *d != demanding {
                *d = demanding;
                drop(s);
                self.changed.notify_waiters();
            }
        }
    }

    /// An overflow slot for `queue` if one is free and the queue is under its quota.
    pub(crate) fn try_acquire(self: &Arc<Self>, queue: usize) -> Option<SharedPermit> {
        let mut s = self.lock();
        let in_use: usize = s.held.iter().sum();
        if in_use >= self.capacity || queue >= s.held.len() {
            return None;
        }
        let mut demand = s.demand.clone();
        demand[queue] = true;
        let quota = quotas(self.capacity, &self.weights, &demand)[queue];
        if s.held[queue] >= quota {
            return None;
        }
        s.held[queue] += 1;
        Some(SharedPermit {
            pool: self.clone(),
            queue,
        })
    }

    /// Wait for an overflow slot for `queue` (cancel-safe: dropping the future takes nothing).
    pub(crate) async fn acquire(self: &Arc<Self>, queue: usize) -> SharedPermit {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(p) = self.try_acquire(queue) {
                return p;
            }
            changed.await;
        }
    }

    fn release(&self, queue: usize) {
        let mut s = self.lock();
        if let Some(h) = s.held.get_mut(queue) {
            *h = h.saturating_sub(1);
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// Overflow slots `queue` holds now.
    #[cfg(test)]
    pub(crate) fn held(&self, queue: usize) -> usize {
        self.lock().held.get(queue).copied().unwrap_or(0)
    }
}

/// Each queue's whole-slot share of `capacity` by weight among the `demanding` queues
/// (largest remainder: everyone gets the floor of their exact share, and the slots left go to
/// the largest fractional parts, ties to the earlier queue). Non-demanding queues get 0; the
/// demanding ones' shares add up to `capacity`.
pub(crate) fn quotas(capacity: usize, weights: &[u64], demanding: &[bool]) -> Vec<usize> {
    let total: u64 = weights
        .iter()
        .zip(demanding)
        .filter(|(_, d)| **d)
        .map(|(w, _)| *w)
        .sum();
    let mut out = vec![0usize; weights.len()];
    if total == 0 {
        return out;
    }
    let cap = capacity as u64;
    let mut remainders = Vec::new();
    let mut given = 0u64;
    for (i, (w, d)) in weights.iter().zip(demanding).enumerate() {
        if *d {
            let exact = cap * w;
            let base = exact / total;
            out[i] = base as usize;
            given += base;
            remainders.push((exact % total, i));
        }
    }
    // Largest remainder first, then the earlier queue.
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, i) in remainders.into_iter().take((cap - given) as usize) {
        out[i] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_split_by_weight_among_demanding_queues_and_add_up() {
        assert_eq!(quotas(6, &[2, 1], &[true, true]), vec![4, 2]);
        assert_eq!(quotas(6, &[2, 1], &[true, false]), vec![6, 0]);
        assert_eq!(quotas(6, &[2, 1], &[false, false]), vec![0, 0]);
        // 7 × 1/3 = 2.33 each: one slot left, to the first.
        assert_eq!(quotas(7, &[1, 1, 1], &[true, true, true]), vec![3, 2, 2]);
        // 5 × (3, 2, 1)/6 = 2.5, 1.67, 0.83: floors 2, 1, 0; two left to .83 and .67.
        assert_eq!(quotas(5, &[3, 2, 1], &[true, true, true]), vec![2, 2, 1]);
        for cap in 0..20usize {
            for w in [[1u64, 1, 1], [5, 2, 1], [1, 100, 3]] {
                let q = quotas(cap, &w, &[true, true, true]);
                assert_eq!(q.iter().sum::<usize>(), cap, "{cap} {w:?} {q:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_queue_over_its_quota_gets_nothing_and_freed_slots_go_under_quota() {
        let pool = SharedPool::new(6, vec![("a".into(), 2), ("b".into(), 1)]);
        pool.set_demand(0, true);
        // Alone with work: a takes the whole pool.
        let mut a: Vec<_> = (0..6).map_while(|_| pool.try_acquire(0)).collect();
        assert_eq!(a.len(), 6);
        assert!(pool.try_acquire(0).is_none());
        pool.set_demand(1, true);
        // b is demanding now: a (6 held, quota 4) gets none of the slots it frees.
        a.pop();
        assert!(pool.try_acquire(0).is_none());
        let b1 = pool.try_acquire(1).expect("b under quota");
        a.pop();
        let b2 = pool.acquire(1).await;
        a.pop();
        // a is at 3 now, under its quota of 4: the slot is a's again; b is at its 2.
        assert!(pool.try_acquire(1).is_none());
        let a4 = pool.try_acquire(0).expect("a under quota");
        assert_eq!((pool.held(0), pool.held(1)), (4, 2));
        drop((a, a4, b1, b2));
        assert_eq!((pool.held(0), pool.held(1)), (0, 0));
    }
}
