"""awa.testing as awa-pg 0.6.9 has it (issue 13, item 9): HandlerJob with awa-pg's fields and
order, JobRow, NoJob, and the awa_client fixture served by the package's pytest plugin."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import pickle
import subprocess
import sys

import awa
import pytest
from awa.testing import _QUEUE_STORAGE_JOB_TABLES, HandlerJob, JobRow, NoJob, WorkResult


@dataclasses.dataclass
class SendEmail:
    to: str


def test_handler_job_takes_awa_pg_fields_in_awa_pg_order() -> None:
    deadline = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)
    positional = HandlerJob(SendEmail("a"), 7, 2, 5, "mail", 3, deadline, {"m": 1}, ["t"])
    keyword = HandlerJob(args=SendEmail("a"), id=7, attempt=2, max_attempts=5, queue="mail", priority=3,
                         deadline=deadline, metadata={"m": 1}, tags=["t"])
    for job in (positional, keyword):
        assert (job.id, job.attempt, job.max_attempts, job.queue, job.priority, job.deadline, job.metadata,
                job.tags) == (7, 2, 5, "mail", 3, deadline, {"m": 1}, ["t"])
        assert job.args == SendEmail("a") and job.kind == "send_email"
        assert job.is_cancelled() is False and job.state is awa.JobState.Running
    # Ours: defaults for everything after args, kind by keyword, and staging.
    job = HandlerJob(SendEmail("b"), kind="custom")
    assert (job.id, job.attempt, job.priority, job.tags, job.kind) == (1, 1, 2, [], "custom")
    job.enqueue_on_completion(SendEmail("c"), queue="next")
    assert [s.queue for s in job.staged] == ["next"]
    job.set_progress(55.4)
    job.update_metadata(updates={"k": 1})
    job.flush_progress_sync()
    assert job.progress == {"percent": 55, "metadata": {"k": 1}}


def test_job_row_and_no_job() -> None:
    row = {"id": 1, "kind": "k", "queue": "q", "args": {"a": 1}, "attempt": 1, "max_attempts": 25,
           "priority": 2, "tags": None, "state": "completed", "extra": "ignored"}
    assert JobRow.from_row(row) == JobRow(1, "k", "q", {"a": 1}, 1, 25, 2, [], "completed")
    assert JobRow(1, "k", "q", {}, 0, 25, 2, []).state is None
    assert not NoJob and repr(NoJob) == "NoJob" and type(NoJob)() is NoJob
    assert pickle.loads(pickle.dumps(NoJob)) is NoJob


async def test_work_one_with_nothing_claimable_returns_no_job(client: awa.AsyncClient) -> None:
    async def handler(job: awa.Job) -> None:
        raise AssertionError("not called")

    result = await awa.testing.AwaTestClient(client).work_one(SendEmail, handler)
    assert isinstance(result, WorkResult)
    assert result.job is NoJob and result.is_no_job() and result.outcome == "no_job"


def test_the_fixture_is_registered_as_a_pytest_plugin(pytestconfig: pytest.Config) -> None:
    entry_points = importlib.metadata.entry_points(group="pytest11")
    assert any(ep.name == "awa" and ep.value == "awa.pytest_plugin" for ep in entry_points)
    assert pytestconfig.pluginmanager.has_plugin("awa")
    # awa-pg's documented import works too, and importing awa.testing alone needs no pytest.
    from awa.pytest_plugin import awa_client as plugin_fixture
    from awa.testing import awa_client

    assert awa_client is plugin_fixture and "awa_client" in awa.testing.__all__
    code = "import sys, awa.testing; assert 'pytest' not in sys.modules and 'pytest_asyncio' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_awa_client_fixture_gives_a_migrated_database_of_its_own(awa_client: awa.testing.AwaTestClient) -> None:
    seen: list[str] = []

    async def handle(job: awa.Job) -> None:
        seen.append(job.args.to)

    job = await awa_client.insert(SendEmail(to="x@example.com"))
    result = await awa_client.work_one(SendEmail, handle)
    assert result.is_completed() and seen == ["x@example.com"]
    assert result.job and result.job.id == job.id and result.job.state is awa.JobState.Completed
    assert "awa_test_" in awa_client.client.database_url, "a database of its own"
    await awa_client.clean()
    assert await awa_client.client.list_jobs() == []


@dataclasses.dataclass
class Chore:
    n: int


async def _fill_every_table(t: awa.testing.AwaTestClient) -> None:
    """Jobs in the states a test leaves behind: available, scheduled, completed, failed, and
    one holding a unique key."""

    async def ok(job: awa.Job) -> None:
        return None

    async def broken(job: awa.Job) -> None:
        raise RuntimeError("broken")

    await t.insert(Chore(1))
    await t.insert(Chore(2), run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    await t.insert(Chore(3), unique_opts={})
    assert (await t.work_one(Chore, ok)).is_completed()
    await t.insert(Chore(4), queue="failing", max_attempts=1)
    assert (await t.work_one(Chore, broken, queue="failing")).outcome == "failed"


async def _assert_clean(t: awa.testing.AwaTestClient) -> None:
    assert await t.client.list_jobs() == []
    again = await t.insert(Chore(3), unique_opts={})  # the key went with its job
    assert again.state is awa.JobState.Available


async def test_clean_empties_the_engine_at_hand(client: awa.AsyncClient) -> None:
    t = awa.testing.AwaTestClient(client)
    await _fill_every_table(t)
    assert {j.state.value for j in await client.list_jobs()} == {"available", "scheduled", "completed", "failed"}
    await t.clean()
    await _assert_clean(t)


async def test_clean_empties_queue_storage_in_any_schema_and_keeps_it_the_engine(empty_database: str) -> None:
    client = awa.AsyncClient(empty_database)
    try:
        await client.migrate()
        await client.install_queue_storage(schema="qs_clean", queue_slot_count=4, lease_slot_count=2)
        t = awa.testing.AwaTestClient(client)
        await _fill_every_table(t)
        await t.clean()
        await _assert_clean(t)
        async with client.transaction() as tx:
            state = await tx.fetch_one("SELECT current_engine, details ->> 'schema' AS schema "
                                       "FROM awa.storage_transition_state")
            # Every table of the schema that is not a partition is either emptied by clean()
            # or one of the positions it keeps: a new job-holding table must join the list.
            rows = await tx.fetch_all(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'qs_clean' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            )
        assert (state["current_engine"], state["schema"]) == ("queue_storage", "qs_clean")
        kept = {"queue_ring_state", "queue_ring_slots", "lease_ring_state", "lanes", "qs_substrate"}
        assert {r["relname"] for r in rows} == kept | set(_QUEUE_STORAGE_JOB_TABLES)
    finally:
        await client.close()
