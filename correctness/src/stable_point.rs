//! Twin of `correctness/storage/AwaStablePoint.tla` (queue storage's candidate
//! stable point: how a lane's claim derives, from transaction ids alone, a seq
//! below which every producer has ended).
//!
//! Every type, action and invariant below has the name of its TLA+ counterpart,
//! and every action's guard and effect follow the TLA+ definition clause by
//! clause. When you change one file, change the other; the `stable_point_check`
//! test also checks that the `.tla` and `.cfg` files still name what this file
//! names.
//!
//! Producers are numbered `1..=producers`, xids `1..=max_xid` and seqs from 1,
//! with 0 meaning "none", as in TLA+.

use std::fmt;

use stateright::{Model, Property};

use crate::set::Set;

/// Capacity of `prod`: at most this many producers.
pub const MAX_PRODUCERS: usize = 3;

/// `CursorNeverPassesWork`: nothing a claim could take lies below the cursor.
pub const CURSOR_NEVER_PASSES_WORK: &str = "CursorNeverPassesWork";
/// `StableSettled`: no running producer's seq is at or below the stable point.
/// Checked in the positive configuration only.
pub const STABLE_SETTLED: &str = "StableSettled";

/// The invariants every configuration checks; each seeded bug violates it.
pub const INVARIANTS: [&str; 1] = [CURSOR_NEVER_PASSES_WORK];
/// Invariants only the positive configuration checks.
pub const POSITIVE_INVARIANTS: [&str; 1] = [STABLE_SETTLED];
/// TLC's deadlock check (twin-only name).
pub const DEADLOCK_FREE: &str = "DeadlockFree";

/// Reachability witnesses, same names as the TLA+ definitions.
pub const WITNESSES: [&str; 4] = [
    "WitnessStableAdvanced",
    "WitnessHeldBack",
    "WitnessGapPassed",
    "WitnessLateCommitClaimed",
];

/// The TLA+ action names, in the order `Next` lists them.
pub const ACTIONS: [&str; 7] = [
    "Hold",
    "Draw",
    "Commit",
    "Abort",
    "ClaimBegin",
    "ClaimLane",
    "ClaimEnd",
];

/// The correct protocol or one of the two seeded bugs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Correct,
    /// The candidate's horizon is the snapshot's xmax (the code before session
    /// 20's fix). Violates `CursorNeverPassesWork`.
    HorizonFromSnapshotXmax,
    /// The claim holds its xid before it reads the last seq drawn. Violates
    /// `CursorNeverPassesWork`.
    SeqReadAfterXid,
}

impl Variant {
    pub const ALL: [Variant; 3] = [
        Variant::Correct,
        Variant::HorizonFromSnapshotXmax,
        Variant::SeqReadAfterXid,
    ];

    /// The value of the TLA+ constant `Variant`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Correct => "Correct",
            Variant::HorizonFromSnapshotXmax => "HorizonFromSnapshotXmax",
            Variant::SeqReadAfterXid => "SeqReadAfterXid",
        }
    }

    /// The invariant a seeded bug's configuration expects TLC to report.
    pub fn expected_violation(self) -> Option<&'static str> {
        match self {
            Variant::Correct => None,
            _ => Some(CURSOR_NEVER_PASSES_WORK),
        }
    }

    /// Its `.cfg` file under `correctness/storage/`.
    pub fn cfg_file(self) -> &'static str {
        match self {
            Variant::Correct => "AwaStablePoint.cfg",
            Variant::HorizonFromSnapshotXmax => "AwaStablePoint_HorizonFromSnapshotXmax.cfg",
            Variant::SeqReadAfterXid => "AwaStablePoint_SeqReadAfterXid.cfg",
        }
    }
}

/// `Phases`: a producer's transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Idle,
    Xid,
    Drawn,
    Done,
}

/// `ProdRec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prod {
    pub phase: Phase,
    pub xid: u8,
    pub seq: u8,
}

/// `CPhases`: the claimer's transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClaimPhase {
    Idle,
    Begun,
    Lane,
}

/// `ClaimRec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    pub phase: ClaimPhase,
    pub vseq: u8,
    pub xid: u8,
}

/// `IdleClaim`.
const IDLE_CLAIM: Claim = Claim {
    phase: ClaimPhase::Idle,
    vseq: 0,
    xid: 0,
};

/// `Events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    HeldBack,
    GapPassed,
    LateClaim,
}

/// The variables of the TLA+ module.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub next_xid: u8,
    pub next_seq: u8,
    pub latest: u8,
    pub prod: [Prod; MAX_PRODUCERS],
    pub entries: Set<u8>,
    pub aborted: Set<u8>,
    pub consumed: Set<u8>,
    pub cursor: u8,
    pub stable: u8,
    pub cand: u8,
    pub cand_xmax: u8,
    pub claim: Claim,
    pub events: Set<Event>,
}

impl State {
    /// `PendingSeqs` (of the model's `producers`).
    fn pending_seqs(&self, producers: u8) -> impl Iterator<Item = u8> + '_ {
        self.prod[..usize::from(producers)]
            .iter()
            .filter(|p| p.phase == Phase::Drawn)
            .map(|p| p.seq)
    }

    /// `Running(x)`.
    fn running(&self, producers: u8, x: u8) -> impl Iterator<Item = u8> + '_ {
        self.prod[..usize::from(producers)]
            .iter()
            .filter(|p| matches!(p.phase, Phase::Xid | Phase::Drawn))
            .map(|p| p.xid)
            .chain((x != 0).then_some(x))
    }

    fn happened(&self, e: Event) -> bool {
        self.events.contains(&e)
    }
}

/// The disjuncts of `Next` (the stuttering `Quiescent` step needs no twin).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Hold(u8),
    Draw(u8),
    Commit(u8),
    Abort(u8),
    ClaimBegin,
    ClaimLane,
    ClaimEnd,
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Hold(p) => write!(f, "Hold({p})"),
            Action::Draw(p) => write!(f, "Draw({p})"),
            Action::Commit(p) => write!(f, "Commit({p})"),
            Action::Abort(p) => write!(f, "Abort({p})"),
            Action::ClaimBegin => f.write_str("ClaimBegin"),
            Action::ClaimLane => f.write_str("ClaimLane"),
            Action::ClaimEnd => f.write_str("ClaimEnd"),
        }
    }
}

/// The model with its constants.
#[derive(Clone, Copy, Debug)]
pub struct AwaStablePoint {
    pub producers: u8,
    pub max_xid: u8,
    pub variant: Variant,
}

impl AwaStablePoint {
    /// `variant` with the constants of the `.cfg` files.
    pub const fn new(variant: Variant) -> Self {
        AwaStablePoint {
            producers: 2,
            max_xid: 6,
            variant,
        }
    }

    /// `Quiescent`'s guard.
    pub fn quiescent(&self, s: &State) -> bool {
        s.next_xid > self.max_xid
    }

    pub fn can_step(&self, s: &State) -> bool {
        crate::harness::can_step(self, s)
    }

    /// `CursorNeverPassesWork`.
    pub fn cursor_never_passes_work(&self, s: &State) -> bool {
        s.entries
            .iter()
            .copied()
            .filter(|e| !s.consumed.contains(e))
            .chain(s.pending_seqs(self.producers))
            .all(|seq| seq >= s.cursor)
    }

    /// `StableSettled`.
    pub fn stable_settled(&self, s: &State) -> bool {
        s.pending_seqs(self.producers).all(|seq| seq > s.stable)
    }

    fn hold(&self, s: &State, p: u8) -> Option<State> {
        let i = usize::from(p - 1);
        if s.prod[i].phase != Phase::Idle || s.next_xid > self.max_xid {
            return None;
        }
        let mut n = s.clone();
        n.prod[i] = Prod {
            phase: Phase::Xid,
            xid: s.next_xid,
            seq: 0,
        };
        n.next_xid += 1;
        Some(n)
    }

    fn draw(&self, s: &State, p: u8) -> Option<State> {
        let i = usize::from(p - 1);
        if s.prod[i].phase != Phase::Xid {
            return None;
        }
        let mut n = s.clone();
        n.prod[i].phase = Phase::Drawn;
        n.prod[i].seq = s.next_seq;
        n.next_seq += 1;
        Some(n)
    }

    /// `Commit(p)` (`commit`) or `Abort(p)`.
    fn end(&self, s: &State, p: u8, commit: bool) -> Option<State> {
        let i = usize::from(p - 1);
        if s.prod[i].phase != Phase::Drawn {
            return None;
        }
        let mut n = s.clone();
        n.prod[i].phase = Phase::Done;
        if commit {
            n.entries.insert(s.prod[i].seq);
        } else {
            n.aborted.insert(s.prod[i].seq);
        }
        n.latest = s.latest.max(s.prod[i].xid);
        Some(n)
    }

    fn claim_begin(&self, s: &State) -> Option<State> {
        if s.claim.phase != ClaimPhase::Idle {
            return None;
        }
        let mut n = s.clone();
        if self.variant == Variant::SeqReadAfterXid {
            if s.next_xid > self.max_xid {
                return None;
            }
            n.claim = Claim {
                phase: ClaimPhase::Begun,
                vseq: 0,
                xid: s.next_xid,
            };
            n.next_xid += 1;
        } else {
            n.claim = Claim {
                phase: ClaimPhase::Begun,
                vseq: s.next_seq - 1,
                xid: 0,
            };
        }
        Some(n)
    }

    fn claim_lane(&self, s: &State) -> Option<State> {
        let after = self.variant == Variant::SeqReadAfterXid;
        if s.claim.phase != ClaimPhase::Begun || (!after && s.next_xid > self.max_xid) {
            return None;
        }
        let x = if after { s.claim.xid } else { s.next_xid };
        let vseq = if after { s.next_seq - 1 } else { s.claim.vseq };
        let xmin = s.running(self.producers, x).min()?;
        let ok = s.cand_xmax <= xmin;
        let stable1 = if ok { s.stable.max(s.cand) } else { s.stable };
        let renew = ok && vseq > s.cand;
        let horizon = if self.variant == Variant::HorizonFromSnapshotXmax {
            s.latest + 1
        } else {
            x
        };
        let ready = s
            .entries
            .iter()
            .copied()
            .filter(|e| !s.consumed.contains(e) && *e >= s.cursor)
            .min();

        let mut n = s.clone();
        if !after {
            n.next_xid += 1;
        }
        n.stable = stable1;
        if renew {
            n.cand = vseq;
            n.cand_xmax = horizon;
        }
        match ready {
            None => n.cursor = s.cursor.max(stable1 + 1),
            Some(e) => {
                n.consumed.insert(e);
                n.cursor = s.cursor.max((e + 1).min(stable1 + 1));
            }
        }
        n.claim = Claim {
            phase: ClaimPhase::Lane,
            vseq,
            xid: x,
        };
        if !ok {
            n.events.insert(Event::HeldBack);
        }
        if s.aborted.iter().any(|g| *g >= s.cursor && *g < n.cursor) {
            n.events.insert(Event::GapPassed);
        }
        if let Some(e) = ready {
            if s.consumed.iter().any(|c| *c > e) {
                n.events.insert(Event::LateClaim);
            }
        }
        Some(n)
    }

    fn claim_end(&self, s: &State) -> Option<State> {
        if s.claim.phase != ClaimPhase::Lane {
            return None;
        }
        let mut n = s.clone();
        n.claim = IDLE_CLAIM;
        n.latest = s.latest.max(s.claim.xid);
        Some(n)
    }
}

impl Model for AwaStablePoint {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        assert!(
            (1..=MAX_PRODUCERS).contains(&usize::from(self.producers)) && self.max_xid >= 1,
            "constants out of range: {self:?}"
        );
        let idle = Prod {
            phase: Phase::Idle,
            xid: 0,
            seq: 0,
        };
        vec![State {
            next_xid: 1,
            next_seq: 1,
            latest: 0,
            prod: [idle; MAX_PRODUCERS],
            entries: Set::new(),
            aborted: Set::new(),
            consumed: Set::new(),
            cursor: 1,
            stable: 0,
            cand: 0,
            cand_xmax: 0,
            claim: IDLE_CLAIM,
            events: Set::new(),
        }]
    }

    fn actions(&self, _: &State, actions: &mut Vec<Action>) {
        for p in 1..=self.producers {
            actions.extend([
                Action::Hold(p),
                Action::Draw(p),
                Action::Commit(p),
                Action::Abort(p),
            ]);
        }
        actions.extend([Action::ClaimBegin, Action::ClaimLane, Action::ClaimEnd]);
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        match action {
            Action::Hold(p) => self.hold(s, p),
            Action::Draw(p) => self.draw(s, p),
            Action::Commit(p) => self.end(s, p, true),
            Action::Abort(p) => self.end(s, p, false),
            Action::ClaimBegin => self.claim_begin(s),
            Action::ClaimLane => self.claim_lane(s),
            Action::ClaimEnd => self.claim_end(s),
        }
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(CURSOR_NEVER_PASSES_WORK, |m: &Self, s: &State| {
                m.cursor_never_passes_work(s)
            }),
            Property::always(STABLE_SETTLED, |m: &Self, s: &State| m.stable_settled(s)),
            Property::always(DEADLOCK_FREE, |m: &Self, s: &State| {
                m.quiescent(s) || m.can_step(s)
            }),
            Property::sometimes(WITNESSES[0], |_, s: &State| s.stable > 0),
            Property::sometimes(WITNESSES[1], |_, s: &State| s.happened(Event::HeldBack)),
            Property::sometimes(WITNESSES[2], |_, s: &State| s.happened(Event::GapPassed)),
            Property::sometimes(WITNESSES[3], |_, s: &State| s.happened(Event::LateClaim)),
        ]
    }
}
