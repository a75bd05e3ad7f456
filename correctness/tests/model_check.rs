//! CI model check of `correctness/storage/AwaStagedFollowUps.tla`, through its
//! executable twin `awa_correctness::staged_follow_ups`.
//!
//! - The correct protocol is searched exhaustively: no invariant is violated,
//!   every witness is reached, and the number of distinct states is pinned (it
//!   is also the number TLC reports for `AwaStagedFollowUps.cfg`).
//! - Each seeded bug is searched exhaustively: exactly its named invariant is
//!   violated. Its shortest counterexample (what TLC's breadth-first search
//!   reports) is found by iterative deepening and printed.
//! - The `.tla` and `.cfg` files still name the twin's actions, invariants,
//!   witnesses, variants and constants.
//!
//! Run with `cargo test -p awa-correctness -- --nocapture` to see the counts and
//! counterexamples.

use std::collections::BTreeSet;

use awa_correctness::harness::{
    assert_cfg_states, assert_shortest_counterexample, assert_tla_names, check_exhaustively,
    render, storage_file, Expect,
};
use awa_correctness::staged_follow_ups::{State, ACTIONS, DEADLOCK_FREE, INVARIANTS, WITNESSES};
use awa_correctness::{AwaStagedFollowUps, Variant};

/// Distinct states of the correct protocol with the `.cfg` constants. TLC's
/// "distinct states found" for `AwaStagedFollowUps.cfg` must be the same
/// number; if a change to the model moves it, update it here and in the README.
const POSITIVE_DISTINCT_STATES: usize = 635_041;

/// The same with `MaxFinalizeTries = 3`, the engine's limit (ignored test).
const POSITIVE_DISTINCT_STATES_THREE_TRIES: usize = 1_944_145;

/// Distinct states of the correct protocol on the per-job path
/// (`AwaStagedFollowUps_PerJob.cfg`, `BatchFollowUps = FALSE`): the model as it
/// was before the batched path with follow-ups, whose count it keeps.
const PER_JOB_DISTINCT_STATES: usize = 132_721;

/// The same with `MaxFinalizeTries = 3` (ignored test).
const PER_JOB_DISTINCT_STATES_THREE_TRIES: usize = 313_585;

/// Length (number of actions) of each seeded bug's shortest counterexample.
fn shortest_counterexample_len(variant: Variant) -> usize {
    match variant {
        Variant::Correct => unreachable!(),
        Variant::InsertBeforeCompletion => 2,
        Variant::InsertAfterCompletion => 4,
        Variant::CompleteWithoutLeaseGuard => 5,
        Variant::DrainOnFirstAttempt => 5,
        Variant::BatchedPath => 4,
        Variant::BatchInsertsUnmatched => 5,
    }
}

fn holds(name: &str, s: &State) -> bool {
    match name {
        "FollowUpTracesToCommit" => s.follow_up_traces_to_commit(),
        "AtMostOneRowPerKey" => s.at_most_one_row_per_key(),
        "CompletionHasFollowUp" => s.completion_has_follow_up(),
        "OnlyCurrentLeaseCompletes" => s.only_current_lease_completes(),
        other => panic!("unknown invariant {other}"),
    }
}

fn check_positive(model: AwaStagedFollowUps, expected_distinct: usize) {
    let outcome = check_exhaustively(model);
    println!(
        "Correct (MaxFinalizeTries = {}, BatchFollowUps = {}): {} distinct states ({} generated, depth {}) in {:.2}s",
        model.max_finalize_tries,
        model.batch_follow_ups,
        outcome.distinct,
        outcome.generated,
        outcome.max_depth,
        outcome.seconds
    );
    outcome.assert_correct(
        "AwaStagedFollowUps",
        INVARIANTS.into_iter().chain([DEADLOCK_FREE]),
        // Without BatchFollowUps no batch inserts, so there is no batched replay.
        WITNESSES
            .into_iter()
            .filter(|w| model.batch_follow_ups || *w != "WitnessBatchedReplay"),
        expected_distinct,
    );
}

#[test]
fn correct_protocol_satisfies_every_invariant_exhaustively() {
    check_positive(
        AwaStagedFollowUps::new(Variant::Correct),
        POSITIVE_DISTINCT_STATES,
    );
}

#[test]
fn correct_protocol_on_the_per_job_path_satisfies_every_invariant_exhaustively() {
    check_positive(AwaStagedFollowUps::per_job(), PER_JOB_DISTINCT_STATES);
}

/// The engine's retry limit. About three times the states and time of the CI
/// configuration; run with `cargo test -p awa-correctness -- --ignored`.
#[test]
#[ignore = "slow: the CI configuration uses MaxFinalizeTries = 2"]
fn correct_protocol_with_three_finalize_tries() {
    check_positive(
        AwaStagedFollowUps {
            max_finalize_tries: 3,
            ..AwaStagedFollowUps::new(Variant::Correct)
        },
        POSITIVE_DISTINCT_STATES_THREE_TRIES,
    );
}

#[test]
#[ignore = "slow: the CI configuration uses MaxFinalizeTries = 2"]
fn correct_protocol_on_the_per_job_path_with_three_finalize_tries() {
    check_positive(
        AwaStagedFollowUps {
            max_finalize_tries: 3,
            ..AwaStagedFollowUps::per_job()
        },
        PER_JOB_DISTINCT_STATES_THREE_TRIES,
    );
}

fn check_negative(variant: Variant) {
    let expected = variant.expected_violation().expect("a seeded bug");
    let outcome = check_exhaustively(AwaStagedFollowUps::new(variant));
    let violated = outcome.violated(&INVARIANTS);
    println!(
        "{}: {} distinct states ({} generated) in {:.2}s; violates {:?}",
        variant.name(),
        outcome.distinct,
        outcome.generated,
        outcome.seconds,
        violated
    );
    assert_eq!(
        violated,
        BTreeSet::from([expected]),
        "{} must violate exactly {expected}",
        variant.name()
    );
    let any = &outcome.discoveries[expected];
    assert!(
        outcome.done,
        "{}: the search did not finish",
        variant.name()
    );
    if let Some(path) = outcome.discoveries.get(DEADLOCK_FREE) {
        panic!("{} deadlocks:\n{}", variant.name(), render(path));
    }
    assert!(!holds(expected, any.last_state()));

    assert_shortest_counterexample(
        variant.name(),
        || AwaStagedFollowUps::new(variant),
        expected,
        |s| holds(expected, s),
        shortest_counterexample_len(variant),
    );
}

#[test]
fn insert_before_completion_violates_follow_up_traces_to_commit() {
    check_negative(Variant::InsertBeforeCompletion);
}

#[test]
fn insert_after_completion_violates_completion_has_follow_up() {
    check_negative(Variant::InsertAfterCompletion);
}

#[test]
fn complete_without_lease_guard_violates_only_current_lease_completes() {
    check_negative(Variant::CompleteWithoutLeaseGuard);
}

#[test]
fn drain_on_first_attempt_violates_completion_has_follow_up() {
    check_negative(Variant::DrainOnFirstAttempt);
}

#[test]
fn batched_path_violates_completion_has_follow_up() {
    check_negative(Variant::BatchedPath);
}

#[test]
fn batch_inserts_unmatched_violates_follow_up_traces_to_commit() {
    check_negative(Variant::BatchInsertsUnmatched);
}

// ---------------------------------------------------------------------------
// The TLA+ files stay in step with the twin.

#[test]
fn tla_module_defines_every_twin_name() {
    assert_tla_names(
        "AwaStagedFollowUps",
        ACTIONS.into_iter().chain(INVARIANTS).chain(WITNESSES),
        Variant::ALL.iter().map(|v| v.name()),
    );
}

#[test]
fn cfg_files_match_the_twin() {
    let configs = Variant::ALL
        .into_iter()
        .map(|v| (v.cfg_file(), AwaStagedFollowUps::new(v)))
        .chain([(
            "AwaStagedFollowUps_PerJob.cfg",
            AwaStagedFollowUps::per_job(),
        )]);
    for (file, model) in configs {
        let variant = model.variant;
        let cfg = storage_file(file);
        let has = |needle: &str| cfg.lines().any(|line| line.trim() == needle);
        let batch = if model.batch_follow_ups {
            "TRUE"
        } else {
            "FALSE"
        };
        assert!(
            has(&format!("BatchFollowUps = {batch}")),
            "{file}: BatchFollowUps"
        );
        assert!(
            has(&format!("Variant = \"{}\"", variant.name())),
            "{file}: Variant"
        );
        assert!(has("Jobs = {1, 2}") && model.jobs == 2, "{file}: Jobs");
        assert!(
            has("Keys = {\"k1\", \"k2\"}") && model.keys == 2,
            "{file}: Keys"
        );
        assert!(
            has(&format!("MaxAttempts = {}", model.max_attempts)),
            "{file}: MaxAttempts"
        );
        assert!(
            has(&format!("MaxFinalizeTries = {}", model.max_finalize_tries)),
            "{file}: MaxFinalizeTries"
        );
        assert_cfg_states(
            file,
            &cfg,
            &INVARIANTS,
            &match variant.expected_violation() {
                None if model.batch_follow_ups => Expect::Positive {
                    distinct: POSITIVE_DISTINCT_STATES,
                },
                None => Expect::Positive {
                    distinct: PER_JOB_DISTINCT_STATES,
                },
                Some(invariant) => Expect::Negative {
                    invariant,
                    steps: shortest_counterexample_len(variant),
                },
            },
        );
    }
}
