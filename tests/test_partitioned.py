"""``awa.PartitionedQueue``: awa-pg's names, validation and routing helpers, and that its
routes and queue configs work end to end with ``insert`` and ``start``."""

from __future__ import annotations

import pytest

import awa
from helpers import FAST, wait_for_state


def test_physical_queues_are_named_as_awa_pg_names_them() -> None:
    p = awa.PartitionedQueue("orders", 4)
    assert p.physical_queues == ["orders", "orders__p1", "orders__p2", "orders__p3"]
    assert (p.logical_queue, p.partitions, len(p)) == ("orders", 4, 4)
    assert repr(p) == 'PartitionedQueue(logical_queue="orders", partitions=4)'
    assert awa.PartitionedQueue("orders", 1).physical_queues == ["orders"]
    q = awa.PartitionedQueue.from_physical_queues("x", ["x_a", "x_b"])
    assert q.physical_queues == ["x_a", "x_b"] and q.partitions == 2
    assert p == awa.PartitionedQueue("orders", 4) and len({p, awa.PartitionedQueue("orders", 4)}) == 1


def test_a_key_always_routes_to_one_partition_and_keys_spread() -> None:
    p = awa.PartitionedQueue("orders", 4)
    assert p.queue_for_key("customer-42") == p.queue_for_key(b"customer-42") == p.queue_for_key("customer-42")
    assert p.route_by_key("customer-42") == {"queue": p.queue_for_key("customer-42"), "ordering_key": b"customer-42"}
    assert p.route_by_key("ü")["ordering_key"] == "ü".encode()
    # Pinned: routing must not change between releases (stored jobs depend on it).
    assert [p.queue_for_key(f"k{i}") for i in range(4)] == [p.queue_for_key(f"k{i}") for i in range(4)]
    hits = {p.queue_for_key(f"customer-{i}") for i in range(200)}
    assert hits == set(p.physical_queues)
    assert p.queue_for_index(0) == "orders" and p.queue_for_index(5) == "orders__p1"  # modulo, as awa-pg
    assert p.route_by_index(3) == {"queue": "orders__p3"}


def test_the_routing_is_pinned() -> None:
    # BLAKE2b-64 little-endian modulo n (docs: python/awa/_partitioned.py); a change here
    # would move existing keys to other partitions.
    p = awa.PartitionedQueue("q", 7)
    assert [p.queue_for_key(k) for k in ("a", "customer-42", "")] == ["q__p4", "q__p6", "q__p5"]


@pytest.mark.parametrize("call, message", [
    (lambda: awa.PartitionedQueue("orders", 0), "partitions must be > 0"),
    (lambda: awa.PartitionedQueue("", 2), "logical queue must not be empty"),
    (lambda: awa.PartitionedQueue("o", 32768), "at most 32767"),
    (lambda: awa.PartitionedQueue.from_physical_queues("x", []), "partitions must be > 0"),
    (lambda: awa.PartitionedQueue.from_physical_queues("x", ["a", "a"]), "'a' is duplicated"),
    (lambda: awa.PartitionedQueue.from_physical_queues("x", ["a", ""]), "must not be empty"),
    (lambda: awa.PartitionedQueue("o", 2).queue_for_index(-1), "index must be >= 0"),
    (lambda: awa.PartitionedQueue("o", 2).queue_for_key(5), "bytes-like or str"),  # type: ignore[arg-type]
    (lambda: awa.PartitionedQueue("o", 2).queue_configs(), "requires max_workers_per_partition"),
    (lambda: awa.PartitionedQueue("o", 2).queue_configs(0), "must be > 0"),
    (lambda: awa.PartitionedQueue("o", 2).queue_configs(2, min_workers_per_partition=1), "not both"),
    (lambda: awa.PartitionedQueue("o", 2).queue_configs(min_workers_per_partition=1, weight=0), "weight must be > 0"),
])
def test_bad_input_is_a_validation_error(call, message: str) -> None:
    with pytest.raises(awa.ValidationError, match=message):
        call()


def test_bad_types_are_type_errors() -> None:
    with pytest.raises(TypeError):
        awa.PartitionedQueue("o", "2")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        awa.PartitionedQueue.from_physical_queues("o", "ab")


def test_queue_configs_match_awa_pgs() -> None:
    p = awa.PartitionedQueue("q", 2)
    assert p.queue_configs(4) == [{"name": "q", "max_workers": 4}, {"name": "q__p1", "max_workers": 4}]
    weighted = p.queue_configs(min_workers_per_partition=1, weight=2, rate_limit_per_partition=(10.0, 5),
                               priority_aging_interval_ms=1000, deadline_duration_ms=5000, claimers=2,
                               claim_batch_size=8)
    assert weighted[1] == {"name": "q__p1", "min_workers": 1, "weight": 2, "rate_limit": (10.0, 5),
                           "priority_aging_interval_ms": 1000, "deadline_duration_ms": 5000, "claimers": 2,
                           "claim_batch_size": 8}


async def test_routed_jobs_run_on_their_partitions(client: awa.AsyncClient) -> None:
    p = awa.PartitionedQueue("part", 3)
    seen: list[tuple[str, str]] = []

    for q in p.physical_queues:
        @client.task(dict, kind=f"partjob_{q}", queue=q)
        async def handle(job: awa.Job) -> None:
            seen.append((job.args["key"], job.queue))

    jobs = []
    for i in range(12):
        route = p.route_by_key(f"key-{i % 4}")
        jobs.append(await client.insert({"key": f"key-{i % 4}"}, kind=f"partjob_{route['queue']}", **route))
    await client.start(p.queue_configs(2), **FAST)
    try:
        for job in jobs:
            await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    for key, queue in seen:
        assert queue == p.queue_for_key(key)
    assert len(seen) == 12
