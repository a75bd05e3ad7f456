"""``awa.Job``: a job row as Python sees it, in admin reads and in handlers."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from typing import Any, Mapping, Optional, Sequence, Union

from . import _awa
from ._convert import build_request, checked_setting, json_text
from ._outcomes import CallbackToken, callback_id_of
from ._states import JobState

__all__ = ["Job", "format_timestamp", "job_from_json", "jobs_from_json", "parse_timestamp"]


def parse_timestamp(value: Optional[str]) -> Optional[_dt.datetime]:
    """A ``Job`` timestamp (RFC 3339 text, as awa-pg gives it) as an aware ``datetime``."""
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


def format_timestamp(value: _dt.datetime) -> str:
    """``value`` as awa-pg formats a ``Job`` timestamp: UTC, ``+00:00``, and 0, 3 or 6
    fractional digits (as few as keep it exact). A naive ``datetime`` is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    value = value.astimezone(_dt.timezone.utc)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    micros = value.microsecond
    if micros % 1000 == 0 and micros:
        text += f".{micros // 1000:03d}"
    elif micros:
        text += f".{micros:06d}"
    return text + "+00:00"


class _TimeoutError(_awa.ValidationError, ValueError):
    """A bad callback timeout: ``ValidationError``, and the ``ValueError`` awa-pg raises."""


@dataclasses.dataclass
class Job:
    """A job row. In a handler, ``args`` is the registered args type and the methods that
    talk to the running attempt (progress, callbacks, staging) are available.

    As in awa-pg, ``state`` is a :class:`JobState` and the timestamps (``run_at``,
    ``deadline``, ``created_at``, ``finalized_at`` and this package's ``heartbeat_at``,
    ``attempted_at``, ``callback_timeout_at``) are RFC 3339 strings such as
    ``"2026-12-03T13:28:23.620739+00:00"`` (``datetime.fromisoformat`` parses them)."""

    id: int
    kind: str
    queue: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    tags: list[str]
    args: Any
    metadata: dict[str, Any]
    errors: list[dict[str, Any]]
    run_at: Optional[str]
    deadline: Optional[str]
    created_at: Optional[str]
    finalized_at: Optional[str]
    progress: Optional[dict[str, Any]]
    heartbeat_at: Optional[str] = None
    attempted_at: Optional[str] = None
    callback_id: Optional[str] = None
    callback_timeout_at: Optional[str] = None
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

    def set_progress(self, percent: int, message: Optional[str] = None) -> None:
        """Record progress, ``percent`` a whole number from 0 to 100 (clamped; a fraction is
        rounded), as in awa-pg. Flushed with heartbeats and the state change; kept across
        retries."""
        self._context().set_progress(_percent(percent), message)
        self.progress = self._current_progress()

    def update_metadata(self, updates: Mapping[str, Any]) -> None:
        """Shallow-merge ``updates`` into ``progress["metadata"]`` (checkpoints for resuming)."""
        text = json_text(dict(updates), "metadata")
        self._context().update_metadata(text)
        self.progress = self._current_progress()

    def _current_progress(self) -> Optional[dict[str, Any]]:
        text = self._context().progress_json()
        return None if text is None else json.loads(text)

    async def flush_progress(self) -> None:
        """Write buffered progress now instead of with the next heartbeat."""
        await self._context().flush_progress()

    def flush_progress_sync(self) -> None:
        """Blocking :meth:`flush_progress`, for code running in a thread of the handler
        (``asyncio.to_thread``, an executor). Do not call it on the event loop's thread."""
        self._context().flush_progress_blocking()

    async def register_callback(
        self,
        timeout_seconds: float = 3600,
        filter: Optional[str] = None,
        on_complete: Optional[str] = None,
        on_fail: Optional[str] = None,
        transform: Optional[str] = None,
    ) -> CallbackToken:
        """Register an external callback for this attempt; returns its :class:`CallbackToken`
        (``token.id`` goes to the external system). ``timeout_seconds`` is more than 0 and at
        most 365 days (``awa.ValidationError``, also a ``ValueError`` for a negative or NaN
        value as in awa-pg).

        The optional CEL expressions (``payload`` is their one variable) decide what
        ``resolve_callback`` does with a payload: ``filter`` (bool) false ignores it,
        ``on_fail`` (bool, evaluated first) fails the job, ``on_complete`` (bool) completes it,
        ``transform`` reshapes the payload that completion returns. Each is compiled here: a
        syntax error or a variable other than ``payload`` raises ``awa.ValidationError``."""
        seconds = _timeout(timeout_seconds)
        expressions = {"filter": filter, "on_complete": on_complete, "on_fail": on_fail, "transform": transform}
        for name, expr in expressions.items():
            if expr is not None and not isinstance(expr, str):
                raise TypeError(f"{name} must be a CEL expression (str) or None, not {type(expr).__name__}")
        token = str(await self._context().register_callback(seconds, filter, on_complete, on_fail, transform))
        self.callback_id = token
        return CallbackToken(token)

    async def wait_for_callback(self, token: Union[CallbackToken, str]) -> Any:
        """Wait in the handler until ``resume_external(token.id, payload)``; returns the payload.
        Takes the :class:`CallbackToken` (or its id)."""
        return json.loads(await self._context().wait_for_callback(callback_id_of(token, "token")))

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
            state=JobState(d["state"]),
            priority=d["priority"],
            attempt=d["attempt"],
            max_attempts=d["max_attempts"],
            tags=list(d.get("tags") or []),
            args=d.get("args"),
            metadata=d.get("metadata") or {},
            errors=list(d.get("errors") or []),
            run_at=d.get("run_at"),
            deadline=d.get("deadline_at"),
            created_at=d.get("created_at"),
            finalized_at=d.get("finalized_at"),
            progress=d.get("progress"),
            heartbeat_at=d.get("heartbeat_at"),
            attempted_at=d.get("attempted_at"),
            callback_id=d.get("callback_id"),
            callback_timeout_at=d.get("callback_timeout_at"),
            run_lease=d.get("run_lease", 0),
            unique_states=d.get("unique_states"),
            ordering_key=d.get("ordering_key"),
        )


def job_from_json(text: str) -> Job:
    return Job.from_dict(json.loads(text))


def jobs_from_json(text: str) -> list[Job]:
    return [Job.from_dict(d) for d in json.loads(text)]


def _percent(value: Any) -> float:
    """``set_progress``'s percent, checked: a real number that is not NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"percent must be an int, not {type(value).__name__}")
    if value != value:  # NaN
        raise _awa.ValidationError("percent must be a number from 0 to 100, got nan")
    return float(value)


def _timeout(value: Any) -> float:
    """``register_callback``'s timeout, checked: awa-pg's ``ValueError`` for a negative or
    non-finite value (as a ``ValidationError`` that is also a ``ValueError``), then the
    engine's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"timeout_seconds must be a number, not {type(value).__name__}")
    if value != value or value < 0 or value in (float("inf"), float("-inf")):
        raise _TimeoutError(f"timeout_seconds must be a finite non-negative number, got {value!r}")
    try:
        return checked_setting("timeout_seconds", value)
    except _awa.ValidationError as exc:
        raise _TimeoutError(str(exc)) from None
