"""The Python side of the worker: task registry, the pump, and running one handler.

Rust claims jobs and hands them over in batches (``next_batch``); each handler runs as an
asyncio task on the loop that called ``start()``; its outcome goes back with ``ctx.finish``,
a synchronous call that also seals the attempt's staged follow-ups. ``run_handler`` calls it
with no ``await`` between the handler's return and the call, so no other task (say, one the
handler spawned and did not await) runs in between: every later ``enqueue_on_completion``
raises ``awa.StagingError``. Finalizing is Rust.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
import traceback as _tb
from typing import Any, Awaitable, Callable, Optional

from . import _awa
from ._job import Job, parse_timestamp
from ._outcomes import Cancel, RetryAfter, Snooze, WaitForCallback

__all__ = ["TaskSpec", "run_handler", "rebuild_args", "Pump"]

log = logging.getLogger("awa")

Handler = Callable[[Job], Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    kind: str
    args_type: Any
    handler: Handler
    queue: str


def rebuild_args(args_type: Any, raw: Any) -> Any:
    """Rebuild the registered args type from JSON: a Pydantic model, a dataclass, or dict."""
    if args_type is None or args_type is dict:
        return raw
    if hasattr(args_type, "model_validate"):
        return args_type.model_validate(raw)
    if dataclasses.is_dataclass(args_type) and isinstance(args_type, type):
        return args_type(**raw)
    return args_type(**raw) if isinstance(raw, dict) else args_type(raw)


def _short_traceback(exc: BaseException) -> str:
    return "".join(_tb.format_exception(type(exc), exc, exc.__traceback__, limit=8))[-4000:]


def _seconds(result: Any) -> float:
    """The delay of a RetryAfter/Snooze as a float; NaN when it is not a number (a mutated or
    subclassed outcome), which the engine refuses as a handler error naming the limit."""
    try:
        return float(result.seconds)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return math.nan


def _finish_with_result(ctx: Any, result: Any) -> None:
    # Values were checked when the outcome was built; the engine checks again in finish()
    # (a mutated attribute or a subclass may bypass the first check) and fails the attempt
    # cleanly as a handler error instead of leaving the job running.
    if isinstance(result, RetryAfter):
        ctx.finish("retry_after", seconds=_seconds(result))
    elif isinstance(result, Snooze):
        ctx.finish("snooze", seconds=_seconds(result))
    elif isinstance(result, Cancel):
        ctx.finish("cancel", value=str(result.reason))
    elif isinstance(result, WaitForCallback):
        ctx.finish("wait_for_callback", value=str(result.token))
    else:
        # None or any other value: completed.
        ctx.finish("completed")


async def run_handler(ctx: Any, spec: TaskSpec, raw: Optional[dict[str, Any]] = None) -> None:
    """Run one attempt and hand its outcome back. Never raises (except cancellation).
    ``raw`` is the job as decoded from its batch (else it is fetched from ``ctx``)."""
    try:
        job = Job.from_dict(raw if raw is not None else json.loads(ctx.job_json()))
        job._ctx = ctx
        job.args = rebuild_args(spec.args_type, job.args)
    except Exception as exc:  # the args do not fit the registered type: terminal
        ctx.finish("terminal", value=f"args do not decode as {getattr(spec.args_type, '__name__', spec.args_type)}: {exc}")
        return
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    deadline_handle = None
    deadline = parse_timestamp(job.deadline)
    if deadline is not None and task is not None:
        remaining = deadline.timestamp() - time.time()
        deadline_handle = loop.call_later(max(remaining, 0.0), task.cancel)
    try:
        result = await spec.handler(job)
    except asyncio.CancelledError:
        ctx.finish("abandoned", value="handler cancelled (deadline or shutdown)")
        raise
    except _awa.TerminalError as exc:  # includes StagingError
        ctx.finish("terminal", value=str(exc) or type(exc).__name__, traceback=_short_traceback(exc))
    except Exception as exc:
        ctx.finish("error", value=f"{type(exc).__name__}: {exc}", traceback=_short_traceback(exc))
    else:
        try:
            _finish_with_result(ctx, result)
        except Exception as exc:  # noqa: BLE001 - a broken outcome object must still finish the attempt
            ctx.finish("error", value=f"invalid outcome: {type(exc).__name__}: {exc}",
                       traceback=_short_traceback(exc))
    finally:
        if deadline_handle is not None:
            deadline_handle.cancel()


class Pump:
    """Pulls claimed jobs from Rust in batches and runs each as a task."""

    def __init__(self, native_worker: Any, tasks: dict[str, TaskSpec], batch: int = 256) -> None:
        self._native = native_worker
        self._tasks = tasks
        self._batch = batch
        self._running: set[asyncio.Task[None]] = set()
        self._queue_of: dict[asyncio.Task[None], str] = {}  # running task -> its job's queue
        self._pump_task: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self._pump_task = asyncio.get_running_loop().create_task(self._pump(), name="awa-pump")

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            got = await self._native.next_batch(self._batch)
            if got is None:
                return
            batch, jobs_json = got
            for ctx, raw in zip(batch, json.loads(jobs_json), strict=True):
                spec = self._tasks.get(ctx.kind)
                if spec is None:
                    ctx.finish("terminal", value="no Python handler registered for this kind")
                    continue
                t = loop.create_task(run_handler(ctx, spec, raw))
                self._running.add(t)
                self._queue_of[t] = str(raw.get("queue", spec.queue))
                t.add_done_callback(self._task_done)

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        self._running.discard(task)
        self._queue_of.pop(task, None)

    def in_flight_by_queue(self) -> dict[str, int]:
        """How many handlers of this worker are running, per queue (for health_check)."""
        out: dict[str, int] = {}
        for queue in self._queue_of.values():
            out[queue] = out.get(queue, 0) + 1
        return out

    async def shutdown(self, timeout_ms: int) -> None:
        # Rust stops claiming, waits for running handlers (they keep running on this loop
        # while we await), then abandons the rest; cancel whatever Python tasks remain.
        await self._native.shutdown(timeout_ms)
        for t in list(self._running):
            t.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._pump_task is not None:
            await asyncio.gather(self._pump_task, return_exceptions=True)
