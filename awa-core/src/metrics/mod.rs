//! Process-wide counters. Cheap atomics, readable with [`snapshot`] (and from Python); the
//! per-kind/queue job counters and timing histograms are in [`series`].

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        $( #[doc = $doc] pub static $name: AtomicU64 = AtomicU64::new(0); )*
        /// Every counter by name.
        pub fn snapshot() -> Vec<(&'static str, u64)> {
            vec![$( (stringify!($name), $name.load(Ordering::Relaxed)) ),*]
        }
    };
}

counters! {
    JOBS_CLAIMED: "Jobs claimed by dispatchers.",
    JOBS_CLAIMED_AHEAD: "Claimed jobs that waited in a dispatcher's buffer for a slot (claim-ahead).",
    JOBS_RELEASED: "Claimed-ahead jobs given back to the queue unstarted (shutdown, or waited too long).",
    CLAIM_STATEMENTS: "Claim statements that returned (each is one commit, whether it found jobs or not).",
    JOBS_COMPLETED_BATCHED: "Completions applied on the batched path.",
    COMPLETION_BATCHES: "Batched completion statements or transactions committed (one commit each).",
    JOBS_FINALIZED_PER_JOB: "Finalizations committed on the per-job path.",
    FINALIZE_STALE: "Finalizations whose lease guard matched no row.",
    FINALIZE_RETRIES: "Finalizations retried after a transient error.",
    FINALIZE_GAVE_UP: "Finalizations abandoned after the last retry (the job waits for rescue).",
    FOLLOW_UPS_INSERTED: "Follow-ups (registered or staged) inserted.",
    FOLLOW_UPS_SKIPPED_DUPLICATE: "Follow-ups skipped because their unique key was held.",
    STAGED_DISCARDED_WAIT_FOR_CALLBACK: "Staged follow-ups discarded because the handler returned WaitForCallback.",
    STAGED_DISCARDED: "Staged follow-ups discarded on any outcome other than a committed completion.",
    ATTEMPTS_POISONED: "Attempts failed terminally because a stage failed and the handler still completed.",
    JOBS_RESCUED: "Running jobs rescued (stale heartbeat or passed deadline).",
    JOBS_ABANDONED: "Handlers abandoned locally (deadline or shutdown).",
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub mod series;
