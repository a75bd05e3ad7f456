#!/usr/bin/env bash
# Run the whole test suite: Rust unit and integration tests, then pytest against the built wheel.
source "$(dirname "$0")/lib.sh"
ensure_venv
ensure_database
log "database: $DATABASE_URL"
log "cargo test"
(cd "$ROOT" && cargo test --workspace --all-targets)
build_wheel "--features test-seams"  # the seam tests (tests/test_staged_follow_ups.py) need it
log "pytest"
(cd "$ROOT" && "$PY" -m pytest -q "$@")
