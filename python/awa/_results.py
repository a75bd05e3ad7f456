"""Typed results of admin and callback calls, with awa-pg 0.6.9's names and attributes:
``RetryFailedResult`` (``retry_failed``), ``DlqEntry`` (the dead-letter queue calls),
``HealthCheck`` / ``QueueHealth``, ``QueueStat`` and ``ResolveResult``.

Dataclasses: attribute access as in awa-pg (``stat.available``, ``health.healthy``), plus
``==`` and a readable ``repr``; unlike awa-pg's native classes they are not tied to the
native module.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any, Mapping, Optional

from ._job import Job, parse_timestamp

__all__ = [
    "DlqEntry",
    "HealthCheck",
    "QueueHealth",
    "QueueStat",
    "ResolveResult",
    "RetryFailedResult",
    "dlq_entry_from_dict",
    "retry_failed_result_from_dict",
]


@dataclasses.dataclass
class RetryFailedResult:
    """What ``retry_failed`` did.

    ``jobs``: the jobs made available again. ``matched``: how many failed jobs the filter
    found (``matched - len(jobs)`` changed state meanwhile). ``pruned_failed_count``: awa-pg
    reports failed rows pruned past retention; Awa does not count pruned rows, so it is
    always ``None`` (what awa-pg gives when filtering by kind).
    """

    jobs: list[Job]
    matched: int
    pruned_failed_count: Optional[int] = None


@dataclasses.dataclass
class DlqEntry:
    """A dead-lettered job: the job as it failed (``job.state`` is ``failed``), why it was
    moved (``reason``), when (``dlq_at``, an aware ``datetime``) and the run lease of its last
    attempt (``original_run_lease``)."""

    job: Job
    reason: str
    dlq_at: _dt.datetime
    original_run_lease: int


def retry_failed_result_from_dict(d: dict[str, Any]) -> RetryFailedResult:
    return RetryFailedResult(jobs=[Job.from_dict(j) for j in d["jobs"]], matched=int(d["matched"]))


def dlq_entry_from_dict(d: dict[str, Any]) -> DlqEntry:
    """An entry from the engine's DLQ row (``awa_core::storage::dlq::DlqJob`` as JSON)."""
    dlq_at = parse_timestamp(d["dlq_at"])
    assert dlq_at is not None  # a NOT NULL column
    # Rows dead-lettered before schema version 6 did not keep run_at / finalized_at: the
    # move's time is the closest truth for both.
    job = Job.from_dict({
        **d,
        "state": "failed",
        "run_at": d.get("run_at") or d["dlq_at"],
        "finalized_at": d.get("finalized_at") or d["dlq_at"],
        "run_lease": d["original_run_lease"],
    })
    return DlqEntry(job=job, reason=d["reason"], dlq_at=dlq_at, original_run_lease=int(d["original_run_lease"]))


#: The states a queued (not yet finished) job is in: ``QueueStat.total_queued`` counts them.
_QUEUED = ("scheduled", "available", "running", "retryable", "waiting_external")


@dataclasses.dataclass(frozen=True)
class QueueHealth:
    """One queue of a running client (``HealthCheck.queues[name]``): jobs this client is
    running (``in_flight``), jobs waiting to be claimed (``available``), and the queue's
    configuration. ``min_workers``, ``weight`` and ``overflow_held`` belong to weighted
    queues (not configured here: always None)."""

    in_flight: int
    available: int
    max_workers: Optional[int] = None
    min_workers: Optional[int] = None
    weight: Optional[int] = None
    overflow_held: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """What ``health_check()`` reports. ``healthy`` is true while the client's worker runs,
    the database answers and it is not shutting down; a client that never started is not
    healthy but ``postgres_connected``. ``schema_version`` and ``instance_id`` (this client's
    row in the runtime registry, docs/runtime-registry.md; None until written, or when not
    started) are this package's additions."""

    healthy: bool
    postgres_connected: bool
    poll_loop_alive: bool
    heartbeat_alive: bool
    shutting_down: bool
    leader: bool
    queues: dict[str, QueueHealth]
    schema_version: int = 0
    instance_id: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class QueueStat:
    """One queue in ``queue_stats()``: job counts by state, ``total_queued`` (every job not
    yet finished: scheduled, available, running, retryable, waiting_external), completions in
    the last hour, ``lag_seconds`` (age of the oldest available job; None when none is
    available) and whether the queue is paused."""

    queue: str
    total_queued: int
    scheduled: int
    available: int
    retryable: int
    running: int
    failed: int
    waiting_external: int
    completed_last_hour: int
    lag_seconds: Optional[float]
    paused: bool
    cancelled: int = 0
    completed: int = 0

    @classmethod
    def from_native(cls, d: Mapping[str, Any]) -> "QueueStat":
        counts = dict(d.get("counts") or {})

        def n(state: str) -> int:
            return int(counts.get(state, 0))

        lag = d.get("lag_seconds")
        return cls(
            queue=d["queue"],
            total_queued=sum(n(s) for s in _QUEUED),
            scheduled=n("scheduled"),
            available=n("available"),
            retryable=n("retryable"),
            running=n("running"),
            failed=n("failed"),
            waiting_external=n("waiting_external"),
            completed_last_hour=int(d.get("completed_last_hour") or 0),
            lag_seconds=None if lag is None else float(lag),
            paused=bool(d.get("paused")),
            cancelled=n("cancelled"),
            completed=n("completed"),
        )


@dataclasses.dataclass(frozen=True)
class ResolveResult:
    """What ``resolve_callback`` did: ``outcome`` is ``"completed"``, ``"failed"`` or
    ``"ignored"``; ``job`` the job after the change (None when ignored); ``payload`` the
    payload completion returned (after ``transform``); ``reason`` why it was ignored."""

    outcome: str
    job: Optional[Job] = None
    payload: Any = None
    reason: Optional[str] = None

    def is_completed(self) -> bool:
        return self.outcome == "completed"

    def is_failed(self) -> bool:
        return self.outcome == "failed"

    def is_ignored(self) -> bool:
        return self.outcome == "ignored"

    @classmethod
    def from_native(cls, d: Mapping[str, Any]) -> "ResolveResult":
        job = d.get("job")
        return cls(
            outcome=d["outcome"],
            job=None if job is None else Job.from_dict(job),
            payload=d.get("payload"),
            reason=d.get("reason"),
        )
