"""``PartitionedQueue``: one hot logical queue spread over physical queues (awa-pg's helper).

A logical queue ``orders`` with 4 partitions is the physical queues ``orders``,
``orders__p1``, ``orders__p2``, ``orders__p3`` (awa-pg's names). Jobs are routed by key, so
every job of one key lands on one partition and, with an ``ordering_key``, runs in order
there, while different keys spread over the partitions and their workers.

Routing is deterministic and stable across processes and releases: BLAKE2b-64 of the key
(UTF-8 for a ``str``), little-endian, modulo the partition count. awa-pg routes with a hash
of its own that its package does not document; a key may land on a different partition
under each library (see bench/compat/GAPS.md). Mixing both libraries' producers on one
partitioned queue keeps every job, but not the per-key partition.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence, Union

from ._awa import ValidationError

__all__ = ["PartitionedQueue", "MAX_PARTITIONS"]

#: The most physical queues one logical queue may have (awa-pg's limit).
MAX_PARTITIONS = 32767


def _key_bytes(key: Union[bytes, str]) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise ValidationError("ordering_key must be bytes-like or str")


def _index(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


class PartitionedQueue:
    """Deterministic physical queue partitions for one hot logical queue."""

    __slots__ = ("_logical", "_physical")

    def __init__(self, logical_queue: str, partitions: int) -> None:
        _index(partitions, "partitions")
        if not isinstance(logical_queue, str):
            raise TypeError(f"logical_queue must be a str, not {type(logical_queue).__name__}")
        if not logical_queue:
            raise ValidationError("partitioned queue logical queue must not be empty")
        if partitions <= 0:
            raise ValidationError("partitioned queue partitions must be > 0")
        if partitions > MAX_PARTITIONS:
            raise ValidationError(
                f"partitioned queue supports at most {MAX_PARTITIONS} physical queues; got {partitions}")
        self._logical = logical_queue
        self._physical = [logical_queue] + [f"{logical_queue}__p{i}" for i in range(1, partitions)]

    @classmethod
    def from_physical_queues(cls, logical_queue: str, physical_queues: Sequence[str]) -> "PartitionedQueue":
        """A partitioned queue over queues that already exist under other names."""
        if not isinstance(logical_queue, str):
            raise TypeError(f"logical_queue must be a str, not {type(logical_queue).__name__}")
        if isinstance(physical_queues, (str, bytes)):
            raise TypeError("physical_queues must be a sequence of str, not a single string")
        queues = list(physical_queues)
        if not logical_queue:
            raise ValidationError("partitioned queue logical queue must not be empty")
        if not queues:
            raise ValidationError("partitioned queue partitions must be > 0")
        if len(queues) > MAX_PARTITIONS:
            raise ValidationError(
                f"partitioned queue supports at most {MAX_PARTITIONS} physical queues; got {len(queues)}")
        seen: set[str] = set()
        for q in queues:
            if not isinstance(q, str):
                raise TypeError(f"physical queue names must be str, not {type(q).__name__}")
            if not q:
                raise ValidationError("partitioned queue physical queue must not be empty")
            if q in seen:
                raise ValidationError(f"partitioned queue physical queue {q!r} is duplicated")
            seen.add(q)
        self = cls.__new__(cls)
        self._logical = logical_queue
        self._physical = queues
        return self

    @property
    def logical_queue(self) -> str:
        return self._logical

    @property
    def physical_queues(self) -> list[str]:
        return list(self._physical)

    @property
    def partitions(self) -> int:
        return len(self._physical)

    def queue_for_key(self, key: Union[bytes, str]) -> str:
        """The physical queue every job of ``key`` goes to."""
        digest = hashlib.blake2b(_key_bytes(key), digest_size=8).digest()
        return self._physical[int.from_bytes(digest, "little") % len(self._physical)]

    def queue_for_index(self, index: int) -> str:
        """The physical queue of partition ``index`` (modulo the partition count, as awa-pg)."""
        if _index(index, "index") < 0:
            raise ValidationError("index must be >= 0")
        return self._physical[index % len(self._physical)]

    def route_by_key(self, key: Union[bytes, str]) -> dict[str, Union[str, bytes]]:
        """``insert`` keywords routing a job by key: its queue and ``ordering_key``."""
        return {"queue": self.queue_for_key(key), "ordering_key": _key_bytes(key)}

    def route_by_index(self, index: int) -> dict[str, str]:
        """``insert`` keywords routing a job to partition ``index``."""
        return {"queue": self.queue_for_index(index)}

    def queue_configs(
        self,
        max_workers_per_partition: Optional[int] = None,
        *,
        min_workers_per_partition: Optional[int] = None,
        weight: int = 1,
        rate_limit_per_partition: Optional[tuple[float, int]] = None,
        priority_aging_interval_ms: Optional[int] = None,
        deadline_duration_ms: Optional[int] = None,
        claimers: Optional[int] = None,
        claim_batch_size: Optional[int] = None,
    ) -> list[dict[str, Any]]:
        """``start(queues=...)`` dicts, one per physical queue. Capacity is per partition:
        ``max_workers_per_partition`` (a hard cap each) or ``min_workers_per_partition`` with
        ``weight`` (a weighted share of ``global_max_workers``), not both."""
        if max_workers_per_partition is not None and min_workers_per_partition is not None:
            raise ValidationError("use max_workers_per_partition or min_workers_per_partition, not both")
        if max_workers_per_partition is None and min_workers_per_partition is None:
            raise ValidationError("queue_configs requires max_workers_per_partition or min_workers_per_partition")
        base: dict[str, Any] = {}
        if max_workers_per_partition is not None:
            if _index(max_workers_per_partition, "max_workers_per_partition") <= 0:
                raise ValidationError("max_workers_per_partition must be > 0")
            base["max_workers"] = max_workers_per_partition
        else:
            assert min_workers_per_partition is not None
            if _index(min_workers_per_partition, "min_workers_per_partition") < 0:
                raise ValidationError("min_workers_per_partition must be >= 0")
            if _index(weight, "weight") <= 0:
                raise ValidationError("weight must be > 0")
            base["min_workers"] = min_workers_per_partition
            base["weight"] = weight
        if max_workers_per_partition is not None and _index(weight, "weight") <= 0:
            raise ValidationError("weight must be > 0")
        for key, value in (("rate_limit", rate_limit_per_partition),
                           ("priority_aging_interval_ms", priority_aging_interval_ms),
                           ("deadline_duration_ms", deadline_duration_ms),
                           ("claimers", claimers), ("claim_batch_size", claim_batch_size)):
            if value is not None:
                base[key] = value
        return [{"name": q, **base} for q in self._physical]

    def __len__(self) -> int:
        return len(self._physical)

    def __repr__(self) -> str:
        return f'PartitionedQueue(logical_queue="{self._logical}", partitions={len(self._physical)})'

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionedQueue):
            return NotImplemented
        return (self._logical, self._physical) == (other._logical, other._physical)

    def __hash__(self) -> int:
        return hash((self._logical, tuple(self._physical)))
