"""The worker runtime from Python: outcomes, args, concurrency, cancel, shutdown, DLQ, logging."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pydantic
import pytest

import awa
from awa._metrics import render_counters
from helpers import FAST, fail_jobs, wait_for, wait_for_state


@dataclasses.dataclass
class Work:
    mode: str
    n: int = 0


class Model(pydantic.BaseModel):
    name: str
    count: int


async def test_every_outcome_from_a_python_handler(client: awa.AsyncClient) -> None:
    @client.task(Work)
    async def handle(job: awa.Job) -> Any:
        mode = job.args.mode
        if mode == "retry_after":
            return awa.RetryAfter(3600)
        if mode == "snooze":
            return awa.Snooze(3600)
        if mode == "cancel":
            return awa.Cancel("not needed")
        if mode == "raise":
            raise ValueError("flaky")
        if mode == "terminal":
            raise awa.TerminalError("bad input")
        if mode == "value":
            return {"any": "value"}
        return None

    ids = {m: (await client.insert(Work(mode=m))).id for m in
           ["ok", "value", "retry_after", "snooze", "cancel", "raise", "terminal"]}
    await client.start([("default", 4)], **FAST)
    try:
        assert (await wait_for_state(client, ids["ok"], "completed")).finalized_at is not None
        await wait_for_state(client, ids["value"], "completed")
        r = await wait_for_state(client, ids["retry_after"], "retryable")
        assert r.attempt == 1
        assert r.errors == [], "a requested retry is not an error (as in awa-pg)"
        s = await wait_for_state(client, ids["snooze"], "scheduled")
        assert s.attempt == 0
        c = await wait_for_state(client, ids["cancel"], "cancelled")
        assert "not needed" in c.errors[0]["error"]
        e = await wait_for_state(client, ids["raise"], "retryable")
        assert e.errors[0]["error"] == "ValueError: flaky"
        assert "Traceback" in e.errors[0]["traceback"] and "flaky" in e.errors[0]["traceback"]
        assert "terminal" not in e.errors[0]
        t = await wait_for_state(client, ids["terminal"], "failed")
        assert t.errors[0]["error"] == "bad input"
        assert t.errors[0]["terminal"] is True, "awa-pg's terminal entries carry terminal: true"
    finally:
        await client.shutdown()


async def test_args_are_rebuilt_as_the_registered_type(client: awa.AsyncClient) -> None:
    seen: list[Any] = []

    @client.task(Model)
    async def model_handler(job: awa.Job) -> None:
        seen.append(job.args)

    @client.task(dict, kind="raw")
    async def raw_handler(job: awa.Job) -> None:
        seen.append(job.args)

    ok = await client.insert(Model(name="a", count=1))
    raw = await client.insert({"free": "form"}, kind="raw")
    broken = await client.insert({"name": "b"}, kind="model")  # missing count
    await client.start([("default", 2)], **FAST)
    try:
        await wait_for_state(client, ok.id, "completed")
        await wait_for_state(client, raw.id, "completed")
        failed = await wait_for_state(client, broken.id, "failed")
        assert "args do not decode as Model" in failed.errors[0]["error"]
    finally:
        await client.shutdown()
    assert Model(name="a", count=1) in seen and {"free": "form"} in seen


async def test_unknown_kind_fails_terminally(client: awa.AsyncClient) -> None:
    @client.task(Work)
    async def handle(job: awa.Job) -> None:
        return None

    stranger = await client.insert({"x": 1}, kind="nobody_handles_me")
    await client.start([("default", 1)], **FAST)
    try:
        failed = await wait_for_state(client, stranger.id, "failed")
        assert "no handler registered" in failed.errors[0]["error"]
    finally:
        await client.shutdown()


async def test_exhausted_attempts_fail_and_dlq(client: awa.AsyncClient) -> None:
    @client.task(Work)
    async def handle(job: awa.Job) -> None:
        raise RuntimeError("always")

    plain = await client.insert(Work(mode="x"), max_attempts=1)
    dead = await client.insert(Work(mode="y"), queue="dlq", max_attempts=1)
    await client.start([("default", 1), {"name": "dlq", "max_workers": 1, "dlq": True}], **FAST)
    try:
        failed = await wait_for_state(client, plain.id, "failed")
        assert "attempts exhausted" in failed.errors[-1]["error"]
        await wait_for(lambda: client.dlq_depth("dlq"), what="dlq depth")
    finally:
        await client.shutdown()
    entry = await client.get_dlq_job(dead.id)
    assert entry is not None and entry.job.queue == "dlq" and "always" in entry.reason
    assert [d.job.id for d in await client.list_dlq()] == [dead.id]
    back = await client.retry_from_dlq(dead.id)
    assert back is not None and (back.state, back.attempt) == ("available", 0)
    assert await client.purge_dlq(allow_all=True) == 0


async def test_handlers_run_concurrently(client: awa.AsyncClient) -> None:
    running = 0
    peak = 0
    all_in = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if peak >= 20:
            all_in.set()
        # Hold every handler until all 20 run at once (not for a fixed time, which a slow
        # claim on a loaded machine can outlast).
        await all_in.wait()
        running -= 1

    await client.insert_many([Work(mode="sleep", n=i) for i in range(20)])
    await client.start([("default", 20)], **FAST)
    try:
        await wait_for(lambda: peak >= 20, what="20 concurrent handlers")
    finally:
        await client.shutdown(timeout_ms=5000)
    assert peak == 20


async def test_claims_and_batched_completions_are_counted(client: awa.AsyncClient) -> None:
    """The two statements most commits of a drain come from: claim statements and batched
    completions, one commit each (the benchmark splits commits per job with them)."""
    done = 0

    @client.task(Work)
    async def handle(job: awa.Job) -> None:
        nonlocal done
        done += 1

    before = client.metrics()
    await client.insert_many([Work(mode="noop", n=i) for i in range(50)])
    await client.start([("default", 8)], **FAST)
    try:
        await wait_for(lambda: done >= 50, what="50 jobs handled")
    finally:
        await client.shutdown(timeout_ms=5000)
    after = client.metrics()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["JOBS_COMPLETED_BATCHED"] == 50
    assert 1 <= delta["COMPLETION_BATCHES"] <= 50
    # Each claim statement takes at most 8 + 8 jobs (free slots plus claim-ahead).
    assert 50 / 16 <= delta["CLAIM_STATEMENTS"] and delta["JOBS_CLAIMED"] == 50
    exposed = "\n".join(render_counters(after))
    assert f"awa_claim_statements_total {after['CLAIM_STATEMENTS']}" in exposed
    assert f"awa_completion_batches_total {after['COMPLETION_BATCHES']}" in exposed


async def test_cancel_reaches_a_running_handler(client: awa.AsyncClient) -> None:
    started = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job) -> Any:
        started.set()
        while not job.is_cancelled():
            await asyncio.sleep(0.02)
        return awa.Cancel("stopped on request")

    job = await client.insert(Work(mode="loop"))
    await client.start([("default", 1)], **FAST)
    try:
        await asyncio.wait_for(started.wait(), 10)
        await client.cancel(job.id)
        done = await wait_for_state(client, job.id, "cancelled")
        assert "stopped on request" in done.errors[0]["error"]
    finally:
        await client.shutdown()


async def test_shutdown_loses_nothing(database_url: str) -> None:
    first = awa.AsyncClient(database_url)
    started = 0

    @first.task(Work)
    async def slow(job: awa.Job) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(30)

    await first.insert_many([Work(mode="s", n=i) for i in range(6)])
    await first.start([("default", 3)], **FAST)
    await wait_for(lambda: started >= 3, what="three running handlers")
    await first.shutdown(timeout_ms=100)
    await first.close()

    second = awa.AsyncClient(database_url)

    @second.task(Work)
    async def fast(job: awa.Job) -> None:
        return None

    await second.start([("default", 3)], **FAST)
    try:
        async def all_done() -> bool:
            return len(await second.list_jobs(state="completed")) == 6
        await wait_for(all_done, timeout=20, what="every job completed after rescue")
    finally:
        await second.shutdown()
        await second.close()


async def test_admin_actions(client: awa.AsyncClient) -> None:
    a = await client.insert(Work(mode="a"), queue="adm")
    b = await client.insert(Work(mode="b"), queue="adm")
    await client.pause_queue("adm")
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["adm"].paused and stats["adm"].available == 2 and stats["adm"].total_queued == 2
    await client.resume_queue("adm")
    assert (await client.cancel(a.id)).state == "cancelled"
    assert (await client.retry(a.id)).state == "available"
    assert await client.drain_queue("adm") == 2
    u = await client.insert(Work(mode="u"), queue="adm", unique_opts={})
    got = await client.cancel_by_unique_key(Work(mode="u"), queue="adm")
    assert got is not None and got.id == u.id and got.state == "cancelled"
    ids = [a.id, b.id, u.id]
    for job_id in ids:
        assert (await client.retry(job_id)).state == "available"
    await fail_jobs(client, ids)
    assert (await client.retry_failed(queue="adm")).matched == 3
    await fail_jobs(client, ids)
    assert await client.discard_failed("work", queue="adm") == 3


async def test_engine_logs_reach_python_logging(client: awa.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    @client.task(Work)
    async def handle(job: awa.Job) -> None:
        return None

    with caplog.at_level(logging.INFO, logger="awa"):
        await client.start([("default", 1)], **FAST)
        await client.shutdown()
        await wait_for(lambda: any("worker shut down" in r.getMessage() for r in caplog.records), what="log record")
    assert any(r.name == "awa" and "worker started" in r.getMessage() for r in caplog.records)


def test_blocking_client_runs_a_worker(sync_client: awa.Client) -> None:
    done: list[int] = []

    @sync_client.task(Work)
    async def handle(job: awa.Job) -> None:
        done.append(job.args.n)

    sync_client.insert_many([Work(mode="x", n=i) for i in range(5)])
    sync_client.start([("default", 2)], **FAST)
    try:
        import time
        deadline = time.monotonic() + 10
        while len(sync_client.list_jobs(state="completed")) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        sync_client.shutdown()
    assert sorted(done) == [0, 1, 2, 3, 4]
    assert sync_client.health_check().postgres_connected is True


async def test_two_clients_complete_every_job_exactly_once(database_url: str) -> None:
    runs: dict[int, int] = {}
    clients = [awa.AsyncClient(database_url) for _ in range(2)]
    for c in clients:
        @c.task(Work)
        async def handle(job: awa.Job) -> None:
            runs[job.id] = runs.get(job.id, 0) + 1

    await clients[0].insert_many([Work(mode="x", n=i) for i in range(2000)])
    # Rescue is not under test here: a loaded machine must not make a heartbeat look stale.
    settings = {**FAST, "heartbeat_staleness_ms": 60_000}
    for c in clients:
        await c.start([("default", 16)], **settings)
    try:
        async def all_done() -> bool:
            stats = await clients[0].queue_stats()
            return bool(stats) and stats[0].completed == 2000
        await wait_for(all_done, timeout=60, what="2000 completions")
    finally:
        for c in clients:
            await c.shutdown()
            await c.close()
    assert len(runs) == 2000 and set(runs.values()) == {1}


_ENDS_WITHOUT_SHUTDOWN = """
import asyncio, logging, sys
import awa
logging.basicConfig(level=logging.DEBUG)
awa._awa.set_log_level(10)

async def main():
    c = awa.AsyncClient(sys.argv[1])

    @c.task(dict, kind="ends_early")
    async def h(job):
        raise awa.TerminalError("x")

    j = await c.insert({}, kind="ends_early", max_attempts=1)
    await c.start([("default", 1)], poll_interval_ms=50)
    while (await c.get_job(j.id)).state != "failed":
        await asyncio.sleep(0.02)
    raise RuntimeError("the script's own bug")

asyncio.run(main())
"""


def test_a_script_that_ends_without_shutdown_exits_without_a_panic(database_url: str) -> None:
    """The runtime's tasks log while the interpreter shuts down (their pool is closed under
    them); the thread forwarding engine events to ``logging`` must then stop, not panic. The
    panic came in about one run in six before the fix, so the script runs several times."""
    import subprocess
    import sys

    for _ in range(4):
        done = subprocess.run([sys.executable, "-c", _ENDS_WITHOUT_SHUTDOWN, database_url],
                              capture_output=True, text=True, timeout=120)
        assert "the script's own bug" in done.stderr, done.stderr[-2000:]
        assert "panicked" not in done.stderr, done.stderr[-4000:]
        assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
