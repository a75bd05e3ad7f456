"""Shared helpers for the worker tests."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import awa

FAST = dict(
    poll_interval_ms=50,
    heartbeat_interval_ms=100,
    # Well above the heartbeat interval, so a heartbeat delayed on a loaded machine does not
    # get a live attempt rescued and run twice.
    heartbeat_staleness_ms=3000,
    heartbeat_rescue_interval_ms=100,
    deadline_rescue_interval_ms=100,
    callback_rescue_interval_ms=100,
    promote_interval_ms=50,
    leader_election_interval_ms=200,
)


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll an async or sync predicate until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def wait_for_state(client: awa.AsyncClient, job_id: int, *states: str, timeout: float = 10.0) -> awa.Job:
    async def check() -> Any:
        job = await client.get_job(job_id)
        return job if job.state in states else None

    return await wait_for(check, timeout, f"job {job_id} in {states}")


async def complete_jobs(client: awa.AsyncClient, ids: Any) -> None:
    """Complete jobs as a worker does, through ``awa.testing``'s ``work_one`` (on either
    engine); each must be the oldest available job of its kind and queue."""
    from awa.testing import AwaTestClient

    harness = AwaTestClient(client)

    async def handler(job: Any) -> None:
        return None

    for job_id in ids:
        job = await client.get_job(job_id)
        result = await harness.work_one(dict, handler, kind=job.kind, queue=job.queue)
        assert result.outcome == "completed" and result.job and result.job.id == job_id, (job_id, result)


async def fail_jobs(client: awa.AsyncClient, ids: Any, error: str = "boom", progress: Any = None) -> None:
    """Fail jobs as a worker does when its handler raises a terminal error on the first
    attempt: one attempt, the error and its traceback recorded, the job failed. Through
    ``awa.testing``'s ``work_one``, so on either engine (SQL through ``awa.jobs`` cannot change
    queue storage's jobs); each job is claimed by its kind and queue, and must be the oldest
    available one of them. ``progress``, ``(percent, message)``, is recorded first."""
    from awa.testing import AwaTestClient

    harness = AwaTestClient(client)

    async def handler(job: Any) -> None:
        if progress is not None:
            job.set_progress(*progress)
        raise awa.TerminalError(error)

    for job_id in ids:
        job = await client.get_job(job_id)
        result = await harness.work_one(dict, handler, kind=job.kind, queue=job.queue)
        assert result.outcome == "failed" and result.job and result.job.id == job_id, (job_id, result)
