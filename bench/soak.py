"""The soak (issue 18): a steady offered load for a long time, completed jobs pruned after a
short retention, and what the database looks like meanwhile and after: dead tuples, size on
disk, WAL, backlog. One system after another, each on a fresh database, in one run.

    bash bench/run.sh --soak                      # 30 minutes per system (the issue's soak)
    bash bench/run.sh --soak --duration-s 600     # shorter; the report says how long it ran

The targets it judges (issue 18, "Targets"), for each system:

- dead tuples at the end <= 1 % of the jobs processed;
- database size growth <= 10 % from the first third of the run (minute 10 of 30) to the end;
- no growing backlog: what was inserted and not yet handled is, at the end, at most two
  seconds of the offered load.

Outputs: ``docs/soak.{json,md,png}`` (a run of at least 30 minutes per system), otherwise
``bench/results/soak.{json,md,png}`` (git-ignored). Adapter output: ``bench/results/soak.log``.
Re-render without measuring: ``python3 bench/soak.py --render FILE.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import orchestrate  # noqa: E402  (the databases, the systems and the run's metadata)

BENCH = orchestrate.BENCH
ROOT = orchestrate.ROOT
RESULTS = os.path.join(BENCH, "results")
FULL_DURATION_S = 1800.0
SYSTEMS = ["awa", "awa-pg", "awa-pg-qs"]
DEAD_LIMIT = 0.01  # dead tuples per job processed
GROWTH_LIMIT = 0.10  # size growth from the first third to the end
BACKLOG_LIMIT_S = 2.0  # backlog at the end, in seconds of offered load


def judge(result: dict[str, Any]) -> dict[str, Any]:
    """The soak's figures and verdicts for one system's run."""
    samples = result["samples"]
    last = samples[-1]
    third = next((s for s in samples if s["t"] >= result["seconds"] / 3), samples[0])
    processed = max(result["handled"], 1)
    dead_per_job = last["dead_tuples"] / processed
    growth = (last["db_bytes"] - third["db_bytes"]) / max(third["db_bytes"], 1)
    backlog_limit = BACKLOG_LIMIT_S * result["rate"]
    wal = (last["wal_bytes"] - samples[0]["wal_bytes"]) / processed
    return {
        "processed": result["handled"],
        "offered_per_s": result["offered_per_s"],
        "handled_per_s": result["handled_per_s"],
        "dead_tuples_end": last["dead_tuples"],
        "dead_per_job": dead_per_job,
        "max_dead_tuples": max(s["dead_tuples"] for s in samples),
        "db_bytes_third": third["db_bytes"],
        "db_bytes_end": last["db_bytes"],
        "growth": growth,
        "backlog_end": last["backlog"],
        "backlog_max": max(s["backlog"] for s in samples),
        "wal_bytes_per_job": wal,
        "vacuums": last["vacuums"] - samples[0]["vacuums"],
        "verdicts": {
            "dead": dead_per_job <= DEAD_LIMIT,
            "growth": growth <= GROWTH_LIMIT,
            "backlog": last["backlog"] <= backlog_limit,
        },
    }


def run_system(system: str, spec: dict[str, Any], admin_url: str, args: argparse.Namespace,
               log_path: str) -> dict[str, Any]:
    dbname = f"awa_soak_{system.replace('-', '_')}"
    url = orchestrate.fresh_db(admin_url, dbname)
    cmd = list(spec["cmd"]) + ["soak", "--phase", "all", "--url", url, "--workers", str(args.workers),
                               "--poll-ms", str(args.poll_ms), "--rate", str(args.rate),
                               "--duration-s", str(args.duration_s), "--sample-s", str(args.sample_s),
                               "--retention-s", str(args.retention_s)]
    env = dict(os.environ, **spec.get("env", {}))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH, env=env, check=False,
                              timeout=args.duration_s + 300)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = None
    finally:
        orchestrate.drop_db(admin_url, dbname)
    with open(log_path, "a") as f:
        f.write(f"\n===== {system} soak rc={rc} ({time.monotonic() - t0:.1f}s)\n{stdout}{stderr}")
    lines = [ln for ln in stdout.splitlines() if ln.startswith(orchestrate.RESULT_PREFIX)]
    if rc is None or not lines:
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"system": system, "ok": False, "error": "timed out" if rc is None else f"exit {rc}: {tail}"}
    out = json.loads(lines[-1][len(orchestrate.RESULT_PREFIX):])
    if not out.get("ok"):
        return {"system": system, "ok": False, "error": out.get("error", "failed")}
    return {"system": system, "label": spec["label"], "ok": True, "result": out["result"],
            "judged": judge(out["result"])}


def mib(n: float) -> str:
    return f"{n / 1024 / 1024:,.1f} MiB"


def render(data: dict[str, Any]) -> str:
    p = data["params"]
    full = p["duration_s"] >= FULL_DURATION_S
    lines = [
        "# Soak: what a sustained load leaves in the database" + ("" if full else " (SHORT RUN)"),
        "",
        f"Generated by `{data['command']}` from {orchestrate.commit_note(data['meta']['git'])}, "
        f"{data['started']}. {data['meta']['machine']}; PostgreSQL {data['meta']['postgres']['version']}.",
        "",
        f"Each system in turn, on a fresh database: {p['rate']:,.0f} jobs/s offered for "
        f"{p['duration_s']:,.0f} s (a bulk insert every 50 ms), {p['workers']} workers, no-op handlers, "
        f"completed jobs pruned after {p['retention_s']:g} s (by each system's pruner, at its default interval), "
        f"**autovacuum {data.get('autovacuum', 'not recorded')}** (the server's setting). "
        f"Sampled every {p['sample_s']:g} s from "
        "`pg_stat_user_tables` (dead tuples as the statistics collector last heard), "
        "`pg_database_size` and the WAL position.",
        "",
        "| system | processed | handled/s | dead tuples at end | per job (<= 1 %) | size at 1/3 | size at end "
        "| growth (<= 10 %) | backlog at end (<= 2 s) | max backlog | WAL B/job | vacuums |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    for rec in data["runs"]:
        if not rec["ok"]:
            lines.append(f"| {rec['system']} | failed: {rec['error'][:120]} |" + " |" * 11)
            continue
        j = rec["judged"]
        v = j["verdicts"]
        lines.append(
            f"| {rec['label']} | {j['processed']:,} | {j['handled_per_s']:,.0f} | {j['dead_tuples_end']:,} "
            f"| {j['dead_per_job']:.2%} {mark(v['dead'])} | {mib(j['db_bytes_third'])} | {mib(j['db_bytes_end'])} "
            f"| {j['growth']:+.1%} {mark(v['growth'])} | {j['backlog_end']:,} {mark(v['backlog'])} "
            f"| {j['backlog_max']:,} | {j['wal_bytes_per_job']:,.0f} | {j['vacuums']} |"
        )
    lines += ["", "Settings per system:", ""]
    for rec in data["runs"]:
        if rec["ok"]:
            lines.append(f"- {rec['label']}: `{rec['result']['settings']}`")
    if not full:
        lines += ["", f"A short run ({p['duration_s']:,.0f} s per system, the issue asks for "
                      f"{FULL_DURATION_S:,.0f}): size growth is measured from the first third of the run."]
    return "\n".join(lines) + "\n"


def plot(json_path: str, png_path: str) -> None:
    """Dead tuples and database size over time, one line per system (runs in the plot venv)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        data = json.load(f)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for rec in data["runs"]:
        if not rec["ok"]:
            continue
        s = rec["result"]["samples"]
        t = [x["t"] for x in s]
        a.plot(t, [x["dead_tuples"] for x in s], label=rec["label"])
        b.plot(t, [x["db_bytes"] / 1024 / 1024 for x in s], label=rec["label"])
    a.set_title("dead tuples")
    a.set_xlabel("seconds")
    b.set_title("database size (MiB)")
    b.set_xlabel("seconds")
    a.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def document(data: dict[str, Any], png_name: str) -> str:
    """The whole report file: the rendered markdown and the chart's link."""
    return render(data) + f"\n![soak chart]({png_name})\n"


def out_dir(data: dict[str, Any]) -> str:
    """Where a run's files go: ``docs/`` for a full-length soak, else ``bench/results/``."""
    return orchestrate.DOCS if data["params"]["duration_s"] >= FULL_DURATION_S else RESULTS


def write(data: dict[str, Any], json_path: str) -> None:
    orchestrate.write_report(data, json_path, lambda png: document(data, png), __file__)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--rate", type=float, default=1000.0, help="offered load, jobs per second")
    p.add_argument("--duration-s", type=float, default=FULL_DURATION_S)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--retention-s", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--poll-ms", type=int, default=50)
    p.add_argument("--command", default="python3 bench/soak.py")
    p.add_argument("--rust-bin", default="")
    args = orchestrate.report_args(p, plot, write)
    if args is None:
        return
    admin_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    registry = orchestrate.systems(args.rust_bin)
    os.makedirs(RESULTS, exist_ok=True)
    log_path = os.path.join(RESULTS, "soak.log")
    open(log_path, "w").close()
    data = orchestrate.run_record(
        args.command, admin_url,
        {k: getattr(args, k) for k in ("rate", "duration_s", "sample_s", "retention_s", "workers",
                                       "poll_ms")})
    for system in args.systems.split(","):
        print(f"==> soak: {system}, {args.rate:,.0f} jobs/s for {args.duration_s:,.0f} s", flush=True)
        rec = run_system(system, registry[system], admin_url, args, log_path)
        data["runs"].append(rec)
        if rec["ok"]:
            j = rec["judged"]
            print(f"    {j['processed']:,} processed, {j['dead_tuples_end']:,} dead at the end "
                  f"({j['dead_per_job']:.2%}), growth {j['growth']:+.1%}, backlog {j['backlog_end']:,}", flush=True)
        else:
            print(f"    FAILED: {rec['error']}", flush=True)
    data["meta"]["load"]["end"] = orchestrate.load_average()
    write(data, os.path.join(out_dir(data), "soak.json"))


if __name__ == "__main__":
    main()
