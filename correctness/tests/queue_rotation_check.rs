//! CI model check of `correctness/storage/AwaQueueRotation.tla`, through its
//! executable twin `awa_correctness::queue_rotation`.
//!
//! - The correct protocol is searched exhaustively: no invariant is violated
//!   (also `OnePlacePerJob` and `SealHolds`, which only the positive
//!   configuration checks), no
//!   state deadlocks, every witness is reached, and the number of distinct
//!   states is pinned (it is also the number TLC reports for
//!   `AwaQueueRotation.cfg`).
//! - Each seeded bug is searched exhaustively: exactly its named invariant (and
//!   the consequences `Variant::consequences` lists) is violated and no state
//!   deadlocks. Its shortest counterexample (what TLC's
//!   breadth-first search reports) is found by iterative deepening and printed.
//! - The `.tla` and `.cfg` files still name the twin's actions, invariants,
//!   witnesses, variants and constants.
//!
//! Run with `cargo test -p awa-correctness --test queue_rotation_check --
//! --nocapture` to see the counts and counterexamples.

use std::collections::BTreeSet;

use awa_correctness::harness::{
    assert_cfg_states, assert_shortest_counterexample, assert_tla_names, check_exhaustively,
    render, storage_file, Expect,
};
use awa_correctness::queue_rotation::{
    State, Variant, ACTIONS, DEADLOCK_FREE, INVARIANTS, POSITIVE_INVARIANTS, WITNESSES,
};
use awa_correctness::AwaQueueRotation;

/// Distinct states of the correct protocol with the `.cfg` constants. TLC's
/// "distinct states found" for `AwaQueueRotation.cfg` must be the same number;
/// if a change to the model moves it, update it here, in the `.cfg` and in the
/// README.
const POSITIVE_DISTINCT_STATES: usize = 382_388;

/// The same with `QueueSlots = 3` (ignored test). With three slots and
/// `MaxSeq = 3` the ring cannot wrap with an entry in it (that takes a fourth
/// seq, and `MaxSeq = 4` is about six million states), so that search shows the
/// invariants with a slot the ring can pass over, not `WitnessRingWrapped`.
const THREE_QUEUE_SLOTS_DISTINCT_STATES: usize = 553_306;

/// Length (number of actions) of each seeded bug's shortest counterexample.
fn shortest_counterexample_len(variant: Variant) -> usize {
    match variant {
        Variant::Correct => unreachable!(),
        Variant::ReclaimWithoutCarryForward => 5,
        Variant::ReclaimUnderOpenLease => 6,
        Variant::CarryForwardInTwoSteps => 7,
        Variant::CursorSkipsPending => 4,
        Variant::CompleteWithoutLeaseGuard => 8,
        Variant::SealWithoutRingLock => 9,
    }
}

fn holds(name: &str, s: &State) -> bool {
    match name {
        "NothingLost" => s.nothing_lost(),
        "OneClaimPerLease" => s.one_claim_per_lease(),
        "LeaseHasEntry" => s.lease_has_entry(),
        "CursorNeverPassesWork" => s.cursor_never_passes_work(),
        "OnlyOpenLeaseCompletes" => s.only_open_lease_completes(),
        other => panic!("unknown invariant {other}"),
    }
}

fn check_positive(model: AwaQueueRotation, expected_distinct: usize, witnesses: &[&'static str]) {
    let outcome = check_exhaustively(model);
    println!(
        "Correct (QueueSlots = {}): {} distinct states ({} generated, depth {}) in {:.2}s",
        model.queue_slots, outcome.distinct, outcome.generated, outcome.max_depth, outcome.seconds
    );
    outcome.assert_correct(
        "AwaQueueRotation",
        INVARIANTS
            .into_iter()
            .chain(POSITIVE_INVARIANTS)
            .chain([DEADLOCK_FREE]),
        witnesses.iter().copied(),
        expected_distinct,
    );
}

#[test]
fn correct_protocol_satisfies_every_invariant_exhaustively() {
    check_positive(
        AwaQueueRotation::new(Variant::Correct),
        POSITIVE_DISTINCT_STATES,
        &WITNESSES,
    );
}

/// Three queue slots; run with `cargo test -p awa-correctness -- --ignored`.
#[test]
#[ignore = "slower, and the ring cannot wrap within MaxSeq = 3: the CI configuration uses QueueSlots = 2"]
fn correct_protocol_with_three_queue_slots() {
    let witnesses: Vec<&'static str> = WITNESSES
        .into_iter()
        .filter(|w| *w != "WitnessRingWrapped")
        .collect();
    check_positive(
        AwaQueueRotation {
            queue_slots: 3,
            ..AwaQueueRotation::new(Variant::Correct)
        },
        THREE_QUEUE_SLOTS_DISTINCT_STATES,
        &witnesses,
    );
}

fn check_negative(variant: Variant) {
    let expected = variant.expected_violation().expect("a seeded bug");
    let outcome = check_exhaustively(AwaQueueRotation::new(variant));
    let violated = outcome.violated(&INVARIANTS);
    println!(
        "{}: {} distinct states ({} generated) in {:.2}s; violates {:?}",
        variant.name(),
        outcome.distinct,
        outcome.generated,
        outcome.seconds,
        violated
    );
    let mut want = BTreeSet::from([expected]);
    want.extend(variant.consequences());
    assert_eq!(
        violated,
        want,
        "{} must violate exactly {expected} and its consequences",
        variant.name()
    );
    assert!(
        outcome.done,
        "{}: the search did not finish",
        variant.name()
    );
    if let Some(path) = outcome.discoveries.get(DEADLOCK_FREE) {
        panic!("{} deadlocks:\n{}", variant.name(), render(path));
    }
    assert!(!holds(expected, outcome.discoveries[expected].last_state()));

    assert_shortest_counterexample(
        variant.name(),
        || AwaQueueRotation::new(variant),
        expected,
        |s| holds(expected, s),
        shortest_counterexample_len(variant),
    );
}

#[test]
fn reclaim_without_carry_forward_violates_nothing_lost() {
    check_negative(Variant::ReclaimWithoutCarryForward);
}

#[test]
fn reclaim_under_open_lease_violates_lease_has_entry() {
    check_negative(Variant::ReclaimUnderOpenLease);
}

#[test]
fn carry_forward_in_two_steps_violates_one_claim_per_lease() {
    check_negative(Variant::CarryForwardInTwoSteps);
}

#[test]
fn cursor_skips_pending_violates_cursor_never_passes_work() {
    check_negative(Variant::CursorSkipsPending);
}

#[test]
fn complete_without_lease_guard_violates_only_open_lease_completes() {
    check_negative(Variant::CompleteWithoutLeaseGuard);
}

#[test]
fn seal_without_ring_lock_violates_cursor_never_passes_work() {
    check_negative(Variant::SealWithoutRingLock);
}

// ---------------------------------------------------------------------------
// The TLA+ files stay in step with the twin.

#[test]
fn tla_module_defines_every_twin_name() {
    assert_tla_names(
        "AwaQueueRotation",
        ACTIONS
            .into_iter()
            .chain(INVARIANTS)
            .chain(POSITIVE_INVARIANTS)
            .chain(WITNESSES)
            .chain(["TypeOK", "Quiescent"]),
        Variant::ALL.iter().map(|v| v.name()),
    );
}

#[test]
fn cfg_files_match_the_twin() {
    for variant in Variant::ALL {
        let model = AwaQueueRotation::new(variant);
        let file = variant.cfg_file();
        let cfg = storage_file(file);
        let has = |needle: &str| cfg.lines().any(|line| line.trim() == needle);
        assert!(
            has(&format!("Variant = \"{}\"", variant.name())),
            "{file}: Variant"
        );
        assert!(has("Jobs = {1, 2}") && model.jobs == 2, "{file}: Jobs");
        for (constant, value) in [
            ("QueueSlots", model.queue_slots),
            ("LeaseSlots", model.lease_slots),
            ("MaxAttempts", model.max_attempts),
            ("MaxSeq", model.max_seq),
        ] {
            assert!(has(&format!("{constant} = {value}")), "{file}: {constant}");
        }
        assert!(has("Open = Open"), "{file}: Open must be a model value");
        assert_cfg_states(
            file,
            &cfg,
            &INVARIANTS,
            &match variant.expected_violation() {
                None => Expect::Positive {
                    distinct: POSITIVE_DISTINCT_STATES,
                },
                Some(invariant) => Expect::Negative {
                    invariant,
                    steps: shortest_counterexample_len(variant),
                },
            },
        );
        for name in POSITIVE_INVARIANTS {
            assert_eq!(
                has(name),
                variant == Variant::Correct,
                "{file}: {name} belongs to the positive configuration only"
            );
        }
    }
}
