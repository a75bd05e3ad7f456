"""awa-pg 0.6.9's types and values (issue 13, item 1): JobState, Job's state and RFC 3339
timestamps, CallbackToken / WaitForCallback, the typed results, the module functions,
outcome value types, progress as an int, update_metadata(updates=...), flush_progress_sync."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
import pickle
import re
import threading
from typing import Any

import awa
import pytest
from awa.testing import AwaTestClient
from helpers import FAST, complete_jobs, wait_for, wait_for_state

# awa-pg's Job timestamps: chrono's to_rfc3339, i.e. "+00:00" and 0, 3 or 6 fractional digits.
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3}|\.\d{6})?\+00:00$")


@dataclasses.dataclass
class Ping:
    n: int = 0


def test_job_state_has_awa_pg_member_names_values_and_positions() -> None:
    names = ["Scheduled", "Available", "Running", "Completed", "Retryable", "Failed", "Cancelled", "WaitingExternal"]
    assert [m.name for m in awa.JobState] == names
    assert [int(m) for m in awa.JobState] == list(range(8))
    assert str(awa.JobState.Available) == "available" and f"{awa.JobState.WaitingExternal}" == "waiting_external"
    assert repr(awa.JobState.Available) == "JobState.Available"
    # Additions kept: the upper-case aliases, equality with the string, hashing.
    assert awa.JobState.AVAILABLE is awa.JobState.Available
    assert awa.JobState.WAITING_EXTERNAL is awa.JobState.WaitingExternal
    assert awa.JobState.Failed == "failed" and {awa.JobState.Failed: 1}["failed"] == 1
    assert awa.JobState("running") is awa.JobState.Running
    assert awa.unique_states([awa.JobState.Scheduled, "failed"]) == 1 | 1 << 5


async def test_job_state_is_a_job_state_and_timestamps_are_rfc3339_everywhere(client: awa.AsyncClient) -> None:
    seen: dict[str, Any] = {}

    @client.task(Ping)
    async def handle(job: awa.Job) -> None:
        seen["state"] = job.state
        seen["deadline"] = job.deadline
        seen["attempted_at"] = job.attempted_at

    inserted = await client.insert(Ping(n=1))
    assert inserted.state is awa.JobState.Available
    for value in (inserted.run_at, inserted.created_at):
        assert isinstance(value, str) and RFC3339.match(value), value
    assert inserted.finalized_at is None and inserted.deadline is None
    await client.start([("default", 1)], **FAST)
    try:
        done = await wait_for_state(client, inserted.id, "completed")
    finally:
        await client.shutdown()
    assert done.state is awa.JobState.Completed
    assert seen["state"] is awa.JobState.Running
    for value in (done.finalized_at, seen["deadline"], seen["attempted_at"]):
        assert isinstance(value, str) and RFC3339.match(value), value
    assert dt.datetime.fromisoformat(done.finalized_at or "") >= dt.datetime.fromisoformat(done.created_at or "")
    assert all(j.state is awa.JobState.Completed for j in await client.list_jobs(state="completed"))


async def test_timestamps_use_as_few_fractional_digits_as_keep_them_exact(client: awa.AsyncClient) -> None:
    base = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)
    cases = {
        base: "2099-01-01T00:00:00+00:00",
        base.replace(microsecond=123000): "2099-01-01T00:00:00.123+00:00",
        base.replace(microsecond=123456): "2099-01-01T00:00:00.123456+00:00",
        # Another offset is shown in UTC.
        dt.datetime(2099, 1, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=2))): "2099-01-01T00:00:00+00:00",
    }
    for run_at, text in cases.items():
        job = await client.insert(Ping(), run_at=run_at)
        assert job.run_at == text and (await client.get_job(job.id)).run_at == text


def test_callback_token_and_wait_for_callback() -> None:
    token = awa.CallbackToken("6f1c2a3e-0000-4000-8000-000000000001")
    assert token.id == str(token) == "6f1c2a3e-0000-4000-8000-000000000001"
    wait = awa.WaitForCallback(token)
    assert wait.callback_id == wait.token == token.id
    # A str is accepted too (an addition: awa-pg takes only the token), and means the same.
    assert awa.WaitForCallback(token.id) == wait
    with pytest.raises(TypeError, match="CallbackToken or a str"):
        awa.WaitForCallback(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        awa.WaitForCallback()  # type: ignore[call-arg]


def test_outcome_values_are_coerced_and_type_checked_as_in_awa_pg() -> None:
    assert awa.RetryAfter(3).seconds == 3.0 and isinstance(awa.RetryAfter(3).seconds, float)
    assert isinstance(awa.Snooze(2).seconds, float)
    for cls in (awa.RetryAfter, awa.Snooze):
        for bad in ("soon", None, [1]):
            with pytest.raises(TypeError, match="must be real number"):
                cls(bad)
            with pytest.raises(awa.ValidationError):  # the same error is a ValidationError too
                cls(bad)
    assert awa.Cancel().reason == "cancelled by handler" and awa.Cancel("x").reason == "x"
    with pytest.raises(TypeError, match="'int' object is not an instance of 'str'"):
        awa.Cancel(3)  # type: ignore[arg-type]
    assert awa.RetryAfter(1) == awa.RetryAfter(1.0)  # kept: equal values compare equal


def test_exception_classes_have_awa_pg_names_hierarchy_and_pickle() -> None:
    for name in ["UniqueConflict", "SchemaNotMigrated", "UnknownJobKind", "SerializationError",
                 "ValidationError", "TerminalError", "DatabaseError", "CallbackNotFound"]:
        cls = getattr(awa, name)
        assert cls.__name__ == name and cls.__mro__[1] is awa.AwaError and cls.__module__ == "awa"
        assert type(pickle.loads(pickle.dumps(cls("m")))) is cls
    assert awa.AwaError.__name__ == "AwaError" and awa.AwaError.__mro__[1] is Exception


def test_migration_functions() -> None:
    listed = awa.migrations()
    versions = [v for v, _, _ in listed]
    assert versions == sorted(versions) and versions[-1] == awa.current_migration_version() == awa._awa.SCHEMA_VERSION
    assert all(isinstance(d, str) and d and isinstance(sql, str) and sql for _, d, sql in listed)
    assert awa.migrations_range(0, awa.current_migration_version()) == listed
    assert [v for v, _, _ in awa.migrations_range(1, 5)] == [v for v in versions if 1 < v <= 5]
    assert awa.migrations_range(5, 1) == []
    assert awa.schema_patches() == []  # awa-pg's maintenance-line patches: none here


async def test_module_migrate_takes_a_url(empty_database: str) -> None:
    await awa.migrate(empty_database)
    await awa.migrate(empty_database)  # idempotent
    c = awa.AsyncClient(empty_database)
    try:
        assert (await c.health_check()).schema_version == awa.current_migration_version()
        assert (await c.insert(Ping())).state is awa.JobState.Available
    finally:
        await c.close()


async def test_health_check_is_typed(client: awa.AsyncClient) -> None:
    idle = await client.health_check()
    assert isinstance(idle, awa.HealthCheck)
    assert (idle.healthy, idle.postgres_connected, idle.poll_loop_alive, idle.heartbeat_alive,
            idle.shutting_down, idle.leader, idle.queues) == (False, True, False, False, False, False, {})
    gate = asyncio.Event()
    started = asyncio.Event()

    @client.task(Ping, queue="hq")
    async def handle(job: awa.Job) -> None:
        started.set()
        await gate.wait()

    await client.insert(Ping(n=1), queue="hq")
    await client.insert(Ping(n=2), queue="hq")
    await client.start([("hq", 1)], **FAST)
    try:
        await asyncio.wait_for(started.wait(), 10)
        running = await client.health_check()
        assert running.healthy and running.postgres_connected and running.poll_loop_alive
        assert running.heartbeat_alive and not running.shutting_down
        assert set(running.queues) == {"hq"}
        q = running.queues["hq"]
        assert isinstance(q, awa.QueueHealth)
        assert (q.in_flight, q.available, q.max_workers) == (1, 1, 1)
        await wait_for(lambda: _leads(client), what="leadership")
    finally:
        gate.set()
        await client.shutdown()
    after = await client.health_check()
    assert isinstance(after, awa.HealthCheck) and not after.healthy and after.postgres_connected


async def _leads(client: awa.AsyncClient) -> bool:
    return (await client.health_check()).leader


async def test_queue_stats_are_typed(client: awa.AsyncClient) -> None:
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    done = await client.insert(Ping(), queue="qs")
    await client.insert(Ping(), queue="qs")
    await client.insert(Ping(), queue="qs", run_at=future)
    await client.insert(Ping())
    # One completed in the last hour, by a worker's path.
    await complete_jobs(client, [done.id])
    await client.pause_queue("paused_empty")
    stats = {s.queue: s for s in await client.queue_stats()}
    assert set(stats) == {"default", "qs", "paused_empty"}
    qs = stats["qs"]
    assert isinstance(qs, awa.QueueStat)
    assert (qs.total_queued, qs.scheduled, qs.available, qs.running, qs.failed, qs.retryable,
            qs.waiting_external, qs.completed_last_hour, qs.paused) == (2, 1, 1, 0, 0, 0, 0, 1, False)
    assert qs.lag_seconds is not None and 0 <= qs.lag_seconds < 60
    empty = stats["paused_empty"]
    assert empty.paused and empty.total_queued == 0 and empty.lag_seconds is None
    with pytest.raises(TypeError):
        qs["available"]  # type: ignore[index]


async def test_progress_percent_is_an_int_and_update_metadata_takes_updates(client: awa.AsyncClient) -> None:
    seen: list[Any] = []

    async def handler(job: awa.Job) -> None:
        job.set_progress(42, "working")
        seen.append(dict(job.progress or {}))
        job.set_progress(33.6)
        job.set_progress(250)
        seen.append((job.progress or {})["percent"])
        job.update_metadata(updates={"cursor": 7})
        seen.append((job.progress or {})["metadata"])
        with pytest.raises(TypeError):
            job.set_progress("half")  # type: ignore[arg-type]
        with pytest.raises(awa.ValidationError):
            job.set_progress(math.nan)
        return None

    await client.insert(Ping(), kind="prog")
    result = await AwaTestClient(client).work_one(dict, handler, kind="prog")
    assert result.is_completed(), result
    assert seen[0] == {"percent": 42, "message": "working"} and type(seen[0]["percent"]) is int
    assert seen[1] == 100 and type(seen[1]) is int
    assert seen[2] == {"cursor": 7}


async def test_flush_progress_sync_writes_from_a_handler_thread(client: awa.AsyncClient) -> None:
    rows: list[Any] = []
    threads: list[bool] = []

    async def read_progress(job_id: int) -> Any:
        async with client.transaction() as tx:
            return (await tx.fetch_one("SELECT progress FROM awa.jobs WHERE id = $1", job_id))["progress"]

    async def handler(job: awa.Job) -> None:
        def work() -> None:
            threads.append(threading.current_thread() is not threading.main_thread())
            job.set_progress(10, "from a thread")
            job.flush_progress_sync()

        await asyncio.to_thread(work)
        rows.append(await read_progress(job.id))  # written before the handler returns
        job.flush_progress_sync()  # nothing pending: a no-op

    await client.insert(Ping(), kind="flush")
    result = await AwaTestClient(client).work_one(dict, handler, kind="flush")
    assert result.is_completed(), result
    assert threads == [True]
    assert rows == [{"percent": 10, "message": "from a thread"}]
