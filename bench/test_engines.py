"""Tests of the engines comparison's bookkeeping (bench/engines.py; no database): medians and
ratios per engine, each target judged on the right side, failed runs left out of the figures
but named in the report, and the committed report is what its JSON renders to.

Run with ``python -m pytest bench/test_engines.py``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engines

COMMITTED = os.path.join(engines.orchestrate.DOCS, "engines.json")


def run(engine: str, rnd: int, rate: float, wal: float, p99: float, dead: float = 0.0) -> dict:
    return {"engine": engine, "round": rnd, "ok": True,
            "result": {"jobs_per_s": rate, "wal_bytes_per_job": wal, "dead_per_job": dead,
                       "pickup_ms": {"p50": p99 / 2, "p99": p99}, "settings": "s"}}


def test_medians_ratios_and_verdicts() -> None:
    runs = [run("canonical", 1, 100, 1000, 2.0), run("queue_storage", 1, 120, 700, 1.0),
            run("canonical", 2, 200, 1000, 4.0), run("queue_storage", 2, 90, 900, 3.0),
            run("canonical", 3, 300, 1000, 3.0), run("queue_storage", 3, 150, 800, 2.0)]
    s = engines.summarize(runs)
    assert s["engines"]["canonical"]["jobs_per_s"] == {"median": 200, "min": 100, "max": 300, "n": 3}
    assert s["ratios"]["jobs_per_s"] == 120 / 200
    assert s["verdicts"] == {"jobs_per_s": False, "wal_bytes_per_job": True, "pickup_p99_ms": True}


def test_a_wal_ratio_just_over_the_target_is_missed_and_failed_runs_are_named() -> None:
    runs = [run("canonical", 1, 100, 1000, 1.0), run("queue_storage", 1, 100, 801, 1.0),
            {"engine": "queue_storage", "round": 2, "ok": False, "error": "boom"}]
    s = engines.summarize(runs)
    assert s["engines"]["queue_storage"]["jobs_per_s"]["n"] == 1
    assert s["verdicts"]["wal_bytes_per_job"] is False
    assert s["verdicts"]["jobs_per_s"] is True  # equal is enough
    data = {"command": "c", "started": "t", "params": {"rounds": 2, "jobs": 1, "workers": 1, "pickups": 1},
            "meta": {"git": {"commit": "abc", "dirty": False}, "machine": "m", "load": {"start": "0"}},
            "autovacuum": "off", "runs": runs, "summary": s}
    text = engines.render(data)
    assert "queue_storage round 2: boom" in text
    assert "| wal_bytes_per_job | 1,000 (1,000-1,000) | 801 (801-801) | 0.80x | <= 0.8x | **no** |" in text


def test_the_committed_report_is_what_its_json_renders_to() -> None:
    if not os.path.exists(COMMITTED):
        return
    with open(COMMITTED) as f:
        data = json.load(f)
    with open(os.path.splitext(COMMITTED)[0] + ".md") as f:
        have = f.read()
    assert have == engines.render(data) + "\n![engines chart](engines.png)\n"
