#!/usr/bin/env bash
# The benchmark, one command, from the repository root:
#
#   bash bench/run.sh            # full run: the issue's sizes, 5 interleaved rounds (~30 min
#                                # on 2 cores, plus ~10 min of release builds the first time)
#   bash bench/run.sh --quick    # smoke run: small sizes, 1 round (~3-4 min warm)
#   bash bench/run.sh --soak     # the soak (bench/soak.py): 30 min per system of steady load,
#                                # dead tuples, size and backlog; --duration-s N for a short one
#   bash bench/run.sh --engines  # the storage engines side by side (bench/engines.py): the Rust
#                                # drain, WAL, dead tuples and idle pickup on each (~3 min warm)
#   bash bench/run.sh --claim-cost  # one idle claim's cost on each engine, next to a one-statement
#                                # claim on queue storage's tables (bench/claim_cost.py; pgbench)
#
# Outputs, written together by one run (the report is generated whole from the JSON):
#   full:    docs/benchmarks.json (every run), docs/benchmarks.md (the report), docs/benchmarks.png
#            -- commit the three together; the report names the commit measured (git rev-parse
#            HEAD) and says "plus uncommitted changes" when the tree was dirty, so run it on a
#            clean checkout.
#   --quick: bench/results/quick.{json,md,png} (git-ignored), marked QUICK RUN: a smoke run
#            never touches the committed evidence.
#   logs:    bench/results/{full,quick}.log (every adapter's output; git-ignored).
# Re-render without measuring: python3 bench/orchestrate.py --render docs/benchmarks.json
# Check the committed report matches its JSON: python3 bench/orchestrate.py --check
#
# It prepares everything it needs, then runs bench/orchestrate.py:
#   1. a virtualenv per system under bench/.venvs/ (git-ignored), installed from PyPI:
#      awa-pg 0.6.9, pgqueuer (+ asyncpg, uvloop), procrastinate (+ psycopg 3 with its pool),
#      and one with matplotlib for the chart;
#   2. our wheel, built in release mode from this checkout, in bench/.venvs/awa;
#   3. the Rust bench binary (bench/rust, its own workspace), release mode, in
#      AWA_BENCH_TARGET_DIR (default ~/.cache/awa-target-bench).
# Database: DATABASE_URL if set, else 127.0.0.1:5432 (user postgres), else a private throwaway
# cluster (see scripts/lib.sh). Every run gets a fresh database, dropped afterwards.
#
# Other options are passed to bench/orchestrate.py (see --help there), e.g.
#   --rounds 5  --systems awa,pgqueuer  --workloads drain,latency  --drain-jobs 5000
#   --floor-sweep 64x2p,256x4p
# and --no-build skips steps 2-3 (reuse the last wheel and binary).
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../scripts/lib.sh"
BENCH="$ROOT/bench"
VENVS="$BENCH/.venvs"
BENCH_TARGET="${AWA_BENCH_TARGET_DIR:-$HOME/.cache/awa-target-bench}"

# Peer versions (pinned so a re-run measures the same code; override from the environment).
UVLOOP_REQ="${UVLOOP_REQ:-uvloop==0.23.0}"  # every Python system runs on uvloop
AWA_PG_REQ="${AWA_PG_REQ:-awa-pg==0.6.9 $UVLOOP_REQ}"
PGQUEUER_REQ="${PGQUEUER_REQ:-pgqueuer==1.6.0 asyncpg==0.32.0 $UVLOOP_REQ}"
PROCRASTINATE_REQ="${PROCRASTINATE_REQ:-procrastinate==3.10.0 psycopg[binary,pool]==3.3.9 $UVLOOP_REQ}"
PLOT_REQ="${PLOT_REQ:-matplotlib==3.11.2}"

BUILD=1
SOAK=0
ENGINES=0
CLAIM_COST=0
PASS=()
for a in "$@"; do
    case "$a" in
        --no-build) BUILD=0 ;;
        --soak) SOAK=1 ;;
        --engines) ENGINES=1 ;;
        --claim-cost) CLAIM_COST=1 ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) PASS+=("$a") ;;
    esac
done
REPRO="bash bench/run.sh${PASS[*]:+ ${PASS[*]}}"

command -v psql >/dev/null 2>&1 || {
    echo "bench/run.sh needs psql (Debian/Ubuntu: apt-get install postgresql-client)" >&2; exit 1; }

# A virtualenv with the given requirements; reinstalled only when the requirements change.
ensure_system_venv() { # $1 = name, $2 = requirements (space separated)
    local dir="$VENVS/$1" stamp="$VENVS/$1/.bench-requirements"
    if [ -x "$dir/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$2" ]; then
        return
    fi
    log "virtualenv $1: $2"
    python3 -m venv "$dir"
    # shellcheck disable=SC2086  # the requirements are a word list
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check $2
    printf '%s' "$2" > "$stamp"
}

ensure_venv
ensure_database
log "database: $DATABASE_URL"
mkdir -p "$VENVS"
if [ "$ENGINES" = 1 ] || [ "$CLAIM_COST" = 1 ]; then
    # Rust only: the bench binary and the chart's virtualenv.
    ensure_system_venv plot "$PLOT_REQ"
    if [ "$BUILD" = 1 ]; then
        log "building the Rust bench binary (release, $BENCH_TARGET; a few minutes on a cold cache)"
        CARGO_TARGET_DIR="$BENCH_TARGET" cargo build --quiet --release --manifest-path "$BENCH/rust/Cargo.toml"
    fi
    if [ "$CLAIM_COST" = 1 ]; then
        command -v pgbench >/dev/null 2>&1 || {
            echo "--claim-cost needs pgbench (Debian/Ubuntu: apt-get install postgresql-client)" >&2; exit 1; }
        log "measuring one idle claim per engine"
        exec "$PY" "$BENCH/claim_cost.py" --rust-bin "$BENCH_TARGET/release/awa-bench" \
            --command "bash bench/run.sh --claim-cost${PASS[*]:+ ${PASS[*]}}" ${PASS[@]+"${PASS[@]}"}
    fi
    log "running the engines comparison"
    exec "$PY" "$BENCH/engines.py" --rust-bin "$BENCH_TARGET/release/awa-bench" \
        --command "bash bench/run.sh --engines${PASS[*]:+ ${PASS[*]}}" ${PASS[@]+"${PASS[@]}"}
fi
ensure_system_venv awa_pg "$AWA_PG_REQ"
ensure_system_venv pgqueuer "$PGQUEUER_REQ"
ensure_system_venv procrastinate "$PROCRASTINATE_REQ"
ensure_system_venv plot "$PLOT_REQ"
ensure_system_venv awa "$UVLOOP_REQ"  # our wheel is added below

if [ "$BUILD" = 1 ]; then
    log "building our wheel (release; a few minutes on a cold cache, seconds when warm)"
    rm -rf "$BENCH/.wheel"
    (cd "$ROOT" && "$VENV/bin/maturin" build --quiet --release --out bench/.wheel >&2)
    "$VENVS/awa/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
        "$(ls "$BENCH"/.wheel/awa_queue-*.whl | head -n1)"
    log "building the Rust bench binary (release, $BENCH_TARGET; a few minutes on a cold cache)"
    CARGO_TARGET_DIR="$BENCH_TARGET" cargo build --quiet --release --manifest-path "$BENCH/rust/Cargo.toml"
fi

if [ "$SOAK" = 1 ]; then
    log "running the soak"
    exec "$PY" "$BENCH/soak.py" --rust-bin "$BENCH_TARGET/release/awa-bench" --command "bash bench/run.sh --soak${PASS[*]:+ ${PASS[*]}}" ${PASS[@]+"${PASS[@]}"}
fi

log "running the benchmark"
"$PY" "$BENCH/orchestrate.py" --rust-bin "$BENCH_TARGET/release/awa-bench" \
    --command "$REPRO" ${PASS[@]+"${PASS[@]}"}
