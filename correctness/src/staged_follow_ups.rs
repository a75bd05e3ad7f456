//! Twin of `correctness/storage/AwaStagedFollowUps.tla` (ADR-046, handler-staged
//! follow-up jobs).
//!
//! Every type, action and invariant below has the name of its TLA+ counterpart,
//! and every action's guard and effect follow the TLA+ definition clause by
//! clause. When you change one file, change the other; the `model_check` test
//! also checks that the `.tla` and `.cfg` files still name what this file names.
//!
//! Jobs are numbered `1..=jobs` and attempts `1..=max_attempts`, as in TLA+;
//! attempt `l` holds run lease `l`. Keys print as `"k1"`, `"k2"`, ... and the
//! empty staging buffer (`NoKey`) is `None`.

use std::fmt;

use stateright::{Model, Property};

use crate::set::Set;

/// Capacity of the per-job arrays of [`State`]: at most this many jobs.
pub const MAX_JOBS: usize = 3;
/// Capacity of the per-attempt arrays of [`State`]: at most this many attempts.
pub const MAX_ATTEMPTS: usize = 3;

// ---------------------------------------------------------------------------
// Names shared with the TLA+ module.

/// `FollowUpTracesToCommit`: every follow-up row traces to a committed handler
/// completion of the attempt that staged it.
pub const FOLLOW_UP_TRACES_TO_COMMIT: &str = "FollowUpTracesToCommit";
/// `AtMostOneRowPerKey`: at most one row per key among the rows that hold it.
pub const AT_MOST_ONE_ROW_PER_KEY: &str = "AtMostOneRowPerKey";
/// `CompletionHasFollowUp`: every committed completion that staged a key
/// committed with its follow-up or with an existing row holding the key.
pub const COMPLETION_HAS_FOLLOW_UP: &str = "CompletionHasFollowUp";
/// `OnlyCurrentLeaseCompletes`: every handler completion committed while its
/// row was running under that attempt's lease.
pub const ONLY_CURRENT_LEASE_COMPLETES: &str = "OnlyCurrentLeaseCompletes";

/// The four invariants, in the order the positive `.cfg` lists them.
pub const INVARIANTS: [&str; 4] = [
    FOLLOW_UP_TRACES_TO_COMMIT,
    AT_MOST_ONE_ROW_PER_KEY,
    COMPLETION_HAS_FOLLOW_UP,
    ONLY_CURRENT_LEASE_COMPLETES,
];

/// TLC's deadlock check: every reachable state is `Quiescent` or has a
/// successor. Twin-only name; TLC checks it by default.
pub const DEADLOCK_FREE: &str = "DeadlockFree";

/// Reachability witnesses: the correct protocol must reach each, so the
/// invariants do not pass vacuously. Same names as the TLA+ definitions.
pub const WITNESSES: [&str; 7] = [
    "WitnessDedupSkip",
    "WitnessKeyReinserted",
    "WitnessLostAckReplay",
    "WitnessRetryAfterAbort",
    "WitnessSupersededFinalizing",
    "WitnessExternalDiscard",
    "WitnessBatchedReplay",
];

/// The TLA+ action names, in the order `Next` lists them.
pub const ACTIONS: [&str; 13] = [
    "Claim",
    "Rescue",
    "CompleteExternal",
    "Stage",
    "Seal",
    "FinalizeCommit",
    "FinalizeAbort",
    "FinalizeStale",
    "CompleteBatched",
    "FallBackToPerJob",
    "InsertAfterCommit",
    "CompleteBatchedWithFollowUps",
    "ReleaseKey",
];

// ---------------------------------------------------------------------------
// Variants (the TLA+ constant `Variant`).

/// The correct protocol or one of the six seeded bugs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// The protocol of ADR-046. Violates nothing.
    Correct,
    /// The handler inserts B itself (`insert_with(ctx.pool(), ...)`) and stages
    /// nothing. Violates `FollowUpTracesToCommit`.
    InsertBeforeCompletion,
    /// B is inserted in a separate transaction after the completion commits.
    /// Violates `CompletionHasFollowUp`.
    InsertAfterCompletion,
    /// The completion matches `(id, state = 'running')` and ignores `run_lease`.
    /// Violates `OnlyCurrentLeaseCompletes`.
    CompleteWithoutLeaseGuard,
    /// The first finalize try takes the sealed follow-ups, so a retry has none.
    /// Violates `CompletionHasFollowUp`.
    DrainOnFirstAttempt,
    /// A job that staged something is sent down the plain batched statement,
    /// which inserts nothing. Violates `CompletionHasFollowUp`.
    BatchedPath,
    /// The batch with follow-ups inserts the follow-ups of every member, also
    /// of those whose guard matched no row. Violates `FollowUpTracesToCommit`.
    BatchInsertsUnmatched,
}

impl Variant {
    /// Every variant, the correct one first.
    pub const ALL: [Variant; 7] = [
        Variant::Correct,
        Variant::InsertBeforeCompletion,
        Variant::InsertAfterCompletion,
        Variant::CompleteWithoutLeaseGuard,
        Variant::DrainOnFirstAttempt,
        Variant::BatchedPath,
        Variant::BatchInsertsUnmatched,
    ];

    /// The six seeded bugs.
    pub const NEGATIVE: [Variant; 6] = [
        Variant::InsertBeforeCompletion,
        Variant::InsertAfterCompletion,
        Variant::CompleteWithoutLeaseGuard,
        Variant::DrainOnFirstAttempt,
        Variant::BatchedPath,
        Variant::BatchInsertsUnmatched,
    ];

    /// The value of the TLA+ constant `Variant`.
    pub const fn name(self) -> &'static str {
        match self {
            Variant::Correct => "Correct",
            Variant::InsertBeforeCompletion => "InsertBeforeCompletion",
            Variant::InsertAfterCompletion => "InsertAfterCompletion",
            Variant::CompleteWithoutLeaseGuard => "CompleteWithoutLeaseGuard",
            Variant::DrainOnFirstAttempt => "DrainOnFirstAttempt",
            Variant::BatchedPath => "BatchedPath",
            Variant::BatchInsertsUnmatched => "BatchInsertsUnmatched",
        }
    }

    /// The invariant this variant is expected to violate (`None` for `Correct`).
    pub const fn expected_violation(self) -> Option<&'static str> {
        match self {
            Variant::Correct => None,
            Variant::InsertBeforeCompletion => Some(FOLLOW_UP_TRACES_TO_COMMIT),
            Variant::InsertAfterCompletion => Some(COMPLETION_HAS_FOLLOW_UP),
            Variant::CompleteWithoutLeaseGuard => Some(ONLY_CURRENT_LEASE_COMPLETES),
            Variant::DrainOnFirstAttempt => Some(COMPLETION_HAS_FOLLOW_UP),
            Variant::BatchedPath => Some(COMPLETION_HAS_FOLLOW_UP),
            Variant::BatchInsertsUnmatched => Some(FOLLOW_UP_TRACES_TO_COMMIT),
        }
    }

    /// The value of `BatchFollowUps` in this variant's `.cfg`: the batched path for
    /// the correct protocol (the engine's default) and the bug seeded in it, the
    /// per-job path for the bugs seeded there.
    pub const fn batch_follow_ups(self) -> bool {
        matches!(self, Variant::Correct | Variant::BatchInsertsUnmatched)
    }

    /// The TLC configuration file for this variant, under `correctness/storage/`.
    pub const fn cfg_file(self) -> &'static str {
        match self {
            Variant::Correct => "AwaStagedFollowUps.cfg",
            Variant::InsertBeforeCompletion => "AwaStagedFollowUps_InsertBeforeCompletion.cfg",
            Variant::InsertAfterCompletion => "AwaStagedFollowUps_InsertAfterCompletion.cfg",
            Variant::CompleteWithoutLeaseGuard => {
                "AwaStagedFollowUps_CompleteWithoutLeaseGuard.cfg"
            }
            Variant::DrainOnFirstAttempt => "AwaStagedFollowUps_DrainOnFirstAttempt.cfg",
            Variant::BatchedPath => "AwaStagedFollowUps_BatchedPath.cfg",
            Variant::BatchInsertsUnmatched => "AwaStagedFollowUps_BatchInsertsUnmatched.cfg",
        }
    }
}

// ---------------------------------------------------------------------------
// State.

/// A unique key a handler can compute for B. `Key(0)` is `"k1"`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub u8);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"k{}\"", u16::from(self.0) + 1)
    }
}

/// `JobStates`. `Available` also stands for retryable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobState {
    Available,
    Running,
    Completed,
    Failed,
}

/// `Phases` of an attempt on the worker side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Not claimed yet.
    Idle,
    /// The handler runs and its staging buffer is open.
    Running,
    /// Sealed and inside `finalize_with_retry`.
    Finalizing,
    /// `InsertAfterCompletion` only: committed, waiting for the separate insert.
    Inserting,
    Done,
}

/// `Routes`: the completion path chosen at seal time.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    None,
    PerJob,
    Batched,
}

/// `AttemptRec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    pub phase: Phase,
    /// The staging buffer, immutable once sealed.
    pub staged: Option<Key>,
    /// The sealed follow-ups as the finalizer holds them for each try.
    pub buf: Option<Key>,
    pub route: Route,
    /// Finalize tries that failed from the finalizer's point of view.
    pub tries: u8,
}

impl Attempt {
    /// TLA+ `Done`.
    pub const DONE: Attempt = Attempt {
        phase: Phase::Done,
        staged: None,
        buf: None,
        route: Route::None,
        tries: 0,
    };
    /// TLA+ `Idle`.
    pub const IDLE: Attempt = Attempt {
        phase: Phase::Idle,
        ..Attempt::DONE
    };
    /// TLA+ `Fresh`.
    pub const FRESH: Attempt = Attempt {
        phase: Phase::Running,
        ..Attempt::DONE
    };
}

/// `RowRec`: a B row that holds its key's unique claim. A row that releases
/// the claim leaves `rows`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Row {
    pub job: u8,
    pub attempt: u8,
    pub key: Key,
}

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[job |-> {}, attempt |-> {}, key |-> {:?}]",
            self.job, self.attempt, self.key
        )
    }
}

/// `CommitRec`: a committed handler completion, observed at its commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Commit {
    pub job: u8,
    pub attempt: u8,
    /// What the attempt staged.
    pub key: Option<Key>,
    /// This completion inserted a B row for `key`.
    pub inserted: bool,
    /// A B row held `key` once the completion had committed.
    pub key_held: bool,
    /// The row was running under this attempt's lease when the completion committed.
    pub current: bool,
}

/// The TLA+ variables. The arrays have room for [`MAX_JOBS`] jobs and
/// [`MAX_ATTEMPTS`] attempts; slots past `jobs` and `attempts` stay as
/// initialised and are never read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The constant `Jobs` is `1..=jobs`.
    pub jobs: u8,
    /// The constant `MaxAttempts`.
    pub attempts: u8,
    /// `jobState[j]` is `job_state[j - 1]`.
    pub job_state: [JobState; MAX_JOBS],
    /// `lease[j]` is `lease[j - 1]`.
    pub lease: [u8; MAX_JOBS],
    /// `att[j][l]` is `att[j - 1][l - 1]`.
    pub att: [[Attempt; MAX_ATTEMPTS]; MAX_JOBS],
    pub rows: Set<Row>,
    pub commits: Set<Commit>,
}

impl State {
    fn job(&self, j: u8) -> JobState {
        self.job_state[usize::from(j - 1)]
    }

    fn lease_of(&self, j: u8) -> u8 {
        self.lease[usize::from(j - 1)]
    }

    fn attempt(&self, j: u8, l: u8) -> &Attempt {
        &self.att[usize::from(j - 1)][usize::from(l - 1)]
    }

    fn set_job(&mut self, j: u8, st: JobState) {
        self.job_state[usize::from(j - 1)] = st;
    }

    fn set_attempt(&mut self, j: u8, l: u8, a: Attempt) {
        self.att[usize::from(j - 1)][usize::from(l - 1)] = a;
    }

    /// Every `(j, l, att[j][l])`.
    pub fn all_attempts(&self) -> impl Iterator<Item = (u8, u8, &Attempt)> + '_ {
        (1..=self.jobs)
            .flat_map(move |j| (1..=self.attempts).map(move |l| (j, l, self.attempt(j, l))))
    }

    /// `KeyHeld(rows, k)`: some B row holds k's unique claim
    /// (`idx_awa_jobs_unique`). Never for `NoKey`.
    pub fn key_held(&self, k: Option<Key>) -> bool {
        k.is_some_and(|k| self.rows.iter().any(|r| r.key == k))
    }

    /// `InsertFollowUp(j, l, k)`: insert under a savepoint, skipping a unique
    /// conflict; an empty buffer inserts nothing.
    fn insert_follow_up(&mut self, j: u8, l: u8, k: Option<Key>) {
        let Some(key) = k else { return };
        if self.key_held(k) {
            return;
        }
        self.rows.insert(Row {
            job: j,
            attempt: l,
            key,
        });
    }

    /// `CommitRecord(j, l, after)`: `self` is the state before the commit and
    /// `after` the rows once it committed.
    fn commit_record(&self, j: u8, l: u8, after: &Set<Row>) -> Commit {
        let staged = self.attempt(j, l).staged;
        let own = |key| Row {
            job: j,
            attempt: l,
            key,
        };
        Commit {
            job: j,
            attempt: l,
            key: staged,
            inserted: staged
                .is_some_and(|k| after.contains(&own(k)) && !self.rows.contains(&own(k))),
            key_held: staged.is_some_and(|k| after.iter().any(|r| r.key == k)),
            current: self.job(j) == JobState::Running && self.lease_of(j) == l,
        }
    }

    // -- Invariants ---------------------------------------------------------

    /// `FollowUpTracesToCommit`.
    pub fn follow_up_traces_to_commit(&self) -> bool {
        self.rows.iter().all(|r| {
            self.commits
                .iter()
                .any(|c| c.job == r.job && c.attempt == r.attempt && c.key == Some(r.key))
        })
    }

    /// `AtMostOneRowPerKey`.
    pub fn at_most_one_row_per_key(&self) -> bool {
        self.rows
            .iter()
            .all(|r1| self.rows.iter().all(|r2| r1 == r2 || r1.key != r2.key))
    }

    /// `CompletionHasFollowUp`.
    pub fn completion_has_follow_up(&self) -> bool {
        self.commits.iter().all(|c| c.key.is_none() || c.key_held)
    }

    /// `OnlyCurrentLeaseCompletes`.
    pub fn only_current_lease_completes(&self) -> bool {
        self.commits.iter().all(|c| c.current)
    }

    // -- Witnesses ----------------------------------------------------------

    /// `WitnessDedupSkip`.
    pub fn witness_dedup_skip(&self) -> bool {
        self.commits
            .iter()
            .any(|c| c.key.is_some() && c.key_held && !c.inserted)
    }

    /// `WitnessKeyReinserted`.
    pub fn witness_key_reinserted(&self) -> bool {
        self.commits.iter().any(|c1| {
            self.commits
                .iter()
                .any(|c2| c1 != c2 && c1.inserted && c2.inserted && c1.key == c2.key)
        })
    }

    /// `WitnessLostAckReplay`.
    pub fn witness_lost_ack_replay(&self) -> bool {
        self.all_attempts().any(|(j, l, a)| {
            a.phase == Phase::Finalizing
                && a.tries > 0
                && self.commits.iter().any(|c| c.job == j && c.attempt == l)
        })
    }

    /// `WitnessRetryAfterAbort`.
    pub fn witness_retry_after_abort(&self) -> bool {
        self.all_attempts().any(|(j, l, a)| {
            a.phase == Phase::Finalizing
                && a.tries > 0
                && a.staged.is_some()
                && self.job(j) == JobState::Running
                && self.lease_of(j) == l
        })
    }

    /// `WitnessSupersededFinalizing`.
    pub fn witness_superseded_finalizing(&self) -> bool {
        self.all_attempts().any(|(j, l, a)| {
            a.phase == Phase::Finalizing && a.staged.is_some() && self.lease_of(j) > l
        })
    }

    /// `WitnessBatchedReplay`.
    pub fn witness_batched_replay(&self) -> bool {
        self.all_attempts().any(|(j, l, a)| {
            a.phase == Phase::Finalizing
                && a.route == Route::Batched
                && a.tries > 0
                && self
                    .commits
                    .iter()
                    .any(|c| c.job == j && c.attempt == l && c.inserted)
        })
    }

    /// `WitnessExternalDiscard`.
    pub fn witness_external_discard(&self) -> bool {
        (1..=self.jobs).any(|j| {
            self.job(j) == JobState::Completed
                && self.commits.iter().all(|c| c.job != j)
                && (1..=self.attempts).any(|l| self.attempt(j, l).staged.is_some())
        })
    }
}

fn tla_bool(b: bool) -> &'static str {
    if b {
        "TRUE"
    } else {
        "FALSE"
    }
}

// ---------------------------------------------------------------------------
// Actions.

/// The disjuncts of `Next` (the stuttering `Quiescent` step needs no twin).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Claim {
        job: u8,
    },
    Rescue {
        job: u8,
    },
    CompleteExternal {
        job: u8,
    },
    Stage {
        job: u8,
        attempt: u8,
        key: Key,
    },
    Seal {
        job: u8,
        attempt: u8,
    },
    FinalizeCommit {
        job: u8,
        attempt: u8,
        ack_lost: bool,
    },
    FinalizeAbort {
        job: u8,
        attempt: u8,
    },
    FinalizeStale {
        job: u8,
        attempt: u8,
    },
    CompleteBatched {
        job: u8,
        attempt: u8,
    },
    FallBackToPerJob {
        job: u8,
        attempt: u8,
    },
    InsertAfterCommit {
        job: u8,
        attempt: u8,
    },
    /// `CompleteBatchedWithFollowUps(B, ackLost)`; `batch` is `B` as a [`Batch`].
    CompleteBatchedWithFollowUps {
        batch: Batch,
        ack_lost: bool,
    },
    ReleaseKey {
        row: Row,
    },
}

/// A set of `<<job, attempt>>` batch members: bit `(j - 1) * MAX_ATTEMPTS + (l - 1)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Batch(pub u16);

impl Batch {
    fn bit(j: u8, l: u8) -> u16 {
        1 << (usize::from(j - 1) * MAX_ATTEMPTS + usize::from(l - 1))
    }

    /// Whether `<<j, l>>` is a member.
    pub fn contains(self, j: u8, l: u8) -> bool {
        self.0 & Batch::bit(j, l) != 0
    }

    /// The members in batch order (job, then attempt), as `Precedes` orders them.
    pub fn members(self, jobs: u8, attempts: u8) -> impl Iterator<Item = (u8, u8)> {
        (1..=jobs)
            .flat_map(move |j| (1..=attempts).map(move |l| (j, l)))
            .filter(move |&(j, l)| self.contains(j, l))
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members: Vec<String> = self
            .members(MAX_JOBS as u8, MAX_ATTEMPTS as u8)
            .map(|(j, l)| format!("<<{j}, {l}>>"))
            .collect();
        write!(f, "{{{}}}", members.join(", "))
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Route::None => "\"none\"",
            Route::PerJob => "\"perjob\"",
            Route::Batched => "\"batched\"",
        })
    }
}

impl Action {
    /// The TLA+ action name.
    pub const fn name(&self) -> &'static str {
        match self {
            Action::Claim { .. } => "Claim",
            Action::Rescue { .. } => "Rescue",
            Action::CompleteExternal { .. } => "CompleteExternal",
            Action::Stage { .. } => "Stage",
            Action::Seal { .. } => "Seal",
            Action::FinalizeCommit { .. } => "FinalizeCommit",
            Action::FinalizeAbort { .. } => "FinalizeAbort",
            Action::FinalizeStale { .. } => "FinalizeStale",
            Action::CompleteBatched { .. } => "CompleteBatched",
            Action::FallBackToPerJob { .. } => "FallBackToPerJob",
            Action::InsertAfterCommit { .. } => "InsertAfterCommit",
            Action::CompleteBatchedWithFollowUps { .. } => "CompleteBatchedWithFollowUps",
            Action::ReleaseKey { .. } => "ReleaseKey",
        }
    }
}

/// Prints the action as a TLA+ action instance, e.g. `Stage(1, 2, "k1")`.
impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        match *self {
            Action::Claim { job } | Action::Rescue { job } | Action::CompleteExternal { job } => {
                write!(f, "{name}({job})")
            }
            Action::Stage { job, attempt, key } => write!(f, "{name}({job}, {attempt}, {key:?})"),
            Action::FinalizeCommit {
                job,
                attempt,
                ack_lost,
            } => write!(f, "{name}({job}, {attempt}, {})", tla_bool(ack_lost)),
            Action::CompleteBatchedWithFollowUps { batch, ack_lost } => {
                write!(f, "{name}({batch:?}, {})", tla_bool(ack_lost))
            }
            Action::Seal { job, attempt }
            | Action::FallBackToPerJob { job, attempt }
            | Action::FinalizeAbort { job, attempt }
            | Action::FinalizeStale { job, attempt }
            | Action::CompleteBatched { job, attempt }
            | Action::InsertAfterCommit { job, attempt } => write!(f, "{name}({job}, {attempt})"),
            Action::ReleaseKey { row } => write!(f, "{name}({row:?})"),
        }
    }
}

// ---------------------------------------------------------------------------
// The model.

/// The TLA+ constants. [`AwaStagedFollowUps::new`] uses the values of the
/// `.cfg` files: `Jobs = {1, 2}`, `Keys = {"k1", "k2"}`, `MaxAttempts = 2`,
/// `MaxFinalizeTries = 2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AwaStagedFollowUps {
    pub jobs: u8,
    pub keys: u8,
    pub max_attempts: u8,
    pub max_finalize_tries: u8,
    /// The constant `BatchFollowUps` (`RuntimeConfig::batch_follow_ups`).
    pub batch_follow_ups: bool,
    pub variant: Variant,
}

impl AwaStagedFollowUps {
    /// `variant` with the constants of its `.cfg` ([`Variant::batch_follow_ups`]).
    pub const fn new(variant: Variant) -> Self {
        AwaStagedFollowUps {
            jobs: 2,
            keys: 2,
            max_attempts: 2,
            max_finalize_tries: 2,
            batch_follow_ups: variant.batch_follow_ups(),
            variant,
        }
    }

    /// The correct protocol with `BatchFollowUps = FALSE`: every completion with a
    /// follow-up takes the per-job transaction (`AwaStagedFollowUps_PerJob.cfg`).
    pub const fn per_job() -> Self {
        AwaStagedFollowUps {
            batch_follow_ups: false,
            ..AwaStagedFollowUps::new(Variant::Correct)
        }
    }

    fn job_ids(&self) -> impl Iterator<Item = u8> {
        1..=self.jobs
    }

    fn attempt_ids(&self) -> impl Iterator<Item = u8> {
        1..=self.max_attempts
    }

    /// `Guard(j, l)`: the completion's `WHERE (id, state = 'running', run_lease)`.
    fn guard(&self, s: &State, j: u8, l: u8) -> bool {
        s.job(j) == JobState::Running
            && (self.variant == Variant::CompleteWithoutLeaseGuard || s.lease_of(j) == l)
    }

    /// `Quiescent`'s guard: every job terminal and no attempt live.
    pub fn quiescent(&self, s: &State) -> bool {
        self.job_ids()
            .all(|j| matches!(s.job(j), JobState::Completed | JobState::Failed))
            && s.all_attempts()
                .all(|(_, _, a)| matches!(a.phase, Phase::Idle | Phase::Done))
    }

    /// Some action of `Next` other than `Quiescent` is enabled.
    pub fn can_step(&self, s: &State) -> bool {
        crate::harness::can_step(self, s)
    }

    /// `AfterFailedTry(a)`.
    fn after_failed_try(&self, a: &Attempt) -> Attempt {
        if a.tries + 1 < self.max_finalize_tries {
            Attempt {
                tries: a.tries + 1,
                buf: if self.variant == Variant::DrainOnFirstAttempt {
                    None
                } else {
                    a.buf
                },
                ..*a
            }
        } else {
            Attempt::DONE
        }
    }

    // One function per TLA+ action: `None` when the action is not enabled.

    fn claim(&self, s: &State, j: u8) -> Option<State> {
        if s.job(j) != JobState::Available || s.lease_of(j) >= self.max_attempts {
            return None;
        }
        let mut n = s.clone();
        n.set_job(j, JobState::Running);
        let l = s.lease_of(j) + 1;
        n.lease[usize::from(j - 1)] = l;
        n.set_attempt(j, l, Attempt::FRESH);
        Some(n)
    }

    fn stage(&self, s: &State, j: u8, l: u8, k: Key) -> Option<State> {
        let a = s.attempt(j, l);
        if a.phase != Phase::Running || a.staged.is_some() {
            return None;
        }
        let mut n = s.clone();
        if self.variant == Variant::InsertBeforeCompletion {
            n.insert_follow_up(j, l, Some(k));
        } else {
            n.set_attempt(
                j,
                l,
                Attempt {
                    staged: Some(k),
                    ..*a
                },
            );
        }
        Some(n)
    }

    fn seal(&self, s: &State, j: u8, l: u8) -> Option<State> {
        let a = *s.attempt(j, l);
        if a.phase != Phase::Running {
            return None;
        }
        let route =
            if a.staged.is_some() && !self.batch_follow_ups && self.variant != Variant::BatchedPath
            {
                Route::PerJob
            } else {
                Route::Batched
            };
        let mut n = s.clone();
        n.set_attempt(
            j,
            l,
            Attempt {
                phase: Phase::Finalizing,
                buf: a.staged,
                route,
                ..a
            },
        );
        Some(n)
    }

    fn finalize_commit(&self, s: &State, j: u8, l: u8, ack_lost: bool) -> Option<State> {
        let a = *s.attempt(j, l);
        if a.phase != Phase::Finalizing || a.route != Route::PerJob || !self.guard(s, j, l) {
            return None;
        }
        let mut n = s.clone();
        n.set_job(j, JobState::Completed);
        if self.variant != Variant::InsertAfterCompletion {
            n.insert_follow_up(j, l, a.buf);
        }
        n.commits.insert(s.commit_record(j, l, &n.rows));
        let next = if ack_lost {
            self.after_failed_try(&a)
        } else if self.variant == Variant::InsertAfterCompletion {
            Attempt {
                phase: Phase::Inserting,
                ..a
            }
        } else {
            Attempt::DONE
        };
        n.set_attempt(j, l, next);
        Some(n)
    }

    fn finalize_abort(&self, s: &State, j: u8, l: u8) -> Option<State> {
        let a = *s.attempt(j, l);
        if a.phase != Phase::Finalizing
            || !(a.route == Route::PerJob || (self.batch_follow_ups && a.buf.is_some()))
        {
            return None;
        }
        let mut n = s.clone();
        n.set_attempt(j, l, self.after_failed_try(&a));
        Some(n)
    }

    fn finalize_stale(&self, s: &State, j: u8, l: u8) -> Option<State> {
        if s.attempt(j, l).phase != Phase::Finalizing || self.guard(s, j, l) {
            return None;
        }
        let mut n = s.clone();
        n.set_attempt(j, l, Attempt::DONE);
        Some(n)
    }

    fn complete_batched(&self, s: &State, j: u8, l: u8) -> Option<State> {
        let a = s.attempt(j, l);
        if a.phase != Phase::Finalizing
            || a.route != Route::Batched
            || !(self.variant == Variant::BatchedPath || a.buf.is_none())
            || !self.guard(s, j, l)
        {
            return None;
        }
        let mut n = s.clone();
        n.set_job(j, JobState::Completed);
        n.commits.insert(s.commit_record(j, l, &s.rows));
        n.set_attempt(j, l, Attempt::DONE);
        Some(n)
    }

    fn complete_batched_with_follow_ups(
        &self,
        s: &State,
        batch: Batch,
        ack_lost: bool,
    ) -> Option<State> {
        let members: Vec<(u8, u8)> = batch.members(self.jobs, self.max_attempts).collect();
        let member = |&(j, l): &(u8, u8)| {
            let a = s.attempt(j, l);
            a.phase == Phase::Finalizing && a.route == Route::Batched && a.buf.is_some()
        };
        if !self.batch_follow_ups || members.is_empty() || !members.iter().all(member) {
            return None;
        }
        let matched: Vec<(u8, u8)> = members
            .iter()
            .copied()
            .filter(|&(j, l)| self.guard(s, j, l))
            .collect();
        let inserting = if self.variant == Variant::BatchInsertsUnmatched {
            &members
        } else {
            &matched
        };
        let mut n = s.clone();
        // BatchInsert: in batch order, each member's key unless a row holds it by
        // then (an existing row, or an earlier member's).
        for &(j, l) in inserting {
            n.insert_follow_up(j, l, s.attempt(j, l).buf);
        }
        for &(j, l) in &matched {
            n.set_job(j, JobState::Completed);
            n.commits.insert(s.commit_record(j, l, &n.rows));
        }
        for &(j, l) in &members {
            let a = s.attempt(j, l);
            let next = if ack_lost {
                self.after_failed_try(a)
            } else {
                Attempt::DONE
            };
            n.set_attempt(j, l, next);
        }
        Some(n)
    }

    fn fall_back_to_per_job(&self, s: &State, j: u8, l: u8) -> Option<State> {
        let a = *s.attempt(j, l);
        if !self.batch_follow_ups
            || a.phase != Phase::Finalizing
            || a.route != Route::Batched
            || a.buf.is_none()
        {
            return None;
        }
        let mut n = s.clone();
        n.set_attempt(
            j,
            l,
            Attempt {
                route: Route::PerJob,
                tries: 0,
                ..a
            },
        );
        Some(n)
    }

    fn insert_after_commit(&self, s: &State, j: u8, l: u8) -> Option<State> {
        let a = *s.attempt(j, l);
        if a.phase != Phase::Inserting {
            return None;
        }
        let mut n = s.clone();
        n.insert_follow_up(j, l, a.buf);
        n.set_attempt(j, l, Attempt::DONE);
        Some(n)
    }

    fn rescue(&self, s: &State, j: u8) -> Option<State> {
        if s.job(j) != JobState::Running {
            return None;
        }
        let mut n = s.clone();
        let next = if s.lease_of(j) < self.max_attempts {
            JobState::Available
        } else {
            JobState::Failed
        };
        n.set_job(j, next);
        Some(n)
    }

    fn complete_external(&self, s: &State, j: u8) -> Option<State> {
        if s.job(j) != JobState::Running {
            return None;
        }
        let mut n = s.clone();
        n.set_job(j, JobState::Completed);
        Some(n)
    }

    fn release_key(&self, s: &State, r: Row) -> Option<State> {
        if !s.rows.contains(&r) {
            return None;
        }
        let mut n = s.clone();
        n.rows.remove(&r);
        Some(n)
    }
}

impl Model for AwaStagedFollowUps {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        assert!(
            (1..=MAX_JOBS).contains(&usize::from(self.jobs))
                && (1..=MAX_ATTEMPTS).contains(&usize::from(self.max_attempts))
                && self.keys >= 1
                && self.max_finalize_tries >= 1,
            "constants out of range: {self:?}"
        );
        vec![State {
            jobs: self.jobs,
            attempts: self.max_attempts,
            job_state: [JobState::Available; MAX_JOBS],
            lease: [0; MAX_JOBS],
            att: [[Attempt::IDLE; MAX_ATTEMPTS]; MAX_JOBS],
            rows: Set::new(),
            commits: Set::new(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for job in self.job_ids() {
            actions.push(Action::Claim { job });
            actions.push(Action::Rescue { job });
            actions.push(Action::CompleteExternal { job });
        }
        for job in self.job_ids() {
            for attempt in self.attempt_ids() {
                for k in 0..self.keys {
                    actions.push(Action::Stage {
                        job,
                        attempt,
                        key: Key(k),
                    });
                }
                actions.push(Action::Seal { job, attempt });
                for ack_lost in [false, true] {
                    actions.push(Action::FinalizeCommit {
                        job,
                        attempt,
                        ack_lost,
                    });
                }
                actions.push(Action::FinalizeAbort { job, attempt });
                actions.push(Action::FinalizeStale { job, attempt });
                actions.push(Action::CompleteBatched { job, attempt });
                actions.push(Action::FallBackToPerJob { job, attempt });
                actions.push(Action::InsertAfterCommit { job, attempt });
            }
        }
        // SUBSET (Jobs \X Attempts): every set of members; the empty one is never
        // enabled. Only sets of attempts on the batched route can be, so the rest are
        // skipped here rather than tried.
        let batched = s
            .all_attempts()
            .filter(|(_, _, a)| {
                a.phase == Phase::Finalizing && a.route == Route::Batched && a.buf.is_some()
            })
            .fold(0u16, |m, (j, l, _)| m | Batch::bit(j, l));
        let mut batch = batched;
        while batch != 0 {
            for ack_lost in [false, true] {
                actions.push(Action::CompleteBatchedWithFollowUps {
                    batch: Batch(batch),
                    ack_lost,
                });
            }
            batch = (batch - 1) & batched;
        }
        for &row in &s.rows {
            actions.push(Action::ReleaseKey { row });
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        match action {
            Action::Claim { job } => self.claim(s, job),
            Action::Rescue { job } => self.rescue(s, job),
            Action::CompleteExternal { job } => self.complete_external(s, job),
            Action::Stage { job, attempt, key } => self.stage(s, job, attempt, key),
            Action::Seal { job, attempt } => self.seal(s, job, attempt),
            Action::FinalizeCommit {
                job,
                attempt,
                ack_lost,
            } => self.finalize_commit(s, job, attempt, ack_lost),
            Action::FinalizeAbort { job, attempt } => self.finalize_abort(s, job, attempt),
            Action::FinalizeStale { job, attempt } => self.finalize_stale(s, job, attempt),
            Action::CompleteBatched { job, attempt } => self.complete_batched(s, job, attempt),
            Action::FallBackToPerJob { job, attempt } => self.fall_back_to_per_job(s, job, attempt),
            Action::InsertAfterCommit { job, attempt } => self.insert_after_commit(s, job, attempt),
            Action::CompleteBatchedWithFollowUps { batch, ack_lost } => {
                self.complete_batched_with_follow_ups(s, batch, ack_lost)
            }
            Action::ReleaseKey { row } => self.release_key(s, row),
        }
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(FOLLOW_UP_TRACES_TO_COMMIT, |_, s: &State| {
                s.follow_up_traces_to_commit()
            }),
            Property::always(AT_MOST_ONE_ROW_PER_KEY, |_, s: &State| {
                s.at_most_one_row_per_key()
            }),
            Property::always(COMPLETION_HAS_FOLLOW_UP, |_, s: &State| {
                s.completion_has_follow_up()
            }),
            Property::always(ONLY_CURRENT_LEASE_COMPLETES, |_, s: &State| {
                s.only_current_lease_completes()
            }),
            Property::always(DEADLOCK_FREE, |m: &Self, s: &State| {
                m.quiescent(s) || m.can_step(s)
            }),
            Property::sometimes(WITNESSES[0], |_, s: &State| s.witness_dedup_skip()),
            Property::sometimes(WITNESSES[1], |_, s: &State| s.witness_key_reinserted()),
            Property::sometimes(WITNESSES[2], |_, s: &State| s.witness_lost_ack_replay()),
            Property::sometimes(WITNESSES[3], |_, s: &State| s.witness_retry_after_abort()),
            Property::sometimes(WITNESSES[4], |_, s: &State| {
                s.witness_superseded_finalizing()
            }),
            Property::sometimes(WITNESSES[5], |_, s: &State| s.witness_external_discard()),
            Property::sometimes(WITNESSES[6], |_, s: &State| s.witness_batched_replay()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> State {
        AwaStagedFollowUps::new(Variant::Correct)
            .init_states()
            .remove(0)
    }

    fn row(job: u8, attempt: u8, key: u8) -> Row {
        Row {
            job,
            attempt,
            key: Key(key),
        }
    }

    fn commit(job: u8, attempt: u8, key: Option<u8>, key_held: bool, current: bool) -> Commit {
        Commit {
            job,
            attempt,
            key: key.map(Key),
            inserted: false,
            key_held,
            current,
        }
    }

    #[test]
    fn initial_state_satisfies_every_invariant() {
        let s = empty();
        assert!(s.follow_up_traces_to_commit());
        assert!(s.at_most_one_row_per_key());
        assert!(s.completion_has_follow_up());
        assert!(s.only_current_lease_completes());
    }

    // No seeded bug breaks deduplication, so this invariant's predicate is
    // checked here on hand-built states.
    #[test]
    fn at_most_one_row_per_key_rejects_a_second_holder() {
        let mut s = empty();
        s.rows.insert(row(1, 1, 0));
        s.rows.insert(row(2, 2, 1));
        assert!(s.at_most_one_row_per_key());
        s.rows.insert(row(2, 1, 0));
        assert!(!s.at_most_one_row_per_key());
    }

    #[test]
    fn follow_up_traces_to_commit_needs_the_staging_attempt_and_key() {
        let mut s = empty();
        s.rows.insert(row(1, 2, 0));
        assert!(!s.follow_up_traces_to_commit());
        s.commits.insert(commit(1, 1, Some(0), true, true));
        assert!(!s.follow_up_traces_to_commit(), "another attempt");
        s.commits.insert(commit(1, 2, Some(1), true, true));
        assert!(!s.follow_up_traces_to_commit(), "another key");
        s.commits.insert(commit(1, 2, Some(0), true, true));
        assert!(s.follow_up_traces_to_commit());
    }

    #[test]
    fn completion_has_follow_up_needs_the_key_held_at_commit() {
        let mut s = empty();
        s.commits.insert(commit(1, 1, None, false, true));
        assert!(s.completion_has_follow_up(), "nothing staged");
        s.commits.insert(commit(2, 1, Some(0), true, true));
        assert!(s.completion_has_follow_up());
        s.commits.insert(commit(2, 2, Some(1), false, true));
        assert!(!s.completion_has_follow_up());
    }

    #[test]
    fn commit_record_observes_the_rows_after_the_commit() {
        let model = AwaStagedFollowUps::per_job();
        let mut s = empty();
        for action in [
            Action::Claim { job: 1 },
            Action::Stage {
                job: 1,
                attempt: 1,
                key: Key(0),
            },
            Action::Seal { job: 1, attempt: 1 },
            Action::FinalizeCommit {
                job: 1,
                attempt: 1,
                ack_lost: false,
            },
        ] {
            s = model.next_state(&s, action).expect("enabled");
        }
        assert_eq!(s.rows, [row(1, 1, 0)].into_iter().collect());
        assert_eq!(s.commits.len(), 1);
        let c = *s.commits.iter().next().expect("one commit");
        assert!(c.inserted && c.key_held && c.current);
        assert_eq!(s.attempt(1, 1), &Attempt::DONE);
    }

    #[test]
    fn action_names_match_the_list() {
        let model = AwaStagedFollowUps::new(Variant::Correct);
        let mut s = empty();
        s.rows.insert(row(1, 1, 0));
        // A batch is listed only once some attempt is on the batched route with
        // something to insert.
        s.set_attempt(
            1,
            1,
            Attempt {
                phase: Phase::Finalizing,
                route: Route::Batched,
                staged: Some(Key(0)),
                buf: Some(Key(0)),
                ..Attempt::DONE
            },
        );
        let mut actions = Vec::new();
        model.actions(&s, &mut actions);
        let names: Set<&str> = actions.iter().map(Action::name).collect();
        assert_eq!(names, ACTIONS.into_iter().collect());
        assert_eq!(
            format!(
                "{:?}",
                Action::FinalizeCommit {
                    job: 1,
                    attempt: 2,
                    ack_lost: true
                }
            ),
            "FinalizeCommit(1, 2, TRUE)"
        );
        assert_eq!(
            format!(
                "{:?}",
                Action::CompleteBatchedWithFollowUps {
                    batch: Batch(Batch::bit(1, 2) | Batch::bit(2, 1)),
                    ack_lost: false
                }
            ),
            "CompleteBatchedWithFollowUps({<<1, 2>>, <<2, 1>>}, FALSE)"
        );
    }
}
