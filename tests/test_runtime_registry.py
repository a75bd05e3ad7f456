"""The runtime registry (issue 13, item 7; docs/runtime-registry.md): every running client has
a row in ``awa.runtime_instances``, listed by ``list_runtime_instances()``; the row goes with a
clean shutdown."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import awa
from helpers import FAST, wait_for


@dataclass
class Tick:
    n: int


def _mine(rows: list[dict[str, Any]], instance_id: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["instance_id"] == instance_id), None)


async def test_a_running_worker_is_listed_until_it_shuts_down(client: awa.AsyncClient) -> None:
    @client.task(Tick, queue="reg")
    async def handle(job: awa.Job) -> None:
        return None

    await client.start([("reg", 2)], **FAST)
    try:
        instance_id = await wait_for(
            lambda: _instance_id(client), what="the registry row is written")
        row = await wait_for(lambda: _leader_row(client, instance_id), what="the row shows leadership")
        assert row["pid"] == os.getpid()
        assert row["queues"] == [{"name": "reg", "max_workers": 2, "deadline_ms": row["queues"][0]["deadline_ms"],
                                  "dlq": False}]
        assert row["version"] and row["hostname"]
        assert row["snapshot_interval_ms"] == FAST["heartbeat_interval_ms"]
        assert row["stale"] is False
        assert row["started_at"].endswith("Z") and row["last_seen_at"] >= row["started_at"]
    finally:
        await client.shutdown()
    assert _mine(await client.list_runtime_instances(), instance_id) is None


async def test_the_row_is_there_when_start_returns(client: awa.AsyncClient, database_url: str) -> None:
    """As with awa-pg: a deploy script that looks right after start() sees this client. The
    worker is a new client (its pool cold, so its first registry write takes a while); the
    look is another client's plain SELECT, as an operator's would be."""
    worker = awa.AsyncClient(database_url)
    warm = await client.transaction()  # the reader's connection is open before the worker starts
    await warm.rollback()

    @worker.task(Tick, queue="reg_now")
    async def handle(job: awa.Job) -> None:
        return None

    await worker.start([("reg_now", 1)], **FAST)
    try:
        tx = await client.transaction()
        try:
            row = await tx.fetch_one("SELECT count(*) AS n FROM awa.runtime_instances WHERE pid = $1", os.getpid())
        finally:
            await tx.rollback()
        assert row["n"] == 1
    finally:
        await worker.shutdown()
        await worker.close()


async def _instance_id(client: awa.AsyncClient) -> str | None:
    value = (await client.health_check()).instance_id
    return None if value is None else str(value)


async def _leader_row(client: awa.AsyncClient, instance_id: str) -> dict[str, Any] | None:
    row = _mine(await client.list_runtime_instances(), instance_id)
    return row if row is not None and row["leader"] else None


def test_the_blocking_client_lists_too(sync_client: awa.Client) -> None:
    assert isinstance(sync_client.list_runtime_instances(), list)
