"""Tests of the benchmark's bookkeeping (no database, no peers): the committed report is what
its JSON renders to, verdicts are computed from the data, the floor is checked to be a floor,
and a quick run cannot write over the committed evidence.

Run with ``python -m pytest bench/test_orchestrate.py`` (standard library plus pytest).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import orchestrate


def committed() -> dict:
    with open(orchestrate.FULL_JSON) as f:
        return json.load(f)


def test_the_committed_report_is_what_the_committed_json_renders_to() -> None:
    with open(orchestrate.FULL_MD) as f:
        have = f.read()
    assert have == orchestrate.document(committed(), "benchmarks.png")
    assert orchestrate.check(orchestrate.FULL_JSON, orchestrate.FULL_MD) == 0


def test_the_report_says_it_is_generated_and_how_to_regenerate_it() -> None:
    text = orchestrate.document(committed(), "benchmarks.png")
    first = text.splitlines()[0]
    assert "GENERATED" in first and "bash bench/run.sh" in first and "--render docs/benchmarks.json" in first


def test_the_report_names_the_commit_and_flags_a_dirty_tree_and_an_unknown_commit() -> None:
    head = subprocess.run(["git", "-C", orchestrate.ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert orchestrate.commit_note({"commit": head, "dirty": False}) == f"commit `{head}`, clean working tree"
    assert "uncommitted changes" in orchestrate.commit_note({"commit": head, "dirty": True, "dirty_files": 2})
    assert "not in the current checkout's history" in orchestrate.commit_note({"commit": "0" * 40, "dirty": False})
    meta = orchestrate.git_meta()
    assert meta["commit"] == head and isinstance(meta["dirty"], bool)


def test_the_committed_evidence_is_a_full_run_of_a_clean_commit_in_this_history() -> None:
    """docs/benchmarks.json must come from one full ``bash bench/run.sh`` (every workload at the
    issue's sizes, at least three rounds) on a clean tree, at a commit this checkout contains."""
    meta = committed()["meta"]
    assert meta["command"] == "bash bench/run.sh"
    assert meta["rounds"] >= 3
    assert meta["sizes"] == orchestrate.FULL_SIZES
    assert meta["git"]["dirty"] is False
    if not os.path.isdir(os.path.join(orchestrate.ROOT, ".git")):
        pytest.skip("not a git checkout: the commit's ancestry cannot be checked")
    ancestor = subprocess.run(["git", "-C", orchestrate.ROOT, "merge-base", "--is-ancestor",
                               meta["git"]["commit"], "HEAD"], capture_output=True, text=True)
    assert ancestor.returncode == 0, f"measured commit {meta['git']['commit']} is not an ancestor of HEAD"


def summary_with(drains: dict[str, float], floor: float) -> dict:
    s = {"drain.jobs_per_s": {k: {"min": v, "median": v, "max": v, "n": 1} for k, v in drains.items()},
         "floor.jobs_per_s": {"floor": {"min": floor, "median": floor, "max": floor, "n": 1}},
         "staging.exactly_once": {}}
    return s


def verdict(targets: list[dict], prefix: str) -> str:
    (t,) = [t for t in targets if t["target"].startswith(prefix)]
    return t["status"]


def test_verdicts_are_computed_from_the_data() -> None:
    met = orchestrate.targets(summary_with({"awa": 9000.0, "awa-pg": 1000.0, "awa-rust": 10000.0}, 20000.0))
    assert verdict(met, "Python no-op drain vs awa-pg") == "met"
    assert verdict(met, "Python no-op drain vs our Rust runtime") == "met"
    missed = orchestrate.targets(summary_with({"awa": 7000.0, "awa-pg": 1000.0, "awa-rust": 10000.0}, 20000.0))
    assert verdict(missed, "Python no-op drain vs awa-pg") == "MISSED"
    assert verdict(missed, "Python no-op drain vs our Rust runtime") == "met"
    assert verdict(missed, "single inserts") == "not measured"


def test_a_floor_below_a_runtime_is_reported_as_missed() -> None:
    below = orchestrate.targets(summary_with({"awa": 5000.0, "awa-rust": 22000.0}, 20000.0))
    assert verdict(below, "the floor is above every runtime's drain") == "MISSED"
    above = orchestrate.targets(summary_with({"awa": 5000.0, "awa-rust": 22000.0}, 30000.0))
    assert verdict(above, "the floor is above every runtime's drain") == "met"
    assert verdict(above, "Rust no-op drain vs the floor") == "met"


def test_staging_is_missed_when_a_follow_up_is_not_exactly_once() -> None:
    s = summary_with({"awa": 10000.0}, 20000.0)
    s["staging.jobs_per_s"] = {"awa": {"min": 9000.0, "median": 9000.0, "max": 9000.0, "n": 1}}
    s["staging.exactly_once"] = {"awa": False}
    assert verdict(orchestrate.targets(s), "staging drain vs plain drain (Python)") == "MISSED"
    s["staging.exactly_once"] = {"awa": True}
    assert verdict(orchestrate.targets(s), "staging drain vs plain drain (Python)") == "met"


def test_a_quick_report_marks_itself() -> None:
    data = copy.deepcopy(committed())
    data["meta"]["quick"] = True
    text = orchestrate.render_markdown(data)
    assert "QUICK RUN" in text.splitlines()[2]


def test_a_quick_run_writes_only_under_bench_results(tmp_path, monkeypatch) -> None:
    # Run the orchestrator with --quick and nothing to measure: it must write its files under
    # bench/results/ and leave docs/ untouched.
    before = {p: os.path.getmtime(p) for p in (orchestrate.FULL_JSON, orchestrate.FULL_MD)}
    out = subprocess.run([sys.executable, os.path.join(orchestrate.BENCH, "orchestrate.py"), "--quick", "--workloads=",
                          "--plot-python", str(tmp_path / "no-python")], capture_output=True, text=True, check=False,
                         env=dict(os.environ, DATABASE_URL=os.environ.get(
                             "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")))
    if out.returncode != 0 and "psql" in out.stderr:
        pytest.skip(f"no PostgreSQL for the machine facts: {out.stderr.strip()[-200:]}")
    assert out.returncode == 0, out.stderr
    assert "bench/results/quick.md" in out.stdout
    assert {p: os.path.getmtime(p) for p in before} == before


def test_the_floor_runs_right_after_our_runtimes_drains() -> None:
    registry = orchestrate.systems("/nonexistent/awa-bench")
    order = orchestrate.schedule(orchestrate.WORKLOADS, list(registry), registry)
    drains = [i for i, (w, s) in enumerate(order) if w == "drain" and s in ("awa", "awa-rust")]
    floors = [i for i, (w, _) in enumerate(order) if w == "floor"]
    assert floors == [drains[-1] + 1], order
    # Nothing is lost or doubled by the move.
    everything = [(w, s) for w in orchestrate.WORKLOADS for s in registry if w in registry[s]["workloads"]]
    assert sorted(order) == sorted(everything)


def run(rnd: int, workload: str, system: str, rate: float) -> dict:
    return {"round": rnd, "workload": workload, "system": system, "ok": True, "result": {"jobs_per_s": rate}}


def test_the_floor_is_judged_round_by_round_against_the_drain_beside_it() -> None:
    # Medians alone would pass (floor median 12,000 > drain median 11,000), but in two of the
    # three rounds the floor is below the drain measured next to it: missed.
    runs = [run(1, "drain", "awa-rust", 13000.0), run(1, "floor", "floor", 12000.0),
            run(2, "drain", "awa-rust", 11000.0), run(2, "floor", "floor", 10000.0),
            run(3, "drain", "awa-rust", 7000.0), run(3, "floor", "floor", 14000.0)]
    s = orchestrate.summarize(runs)
    assert [round(p["ratio"], 3) for p in s["floor.paired"]["rounds"]] == [0.923, 0.909, 2.0]
    assert verdict(orchestrate.targets(s), "the floor is above every runtime's drain") == "MISSED"
    for r in runs:
        if r["workload"] == "floor":
            r["result"]["jobs_per_s"] *= 1.2
    assert verdict(orchestrate.targets(orchestrate.summarize(runs)), "the floor is above every runtime's drain") == "met"


def test_a_capped_system_runs_and_is_judged_on_its_cap() -> None:
    registry = orchestrate.systems("/nonexistent/awa-bench")
    args = type("A", (), {"sizes": dict(orchestrate.FULL_SIZES)})()
    assert orchestrate.size_for(registry["procrastinate"], "drain", args) == 2000
    assert orchestrate.size_for(registry["awa"], "drain", args) == orchestrate.FULL_SIZES["drain"]


def test_cpu_per_job_is_named_as_the_cause_in_the_verdicts() -> None:
    s = summary_with({"awa": 6000.0, "awa-pg": 1000.0, "awa-rust": 10000.0}, 12000.0)
    for system, client, server in (("awa", 180.0, 90.0), ("awa-rust", 60.0, 85.0)):
        s.setdefault("drain.cpu.client_us_per_job", {})[system] = {"min": client, "median": client, "max": client, "n": 1}
        s.setdefault("drain.cpu.server_us_per_job", {})[system] = {"min": server, "median": server, "max": server, "n": 1}
    targets = orchestrate.targets(s)
    (rust,) = [t for t in targets if t["target"].startswith("Python no-op drain vs our Rust runtime")]
    assert rust["status"] == "MISSED"
    assert rust["detail"] == "CPU per job: awa: client 180 µs, server 90 µs; awa-rust: client 60 µs, server 85 µs"
    (pg,) = [t for t in targets if t["target"].startswith("Python no-op drain vs awa-pg")]
    assert pg["detail"] == "8× awa-pg is 8,000 jobs/s, the floor (our SQL alone, no runtime) 12,000"


def test_cpu_is_read_from_the_os() -> None:
    before = orchestrate.children_cpu_s()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(2_000_000))"], check=True)
    assert orchestrate.children_cpu_s() - before > 0.01
    server = orchestrate.server_cpu_s()  # None where /proc shows no local PostgreSQL
    assert server is None or server >= 0.0


def test_the_storage_engines_section_reads_the_soak_and_the_engines_runs(tmp_path) -> None:
    """Issue 18's section: each soak system's figures with its verdicts, the engines' medians
    and ratios, each run's command named; nothing recorded says so."""
    assert "No soak or engines run is recorded" in "\n".join(orchestrate.storage_engines_section(str(tmp_path)))
    meta = {"git": {"commit": "abc", "dirty": False}}

    def judged(dead: float, growth: float, ok: bool) -> dict:
        return {"processed": 1_800_000, "dead_per_job": dead, "growth": growth, "backlog_end": 0,
                "wal_bytes_per_job": 900.0, "verdicts": {"dead": ok, "growth": ok, "backlog": True}}

    soak = {"command": "bash bench/run.sh --soak", "started": "then", "meta": meta, "autovacuum": "off",
            "params": {"rate": 1000.0, "duration_s": 1800.0, "retention_s": 10.0},
            "runs": [{"system": "awa-rust-soak", "ok": True, "judged": judged(2.1, 2.0, False)},
                     {"system": "awa-rust-qs", "ok": True, "judged": judged(0.002, 0.01, True)},
                     {"system": "awa-pg-qs", "ok": False, "error": "boom"}]}
    figure = {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}
    engines = {"command": "bash bench/run.sh --engines", "started": "now", "meta": meta,
               "params": {"rounds": 5, "jobs": 20000, "pickups": 100},
               "summary": {"engines": {e: {k: figure for k in ("jobs_per_s", "wal_bytes_per_job", "pickup_p99_ms",
                                                                 "pickup_p50_ms")}
                                       for e in ("canonical", "queue_storage")},
                           "ratios": {"jobs_per_s": 0.9, "wal_bytes_per_job": 0.5, "pickup_p99_ms": 2.0,
                                      "pickup_p50_ms": 1.8},
                           "verdicts": {"jobs_per_s": False, "wal_bytes_per_job": True, "pickup_p99_ms": False}}}
    for name, data in (("soak.json", soak), ("engines.json", engines)):
        (tmp_path / name).write_text(json.dumps(data))
    text = "\n".join(orchestrate.storage_engines_section(str(tmp_path)))
    assert "`bash bench/run.sh --soak`" in text and "`bash bench/run.sh --engines`" in text
    assert "| ours, canonical | 1,800,000 | 210.00% **missed** | +200.0% **missed** | 0 met | 900 |" in text
    assert "| ours, queue storage | 1,800,000 | 0.20% met | +1.0% met | 0 met | 900 |" in text
    assert "| awa-pg 0.6.9, queue storage | failed: boom |" in text
    assert "| drain, jobs/s | 1 | 1 | 0.90× | ≥ 1.0× | **missed** |" in text
    assert "| WAL bytes per job | 1 | 1 | 0.50× | ≤ 0.8× | met |" in text
    assert "| idle pickup p50, ms | 1.00 | 1.00 | 1.80× |  |  |" in text
    soak["params"]["duration_s"] = 1200.0
    (tmp_path / "soak-engines.json").write_text(json.dumps(soak))
    text = "\n".join(orchestrate.storage_engines_section(str(tmp_path)))
    assert "[soak-engines.md](soak-engines.md)" in text and "A short run: 1,200 s per system" in text
    assert "size growth from minute 6.67" in text
    assert "What one idle claim costs" not in text
    claims = {"command": "bash bench/run.sh --claim-cost", "started": "later", "meta": meta,
              "params": {"rounds": 7, "loops": 2000},
              "summary": {"claims": {"canonical": {"median": 0.5}, "queue_storage": {"median": 0.9}},
                          "ratios": {"canonical": 1.0, "queue_storage": 1.8}}}
    (tmp_path / "claim-cost.json").write_text(json.dumps(claims))
    text = "\n".join(orchestrate.storage_engines_section(str(tmp_path)))
    assert "`bash bench/run.sh --claim-cost`" in text and "7 rounds of 2,000 loops" in text
    assert "| queue storage | 0.900 | 1.80× |" in text
    assert "one statement on queue storage's tables |" not in text  # not measured in that run
