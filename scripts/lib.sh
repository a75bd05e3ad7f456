# Shared set-up for scripts/demo.sh and scripts/test.sh (sourced, not run).
# - ensure_venv: a project-local virtualenv with maturin, the test dependencies and the
#   pinned lint tools (ruff, mypy).
# - ensure_database: exports DATABASE_URL: the caller's, else 127.0.0.1:5432, else a private
#   throwaway cluster in .pgdata/ (stopped on exit), else says what to install.
# - build_wheel: builds the abi3 wheel into dist/ (maturin, showing cargo's progress) and
#   installs it into the virtualenv. Cargo's cache: CARGO_TARGET_DIR, default ~/.cache/awa-target.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/awa-target}"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
RUFF_VERSION="0.17.5"
MYPY_VERSION="2.4.1"

log() { printf '==> %s\n' "$*" >&2; }

ensure_venv() {
    if [ ! -x "$PY" ]; then
        log "creating virtualenv $VENV"
        python3 -m venv "$VENV"
    fi
    # asyncpg, psycopg, SQLAlchemy and Django: the drivers awa.bridge writes through, each
    # tested against the real thing (tests/test_driver_bridge.py); prometheus_client parses
    # /metrics in tests/test_serve.py; selenium drives Chromium in tests/test_ui.py; grpcio and
    # opentelemetry-proto make the OTLP/gRPC collector of tests/test_telemetry.py. All
    # test-only dependencies.
    if ! "$PY" -c 'import maturin, pytest, pytest_asyncio, pydantic, uvloop, asyncpg, psycopg, sqlalchemy, greenlet, django, prometheus_client, selenium, grpc, opentelemetry.proto' 2>/dev/null; then
        log "installing build and test tools"
        "$PY" -m pip install --quiet --upgrade pip
        "$PY" -m pip install --quiet "maturin>=1.5,<2" "pytest>=8" "pytest-asyncio>=0.23" "pydantic>=2" "uvloop>=0.19" \
            "asyncpg>=0.29" "psycopg[binary]>=3.1" "sqlalchemy[asyncio]>=2.0" "django>=4.2" \
            "prometheus-client>=0.20" "selenium>=4.20" "grpcio>=1.60" "opentelemetry-proto>=1.20"
    fi
    # The lint gates' tools (scripts/lint.sh), pinned so a new release cannot turn CI red.
    if ! "$VENV/bin/ruff" --version 2>/dev/null | grep -qx "ruff $RUFF_VERSION" \
        || ! "$PY" -m mypy --version 2>/dev/null | grep -q "^mypy $MYPY_VERSION "; then
        log "installing ruff $RUFF_VERSION and mypy $MYPY_VERSION"
        "$PY" -m pip install --quiet "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION"
    fi
}

pg_answers() { # $1 = url
    if command -v psql >/dev/null 2>&1; then
        psql "$1" -Atqc 'select 1' >/dev/null 2>&1
    else
        "$PY" - "$1" <<'PYEOF' 2>/dev/null
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
socket.create_connection((u.hostname or "127.0.0.1", u.port or 5432), timeout=2).close()
PYEOF
    fi
}

find_pg_bin() {
    if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin; do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return; fi
    done
}

PRIVATE_PGDATA=""
stop_private_cluster() {
    if [ -n "$PRIVATE_PGDATA" ] && [ -d "$PRIVATE_PGDATA" ]; then
        log "stopping private PostgreSQL cluster"
        as_pg "$PG_BIN/pg_ctl" -D "$PRIVATE_PGDATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
}

as_pg() { # initdb refuses to run as root: run the private cluster as the postgres user
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

ensure_database() {
    if [ -n "${DATABASE_URL:-}" ]; then
        pg_answers "$DATABASE_URL" || { echo "DATABASE_URL=$DATABASE_URL does not answer" >&2; exit 1; }
        return
    fi
    # AWA_LOCAL_PG_URL only exists so the fallback below can be exercised on a machine that
    # does run a server on 5432.
    local local_url="${AWA_LOCAL_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
    if pg_answers "$local_url"; then
        export DATABASE_URL="$local_url"
        return
    fi
    PG_BIN="$(find_pg_bin || true)"
    if [ -z "$PG_BIN" ]; then
        cat >&2 <<'MSG'
No PostgreSQL answers on 127.0.0.1:5432 and DATABASE_URL is not set.
Either set DATABASE_URL=postgres://user@host:port/db, start a local server, or install
PostgreSQL's server programs (Debian/Ubuntu: apt-get install postgresql) so a private
throwaway cluster can be started.
MSG
        exit 1
    fi
    local port
    port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    PRIVATE_PGDATA="$ROOT/.pgdata/cluster-$$"
    mkdir -p "$PRIVATE_PGDATA"
    if [ "$(id -u)" = 0 ]; then chown -R postgres "$ROOT/.pgdata"; fi
    log "starting a private PostgreSQL cluster on 127.0.0.1:$port ($PRIVATE_PGDATA)"
    as_pg "$PG_BIN/initdb" -D "$PRIVATE_PGDATA" -U postgres -A trust >/dev/null
    trap 'stop_private_cluster; rm -rf "$PRIVATE_PGDATA"' EXIT
    as_pg "$PG_BIN/pg_ctl" -D "$PRIVATE_PGDATA" -w -l "$PRIVATE_PGDATA/log" \
        -o "-p $port -c listen_addresses=127.0.0.1 -k $PRIVATE_PGDATA" start >/dev/null
    export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

build_wheel() { # $1 = extra maturin flags (e.g. --release)
    # maturin's and cargo's own progress stays visible (one "Compiling ..." line per crate), so
    # a cold build shows what it is doing instead of sitting silent.
    local mode="debug"
    case " ${1:-} " in *" --release "*) mode="release" ;; esac
    log "building the wheel with maturin ($mode; cargo cache: $CARGO_TARGET_DIR)"
    log "  a cold cache compiles ~130 crates: a few minutes on 2 cores; a warm one takes seconds"
    rm -rf "$ROOT/dist"
    (cd "$ROOT" && "$VENV/bin/maturin" build ${1:-} --out dist >&2)
    local wheel
    wheel="$(ls "$ROOT"/dist/awa_queue-*.whl | head -n1)"
    log "installing $(basename "$wheel") into $VENV"
    "$PY" -m pip install --quiet --force-reinstall --no-deps "$wheel"
    export AWA_WHEEL="$wheel"
}
