"""The demo: a two-stage pipeline with handler-staged follow-ups (ADR-046).

Stage A resolves an order to the item it needs (a value computed at run time) and stages a
stage-B job for that item. B is inserted only if A's completion commits, and B's unique key
makes it run once per distinct item however many A jobs resolve to it.

Every demo run carries a fresh run id in its args. A unique key covers the job's kind and args
and, by default, holds in every state up to ``completed``: without the run id, a second demo
run's B jobs would match the first run's completed ones and be skipped without a word. The run
id makes every run do the whole pipeline again, and the summary line says how many staged B
jobs the unique key skipped within the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid

import awa


@dataclasses.dataclass
class ResolveItem:
    """Stage A: which item does this order need?"""

    run: str
    order_id: int


@dataclasses.dataclass
class BuildItem:
    """Stage B: build one item (once per item, per demo run)."""

    run: str
    item_id: int


CATALOGUE = {1: 101, 2: 102, 3: 101, 4: 103, 5: 102, 6: 101, 7: 104, 8: 103}


async def main() -> None:
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    run = uuid.uuid4().hex[:8]
    client = awa.AsyncClient(url)
    await client.migrate()
    built: list[int] = []
    staged = [0]

    @client.task(ResolveItem, queue="demo")
    async def resolve(job: awa.Job) -> None:
        await asyncio.sleep(0.01)  # pretend to look the order up
        item_id = CATALOGUE[job.args.order_id]
        print(f"  A  order {job.args.order_id} -> item {item_id}  (job {job.id})")
        staged[0] += 1
        job.enqueue_on_completion(
            BuildItem(run=job.args.run, item_id=item_id),
            queue="demo",
            unique_opts={},  # one B per item: the key covers B's kind and args
            metadata={"resolved_by": job.id},  # context that must not affect deduplication
        )

    @client.task(BuildItem, queue="demo")
    async def build(job: awa.Job) -> None:
        if job.args.run == run:
            built.append(job.args.item_id)
        print(f"  B  build item {job.args.item_id}  (job {job.id}, staged by job {job.metadata['resolved_by']})")

    print(f"demo run {run}: {len(CATALOGUE)} orders, {len(set(CATALOGUE.values()))} distinct items")
    await client.insert_many([ResolveItem(run=run, order_id=o) for o in CATALOGUE], queue="demo")
    started = time.monotonic()
    await client.start([("demo", 4)], poll_interval_ms=50)
    try:
        while True:
            jobs = [j for j in await client.list_jobs(queue="demo", limit=1000) if j.args.get("run") == run]
            if len(jobs) == len(CATALOGUE) + len(set(CATALOGUE.values())) and all(j.state == "completed" for j in jobs):
                break
            if time.monotonic() - started > 60:
                raise SystemExit("demo did not finish within 60 s")
            await asyncio.sleep(0.05)
    finally:
        await client.shutdown()
    distinct = sorted(set(CATALOGUE.values()))
    once = sorted(built) == distinct
    inserted = len([j for j in await client.list_jobs(queue="demo", limit=1000)
                    if j.kind == "build_item" and j.args.get("run") == run])
    print(f"done in {time.monotonic() - started:.2f}s: {len(CATALOGUE)} A jobs completed; "
          f"A staged {staged[0]} B jobs: {inserted} inserted, {staged[0] - inserted} skipped by B's unique key "
          f"(same item, same run); B ran for items {sorted(built)}: "
          f"{'once per distinct item' if once else 'NOT once per item'}")
    if not once:
        raise SystemExit(1)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
