"""Adapter for Procrastinate (PyPI) with its psycopg 3 connector.

Settings (from the docstrings of the installed package, ``App.run_worker_async``):
- ``concurrency=W`` (32) asynchronous jobs per worker, ``listen_notify=True`` (the default:
  "lower latency for job updates compared to polling alone"), the default polling interval
  as the fallback, ``delete_jobs`` left at its default (``never``).
- the connector's psycopg pool sized to the concurrency (``max_size=W+4``), so no job waits
  for a connection (override with PROCRASTINATE_POOL_MAX).
- single inserts: ``Task.defer_async``; bulk: ``Task.batch_defer_async`` ("more efficient
  than deferring them one by one").
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procrastinate
import psycopg
from common import (
    FOLLOW_UP_QUEUE,
    QUEUE,
    Workload,
    main,
    pace_inserts,
    psql,
    psql_int,
    wait_drained,
)


def describe() -> dict[str, Any]:
    from importlib.metadata import version

    return {"name": "procrastinate", "version": version("procrastinate"), "psycopg": version("psycopg")}


def pool_max(workers: int) -> int:
    return int(os.environ.get("PROCRASTINATE_POOL_MAX", str(workers + 4)))


def make_app(url: str, workers: int) -> procrastinate.App:
    return procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=2, max_size=pool_max(workers))
    )


def settings(workers: int) -> str:
    return (
        f"run_worker_async(concurrency={workers}, listen_notify=True), "
        f"PsycopgConnector(max_size={pool_max(workers)})"
    )


class Tasks:
    """The benchmark's tasks on one app, recording into plain counters."""

    def __init__(self, app: procrastinate.App) -> None:
        self.handled = [0]
        self.started: dict[int, float] = {}

        @app.task(name="noop", queue=QUEUE)
        async def noop(i: int) -> None:
            self.handled[0] += 1

        @app.task(name="follow_up", queue=FOLLOW_UP_QUEUE)
        async def follow_up(i: int) -> None:
            pass

        @app.task(name="stage_job", queue=QUEUE)
        async def stage_job(i: int) -> None:
            # Procrastinate has no staging: the handler defers the follow-up itself (its own
            # transaction, not atomic with the completion), deduplicated by queueing_lock.
            await follow_up.configure(queueing_lock=f"fu-{i}").defer_async(i=i)
            self.handled[0] += 1

        @app.task(name="tick", queue=QUEUE)
        async def tick(i: int) -> None:
            self.started[i] = time.perf_counter()

        self.noop, self.follow_up, self.stage_job, self.tick = noop, follow_up, stage_job, tick


async def _schema(url: str, task_name: str | None = None, n: int = 0) -> None:
    app = make_app(url, 4)
    tasks = Tasks(app)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        if n and task_name:
            await getattr(tasks, task_name).batch_defer_async(*[{"i": i} for i in range(n)])


async def setup_schema(args: Any) -> None:
    await _schema(args.url)


async def setup_noop_jobs(args: Any) -> None:
    await _schema(args.url, "noop", args.jobs)


async def setup_stage_jobs(args: Any) -> None:
    await _schema(args.url, "stage_job", args.jobs)


async def enqueue_single(args: Any) -> dict[str, Any]:
    app = make_app(args.url, 4)
    tasks = Tasks(app)
    async with app.open_async():
        await tasks.noop.configure(queue="warmup").defer_async(i=-1)  # open a connection outside the clock
        t0 = time.perf_counter()
        for i in range(args.jobs):
            await tasks.noop.defer_async(i=i)
        seconds = time.perf_counter() - t0
    return {"jobs": args.jobs, "seconds": seconds, "jobs_per_s": args.jobs / seconds, "api": "Task.defer_async"}


async def enqueue_bulk(args: Any) -> dict[str, Any]:
    app = make_app(args.url, 4)
    tasks = Tasks(app)
    items = [{"i": i} for i in range(args.jobs)]
    async with app.open_async():
        await tasks.noop.configure(queue="warmup").defer_async(i=-1)
        t0 = time.perf_counter()
        await tasks.noop.batch_defer_async(*items)
        seconds = time.perf_counter() - t0
    return {"jobs": args.jobs, "seconds": seconds, "jobs_per_s": args.jobs / seconds, "api": "Task.batch_defer_async", "returns": "job ids"}


async def verify_bulk(args: Any) -> dict[str, Any]:
    stored = psql_int(args.url, f"SELECT count(*) FROM procrastinate_jobs WHERE queue_name = '{QUEUE}'")
    if stored != args.jobs:
        raise RuntimeError(f"bulk insert stored {stored} of {args.jobs} jobs")
    return {"stored": stored}


def _start_worker(app: procrastinate.App, workers: int) -> asyncio.Task:
    return asyncio.create_task(
        app.run_worker_async(
            queues=[QUEUE],
            concurrency=workers,
            listen_notify=True,
            install_signal_handlers=False,
        )
    )


async def _stop_worker(task: asyncio.Task) -> None:
    task.cancel()
    try:
        await asyncio.wait_for(task, 30)
    except (asyncio.CancelledError, TimeoutError):
        pass


async def _drain(args: Any, staging: bool) -> dict[str, Any]:
    app = make_app(args.url, args.workers)
    tasks = Tasks(app)
    monitor = await psycopg.AsyncConnection.connect(args.url, autocommit=True)

    async def pending() -> int:
        # Autocommit: one transaction per poll (subtracted as own_txns).
        cur = await monitor.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status IN ('todo', 'doing')", (QUEUE,)
        )
        row = await cur.fetchone()
        return int(row[0])

    async with app.open_async():
        t0 = time.perf_counter()
        worker = _start_worker(app, args.workers)
        polls = await wait_drained(tasks.handled, args.jobs, pending, args.timeout_s)
        seconds = time.perf_counter() - t0
        await _stop_worker(worker)
    await monitor.close()
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "workers": args.workers,
        "seconds": seconds,
        "jobs_per_s": args.jobs / seconds,
        "own_txns": polls,
        "settings": settings(args.workers),
    }
    if staging:
        out["staging_api"] = "Task.configure(queueing_lock=...).defer_async from inside the handler (no staging; not atomic)"
    return out


async def verify_drain(args: Any) -> dict[str, Any]:
    completed = psql_int(
        args.url, f"SELECT count(*) FROM procrastinate_jobs WHERE queue_name = '{QUEUE}' AND status = 'succeeded'"
    )
    return {"completed": completed}


async def verify_staging(args: Any) -> dict[str, Any]:
    out = await verify_drain(args)
    rows = psql(
        args.url,
        "SELECT count(*), count(DISTINCT args->>'i') FROM procrastinate_jobs "
        f"WHERE task_name = 'follow_up' AND queue_name = '{FOLLOW_UP_QUEUE}'",
    )
    total, distinct = int(rows[0][0]), int(rows[0][1])
    out.update(follow_ups=total, follow_ups_distinct=distinct, exactly_once=(total == args.jobs and distinct == args.jobs))
    return out


async def drain(args: Any) -> dict[str, Any]:
    return await _drain(args, staging=False)


async def staging(args: Any) -> dict[str, Any]:
    return await _drain(args, staging=True)


async def latency(args: Any) -> dict[str, Any]:
    app = make_app(args.url, args.workers)
    tasks = Tasks(app)
    async with app.open_async():
        worker = _start_worker(app, args.workers)
        await tasks.tick.configure(queue="warmup").defer_async(i=-1)
        await asyncio.sleep(1.5)
        result = await pace_inserts(
            args.jobs, args.interval_ms / 1000.0, lambda i: tasks.tick.defer_async(i=i), tasks.started
        )
        await _stop_worker(worker)
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
