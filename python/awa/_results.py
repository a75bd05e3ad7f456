"""Typed results of admin calls, as awa-pg 0.6.9 returns them: ``RetryFailedResult``
(``retry_failed``) and ``DlqEntry`` (the dead-letter queue calls)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any, Optional

from ._job import Job, parse_timestamp

__all__ = ["DlqEntry", "RetryFailedResult", "dlq_entry_from_dict", "retry_failed_result_from_dict"]


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
