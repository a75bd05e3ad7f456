"""External callbacks and progress from Python."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

import pytest

import awa
from helpers import FAST, wait_for, wait_for_state


@dataclasses.dataclass
class Charge:
    order: int
    mode: str = "park"


async def test_parked_job_completed_failed_or_retried_externally(client: awa.AsyncClient) -> None:
    tokens: dict[int, awa.CallbackToken] = {}

    @client.task(Charge)
    async def charge(job: awa.Job) -> Any:
        token = await job.register_callback(timeout_seconds=60)
        tokens[job.args.order] = token
        return awa.WaitForCallback(token)

    jobs = [await client.insert(Charge(order=i)) for i in range(3)]
    await client.start([("default", 1)], **FAST)
    try:
        for j in jobs:
            parked = await wait_for_state(client, j.id, "waiting_external")
            # Parked: no heartbeat and no deadline (the callback's timeout rules it), on
            # either engine.
            assert (parked.heartbeat_at, parked.deadline) == (None, None)
        await wait_for(lambda: len(tokens) == 3, what="three tokens")
        done = await client.complete_external(tokens[0], {"ok": True})
        assert done.state == "completed"
        failed = await client.fail_external(tokens[1], "card declined")
        assert failed.state == "failed" and failed.errors[-1]["error"] == "card declined"
        retried = await client.retry_external(tokens[2])
        assert retried.state == "available"
        with pytest.raises(awa.CallbackNotFound):
            await client.complete_external(tokens[0])
        with pytest.raises(awa.CallbackNotFound):
            await client.complete_external("00000000-0000-0000-0000-000000000000")
        # A malformed id is a bad request (as in awa-pg), not an unknown callback.
        with pytest.raises(awa.ValidationError, match="invalid callback id"):
            await client.fail_external("not-a-uuid", "x")
    finally:
        await client.shutdown()


async def test_wait_for_callback_inside_the_handler(client: awa.AsyncClient) -> None:
    tokens: asyncio.Queue[awa.CallbackToken] = asyncio.Queue()
    payloads: list[Any] = []

    @client.task(Charge)
    async def charge(job: awa.Job) -> None:
        token = await job.register_callback(60)
        await tokens.put(token)
        payloads.append(await job.wait_for_callback(token))

    job = await client.insert(Charge(order=1))
    await client.start([("default", 1)], **FAST)
    try:
        token = await asyncio.wait_for(tokens.get(), 10)
        before = await client.get_job(job.id)
        await client.resume_external(token, {"amount": 42})
        done = await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    assert payloads == [{"amount": 42}]
    assert done.run_lease == before.run_lease, "continued under the same lease"


async def test_resume_before_the_handler_waits(client: awa.AsyncClient) -> None:
    tokens: asyncio.Queue[awa.CallbackToken] = asyncio.Queue()
    go = asyncio.Event()
    payloads: list[Any] = []

    @client.task(Charge)
    async def charge(job: awa.Job) -> None:
        token = await job.register_callback(60)
        await tokens.put(token)
        await go.wait()  # the resume lands before we start waiting
        payloads.append(await job.wait_for_callback(token))

    job = await client.insert(Charge(order=1))
    await client.start([("default", 1)], **FAST)
    try:
        token = await asyncio.wait_for(tokens.get(), 10)
        await client.resume_external(token, "early")
        go.set()
        await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    assert payloads == ["early"]


async def test_callback_timeout_is_rescued_and_heartbeat_extends_it(client: awa.AsyncClient) -> None:
    tokens: dict[int, awa.CallbackToken] = {}

    @client.task(Charge)
    async def charge(job: awa.Job) -> Any:
        # The third job's first timeout must outlast the test's way to its heartbeat on a
        # loaded machine; the heartbeat's effect is read from the row, not inferred from time.
        token = await job.register_callback(timeout_seconds=20 if job.args.order == 3 else 1)
        tokens[job.args.order] = token
        return awa.WaitForCallback(token)

    retried = await client.insert(Charge(order=1))
    exhausted = await client.insert(Charge(order=2), max_attempts=1)
    extended = await client.insert(Charge(order=3))
    await client.start([("default", 3)], **FAST)
    try:
        await wait_for(lambda: len(tokens) == 3, what="tokens")
        await client.heartbeat_callback(tokens[3], timeout_seconds=60)
        # The job is still `running` when its token is registered (WaitForCallback has not been
        # finalized yet), so wait for the rescue's error rather than for a state.
        async def rescued() -> Any:
            job = await client.get_job(retried.id)
            return job if job.errors else None

        r = await wait_for(rescued, 15, "callback timeout rescue of the first job")
        assert r.state in ("retryable", "available", "running", "waiting_external")
        assert "callback timed out" in r.errors[-1]["error"]
        f = await wait_for_state(client, exhausted.id, "failed", timeout=15)
        assert "callback timed out" in f.errors[-1]["error"]
        assert (await client.get_job(extended.id)).state == "waiting_external"
        async with client.transaction() as tx:
            row = await tx.fetch_one(
                "SELECT callback_timeout_at > now() + interval '40 seconds' AS extended"
                " FROM awa.jobs WHERE id = $1",
                extended.id,
            )
            await tx.commit()
        assert row["extended"], "the heartbeat moved the timeout to 60 s from then"
    finally:
        await client.shutdown()


async def test_progress_survives_retry_and_clears_on_completion(client: awa.AsyncClient) -> None:
    seen: list[Any] = []

    @client.task(Charge)
    async def charge(job: awa.Job) -> Any:
        seen.append(job.progress)
        if job.attempt == 1:
            job.set_progress(40, "halfway")
            job.update_metadata({"cursor": 17})
            await job.flush_progress()
            raise RuntimeError("interrupted")
        assert job.progress["metadata"]["cursor"] == 17  # resume from the checkpoint
        job.update_metadata({"cursor": 18})
        return None

    job = await client.insert(Charge(order=1))
    await client.start([("default", 1)], **FAST)
    try:
        # Wait for the first failure, not for `retryable`: that state lasts only the 2 s
        # backoff, which a loaded machine can let pass before the test looks.
        async def failed_once() -> Any:
            row = await client.get_job(job.id)
            return row if row.errors else None

        r = await wait_for(failed_once, what="the first attempt to fail")
        if r.state in ("retryable", "available"):  # a running retry may store its own progress
            assert r.progress == {"percent": 40.0, "message": "halfway", "metadata": {"cursor": 17}}
        # Skip the backoff; a job already running again has nothing to hurry.
        with contextlib.suppress(awa.AwaError):
            await client.retry(job.id)
        done = await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    assert seen[0] is None and seen[1]["metadata"] == {"cursor": 17}
    assert done.progress is None, "cleared on completion"


async def test_progress_is_bounded(client: awa.AsyncClient) -> None:
    errors: list[BaseException] = []

    @client.task(Charge)
    async def charge(job: awa.Job) -> None:
        try:
            job.update_metadata({"blob": "x" * 70_000})
        except awa.ValidationError as exc:
            errors.append(exc)

    job = await client.insert(Charge(order=1))
    await client.start([("default", 1)], **FAST)
    try:
        await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    assert errors and "progress" in str(errors[0])
