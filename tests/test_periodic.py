"""Periodic jobs from Python with awa-pg 0.6.9's API: registration, validation, exactly one
job per fire time across clients, and the schedule operations."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any

import pydantic
import pytest

import awa
from helpers import FAST, wait_for


@dataclasses.dataclass
class Heartbeat:
    source: str


class DailyReport(pydantic.BaseModel):
    team: str
    days: int = 1


def _fire_times(jobs: list[awa.Job], name: str) -> list[dt.datetime]:
    return sorted(
        dt.datetime.fromisoformat(j.metadata["awa:cron_fire_at"])
        for j in jobs
        if j.metadata.get("awa:cron_name") == name and "awa:cron_triggered" not in j.metadata
    )


async def test_awa_pg_example_registers_lists_and_deletes(client: awa.AsyncClient) -> None:
    @client.task(DailyReport, queue="reports")
    async def report(job: awa.Job) -> None:
        return None

    # awa-pg's documented call, unchanged.
    client.periodic(
        "daily_report",
        "0 9 * * *",
        DailyReport,
        DailyReport(team="data"),
        timezone="America/New_York",
        queue="reports",
        priority=3,
        tags=["nightly"],
        metadata={"owner": "data"},
    )
    await client.start([("reports", 1)], **FAST)
    try:
        rows = await client.list_cron_jobs()
        assert [r["name"] for r in rows] == ["daily_report"]
        row = rows[0]
        assert row["cron_expr"] == "0 9 * * *"
        assert row["timezone"] == "America/New_York"
        assert row["kind"] == "daily_report"
        assert row["queue"] == "reports"
        assert row["args"] == {"team": "data", "days": 1}
        assert (row["priority"], row["max_attempts"]) == (3, 25)
        assert row["tags"] == ["nightly"] and row["metadata"] == {"owner": "data"}
        assert row["missed_fire_policy"] == "coalesce" and row["paused"] is False
        # The leader records the next fire: 09:00 New York time.
        next_fire = await wait_for(
            lambda: _next_fire(client, "daily_report"), what="next_fire_at")
        local = dt.datetime.fromisoformat(next_fire).astimezone(_zone("America/New_York"))
        assert (local.hour, local.minute) == (9, 0)
    finally:
        await client.shutdown()
    assert await client.delete_cron_job("daily_report") is True
    assert await client.delete_cron_job("daily_report") is False
    assert await client.list_cron_jobs() == []


def _zone(name: str) -> Any:
    import zoneinfo

    return zoneinfo.ZoneInfo(name)


async def _next_fire(client: awa.AsyncClient, name: str) -> Any:
    for r in await client.list_cron_jobs():
        if r["name"] == name:
            return r["next_fire_at"]
    return None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"cron_expr": "61 * * * *"}, 'invalid cron expression "61 * * * *"'),
        ({"cron_expr": "* * *"}, "got 3"),
        ({"cron_expr": "not a cron"}, "invalid cron expression"),
        ({"timezone": "Mars/Olympus"}, 'invalid timezone "Mars/Olympus"'),
        ({"missed_fire_policy": "sometimes"}, "missed_fire_policy"),
        ({"priority": 9}, "priority is 9"),
    ],
)
async def test_bad_definitions_raise_validation_error_at_registration(
    client: awa.AsyncClient, kwargs: dict[str, Any], needle: str
) -> None:
    call: dict[str, Any] = {"cron_expr": "* * * * *", **kwargs}
    expr = call.pop("cron_expr")
    with pytest.raises(awa.ValidationError) as err:
        client.periodic("bad", expr, Heartbeat, Heartbeat(source="x"), **call)
    assert needle in str(err.value)
    assert '"bad"' in str(err.value), "the error names the schedule"
    assert await client.list_cron_jobs() == [], "nothing was registered"


async def test_args_type_must_be_a_class(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError, match="args_type"):
        client.periodic("d", "* * * * *", dict, {"a": 1})  # type: ignore[arg-type]


async def test_two_clients_run_an_every_second_schedule_once_per_fire(database_url: str) -> None:
    seen: list[awa.Job] = []
    clients = [awa.AsyncClient(database_url) for _ in range(2)]
    try:
        for c in clients:
            @c.task(Heartbeat)
            async def beat(job: awa.Job) -> None:
                seen.append(job)

            c.periodic("beat", "* * * * * *", Heartbeat, Heartbeat(source="py"))
            await c.start([("default", 2)], **FAST)
        await wait_for(lambda: len(_fire_times(seen, "beat")) >= 4, timeout=20, what="4 fires")
    finally:
        for c in clients:
            await c.shutdown()
    await clients[0].delete_cron_job("beat")
    fires = _fire_times(seen, "beat")
    assert len(set(fires)) == len(fires), f"a fire ran twice: {fires}"
    span = int((fires[-1] - fires[0]).total_seconds()) + 1
    assert span == len(fires), f"a fire was lost: {fires}"
    assert all(j.args == Heartbeat(source="py") for j in seen)
    for c in clients:
        await c.close()


async def test_pause_resume_and_trigger(client: awa.AsyncClient) -> None:
    client.periodic("hourly", "0 * * * *", Heartbeat, Heartbeat(source="ops"),
                    missed_fire_policy="catch_up", queue="ops")

    @client.task(Heartbeat, queue="other")
    async def beat(job: awa.Job) -> None:
        return None

    await client.start([("other", 1)], **FAST)
    with pytest.raises(awa.AwaError, match="before start"):
        client.periodic("late", "* * * * *", Heartbeat, Heartbeat(source="x"))
    await client.shutdown()
    assert await client.pause_cron_job("hourly") is True
    assert (await client.list_cron_jobs())[0]["paused"] is True
    job = await client.trigger_cron_job("hourly")
    assert job is not None
    assert job.kind == "heartbeat" and job.queue == "ops"
    assert job.args == {"source": "ops"} or job.args == Heartbeat(source="ops")
    assert job.metadata["awa:cron_name"] == "hourly"
    assert job.metadata["awa:cron_triggered"] is True
    assert "awa:cron_fire_at" in job.metadata
    assert await client.resume_cron_job("hourly") is True
    row = (await client.list_cron_jobs())[0]
    assert row["paused"] is False and row["missed_fire_policy"] == "catch_up"
    assert await client.pause_cron_job("nope") is False
    assert await client.resume_cron_job("nope") is False
    assert await client.trigger_cron_job("nope") is None
    # The _sync mirrors block instead (run off the loop thread).
    rows = await asyncio.to_thread(client.list_cron_jobs_sync)
    assert [r["name"] for r in rows] == ["hourly"]
    assert await asyncio.to_thread(client.pause_cron_job_sync, "hourly") is True
    assert await asyncio.to_thread(client.resume_cron_job_sync, "hourly") is True
    assert (await asyncio.to_thread(client.trigger_cron_job_sync, "hourly")) is not None
    assert await asyncio.to_thread(client.delete_cron_job_sync, "hourly") is True


def test_blocking_client(sync_client: awa.Client) -> None:
    @sync_client.task(Heartbeat, queue="other")
    async def beat(job: awa.Job) -> None:
        return None

    sync_client.periodic("sync_daily", "30 6 * * 1-5", Heartbeat, Heartbeat(source="sync"),
                         timezone="Europe/London")
    sync_client.start([("other", 1)], **FAST)
    sync_client.shutdown()
    assert [r["name"] for r in sync_client.list_cron_jobs()] == ["sync_daily"]
    assert [r["name"] for r in sync_client.list_cron_jobs_sync()] == ["sync_daily"]
    assert sync_client.pause_cron_job("sync_daily") is True
    job = sync_client.trigger_cron_job("sync_daily")
    assert job is not None and job.metadata["awa:cron_name"] == "sync_daily"
    assert sync_client.resume_cron_job("sync_daily") is True
    assert sync_client.delete_cron_job("sync_daily") is True
    assert sync_client.delete_cron_job_sync("sync_daily") is False
    with pytest.raises(awa.ValidationError, match="Nowhere/Land"):
        sync_client.periodic("z", "* * * * *", Heartbeat, Heartbeat(source="x"), timezone="Nowhere/Land")


async def test_a_changed_definition_updates_the_row(database_url: str) -> None:
    async def register(expr: str) -> None:
        c = awa.AsyncClient(database_url)

        @c.task(Heartbeat, queue="other")
        async def beat(job: awa.Job) -> None:
            return None

        c.periodic("changing", expr, Heartbeat, Heartbeat(source="v"))
        await c.start([("other", 1)], **FAST)
        await c.shutdown()
        await c.close()

    await register("0 1 * * *")
    c = awa.AsyncClient(database_url)
    try:
        first = (await c.list_cron_jobs())[0]
        await register("0 1 * * *")
        assert (await c.list_cron_jobs())[0]["updated_at"] == first["updated_at"], "unchanged"
        await register("0 2 * * *")
        changed = (await c.list_cron_jobs())[0]
        assert changed["cron_expr"] == "0 2 * * *"
        assert changed["updated_at"] != first["updated_at"]
        assert changed["created_at"] == first["created_at"]
        await c.delete_cron_job("changing")
    finally:
        await c.close()
