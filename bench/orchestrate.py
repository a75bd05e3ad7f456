"""Run the benchmark: every workload, every system, interleaved, several rounds.

Started by ``bench/run.sh`` (which prepares the virtualenvs, the wheel and the Rust binary);
standard library only. For each round, for each workload, each system that implements it
runs once (A, B, C, A, B, C, ...), each run in its own subprocess with that system's
virtualenv and on its own fresh database (created before, dropped after). The results go to
a JSON file, a markdown report generated from it and a PNG chart, written together:

- a full run writes ``docs/benchmarks.json``, ``docs/benchmarks.md`` and ``docs/benchmarks.png``
  (committed together; the report names the commit it measured);
- ``--quick`` writes ``bench/results/quick.{json,md,png}`` (git-ignored) and marks itself as a
  quick run, so a smoke run never overwrites the committed evidence;
- ``--render JSON`` re-renders a report and chart from a results file, ``--check`` verifies
  that ``docs/benchmarks.md`` is exactly what ``docs/benchmarks.json`` renders to.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
import urllib.parse
from typing import Any, Callable

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
VENVS = os.path.join(BENCH, ".venvs")
RESULT_PREFIX = "BENCH_RESULT "

WORKLOADS = ["enqueue_single", "enqueue_bulk_count", "enqueue_bulk_jobs", "drain", "latency", "staging", "floor"]

FULL_SIZES = {"enqueue_single": 2000, "enqueue_bulk_count": 20000, "enqueue_bulk_jobs": 20000, "drain": 20000,
              "latency": 100, "staging": 20000, "floor": 50000}
QUICK_SIZES = {"enqueue_single": 200, "enqueue_bulk_count": 2000, "enqueue_bulk_jobs": 2000, "drain": 2000,
               "latency": 30, "staging": 1000, "floor": 5000}

# The floor's sweep: BxK = B jobs per claim statement on K connections; p = pipelined (the next
# claim is sent while the previous batch's completion is in flight). The best point is the floor.
# (256x8p and 1024-job claims were dropped after fded288's run: every one was below 3,700/s,
# a quarter of the best point, and they cost ~40 s a round.)
FULL_FLOOR_SWEEP = "32x2,32x2p,64x2p,64x4p,128x2p,128x4p,256x2p,256x4p,512x4p,32x2d,64x2d,128x2d"
QUICK_FLOOR_SWEEP = "32x2,64x2p,256x4p"

PY_WORKLOADS = ["enqueue_single", "enqueue_bulk_count", "enqueue_bulk_jobs", "drain", "latency", "staging"]

DOCS = os.path.join(ROOT, "docs")
FULL_JSON = os.path.join(DOCS, "benchmarks.json")
FULL_MD = os.path.join(DOCS, "benchmarks.md")


def systems(rust_bin: str) -> dict[str, dict[str, Any]]:
    """Every system: how to run it and which workloads it has."""
    def py(venv: str, adapter: str, label: str, workloads: list[str] = PY_WORKLOADS) -> dict[str, Any]:
        return {
            "label": label,
            "cmd": [os.path.join(VENVS, venv, "bin", "python"), os.path.join(BENCH, "systems", adapter)],
            "workloads": {w: w for w in workloads},
        }

    peer_workloads = [w for w in PY_WORKLOADS if w != "enqueue_bulk_count"]

    return {
        "awa": py("awa", "awa_queue.py", "awa (ours, Python)"),
        "awa-rust": {
            "label": "awa (ours, Rust handler)",
            "cmd": [rust_bin],
            "workloads": {"enqueue_single": "enqueue_single", "drain": "drain", "staging": "staging"},
        },
        # awa-pg 0.6.9 runs on its canonical engine after migrate() (the faster one for
        # draining here; its Job-returning insert_many_copy is the canonical engine's COPY);
        # its queue-storage engine has the count-returning COPY ingestion (enqueue_many_copy),
        # so it is measured separately for inserts and pickup.
        "awa-pg": dict(py("awa_pg", "awa_pg.py", "awa-pg 0.6.9", peer_workloads), env={"AWA_PG_ENGINE": "canonical"}),
        "awa-pg-qs": dict(
            py("awa_pg", "awa_pg.py", "awa-pg 0.6.9, queue storage",
               ["enqueue_single", "enqueue_bulk_count", "latency"]),
            env={"AWA_PG_ENGINE": "queue_storage"},
        ),
        "pgqueuer": py("pgqueuer", "pgqueuer_sys.py", "pgqueuer", peer_workloads),
        # Procrastinate drains at ~70 jobs/s here: the full 20,000 took 650 s of every round
        # (two thirds of the run). Its drains are capped; a rate over 2,000 jobs (~30 s of
        # steady draining) is the same rate, and the report states the cap.
        "procrastinate": dict(py("procrastinate", "procrastinate_sys.py", "procrastinate", peer_workloads),
                              max_jobs={"drain": 2000, "staging": 2000}),
        # Issue 18's engines under the soak: the Rust runtime on each (bench/rust, `soak`).
        "awa-rust-soak": {
            "label": "awa (ours, Rust runtime, canonical)",
            "cmd": [rust_bin],
            "workloads": {"soak": "soak"},
            "env": {"AWA_BENCH_ENGINE": "canonical"},
        },
        "awa-rust-qs": {
            "label": "awa (ours, Rust runtime, queue storage)",
            "cmd": [rust_bin],
            "workloads": {"soak": "soak"},
            "env": {"AWA_BENCH_ENGINE": "queue_storage"},
        },
        "floor": {
            "label": "floor (our SQL, no runtime, best of the sweep)",
            "cmd": [rust_bin],
            "workloads": {"floor": "floor"},
        },
    }


# ---------------------------------------------------------------------------------------------
# databases


def with_db(url: str, dbname: str) -> str:
    u = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + dbname, u.query, u.fragment))


def psql(url: str, sql: str) -> str:
    out = subprocess.run(
        ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr.strip()}")
    return out.stdout.strip()


def fresh_db(admin_url: str, name: str) -> str:
    psql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    psql(admin_url, f'CREATE DATABASE "{name}"')
    # Every run starts with the previous run's dirty pages written out, so no run pays for
    # the checkpoint of the one before it (a 350 s Procrastinate run leaves plenty).
    try:
        psql(admin_url, "CHECKPOINT")
    except RuntimeError as e:  # not a superuser: measure without it, and say so in the log
        print(f"  (CHECKPOINT refused: {e})", file=sys.stderr)
    return with_db(admin_url, name)


def drop_db(admin_url: str, name: str) -> None:
    try:
        psql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except RuntimeError as e:
        print(f"  (could not drop {name}: {e})", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# one run


# Read the database's counters around the run phase (the floor counts its own statements).
MEASURE_DB = {"drain", "staging"}
# Workloads whose CPU time is split between the client and the server (per job): where each
# system spends its time, the measured cause of a rate.
MEASURE_CPU = {"enqueue_single", "drain", "staging"}
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def server_cpu_s() -> float | None:
    """CPU seconds PostgreSQL has used so far, read from /proc: every live ``postgres`` process's
    own time plus the reaped children's time of the postmaster (so backends that exited during
    a run, such as the client's connections, are still counted). None where /proc cannot show
    it (another OS, a server on another machine). The whole server is counted: background
    writers and autovacuum included, and any other database's work, so measure on a quiet
    machine."""
    total = 0
    found = False
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    stats: dict[str, list[str]] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.find("(") + 1:raw.rfind(")")]
        if comm.startswith("postgres"):
            stats[pid] = raw[raw.rfind(")") + 2:].split()
    for fields in stats.values():
        # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17.
        total += int(fields[11]) + int(fields[12])
        if fields[1] not in stats:  # the postmaster: its parent is not a postgres process
            total += int(fields[13]) + int(fields[14])
            found = True
    return total / CLK_TCK if found else None


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def size_for(spec: dict[str, Any], workload: str, args: argparse.Namespace) -> int:
    """How many jobs this system's run of ``workload`` uses: the run's size, or the system's cap."""
    n = int(args.sizes[workload])
    cap = spec.get("max_jobs", {}).get(workload)
    return min(n, int(cap)) if cap is not None else n


def call(spec: dict[str, Any], system: str, workload: str, phase: str, url: str, args: argparse.Namespace,
         log_path: str) -> dict[str, Any]:
    """Run one phase of one workload in a subprocess; returns its parsed result line."""
    n = size_for(spec, workload, args)
    cmd = list(spec["cmd"]) + [spec["workloads"][workload], "--phase", phase, "--url", url, "--jobs", str(n)]
    if workload in ("drain", "staging", "latency"):
        cmd += ["--workers", str(args.workers), "--poll-ms", str(args.poll_ms)]
    if workload == "latency":
        cmd += ["--interval-ms", str(args.interval_ms)]
    if workload == "floor":
        cmd += ["--sweep", args.floor_sweep]
    timeout = 120 + n / 15 + (n / 1000 * len(args.floor_sweep.split(",")) if workload == "floor" else 0)
    if not os.path.exists(cmd[0]):
        return {"ok": False, "unavailable": True, "error": f"{cmd[0]} is missing (run bench/run.sh)"}
    t0 = time.monotonic()
    try:
        env = dict(os.environ, **spec.get("env", {}))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=BENCH, check=False, env=env)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = None
    with open(log_path, "a") as f:
        f.write(f"\n===== {system} {workload} {phase} rc={rc} ({time.monotonic() - t0:.1f}s)\n$ {shlex.join(cmd)}\n")
        f.write(stdout)
        f.write(stderr)
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if rc is None:
        return {"ok": False, "error": f"{phase}: timed out after {timeout:.0f}s"}
    if not lines:
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"ok": False, "unavailable": True, "error": f"{phase}: exit {rc}: {tail}"}
    out = json.loads(lines[-1][len(RESULT_PREFIX):])
    if not out.get("ok"):
        err = out.get("error", "failed")
        out["error"] = f"{phase}: {err}"
        # An import or attribute error means the system (or this workload) is not there.
        if re.search(r"(ImportError|ModuleNotFoundError|AttributeError|not implemented)", err):
            out["unavailable"] = True
    return out


def schedule(workloads: list[str], systems_: list[str], registry: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """One round's runs, in order: workload by workload, system by system, except that the
    floor runs right after the last of our runtimes' drains. The floor must be above every
    runtime's drain, and on a shared 2-core machine the rate drifts by a quarter within a
    round; measured minutes apart, the two are not comparable, measured back to back they are
    (the floor's target is judged per round, on these adjacent pairs)."""
    runs = [(w, s) for w in workloads for s in systems_ if w in registry[s]["workloads"]]
    floor = [(w, s) for (w, s) in runs if w == "floor"]
    rest = [(w, s) for (w, s) in runs if w != "floor"]
    ours = [i for i, (w, s) in enumerate(rest) if w == "drain" and s in ("awa", "awa-rust")]
    at = ours[-1] + 1 if ours else len(rest)
    return rest[:at] + floor + rest[at:]


def wait_no_backends(admin_url: str, dbname: str, timeout_s: float = 20.0) -> int:
    """Wait until nothing is connected to ``dbname`` (every backend has exited and so flushed
    its statistics), then a moment more. Returns how many were still connected at the end."""
    deadline = time.monotonic() + timeout_s
    left = 0
    while time.monotonic() < deadline:
        left = int(psql(admin_url, f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{dbname}'") or 0)
        if left == 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    return left


def read_stats(admin_url: str, dbname: str) -> tuple[int, str, int]:
    """Commit counter and WAL position, read from the admin database (so reading them adds
    nothing to ``dbname``), once every connection to ``dbname`` is gone."""
    left = wait_no_backends(admin_url, dbname)
    row = psql(admin_url, f"SELECT xact_commit || ' ' || pg_current_wal_lsn() FROM pg_stat_database WHERE datname = '{dbname}'")
    commits, lsn = row.split()
    return int(commits), lsn, left


def run_one(spec: dict[str, Any], system: str, workload: str, admin_url: str, dbname: str,
            args: argparse.Namespace, log_path: str) -> dict[str, Any]:
    """setup, (statistics), run, (statistics), verify; one fresh database."""
    url = with_db(admin_url, dbname)
    out = call(spec, system, workload, "setup", url, args, log_path)
    if not out.get("ok"):
        return out
    measure = workload in MEASURE_DB
    if measure:
        c0, lsn0, _ = read_stats(admin_url, dbname)
    cpu = workload in MEASURE_CPU
    if cpu:
        client0, server0 = children_cpu_s(), server_cpu_s()
    out = call(spec, system, workload, "run", url, args, log_path)
    if not out.get("ok"):
        return out
    result = out["result"]
    if cpu:
        # The client: the CPU the run phase reported for itself (start-up and imports left
        # out), else the whole subprocess's; the server: all of PostgreSQL over the same span.
        client_s, server1 = children_cpu_s() - client0, server_cpu_s()
        if isinstance(result.get("cpu_s"), (int, float)):
            client_s = float(result["cpu_s"])
        per = max(size_for(spec, workload, args), 1)
        result["cpu"] = {"client_s": client_s, "client_us_per_job": client_s / per * 1e6}
        if server0 is not None and server1 is not None:
            result["cpu"].update(server_s=server1 - server0, server_us_per_job=(server1 - server0) / per * 1e6)
    if measure:
        c1, _, left = read_stats(admin_url, dbname)
        wal = float(psql(admin_url, f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn0}'::pg_lsn)"))
        dead, live = (int(x) for x in psql(
            url, "SELECT coalesce(sum(n_dead_tup), 0) || ' ' || coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables"
        ).split())
        commits = c1 - c0 - int(result.get("own_txns", 0))
        per = max(size_for(spec, workload, args), 1)
        result["db"] = {
            "commits": commits, "commits_per_job": commits / per,
            "wal_bytes": wal, "wal_bytes_per_job": wal / per,
            "dead_tuples": dead, "live_tuples": live,
        }
        if left:
            result["db"]["warning"] = f"{left} connection(s) were still open when the statistics were read"
    ver = call(spec, system, workload, "verify", url, args, log_path)
    if not ver.get("ok"):
        return {"ok": False, "error": ver.get("error"), "result": result}
    result.update(ver["result"])
    n = size_for(spec, workload, args)
    if "completed" in result and result["completed"] != n:
        return {"ok": False, "error": f"only {result['completed']} of {n} jobs completed", "result": result}
    return {"ok": True, "result": result}


# ---------------------------------------------------------------------------------------------
# summaries


METRICS: list[tuple[str, str, str, str]] = [
    # (workload, key path, label, unit)
    ("enqueue_single", "jobs_per_s", "single inserts (one commit each)", "jobs/s"),
    ("enqueue_bulk_count", "jobs_per_s", "bulk insert returning a count (COPY)", "jobs/s"),
    ("enqueue_bulk_jobs", "jobs_per_s", "bulk insert returning the jobs (pgqueuer, procrastinate: ids)", "jobs/s"),
    ("drain", "jobs_per_s", "drain, no-op handler, 32 workers", "jobs/s"),
    ("latency", "p50_ms", "idle pickup p50 (insert call to handler start)", "ms"),
    ("latency", "p99_ms", "idle pickup p99", "ms"),
    ("latency", "from_commit_p50_ms", "idle pickup p50 from insert commit", "ms"),
    ("latency", "insert_call_p50_ms", "idle insert call p50 (call to its commit returning)", "ms"),
    ("staging", "jobs_per_s", "drain, each job stages one unique follow-up", "jobs/s"),
    ("drain", "db.commits_per_job", "commits per completed job (drain)", "commits"),
    ("drain", "engine.claims_per_job", "of which claim statements (ours: engine counters)", "commits"),
    ("drain", "engine.completion_batches_per_job", "of which batched completions (ours: engine counters)", "commits"),
    ("drain", "db.wal_bytes_per_job", "WAL bytes per completed job (drain)", "bytes"),
    ("drain", "db.dead_tuples", "dead tuples left after the drain", "tuples"),
    ("staging", "db.commits_per_job", "commits per job (staging drain)", "commits"),
    ("staging", "engine.claims_per_job", "of which claim statements (staging; engine counters)", "commits"),
    ("staging", "engine.completion_batches_per_job", "of which batched completions (staging; engine counters)", "commits"),
    ("staging", "db.wal_bytes_per_job", "WAL bytes per job (staging drain)", "bytes"),
    ("enqueue_single", "cpu.client_us_per_job", "client CPU per single insert", "µs"),
    ("enqueue_single", "cpu.server_us_per_job", "PostgreSQL CPU per single insert", "µs"),
    ("drain", "cpu.client_us_per_job", "client CPU per job (drain)", "µs"),
    ("drain", "cpu.server_us_per_job", "PostgreSQL CPU per job (drain)", "µs"),
    ("staging", "cpu.client_us_per_job", "client CPU per job (staging drain)", "µs"),
    ("staging", "cpu.server_us_per_job", "PostgreSQL CPU per job (staging drain)", "µs"),
    ("floor", "jobs_per_s", "floor: our claim + complete statements alone, best point of the sweep", "jobs/s"),
    ("floor", "best.commits_per_job", "floor: commits per job at its best point", "commits"),
]

HIGHER_IS_BETTER = {"jobs_per_s"}

# The column the bold ratios are taken against: awa-pg 0.6.9 (canonical engine), except where
# only its queue-storage engine has the call (the count-returning COPY).
RATIO_BASE = {"enqueue_bulk_count": "awa-pg-qs"}


def get_path(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for workload, path, _label, _unit in METRICS:
        key = f"{workload}.{path}"
        per_system: dict[str, Any] = {}
        for sysname in sorted({r["system"] for r in runs}):
            vals = [
                get_path(r["result"], path)
                for r in runs
                if r["system"] == sysname and r["workload"] == workload and r.get("ok") and r.get("result")
            ]
            vals = [float(v) for v in vals if isinstance(v, (int, float)) and not math.isnan(float(v))]
            if vals:
                per_system[sysname] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "n": len(vals)}
        if per_system:
            summary[key] = per_system
    # Exactly-once check of the staged follow-ups, per system.
    once: dict[str, Any] = {}
    for r in runs:
        if r["workload"] == "staging" and r.get("ok") and r.get("result"):
            ok = bool(r["result"].get("exactly_once"))
            once[r["system"]] = once.get(r["system"], True) and ok
    summary["staging.exactly_once"] = once
    # The floor's sweep, per point.
    points: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r["workload"] == "floor" and r.get("ok") and r.get("result"):
            for pt in r["result"].get("sweep", []):
                points.setdefault(pt["point"], []).append(pt)
    sweep = {}
    for point, pts in points.items():
        rates = [float(p["jobs_per_s"]) for p in pts]
        sweep[point] = {"min": min(rates), "median": statistics.median(rates), "max": max(rates), "n": len(rates),
                        "commits_per_job": statistics.median(float(p["commits_per_job"]) for p in pts)}
    if sweep:
        summary["floor.sweep"] = sweep
    # The floor against the fastest runtime drain of the same round (they run back to back,
    # see schedule()): the ratio the floor's target is judged on.
    paired = []
    for rnd in sorted({r["round"] for r in runs}):
        fl = [r for r in runs if r["round"] == rnd and r["workload"] == "floor" and r.get("ok") and r.get("result")]
        dr = [r for r in runs if r["round"] == rnd and r["workload"] == "drain" and r.get("ok") and r.get("result")]
        if not fl or not dr:
            continue
        fastest = max(dr, key=lambda r: float(r["result"]["jobs_per_s"]))
        f_rate, d_rate = float(fl[0]["result"]["jobs_per_s"]), float(fastest["result"]["jobs_per_s"])
        paired.append({"round": rnd, "floor": f_rate, "system": fastest["system"], "drain": d_rate,
                       "ratio": f_rate / d_rate if d_rate else None})
    ratios = [p["ratio"] for p in paired if p["ratio"] is not None]
    if ratios:
        summary["floor.paired"] = {"rounds": paired, "median_ratio": statistics.median(ratios)}
    return summary


def med(summary: dict[str, Any], key: str, system: str) -> float | None:
    v = summary.get(key, {}).get(system)
    return v["median"] if v else None


def best_drain(summary: dict[str, Any]) -> tuple[str | None, float | None]:
    """The fastest runtime drain (any system) in this run."""
    per = summary.get("drain.jobs_per_s", {})
    if not per:
        return None, None
    name = max(per, key=lambda k: per[k]["median"])
    return name, per[name]["median"]


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issues' targets, judged on the medians of this one run (computed, never written by
    hand: the report renders exactly this list)."""
    out = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def add(issue: int, name: str, value: float | None, need: float, fmt: str, le: bool = False,
            detail: str = "", extra_ok: bool | None = None) -> None:
        if value is None:
            status = "not measured"
        else:
            status = "met" if (value <= need if le else value >= need) else "MISSED"
            if extra_ok is False:
                status = "MISSED"
        out.append({"issue": issue, "target": name, "value": value, "need": need, "fmt": fmt, "le": le,
                    "status": status, "detail": detail})

    def m(key: str, system: str) -> float | None:
        return med(summary, key, system)

    d_awa, d_rust = m("drain.jobs_per_s", "awa"), m("drain.jobs_per_s", "awa-rust")
    floor = m("floor.jobs_per_s", "floor")
    once = summary.get("staging.exactly_once", {})

    def once_detail(system: str) -> tuple[str, bool | None]:
        if system not in once:
            return "", None
        return f"follow-ups inserted exactly once: {'yes' if once[system] else 'NO'}", bool(once[system])

    def cpu(workload: str, *systems: str) -> str:
        """Where the time goes, measured: client and server CPU per job of each system."""
        parts = []
        for system in systems:
            c, srv = m(f"{workload}.cpu.client_us_per_job", system), m(f"{workload}.cpu.server_us_per_job", system)
            if c is not None:
                parts.append(f"{system}: client {c:,.0f} µs" + (f", server {srv:,.0f} µs" if srv is not None else ""))
        return ("CPU per job: " + "; ".join(parts)) if parts else ""

    def pickup_split() -> str:
        """Where the idle pickup time goes: the insert call itself, then commit to handler start."""
        call, after = m("latency.insert_call_p50_ms", "awa"), m("latency.from_commit_p50_ms", "awa")
        if call is None or after is None:
            return ""
        peer = m("latency.insert_call_p50_ms", "pgqueuer")
        return (f"insert call {call:.1f} ms (its round trip and commit), then {after:.1f} ms from commit to handler start"
                + (f"; pgqueuer's insert call {peer:.1f} ms" if peer is not None else ""))

    def commit_split(workload: str, system: str) -> str:
        """Where the commits go: claim statements, batched completions, the rest (heartbeats,
        listener wake-ups, maintenance, per-job finalizations)."""
        total = m(f"{workload}.db.commits_per_job", system)
        claims = m(f"{workload}.engine.claims_per_job", system)
        batches = m(f"{workload}.engine.completion_batches_per_job", system)
        if total is None or claims is None or batches is None:
            return ""
        return (f"claims {claims:.3f} (≈{1 / claims:.0f} jobs each), batched completions {batches:.3f} "
                f"(≈{1 / batches:.0f} each), the rest {max(total - claims - batches, 0):.3f}"
                if claims and batches else f"claims {claims:.3f}, batched completions {batches:.3f}")

    d_pg = m("drain.jobs_per_s", "awa-pg")
    ceiling = (f"8× awa-pg is {8 * d_pg:,.0f} jobs/s, the floor (our SQL alone, no runtime) {floor:,.0f}"
               if d_pg and floor else "")
    # issue 17, item 3 and its targets
    add(17, "Python no-op drain vs awa-pg 0.6.9", ratio(d_awa, d_pg), 8.0, "{:.2f}×", detail=ceiling)
    add(17, "Python no-op drain vs our Rust runtime", ratio(d_awa, d_rust), 0.70, "{:.0%}",
        detail=cpu("drain", "awa", "awa-rust"))
    add(17, "single inserts (one commit each) vs pgqueuer",
        ratio(m("enqueue_single.jobs_per_s", "awa"), m("enqueue_single.jobs_per_s", "pgqueuer")), 1.0, "{:.2f}×",
        detail=cpu("enqueue_single", "awa", "pgqueuer"))
    add(17, "idle pickup p50 (Python)", m("latency.p50_ms", "awa"), 2.0, "{:.1f} ms", le=True,
        detail=pickup_split())
    add(17, "idle pickup p99 (Python)", m("latency.p99_ms", "awa"), 10.0, "{:.1f} ms", le=True)
    add(17, "commits per plain completed job (Python drain)", m("drain.db.commits_per_job", "awa"), 0.03, "{:.3f}",
        le=True, detail=commit_split("drain", "awa"))
    add(17, "commits per plain completed job (Rust drain)", m("drain.db.commits_per_job", "awa-rust"), 0.03, "{:.3f}",
        le=True, detail=commit_split("drain", "awa-rust"))
    add(17, "commits per staging job (Python)", m("staging.db.commits_per_job", "awa"), 0.10, "{:.3f}", le=True,
        detail=commit_split("staging", "awa"))
    add(17, "commits per staging job (Rust)", m("staging.db.commits_per_job", "awa-rust"), 0.10, "{:.3f}", le=True,
        detail=commit_split("staging", "awa-rust"))
    for system, label in (("awa", "Python"), ("awa-rust", "Rust")):
        detail, ok = once_detail(system)
        add(17, f"staging drain vs plain drain ({label}), every follow-up exactly once",
            ratio(m("staging.jobs_per_s", system), m("drain.jobs_per_s", system)), 0.60, "{:.0%}",
            detail=detail, extra_ok=ok)
    # issue 7 targets that still apply
    add(7, "Python no-op drain vs pgqueuer", ratio(d_awa, m("drain.jobs_per_s", "pgqueuer")), 3.0, "{:.2f}×")
    add(7, "Rust no-op drain vs the floor", ratio(d_rust, floor), 0.60, "{:.0%}")
    add(7, "bulk insert returning a count vs awa-pg's (enqueue_many_copy, both)",
        ratio(m("enqueue_bulk_count.jobs_per_s", "awa"), m("enqueue_bulk_count.jobs_per_s", "awa-pg-qs")), 1.0, "{:.2f}×")
    add(7, "bulk insert returning the jobs vs awa-pg's (insert_many_copy, both)",
        ratio(m("enqueue_bulk_jobs.jobs_per_s", "awa"), m("enqueue_bulk_jobs.jobs_per_s", "awa-pg")), 1.0, "{:.2f}×")
    # The floor has to be a floor: above every runtime's drain in the same run. Judged round by
    # round on the floor and the fastest drain measured back to back (median of those ratios);
    # without per-round data (a summary alone), on the medians.
    name, best = best_drain(summary)
    paired = summary.get("floor.paired")
    if paired:
        per = ", ".join(f"r{p['round']} {p['ratio']:.2f}× ({p['system']})" for p in paired["rounds"] if p["ratio"])
        add(12, f"the floor is above every runtime's drain (fastest: {name or '–'}; per round, back to back)",
            paired["median_ratio"], 1.0, "{:.2f}×", detail=f"floor ÷ fastest drain of its round: {per}")
    else:
        add(12, f"the floor is above every runtime's drain (fastest: {name or '–'})", ratio(floor, best), 1.0, "{:.2f}×")
    return out


# ---------------------------------------------------------------------------------------------
# report


def fmt_num(v: float, unit: str) -> str:
    if unit in ("jobs/s", "bytes", "tuples", "µs"):
        return f"{v:,.0f}"
    if unit == "ms":
        return f"{v:.1f}"
    return f"{v:.3f}"


def commit_note(git: dict[str, Any]) -> str:
    """The commit a run measured, and whether this checkout knows it."""
    commit = git.get("commit") or "unknown"
    bits = [f"commit `{commit}`"]
    if git.get("dirty"):
        bits.append(f"**plus uncommitted changes** ({git.get('dirty_files', '?')} file(s) differed from that commit)")
    else:
        bits.append("clean working tree")
    if commit != "unknown" and not git_has(commit):
        bits.append("**this commit is not in the current checkout's history**")
    return ", ".join(bits)


def git_has(commit: str) -> bool:
    r = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, check=False)
    return r.returncode == 0


# Issue 18's figures come from two runs of their own (a 30-minute soak per system does not fit in
# this run's rounds): the soak (bench/soak.py) and the engines' drain (bench/engines.py).
FULL_SOAK_S = 1800.0  # the issue's 30 minutes per system
SOAK_SYSTEMS = [("awa-rust-soak", "ours, canonical"), ("awa-rust-qs", "ours, queue storage"),
                ("awa-pg-qs", "awa-pg 0.6.9, queue storage")]


def storage_engines_section(docs: str = DOCS) -> list[str]:
    """Issue 18's targets, from docs/soak.json, docs/engines.json and docs/claim-cost.json as they stand."""
    def load(name: str) -> dict[str, Any] | None:
        path = os.path.join(docs, name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    # The soak of the three systems side by side when one is recorded, else the plain soak.
    soak, engines = load("soak-engines.json") or load("soak.json"), load("engines.json")
    lines = ["## Storage engines (issue 18)", ""]
    if soak is None and engines is None:
        return lines + ["No soak or engines run is recorded (docs/soak.json, docs/engines.json).", ""]

    def source(d: dict[str, Any]) -> str:
        return (f"`{d['command']}`, {d['started']}, {commit_note(d['meta'].get('git', {}))}")

    lines.append("Not measured in the run above: each comes from its own run, written next to this file.")
    lines.append("")
    if soak is not None:
        p = soak["params"]
        runs = {r["system"]: r for r in soak["runs"]}
        name = "soak-engines.md" if os.path.exists(os.path.join(docs, "soak-engines.json")) else "soak.md"
        short = (f" **A short run: {p['duration_s']:,.0f} s per system; the issue asks for "
                 f"{FULL_SOAK_S:,.0f}.**" if p["duration_s"] < FULL_SOAK_S else "")
        lines.append(f"**Soak** ([{name}]({name}): {source(soak)}): each system in turn, "
                     f"{p['rate']:,.0f} jobs/s offered for {p['duration_s']:,.0f} s, completed jobs kept "
                     f"{p['retention_s']:g} s, autovacuum {soak.get('autovacuum', '?')}.{short}")
        lines.append("")
        lines.append("| system | processed | dead tuples per job (≤ 1 %) | size growth from minute "
                     f"{p['duration_s'] / 180:.3g} (≤ 10 %) | backlog at the end (≤ 2 s of load) | WAL bytes per job |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
        for system, label in SOAK_SYSTEMS:
            rec = runs.get(system)
            if rec is None:
                continue
            if not rec.get("ok"):
                lines.append(f"| {label} | failed: {str(rec.get('error'))[:100]} | | | | |")
                continue
            j = rec["judged"]
            v = j["verdicts"]

            def mark(ok: bool) -> str:
                return "met" if ok else "**missed**"

            lines.append(f"| {label} | {j['processed']:,} | {j['dead_per_job']:.2%} {mark(v['dead'])} | "
                         f"{j['growth']:+.1%} {mark(v['growth'])} | {j['backlog_end']:,} {mark(v['backlog'])} | "
                         f"{j['wal_bytes_per_job']:,.0f} |")
        lines.append("")
    if engines is not None:
        sm, p = engines["summary"], engines["params"]
        lines.append(f"**Drain, WAL and idle pickup** ([engines.md](engines.md): {source(engines)}): our Rust "
                     f"runtime on each engine, {p['rounds']} rounds of {p['jobs']:,} no-op jobs and "
                     f"{p['pickups']} idle pickups; medians, the ratio is queue storage / canonical.")
        lines.append("")
        lines.append("| figure | canonical | queue storage | ratio | needed | met |")
        lines.append("| --- | ---: | ---: | ---: | --- | --- |")
        needs = [("jobs_per_s", "drain, jobs/s", "≥ 1.0×", "{:,.0f}"),
                 ("wal_bytes_per_job", "WAL bytes per job", "≤ 0.8×", "{:,.0f}"),
                 ("pickup_p99_ms", "idle pickup p99, ms", "≤ 1.0×", "{:.2f}"),
                 ("pickup_p50_ms", "idle pickup p50, ms", "", "{:.2f}")]
        eng = sm.get("engines", {})
        for key, label, need, fmt in needs:
            if "canonical" not in eng or "queue_storage" not in eng:
                break
            c, q = eng["canonical"][key]["median"], eng["queue_storage"][key]["median"]
            verdict = sm.get("verdicts", {}).get(key)
            met = "" if verdict is None else ("met" if verdict else "**missed**")
            lines.append(f"| {label} | {fmt.format(c)} | {fmt.format(q)} | {sm['ratios'][key]:.2f}× | {need} | {met} |")
        lines.append("")
    claims = load("claim-cost.json")
    if claims is not None:
        cs, p = claims["summary"], claims["params"]
        lines.append(f"**What one idle claim costs** ([claim-cost.md](claim-cost.md): {source(claims)}): "
                     f"`pgbench`, one client, {p['rounds']} rounds of {p['loops']:,} loops (insert one job, "
                     "claim it, complete it); the claim's latency as the client sees it, medians; the "
                     "ratio is over canonical's. The last is not a correct claim: the least a claim on "
                     "queue storage's tables can cost ([why](queue-storage-design.md)).")
        lines.append("")
        lines.append("| claim | ms | ratio |")
        lines.append("| --- | ---: | ---: |")
        labels = [("canonical", "canonical"), ("queue_storage", "queue storage"),
                  ("one_statement", "one statement on queue storage's tables")]
        for key, label in labels:
            if key in cs.get("claims", {}) and key in cs.get("ratios", {}):
                lines.append(f"| {label} | {cs['claims'][key]['median']:.3f} | {cs['ratios'][key]:.2f}× |")
        lines.append("")
    return lines


def render_markdown(data: dict[str, Any]) -> str:
    summary, order, meta = data["summary"], data["systems"], data["meta"]
    labels = {s: data["labels"][s] for s in order}
    quick = meta.get("quick", False)
    lines: list[str] = []
    lines.append("<!-- GENERATED by bench/orchestrate.py from " + ("a quick run" if quick else "docs/benchmarks.json")
                 + ": do not edit. Regenerate with `bash bench/run.sh` (measure again) or "
                 "`python3 bench/orchestrate.py --render docs/benchmarks.json` (re-render). -->")
    lines.append("")
    if quick:
        lines.append("# Benchmarks — QUICK RUN (smoke sizes, 1 round; not the committed results)")
        lines.append("")
        lines.append("A `--quick` run checks that the pipeline works; its sizes are too small for its numbers "
                     "to mean much. The committed results are `docs/benchmarks.md`, written by a full run.")
    else:
        lines.append("# Benchmarks")
        lines.append("")
        lines.append("Awa next to awa-pg 0.6.9, PgQueuer and Procrastinate on one PostgreSQL, plus our Rust runtime "
                     "and the floor (our own SQL with no runtime). This file, `docs/benchmarks.json` (every run) and "
                     "`docs/benchmarks.png` are written together by one `bash bench/run.sh`; how each workload is "
                     "measured and each system configured: [benchmarks-method.md](benchmarks-method.md).")
    lines.append("")
    lines.append("Reproduce (from the repository root):")
    lines.append("")
    lines.append("```")
    lines.append(meta["command"])
    lines.append("```")
    lines.append("")
    lines.append("## Run")
    lines.append("")
    lines.append(f"- code: {commit_note(meta.get('git', {}))}")
    lines.append(f"- when: {meta['started']} to {meta['finished']} (UTC)")
    lines.append(f"- machine: {meta['machine']}")
    if meta.get("load"):
        lines.append(f"- load average (1 min) at start / end: {meta['load'].get('start', '?')} / {meta['load'].get('end', '?')}")
    pg = meta["postgres"]
    lines.append(f"- PostgreSQL {pg['version']} ({', '.join(f'{k}={v}' for k, v in pg['settings'].items())})")
    tools = meta.get("tools", {})
    lines.append(f"- Python {meta.get('python', '?')}" + "".join(f", {k} {v}" for k, v in tools.items() if v))
    lines.append(f"- {meta['rounds']} round(s), interleaved; sizes: "
                 + ", ".join(f"{w} {n:,}" for w, n in meta["sizes"].items()) + f"; {meta['workers']} workers; "
                 f"floor sweep `{meta.get('floor', {}).get('sweep', '?')}`"
                 + "".join(f"; {s} capped at " + ", ".join(f"{w} {n:,}" for w, n in c.items())
                           for s, c in meta.get("caps", {}).items()))
    if meta.get("schedule"):
        lines.append(f"- order in each round: {meta['schedule']}")
    lines.append("")
    lines.append("## Results")
    lines.append("")
    lines.append("Each cell: median (min–max) over the rounds. **Bold ratio**: that system's median over "
                 "awa-pg 0.6.9's (its queue-storage engine's for the count-returning COPY, which only that "
                 "engine has; for rates, higher is better; for the rest, lower is better).")
    lines.append("")
    head = "| measurement | unit | " + " | ".join(labels[s] for s in order) + " |"
    lines.append(head)
    lines.append("|" + " --- |" * (2 + len(order)))
    for workload, path, label, unit in METRICS:
        cells = []
        per = summary.get(f"{workload}.{path}", {})
        if not per:
            continue
        for s in order:
            v = per.get(s)
            if not v:
                cells.append("–")
                continue
            cell = fmt_num(v["median"], unit)
            if v["n"] > 1:
                cell += f" ({fmt_num(v['min'], unit)}–{fmt_num(v['max'], unit)})"
            base_name = RATIO_BASE.get(workload, "awa-pg")
            base = per.get(base_name)
            if base and s != base_name and base["median"]:
                cell += f" **{v['median'] / base['median']:.2f}×**"
            cells.append(cell)
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    once = summary.get("staging.exactly_once", {})
    if once:
        lines.append("| every follow-up inserted exactly once | – | "
                     + " | ".join(("yes" if once[s] else "**NO**") if s in once else "–" for s in order) + " |")
    lines.append("")
    sweep = summary.get("floor.sweep", {})
    if sweep:
        lines.append("### The floor's sweep")
        lines.append("")
        lines.append("The engine's own claim (`storage::claim::claim_batch`) and completion "
                     "(`finalizer::batched::complete_batch`) statements, nothing else, on a freshly filled and "
                     "vacuumed table. BxK: B jobs per claim on K connections; p: pipelined (each connection's "
                     "next claim is sent while its previous batch's completion is in flight). The best point is "
                     "the floor, the most a runtime could drain with our SQL on this machine.")
        lines.append("")
        lines.append("| point | jobs/s, median (min–max) | commits per job |")
        lines.append("| --- | --- | --- |")
        for point, v in sweep.items():
            rng = f" ({v['min']:,.0f}–{v['max']:,.0f})" if v["n"] > 1 else ""
            lines.append(f"| {point} | {v['median']:,.0f}{rng} | {v['commits_per_job']:.3f} |")
        lines.append("")
    lines.append("## Targets, judged on this run's medians")
    lines.append("")
    lines.append("Computed by `bench/orchestrate.py` (`targets()`) from the data above.")
    lines.append("")
    lines.append("| issue | target | measured | needed | status |")
    lines.append("| --- | --- | --- | --- | --- |")
    for t in data["targets"]:
        val = "–" if t["value"] is None else t["fmt"].format(t["value"])
        need = ("≤ " if t["le"] else "≥ ") + t["fmt"].format(t["need"])
        status = t["status"] if t["status"] != "MISSED" else "**missed**"
        detail = f" ({t['detail']})" if t["detail"] else ""
        lines.append(f"| {t.get('issue', '')} | {t['target']} | {val}{detail} | {need} | {status} |")
    lines.append("")
    failures = [r for r in data["runs"] if not r.get("ok")]
    if failures:
        lines.append("## Runs that failed or were unavailable")
        lines.append("")
        seen = set()
        for r in failures:
            key = (r["system"], r["workload"], r.get("error"))
            if key in seen:
                continue
            seen.add(key)
            kind = "unavailable" if r.get("unavailable") else "failed"
            lines.append(f"- {r['system']} / {r['workload']}: {kind}: `{(r.get('error') or '')[:300]}`")
        lines.append("")
    if not quick:
        lines += storage_engines_section()
    lines.append("## Settings used (as each run reported them)")
    lines.append("")
    for s in order:
        st = sorted({str(r["result"].get("settings")) for r in data["runs"]
                     if r["system"] == s and r.get("ok") and r.get("result", {}).get("settings")})
        apis = sorted({f"{r['workload']}: {r['result'].get('api')}"
                       + (f" (returns {r['result']['returns']})" if r["result"].get("returns") else "")
                       for r in data["runs"]
                       if r["system"] == s and r.get("ok") and r.get("result", {}).get("api")})
        ver = next((r["result"].get("system") for r in data["runs"] if r["system"] == s and r.get("ok") and r.get("result", {}).get("system")), None)
        bits = []
        if ver:
            bits.append(", ".join(f"{k} {v}" for k, v in ver.items() if k != "name"))
        if st:
            bits.append("; ".join(st))
        if apis:
            bits.append("; ".join(apis))
        lines.append(f"- **{labels[s]}**: " + (" — ".join(bits) if bits else "(no successful run)"))
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# meta


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def git_meta() -> dict[str, Any]:
    """The commit measured (`git rev-parse HEAD`) and whether tracked files differ from it."""
    changed = [ln for ln in sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]).splitlines() if ln]
    return {"commit": sh(["git", "-C", ROOT, "rev-parse", "HEAD"]) or "unknown",
            "branch": sh(["git", "-C", ROOT, "rev-parse", "--abbrev-ref", "HEAD"]),
            "dirty": bool(changed), "dirty_files": len(changed)}


def machine_meta(admin_url: str) -> dict[str, Any]:
    mem_gib = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem_gib = f"{kb / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    settings = {}
    for name in ("shared_buffers", "synchronous_commit", "fsync", "wal_level", "max_connections"):
        try:
            settings[name] = psql(admin_url, f"SHOW {name}")
        except RuntimeError:
            pass
    host = urllib.parse.urlsplit(admin_url).hostname or "local socket"
    return {
        "machine": f"{os.cpu_count()} cores ({cpu or platform.machine()}), {mem_gib} RAM, "
                   f"{platform.system()} {platform.release()}; PostgreSQL at {host}",
        "postgres": {"version": psql(admin_url, "SHOW server_version"), "settings": settings},
        "git": git_meta(),
        "python": platform.python_version(),
        "tools": {"rustc": sh(["rustc", "--version"]).removeprefix("rustc ")},
        "load": {"start": load_average()},
    }


def write_report(data: dict[str, Any], json_path: str, document: Callable[[str], str], script: str) -> None:
    """Write a run's JSON, its markdown report (``document(png_name)``) beside it, and its chart,
    drawn by ``script --plot JSON PNG`` in the bench-only plotting virtualenv when it exists
    (the soak and the engines comparison share this)."""
    md_path = os.path.splitext(json_path)[0] + ".md"
    png_path = os.path.splitext(json_path)[0] + ".png"
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    text = document(os.path.basename(png_path))
    with open(md_path, "w") as f:
        f.write(text)
    print(text)
    plot_python = os.path.join(VENVS, "plot", "bin", "python")
    if os.path.exists(plot_python):
        r = subprocess.run([plot_python, os.path.abspath(script), "--plot", json_path, png_path],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            print(f"(chart not drawn: {r.stderr.strip()[-500:]})", file=sys.stderr)
    print(f"==> {os.path.relpath(md_path, ROOT)}")


def report_args(p: argparse.ArgumentParser, plot: Callable[[str, str], None],
                 write: Callable[[dict[str, Any], str], None]) -> argparse.Namespace | None:
    """Parse a report script's arguments, adding the two every such script takes: ``--render
    JSON`` (write the report again from a run's JSON, without measuring) and ``--plot JSON PNG``
    (draw the chart; ``write_report`` calls it in the plotting virtualenv). Returns None when one
    of them was given and done (the soak, the engines comparison and the claim cost share this)."""
    p.add_argument("--render", metavar="JSON", help="re-render a run's report without measuring")
    p.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.plot:
        plot(*args.plot)
        return None
    if args.render:
        with open(args.render) as f:
            write(json.load(f), args.render)
        return None
    return args


def run_record(command: str, admin_url: str, params: dict[str, Any]) -> dict[str, Any]:
    """The start of a report script's JSON: how it was run, when, on what, and whether the
    server vacuums on its own (which decides what the canonical engine leaves behind)."""
    return {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "meta": machine_meta(admin_url),
        "autovacuum": psql(admin_url, "SHOW autovacuum"),
        "params": params,
        "runs": [],
    }


def check(json_path: str, md_path: str) -> int:
    """Exit status 0 when ``md_path`` is exactly what ``json_path`` renders to."""
    with open(json_path) as f:
        data = json.load(f)
    want = document(data, os.path.splitext(os.path.basename(md_path))[0] + ".png")
    with open(md_path) as f:
        have = f.read()
    if have == want:
        print(f"{os.path.relpath(md_path, ROOT)} matches {os.path.relpath(json_path, ROOT)}")
        return 0
    print(f"{os.path.relpath(md_path, ROOT)} is not what {os.path.relpath(json_path, ROOT)} renders to; "
          f"run: python3 bench/orchestrate.py --render {os.path.relpath(json_path, ROOT)}", file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small sizes, 1 round (a smoke run); writes bench/results/quick.* only")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--systems", default="awa,awa-rust,awa-pg,awa-pg-qs,pgqueuer,procrastinate,floor")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--poll-ms", type=int, default=50)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--floor-sweep", default=None,
                   help=f"floor points BxK[p|d], comma separated (default {FULL_FLOOR_SWEEP}; quick {QUICK_FLOOR_SWEEP})")
    for w in WORKLOADS:
        p.add_argument(f"--{w.replace('_', '-')}-jobs", type=int, default=None, dest=f"n_{w}")
    p.add_argument("--rust-bin", default=os.path.join(os.path.expanduser("~"), ".cache", "awa-target-bench", "release", "awa-bench"))
    p.add_argument("--out", default=None,
                   help="results JSON (default docs/benchmarks.json; with --quick bench/results/quick.json)")
    p.add_argument("--docs", default=None,
                   help="report to write, the chart goes next to it (default: next to --out, docs/benchmarks.md)")
    p.add_argument("--plot-python", default=os.path.join(VENVS, "plot", "bin", "python"))
    p.add_argument("--command", default=None, help="the command line to print as 'reproduce'")
    p.add_argument("--render", default=None, metavar="RESULTS_JSON",
                   help="only re-render the report and chart from a results file (next to it unless --docs)")
    p.add_argument("--check", action="store_true",
                   help="only check that docs/benchmarks.md is what docs/benchmarks.json renders to")
    args = p.parse_args()
    if args.check:
        sys.exit(check(args.out or FULL_JSON, args.docs or FULL_MD))
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        if args.command:
            data["meta"]["command"] = args.command
        docs_path = args.docs or os.path.splitext(args.render)[0] + ".md"
        report(data, args.render, docs_path, args.plot_python)
        return

    admin_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    rounds = args.rounds or (1 if args.quick else 5)
    sizes = dict(QUICK_SIZES if args.quick else FULL_SIZES)
    for w in WORKLOADS:
        v = getattr(args, f"n_{w}")
        if v is not None:
            sizes[w] = v
    args.sizes = sizes
    args.floor_sweep = args.floor_sweep or (QUICK_FLOOR_SWEEP if args.quick else FULL_FLOOR_SWEEP)
    wanted_systems = [s for s in args.systems.split(",") if s]
    wanted_workloads = [w for w in args.workloads.split(",") if w]
    registry = systems(args.rust_bin)
    for s in wanted_systems:
        if s not in registry:
            sys.exit(f"unknown system {s}; known: {', '.join(registry)}")
    for w in wanted_workloads:
        if w not in WORKLOADS:
            sys.exit(f"unknown workload {w}; known: {', '.join(WORKLOADS)}")
    results_dir = os.path.join(BENCH, "results")
    os.makedirs(results_dir, exist_ok=True)
    out_path = args.out or (os.path.join(results_dir, "quick.json") if args.quick else FULL_JSON)
    docs_path = args.docs or os.path.splitext(out_path)[0] + ".md"
    # The adapters' output is a log, not evidence: it stays in the ignored bench/results/.
    log_path = os.path.join(results_dir, ("quick" if args.quick else "full") + ".log")
    open(log_path, "w").close()

    meta = machine_meta(admin_url)
    meta.update(
        quick=bool(args.quick),
        started=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        rounds=rounds, sizes={w: sizes[w] for w in wanted_workloads}, workers=args.workers,
        poll_ms=args.poll_ms, interval_ms=args.interval_ms,
        floor={"sweep": args.floor_sweep},
        caps={s: registry[s]["max_jobs"] for s in wanted_systems if registry[s].get("max_jobs")},
        schedule="workload by workload, except the floor, which runs right after our runtimes' drains (its "
                 "target compares the two back to back, round by round); a CHECKPOINT before every run",
        command=args.command or ("bash bench/run.sh" + (" --quick" if args.quick else "")),
    )
    print(f"==> {meta['machine']}; PostgreSQL {meta['postgres']['version']}; {rounds} round(s); "
          f"commit {meta['git']['commit'][:12]}{' (dirty)' if meta['git']['dirty'] else ''}", flush=True)

    if meta["git"]["dirty"] and not args.quick:
        print(f"==> WARNING: {meta['git']['dirty_files']} tracked file(s) differ from HEAD: the report will say "
              "'plus uncommitted changes'; commit first for a report that names exactly what it measured",
              flush=True)

    runs: list[dict[str, Any]] = []
    pid = os.getpid()
    order_of_round = schedule(wanted_workloads, wanted_systems, registry)
    for rnd in range(1, rounds + 1):
        for workload, sysname in order_of_round:
            spec = registry[sysname]
            dbname = re.sub(r"[^a-z0-9_]", "_", f"awabench_{pid}_{sysname}_{workload}_r{rnd}")
            fresh_db(admin_url, dbname)
            t0 = time.monotonic()
            try:
                out = run_one(spec, sysname, workload, admin_url, dbname, args, log_path)
            finally:
                drop_db(admin_url, dbname)
            rec = {"round": rnd, "workload": workload, "system": sysname, "ok": bool(out.get("ok")),
                   "wall_s": round(time.monotonic() - t0, 2)}
            if out.get("ok"):
                rec["result"] = out["result"]
            else:
                rec["error"] = out.get("error")
                rec["unavailable"] = bool(out.get("unavailable"))
            runs.append(rec)
            print(f"  round {rnd} {workload:18s} {sysname:14s} " + brief(rec), flush=True)

    meta["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    meta["load"]["end"] = load_average()
    summary = summarize(runs)
    order = [s for s in wanted_systems if any(r["system"] == s for r in runs)]
    data = {"meta": meta, "systems": order, "labels": {s: registry[s]["label"] for s in order},
            "runs": runs, "summary": summary, "targets": targets(summary)}
    with open(out_path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    print(f"==> results: {os.path.relpath(out_path, ROOT)} (log: {os.path.relpath(log_path, ROOT)})")

    report(data, out_path, docs_path, args.plot_python)


def document(data: dict[str, Any], png_name: str) -> str:
    """The whole report file: the rendered markdown and the chart's link."""
    return render_markdown(data) + f"\n![benchmark chart]({png_name})\n"


def report(data: dict[str, Any], json_path: str, docs_path: str, plot_python: str) -> None:
    """Print the report, draw the chart next to it and write it."""
    png_path = os.path.splitext(docs_path)[0] + ".png"
    text = document(data, os.path.basename(png_path))
    print()
    print(text)
    if os.path.exists(plot_python):
        r = subprocess.run([plot_python, os.path.join(BENCH, "plot.py"), json_path, png_path],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            print(f"(chart not drawn: {r.stderr.strip()[-500:]})", file=sys.stderr)
    else:
        print("(chart not drawn: no plotting virtualenv; run bench/run.sh)", file=sys.stderr)
    with open(docs_path, "w") as f:
        f.write(text)
    print(f"==> report: {os.path.relpath(docs_path, ROOT)}, chart: {os.path.relpath(png_path, ROOT)}")


def brief(rec: dict[str, Any]) -> str:
    if not rec["ok"]:
        return ("unavailable: " if rec.get("unavailable") else "FAILED: ") + str(rec.get("error"))[:160]
    r = rec["result"]
    bits = []
    if "jobs_per_s" in r:
        bits.append(f"{r['jobs_per_s']:,.0f} jobs/s")
    if "p50_ms" in r:
        bits.append(f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms")
    if "db" in r:
        bits.append(f"{r['db']['commits_per_job']:.3f} commits/job, {r['db']['wal_bytes_per_job']:,.0f} WAL B/job, "
                    f"{r['db']['dead_tuples']:,} dead")
    if "exactly_once" in r:
        bits.append("exactly once" if r["exactly_once"] else "NOT exactly once")
    return "; ".join(bits) + f"  [{rec['wall_s']}s]"


if __name__ == "__main__":
    main()
