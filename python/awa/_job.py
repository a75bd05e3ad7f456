"""``awa.Job``: a job row as Python sees it, in admin reads and in handlers."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from typing import Any, Mapping, Optional, Sequence

from . import _awa
from ._convert import build_request, checked_setting, json_text

__all__ = ["Job", "job_from_json", "jobs_from_json", "parse_timestamp"]


def parse_timestamp(value: Optional[str]) -> Optional[_dt.datetime]:
    """Parse the engine's timestamps (``...ffffff+00:00``); anything else RFC 3339 also works."""
    if value is None:
        return None
    try:
        return _fromisoformat(value)
    except ValueError:
        return _parse_loose(value)


_fromisoformat = _dt.datetime.fromisoformat


def _parse_loose(value: str) -> _dt.datetime:
    # Python 3.10's fromisoformat wants "+00:00" and 0, 3 or 6 fractional digits.
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    if "." in text:
        head, rest = text.split(".", 1)
        i = 0
        while i < len(rest) and rest[i].isdigit():
            i += 1
        text = f"{head}.{(rest[:i] + '000000')[:6]}{rest[i:]}"
    return _fromisoformat(text)


@dataclasses.dataclass
class Job:
    """A job row. In a handler, ``args`` is the registered args type and the methods that
    talk to the running attempt (progress, callbacks, staging) are available."""

    id: int
    kind: str
    queue: str
    state: str
    priority: int
    attempt: int
    max_attempts: int
    tags: list[str]
    args: Any
    metadata: dict[str, Any]
    errors: list[dict[str, Any]]
    run_at: Optional[_dt.datetime]
    deadline: Optional[_dt.datetime]
    created_at: Optional[_dt.datetime]
    finalized_at: Optional[_dt.datetime]
    progress: Optional[dict[str, Any]]
    heartbeat_at: Optional[_dt.datetime] = None
    attempted_at: Optional[_dt.datetime] = None
    callback_id: Optional[str] = None
    callback_timeout_at: Optional[_dt.datetime] = None
    run_lease: int = 0
    unique_states: Optional[int] = None
    ordering_key: Optional[str] = None
    _ctx: Any = dataclasses.field(default=None, repr=False, compare=False)

    def _context(self) -> Any:
        if self._ctx is None:
            raise _awa.AwaError("this method is only available inside a running handler")
        return self._ctx

    def is_cancelled(self) -> bool:
        """True once ``cancel(job_id)`` was requested for this running attempt."""
        return bool(self._context().is_cancelled())

    def set_progress(self, percent: float, message: Optional[str] = None) -> None:
        """Record progress (flushed with heartbeats and the state change; kept across retries)."""
        self._context().set_progress(float(percent), message)
        self.progress = self._current_progress()

    def update_metadata(self, values: Mapping[str, Any]) -> None:
        """Shallow-merge ``values`` into ``progress["metadata"]`` (checkpoints for resuming)."""
        text = json_text(dict(values), "metadata")
        self._context().update_metadata(text)
        self.progress = self._current_progress()

    def _current_progress(self) -> Optional[dict[str, Any]]:
        text = self._context().progress_json()
        return None if text is None else json.loads(text)

    async def flush_progress(self) -> None:
        """Write buffered progress now instead of with the next heartbeat."""
        await self._context().flush_progress()

    async def register_callback(self, timeout_seconds: float = 3600) -> str:
        """Register an external callback for this attempt; returns its token (callback id).
        ``timeout_seconds`` is more than 0 and at most 365 days (``awa.ValidationError``)."""
        token = str(await self._context().register_callback(checked_setting("timeout_seconds", timeout_seconds)))
        self.callback_id = token
        return token

    async def wait_for_callback(self, token: str) -> Any:
        """Wait in the handler until ``resume_external(token, payload)``; returns the payload."""
        return json.loads(await self._context().wait_for_callback(token))

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
        """Stage a follow-up job, inserted if and only if this attempt's completion commits
        (ADR-046). Raises ``awa.StagingError`` (a ``TerminalError``) when it cannot be staged;
        a failed stage also fails the attempt even if the error is swallowed."""
        ctx = self._context()
        try:
            request = build_request(
                args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts,
                tags=tags, metadata=metadata, run_at=run_at, unique_opts=unique_opts,
                ordering_key=ordering_key,
            )
        except Exception as exc:
            raise _awa.StagingError(ctx.record_staging_failure(str(exc))) from exc
        try:
            ctx.enqueue_on_completion(request)
        except _awa.ValidationError as exc:
            raise _awa.StagingError(str(exc)) from exc

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Job":
        return cls(
            id=d["id"],
            kind=d["kind"],
            queue=d["queue"],
            state=d["state"],
            priority=d["priority"],
            attempt=d["attempt"],
            max_attempts=d["max_attempts"],
            tags=list(d.get("tags") or []),
            args=d.get("args"),
            metadata=d.get("metadata") or {},
            errors=list(d.get("errors") or []),
            run_at=parse_timestamp(d.get("run_at")),
            deadline=parse_timestamp(d.get("deadline_at")),
            created_at=parse_timestamp(d.get("created_at")),
            finalized_at=parse_timestamp(d.get("finalized_at")),
            progress=d.get("progress"),
            heartbeat_at=parse_timestamp(d.get("heartbeat_at")),
            attempted_at=parse_timestamp(d.get("attempted_at")),
            callback_id=d.get("callback_id"),
            callback_timeout_at=parse_timestamp(d.get("callback_timeout_at")),
            run_lease=d.get("run_lease", 0),
            unique_states=d.get("unique_states"),
            ordering_key=d.get("ordering_key"),
        )


def job_from_json(text: str) -> Job:
    return Job.from_dict(json.loads(text))


def jobs_from_json(text: str) -> list[Job]:
    return [Job.from_dict(d) for d in json.loads(text)]
