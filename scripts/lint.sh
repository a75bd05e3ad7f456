#!/usr/bin/env bash
# The CI gates that are not tests; .ci/run runs them before the test suite, and so can anyone:
#   bash scripts/lint.sh
# Each gate runs (they are quick next to the tests), each failure prints one line saying which
# gate failed and the command that reproduces it, and the script exits non-zero if any failed.
#   rustfmt   cargo fmt --all --check
#   clippy    cargo clippy --workspace --all-targets -- -D warnings
#   ruff      ruff check python tests bench correctness (rules: pyproject.toml [tool.ruff])
#   mypy      mypy --strict python/awa                (pyproject.toml [tool.mypy])
#   stubtest  python -m mypy.stubtest awa._awa        (the .pyi stubs against the built wheel)
#   evidence  python bench/orchestrate.py --check     (docs/benchmarks.md is what its JSON renders to)
# Doctests run with the tests (scripts/test.sh: cargo test --workspace --doc).
source "$(dirname "$0")/lib.sh"
ensure_venv

failed=()
gate() { # $1 = name, rest = command
    local name="$1"
    shift
    log "gate $name: $*"
    local start=$SECONDS
    if (cd "$ROOT" && "$@"); then
        log "gate $name: ok ($((SECONDS - start)) s)"
    else
        log "GATE FAILED: $name (reproduce: $*)"
        failed+=("$name")
    fi
}

for tool in rustfmt clippy; do
    if ! cargo "${tool/rustfmt/fmt}" --version >/dev/null 2>&1; then
        log "GATE FAILED: $tool is not installed (rustup component add $tool)"
        exit 1
    fi
done

gate rustfmt cargo fmt --all --check
gate ruff "$VENV/bin/ruff" check python tests bench correctness
gate mypy "$PY" -m mypy --strict python/awa
gate evidence "$PY" bench/orchestrate.py --check
gate clippy cargo clippy --workspace --all-targets -- -D warnings
# stubtest imports the native module, so it needs the wheel built and installed.
if build_wheel; then
    gate stubtest "$PY" -m mypy.stubtest awa._awa
else
    log "GATE FAILED: stubtest (the wheel did not build)"
    failed+=("stubtest")
fi

if [ "${#failed[@]}" -gt 0 ]; then
    log "FAILED GATES: $(IFS=,; echo "${failed[*]}")"
    exit 1
fi
log "all gates passed"
