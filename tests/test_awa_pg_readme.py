"""The usage patterns awa-pg 0.6.9's README documents (its PyPI page), run unchanged against
Awa: issue 13's "an application written for awa-pg runs unchanged". Each test is one pattern,
written the way an awa-pg user writes it (awa-pg's names, keywords and call shapes; no Awa
additions), then checked through the public API."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import awa
from awa import AsyncClient
from helpers import wait_for


@dataclass
class SendEmail:
    to: str
    subject: str


@dataclass
class UpdateCustomer:
    customer_id: int
    payload: str


async def test_quick_start(database_url: str) -> None:
    """AsyncClient(url), @client.task(Args, queue=...), start([(queue, n)]), insert, shutdown."""
    client = AsyncClient(database_url)
    seen: list[tuple[str, str]] = []

    @client.task(SendEmail, queue="email")
    async def send_email(job: Any) -> None:
        seen.append((job.args.to, job.args.subject))

    await client.start([("email", 4)])
    try:
        job = await client.insert(SendEmail(to="ada@example.com", subject="hello"), queue="email")
        await wait_for(lambda: seen, what="the email handler ran")
    finally:
        await client.shutdown()
        await client.close()
    assert seen == [("ada@example.com", "hello")]
    assert job.state == awa.JobState.Available and job.queue == "email"


def test_migrate_from_the_command_line(empty_database: str) -> None:
    """python -m awa --database-url URL migrate, on a fresh database."""
    run = subprocess.run([sys.executable, "-m", "awa", "--database-url", empty_database, "migrate"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with awa.Client(empty_database) as c:
        assert c.queue_stats() == []


async def test_ordering_key_as_bytes_or_str(client: awa.AsyncClient) -> None:
    """insert(..., ordering_key=b"customer-42") and the same key as a str."""
    a = await client.insert(UpdateCustomer(customer_id=42, payload="a"), queue="customer-updates",
                            ordering_key=b"customer-42")
    b = await client.insert(UpdateCustomer(customer_id=42, payload="b"), queue="customer-updates",
                            ordering_key="customer-42")
    assert (a.state, b.state) == (awa.JobState.Available, awa.JobState.Available)


async def test_partitioned_queue_with_one_handler(database_url: str) -> None:
    """One @task on physical_queues[0], start(queue.queue_configs(max_workers_per_partition=16)),
    insert(**queue.route_by_key(...)) and enqueue_many_copy(jobs, opts=[route_by_key ...]):
    handlers are dispatched by kind, so jobs on every partition run."""
    client = AsyncClient(database_url)
    queue = awa.PartitionedQueue("customer-updates", 4)
    seen: list[tuple[int, str]] = []

    @client.task(UpdateCustomer, queue=queue.physical_queues[0])
    async def update_customer(job: Any) -> None:
        seen.append((job.args.customer_id, job.queue))

    await client.start(queue.queue_configs(max_workers_per_partition=16))
    try:
        for i in range(8):
            await client.insert(UpdateCustomer(customer_id=i, payload="one"), **queue.route_by_key(f"customer-{i}"))
        jobs = [UpdateCustomer(customer_id=100 + i, payload="copy") for i in range(8)]
        written = await client.enqueue_many_copy(jobs, opts=[queue.route_by_key(str(j.customer_id)) for j in jobs])
        assert written == 8
        await wait_for(lambda: len(seen) == 16, what="all 16 jobs ran")
    finally:
        await client.shutdown()
        await client.close()
    for customer_id, physical in seen:
        key = f"customer-{customer_id}" if customer_id < 100 else str(customer_id)
        assert physical == queue.queue_for_key(key)


def test_the_synchronous_client(database_url: str) -> None:
    """awa.Client for codebases that are not async-first: the same calls, blocking."""
    with awa.Client(database_url) as client:
        job = client.insert(SendEmail(to="bob@example.com", subject="hi"), queue="email")
        assert client.get_job(job.id).args == {"to": "bob@example.com", "subject": "hi"}
        assert [s.queue for s in client.queue_stats()] == ["email"]


async def test_insert_then_sleep_then_shutdown_completes_the_job(database_url: str) -> None:
    """The quick start's own shape: start, insert, sleep a moment, shutdown: the job is done."""
    client = AsyncClient(database_url)

    @client.task(SendEmail, queue="email")
    async def send_email(job: Any) -> None:
        return None

    await client.start([("email", 4)])
    job = await client.insert(SendEmail(to="ada@example.com", subject="hello"), queue="email")
    await asyncio.sleep(1)
    await client.shutdown()
    try:
        assert (await client.get_job(job.id)).state == awa.JobState.Completed
    finally:
        await client.close()



async def test_durable_batch_operations(client: awa.AsyncClient) -> None:
    """preview_set_priority / set_priority / move_queue with filters, list_batch_operations,
    cancel_batch_operation(operation["id"]), as the README's operator example calls them."""
    await client.insert(SendEmail(to="a@example.com", subject="x"), queue="default")
    await client.insert(SendEmail(to="b@example.com", subject="y"), queue="default", tags=["incident-123"])

    preview = await client.preview_set_priority(1, filter={"queue": "default", "state": "available"})
    assert preview["total_matched"] == 2 and len(preview["sample"]) == 2

    operation = await client.set_priority(1, filter={"queue": "default"}, submitted_by="ops@example.com")
    assert operation["state"] == "pending" and operation["submitted_by"] == "ops@example.com"

    operation = await client.move_queue("escalations", priority=1, filter={"tag": "incident-123"})
    assert operation["op_kind"] == "move_queue"

    active = await client.list_batch_operations(state="running")
    assert active == []  # nothing runs them here: no runtime is leader
    cancelled = await client.cancel_batch_operation(operation["id"])
    assert cancelled["id"] == operation["id"] and cancelled["state"] in ("cancelling", "cancelled")
