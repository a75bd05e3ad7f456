"""Helpers shared by every system adapter (standard library only: each adapter runs in its
own virtualenv, with only that system installed).

Protocol: an adapter is run as ``python <adapter>.py WORKLOAD --phase PHASE --url URL
[options]`` against a fresh, empty database, once per phase:

- ``setup``: schema, plus the jobs a drain needs (not timed);
- ``run``: the measurement;
- ``verify``: checks on what the run left in the database (completed jobs, follow-ups);
- ``all`` (the default, for running an adapter by hand): the three in one process.

Each phase prints exactly one line starting with ``BENCH_RESULT `` holding
``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "..."}``; anything else it
prints is log output. Phases are separate processes so that the orchestrator can read the
database's statistics between them with every connection of the system closed (a backend
flushes its statistics when it exits): commits (``pg_stat_database.xact_commit``), WAL
(``pg_current_wal_lsn()``) and dead tuples of the ``run`` phase are measured that way, and the
run's own reads of the database (pending polls, reported as ``own_txns``) are subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "
QUEUE = "bench"
FOLLOW_UP_QUEUE = "bench_followups"
WORKLOADS = ("enqueue_single", "enqueue_bulk_count", "enqueue_bulk_jobs", "drain", "latency", "staging", "soak")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("--phase", choices=("setup", "run", "verify", "all"), default="all")
    p.add_argument("--url", required=True, help="database URL (a fresh database)")
    p.add_argument("--jobs", type=int, default=2000, help="jobs in the workload")
    p.add_argument("--workers", type=int, default=32, help="concurrent handlers")
    p.add_argument("--interval-ms", type=float, default=20.0, help="latency: gap between inserts")
    p.add_argument("--poll-ms", type=int, default=50, help="poll interval where a system has one")
    p.add_argument("--timeout-s", type=float, default=900.0, help="give up on a drain after this")
    p.add_argument("--rate", type=float, default=1000.0, help="soak: offered load, jobs per second")
    p.add_argument("--duration-s", type=float, default=1800.0, help="soak: how long to offer it")
    p.add_argument("--sample-s", type=float, default=5.0, help="soak: seconds between database samples")
    p.add_argument("--retention-s", type=float, default=10.0, help="soak: completed-job retention")
    return p.parse_args(argv)


def psql(url: str, sql: str) -> list[list[str]]:
    """Run one statement with psql (one connection, one transaction) and return its rows."""
    out = subprocess.run(
        ["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"psql failed: {out.stderr.strip()}")
    return [line.split("\t") for line in out.stdout.splitlines() if line != ""]


def psql_int(url: str, sql: str) -> int:
    rows = psql(url, sql)
    return int(rows[0][0]) if rows and rows[0][0] != "" else 0


async def wait_drained(
    handled: list[int],
    n: int,
    pending: Callable[[], Awaitable[int]],
    timeout_s: float,
) -> int:
    """Wait until the handlers ran ``n`` times (in-process counter, no queries), then poll the
    database until it shows nothing pending. Returns the number of polls (each is one
    transaction, subtracted from the commit count)."""
    deadline = time.monotonic() + timeout_s
    while handled[0] < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out: {handled[0]} of {n} jobs handled")
        await asyncio.sleep(0.002)
    polls = 0
    while True:
        polls += 1
        if await pending() == 0:
            return polls
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for completions to land")
        await asyncio.sleep(0.002)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def pace_inserts(
    n: int,
    interval_s: float,
    insert: Callable[[int], Awaitable[Any]],
    started: dict[int, float],
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Insert ``n`` jobs one per ``interval_s`` into an idle worker and report the time from
    each insert call to its handler starting (``started[i]``, perf_counter, set by the
    handler). Also reported from the moment the insert call returned (after its commit)."""
    before: dict[int, float] = {}
    after: dict[int, float] = {}
    t0 = time.perf_counter()
    for i in range(n):
        target = t0 + i * interval_s
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        before[i] = time.perf_counter()
        await insert(i)
        after[i] = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    while len(started) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    missing = n - len(started)
    lat = [(started[i] - before[i]) * 1000 for i in range(n) if i in started]
    lat_commit = [(started[i] - after[i]) * 1000 for i in range(n) if i in started]
    insert_ms = [(after[i] - before[i]) * 1000 for i in range(n)]
    return {
        "jobs": n,
        "interval_ms": interval_s * 1000,
        "missing": missing,
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else float("nan"),
        "from_commit_p50_ms": percentile(lat_commit, 50),
        "from_commit_p99_ms": percentile(lat_commit, 99),
        "insert_call_p50_ms": percentile(insert_ms, 50),
    }


# One sample of what a sustained load leaves in the database: every user table's dead and live
# tuples (as the statistics collector last heard of them), vacuums so far, the database's size
# on disk and the WAL position. Queue-agnostic: it names no system's tables.
SOAK_SAMPLE_SQL = """
SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_live_tup), 0),
       coalesce(sum(autovacuum_count + vacuum_count), 0),
       pg_database_size(current_database()),
       pg_current_wal_lsn() - '0/0'::pg_lsn
FROM pg_stat_user_tables
"""


def soak_sample(url: str) -> dict[str, int]:
    row = psql(url, SOAK_SAMPLE_SQL)[0]
    dead, live, vacuums, size, wal = (int(float(v)) for v in row)
    return {"dead_tuples": dead, "live_tuples": live, "vacuums": vacuums, "db_bytes": size, "wal_bytes": wal}


async def soak_loop(
    args: argparse.Namespace,
    insert_batch: Callable[[int, int], Awaitable[Any]],
    handled: list[int],
) -> dict[str, Any]:
    """Offer ``args.rate`` jobs per second for ``args.duration_s`` (a batch every 50 ms through
    ``insert_batch(first_index, n)``, the system's own bulk insert) into a started worker whose
    handlers count into ``handled[0]``; sample the database every ``args.sample_s``. The
    backlog is what was inserted and not yet handled. Returns the samples and the figures the
    soak targets are judged on (the orchestrator, ``bench/soak.py``, judges them)."""
    tick = 0.05
    per_tick = args.rate * tick
    inserted = 0
    owed = 0.0
    samples: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()

    async def sample(t: float) -> None:
        db = await loop.run_in_executor(None, soak_sample, args.url)
        samples.append({"t": round(t, 3), "inserted": inserted, "handled": handled[0],
                        "backlog": inserted - handled[0], **db})

    t0 = time.perf_counter()
    await sample(0.0)
    next_sample = args.sample_s
    n_ticks = 0
    while True:
        now = time.perf_counter() - t0
        if now >= args.duration_s:
            break
        owed += per_tick
        n = int(owed)
        if n:
            owed -= n
            await insert_batch(inserted, n)
            inserted += n
        if now >= next_sample:
            await sample(now)
            next_sample += args.sample_s
        n_ticks += 1
        delay = t0 + n_ticks * tick - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    seconds = time.perf_counter() - t0
    await sample(seconds)
    return {"rate": args.rate, "duration_s": args.duration_s, "seconds": seconds, "inserted": inserted,
            "handled": handled[0], "offered_per_s": inserted / seconds, "handled_per_s": handled[0] / seconds,
            "retention_s": args.retention_s, "samples": samples}


def emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


class Workload:
    """The three phases of one workload; ``setup`` and ``verify`` may be omitted."""

    def __init__(
        self,
        run: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]],
        setup: Callable[[argparse.Namespace], Awaitable[None]] | None = None,
        verify: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self.run, self.setup, self.verify = run, setup, verify


async def _phases(w: Workload, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if args.phase in ("setup", "all") and w.setup is not None:
        await w.setup(args)
    if args.phase in ("run", "all"):
        result.update(await w.run(args))
    if args.phase in ("verify", "all") and w.verify is not None:
        result.update(await w.verify(args))
    return result


def uvloop_run(coro: Any) -> Any:
    """Run on uvloop when it is installed (run.sh installs it for every system: pgqueuer's
    runner uses it by default, and every adapter gets the same loop), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def event_loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def main(
    workloads: dict[str, Workload],
    describe: Callable[[], dict[str, Any]],
    run: Callable[[Awaitable[Any]], Any] = uvloop_run,
) -> None:
    """Parse arguments, run one phase of one workload with ``run`` (uvloop when installed)
    and print the result line. Exits 1 on failure."""
    args = parse_args()
    try:
        w = workloads.get(args.workload)
        if w is None:
            emit({"ok": False, "unavailable": True, "error": f"workload {args.workload} not implemented"})
            sys.exit(1)
        cpu0 = time.process_time()
        result = run(_phases(w, args))
        if args.phase == "run":
            # This process's CPU (every thread) over the phase, start-up and imports left out.
            result["cpu_s"] = time.process_time() - cpu0
        if args.phase in ("run", "all"):
            result.setdefault("system", describe())
            result["system"].setdefault("event_loop", event_loop_name())
        emit({"ok": True, "result": result})
    except BaseException as e:  # noqa: BLE001 - the harness records any failure
        traceback.print_exc()
        emit({"ok": False, "error": f"{type(e).__name__}: {e}"})
        sys.exit(1)
