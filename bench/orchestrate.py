"""Run the benchmark: every workload, every system, interleaved, several rounds.

Started by ``bench/run.sh`` (which prepares the virtualenvs, the wheel and the Rust binary);
standard library only. For each round, for each workload, each system that implements it
runs once (A, B, C, A, B, C, ...), each run in its own subprocess with that system's
virtualenv and on its own fresh database (created before, dropped after). The results go to
a JSON file, a markdown report and a PNG chart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
import urllib.parse
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
VENVS = os.path.join(BENCH, ".venvs")
RESULT_PREFIX = "BENCH_RESULT "

WORKLOADS = ["enqueue_single", "enqueue_bulk", "drain", "latency", "staging", "floor"]

FULL_SIZES = {"enqueue_single": 2000, "enqueue_bulk": 20000, "drain": 20000, "latency": 100, "staging": 20000, "floor": 20000}
QUICK_SIZES = {"enqueue_single": 200, "enqueue_bulk": 2000, "drain": 2000, "latency": 30, "staging": 1000, "floor": 2000}

PY_WORKLOADS = ["enqueue_single", "enqueue_bulk", "drain", "latency", "staging"]


def systems(rust_bin: str) -> dict[str, dict[str, Any]]:
    """Every system: how to run it and which workloads it has."""
    def py(venv: str, adapter: str, label: str) -> dict[str, Any]:
        return {
            "label": label,
            "cmd": [os.path.join(VENVS, venv, "bin", "python"), os.path.join(BENCH, "systems", adapter)],
            "workloads": {w: w for w in PY_WORKLOADS},
        }

    return {
        "awa": py("awa", "awa_queue.py", "awa (ours, Python)"),
        "awa-rust": {
            "label": "awa (ours, Rust handler)",
            "cmd": [rust_bin],
            "workloads": {"enqueue_single": "enqueue_single", "drain": "drain", "staging": "staging"},
        },
        # awa-pg 0.6.9 runs on its canonical engine after migrate() (the faster one for
        # draining here); its queue-storage engine has the COPY ingestion (enqueue_many_copy),
        # so it is measured separately for inserts and pickup.
        "awa-pg": dict(py("awa_pg", "awa_pg.py", "awa-pg 0.6.9"), env={"AWA_PG_ENGINE": "canonical"}),
        "awa-pg-qs": dict(
            py("awa_pg", "awa_pg.py", "awa-pg 0.6.9, queue storage"),
            env={"AWA_PG_ENGINE": "queue_storage"},
            workloads={w: w for w in ("enqueue_single", "enqueue_bulk", "latency")},
        ),
        "pgqueuer": py("pgqueuer", "pgqueuer_sys.py", "pgqueuer"),
        "procrastinate": py("procrastinate", "procrastinate_sys.py", "procrastinate"),
        "floor": {
            "label": "floor (our SQL, no runtime)",
            "cmd": [rust_bin],
            "workloads": {"floor": "floor"},
        },
        "floor-64": {
            "label": "floor, 64 per claim",
            "cmd": [rust_bin],
            "workloads": {"floor": "floor"},
            "floor_batch": 64,
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
    return with_db(admin_url, name)


def drop_db(admin_url: str, name: str) -> None:
    try:
        psql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except RuntimeError as e:
        print(f"  (could not drop {name}: {e})", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# one run


MEASURE_DB = {"drain", "staging", "floor"}


def call(spec: dict[str, Any], system: str, workload: str, phase: str, url: str, args: argparse.Namespace,
         log_path: str) -> dict[str, Any]:
    """Run one phase of one workload in a subprocess; returns its parsed result line."""
    n = args.sizes[workload]
    cmd = list(spec["cmd"]) + [spec["workloads"][workload], "--phase", phase, "--url", url, "--jobs", str(n)]
    if workload in ("drain", "staging", "latency"):
        cmd += ["--workers", str(args.workers), "--poll-ms", str(args.poll_ms)]
    if workload == "latency":
        cmd += ["--interval-ms", str(args.interval_ms)]
    if workload == "floor":
        cmd += ["--batch", str(spec.get("floor_batch", args.floor_batch)), "--loops", str(args.floor_loops)]
    timeout = 120 + n / 15
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
    out = call(spec, system, workload, "run", url, args, log_path)
    if not out.get("ok"):
        return out
    result = out["result"]
    if measure:
        c1, _, left = read_stats(admin_url, dbname)
        wal = float(psql(admin_url, f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn0}'::pg_lsn)"))
        dead, live = (int(x) for x in psql(
            url, "SELECT coalesce(sum(n_dead_tup), 0) || ' ' || coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables"
        ).split())
        commits = c1 - c0 - int(result.get("own_txns", 0))
        per = max(args.sizes[workload], 1)
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
    if "completed" in result and result["completed"] != args.sizes[workload]:
        return {"ok": False, "error": f"only {result['completed']} of {args.sizes[workload]} jobs completed", "result": result}
    return {"ok": True, "result": result}


# ---------------------------------------------------------------------------------------------
# summaries


METRICS: list[tuple[str, str, str, str]] = [
    # (workload, key path, label, unit)
    ("enqueue_single", "jobs_per_s", "single inserts (one commit each)", "jobs/s"),
    ("enqueue_bulk", "jobs_per_s", "bulk insert (fastest bulk API)", "jobs/s"),
    ("drain", "jobs_per_s", "drain, no-op handler, 32 workers", "jobs/s"),
    ("latency", "p50_ms", "idle pickup p50 (insert call to handler start)", "ms"),
    ("latency", "p99_ms", "idle pickup p99", "ms"),
    ("latency", "from_commit_p50_ms", "idle pickup p50 from insert commit", "ms"),
    ("staging", "jobs_per_s", "drain, each job stages one unique follow-up", "jobs/s"),
    ("drain", "db.commits_per_job", "commits per completed job (drain)", "commits"),
    ("drain", "db.wal_bytes_per_job", "WAL bytes per completed job (drain)", "bytes"),
    ("drain", "db.dead_tuples", "dead tuples left after the drain", "tuples"),
    ("staging", "db.commits_per_job", "commits per job (staging drain)", "commits"),
    ("staging", "db.wal_bytes_per_job", "WAL bytes per job (staging drain)", "bytes"),
    ("floor", "jobs_per_s", "floor: claim + complete statements, no runtime", "jobs/s"),
    ("floor", "db.commits_per_job", "floor: commits per job", "commits"),
]

HIGHER_IS_BETTER = {"jobs_per_s"}


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
    return summary


def med(summary: dict[str, Any], key: str, system: str) -> float | None:
    v = summary.get(key, {}).get(system)
    return v["median"] if v else None


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, judged on the medians of this one run."""
    out = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def add(name: str, value: float | None, need: float, fmt: str, le: bool = False, detail: str = "") -> None:
        if value is None:
            status = "not measured"
        else:
            status = "met" if (value <= need if le else value >= need) else "MISSED"
        out.append({"target": name, "value": value, "need": need, "fmt": fmt, "le": le, "status": status, "detail": detail})

    d_awa = med(summary, "drain.jobs_per_s", "awa")
    add("Python no-op drain vs awa-pg 0.6.9", ratio(d_awa, med(summary, "drain.jobs_per_s", "awa-pg")), 4.0, "{:.2f}×")
    add("Python no-op drain vs pgqueuer", ratio(d_awa, med(summary, "drain.jobs_per_s", "pgqueuer")), 3.0, "{:.2f}×")
    add("Rust no-op drain vs the floor", ratio(med(summary, "drain.jobs_per_s", "awa-rust"), med(summary, "floor.jobs_per_s", "floor")), 0.60, "{:.0%}")
    add("single inserts vs pgqueuer", ratio(med(summary, "enqueue_single.jobs_per_s", "awa"), med(summary, "enqueue_single.jobs_per_s", "pgqueuer")), 1.0, "{:.2f}×")
    copy = med(summary, "enqueue_bulk.jobs_per_s", "awa-pg-qs") or med(summary, "enqueue_bulk.jobs_per_s", "awa-pg")
    add("bulk insert vs awa-pg COPY (enqueue_many_copy)", ratio(med(summary, "enqueue_bulk.jobs_per_s", "awa"), copy), 1.0, "{:.2f}×")
    add("idle pickup p50", med(summary, "latency.p50_ms", "awa"), 5.0, "{:.1f} ms", le=True)
    add("idle pickup p99", med(summary, "latency.p99_ms", "awa"), 15.0, "{:.1f} ms", le=True)
    once = summary.get("staging.exactly_once", {}).get("awa")
    add("staging drain vs plain drain (Python)", ratio(med(summary, "staging.jobs_per_s", "awa"), d_awa), 0.50, "{:.0%}",
        detail="" if once is None else f"follow-ups inserted exactly once: {'yes' if once else 'NO'}")
    once_r = summary.get("staging.exactly_once", {}).get("awa-rust")
    add("staging drain vs plain drain (Rust)", ratio(med(summary, "staging.jobs_per_s", "awa-rust"), med(summary, "drain.jobs_per_s", "awa-rust")), 0.50, "{:.0%}",
        detail="" if once_r is None else f"follow-ups inserted exactly once: {'yes' if once_r else 'NO'}")
    add("commits per plain completion (Python drain)", med(summary, "drain.db.commits_per_job", "awa"), 0.05, "{:.3f}", le=True)
    add("commits per plain completion (Rust drain)", med(summary, "drain.db.commits_per_job", "awa-rust"), 0.05, "{:.3f}", le=True)
    return out


# ---------------------------------------------------------------------------------------------
# report


def fmt_num(v: float, unit: str) -> str:
    if unit in ("jobs/s", "bytes", "tuples"):
        return f"{v:,.0f}"
    if unit == "ms":
        return f"{v:.1f}"
    return f"{v:.3f}"


def render_markdown(data: dict[str, Any]) -> str:
    summary, order, meta = data["summary"], data["systems"], data["meta"]
    labels = {s: data["labels"][s] for s in order}
    lines: list[str] = []
    lines.append(f"Measured {meta['finished']} on {meta['machine']}; PostgreSQL {meta['postgres']['version']} "
                 f"({', '.join(f'{k}={v}' for k, v in meta['postgres']['settings'].items())}).")
    git = meta.get("git", {})
    if git.get("commit"):
        lines.append(f"Code: commit {git['commit']}" + (" plus uncommitted changes in the working tree" if git.get("dirty") else "") + ".")
    lines.append(f"{meta['rounds']} round(s), interleaved; sizes: "
                 + ", ".join(f"{w} {n:,}" for w, n in meta["sizes"].items()) + f"; {meta['workers']} workers.")
    lines.append("")
    lines.append("Reproduce (from the repository root):")
    lines.append("")
    lines.append("```")
    lines.append(meta["command"])
    lines.append("```")
    lines.append("")
    lines.append("Each cell: median (min–max) over the rounds. Ratio columns: that system's median over "
                 "awa-pg 0.6.9's (for rates, higher is better; for the rest, lower is better).")
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
            base = per.get("awa-pg")
            if base and s != "awa-pg" and base["median"]:
                cell += f" **{v['median'] / base['median']:.2f}×**"
            cells.append(cell)
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    once = summary.get("staging.exactly_once", {})
    if once:
        lines.append("| every follow-up inserted exactly once | – | "
                     + " | ".join(("yes" if once[s] else "**NO**") if s in once else "–" for s in order) + " |")
    lines.append("")
    lines.append("### Targets (issue 7), judged on this run's medians")
    lines.append("")
    lines.append("| target | measured | needed | status |")
    lines.append("| --- | --- | --- | --- |")
    for t in data["targets"]:
        val = "–" if t["value"] is None else t["fmt"].format(t["value"])
        need = ("≤ " if t["le"] else "≥ ") + t["fmt"].format(t["need"])
        status = t["status"] if t["status"] != "MISSED" else "**missed**"
        detail = f" ({t['detail']})" if t["detail"] else ""
        lines.append(f"| {t['target']} | {val}{detail} | {need} | {status} |")
    lines.append("")
    failures = [r for r in data["runs"] if not r.get("ok")]
    if failures:
        lines.append("### Runs that failed or were unavailable")
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
    lines.append("### Settings used")
    lines.append("")
    for s in order:
        st = sorted({str(r["result"].get("settings")) for r in data["runs"]
                     if r["system"] == s and r.get("ok") and r.get("result", {}).get("settings")})
        apis = sorted({f"{r['workload']}: {r['result'].get('api')}" for r in data["runs"]
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


BEGIN = "<!-- BEGIN GENERATED: bench/orchestrate.py writes between these markers -->"
END = "<!-- END GENERATED -->"


def write_docs(path: str, generated: str, png_name: str | None) -> None:
    block = BEGIN + "\n" + generated + ("\n![benchmark chart](" + png_name + ")\n" if png_name else "") + END
    if os.path.exists(path):
        text = open(path).read()
        if BEGIN in text and END in text:
            pre, rest = text.split(BEGIN, 1)
            _, post = rest.split(END, 1)
            text = pre + block + post
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    else:
        text = "# Benchmarks\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


# ---------------------------------------------------------------------------------------------
# meta


def machine_meta(admin_url: str) -> dict[str, Any]:
    def sh(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return ""

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
    return {
        "machine": f"{os.cpu_count()} cores ({cpu or platform.machine()}), {mem_gib} RAM, {platform.system()} {platform.release()}",
        "postgres": {"version": psql(admin_url, "SHOW server_version"), "settings": settings},
        "git": {"commit": sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]),
                "dirty": bool(sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]))},
        "python": platform.python_version(),
    }


# ---------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, 1 round (a smoke run)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--systems", default="awa,awa-rust,awa-pg,awa-pg-qs,pgqueuer,procrastinate,floor,floor-64")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--poll-ms", type=int, default=50)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--floor-batch", type=int, default=32, help="floor: jobs per claim (= the 32 workers)")
    p.add_argument("--floor-loops", type=int, default=2, help="floor: concurrent claim/complete loops")
    for w in WORKLOADS:
        p.add_argument(f"--{w.replace('_', '-')}-jobs", type=int, default=None, dest=f"n_{w}")
    p.add_argument("--rust-bin", default=os.path.join(os.path.expanduser("~"), ".cache", "awa-target-bench", "release", "awa-bench"))
    p.add_argument("--out", default=None, help="results JSON (default bench/results/latest.json, quick.json with --quick)")
    p.add_argument("--docs", default=None, help="markdown report to update (default docs/benchmarks.md; with --quick bench/results/quick.md)")
    p.add_argument("--plot-python", default=os.path.join(VENVS, "plot", "bin", "python"))
    p.add_argument("--command", default=None, help="the command line to print as 'reproduce'")
    p.add_argument("--render", default=None, metavar="RESULTS_JSON",
                   help="only re-render the report and chart from an earlier results file")
    args = p.parse_args()
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        if args.command:
            data["meta"]["command"] = args.command
        data["summary"] = summarize(data["runs"])
        data["targets"] = targets(data["summary"])
        docs_path = args.docs or os.path.join(ROOT, "docs", "benchmarks.md")
        report(data, args.render, docs_path, args.plot_python)
        return

    admin_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    rounds = args.rounds or (1 if args.quick else 3)
    sizes = dict(QUICK_SIZES if args.quick else FULL_SIZES)
    for w in WORKLOADS:
        v = getattr(args, f"n_{w}")
        if v is not None:
            sizes[w] = v
    args.sizes = sizes
    wanted_systems = [s for s in args.systems.split(",") if s]
    wanted_workloads = [w for w in args.workloads.split(",") if w]
    registry = systems(args.rust_bin)
    for s in wanted_systems:
        if s not in registry:
            sys.exit(f"unknown system {s}; known: {', '.join(registry)}")
    results_dir = os.path.join(BENCH, "results")
    os.makedirs(results_dir, exist_ok=True)
    out_path = args.out or os.path.join(results_dir, "quick.json" if args.quick else "latest.json")
    docs_path = args.docs or (os.path.join(results_dir, "quick.md") if args.quick else os.path.join(ROOT, "docs", "benchmarks.md"))
    log_path = os.path.splitext(out_path)[0] + ".log"
    open(log_path, "w").close()

    meta = machine_meta(admin_url)
    meta.update(
        started=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        rounds=rounds, sizes={w: sizes[w] for w in wanted_workloads}, workers=args.workers,
        poll_ms=args.poll_ms, interval_ms=args.interval_ms,
        floor={"batch": args.floor_batch, "loops": args.floor_loops},
        command=args.command or ("bash bench/run.sh" + (" --quick" if args.quick else "")),
    )
    print(f"==> {meta['machine']}; PostgreSQL {meta['postgres']['version']}; {rounds} round(s)", flush=True)

    runs: list[dict[str, Any]] = []
    pid = os.getpid()
    for rnd in range(1, rounds + 1):
        for workload in wanted_workloads:
            for sysname in wanted_systems:
                spec = registry[sysname]
                if workload not in spec["workloads"]:
                    continue
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
                print(f"  round {rnd} {workload:15s} {sysname:14s} " + brief(rec), flush=True)

    meta["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    summary = summarize(runs)
    order = [s for s in wanted_systems if any(r["system"] == s for r in runs)]
    data = {"meta": meta, "systems": order, "labels": {s: registry[s]["label"] for s in order},
            "runs": runs, "summary": summary, "targets": targets(summary)}
    with open(out_path, "w") as f:
        json.dump(data, f, indent=2)
    print(f"==> results: {os.path.relpath(out_path, ROOT)} (log: {os.path.relpath(log_path, ROOT)})")

    report(data, out_path, docs_path, args.plot_python)


def report(data: dict[str, Any], json_path: str, docs_path: str, plot_python: str) -> None:
    """Print the table, draw the chart next to the report and update the report."""
    png_path = os.path.splitext(docs_path)[0] + ".png"
    md = render_markdown(data)
    print()
    print(md)
    png_ok = False
    if os.path.exists(plot_python):
        r = subprocess.run([plot_python, os.path.join(BENCH, "plot.py"), json_path, png_path],
                           capture_output=True, text=True, check=False)
        png_ok = r.returncode == 0
        if not png_ok:
            print(f"(chart not drawn: {r.stderr.strip()[-500:]})", file=sys.stderr)
    else:
        print("(chart not drawn: no plotting virtualenv; run bench/run.sh)", file=sys.stderr)
    write_docs(docs_path, md, os.path.basename(png_path) if png_ok else None)
    print(f"==> report: {os.path.relpath(docs_path, ROOT)}" + (f", chart: {os.path.relpath(png_path, ROOT)}" if png_ok else ""))


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
