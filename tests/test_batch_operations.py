"""Durable batch operations as awa-pg 0.6.9 has them (docs/batch-operations.md): preview,
submit, the maintenance leader's execution on queued jobs only, filters, refusals, list, get,
cancel, purge, and the blocking twins."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import inspect
from typing import Any

import pytest

import awa

from conftest import ENGINE
from helpers import FAST, complete_jobs, wait_for, wait_for_state

OP_KEYS = {
    "id", "op_kind", "filter", "spec", "state", "submitted_by", "submitted_at", "started_at",
    "finalized_at", "cursor", "total_matched", "processed", "skipped", "errored", "last_error",
    "runner_instance", "retention_until", "updated_at",
}
FILTER_KEYS = {"kind", "queue", "ids", "tag", "state", "created_at_gte", "created_at_lt"}


@dataclasses.dataclass
class Chore:
    n: int


@dataclasses.dataclass
class Errand:
    n: int


@dataclasses.dataclass
class Block:
    n: int


LATER = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)


async def _job(client: awa.AsyncClient, job_id: int) -> awa.Job:
    return await client.get_job(job_id)


async def _finish(client: awa.AsyncClient, job_id: int) -> None:
    """Complete a job through a worker's path (it must be the oldest of its kind and queue)."""
    await complete_jobs(client, [job_id])


async def _wait_finished(client: awa.AsyncClient, op_id: str, timeout: float = 20.0) -> awa.BatchOperation:
    async def done() -> Any:
        op = await client.get_batch_operation(op_id)
        return op if op["state"] in ("completed", "cancelled", "failed") else None

    result: awa.BatchOperation = await wait_for(done, timeout, f"batch operation {op_id} to finish")
    return result


# ----- preview and filters --------------------------------------------------------------------


async def test_preview_counts_queued_jobs_and_samples_the_first_ten(client: awa.AsyncClient) -> None:
    finished = (await client.insert(Chore(n=100), queue="q")).id
    await _finish(client, finished)
    queued = [(await client.insert(Chore(n=i), queue="q")).id for i in range(12)]
    scheduled = (await client.insert(Chore(n=99), queue="q", run_at=LATER)).id
    await client.insert(Chore(n=101), queue="other")

    preview = await client.preview_set_priority(3, filter={"queue": "q"})
    assert preview["total_matched"] == 13, "12 available + 1 scheduled; the completed job is not queued"
    assert [j["id"] for j in preview["sample"]] == queued[:10]
    first = preview["sample"][0]
    assert (first["kind"], first["queue"], first["state"], first["priority"]) == ("chore", "q", "available", 2)
    assert first["args"] == {"n": 0}

    everything = await client.preview_move_queue("elsewhere", priority=1)
    assert everything["total_matched"] == 14, "no filter: every queued job (a preview needs no allow_all)"
    assert scheduled in [j["id"] for j in (await client.preview_set_priority(1, filter={"state": "scheduled"}))["sample"]]
    # A preview changes nothing and records nothing.
    assert (await _job(client, queued[0])).priority == 2
    assert await client.list_batch_operations() == []


async def test_every_filter_key_narrows_the_set(client: awa.AsyncClient) -> None:
    a = await client.insert(Chore(n=1), queue="q", tags=["red"])
    b = await client.insert(Chore(n=2), queue="q", tags=["blue"])
    c = await client.insert(Errand(n=3), queue="r", tags=["red"], run_at=LATER)
    # Backdated with SQL on the table that holds the job: awa.jobs refuses writes to queue
    # storage's jobs, whose available ones are ready entries.
    table = "awa.ready_entries" if ENGINE == "queue_storage" else "awa.jobs"
    await client._execute(f"UPDATE {table} SET created_at = now() - interval '2 days' WHERE id = $1", a.id)
    yesterday = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)

    async def matched(f: awa.BatchOperationFilter) -> list[int]:
        preview = await client.preview_set_priority(4, filter=f)
        ids = [j["id"] for j in preview["sample"]]
        assert preview["total_matched"] == len(ids)
        return ids

    assert await matched({"kind": "errand"}) == [c.id]
    assert await matched({"queue": "q"}) == [a.id, b.id]
    assert await matched({"ids": [c.id, a.id, 10_000]}) == [a.id, c.id]
    assert await matched({"ids": []}) == []
    assert await matched({"tag": "red"}) == [a.id, c.id]
    assert await matched({"state": "scheduled"}) == [c.id]
    assert await matched({"state": "available"}) == [a.id, b.id]
    assert await matched({"created_at_lt": yesterday}) == [a.id]
    assert await matched({"created_at_gte": yesterday}) == [b.id, c.id]
    assert await matched({"created_at_gte": yesterday.isoformat()}) == [b.id, c.id]
    assert await matched({"created_at_lt": "2000-01-01T00:00:00Z"}) == []
    assert await matched({"queue": "q", "tag": "red", "kind": "chore"}) == [a.id]
    assert await matched({"queue": None, "kind": "chore"}) == [a.id, b.id], "None is the same as absent"


async def test_bad_requests_are_refused(client: awa.AsyncClient) -> None:
    await client.insert(Chore(n=1), queue="q")
    scoped: awa.BatchOperationFilter = {"queue": "q"}
    refused: list[Any] = [
        client.preview_batch_operation("bogus", spec={"priority": 1}, filter=scoped),  # type: ignore[arg-type]
        client.preview_set_priority(0, filter=scoped),
        client.set_priority(5, filter=scoped),
        client.preview_batch_operation("set_priority", spec={}, filter=scoped),
        client.preview_batch_operation("set_priority", spec={"priority": 1, "bogus": 1}, filter=scoped),
        client.preview_move_queue("", filter=scoped),
        client.move_queue("x" * 201, filter=scoped),
        client.preview_move_queue("ok", priority=9, filter=scoped),
        client.preview_batch_operation("move_queue", spec={}, filter=scoped),
        client.preview_set_priority(1, filter={"queeu": "q"}),  # type: ignore[typeddict-unknown-key]
        client.set_priority(1, filter={"queeu": "q"}, allow_all=True),  # type: ignore[typeddict-unknown-key]
        client.preview_set_priority(1, filter={"state": "running"}),
        client.preview_set_priority(1, filter={"state": "bogus"}),
        client.preview_set_priority(1, filter={"created_at_lt": "yesterday"}),
        client.list_batch_operations(state="bogus"),  # type: ignore[arg-type]
        client.get_batch_operation("not-a-uuid"),
        client.get_batch_operation("00000000-0000-0000-0000-000000000000"),
        client.cancel_batch_operation("00000000-0000-0000-0000-000000000000"),
    ]
    for call in refused:
        with pytest.raises(awa.ValidationError):
            await call
    # Wrong Python types are a TypeError, as in awa-pg.
    for bad in (
        client.preview_batch_operation("set_priority", spec={"priority": "1"}, filter=scoped),
        client.preview_set_priority(1, filter={"queue": 1}),  # type: ignore[typeddict-item]
        client.preview_set_priority(1, filter={"ids": "1"}),  # type: ignore[typeddict-item]
        client.preview_set_priority(1, filter={"created_at_lt": 5}),  # type: ignore[typeddict-item]
    ):
        with pytest.raises(TypeError):
            await bad
    # ValidationError is also a ValueError, the class awa-pg raises for a malformed id.
    with pytest.raises(ValueError):
        await client.get_batch_operation("nope")
    assert await client.list_batch_operations() == []


async def test_a_filter_that_narrows_nothing_needs_allow_all(client: awa.AsyncClient) -> None:
    job = await client.insert(Chore(n=1), queue="q")
    for f in (None, {}, {"queue": None}, {"ids": []}):
        with pytest.raises(awa.ValidationError, match="allow_all"):
            await client.set_priority(3, filter=f)  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="allow_all"):
        await client.move_queue("elsewhere")
    op = await client.set_priority(3, allow_all=True)
    assert op["state"] == "pending"
    assert (await client.submit_batch_operation("set_priority", spec={"priority": 3}, filter={"state": "available"}))["state"] == "pending"
    assert (await _job(client, job.id)).priority == 2, "nothing runs without a maintenance leader"


# ----- submit and execution ---------------------------------------------------------------------


async def test_operations_change_queued_jobs_only_and_count_what_they_did(client: awa.AsyncClient) -> None:
    release = asyncio.Event()

    @client.task(Block, queue="work")
    async def block(job: Any) -> None:
        await release.wait()

    done = (await client.insert(Chore(n=10), queue="parked", tags=["a"])).id
    await _finish(client, done)
    a = [(await client.insert(Chore(n=i), queue="parked", tags=["a"])).id for i in range(3)]
    a.append((await client.insert(Chore(n=3), queue="parked", tags=["a"], run_at=LATER)).id)
    b = [(await client.insert(Chore(n=i), queue="parked", tags=["b"], priority=3)).id for i in range(2)]
    c = (await client.insert(Chore(n=9), queue="parked", tags=["c"], run_at=LATER)).id
    running = (await client.insert(Block(n=1), queue="work", tags=["a"])).id

    await client.start([("work", 1)], **FAST)
    try:
        await wait_for(lambda: _state_is(client, running, "running"), what="the blocking job to run")
        op_a = await client.set_priority(4, filter={"tag": "a"}, submitted_by="ops@example")
        assert set(op_a) == OP_KEYS
        assert op_a["state"] == "pending" and op_a["submitted_by"] == "ops@example"
        assert op_a["spec"] == {"op_kind": "set_priority", "priority": 4}
        assert set(op_a["filter"]) == FILTER_KEYS and op_a["filter"]["tag"] == "a"
        assert op_a["cursor"] is None and op_a["total_matched"] is None and op_a["started_at"] is None
        op_b = await client.move_queue("elsewhere", filter={"tag": "b"})
        assert op_b["spec"] == {"op_kind": "move_queue", "queue": "elsewhere", "priority": None}
        op_c = await client.move_queue("elsewhere", priority=1, filter={"ids": [c, running, done]})

        final_a = await _wait_finished(client, op_a["id"])
        assert final_a["state"] == "completed"
        assert (final_a["total_matched"], final_a["processed"], final_a["skipped"], final_a["errored"]) == (4, 4, 0, 0)
        assert final_a["cursor"] == {"after_job_id": a[-1], "max_job_id": a[-1]}
        assert final_a["started_at"] and final_a["finalized_at"] and final_a["last_error"] is None
        assert final_a["runner_instance"], "the leader's runtime instance id"
        finalized = dt.datetime.fromisoformat(final_a["finalized_at"])
        retention = dt.datetime.fromisoformat(str(final_a["retention_until"]))
        assert retention - finalized == dt.timedelta(days=90)
        for job_id in a:
            job = await _job(client, job_id)
            assert (job.priority, job.queue) == (4, "parked")
        assert (await _job(client, a[-1])).state == "scheduled", "a scheduled job stays scheduled"

        final_b = await _wait_finished(client, op_b["id"])
        assert (final_b["state"], final_b["processed"]) == ("completed", 2)
        for job_id in b:
            job = await _job(client, job_id)
            assert (job.queue, job.priority, job.state) == ("elsewhere", 3, "available"), "priority kept"

        final_c = await _wait_finished(client, op_c["id"])
        assert (final_c["state"], final_c["total_matched"], final_c["processed"]) == ("completed", 1, 1)
        job_c = await _job(client, c)
        assert (job_c.queue, job_c.priority, job_c.state) == ("elsewhere", 1, "scheduled")
        # Running and finished jobs are never touched, whatever the filter says.
        for job_id, queue in ((running, "work"), (done, "parked")):
            job = await _job(client, job_id)
            assert (job.queue, job.priority) == (queue, 2)

        # A job already at the target needs no change: skipped, as in awa-pg.
        again = await client.set_priority(4, filter={"tag": "a"})
        final = await _wait_finished(client, again["id"])
        assert (final["total_matched"], final["processed"], final["skipped"]) == (4, 0, 4)
    finally:
        release.set()
        await client.shutdown()


async def _state_is(client: awa.AsyncClient, job_id: int, state: str) -> bool:
    return (await client.get_job(job_id)).state == state


async def test_moved_available_jobs_are_picked_up_by_the_new_queue(client: awa.AsyncClient) -> None:
    seen: list[int] = []

    @client.task(Chore, queue="live")
    async def chore(job: Any) -> None:
        seen.append(job.args.n)

    ids = [(await client.insert(Chore(n=i), queue="parked")).id for i in range(3)]
    await client.start([("live", 2)], **FAST)
    try:
        op = await client.move_queue("live", filter={"queue": "parked"})
        await _wait_finished(client, op["id"])
        for job_id in ids:
            await wait_for_state(client, job_id, "completed")
        assert sorted(seen) == [0, 1, 2]
    finally:
        await client.shutdown()


async def test_jobs_inserted_after_the_submit_are_not_part_of_the_operation(client: awa.AsyncClient) -> None:
    @client.task(Block, queue="work")
    async def block(job: Any) -> None:
        pass

    before = (await client.insert(Chore(n=1), queue="q")).id
    op = await client.set_priority(4, filter={"queue": "q"})
    after = (await client.insert(Chore(n=2), queue="q")).id
    await client.start([("work", 1)], **FAST)
    try:
        final = await _wait_finished(client, op["id"])
    finally:
        await client.shutdown()
    assert (final["total_matched"], final["processed"]) == (1, 1)
    assert (await _job(client, before)).priority == 4
    assert (await _job(client, after)).priority == 2


# ----- cancel, list, purge ---------------------------------------------------------------------


async def test_a_pending_operation_cancelled_before_any_leader_touches_nothing(client: awa.AsyncClient) -> None:
    @client.task(Block, queue="work")
    async def block(job: Any) -> None:
        pass

    kept = [(await client.insert(Chore(n=i), queue="keep")).id for i in range(3)]
    other = (await client.insert(Chore(n=9), queue="other")).id
    op = await client.set_priority(1, filter={"queue": "keep"})
    cancelled = await client.cancel_batch_operation(op["id"])
    assert cancelled["state"] == "cancelled", "a pending operation ends at once"
    assert cancelled["finalized_at"] is not None and cancelled["retention_until"] is not None
    with pytest.raises(awa.ValidationError, match="cancelled"):
        await client.cancel_batch_operation(op["id"])
    later = await client.set_priority(3, filter={"queue": "other"})

    await client.start([("work", 1)], **FAST)
    try:
        # Operations run oldest first: once the later one is done, the cancelled one had its turn.
        assert (await _wait_finished(client, later["id"]))["state"] == "completed"
    finally:
        await client.shutdown()
    assert (await _job(client, other)).priority == 3
    for job_id in kept:
        assert (await _job(client, job_id)).priority == 2
    final = await client.get_batch_operation(op["id"])
    assert (final["state"], final["processed"], final["started_at"]) == ("cancelled", 0, None)
    with pytest.raises(awa.ValidationError, match="completed"):
        await client.cancel_batch_operation(later["id"])


async def test_list_filters_by_state_newest_first_with_a_limit(client: awa.AsyncClient) -> None:
    await client.insert(Chore(n=1), queue="q")
    ops = [await client.set_priority(p, filter={"queue": "q"}) for p in (1, 2, 3)]
    await client.cancel_batch_operation(ops[1]["id"])
    listed = await client.list_batch_operations()
    assert [o["id"] for o in listed] == [o["id"] for o in reversed(ops)]
    assert all(set(o) == OP_KEYS for o in listed)
    assert len(await client.list_batch_operations(limit=2)) == 2
    assert len(await client.list_batch_operations(limit=0)) == 1, "awa-pg treats a limit below 1 as 1"
    assert [o["id"] for o in await client.list_batch_operations(state="cancelled")] == [ops[1]["id"]]
    assert [o["id"] for o in await client.list_batch_operations(state="pending")] == [ops[2]["id"], ops[0]["id"]]
    assert await client.list_batch_operations(state="running") == []
    got = await client.get_batch_operation(ops[0]["id"].upper())
    assert got["id"] == ops[0]["id"]


async def test_purge_deletes_finished_operations_before_a_time(client: awa.AsyncClient) -> None:
    await client.insert(Chore(n=1), queue="q")
    ops = [await client.set_priority(2, filter={"queue": "q"}) for _ in range(3)]
    for op in ops[:2]:
        await client.cancel_batch_operation(op["id"])
    now = dt.datetime.now(dt.timezone.utc)
    assert await client.purge_batch_operations(now - dt.timedelta(hours=1)) == 0
    assert await client.purge_batch_operations(now + dt.timedelta(minutes=1), limit=1) == 1
    assert await client.purge_batch_operations(now + dt.timedelta(minutes=1)) == 1
    assert await client.purge_batch_operations(now + dt.timedelta(minutes=1)) == 0
    remaining = await client.list_batch_operations()
    assert [o["id"] for o in remaining] == [ops[2]["id"]], "a pending operation is never purged"


# ----- the blocking client and the surface ------------------------------------------------------


def test_the_blocking_client_has_the_same_calls(sync_client: awa.Client) -> None:
    job = sync_client.insert(Chore(n=1), queue="q", tags=["t"])
    assert sync_client.preview_set_priority(3, filter={"tag": "t"})["total_matched"] == 1
    assert sync_client.preview_move_queue("r", filter={"tag": "t"})["sample"][0]["id"] == job.id
    assert sync_client.preview_batch_operation("set_priority", spec={"priority": 1}, filter={"ids": [job.id]})["total_matched"] == 1
    one = sync_client.set_priority(3, filter={"tag": "t"}, submitted_by="me")
    two = sync_client.move_queue("r", priority=1, filter={"tag": "t"})
    three = sync_client.submit_batch_operation("set_priority", spec={"priority": 4}, filter={"queue": "q"})
    assert sync_client.get_batch_operation(one["id"])["submitted_by"] == "me"
    assert [o["id"] for o in sync_client.list_batch_operations(state="pending", limit=5)] == [three["id"], two["id"], one["id"]]
    assert sync_client.cancel_batch_operation(two["id"])["state"] == "cancelled"
    with pytest.raises(awa.ValidationError):
        sync_client.set_priority(3)
    assert sync_client.purge_batch_operations(dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=1)) == 1


def test_the_surface_matches_awa_pg() -> None:
    for name in ("BatchOperation", "BatchOperationFilter", "BatchOperationKind", "BatchOperationPreview", "BatchOperationState"):
        assert name in awa.__all__
    assert set(awa.BatchOperation.__annotations__) == OP_KEYS
    assert set(awa.BatchOperationFilter.__annotations__) == FILTER_KEYS
    assert set(awa.BatchOperationPreview.__annotations__) == {"total_matched", "sample"}
    expected = {
        "preview_batch_operation": ["op_kind", "spec", "filter"],
        "submit_batch_operation": ["op_kind", "spec", "filter", "submitted_by", "allow_all"],
        "preview_set_priority": ["priority", "filter"],
        "set_priority": ["priority", "filter", "submitted_by", "allow_all"],
        "preview_move_queue": ["queue", "priority", "filter"],
        "move_queue": ["queue", "priority", "filter", "submitted_by", "allow_all"],
        "list_batch_operations": ["state", "limit"],
        "get_batch_operation": ["operation_id"],
        "cancel_batch_operation": ["operation_id"],
        "purge_batch_operations": ["before", "limit"],
    }
    for cls in (awa.AsyncClient, awa.Client):
        for name, params in expected.items():
            sig = inspect.signature(getattr(cls, name))
            assert list(sig.parameters)[1:] == params, f"{cls.__name__}.{name}"
            assert inspect.iscoroutinefunction(getattr(cls, name)) == (cls is awa.AsyncClient)
