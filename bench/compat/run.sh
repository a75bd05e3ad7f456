#!/usr/bin/env bash
# The compatibility probe, end to end: set up two virtualenvs (awa-pg 0.6.9 from PyPI; our
# wheel), run probe.py under each against fresh databases, probe each package on a schema the
# other one created, and write report.md with diff.py. Python only; light on CPU.
#
#   bench/compat/run.sh                      # reuse the venvs, keep what our venv has installed
#   AWA_WHEEL=path/to/awa_queue-*.whl bench/compat/run.sh   # (re)install our wheel first
#   DATABASE_URL=postgres://... bench/compat/run.sh         # another server (default: local 5432)
#
# Outputs (committed): awa-pg.json, awa.json, foreign-*.json, report.md, all in bench/compat/.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENVS="$ROOT/bench/.venvs"          # git-ignored
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_VENV="$VENVS/awa-pg-probe"
OUR_VENV="$VENVS/awa-probe"
PG="$PG_VENV/bin/python"
OURS="$OUR_VENV/bin/python"
# The probes import these: pytest-asyncio because awa-pg's awa.testing imports it at module
# level; pydantic for an args-type probe; psycopg and asyncpg for awa.bridge and database setup.
DEPS=(pytest pytest-asyncio pydantic "psycopg[binary]" asyncpg)

if [ ! -x "$PG" ]; then
    python3 -m venv "$PG_VENV"
    "$PG" -m pip install -q awa-pg==0.6.9 "${DEPS[@]}"
fi
if [ ! -x "$OURS" ]; then
    python3 -m venv "$OUR_VENV"
    "$OURS" -m pip install -q "${DEPS[@]}"
fi
if [ -n "${AWA_WHEEL:-}" ]; then
    "$OURS" -m pip install -q --force-reinstall --no-deps "$AWA_WHEEL"
fi
"$OURS" -c 'import importlib.metadata as m; m.version("awa-queue")' 2>/dev/null || {
    echo "our venv has no awa-queue: set AWA_WHEEL=path/to/the/wheel" >&2; exit 1; }

db_url() { echo "${BASE_URL%/*}/$1"; }
admin() { "$OURS" -c 'import psycopg, sys
with psycopg.connect(sys.argv[1], autocommit=True) as c: c.execute(sys.argv[2])' "$BASE_URL" "$1"; }

echo "== awa-pg 0.6.9" >&2
nice "$PG" "$HERE/probe.py" --database-url "$BASE_URL" --out "$HERE/awa-pg.json"
echo "== ours" >&2
nice "$OURS" "$HERE/probe.py" --database-url "$BASE_URL" --out "$HERE/awa.json" --reference "$HERE/awa-pg.json"

# Foreign schemas (issue 13 item 8): each package on a database the other one migrated.
F1="awa_compat_foreign_pg_$$"
F2="awa_compat_foreign_ours_$$"
cleanup() { admin "DROP DATABASE IF EXISTS \"$F1\" WITH (FORCE)" || true
            admin "DROP DATABASE IF EXISTS \"$F2\" WITH (FORCE)" || true; }
trap cleanup EXIT
admin "CREATE DATABASE \"$F1\""
admin "CREATE DATABASE \"$F2\""
echo "== ours on an awa-pg schema" >&2
nice "$PG" -m awa --database-url "$(db_url "$F1")" migrate >/dev/null
nice "$OURS" "$HERE/probe.py" --foreign-schema-url "$(db_url "$F1")" --out "$HERE/foreign-ours-on-awa-pg.json"
echo "== awa-pg on our schema" >&2
nice "$OURS" "$HERE/probe.py" --foreign-schema-url "$(db_url "$F2")" --out "$(mktemp)"   # migrates ours
nice "$PG" "$HERE/probe.py" --foreign-schema-url "$(db_url "$F2")" --out "$HERE/foreign-awa-pg-on-ours.json"

python3 "$HERE/diff.py" "$HERE/awa-pg.json" "$HERE/awa.json" \
    --foreign "$HERE/foreign-ours-on-awa-pg.json" "$HERE/foreign-awa-pg-on-ours.json" \
    --markdown "$HERE/report.md"
echo "wrote $HERE/report.md" >&2
