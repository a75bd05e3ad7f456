"""Test helpers.

- :class:`AwaTestClient` wraps an :class:`awa.AsyncClient`; ``work_one`` claims one job and runs
  your handler through the real executor and finalizer path, so staged follow-ups are inserted
  with the completion, a failed stage poisons the attempt, and every other outcome discards them.
- :class:`HandlerJob` is a database-free stand-in for ``awa.Job`` to unit-test handlers: it
  validates ``enqueue_on_completion`` requests exactly like the engine (same rules and limits)
  and records them in ``job.staged``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from typing import Any, Mapping, Optional, Sequence

from . import _awa
from ._client import AsyncClient
from ._convert import build_request, derive_kind
from ._job import Job
from ._worker import TaskSpec, run_handler

__all__ = ["AwaTestClient", "WorkResult", "HandlerJob", "StagedRequest"]


@dataclasses.dataclass
class WorkResult:
    """What ``work_one`` did: the job after finalization and the outcome."""

    job: Optional[Job]
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


class AwaTestClient:
    """Drive jobs one at a time in tests."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def migrate(self) -> None:
        await self.client.migrate()

    async def insert(self, args: Any, **opts: Any) -> Job:
        return await self.client.insert(args, **opts)

    async def clean(self) -> None:
        """Delete every job, dead-lettered job and queue setting."""
        await self.client._execute("TRUNCATE awa.jobs, awa.jobs_dlq, awa.queue_meta")

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
        job = Job.from_dict(result["job"]) if result.get("job") else None
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
    """A stand-in ``awa.Job`` for calling a handler directly, with no database."""

    def __init__(self, args: Any, *, id: int = 1, kind: Optional[str] = None, queue: str = "default",
                 attempt: int = 1, max_attempts: int = 25, metadata: Optional[dict[str, Any]] = None) -> None:
        now = _dt.datetime.now(_dt.timezone.utc)
        super().__init__(
            id=id, kind=kind or (derive_kind(type(args).__name__) if not isinstance(args, Mapping) else "job"),
            queue=queue, state="running", priority=2, attempt=attempt, max_attempts=max_attempts,
            tags=[], args=args, metadata=metadata or {}, errors=[], run_at=now, deadline=None,
            created_at=now, finalized_at=None, progress=None,
        )
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

    def set_progress(self, percent: float, message: Optional[str] = None) -> None:
        self.progress = {**(self.progress or {}), "percent": max(0.0, min(100.0, float(percent)))}
        if message is not None:
            self.progress["message"] = message

    def update_metadata(self, values: Mapping[str, Any]) -> None:
        doc = dict(self.progress or {})
        doc["metadata"] = {**doc.get("metadata", {}), **dict(values)}
        self.progress = doc

    async def flush_progress(self) -> None:
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
