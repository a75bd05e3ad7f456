"""Tests of the soak's bookkeeping (bench/soak.py; no database): the targets are judged from
the samples, a short run never lands in docs/, and a committed soak report is what its JSON
renders to.

Run with ``python -m pytest bench/test_soak.py``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import soak

COMMITTED = os.path.join(soak.orchestrate.DOCS, "soak.json")


def sample(t: float, dead: int, size_mib: float, backlog: int, wal: int = 0) -> dict:
    return {"t": t, "inserted": 0, "handled": 0, "backlog": backlog, "dead_tuples": dead, "live_tuples": 0,
            "vacuums": 0, "db_bytes": int(size_mib * 1024 * 1024), "wal_bytes": wal}


def result(samples: list[dict], handled: int = 100_000, rate: float = 1000.0, seconds: float = 90.0) -> dict:
    return {"rate": rate, "duration_s": seconds, "seconds": seconds, "inserted": handled, "handled": handled,
            "offered_per_s": handled / seconds, "handled_per_s": handled / seconds, "retention_s": 10.0,
            "samples": samples, "settings": "start(...)"}


def test_a_flat_clean_run_meets_every_target() -> None:
    r = result([sample(0, 0, 30, 0, 0), sample(30, 400, 40, 10, 10**8), sample(60, 300, 41, 20, 2 * 10**8),
                sample(90, 500, 42, 30, 3 * 10**8)])
    j = soak.judge(r)
    assert j["verdicts"] == {"dead": True, "growth": True, "backlog": True}
    assert j["db_bytes_third"] == 40 * 1024 * 1024  # measured from the first sample at a third
    assert abs(j["growth"] - 0.05) < 1e-9
    assert j["wal_bytes_per_job"] == 3000


def test_dead_tuples_growth_and_backlog_are_each_missed_on_their_own() -> None:
    dead = soak.judge(result([sample(0, 0, 30, 0), sample(30, 0, 40, 0), sample(90, 1001, 40, 0)]))
    assert dead["verdicts"] == {"dead": False, "growth": True, "backlog": True}
    grown = soak.judge(result([sample(0, 0, 30, 0), sample(30, 0, 40, 0), sample(90, 0, 44.1, 0)]))
    assert grown["verdicts"] == {"dead": True, "growth": False, "backlog": True}
    behind = soak.judge(result([sample(0, 0, 30, 0), sample(30, 0, 40, 0), sample(90, 0, 40, 2001)]))
    assert behind["verdicts"] == {"dead": True, "growth": True, "backlog": False}


def test_the_report_says_missed_and_marks_a_short_run() -> None:
    r = result([sample(0, 0, 30, 0), sample(30, 0, 40, 0), sample(90, 5000, 80, 0)])
    data = {"command": "bash bench/run.sh --soak --duration-s 90", "started": "now",
            "meta": {"git": {"commit": "abc", "dirty": False}, "machine": "m", "postgres": {"version": "15"}},
            "params": {"rate": 1000.0, "duration_s": 90.0, "sample_s": 30.0, "retention_s": 10.0, "workers": 32,
                       "poll_ms": 50},
            "runs": [{"system": "awa", "label": "awa (ours)", "ok": True, "result": r, "judged": soak.judge(r)},
                     {"system": "awa-pg", "ok": False, "error": "exit 1: boom"}]}
    text = soak.document(data, "soak.png")
    assert "SHORT RUN" in text.splitlines()[0]
    assert "autovacuum not recorded" in text
    data["autovacuum"] = "off"
    text = soak.document(data, "soak.png")
    assert "**autovacuum off**" in text
    assert "5.00% MISSED" in text and "+100.0% MISSED" in text and "failed: exit 1: boom" in text
    assert soak.out_dir(data) == soak.RESULTS
    data["params"]["duration_s"] = soak.FULL_DURATION_S
    assert soak.out_dir(data) == soak.orchestrate.DOCS
    assert "SHORT RUN" not in soak.document(data, "soak.png")


def test_a_committed_soak_report_is_what_its_json_renders_to() -> None:
    if not os.path.exists(COMMITTED):
        return  # no full soak committed yet
    with open(COMMITTED) as f:
        data = json.load(f)
    assert data["params"]["duration_s"] >= soak.FULL_DURATION_S
    with open(os.path.splitext(COMMITTED)[0] + ".md") as f:
        assert f.read() == soak.document(data, "soak.png")


def test_the_committed_engines_soak_is_what_its_json_renders_to() -> None:
    """docs/soak-engines.*: the three systems of issue 18 in one run (canonical, queue storage,
    awa-pg 0.6.9's queue storage), each having run."""
    path = os.path.join(soak.orchestrate.DOCS, "soak-engines.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        data = json.load(f)
    assert [r["system"] for r in data["runs"]] == ["awa-rust-soak", "awa-rust-qs", "awa-pg-qs"]
    assert all(r["ok"] for r in data["runs"])
    with open(os.path.splitext(path)[0] + ".md") as f:
        assert f.read() == soak.document(data, "soak-engines.png")
