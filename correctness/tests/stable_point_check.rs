//! CI model check of `correctness/storage/AwaStablePoint.tla`, through its
//! executable twin `awa_correctness::stable_point`.
//!
//! - The correct protocol is searched exhaustively: no invariant is violated
//!   (also `StableSettled`, which only the positive configuration checks), no
//!   state deadlocks, every witness is reached, and the number of distinct
//!   states is pinned (it is also the number TLC reports for
//!   `AwaStablePoint.cfg`).
//! - Each seeded bug violates `CursorNeverPassesWork`, and its shortest
//!   counterexample (what TLC's breadth-first search reports) has the pinned
//!   length.
//! - The `.tla` and `.cfg` files still name the twin's actions, invariants,
//!   witnesses, variants and constants.
//!
//! Run with `cargo test -p awa-correctness --test stable_point_check --
//! --nocapture` to see the counts and counterexamples.

use awa_correctness::harness::{
    assert_cfg_states, assert_shortest_counterexample, assert_tla_names, check_exhaustively,
    render, storage_file, Expect,
};
use awa_correctness::stable_point::{
    Variant, ACTIONS, CURSOR_NEVER_PASSES_WORK, DEADLOCK_FREE, INVARIANTS, POSITIVE_INVARIANTS,
    WITNESSES,
};
use awa_correctness::AwaStablePoint;

/// Distinct states of the correct protocol with the `.cfg` constants. TLC's
/// "distinct states found" for `AwaStablePoint.cfg` must be the same number;
/// if a change to the model moves it, update it here, in the `.cfg` and in the
/// README.
const POSITIVE_DISTINCT_STATES: usize = 40_558;

/// Length (number of actions) of each seeded bug's shortest counterexample.
fn shortest_counterexample_len(variant: Variant) -> usize {
    match variant {
        Variant::Correct => unreachable!(),
        Variant::HorizonFromSnapshotXmax | Variant::SeqReadAfterXid => 7,
    }
}

#[test]
fn correct_protocol_satisfies_every_invariant_exhaustively() {
    let model = AwaStablePoint::new(Variant::Correct);
    let outcome = check_exhaustively(model);
    println!(
        "Correct: {} distinct states ({} generated, depth {}) in {:.2}s",
        outcome.distinct, outcome.generated, outcome.max_depth, outcome.seconds
    );
    outcome.assert_correct(
        "AwaStablePoint",
        INVARIANTS
            .into_iter()
            .chain(POSITIVE_INVARIANTS)
            .chain([DEADLOCK_FREE]),
        WITNESSES,
        POSITIVE_DISTINCT_STATES,
    );
}

fn check_negative(variant: Variant) {
    let model = AwaStablePoint::new(variant);
    let outcome = check_exhaustively(model);
    println!(
        "{}: {} distinct states ({} generated) in {:.2}s",
        variant.name(),
        outcome.distinct,
        outcome.generated,
        outcome.seconds
    );
    assert_eq!(variant.expected_violation(), Some(CURSOR_NEVER_PASSES_WORK));
    let found = outcome
        .discoveries
        .get(CURSOR_NEVER_PASSES_WORK)
        .unwrap_or_else(|| panic!("{} violates nothing", variant.name()));
    assert!(!model.cursor_never_passes_work(found.last_state()));
    if let Some(path) = outcome.discoveries.get(DEADLOCK_FREE) {
        panic!("{} deadlocks:\n{}", variant.name(), render(path));
    }
    assert_shortest_counterexample(
        variant.name(),
        || AwaStablePoint::new(variant),
        CURSOR_NEVER_PASSES_WORK,
        |s| model.cursor_never_passes_work(s),
        shortest_counterexample_len(variant),
    );
}

#[test]
fn a_horizon_from_the_snapshots_xmax_lets_the_cursor_pass_a_running_producer() {
    check_negative(Variant::HorizonFromSnapshotXmax);
}

#[test]
fn reading_the_seq_after_holding_an_xid_lets_the_cursor_pass_a_running_producer() {
    check_negative(Variant::SeqReadAfterXid);
}

#[test]
fn tla_module_defines_every_twin_name() {
    assert_tla_names(
        "AwaStablePoint",
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
        let model = AwaStablePoint::new(variant);
        let file = variant.cfg_file();
        let cfg = storage_file(file);
        let has = |needle: &str| cfg.lines().any(|line| line.trim() == needle);
        assert!(
            has(&format!("Variant = \"{}\"", variant.name())),
            "{file}: Variant"
        );
        assert!(
            has("Producers = {1, 2}") && model.producers == 2,
            "{file}: Producers"
        );
        assert!(
            has(&format!("MaxXid = {}", model.max_xid)),
            "{file}: MaxXid"
        );
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
