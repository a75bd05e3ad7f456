"""Guarantees under races, seen from Python: a superseded lease, rescue, leader failover."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import awa
from conftest import ENGINE
from helpers import FAST, wait_for, wait_for_state


@dataclasses.dataclass
class Hold:
    n: int


@dataclasses.dataclass
class Follow:
    n: int


async def bump_lease(client: awa.AsyncClient, job_id: int) -> None:
    """What a rescue followed by a new claim does to the attempt: the old attempt's lease is
    gone. On canonical the job's row holds the lease; on queue storage its lease row does."""
    table = "awa.leases" if ENGINE == "queue_storage" else "awa.jobs"
    async with client.transaction() as tx:
        await tx.execute(f"UPDATE {table} SET run_lease = run_lease + 1 WHERE id = $1", job_id)


async def make_available_again(client: awa.AsyncClient, job_id: int) -> None:
    """What rescue does to a stale attempt: the job is available again while the attempt still
    runs. On canonical, the row is set back to available directly; on queue storage (whose
    entries are never updated) the attempt's deadline is moved into the past, so that the
    runtime's own deadline rescue ends the lease and defers the job as retryable, due at once."""
    async with client.transaction() as tx:
        if ENGINE == "queue_storage":
            await tx.execute("UPDATE awa.leases SET deadline_at = now() - interval '1 second' WHERE id = $1", job_id)
        else:
            await tx.execute("UPDATE awa.jobs SET state = 'available', run_at = now() WHERE id = $1", job_id)


async def test_a_completion_for_a_superseded_lease_changes_nothing_and_inserts_no_follow_up(
    client: awa.AsyncClient,
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @client.task(Hold)
    async def hold(job: awa.Job) -> None:
        job.enqueue_on_completion(Follow(n=job.args.n), unique_opts={})
        started.set()
        await release.wait()

    job = await client.insert(Hold(n=1))
    stale_before = client.metrics()["FINALIZE_STALE"]
    # Default rescue intervals: nothing rescues the job while the test holds it.
    await client.start([("default", 1)], poll_interval_ms=50)
    try:
        await asyncio.wait_for(started.wait(), 10)
        await bump_lease(client, job.id)
        release.set()
        await wait_for(lambda: client.metrics()["FINALIZE_STALE"] > stale_before, what="a stale finalization")
    finally:
        await client.shutdown()
    row = await client.get_job(job.id)
    assert row.state == "running" and row.finalized_at is None, "the late completion changed nothing"
    assert await client.list_jobs(kind="follow") == [], "and inserted none of its follow-ups"


async def test_a_reclaimed_job_runs_again_and_only_the_new_attempt_commits(client: awa.AsyncClient) -> None:
    attempts: list[int] = []
    first_running = asyncio.Event()
    release_first = asyncio.Event()

    @client.task(Hold)
    async def hold(job: awa.Job) -> None:
        attempts.append(job.attempt)
        job.enqueue_on_completion(Follow(n=job.attempt), unique_opts={})
        if job.attempt == 1:
            first_running.set()
            await release_first.wait()

    job = await client.insert(Hold(n=1))
    await client.start([("default", 2)], **FAST)
    try:
        await asyncio.wait_for(first_running.wait(), 10)
        # The job is available again, and a new claim runs it under a new lease while the first
        # attempt still waits.
        await make_available_again(client, job.id)
        await wait_for(lambda: 2 in attempts, timeout=15, what="the reclaimed job to run again")
        done = await wait_for_state(client, job.id, "completed")
        release_first.set()
        await asyncio.sleep(0.3)
    finally:
        await client.shutdown()
    follows = await client.list_jobs(kind="follow")
    assert [f.args["n"] for f in follows] == [done.attempt], "only the committing attempt's follow-up"
    assert (await client.get_job(job.id)).state == "completed"


async def test_leadership_moves_to_another_client_when_the_leader_stops(database_url: str) -> None:
    first = awa.AsyncClient(database_url)
    second = awa.AsyncClient(database_url)

    @first.task(Hold)
    async def hold_a(job: awa.Job) -> None:
        return None

    @second.task(Hold)
    async def hold_b(job: awa.Job) -> None:
        return None

    try:
        await first.start([("default", 1)], **FAST)
        await wait_for(lambda: _leader(first), what="the first client to lead")
        await second.start([("default", 1)], **FAST)
        await asyncio.sleep(0.5)
        assert not (await second.health_check()).leader, "one leader at a time"
        await first.shutdown()
        await wait_for(lambda: _leader(second), what="the second client to take over")
        # The new leader does the leader's work: it promotes a due scheduled job.
        job = await second.insert(Hold(n=2), run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1))
        assert job.state == "scheduled"
        await wait_for_state(second, job.id, "completed")
    finally:
        await second.shutdown()
        await first.close()
        await second.close()


async def _leader(client: awa.AsyncClient) -> bool:
    return (await client.health_check()).leader
