"""Adapter for PgQueuer (PyPI), driven through asyncpg.

Settings (from PgQueuer's own docs and docstrings in the installed package):
- tables installed with ``durability=balanced``: the job table stays LOGGED (crash-safe, like
  every other system here) while the log and statistics tables are UNLOGGED "to optimize
  performance" (``volatile`` would make the job table itself unlogged, i.e. lose jobs on a
  crash, so it is not comparable). Override with PGQUEUER_DURABILITY.
- the event loop is uvloop, as PgQueuer's own runner (``pgq run``) uses when it is installed.
- ``run(batch_size=B, max_concurrent_tasks=W)``: W=32 jobs in flight; B (default 16, the largest
  the run() check allows for W=32) jobs per dequeue; LISTEN/NOTIFY wake-ups (always on).
- single inserts: ``Queries.enqueue(entrypoint, payload)``; bulk: the list form of
  ``Queries.enqueue`` (one statement).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PGQUEUER_DURABILITY", "balanced")

import asyncpg
from common import Workload, main, pace_inserts, psql, psql_int, wait_drained
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

NOOP = "noop"
STAGE = "stage_job"
FOLLOW_UP = "follow_up"
TICK = "tick"
BATCH = int(os.environ.get("PGQUEUER_BATCH_SIZE", "16"))
DRIVER = os.environ.get("PGQUEUER_DRIVER", "connection")  # connection | pool


def describe() -> dict[str, Any]:
    from importlib.metadata import version

    return {"name": "pgqueuer", "version": version("pgqueuer"), "asyncpg": version("asyncpg")}


def settings(workers: int) -> str:
    return (
        f"durability={os.environ['PGQUEUER_DURABILITY']}, uvloop, driver={DRIVER}, "
        f"run(batch_size={BATCH}, max_concurrent_tasks={workers})"
    )


async def _schema(url: str, entrypoint: str | None = None, n: int = 0) -> None:
    conn = await asyncpg.connect(url)
    q = Queries(AsyncpgDriver(conn))
    await q.install()
    if n and entrypoint:
        await q.enqueue([entrypoint] * n, [str(i).encode() for i in range(n)], [0] * n)
    await conn.close()


async def setup_schema(args: Any) -> None:
    await _schema(args.url)


async def setup_noop_jobs(args: Any) -> None:
    await _schema(args.url, NOOP, args.jobs)


async def setup_stage_jobs(args: Any) -> None:
    await _schema(args.url, STAGE, args.jobs)


async def enqueue_single(args: Any) -> dict[str, Any]:
    conn = await asyncpg.connect(args.url)
    q = Queries(AsyncpgDriver(conn))
    t0 = time.perf_counter()
    for i in range(args.jobs):
        await q.enqueue(NOOP, str(i).encode())
    seconds = time.perf_counter() - t0
    await conn.close()
    return {"jobs": args.jobs, "seconds": seconds, "jobs_per_s": args.jobs / seconds, "api": "Queries.enqueue"}


async def enqueue_bulk(args: Any) -> dict[str, Any]:
    conn = await asyncpg.connect(args.url)
    q = Queries(AsyncpgDriver(conn))
    n = args.jobs
    entrypoints, payloads, priorities = [NOOP] * n, [str(i).encode() for i in range(n)], [0] * n
    t0 = time.perf_counter()
    await q.enqueue(entrypoints, payloads, priorities)
    seconds = time.perf_counter() - t0
    await conn.close()
    return {"jobs": n, "seconds": seconds, "jobs_per_s": n / seconds, "api": "Queries.enqueue(list)", "returns": "job ids"}


async def verify_bulk(args: Any) -> dict[str, Any]:
    stored = psql_int(args.url, f"SELECT count(*) FROM pgqueuer WHERE entrypoint = '{NOOP}'")
    if stored != args.jobs:
        raise RuntimeError(f"bulk insert stored {stored} of {args.jobs} jobs")
    return {"stored": stored}


async def _worker(url: str) -> tuple[PgQueuer, Any]:
    if DRIVER == "pool":
        pool = await asyncpg.create_pool(url, min_size=2, max_size=10)
        return PgQueuer(AsyncpgPoolDriver(pool)), pool
    conn = await asyncpg.connect(url)
    return PgQueuer(AsyncpgDriver(conn)), conn


def _run(pgq: PgQueuer, workers: int) -> asyncio.Task:
    return asyncio.create_task(
        pgq.run(batch_size=BATCH, max_concurrent_tasks=workers, dequeue_timeout=timedelta(seconds=30))
    )


async def _drain(args: Any, staging: bool) -> dict[str, Any]:
    entry = STAGE if staging else NOOP
    pgq, resource = await _worker(args.url)
    producer_pool = await asyncpg.create_pool(args.url, min_size=1, max_size=8) if staging else None
    producer = Queries(AsyncpgPoolDriver(producer_pool)) if producer_pool else None
    monitor = await asyncpg.connect(args.url)
    handled = [0]

    if staging:

        @pgq.entrypoint(STAGE)
        async def stage_job(job: Job) -> None:
            # PgQueuer has no staging: the handler enqueues the follow-up itself (its own
            # transaction, not atomic with the completion), deduplicated by dedupe_key.
            i = job.payload.decode()
            await producer.enqueue(FOLLOW_UP, job.payload, dedupe_key=f"fu-{i}")
            handled[0] += 1

    else:

        @pgq.entrypoint(NOOP)
        async def noop(job: Job) -> None:
            handled[0] += 1

    async def pending() -> int:
        # Autocommit: one transaction per poll (subtracted as own_txns).
        return int(await monitor.fetchval("SELECT count(*) FROM pgqueuer WHERE entrypoint = $1", entry))

    t0 = time.perf_counter()
    task = _run(pgq, args.workers)
    polls = await wait_drained(handled, args.jobs, pending, args.timeout_s)
    seconds = time.perf_counter() - t0
    pgq.shutdown.set()
    await asyncio.wait_for(task, 30)
    await resource.close()
    await monitor.close()
    if producer_pool:
        await producer_pool.close()
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "workers": args.workers,
        "seconds": seconds,
        "jobs_per_s": args.jobs / seconds,
        "own_txns": polls,
        "settings": settings(args.workers),
    }
    if staging:
        out["staging_api"] = "Queries.enqueue(dedupe_key=...) from inside the handler (no staging; not atomic)"
    return out


async def verify_drain(args: Any, entry: str = NOOP) -> dict[str, Any]:
    completed = psql_int(
        args.url, f"SELECT count(*) FROM pgqueuer_log WHERE entrypoint = '{entry}' AND status = 'successful'"
    )
    return {"completed": completed}


async def verify_staging(args: Any) -> dict[str, Any]:
    out = await verify_drain(args, STAGE)
    rows = psql(args.url, f"SELECT count(*), count(DISTINCT payload) FROM pgqueuer WHERE entrypoint = '{FOLLOW_UP}'")
    total, distinct = int(rows[0][0]), int(rows[0][1])
    out.update(follow_ups=total, follow_ups_distinct=distinct, exactly_once=(total == args.jobs and distinct == args.jobs))
    return out


async def drain(args: Any) -> dict[str, Any]:
    return await _drain(args, staging=False)


async def staging(args: Any) -> dict[str, Any]:
    return await _drain(args, staging=True)


async def latency(args: Any) -> dict[str, Any]:
    pgq, resource = await _worker(args.url)
    started: dict[int, float] = {}

    @pgq.entrypoint(TICK)
    async def tick(job: Job) -> None:
        started[int(job.payload.decode())] = time.perf_counter()

    task = _run(pgq, args.workers)
    conn = await asyncpg.connect(args.url)
    producer = Queries(AsyncpgDriver(conn))
    await asyncio.sleep(1.5)
    result = await pace_inserts(
        args.jobs, args.interval_ms / 1000.0, lambda i: producer.enqueue(TICK, str(i).encode()), started
    )
    pgq.shutdown.set()
    await asyncio.wait_for(task, 30)
    await resource.close()
    await conn.close()
    result["settings"] = settings(args.workers)
    return result


if __name__ == "__main__":
    main(
        {
            "enqueue_single": Workload(enqueue_single, setup=setup_schema),
            "enqueue_bulk_jobs": Workload(enqueue_bulk, setup=setup_schema, verify=verify_bulk),
            "drain": Workload(drain, setup=setup_noop_jobs, verify=verify_drain),
            "latency": Workload(latency, setup=setup_schema),
            "staging": Workload(staging, setup=setup_stage_jobs, verify=verify_staging),
        },
        describe,
    )
