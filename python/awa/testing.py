"""Test helpers.

- :class:`AwaTestClient` wraps an :class:`awa.AsyncClient`; ``work_one`` claims one job and runs
  your handler through the real executor and finalizer path, so staged follow-ups are inserted
  with the completion, a failed stage poisons the attempt, and every other outcome discards them.
- :class:`HandlerJob` is a database-free stand-in for ``awa.Job`` to unit-test handlers,
  constructible as awa-pg's (``HandlerJob(args, id, attempt, max_attempts, queue, priority,
  deadline, metadata, tags)``, every field after ``args`` optional here): it validates
  ``enqueue_on_completion`` requests exactly like the engine (same rules and limits) and
  records them in ``job.staged``.
- :class:`JobRow` and :data:`NoJob` as in awa-pg; ``work_one`` returns ``NoJob`` (falsy) as
  ``WorkResult.job`` when nothing is claimable.
- The ``awa_client`` pytest fixture (an :class:`AwaTestClient` on a fresh, migrated database)
  comes with the package as a pytest plugin (``awa.pytest_plugin``, registered under
  ``pytest11``): nothing to import. It needs pytest-asyncio; this module itself needs neither.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from typing import Any, Mapping, Optional, Sequence, Union

from . import _awa
from ._client import AsyncClient
from ._convert import build_request, derive_kind
from ._job import Job, format_timestamp
from ._states import JobState
from ._worker import TaskSpec, run_handler

# "awa_client" is served by the module __getattr__ below (imported from the pytest plugin on
# first use, so importing this module never imports pytest).
__all__ = [  # noqa: F822
    "AwaTestClient", "DEFAULT_DATABASE_URL", "HandlerJob", "JobRow", "NoJob", "StagedRequest", "WorkResult",
    "awa_client", "get_database_url",
]

#: awa-pg's default test database, used when ``DATABASE_URL`` is not set.
DEFAULT_DATABASE_URL = "postgres://postgres:test@localhost:5432/awa_test"


def get_database_url() -> str:
    """The test database: ``DATABASE_URL``, else :data:`DEFAULT_DATABASE_URL`."""
    return os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)


@dataclasses.dataclass
class JobRow:
    """awa-pg's lightweight job row. ``work_one`` returns a full :class:`awa.Job` instead
    (every attribute of this one and more); :meth:`from_row` builds one from a row dict,
    e.g. a ``Transaction.fetch_one`` result."""

    id: int
    kind: str
    queue: str
    args: dict[str, Any]
    attempt: int
    max_attempts: int
    priority: int
    tags: list[str]
    state: Optional[str] = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "JobRow":
        return cls(
            id=row["id"], kind=row["kind"], queue=row["queue"], args=row["args"], attempt=row["attempt"],
            max_attempts=row["max_attempts"], priority=row["priority"], tags=list(row.get("tags") or []),
            state=row.get("state"),
        )


class _NoJob:
    """The type of :data:`NoJob`."""

    _instance: Optional["_NoJob"] = None

    def __new__(cls) -> "_NoJob":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NoJob"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "NoJob"


#: ``WorkResult.job`` when ``work_one`` found nothing to claim (falsy, a singleton).
NoJob = _NoJob()


@dataclasses.dataclass
class WorkResult:
    """What ``work_one`` did: the job after finalization (``NoJob`` when there was none to
    claim) and the outcome."""

    job: Union[Job, _NoJob]
    outcome: str
    error: Optional[str] = None

    def is_completed(self) -> bool:
        return self.outcome == "completed"

    def is_retryable(self) -> bool:
        return self.outcome == "retryable"

    def is_failed(self) -> bool:
        return self.outcome == "failed"

    def is_cancelled(self) -> bool:
        return self.outcome == "cancelled"

    def is_snoozed(self) -> bool:
        return self.outcome == "snoozed"

    def is_waiting_external(self) -> bool:
        return self.outcome == "waiting_external"

    def is_no_job(self) -> bool:
        return self.outcome == "no_job"


#: The queue-storage tables that hold jobs or their unique keys (install.sql); its lanes and
#: rings keep their positions, which no longer point at anything once these are empty.
_QUEUE_STORAGE_JOB_TABLES = (
    "ready_entries", "claimed_entries", "leases", "receipts", "done_entries", "deferred_jobs", "unique_keys",
)


class AwaTestClient:
    """Drive jobs one at a time in tests."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @property
    def client(self) -> AsyncClient:
        """The wrapped :class:`awa.AsyncClient`."""
        return self._client

    async def migrate(self) -> None:
        await self.client.migrate()

    async def insert(self, args: Any, **opts: Any) -> Job:
        return await self.client.insert(args, **opts)

    async def clean(self) -> None:
        """Delete every job, dead-lettered job and queue setting, on either engine: canonical's
        table and, when ``awa.jobs`` reads a queue-storage schema, that schema's jobs and unique
        keys too. The engine new jobs go to stays as it was (awa-pg's ``clean()`` also moves the
        database back to canonical; ours keeps a test database on the engine it was set up on).
        Run it with no runtime working on the database, as between tests."""
        async with self.client.transaction() as tx:
            row = await tx.fetch_one("SELECT awa.readable_queue_storage_schema() AS s")
            tables = ["awa.canonical_jobs", "awa.jobs_dlq", "awa.queue_meta"]
            if row["s"] is not None:
                schema = '"' + str(row["s"]).replace('"', '""') + '"'
                tables += [f"{schema}.{t}" for t in _QUEUE_STORAGE_JOB_TABLES]
            await tx.execute("TRUNCATE " + ", ".join(tables))

    async def work_one(self, args_type: Any, handler: Any, *, kind: Optional[str] = None, queue: str = "default") -> WorkResult:
        """Claim the next job of ``queue`` and run ``handler`` on it through the real path."""
        resolved = kind or derive_kind(args_type.__name__)
        run = await self.client._native.work_one_begin(queue, resolved)
        ctx = run.take_context()
        if ctx is not None:
            if ctx.kind != resolved:
                ctx.finish("terminal", value=f"work_one expected kind {resolved!r}, claimed {ctx.kind!r}")
            else:
                await run_handler(ctx, TaskSpec(resolved, args_type, handler, queue))
        result = json.loads(await run.result())
        job: Union[Job, _NoJob] = Job.from_dict(result["job"]) if result.get("job") else NoJob
        return WorkResult(job=job, outcome=result["outcome"], error=result.get("error"))


@dataclasses.dataclass(frozen=True)
class StagedRequest:
    """One recorded ``enqueue_on_completion`` call of a :class:`HandlerJob`."""

    kind: str
    args: Any
    queue: str
    priority: int
    max_attempts: int
    tags: list[str]
    metadata: Optional[dict[str, Any]]
    run_at: Optional[str]
    unique_opts: Optional[dict[str, Any]]
    ordering_key: Optional[str]


class HandlerJob(Job):
    """A stand-in ``awa.Job`` for calling a handler directly, with no database.

    The fields and their order are awa-pg's (``args, id, attempt, max_attempts, queue,
    priority, deadline, metadata, tags``), positional or by keyword; here all but ``args``
    have defaults, and ``kind`` (keyword only) defaults to the args' derived kind.
    ``deadline`` may be a ``datetime`` (awa-pg's type) or RFC 3339 text; ``awa.Job``'s other
    attributes are there too."""

    def __init__(
        self,
        args: Any,
        id: int = 1,
        attempt: int = 1,
        max_attempts: int = 25,
        queue: str = "default",
        priority: int = 2,
        deadline: Union[_dt.datetime, str, None] = None,
        metadata: Optional[dict[str, Any]] = None,
        tags: Optional[Sequence[str]] = None,
        *,
        kind: Optional[str] = None,
    ) -> None:
        now = format_timestamp(_dt.datetime.now(_dt.timezone.utc))
        super().__init__(
            id=id, kind=kind or (derive_kind(type(args).__name__) if not isinstance(args, Mapping) else "job"),
            queue=queue, state=JobState.Running, priority=priority, attempt=attempt, max_attempts=max_attempts,
            tags=list(tags or []), args=args, metadata=metadata if metadata is not None else {}, errors=[],
            run_at=now, deadline=None, created_at=now, finalized_at=None, progress=None,
        )
        # As given (awa-pg's HandlerJob keeps a datetime); Job.deadline is typed as text.
        self.deadline = deadline  # type: ignore[assignment]
        self.staged: list[StagedRequest] = []
        self.poisoned: Optional[str] = None
        self.sealed = False
        self._staged_bytes = 0
        self._cancelled = False

    def cancel(self) -> None:
        """Make ``is_cancelled()`` return True, as a cancel request would."""
        self._cancelled = True

    def is_cancelled(self) -> bool:
        return self._cancelled

    def set_progress(self, percent: int, message: Optional[str] = None) -> None:
        value = float(percent)
        whole = 0 if value != value else int(round(max(0.0, min(100.0, value))))
        self.progress = {**(self.progress or {}), "percent": whole}
        if message is not None:
            self.progress["message"] = message

    def update_metadata(self, updates: Mapping[str, Any]) -> None:
        doc = dict(self.progress or {})
        doc["metadata"] = {**doc.get("metadata", {}), **dict(updates)}
        self.progress = doc

    async def flush_progress(self) -> None:
        return None

    def flush_progress_sync(self) -> None:
        return None

    def seal(self) -> list[StagedRequest]:
        """What the executor does when the handler returns: later stages raise StagingError."""
        self.sealed = True
        return list(self.staged)

    def _fail(self, message: str, cause: Optional[BaseException] = None) -> None:
        if self.poisoned is None:
            self.poisoned = message
        if cause is not None:
            raise _awa.StagingError(message) from cause
        raise _awa.StagingError(message)

    def enqueue_on_completion(
        self,
        args: Any,
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[_dt.datetime] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[str] = None,
    ) -> None:
        if self.sealed:
            raise _awa.StagingError("the handler already returned; follow-ups can no longer be staged")
        try:
            request = build_request(
                args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
                metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
            )
            size = _awa.stage_check(request)
        except _awa.StagingError as exc:
            self._fail(str(exc), exc)
            return
        except Exception as exc:
            self._fail(f"invalid follow-up: {exc}", exc)
            return
        if len(self.staged) >= _awa.MAX_STAGED_FOLLOW_UPS:
            self._fail(f"too many staged follow-ups: the limit is {_awa.MAX_STAGED_FOLLOW_UPS} per attempt")
        if self._staged_bytes + size > _awa.MAX_STAGED_BYTES:
            self._fail(f"staged follow-ups too large: the limit is {_awa.MAX_STAGED_BYTES} bytes per attempt")
        self._staged_bytes += size
        parsed = json.loads(request)
        self.staged.append(StagedRequest(
            kind=parsed["kind"], args=parsed["args"], queue=parsed["queue"], priority=parsed["priority"],
            max_attempts=parsed["max_attempts"], tags=parsed["tags"], metadata=parsed.get("metadata"),
            run_at=parsed["run_at"], unique_opts=parsed.get("unique_opts"), ordering_key=parsed["ordering_key"],
        ))


def __getattr__(name: str) -> Any:
    # ``from awa.testing import awa_client`` (awa-pg's documented use) works without making
    # this module import pytest: the fixture lives in the pytest plugin, loaded on demand.
    if name == "awa_client":
        from .pytest_plugin import awa_client

        return awa_client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
