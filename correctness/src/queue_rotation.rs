//! Twin of `correctness/storage/AwaQueueRotation.tla` (queue-storage rotation:
//! a ring of queue slots with carry-forward reclaim and slot pruning by seals,
//! a ring of lease slots).
//!
//! Every type, action and invariant below has the name of its TLA+ counterpart,
//! and every action's guard and effect follow the TLA+ definition clause by
//! clause. When you change one file, change the other; the
//! `queue_rotation_check` test also checks that the `.tla` and `.cfg` files
//! still name what this file names.
//!
//! Jobs are numbered `1..=jobs` and run leases `1..=max_attempts`, queue slots
//! `0..queue_slots`, lease slots `0..lease_slots` and seqs `0..max_seq`, as in
//! TLA+. Records print as TLA+ records.

use std::fmt;

use stateright::{Model, Property};

use crate::set::Set;

/// Capacity of `qgen`: at most this many queue slots.
pub const MAX_QUEUE_SLOTS: usize = 4;

// ---------------------------------------------------------------------------
// Names shared with the TLA+ module.

/// `NothingLost`: every inserted job is somewhere.
pub const NOTHING_LOST: &str = "NothingLost";
/// `OneClaimPerLease`: no `<<job, k>>` is claimed twice.
pub const ONE_CLAIM_PER_LEASE: &str = "OneClaimPerLease";
/// `LeaseHasEntry`: every open lease references an entry that exists.
pub const LEASE_HAS_ENTRY: &str = "LeaseHasEntry";
/// `CursorNeverPassesWork`: no committed, unconsumed entry below the cursor.
pub const CURSOR_NEVER_PASSES_WORK: &str = "CursorNeverPassesWork";
/// `OnlyOpenLeaseCompletes`: every terminal transition came from an open lease.
pub const ONLY_OPEN_LEASE_COMPLETES: &str = "OnlyOpenLeaseCompletes";
/// `OnePlacePerJob`: every inserted job is in exactly one place. Checked in the
/// positive configuration only (see `NothingLost` in the `.tla`).
pub const ONE_PLACE_PER_JOB: &str = "OnePlacePerJob";
/// `SealHolds`: the current slot is open and every entry of a sealed slot is
/// below its seal. Checked in the positive configuration only (see the `.tla`).
pub const SEAL_HOLDS: &str = "SealHolds";
/// `AvailIsUnconsumed`: what the implementation reads as available (unmarked, at
/// or above the cursor) is exactly what is unconsumed. Positive configuration only.
pub const AVAIL_IS_UNCONSUMED: &str = "AvailIsUnconsumed";

/// The five invariants every configuration checks, in the order the `.cfg`
/// files list them. Each seeded bug violates exactly one of them.
pub const INVARIANTS: [&str; 5] = [
    NOTHING_LOST,
    ONE_CLAIM_PER_LEASE,
    LEASE_HAS_ENTRY,
    CURSOR_NEVER_PASSES_WORK,
    ONLY_OPEN_LEASE_COMPLETES,
];

/// Invariants only the positive configuration checks.
pub const POSITIVE_INVARIANTS: [&str; 3] = [ONE_PLACE_PER_JOB, SEAL_HOLDS, AVAIL_IS_UNCONSUMED];

/// TLC's deadlock check: every reachable state is `Quiescent` or has a
/// successor. Twin-only name; TLC checks it by default.
pub const DEADLOCK_FREE: &str = "DeadlockFree";

/// Reachability witnesses: the correct protocol must reach each, so the
/// invariants do not pass vacuously. Same names as the TLA+ definitions.
pub const WITNESSES: [&str; 8] = [
    "WitnessRingWrapped",
    "WitnessCarryUnconsumed",
    "WitnessCarryRunning",
    "WitnessLateCommitClaimed",
    "WitnessZombieRejected",
    "WitnessLeaseSlotReclaimed",
    "WitnessClaimPruned",
    "WitnessMarkDropped",
];

/// The TLA+ action names, in the order `Next` lists them.
pub const ACTIONS: [&str; 16] = [
    "ReadSlot",
    "BeginAppend",
    "CommitAppend",
    "AbortAppend",
    "Claim",
    "AdvanceCursor",
    "Complete",
    "Retry",
    "Rescue",
    "ZombieComplete",
    "Promote",
    "RotateQueue",
    "RotateLease",
    "ReclaimQueue",
    "FinishReclaim",
    "ReclaimLease",
];

// ---------------------------------------------------------------------------
// Variants (the TLA+ constant `Variant`).

/// The correct protocol or one of the six seeded bugs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// The rotation protocol. Violates nothing.
    Correct,
    /// Reclaim drops the slot's unconsumed entries instead of carrying them
    /// forward. Violates `NothingLost`.
    ReclaimWithoutCarryForward,
    /// Reclaim drops running jobs' entries and leaves their leases' references
    /// dangling. Violates `LeaseHasEntry`.
    ReclaimUnderOpenLease,
    /// Reclaim copies forward in one transaction and truncates in a later one;
    /// a claim can take the old copy in between. Violates `OneClaimPerLease`.
    CarryForwardInTwoSteps,
    /// `AdvanceCursor` ignores pending appends, so a late commit lands below the
    /// cursor. Violates `CursorNeverPassesWork`.
    CursorSkipsPending,
    /// A completion deletes the job's open lease whatever its `k`, so a zombie
    /// completes the job its successor runs. Violates `OnlyOpenLeaseCompletes`.
    CompleteWithoutLeaseGuard,
    /// `RotateQueue` seals the current slot without the ring's lock, so a
    /// producer that read the slot appends at or past its seal, and the cursor
    /// passes the entry once claims stop opening the slot. Violates
    /// `CursorNeverPassesWork` (and `SealHolds`, checked by the positive
    /// configuration only).
    SealWithoutRingLock,
}

impl Variant {
    /// Every variant, the correct one first.
    pub const ALL: [Variant; 7] = [
        Variant::Correct,
        Variant::ReclaimWithoutCarryForward,
        Variant::ReclaimUnderOpenLease,
        Variant::CarryForwardInTwoSteps,
        Variant::CursorSkipsPending,
        Variant::CompleteWithoutLeaseGuard,
        Variant::SealWithoutRingLock,
    ];

    /// The six seeded bugs.
    pub const NEGATIVE: [Variant; 6] = [
        Variant::ReclaimWithoutCarryForward,
        Variant::ReclaimUnderOpenLease,
        Variant::CarryForwardInTwoSteps,
        Variant::CursorSkipsPending,
        Variant::CompleteWithoutLeaseGuard,
        Variant::SealWithoutRingLock,
    ];

    /// The value of the TLA+ constant `Variant`.
    pub const fn name(self) -> &'static str {
        match self {
            Variant::Correct => "Correct",
            Variant::ReclaimWithoutCarryForward => "ReclaimWithoutCarryForward",
            Variant::ReclaimUnderOpenLease => "ReclaimUnderOpenLease",
            Variant::CarryForwardInTwoSteps => "CarryForwardInTwoSteps",
            Variant::CursorSkipsPending => "CursorSkipsPending",
            Variant::CompleteWithoutLeaseGuard => "CompleteWithoutLeaseGuard",
            Variant::SealWithoutRingLock => "SealWithoutRingLock",
        }
    }

    /// The invariant this variant is expected to violate (`None` for `Correct`).
    pub const fn expected_violation(self) -> Option<&'static str> {
        match self {
            Variant::Correct => None,
            Variant::ReclaimWithoutCarryForward => Some(NOTHING_LOST),
            Variant::ReclaimUnderOpenLease => Some(LEASE_HAS_ENTRY),
            Variant::CarryForwardInTwoSteps => Some(ONE_CLAIM_PER_LEASE),
            Variant::CursorSkipsPending => Some(CURSOR_NEVER_PASSES_WORK),
            Variant::CompleteWithoutLeaseGuard => Some(ONLY_OPEN_LEASE_COMPLETES),
            Variant::SealWithoutRingLock => Some(CURSOR_NEVER_PASSES_WORK),
        }
    }

    /// Invariants this variant also violates later, as a consequence of its named one
    /// (whose counterexample is the shortest, so TLC stops on it). A cursor that passed
    /// an entry consumes it (no mark is kept below the cursor), so the next reclaim of
    /// its slot does not carry it forward: the job is lost.
    pub const fn consequences(self) -> &'static [&'static str] {
        match self {
            Variant::CursorSkipsPending | Variant::SealWithoutRingLock => &[NOTHING_LOST],
            _ => &[],
        }
    }

    /// The TLC configuration file for this variant, under `correctness/storage/`.
    pub const fn cfg_file(self) -> &'static str {
        match self {
            Variant::Correct => "AwaQueueRotation.cfg",
            Variant::ReclaimWithoutCarryForward => {
                "AwaQueueRotation_ReclaimWithoutCarryForward.cfg"
            }
            Variant::ReclaimUnderOpenLease => "AwaQueueRotation_ReclaimUnderOpenLease.cfg",
            Variant::CarryForwardInTwoSteps => "AwaQueueRotation_CarryForwardInTwoSteps.cfg",
            Variant::CursorSkipsPending => "AwaQueueRotation_CursorSkipsPending.cfg",
            Variant::CompleteWithoutLeaseGuard => "AwaQueueRotation_CompleteWithoutLeaseGuard.cfg",
            Variant::SealWithoutRingLock => "AwaQueueRotation_SealWithoutRingLock.cfg",
        }
    }
}

// ---------------------------------------------------------------------------
// State.

/// `EntryRec`: a ready entry (committed in `entries`, uncommitted in `pending`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub job: u8,
    pub slot: u8,
    pub gen: u8,
    pub seq: u8,
    /// The run lease the next claim will use.
    pub k: u8,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[job |-> {}, slot |-> {}, gen |-> {}, seq |-> {}, k |-> {}]",
            self.job, self.slot, self.gen, self.seq, self.k
        )
    }
}

/// A queue slot's seal (`Seals`): `Open` (the model value; SQL `NULL`) while
/// the slot is current, else `Bound(b)`: every entry of the slot has a seq
/// below `b` (0: truncated, opened by no claim).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seal {
    Open,
    Bound(u8),
}

impl fmt::Debug for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seal::Open => f.write_str("Open"),
            Seal::Bound(b) => write!(f, "{b}"),
        }
    }
}

/// `ReaderRec`: a producer holding the ring's lock that read the current slot
/// and its generation, and has not drawn its seq yet.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reader {
    pub job: u8,
    pub slot: u8,
    pub gen: u8,
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[job |-> {}, slot |-> {}, gen |-> {}]",
            self.job, self.slot, self.gen
        )
    }
}

/// `LeaseRec`: an open lease; `slot`, `gen`, `seq` reference its entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease {
    pub job: u8,
    pub k: u8,
    pub lslot: u8,
    pub slot: u8,
    pub gen: u8,
    pub seq: u8,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[job |-> {}, k |-> {}, lslot |-> {}, slot |-> {}, gen |-> {}, seq |-> {}]",
            self.job, self.k, self.lslot, self.slot, self.gen, self.seq
        )
    }
}

/// A receipt's `outcome`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Completed,
    Failed,
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Completed => "\"completed\"",
            Outcome::Failed => "\"failed\"",
        })
    }
}

/// `ReceiptRec`: a terminal receipt in the queue slot of its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Receipt {
    pub job: u8,
    pub k: u8,
    pub slot: u8,
    pub outcome: Outcome,
}

/// `JobLease`: a deferred row or a zombie worker.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobLease {
    pub job: u8,
    pub k: u8,
}

impl fmt::Debug for JobLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[job |-> {}, k |-> {}]", self.job, self.k)
    }
}

/// `Events`: what the witnesses observe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    CarryUnconsumed,
    CarryRunning,
    LateClaim,
    ZombieRejected,
    LeaseReclaimed,
    PrunedClaim,
    MarkDropped,
}

/// The TLA+ variables. `qgen` and `seal` have room for [`MAX_QUEUE_SLOTS`]
/// slots; slots past `queue_slots` stay 0 and are never read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub qcur: u8,
    pub qgen: [u8; MAX_QUEUE_SLOTS],
    pub seal: [Seal; MAX_QUEUE_SLOTS],
    pub lcur: u8,
    pub ldirty: Set<u8>,
    pub next_seq: u8,
    pub cursor: u8,
    pub readers: Set<Reader>,
    pub pending: Set<Entry>,
    pub entries: Set<Entry>,
    pub consumed: Set<u8>,
    /// `marked`: the consumed seqs the implementation marks (none below the cursor).
    pub marked: Set<u8>,
    pub leases: Set<Lease>,
    pub receipts: Set<Receipt>,
    pub deferred: Set<JobLease>,
    pub zombies: Set<JobLease>,
    pub moving: Set<u8>,
    pub inserted: Set<u8>,
    pub done: Set<u8>,
    /// `claimed`: `<<job, k>>` pairs.
    pub claimed: Set<(u8, u8)>,
    pub dup_claim: bool,
    pub stale_completion: bool,
    pub events: Set<Event>,
}

/// `RefersTo(l, e)`.
fn refers_to(l: &Lease, e: &Entry) -> bool {
    l.slot == e.slot && l.gen == e.gen && l.seq == e.seq
}

impl State {
    /// `Unconsumed(e)`.
    fn unconsumed(&self, e: &Entry) -> bool {
        !self.consumed.contains(&e.seq)
    }

    /// `Avail(e)`: what the implementation reads as available.
    fn avail(&self, e: &Entry) -> bool {
        !self.marked.contains(&e.seq) && e.seq >= self.cursor
    }

    /// `Eligible(s)`: a claim opens slot `s`.
    pub fn eligible(&self, s: u8) -> bool {
        match self.seal[usize::from(s)] {
            Seal::Open => true,
            Seal::Bound(b) => b > self.cursor,
        }
    }

    /// `RingLockFree`: no producer holds the ring's lock.
    fn ring_lock_free(&self) -> bool {
        self.readers.is_empty() && self.pending.is_empty()
    }

    /// `QSlotEmpty(s)`.
    fn qslot_empty(&self, s: u8) -> bool {
        self.entries.iter().all(|e| e.slot != s)
            && self.receipts.iter().all(|r| r.slot != s)
            && self.pending.iter().all(|p| p.slot != s)
    }

    fn in_queue(&self, j: u8) -> usize {
        self.entries
            .iter()
            .filter(|e| e.job == j && self.unconsumed(e))
            .count()
    }

    fn in_lease(&self, j: u8) -> usize {
        self.leases.iter().filter(|l| l.job == j).count()
    }

    fn in_deferred(&self, j: u8) -> usize {
        self.deferred.iter().filter(|d| d.job == j).count()
    }

    /// `Finish(l, outcome)`.
    fn finish(&mut self, l: Lease, outcome: Outcome) {
        self.leases.remove(&l);
        self.receipts.insert(Receipt {
            job: l.job,
            k: l.k,
            slot: l.slot,
            outcome,
        });
        self.done.insert(l.job);
    }

    /// `Truncate(s, ents, cons, mks)` applied to `self.entries`, `self.consumed`
    /// and `self.marked`.
    fn truncate(&mut self, s: u8) {
        self.entries = self
            .entries
            .iter()
            .copied()
            .filter(|e| e.slot != s)
            .collect();
        let kept: Set<u8> = self.entries.iter().map(|e| e.seq).collect();
        let of_kept = |seqs: &Set<u8>| seqs.iter().copied().filter(|c| kept.contains(c)).collect();
        self.consumed = of_kept(&self.consumed);
        self.marked = of_kept(&self.marked);
        self.receipts = self
            .receipts
            .iter()
            .copied()
            .filter(|r| r.slot != s)
            .collect();
        self.qgen[usize::from(s)] += 1;
        self.seal[usize::from(s)] = Seal::Bound(0);
    }

    // -- Invariants ---------------------------------------------------------

    /// `NothingLost`.
    pub fn nothing_lost(&self) -> bool {
        self.inserted.iter().all(|&j| {
            self.in_queue(j) > 0
                || self.in_lease(j) > 0
                || self.in_deferred(j) > 0
                || self.done.contains(&j)
        })
    }

    /// `OneClaimPerLease`.
    pub fn one_claim_per_lease(&self) -> bool {
        !self.dup_claim
    }

    /// `LeaseHasEntry`.
    pub fn lease_has_entry(&self) -> bool {
        self.leases.iter().all(|l| {
            self.entries
                .iter()
                .any(|e| refers_to(l, e) && e.job == l.job && e.k == l.k)
        })
    }

    /// `CursorNeverPassesWork`.
    pub fn cursor_never_passes_work(&self) -> bool {
        self.entries
            .iter()
            .all(|e| !self.unconsumed(e) || e.seq >= self.cursor)
    }

    /// `OnlyOpenLeaseCompletes`.
    pub fn only_open_lease_completes(&self) -> bool {
        !self.stale_completion
    }

    /// `OnePlacePerJob` (positive configuration only).
    pub fn one_place_per_job(&self) -> bool {
        self.inserted.iter().all(|&j| {
            self.in_queue(j)
                + self.in_lease(j)
                + self.in_deferred(j)
                + usize::from(self.done.contains(&j))
                == 1
        })
    }

    /// `AvailIsUnconsumed` (positive configuration only).
    pub fn avail_is_unconsumed(&self) -> bool {
        self.entries
            .iter()
            .all(|e| self.avail(e) == self.unconsumed(e))
    }

    /// `SealHolds` (positive configuration only).
    pub fn seal_holds(&self) -> bool {
        self.seal[usize::from(self.qcur)] == Seal::Open
            && self.entries.iter().chain(self.pending.iter()).all(|e| {
                match self.seal[usize::from(e.slot)] {
                    Seal::Open => true,
                    Seal::Bound(b) => e.seq < b,
                }
            })
    }

    // -- Witnesses ----------------------------------------------------------

    /// `WitnessRingWrapped`.
    pub fn witness_ring_wrapped(&self) -> bool {
        self.entries.iter().any(|e| e.gen > 0)
    }

    /// The event witnesses (`"carryUnconsumed" \in events`, ...).
    pub fn happened(&self, event: Event) -> bool {
        self.events.contains(&event)
    }
}

// ---------------------------------------------------------------------------
// Actions.

/// The disjuncts of `Next` (the stuttering `Quiescent` step needs no twin).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    ReadSlot {
        job: u8,
    },
    BeginAppend {
        r: Reader,
    },
    CommitAppend {
        p: Entry,
    },
    AbortAppend {
        p: Entry,
    },
    Claim,
    AdvanceCursor,
    Complete {
        l: Lease,
    },
    Retry {
        l: Lease,
    },
    Rescue {
        l: Lease,
    },
    /// `ZombieComplete(z)`. `lease` is the witness of its `\E l \in leases`: the
    /// lease row the guard matched, `None` when it matched none (rejected).
    ZombieComplete {
        z: JobLease,
        lease: Option<Lease>,
    },
    Promote {
        d: JobLease,
    },
    RotateQueue,
    RotateLease,
    ReclaimQueue {
        s: u8,
    },
    FinishReclaim {
        s: u8,
    },
    ReclaimLease {
        ls: u8,
    },
}

impl Action {
    /// The TLA+ action name.
    pub const fn name(&self) -> &'static str {
        match self {
            Action::ReadSlot { .. } => "ReadSlot",
            Action::BeginAppend { .. } => "BeginAppend",
            Action::CommitAppend { .. } => "CommitAppend",
            Action::AbortAppend { .. } => "AbortAppend",
            Action::Claim => "Claim",
            Action::AdvanceCursor => "AdvanceCursor",
            Action::Complete { .. } => "Complete",
            Action::Retry { .. } => "Retry",
            Action::Rescue { .. } => "Rescue",
            Action::ZombieComplete { .. } => "ZombieComplete",
            Action::Promote { .. } => "Promote",
            Action::RotateQueue => "RotateQueue",
            Action::RotateLease => "RotateLease",
            Action::ReclaimQueue { .. } => "ReclaimQueue",
            Action::FinishReclaim { .. } => "FinishReclaim",
            Action::ReclaimLease { .. } => "ReclaimLease",
        }
    }
}

/// Prints the action as a TLA+ action instance, e.g. `ReclaimQueue(0)`.
impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        match self {
            Action::ReadSlot { job } => write!(f, "{name}({job})"),
            Action::BeginAppend { r } => write!(f, "{name}({r:?})"),
            Action::CommitAppend { p } | Action::AbortAppend { p } => write!(f, "{name}({p:?})"),
            Action::Claim | Action::AdvanceCursor | Action::RotateQueue | Action::RotateLease => {
                f.write_str(name)
            }
            Action::Complete { l } | Action::Retry { l } | Action::Rescue { l } => {
                write!(f, "{name}({l:?})")
            }
            Action::ZombieComplete { z, .. } => write!(f, "{name}({z:?})"),
            Action::Promote { d } => write!(f, "{name}({d:?})"),
            Action::ReclaimQueue { s } | Action::FinishReclaim { s } => write!(f, "{name}({s})"),
            Action::ReclaimLease { ls } => write!(f, "{name}({ls})"),
        }
    }
}

// ---------------------------------------------------------------------------
// The model.

/// The TLA+ constants. [`AwaQueueRotation::new`] uses the values of the `.cfg`
/// files: `Jobs = {1, 2}`, `QueueSlots = 2`, `LeaseSlots = 2`,
/// `MaxAttempts = 2`, `MaxSeq = 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AwaQueueRotation {
    pub jobs: u8,
    pub queue_slots: u8,
    pub lease_slots: u8,
    pub max_attempts: u8,
    pub max_seq: u8,
    pub variant: Variant,
}

impl AwaQueueRotation {
    /// `variant` with the constants of the `.cfg` files.
    pub const fn new(variant: Variant) -> Self {
        AwaQueueRotation {
            jobs: 2,
            queue_slots: 2,
            lease_slots: 2,
            max_attempts: 2,
            max_seq: 3,
            variant,
        }
    }

    /// `Quiescent`'s guard: `NothingInFlight \/ SeqBoundReached`.
    pub fn quiescent(&self, s: &State) -> bool {
        let nothing_in_flight = s.readers.is_empty()
            && s.pending.is_empty()
            && s.entries.iter().all(|e| !s.unconsumed(e))
            && s.leases.is_empty()
            && s.deferred.is_empty();
        let seq_bound_reached = s.next_seq == self.max_seq
            || (0..self.queue_slots).any(|slot| {
                slot != s.qcur
                    && !s.moving.contains(&slot)
                    && !s.qslot_empty(slot)
                    && usize::from(s.next_seq) + self.carried(s, slot).len()
                        > usize::from(self.max_seq)
            });
        nothing_in_flight || seq_bound_reached
    }

    /// Some action of `Next` other than `Quiescent` is enabled.
    pub fn can_step(&self, s: &State) -> bool {
        crate::harness::can_step(self, s)
    }

    /// `StablePoint`: what a claim sees (the entries of the slots it opens).
    fn stable_point(&self, s: &State) -> u8 {
        let entries = s
            .entries
            .iter()
            .filter(|e| s.avail(e) && s.eligible(e.slot))
            .map(|e| e.seq);
        let pending = s
            .pending
            .iter()
            .filter(|_| self.variant != Variant::CursorSkipsPending)
            .map(|p| p.seq);
        entries.chain(pending).fold(s.next_seq, u8::min)
    }

    /// `GuardMatches(l, z)`.
    fn guard_matches(&self, l: &Lease, z: &JobLease) -> bool {
        l.job == z.job && (self.variant == Variant::CompleteWithoutLeaseGuard || l.k == z.k)
    }

    /// `CarryUnconsumed(s) \cup CarryRunning(s)`, in seq order: the i-th is
    /// copied under seq `nextSeq + i` (`NewSeq`).
    fn carried(&self, st: &State, s: u8) -> Vec<Entry> {
        let mut c: Vec<Entry> = st
            .entries
            .iter()
            .filter(|e| e.slot == s)
            .filter(|e| {
                if st.avail(e) {
                    self.variant != Variant::ReclaimWithoutCarryForward
                } else {
                    self.variant != Variant::ReclaimUnderOpenLease
                        && st.leases.iter().any(|l| refers_to(l, e))
                }
            })
            .copied()
            .collect();
        c.sort_by_key(|e| e.seq);
        c
    }

    /// `EndAttempt(l)`.
    fn end_attempt(&self, n: &mut State, l: Lease) {
        if l.k < self.max_attempts {
            n.leases.remove(&l);
            n.deferred.insert(JobLease {
                job: l.job,
                k: l.k + 1,
            });
        } else {
            n.finish(l, Outcome::Failed);
        }
    }

    // One function per TLA+ action: `None` when the action is not enabled.

    fn read_slot(&self, s: &State, j: u8) -> Option<State> {
        if s.inserted.contains(&j)
            || s.readers.iter().any(|r| r.job == j)
            || s.pending.iter().any(|p| p.job == j)
            || s.next_seq >= self.max_seq
        {
            return None;
        }
        let mut n = s.clone();
        n.readers.insert(Reader {
            job: j,
            slot: s.qcur,
            gen: s.qgen[usize::from(s.qcur)],
        });
        Some(n)
    }

    fn begin_append(&self, s: &State, r: Reader) -> Option<State> {
        if !s.readers.contains(&r) || s.next_seq >= self.max_seq {
            return None;
        }
        let mut n = s.clone();
        n.readers.remove(&r);
        n.pending.insert(Entry {
            job: r.job,
            slot: r.slot,
            gen: r.gen,
            seq: s.next_seq,
            k: 1,
        });
        n.next_seq += 1;
        Some(n)
    }

    fn commit_append(&self, s: &State, p: Entry) -> Option<State> {
        if !s.pending.contains(&p) || s.qgen[usize::from(p.slot)] != p.gen {
            return None;
        }
        let mut n = s.clone();
        n.pending.remove(&p);
        n.entries.insert(p);
        n.inserted.insert(p.job);
        Some(n)
    }

    fn abort_append(&self, s: &State, p: Entry) -> Option<State> {
        if !s.pending.contains(&p) {
            return None;
        }
        let mut n = s.clone();
        n.pending.remove(&p);
        Some(n)
    }

    fn claim(&self, s: &State) -> Option<State> {
        let e = *s
            .entries
            .iter()
            .filter(|e| s.avail(e) && s.eligible(e.slot))
            .min_by_key(|e| e.seq)?;
        let mut n = s.clone();
        n.consumed.insert(e.seq);
        n.marked.insert(e.seq);
        n.leases.insert(Lease {
            job: e.job,
            k: e.k,
            lslot: s.lcur,
            slot: e.slot,
            gen: e.gen,
            seq: e.seq,
        });
        n.ldirty.insert(s.lcur);
        n.claimed.insert((e.job, e.k));
        n.dup_claim = s.dup_claim || s.claimed.contains(&(e.job, e.k));
        if s.consumed.iter().any(|&c| c > e.seq) {
            n.events.insert(Event::LateClaim);
        }
        if (0..self.queue_slots)
            .any(|slot| !s.eligible(slot) && s.entries.iter().any(|x| x.slot == slot))
        {
            n.events.insert(Event::PrunedClaim);
        }
        Some(n)
    }

    fn advance_cursor(&self, s: &State) -> Option<State> {
        let stable = self.stable_point(s);
        if stable <= s.cursor {
            return None;
        }
        let mut n = s.clone();
        n.cursor = stable;
        if s.marked.iter().any(|&m| m < stable) {
            n.events.insert(Event::MarkDropped);
        }
        n.marked = s.marked.iter().copied().filter(|&m| m >= stable).collect();
        Some(n)
    }

    fn complete(&self, s: &State, l: Lease) -> Option<State> {
        if !s.leases.contains(&l) {
            return None;
        }
        let mut n = s.clone();
        n.finish(l, Outcome::Completed);
        Some(n)
    }

    fn retry(&self, s: &State, l: Lease) -> Option<State> {
        if !s.leases.contains(&l) {
            return None;
        }
        let mut n = s.clone();
        self.end_attempt(&mut n, l);
        Some(n)
    }

    fn rescue(&self, s: &State, l: Lease) -> Option<State> {
        if !s.leases.contains(&l) {
            return None;
        }
        let mut n = s.clone();
        self.end_attempt(&mut n, l);
        n.zombies.insert(JobLease { job: l.job, k: l.k });
        Some(n)
    }

    fn zombie_complete(&self, s: &State, z: JobLease, lease: Option<Lease>) -> Option<State> {
        if !s.zombies.contains(&z) {
            return None;
        }
        let any_match = s.leases.iter().any(|l| self.guard_matches(l, &z));
        let mut n = s.clone();
        n.zombies.remove(&z);
        match lease {
            Some(l) => {
                if !s.leases.contains(&l) || !self.guard_matches(&l, &z) {
                    return None;
                }
                n.finish(l, Outcome::Completed);
                let own_open = s.leases.iter().any(|o| o.job == z.job && o.k == z.k);
                n.stale_completion = s.stale_completion || !own_open;
            }
            None => {
                if any_match {
                    return None;
                }
                n.events.insert(Event::ZombieRejected);
            }
        }
        Some(n)
    }

    fn promote(&self, s: &State, d: JobLease) -> Option<State> {
        if !s.deferred.contains(&d) || s.next_seq >= self.max_seq {
            return None;
        }
        let mut n = s.clone();
        n.deferred.remove(&d);
        n.entries.insert(Entry {
            job: d.job,
            slot: s.qcur,
            gen: s.qgen[usize::from(s.qcur)],
            seq: s.next_seq,
            k: d.k,
        });
        n.next_seq += 1;
        Some(n)
    }

    fn rotate_queue(&self, s: &State) -> Option<State> {
        let next = (s.qcur + 1) % self.queue_slots;
        if s.qslot_empty(s.qcur)
            || !s.qslot_empty(next)
            || (self.variant != Variant::SealWithoutRingLock && !s.ring_lock_free())
        {
            return None;
        }
        let mut n = s.clone();
        n.qcur = next;
        n.seal[usize::from(s.qcur)] = Seal::Bound(s.next_seq);
        n.seal[usize::from(next)] = Seal::Open;
        Some(n)
    }

    fn rotate_lease(&self, s: &State) -> Option<State> {
        let next = (s.lcur + 1) % self.lease_slots;
        if !s.ldirty.contains(&s.lcur) || s.ldirty.contains(&next) {
            return None;
        }
        let mut n = s.clone();
        n.lcur = next;
        Some(n)
    }

    fn reclaim_queue(&self, st: &State, s: u8) -> Option<State> {
        if s == st.qcur
            || st.moving.contains(&s)
            || st.qslot_empty(s)
            || st.pending.iter().any(|p| p.slot == s)
        {
            return None;
        }
        let carried = self.carried(st, s);
        if usize::from(st.next_seq) + carried.len() > usize::from(self.max_seq) {
            return None;
        }
        let mut n = st.clone();
        let gen = st.qgen[usize::from(st.qcur)];
        for (i, e) in (0u8..).zip(&carried) {
            let seq = st.next_seq + i;
            n.entries.insert(Entry {
                slot: st.qcur,
                gen,
                seq,
                ..*e
            });
            // CarryEvents(C), and the copy's mark (mks) and consumption (cons).
            if st.avail(e) {
                n.events.insert(Event::CarryUnconsumed);
            } else {
                n.events.insert(Event::CarryRunning);
                n.marked.insert(seq);
            }
            if !st.unconsumed(e) {
                n.consumed.insert(seq);
            }
            // MovedLeases: a running job's lease now refers to the copy.
            for l in st.leases.iter().filter(|l| refers_to(l, e)) {
                n.leases.remove(l);
                n.leases.insert(Lease {
                    slot: st.qcur,
                    gen,
                    seq,
                    ..*l
                });
            }
        }
        n.next_seq += carried.len() as u8;
        if self.variant == Variant::CarryForwardInTwoSteps {
            n.moving.insert(s);
        } else {
            n.truncate(s);
        }
        Some(n)
    }

    fn finish_reclaim(&self, st: &State, s: u8) -> Option<State> {
        if !st.moving.contains(&s) || st.leases.iter().any(|l| l.slot == s) {
            return None;
        }
        let mut n = st.clone();
        n.moving.remove(&s);
        n.truncate(s);
        Some(n)
    }

    fn reclaim_lease(&self, s: &State, ls: u8) -> Option<State> {
        if ls == s.lcur || !s.ldirty.contains(&ls) || s.leases.iter().any(|l| l.lslot == ls) {
            return None;
        }
        let mut n = s.clone();
        n.ldirty.remove(&ls);
        // TRUNCATE: no open lease is in the slot under the guard.
        n.leases = s.leases.iter().copied().filter(|l| l.lslot != ls).collect();
        n.events.insert(Event::LeaseReclaimed);
        Some(n)
    }
}

impl Model for AwaQueueRotation {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        assert!(
            self.jobs >= 1
                && (2..=MAX_QUEUE_SLOTS).contains(&usize::from(self.queue_slots))
                && self.lease_slots >= 2
                && self.max_attempts >= 1
                && self.max_seq >= 1,
            "constants out of range: {self:?}"
        );
        let mut seal = [Seal::Bound(0); MAX_QUEUE_SLOTS];
        seal[0] = Seal::Open;
        vec![State {
            qcur: 0,
            qgen: [0; MAX_QUEUE_SLOTS],
            seal,
            lcur: 0,
            ldirty: Set::new(),
            next_seq: 0,
            cursor: 0,
            readers: Set::new(),
            pending: Set::new(),
            entries: Set::new(),
            consumed: Set::new(),
            marked: Set::new(),
            leases: Set::new(),
            receipts: Set::new(),
            deferred: Set::new(),
            zombies: Set::new(),
            moving: Set::new(),
            inserted: Set::new(),
            done: Set::new(),
            claimed: Set::new(),
            dup_claim: false,
            stale_completion: false,
            events: Set::new(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for job in 1..=self.jobs {
            actions.push(Action::ReadSlot { job });
        }
        for &r in &s.readers {
            actions.push(Action::BeginAppend { r });
        }
        for &p in &s.pending {
            actions.push(Action::CommitAppend { p });
            actions.push(Action::AbortAppend { p });
        }
        actions.push(Action::Claim);
        actions.push(Action::AdvanceCursor);
        for &l in &s.leases {
            actions.push(Action::Complete { l });
            actions.push(Action::Retry { l });
            actions.push(Action::Rescue { l });
        }
        for &z in &s.zombies {
            actions.push(Action::ZombieComplete { z, lease: None });
            for &l in &s.leases {
                actions.push(Action::ZombieComplete { z, lease: Some(l) });
            }
        }
        for &d in &s.deferred {
            actions.push(Action::Promote { d });
        }
        actions.push(Action::RotateQueue);
        actions.push(Action::RotateLease);
        for slot in 0..self.queue_slots {
            actions.push(Action::ReclaimQueue { s: slot });
            actions.push(Action::FinishReclaim { s: slot });
        }
        for ls in 0..self.lease_slots {
            actions.push(Action::ReclaimLease { ls });
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        match action {
            Action::ReadSlot { job } => self.read_slot(s, job),
            Action::BeginAppend { r } => self.begin_append(s, r),
            Action::CommitAppend { p } => self.commit_append(s, p),
            Action::AbortAppend { p } => self.abort_append(s, p),
            Action::Claim => self.claim(s),
            Action::AdvanceCursor => self.advance_cursor(s),
            Action::Complete { l } => self.complete(s, l),
            Action::Retry { l } => self.retry(s, l),
            Action::Rescue { l } => self.rescue(s, l),
            Action::ZombieComplete { z, lease } => self.zombie_complete(s, z, lease),
            Action::Promote { d } => self.promote(s, d),
            Action::RotateQueue => self.rotate_queue(s),
            Action::RotateLease => self.rotate_lease(s),
            Action::ReclaimQueue { s: slot } => self.reclaim_queue(s, slot),
            Action::FinishReclaim { s: slot } => self.finish_reclaim(s, slot),
            Action::ReclaimLease { ls } => self.reclaim_lease(s, ls),
        }
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NOTHING_LOST, |_, s: &State| s.nothing_lost()),
            Property::always(ONE_CLAIM_PER_LEASE, |_, s: &State| s.one_claim_per_lease()),
            Property::always(LEASE_HAS_ENTRY, |_, s: &State| s.lease_has_entry()),
            Property::always(CURSOR_NEVER_PASSES_WORK, |_, s: &State| {
                s.cursor_never_passes_work()
            }),
            Property::always(ONLY_OPEN_LEASE_COMPLETES, |_, s: &State| {
                s.only_open_lease_completes()
            }),
            Property::always(ONE_PLACE_PER_JOB, |_, s: &State| s.one_place_per_job()),
            Property::always(SEAL_HOLDS, |_, s: &State| s.seal_holds()),
            Property::always(AVAIL_IS_UNCONSUMED, |_, s: &State| s.avail_is_unconsumed()),
            Property::always(DEADLOCK_FREE, |m: &Self, s: &State| {
                m.quiescent(s) || m.can_step(s)
            }),
            Property::sometimes(WITNESSES[0], |_, s: &State| s.witness_ring_wrapped()),
            Property::sometimes(WITNESSES[1], |_, s: &State| {
                s.happened(Event::CarryUnconsumed)
            }),
            Property::sometimes(WITNESSES[2], |_, s: &State| s.happened(Event::CarryRunning)),
            Property::sometimes(WITNESSES[3], |_, s: &State| s.happened(Event::LateClaim)),
            Property::sometimes(WITNESSES[4], |_, s: &State| {
                s.happened(Event::ZombieRejected)
            }),
            Property::sometimes(WITNESSES[5], |_, s: &State| {
                s.happened(Event::LeaseReclaimed)
            }),
            Property::sometimes(WITNESSES[6], |_, s: &State| s.happened(Event::PrunedClaim)),
            Property::sometimes(WITNESSES[7], |_, s: &State| s.happened(Event::MarkDropped)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> AwaQueueRotation {
        AwaQueueRotation::new(Variant::Correct)
    }

    fn run(model: &AwaQueueRotation, actions: &[Action]) -> State {
        run_from(model, model.init_states().remove(0), actions)
    }

    fn run_from(model: &AwaQueueRotation, mut s: State, actions: &[Action]) -> State {
        for &action in actions {
            s = model
                .next_state(&s, action)
                .unwrap_or_else(|| panic!("{action:?} is not enabled in {s:?}"));
        }
        s
    }

    fn reader(job: u8, slot: u8, gen: u8) -> Reader {
        Reader { job, slot, gen }
    }

    /// A producer's whole append of job `job` into `slot` (generation `gen`) at `seq`: it
    /// reads the slot, draws the seq and commits.
    fn appended(job: u8, slot: u8, gen: u8, seq: u8) -> [Action; 3] {
        [
            Action::ReadSlot { job },
            Action::BeginAppend {
                r: reader(job, slot, gen),
            },
            Action::CommitAppend {
                p: entry(job, slot, gen, seq, 1),
            },
        ]
    }

    fn entry(job: u8, slot: u8, gen: u8, seq: u8, k: u8) -> Entry {
        Entry {
            job,
            slot,
            gen,
            seq,
            k,
        }
    }

    #[test]
    fn initial_state_satisfies_every_invariant() {
        let s = model().init_states().remove(0);
        assert!(s.nothing_lost());
        assert!(s.one_claim_per_lease());
        assert!(s.lease_has_entry());
        assert!(s.cursor_never_passes_work());
        assert!(s.only_open_lease_completes());
        assert!(s.one_place_per_job());
        assert!(s.seal_holds());
        assert!(model().quiescent(&s) && model().can_step(&s));
    }

    #[test]
    fn rotation_waits_for_the_ring_lock_and_seals_the_slot_it_leaves() {
        let m = model();
        let s = run(
            &m,
            &[
                &appended(1, 0, 0, 0)[..],
                &[Action::ReadSlot { job: 2 }][..],
            ]
            .concat(),
        );
        // Job 2's producer has read slot 0: the rotation waits for it.
        assert!(m.next_state(&s, Action::RotateQueue).is_none());
        let s = m
            .next_state(&s, Action::BeginAppend { r: reader(2, 0, 0) })
            .expect("begin");
        assert!(m.next_state(&s, Action::RotateQueue).is_none());
        let s = m
            .next_state(
                &s,
                Action::CommitAppend {
                    p: entry(2, 0, 0, 1, 1),
                },
            )
            .expect("commit");
        let s = m.next_state(&s, Action::RotateQueue).expect("rotate");
        assert_eq!(s.seal[..2], [Seal::Bound(2), Seal::Open]);
        assert!(s.seal_holds() && s.eligible(0) && s.eligible(1));

        // Claim both, move the cursor to 2: slot 0 is no longer opened.
        let s = run_from(
            &m,
            s,
            &[Action::Claim, Action::Claim, Action::AdvanceCursor],
        );
        assert_eq!(s.cursor, 2);
        assert!(!s.eligible(0) && s.eligible(1) && s.seal_holds());
    }

    #[test]
    fn a_claim_skips_a_sealed_slot_below_the_cursor() {
        let m = model();
        let s = run(
            &m,
            &[
                &appended(1, 0, 0, 0)[..],
                &[Action::Claim, Action::AdvanceCursor, Action::RotateQueue][..],
                &appended(2, 1, 0, 1)[..],
                &[Action::Claim][..],
            ]
            .concat(),
        );
        assert_eq!(s.seal[..2], [Seal::Bound(1), Seal::Open]);
        assert!(!s.eligible(0) && s.happened(Event::PrunedClaim));
        assert!(s.seal_holds() && s.cursor_never_passes_work());
        // Reclaiming slot 0 carries job 1's running entry and seals the slot at 0.
        let s = m
            .next_state(&s, Action::ReclaimQueue { s: 0 })
            .expect("reclaim");
        assert_eq!(s.seal[0], Seal::Bound(0));
        assert!(s.seal_holds() && s.lease_has_entry());
    }

    #[test]
    fn without_the_ring_lock_a_reader_appends_past_the_seal() {
        let m = AwaQueueRotation::new(Variant::SealWithoutRingLock);
        let s = run(
            &m,
            &[
                Action::ReadSlot { job: 1 },
                Action::ReadSlot { job: 2 },
                Action::BeginAppend { r: reader(1, 0, 0) },
                Action::RotateQueue,
                Action::BeginAppend { r: reader(2, 0, 0) },
                Action::AbortAppend {
                    p: entry(1, 0, 0, 0, 1),
                },
                Action::CommitAppend {
                    p: entry(2, 0, 0, 1, 1),
                },
            ],
        );
        assert_eq!(s.seal[0], Seal::Bound(1));
        assert!(!s.seal_holds() && s.cursor_never_passes_work());
        let s = run_from(&m, s, &[Action::AdvanceCursor]);
        assert!(s.cursor == 1 && !s.eligible(0) && s.cursor_never_passes_work());
        let s = run_from(&m, s, &[Action::AdvanceCursor]);
        assert_eq!(s.cursor, 2);
        assert!(!s.cursor_never_passes_work() && s.nothing_lost());
        // The correct rotation waits for both producers.
        let correct = model();
        let waiting = run(
            &correct,
            &[
                Action::ReadSlot { job: 1 },
                Action::ReadSlot { job: 2 },
                Action::BeginAppend { r: reader(1, 0, 0) },
            ],
        );
        assert!(correct.next_state(&waiting, Action::RotateQueue).is_none());
    }

    #[test]
    fn reclaim_carries_a_running_entry_and_moves_its_lease() {
        let m = model();
        let s = run(
            &m,
            &[
                &appended(1, 0, 0, 0)[..],
                &[
                    Action::Claim,
                    Action::RotateQueue,
                    Action::ReclaimQueue { s: 0 },
                ][..],
            ]
            .concat(),
        );
        assert_eq!(s.qgen[0], 1);
        assert_eq!(s.entries, [entry(1, 1, 0, 1, 1)].into_iter().collect());
        assert_eq!(s.consumed, [1].into_iter().collect());
        let lease = *s.leases.iter().next().expect("the lease stays open");
        assert_eq!((lease.slot, lease.gen, lease.seq), (1, 0, 1));
        assert!(s.lease_has_entry() && s.one_place_per_job());
        assert!(s.happened(Event::CarryRunning) && !s.happened(Event::CarryUnconsumed));
    }

    #[test]
    fn a_zombie_completion_is_rejected_under_the_lease_guard() {
        let m = model();
        let before = run(
            &m,
            &[&appended(1, 0, 0, 0)[..], &[Action::Claim][..]].concat(),
        );
        let l = *before.leases.iter().next().expect("open lease");
        let s = m.next_state(&before, Action::Rescue { l }).expect("rescue");
        let s = m
            .next_state(
                &s,
                Action::Promote {
                    d: JobLease { job: 1, k: 2 },
                },
            )
            .expect("promote");
        let s = m.next_state(&s, Action::Claim).expect("claim lease 2");
        let z = JobLease { job: 1, k: 1 };
        let successor = *s.leases.iter().next().expect("lease 2");
        assert!(m
            .next_state(
                &s,
                Action::ZombieComplete {
                    z,
                    lease: Some(successor)
                }
            )
            .is_none());
        let rejected = m
            .next_state(&s, Action::ZombieComplete { z, lease: None })
            .expect("rejected");
        assert_eq!(rejected.leases, s.leases);
        assert!(rejected.happened(Event::ZombieRejected) && rejected.only_open_lease_completes());

        let unguarded = AwaQueueRotation::new(Variant::CompleteWithoutLeaseGuard);
        let stale = unguarded
            .next_state(
                &s,
                Action::ZombieComplete {
                    z,
                    lease: Some(successor),
                },
            )
            .expect("the unguarded completion deletes lease 2");
        assert!(!stale.only_open_lease_completes() && stale.nothing_lost());
    }

    #[test]
    fn action_names_match_the_list() {
        let m = AwaQueueRotation::new(Variant::CarryForwardInTwoSteps);
        let mut s = m.init_states().remove(0);
        s.readers.insert(reader(1, 0, 0));
        s.pending.insert(entry(2, 0, 0, 1, 1));
        s.leases.insert(Lease {
            job: 1,
            k: 1,
            lslot: 0,
            slot: 0,
            gen: 0,
            seq: 0,
        });
        s.deferred.insert(JobLease { job: 2, k: 2 });
        s.zombies.insert(JobLease { job: 1, k: 1 });
        let mut actions = Vec::new();
        m.actions(&s, &mut actions);
        let names: Set<&str> = actions.iter().map(Action::name).collect();
        assert_eq!(names, ACTIONS.into_iter().collect());
        assert_eq!(
            format!(
                "{:?}",
                Action::CommitAppend {
                    p: entry(2, 1, 3, 4, 1)
                }
            ),
            "CommitAppend([job |-> 2, slot |-> 1, gen |-> 3, seq |-> 4, k |-> 1])"
        );
        assert_eq!(
            format!("{:?}", Action::ReclaimQueue { s: 1 }),
            "ReclaimQueue(1)"
        );
    }
}
