#!/usr/bin/env bash
# Run the demo: migrate, start a worker and run the two-stage pipeline (see examples/demo.py).
source "$(dirname "$0")/lib.sh"
ensure_venv
ensure_database
build_wheel --release
(cd "$ROOT" && "$PY" examples/demo.py "$@")
