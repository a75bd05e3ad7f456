"""The native-future bridge (awa-python/src/bridge.rs): every awaitable the package returns
resolves once, with its own result, whichever thread finished it; cancelling one aborts the
Rust work behind it; several event loops share one client."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import awa


@dataclasses.dataclass
class Item:
    n: int


async def test_a_burst_of_concurrent_awaits_each_gets_its_own_result(database_url: str) -> None:
    # 300 inserts over 4 connections finish on runtime threads in bursts; the loop's one
    # wake-up socket must deliver every result to the awaitable that asked for it.
    client = awa.AsyncClient(database_url, max_connections=4)
    try:
        jobs = await asyncio.gather(*(client.insert(Item(n=i), queue="burst") for i in range(300)))
        assert [j.args["n"] for j in jobs] == list(range(300))
        assert len({j.id for j in jobs}) == 300
        rows = await client.list_jobs(queue="burst", limit=1000)
        assert sorted(r.args["n"] for r in rows) == list(range(300))
    finally:
        await client.close()


async def test_errors_arrive_typed_through_the_bridge(database_url: str) -> None:
    client = awa.AsyncClient(database_url, max_connections=2)
    try:
        opts = {"by_args": True}
        await client.insert(Item(n=1), queue="typed", unique_opts=opts)
        results = await asyncio.gather(
            *(client.insert(Item(n=1), queue="typed", unique_opts=opts) for _ in range(5)),
            return_exceptions=True,
        )
        assert all(isinstance(r, awa.UniqueConflict) for r in results), results
    finally:
        await client.close()


async def test_cancelling_an_awaitable_aborts_the_native_work(database_url: str) -> None:
    # One connection, held by an open transaction: the insert waits for the pool. Cancelling
    # it must abort it — once the connection is free, it must not run after all.
    client = awa.AsyncClient(database_url, max_connections=1)
    try:
        async with client.transaction() as tx:
            await tx.execute("SELECT 1")
            pending = asyncio.ensure_future(client.insert(Item(n=99), queue="aborted"))
            await asyncio.sleep(0.05)
            assert not pending.done()
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
            assert pending.cancelled()
        # The pool hands connections out in request order: had the cancelled insert survived,
        # it would run before this one.
        await client.insert(Item(n=1), queue="after")
        assert await client.list_jobs(queue="aborted") == []
    finally:
        await client.close()


def test_one_client_serves_several_event_loops(database_url: str) -> None:
    client = awa.AsyncClient(database_url, max_connections=4)
    errors: list[BaseException] = []

    def run(base: int) -> None:
        async def work() -> None:
            for i in range(50):
                job = await client.insert(Item(n=base + i), queue="loops")
                assert job.args["n"] == base + i

        try:
            asyncio.run(work())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k * 1000,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []

    async def count() -> int:
        rows = await client.list_jobs(queue="loops", limit=1000)
        await client.close()
        return len(rows)

    assert asyncio.run(count()) == 150


def test_inserts_and_a_worker_run_on_uvloop(database_url: str) -> None:
    # uvloop's loop is not asyncio's: the wake-up socket goes through its add_reader.
    import uvloop

    from helpers import FAST, wait_for

    async def main() -> None:
        client = awa.AsyncClient(database_url, max_connections=4)
        handled: list[int] = []

        @client.task(Item, queue="uv")
        async def handle(job: awa.Job) -> None:
            await asyncio.sleep(0)
            handled.append(job.args.n)

        await asyncio.gather(*(client.insert(Item(n=i), queue="uv") for i in range(40)))
        await client.start([("uv", 8)], **FAST)
        try:
            await wait_for(lambda: len(handled) == 40, what="40 jobs handled on uvloop")

            # Completions are batched: a handler has returned before its row says so.
            async def all_completed() -> bool:
                done = await client.list_jobs(queue="uv", state="completed", limit=100)
                return len(done) == 40

            await wait_for(all_completed, what="40 completed rows")
        finally:
            await client.shutdown()
            await client.close()

    uvloop.run(main())
