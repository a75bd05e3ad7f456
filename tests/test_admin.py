"""The admin and dead-letter-queue surface as awa-pg 0.6.9 has it (issue 13 item 2): failed-job
maintenance that never acts on everything by accident, typed results, the DLQ with filters,
paging, overrides and bulk calls, job dumps, and the insert value types awa-pg accepts."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import json
import warnings
from typing import Any, Callable

import pytest

import awa
from awa.testing import AwaTestClient
from helpers import fail_jobs


@dataclasses.dataclass
class Chore:
    n: int


@dataclasses.dataclass
class Other:
    n: int


def _instant(value: Any) -> dt.datetime:
    """A job timestamp as a datetime, whether the Job gives a datetime or an RFC 3339 str."""
    if isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


async def _fail(client: awa.AsyncClient, which: Callable[[awa.Job], bool] = lambda job: True) -> None:
    """Fail the available jobs ``which`` picks, as a worker does (``helpers.fail_jobs``)."""
    jobs = sorted(await client.list_jobs(state="available"), key=lambda job: job.id)
    await fail_jobs(client, [job.id for job in jobs if which(job)])


async def _dead_letter(client: awa.AsyncClient) -> list[awa.Job]:
    """Five dead-lettered jobs: chores in queues a and b (tag t on two), one other in a."""
    jobs = [
        await client.insert(Chore(n=1), queue="a", tags=["t"]),
        await client.insert(Chore(n=2), queue="a"),
        await client.insert(Chore(n=3), queue="b", tags=["t"]),
        await client.insert(Chore(n=4), queue="b"),
        await client.insert(Other(n=5), queue="a"),
    ]
    await _fail(client)
    assert await client.bulk_move_failed_to_dlq(allow_all=True, reason="test") == 5
    return jobs


# ----- failed jobs -------------------------------------------------------------------------


async def test_discard_failed_needs_a_kind_and_deletes_only_it(client: awa.AsyncClient) -> None:
    await client.insert(Chore(n=1))
    await client.insert(Chore(n=2), queue="q")
    await client.insert(Other(n=3))
    await _fail(client)
    with pytest.raises(TypeError):
        await client.discard_failed()  # type: ignore[call-arg]
    with pytest.raises(awa.ValidationError):
        await client.discard_failed(None)  # type: ignore[arg-type]
    assert len(await client.list_jobs(state="failed")) == 3, "a bad call deleted nothing"
    assert await client.discard_failed("chore", queue="q") == 1
    assert await client.discard_failed("chore") == 1
    assert [j.kind for j in await client.list_jobs(state="failed")] == ["other"]


async def test_retry_failed_returns_the_jobs_and_refuses_a_bare_call(client: awa.AsyncClient) -> None:
    a = await client.insert(Chore(n=1), queue="q")
    await client.insert(Other(n=2), queue="q")
    await client.insert(Chore(n=3), queue="r")
    await _fail(client)
    with pytest.raises(awa.ValidationError, match="retry_failed requires kind or queue") as info:
        await client.retry_failed()
    assert isinstance(info.value, ValueError), "awa-pg raises ValueError here"
    assert len(await client.list_jobs(state="failed")) == 3
    result = await client.retry_failed(kind="chore", queue="q")
    assert isinstance(result, awa.RetryFailedResult)
    assert (result.matched, [j.id for j in result.jobs], result.pruned_failed_count) == (1, [a.id], None)
    assert result.jobs[0].state == "available"
    nothing = await client.retry_failed(kind="nope")
    assert (nothing.matched, nothing.jobs) == (0, [])
    everything = await client.retry_failed(allow_all=True)
    assert everything.matched == 2 and len(everything.jobs) == 2
    assert await client.list_jobs(state="failed") == []


async def test_pause_queue_records_who_paused_it(client: awa.AsyncClient) -> None:
    await client.pause_queue("pq", "ops@example")
    row = await _queue_meta(client, "pq")
    assert row["paused"] and row["paused_by"] == "ops@example" and row["paused_at"] is not None
    await client.pause_queue(queue="pq", paused_by=None)
    assert (await _queue_meta(client, "pq"))["paused_by"] is None
    await client.pause_queue("pq", paused_by="deploy")
    await client.resume_queue("pq")
    row = await _queue_meta(client, "pq")
    assert (row["paused"], row["paused_by"], row["paused_at"]) == (False, None, None)
    await client.flush_admin_metadata()  # a no-op: stats are counted live


async def _queue_meta(client: awa.AsyncClient, queue: str) -> dict[str, Any]:
    async with client.transaction() as tx:
        return await tx.fetch_one(
            "SELECT paused, paused_by, paused_at::text AS paused_at FROM awa.queue_meta WHERE queue = $1", queue
        )


async def test_dump_job_and_dump_run(client: awa.AsyncClient) -> None:
    job = await client.insert(Chore(n=1), tags=["x"])
    dump = json.loads(await client.dump_job(job.id))
    assert sorted(dump) == ["job", "summary", "timeline"]
    assert dump["job"]["id"] == job.id and dump["job"]["tags"] == ["x"]
    assert dump["summary"] == {"original_priority": 2, "can_retry": False, "can_cancel": True,
                               "error_count": 0, "latest_error": None}
    assert [e["label"] for e in dump["timeline"]] == ["Created"]
    run = json.loads(await client.dump_run(job.id))
    assert (run["selected_attempt"], run["source"], run["state"]) == (0, "current_job_row", "available")

    # Attempt 1 fails and will be retried; retried now, attempt 2 fails for good.
    async def flaky(_job: Any) -> None:
        raise RuntimeError("boom")

    first = await AwaTestClient(client).work_one(Chore, flaky)
    assert first.outcome == "retryable", first
    assert (await client.retry(job.id)).state == "available"
    await fail_jobs(client, [job.id])
    dump = json.loads(await client.dump_job(job.id))
    assert dump["summary"]["can_retry"] and not dump["summary"]["can_cancel"]
    assert dump["summary"]["latest_error"] == "boom"
    labels = [e["label"] for e in dump["timeline"]]
    assert labels[0] == "Created" and "Attempt 1 failed" in labels and labels[-1] == "Failed"
    earlier = json.loads(await client.dump_run(job.id, 1))
    assert (earlier["source"], earlier["error"]) == ("error_history", "RuntimeError: boom")
    with pytest.raises(awa.ValidationError, match="attempt 7 is not present"):
        await client.dump_run(job.id, 7)
    with pytest.raises(awa.JobNotFound):
        await client.dump_job(987654321)


async def test_worker_is_a_deprecated_alias_of_task(client: awa.AsyncClient) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")

        @client.worker(Chore, queue="w")
        async def handle(job: awa.Job) -> None:
            return None

    assert [w.category for w in seen] == [DeprecationWarning]
    assert "client.task()" in str(seen[0].message)
    assert client._tasks["chore"].queue == "w"


# ----- insert value types ------------------------------------------------------------------


async def test_run_at_as_an_rfc3339_string(client: awa.AsyncClient) -> None:
    job = await client.insert(Chore(n=1), run_at="2099-01-01T00:00:00Z")
    assert job.state == "scheduled"
    assert _instant(job.run_at) == dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)
    shifted = await client.insert(Chore(n=2), run_at="2099-01-01T02:00:00+02:00")
    assert _instant(shifted.run_at) == _instant(job.run_at)
    for bad in ("tomorrow", "2099-01-01", "2099-01-01T00:00:00"):
        with pytest.raises(awa.ValidationError, match="run_at"):
            await client.insert(Chore(n=3), run_at=bad)
    with pytest.raises(awa.ValidationError, match="run_at must be a datetime or an RFC 3339 string, not int"):
        await client.insert(Chore(n=3), run_at=123)  # type: ignore[arg-type]


async def test_ordering_key_as_bytes_or_str(client: awa.AsyncClient) -> None:
    assert (await client.insert(Chore(n=1), ordering_key=b"customer-42")).ordering_key == "customer-42"
    assert (await client.insert(Chore(n=2), ordering_key="customer-42")).ordering_key == "customer-42"
    with pytest.raises(awa.ValidationError, match="UTF-8"):
        await client.insert(Chore(n=3), ordering_key=b"\xff\xfe")
    with pytest.raises(awa.ValidationError, match="ordering_key must be a str or bytes, not int"):
        await client.insert(Chore(n=4), ordering_key=42)  # type: ignore[arg-type]
    assert len(await client.list_jobs()) == 2


async def test_tags_must_be_a_list_of_str(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError, match="tags must be a list of str, not str"):
        await client.insert(Chore(n=1), tags="notalist")  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match=r"tags\[1\] must be a str, not int"):
        await client.insert(Chore(n=1), tags=["a", 1])  # type: ignore[list-item]
    with pytest.raises(awa.ValidationError, match="tags must be a list of str"):
        await client.insert_many([Chore(n=1)], tags="abc")  # type: ignore[arg-type]
    assert await client.list_jobs() == []
    assert (await client.insert(Chore(n=1), tags=("a", "b"))).tags == ["a", "b"]


async def test_bad_input_classes(client: awa.AsyncClient) -> None:
    # args of a type args can never be: a ValidationError, as in awa-pg.
    with pytest.raises(awa.ValidationError, match="args must be a dataclass, a Pydantic model or a dict, not int"):
        await client.insert(42)
    # Every ValidationError is a ValueError too (awa-pg raises ValueError for some bad input).
    with pytest.raises(ValueError, match="unknown job state"):
        await client.list_jobs(state="nope")
    assert issubclass(awa.ValidationError, awa.AwaError) and issubclass(awa.ValidationError, ValueError)


def test_signatures_are_explicit() -> None:
    # No **kwargs on the insert family: a misspelt keyword is a TypeError at the call.
    for cls in (awa.AsyncClient, awa.Client, awa.Transaction, awa.SyncTransaction):
        for name in ("insert", "insert_many", "insert_many_copy", "enqueue_many_copy"):
            params = inspect.signature(getattr(cls, name)).parameters
            assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), f"{cls.__name__}.{name}"
            assert "ordering_key" in params and "run_at" in params
        for name in ("execute", "fetch_one", "fetch_optional", "fetch_all"):
            if hasattr(cls, name):
                assert list(inspect.signature(getattr(cls, name)).parameters)[1] == "query"
    # The blocking client's admin and DLQ calls are real methods (dir(), IDEs, stubs).
    for name in ("pause_queue", "retry_failed", "discard_failed", "dump_job", "dump_run", "list_dlq",
                 "get_dlq_job", "dlq_depth_by_queue", "retry_from_dlq", "bulk_retry_from_dlq",
                 "move_failed_to_dlq", "bulk_move_failed_to_dlq", "purge_dlq_job", "purge_dlq",
                 "flush_admin_metadata", "worker"):
        assert name in vars(awa.Client), name
        assert inspect.signature(getattr(awa.Client, name)) .parameters.keys() == \
            inspect.signature(getattr(awa.AsyncClient, name)).parameters.keys(), name


async def test_enqueue_many_copy_takes_the_stripe_count_and_refuses_other_than_one(client: awa.AsyncClient) -> None:
    assert await client.enqueue_many_copy([Chore(n=1)], queue_storage_queue_stripe_count=1) == 1
    with pytest.raises(awa.ValidationError, match="queue_storage_queue_stripe_count is 4"):
        await client.enqueue_many_copy([Chore(n=2)], queue_storage_queue_stripe_count=4)
    assert len(await client.list_jobs()) == 1


async def test_transaction_query_keyword(client: awa.AsyncClient) -> None:
    async with client.transaction() as tx:
        assert (await tx.fetch_one("SELECT 1 AS x")) == {"x": 1}
        assert await tx.fetch_optional(query="SELECT 1 AS x WHERE false") is None
        assert await tx.fetch_all(query="SELECT 2 AS x") == [{"x": 2}]
        assert await tx.execute(query="SELECT 1") == 1
        with pytest.raises(awa.DatabaseError):
            await tx.fetch_one(query="SELECT 1 AS x WHERE false")


# ----- dead-letter queue -------------------------------------------------------------------


async def test_list_dlq_filters_and_pages(client: awa.AsyncClient) -> None:
    jobs = await _dead_letter(client)
    entries = await client.list_dlq()
    assert len(entries) == 5 and all(isinstance(e, awa.DlqEntry) for e in entries)
    e = entries[0]
    assert isinstance(e.job, awa.Job) and e.job.state == "failed" and e.reason == "test"
    assert e.dlq_at.tzinfo is not None and isinstance(e.original_run_lease, int)
    assert e.job.errors and e.job.finalized_at is not None
    # Newest first: one statement moved them all (same dlq_at), so by id descending.
    assert [x.job.id for x in entries] == sorted((j.id for j in jobs), reverse=True)
    assert {x.job.id for x in await client.list_dlq(kind="other")} == {jobs[4].id}
    assert len(await client.list_dlq(queue="b")) == 2
    assert {x.job.id for x in await client.list_dlq(tag="t")} == {jobs[0].id, jobs[2].id}
    assert len(await client.list_dlq(kind="chore", queue="a", tag="t")) == 1
    # Paging with the last entry's (dlq_at, id) as the cursor walks every entry exactly once.
    seen: list[int] = []
    page = await client.list_dlq(limit=2)
    while page:
        seen += [x.job.id for x in page]
        last = page[-1]
        page = await client.list_dlq(limit=2, before_dlq_at=last.dlq_at, before_id=last.job.id)
    assert seen == [x.job.id for x in entries]
    assert [x.job.id for x in await client.list_dlq(before_id=jobs[2].id)] == [jobs[1].id, jobs[0].id]
    with pytest.raises(awa.ValidationError, match="limit"):
        await client.list_dlq(limit=-1)


async def test_get_dlq_job_and_depths(client: awa.AsyncClient) -> None:
    jobs = await _dead_letter(client)
    entry = await client.get_dlq_job(jobs[0].id)
    assert entry is not None and entry.job.id == jobs[0].id and entry.job.args == {"n": 1}
    assert await client.get_dlq_job(987654321) is None
    assert await client.dlq_depth() == 5
    assert await client.dlq_depth(queue="a") == 3
    assert await client.dlq_depth_by_queue() == [("a", 3), ("b", 2)]


async def test_retry_from_dlq_with_overrides(client: awa.AsyncClient) -> None:
    jobs = await _dead_letter(client)
    plain = await client.retry_from_dlq(jobs[0].id)
    assert plain is not None and (plain.state, plain.attempt, plain.queue, plain.priority) == ("available", 0, "a", 2)
    later = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)
    moved = await client.retry_from_dlq(jobs[1].id, run_at=later, priority=1, queue="revived")
    assert moved is not None and (moved.state, moved.queue, moved.priority) == ("scheduled", "revived", 1)
    assert _instant(moved.run_at) == later and moved.id == jobs[1].id
    assert await client.retry_from_dlq(jobs[1].id) is None, "no longer in the DLQ"
    for bad in ({"priority": 9}, {"queue": ""}, {"queue": "q" * 201}):
        with pytest.raises(awa.ValidationError):
            await client.retry_from_dlq(jobs[2].id, **bad)
    assert await client.get_dlq_job(jobs[2].id) is not None, "a refused retry leaves the entry"


async def test_bulk_retry_from_dlq(client: awa.AsyncClient) -> None:
    await _dead_letter(client)
    with pytest.raises(awa.ValidationError, match=r"bulk_retry_from_dlq requires at least one of kind, queue, or tag \(or allow_all=true\)"):
        await client.bulk_retry_from_dlq()
    assert await client.dlq_depth() == 5
    assert await client.bulk_retry_from_dlq(tag="t") == 2
    assert await client.bulk_retry_from_dlq(kind="chore", queue="a") == 1
    assert await client.bulk_retry_from_dlq(allow_all=True) == 2
    assert await client.dlq_depth() == 0
    assert len(await client.list_jobs(state="available")) == 5


async def test_move_failed_to_dlq(client: awa.AsyncClient) -> None:
    failed = await client.insert(Chore(n=1))
    waiting = await client.insert(Chore(n=2))
    await _fail(client, lambda job: job.id == failed.id)
    entry = await client.move_failed_to_dlq(failed.id, "operator said so")
    assert entry is not None and entry.reason == "operator said so" and entry.job.id == failed.id
    assert await client.move_failed_to_dlq(waiting.id, "not failed") is None
    assert await client.move_failed_to_dlq(987654321, "missing") is None
    assert (await client.get_job(waiting.id)).state == "available"
    with pytest.raises(awa.JobNotFound):
        await client.get_job(failed.id)


async def test_bulk_move_failed_to_dlq(client: awa.AsyncClient) -> None:
    await client.insert(Chore(n=1), queue="a")
    await client.insert(Other(n=2), queue="a")
    await client.insert(Chore(n=3), queue="b")
    await client.insert(Chore(n=4), queue="b")  # stays available
    await _fail(client, lambda job: job.args["n"] != 4)
    with pytest.raises(awa.ValidationError, match=r"bulk_move_failed_to_dlq requires at least one of kind or queue \(or allow_all=true\)"):
        await client.bulk_move_failed_to_dlq()
    assert await client.bulk_move_failed_to_dlq(kind="other") == 1
    assert await client.bulk_move_failed_to_dlq(queue="b", reason="why") == 1
    assert (await client.list_dlq(queue="b"))[0].reason == "why"
    assert await client.bulk_move_failed_to_dlq(allow_all=True) == 1
    assert [j.args["n"] for j in await client.list_jobs()] == [4]


async def test_purge(client: awa.AsyncClient) -> None:
    jobs = await _dead_letter(client)
    assert await client.purge_dlq_job(jobs[0].id) is True
    assert await client.purge_dlq_job(jobs[0].id) is False
    with pytest.raises(awa.ValidationError, match=r"purge_dlq requires at least one of kind, queue, or tag \(or allow_all=true\)"):
        await client.purge_dlq()
    with pytest.raises(awa.ValidationError, match="purge_dlq requires"):
        await client.purge_dlq(before_id=10**9)  # a cursor alone is not a filter
    assert await client.dlq_depth() == 4
    assert await client.purge_dlq(kind="other") == 1
    assert await client.purge_dlq(queue="a", before_id=jobs[1].id + 1) == 1
    assert await client.purge_dlq(allow_all=True) == 2
    assert await client.dlq_depth() == 0


def test_the_blocking_client_has_the_same_surface(sync_client: awa.Client) -> None:
    job = sync_client.insert(Chore(n=1), queue="s", run_at="2000-01-01T00:00:00Z")
    sync_client._run(_fail(sync_client._async))
    assert sync_client.retry_failed(queue="s").matched == 1
    sync_client._run(_fail(sync_client._async))
    entry = sync_client.move_failed_to_dlq(job.id, "sync")
    assert entry is not None and sync_client.list_dlq()[0].job.id == job.id
    assert sync_client.dlq_depth_by_queue() == [("s", 1)]
    revived = sync_client.retry_from_dlq(job.id, priority=4)
    assert revived is not None and revived.priority == 4
    sync_client.pause_queue("s", "me")
    json.loads(sync_client.dump_job(job.id))
    assert sync_client.purge_dlq(allow_all=True) == 0
    with sync_client.transaction() as tx:
        assert tx.fetch_one(query="SELECT 1 AS x") == {"x": 1}
        assert tx.insert(Chore(n=2), ordering_key=b"k").ordering_key == "k"


def test_a_call_after_close_raises_without_leaking_a_coroutine(database_url: str) -> None:
    c = awa.Client(database_url)
    c.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a never-awaited coroutine would warn
        with pytest.raises(awa.DatabaseError, match="closed"):
            c.get_job(1)


async def test_a_cancel_records_no_error_and_keeps_the_last_one(client: awa.AsyncClient) -> None:
    fresh = await client.insert(Chore(n=1))
    assert (await client.cancel(fresh.id)).state == "cancelled"
    assert (await client.get_job(fresh.id)).errors == [], "a job that never ran has no error"
    # Failed, retried, then cancelled before it ran again: its error is still the failure's.
    ran = await client.insert(Chore(n=2))
    await fail_jobs(client, [ran.id], error="broken")
    await client.retry(ran.id)
    await client.cancel(ran.id)
    job = await client.get_job(ran.id)
    assert job.state == "cancelled" and [e["error"] for e in job.errors] == ["broken"]


async def test_a_revived_job_takes_its_unique_key_back(client: awa.AsyncClient) -> None:
    job = await client.insert(Chore(n=7), unique_opts={})
    await fail_jobs(client, [job.id])
    await client.move_failed_to_dlq(job.id, "by hand")
    # Dead-lettered, the key is free: a new job takes it.
    taker = await client.insert(Chore(n=7), unique_opts={})
    with pytest.raises(awa.UniqueConflict, match="chore"):
        await client.retry_from_dlq(job.id)
    with pytest.raises(awa.UniqueConflict):
        await client.bulk_retry_from_dlq(kind="chore")
    assert [d.job.id for d in await client.list_dlq()] == [job.id], "the DLQ row stays"
    assert (await client.get_job(taker.id)).state == "available"
    # Once the key is free again, the revive takes it back: the job is unique again.
    await client.cancel(taker.id)
    revived = await client.retry_from_dlq(job.id)
    assert revived is not None and revived.state == "available"
    with pytest.raises(awa.UniqueConflict):
        await client.insert(Chore(n=7), unique_opts={})
