"""``AsyncClient``, its blocking mirror ``Client``, and ``Transaction``."""

from __future__ import annotations

import asyncio
import atexit
import datetime as _dt
import threading
from typing import Any, Awaitable, Mapping, Optional, Sequence, TypeVar, cast

import json
import logging

from . import _awa
from . import _cron
from ._convert import build_request, checked_setting, copy_batch, derive_kind, json_text
from ._job import Job, job_from_json, jobs_from_json
from ._worker import Pump, TaskSpec

__all__ = ["AsyncClient", "Client", "Transaction", "SyncTransaction"]

T = TypeVar("T")


def _request(args: Any, **opts: Any) -> str:
    return build_request(args, **opts)


async def _insert_one(native: Any, request: str) -> Job:
    """One insert through the native bulk entry point (a one-row batch takes the engine's
    single-row statement)."""
    return jobs_from_json(await native.insert_many([request]))[0]


class Transaction:
    """A database transaction for raw SQL (``$1`` placeholders) and transactional enqueue.

    Use ``async with client.transaction() as tx:``; it commits on normal exit and rolls back
    on an exception.
    """

    def __init__(self, native: Any) -> None:
        self._native = native

    async def execute(self, sql: str, *args: Any) -> int:
        return cast("int", await self._native.execute(sql, list(args)))

    async def fetch_one(self, sql: str, *args: Any) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._native.fetch_one(sql, list(args)))

    async def fetch_optional(self, sql: str, *args: Any) -> Optional[dict[str, Any]]:
        return cast("Optional[dict[str, Any]]", await self._native.fetch_optional(sql, list(args)))

    async def fetch_all(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", await self._native.fetch_all(sql, list(args)))

    async def insert(self, args: Any, **opts: Any) -> Job:
        return await _insert_one(self._native, _request(args, **opts))

    async def insert_many(self, jobs: Sequence[Any], **opts: Any) -> list[Job]:
        return jobs_from_json(await self._native.insert_many(_many(jobs, opts)))

    async def insert_many_copy(self, jobs: Sequence[Any], *, opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None, **kw: Any) -> list[Job]:
        """``AsyncClient.insert_many_copy`` inside this transaction."""
        return jobs_from_json(await self._native.insert_many_copy(*copy_batch(jobs, kw, opts), returning=True))

    async def enqueue_many_copy(self, jobs: Sequence[Any], *, opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None, **kw: Any) -> int:
        """``AsyncClient.enqueue_many_copy`` inside this transaction."""
        return cast("int", await self._native.insert_many_copy(*copy_batch(jobs, kw, opts)))

    async def commit(self) -> None:
        await self._native.commit()

    async def rollback(self) -> None:
        await self._native.rollback()

    async def __aenter__(self) -> "Transaction":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if await self._native.is_closed():
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()


def _many(jobs: Sequence[Any], opts: Mapping[str, Any]) -> list[str]:
    """Requests for insert_many: each item is args, or ``(args, {per-job options})``."""
    out = []
    for item in jobs:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
            args, own = item
            out.append(_request(args, **{**opts, **own}))
        else:
            out.append(_request(item, **opts))
    return out


class _TransactionContext:
    """Awaitable and async context manager, so both ``await client.transaction()`` and
    ``async with client.transaction() as tx`` work."""

    def __init__(self, native_client: Any) -> None:
        self._native_client = native_client
        self._tx: Optional[Transaction] = None

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._open().__await__()

    async def _open(self) -> Transaction:
        self._tx = Transaction(await self._native_client.transaction())
        return self._tx

    async def __aenter__(self) -> Transaction:
        return await self._open()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._tx is not None:
            await self._tx.__aexit__(exc_type, exc, tb)


class AsyncClient:
    """The asyncio client: inserts, admin, and the worker runtime.

    ``AsyncClient(database_url, max_connections=10)``; usable as ``async with``.
    """

    def __init__(self, database_url: str, max_connections: int = 10) -> None:
        self.database_url = database_url
        connections = int(checked_setting("max_connections", max_connections))
        self._native = _awa.NativeClient(database_url, connections)
        self._tasks: dict[str, TaskSpec] = {}
        self._pump: Optional[Pump] = None
        self._periodic: dict[str, str] = {}  # name -> registration JSON (see _cron.py)
        # Close the pool before the interpreter finalizes: native threads still holding
        # connections while the process exits can crash it.
        native = self._native
        atexit.register(native.close_blocking)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.close()

    async def migrate(self) -> None:
        """Create or upgrade the ``awa`` schema. Idempotent; safe to run concurrently."""
        await self._native.migrate()

    async def insert(
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
    ) -> Job:
        request = _request(
            args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts,
            tags=tags, metadata=metadata, run_at=run_at, unique_opts=unique_opts,
            ordering_key=ordering_key,
        )
        return await _insert_one(self._native, request)

    async def insert_many(self, jobs: Sequence[Any], **opts: Any) -> list[Job]:
        """Insert many jobs in one statement (all or nothing). Each item is args or
        ``(args, {options})``; keyword options apply to every item."""
        return jobs_from_json(await self._native.insert_many(_many(jobs, opts)))

    async def insert_many_copy(self, jobs: Sequence[Any], *, opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None, **kw: Any) -> list[Job]:
        """Insert many jobs with one ``COPY`` (all or nothing) and return them, as awa-pg's
        ``insert_many_copy`` does. The same arguments and errors as :meth:`insert_many`;
        ``opts`` gives per-job options (one entry per job, ``None`` or a dict). Reading the
        rows back costs most of what COPY saves: use :meth:`enqueue_many_copy` when a count
        is enough."""
        return jobs_from_json(await self._native.insert_many_copy(*copy_batch(jobs, kw, opts), returning=True))

    async def enqueue_many_copy(self, jobs: Sequence[Any], *, opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None, **kw: Any) -> int:
        """Insert many jobs with one ``COPY`` (all or nothing) and return how many were
        written: the fastest bulk insert (awa-pg's ``enqueue_many_copy`` returns a count too).
        The same arguments as :meth:`insert_many_copy`."""
        return cast("int", await self._native.insert_many_copy(*copy_batch(jobs, kw, opts)))

    def transaction(self) -> _TransactionContext:
        return _TransactionContext(self._native)

    async def get_job(self, job_id: int) -> Job:
        return job_from_json(await self._native.get_job(job_id))

    async def list_jobs(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        limit: int = 100,
    ) -> list[Job]:
        return jobs_from_json(await self._native.list_jobs(state, kind, queue, limit))

    # ----- worker -------------------------------------------------------------------------

    def task(self, args_type: Any, *, kind: Optional[str] = None, queue: str = "default") -> Any:
        """Register ``async def handler(job)`` for ``args_type``'s kind (decorator)."""
        resolved = kind or (derive_kind(args_type.__name__) if isinstance(args_type, type) and args_type is not dict else None)
        if resolved is None:
            raise _awa.ValidationError("task() needs kind= when args_type is dict")

        def register(handler: Any) -> Any:
            if not asyncio.iscoroutinefunction(handler):
                raise TypeError("awa handlers must be async functions")
            self._tasks[resolved] = TaskSpec(resolved, args_type, handler, queue)
            return handler

        return register

    async def start(
        self,
        queues: Optional[Sequence[Any]] = None,
        *,
        poll_interval_ms: float = 200,
        heartbeat_interval_ms: Optional[float] = None,
        heartbeat_staleness_ms: Optional[float] = None,
        heartbeat_rescue_interval_ms: Optional[float] = None,
        deadline_rescue_interval_ms: Optional[float] = None,
        callback_rescue_interval_ms: Optional[float] = None,
        promote_interval_ms: Optional[float] = None,
        leader_election_interval_ms: Optional[float] = None,
        prune_interval_ms: Optional[float] = None,
        finalize_deadline_ms: Optional[float] = None,
        completed_retention_hours: Optional[float] = None,
        failed_retention_hours: Optional[float] = None,
        claim_batch: Optional[int] = None,
        completion_batch: Optional[int] = None,
        batch_follow_ups: Optional[bool] = None,
    ) -> None:
        """Start working ``queues``: ``[("name", max_workers), ...]`` or dicts with ``name``,
        ``max_workers`` and optional ``deadline_ms`` and ``dlq``. Handlers run on this loop.

        Every interval, deadline and retention keyword is checked before the worker starts:
        ``awa.ValidationError`` names the keyword and its range for NaN, infinite, negative
        or out-of-range values (intervals and deadlines 1 ms to 30 days, retention 0 to
        87,600 hours, ``max_workers`` and batch sizes whole numbers 1 to 10,000).

        ``batch_follow_ups`` (an addition to awa-pg's ``start()``; default ``True``): completions
        that insert follow-ups commit many per transaction with the rest of their batch; ``False``
        gives each its own transaction. Both keep every guarantee of staged follow-ups
        (docs/follow-ups.md, "How they are inserted")."""
        if self._pump is not None:
            raise _awa.AwaError("the worker is already started")
        if not self._tasks:
            raise _awa.ValidationError("register at least one handler with @client.task(...) before start()")
        if queues is None:
            queues = sorted({(spec.queue, 10) for spec in self._tasks.values()})
        parsed = []
        for q in queues:
            if isinstance(q, Mapping):
                spec = dict(q)
            else:
                name, workers = q
                spec = {"name": name, "max_workers": workers}
            for key in ("max_workers", "deadline_ms"):
                if spec.get(key) is not None:
                    spec[key] = _queue_setting(spec.get("name"), key, spec[key])
            parsed.append(spec)
        intervals = {
            k: checked_setting(k, v) for k, v in {
                "poll_interval_ms": poll_interval_ms,
                "heartbeat_interval_ms": heartbeat_interval_ms,
                "heartbeat_staleness_ms": heartbeat_staleness_ms,
                "heartbeat_rescue_interval_ms": heartbeat_rescue_interval_ms,
                "deadline_rescue_interval_ms": deadline_rescue_interval_ms,
                "callback_rescue_interval_ms": callback_rescue_interval_ms,
                "promote_interval_ms": promote_interval_ms,
                "leader_election_interval_ms": leader_election_interval_ms,
                "prune_interval_ms": prune_interval_ms,
                "finalize_deadline_ms": finalize_deadline_ms,
                "completed_retention_hours": completed_retention_hours,
                "failed_retention_hours": failed_retention_hours,
            }.items() if v is not None
        }
        batches = {
            k: checked_setting(k, v)
            for k, v in {"claim_batch": claim_batch, "completion_batch": completion_batch}.items()
            if v is not None
        }
        if batch_follow_ups is not None and not isinstance(batch_follow_ups, bool):
            raise _awa.ValidationError(
                f"batch_follow_ups is {batch_follow_ups!r}; it must be True or False")
        config = {"queues": parsed, "intervals": intervals, **batches}
        if batch_follow_ups is not None:
            config["batch_follow_ups"] = batch_follow_ups
        _awa.set_log_level(max(logging.getLogger("awa").getEffectiveLevel(), 10))
        await _cron.upsert(self._native, self._periodic)
        native_worker = await self._native.start(json.dumps(config), list(self._tasks))
        self._pump = Pump(native_worker, self._tasks)
        self._pump.start()

    async def shutdown(self, timeout_ms: int = 2000) -> None:
        """Stop claiming, let running handlers finish within ``timeout_ms``, then cancel the
        rest (their jobs are rescued later). Nothing is lost or finalized twice.
        ``timeout_ms`` is 0 to 30 days in milliseconds (``awa.ValidationError`` otherwise)."""
        timeout = int(checked_setting("timeout_ms", timeout_ms))
        pump, self._pump = self._pump, None
        if pump is not None:
            await pump.shutdown(timeout)

    async def health_check(self) -> dict[str, Any]:
        if self._pump is not None:
            return cast("dict[str, Any]", json.loads(await self._pump._native.health_check()))
        await self._native.execute("SELECT 1", [])
        return {"database": True, "running": False, "leader": False, "in_flight": 0}

    # ----- admin ----------------------------------------------------------------------------

    async def cancel(self, job_id: int) -> Job:
        """Cancel a job; a running job is signalled (``job.is_cancelled()``)."""
        return job_from_json(await self._native.cancel(job_id))

    async def cancel_by_unique_key(
        self, args: Any, *, kind: Optional[str] = None, queue: str = "default",
        unique_opts: Optional[Mapping[str, Any]] = None, run_at: Optional[_dt.datetime] = None,
    ) -> Optional[Job]:
        """Cancel the unfinished job holding the unique key these args and options produce."""
        request = _request(args, kind=kind, queue=queue, unique_opts=unique_opts or {}, run_at=run_at)
        text = await self._native.cancel_by_unique_key(request)
        return None if text == "null" else job_from_json(text)

    async def retry(self, job_id: int) -> Job:
        return job_from_json(await self._native.retry(job_id))

    async def pause_queue(self, queue: str) -> None:
        await self._native.set_queue_paused(queue, True)

    async def resume_queue(self, queue: str) -> None:
        await self._native.set_queue_paused(queue, False)

    async def drain_queue(self, queue: str) -> int:
        return cast("int", json.loads(await self._native.drain_queue(queue)))

    async def queue_stats(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", json.loads(await self._native.queue_stats()))

    async def retry_failed(self, *, kind: Optional[str] = None, queue: Optional[str] = None) -> int:
        return cast("int", json.loads(await self._native.retry_failed(kind, queue)))

    async def discard_failed(self, *, kind: Optional[str] = None, queue: Optional[str] = None) -> int:
        return cast("int", json.loads(await self._native.discard_failed(kind, queue)))

    async def list_dlq(self, *, queue: Optional[str] = None, limit: int = 100) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", json.loads(await self._native.list_dlq(queue, limit)))

    async def get_dlq_job(self, job_id: int) -> dict[str, Any]:
        return cast("dict[str, Any]", json.loads(await self._native.get_dlq_job(job_id)))

    async def dlq_depth(self, queue: Optional[str] = None) -> int:
        return cast("int", json.loads(await self._native.dlq_depth(queue)))

    async def retry_from_dlq(self, job_id: int) -> Job:
        return job_from_json(await self._native.retry_from_dlq(job_id))

    async def purge_dlq(self, queue: Optional[str] = None) -> int:
        return cast("int", json.loads(await self._native.purge_dlq(queue)))

    # ----- external callbacks ----------------------------------------------------------------

    async def _callback(self, action: str, callback_id: str, payload: Any = None, error: Optional[str] = None,
                        timeout_seconds: float = 3600) -> Job:
        payload_json = None if payload is None else json_text(payload, "payload")
        return job_from_json(await self._native.callback(action, callback_id, payload_json, error, float(timeout_seconds)))

    async def complete_external(self, callback_id: str, payload: Any = None) -> Job:
        return await self._callback("complete", callback_id, payload)

    async def fail_external(self, callback_id: str, error: str) -> Job:
        return await self._callback("fail", callback_id, error=error)

    async def retry_external(self, callback_id: str) -> Job:
        return await self._callback("retry", callback_id)

    async def resume_external(self, callback_id: str, payload: Any = None) -> Job:
        return await self._callback("resume", callback_id, payload)

    async def heartbeat_callback(self, callback_id: str, timeout_seconds: float = 3600) -> Job:
        """Extend a waiting job's callback timeout to ``timeout_seconds`` from now (more than
        0, at most 365 days; ``awa.ValidationError`` otherwise)."""
        seconds = checked_setting("timeout_seconds", timeout_seconds)
        return await self._callback("heartbeat", callback_id, timeout_seconds=seconds)

    def metrics(self) -> dict[str, int]:
        """Engine counters of this process."""
        return cast("dict[str, int]", json.loads(self._native.metrics()))

    # ----- periodic jobs (docs/periodic.md) --------------------------------------------------

    def periodic(
        self,
        name: str,
        cron_expr: str,
        args_type: type[T],
        args: T,
        *,
        timezone: str = "UTC",
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        missed_fire_policy: str = "coalesce",
    ) -> None:
        """Register a periodic job before :meth:`start`: ``cron_expr`` (five fields, or six
        with seconds first) in the IANA ``timezone`` enqueues ``args`` as a job of
        ``args_type``'s kind. ``missed_fire_policy``: ``"coalesce"`` enqueues only the latest
        of the fires missed while no leader ran, ``"catch_up"`` each of them in order.
        A bad expression, zone, policy or option raises ``awa.ValidationError`` here.
        ``start()`` upserts the schedule; the maintenance leader fires it exactly once per
        fire time across all clients."""
        if self._pump is not None:
            raise _awa.AwaError("register periodic jobs before start(); this client is started")
        self._periodic[name] = _cron.registration(
            name, cron_expr, args_type, args, timezone=timezone, queue=queue,
            priority=priority, max_attempts=max_attempts, tags=tags, metadata=metadata,
            missed_fire_policy=missed_fire_policy,
        )

    async def list_cron_jobs(self) -> list[dict[str, Any]]:
        """Every schedule in the database (name, cron_expr, timezone, kind, queue, args,
        priority, max_attempts, tags, metadata, missed_fire_policy, paused,
        last_enqueued_at, next_fire_at, created_at, updated_at)."""
        return await _cron.list_cron_jobs(self._native)

    async def delete_cron_job(self, name: str) -> bool:
        """Delete a schedule; ``True`` if it existed. Jobs it already enqueued stay."""
        return await _cron.delete_cron_job(self._native, name)

    async def pause_cron_job(self, name: str) -> bool:
        """Stop a schedule's automatic fires; ``True`` if it exists."""
        return await _cron.set_paused(self._native, name, True)

    async def resume_cron_job(self, name: str) -> bool:
        """Resume a paused schedule (fires missed meanwhile follow its missed-fire policy);
        ``True`` if it exists."""
        return await _cron.set_paused(self._native, name, False)

    async def trigger_cron_job(self, name: str) -> Optional[Job]:
        """Enqueue a schedule's job now (paused or not); ``None`` if there is no such
        schedule. Its fires are not affected."""
        return await _cron.trigger(self._native, name)

    def list_cron_jobs_sync(self) -> list[dict[str, Any]]:
        """Blocking :meth:`list_cron_jobs` (do not call from a running event loop)."""
        return _cron.list_cron_jobs_sync(self._native)

    def delete_cron_job_sync(self, name: str) -> bool:
        """Blocking :meth:`delete_cron_job`."""
        return _cron.delete_cron_job_sync(self._native, name)

    def pause_cron_job_sync(self, name: str) -> bool:
        """Blocking :meth:`pause_cron_job`."""
        return _cron.set_paused_sync(self._native, name, True)

    def resume_cron_job_sync(self, name: str) -> bool:
        """Blocking :meth:`resume_cron_job`."""
        return _cron.set_paused_sync(self._native, name, False)

    def trigger_cron_job_sync(self, name: str) -> Optional[Job]:
        """Blocking :meth:`trigger_cron_job`."""
        return _cron.trigger_sync(self._native, name)

    async def _execute(self, sql: str, *args: Any) -> int:
        """Run one statement outside a transaction (test and tooling helper)."""
        return await self._native.execute(sql, list(args))

    async def close(self) -> None:
        await self._native.close()


def _queue_setting(queue: Any, key: str, value: Any) -> float:
    try:
        return checked_setting(key, value)
    except _awa.ValidationError as exc:
        raise _awa.ValidationError(f"queue {queue!r}: {exc}") from None


class _LoopThread:
    """A private event loop on a daemon thread that runs the blocking client's coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="awa-client", daemon=True)
        self.thread.start()
        # Stop the loop before the interpreter finalizes: a loop thread still running while
        # Python tears down can be woken by the native runtime at the wrong moment.
        atexit.register(self.stop)

    def run(self, coro: Awaitable[T]) -> T:
        if self.loop.is_closed():
            raise _awa.AwaError("the client is closed")
        return asyncio.run_coroutine_threadsafe(_await(coro), self.loop).result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()
        atexit.unregister(self.stop)


async def _await(aw: Awaitable[T]) -> T:
    return await aw


class SyncTransaction:
    """Blocking mirror of :class:`Transaction`; ``with client.transaction() as tx:``."""

    def __init__(self, runner: _LoopThread, tx: Transaction) -> None:
        self._run = runner.run
        self._tx = tx

    def execute(self, sql: str, *args: Any) -> int:
        return self._run(self._tx.execute(sql, *args))

    def fetch_one(self, sql: str, *args: Any) -> dict[str, Any]:
        return self._run(self._tx.fetch_one(sql, *args))

    def fetch_optional(self, sql: str, *args: Any) -> Optional[dict[str, Any]]:
        return self._run(self._tx.fetch_optional(sql, *args))

    def fetch_all(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return self._run(self._tx.fetch_all(sql, *args))

    def insert(self, args: Any, **opts: Any) -> Job:
        return self._run(self._tx.insert(args, **opts))

    def insert_many(self, jobs: Sequence[Any], **opts: Any) -> list[Job]:
        return self._run(self._tx.insert_many(jobs, **opts))

    def insert_many_copy(self, jobs: Sequence[Any], **opts: Any) -> list[Job]:
        return self._run(self._tx.insert_many_copy(jobs, **opts))

    def enqueue_many_copy(self, jobs: Sequence[Any], **opts: Any) -> int:
        return self._run(self._tx.enqueue_many_copy(jobs, **opts))

    def commit(self) -> None:
        self._run(self._tx.commit())

    def rollback(self) -> None:
        self._run(self._tx.rollback())

    def __enter__(self) -> "SyncTransaction":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._run(self._tx.__aexit__(exc_type, exc, tb))


class Client:
    """The blocking client: the same methods as :class:`AsyncClient`, each returning its
    result instead of an awaitable. Calls run on a private event loop thread."""

    def __init__(self, database_url: str, max_connections: int = 10) -> None:
        # The native client first: a bad argument raises before a loop thread exists.
        self._async = AsyncClient(database_url, max_connections)
        self._runner = _LoopThread()
        self.database_url = database_url

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    def _run(self, coro: Awaitable[T]) -> T:
        return self._runner.run(coro)

    def migrate(self) -> None:
        self._run(self._async.migrate())

    def insert(self, args: Any, **opts: Any) -> Job:
        return self._run(self._async.insert(args, **opts))

    def insert_many(self, jobs: Sequence[Any], **opts: Any) -> list[Job]:
        return self._run(self._async.insert_many(jobs, **opts))

    def insert_many_copy(self, jobs: Sequence[Any], **opts: Any) -> list[Job]:
        return self._run(self._async.insert_many_copy(jobs, **opts))

    def enqueue_many_copy(self, jobs: Sequence[Any], **opts: Any) -> int:
        return self._run(self._async.enqueue_many_copy(jobs, **opts))

    def transaction(self) -> SyncTransaction:
        return SyncTransaction(self._runner, self._run(self._async.transaction()._open()))

    def get_job(self, job_id: int) -> Job:
        return self._run(self._async.get_job(job_id))

    def list_jobs(self, **filters: Any) -> list[Job]:
        return self._run(self._async.list_jobs(**filters))

    def task(self, args_type: Any, *, kind: Optional[str] = None, queue: str = "default") -> Any:
        return self._async.task(args_type, kind=kind, queue=queue)

    def metrics(self) -> dict[str, int]:
        return self._async.metrics()

    # ----- periodic jobs (docs/periodic.md) --------------------------------------------------

    def periodic(self, name: str, cron_expr: str, args_type: type[T], args: T, **opts: Any) -> None:
        """:meth:`AsyncClient.periodic` (same arguments); register before :meth:`start`."""
        self._async.periodic(name, cron_expr, args_type, args, **opts)

    def list_cron_jobs(self) -> list[dict[str, Any]]:
        return self._async.list_cron_jobs_sync()

    def delete_cron_job(self, name: str) -> bool:
        return self._async.delete_cron_job_sync(name)

    def pause_cron_job(self, name: str) -> bool:
        return self._async.pause_cron_job_sync(name)

    def resume_cron_job(self, name: str) -> bool:
        return self._async.resume_cron_job_sync(name)

    def trigger_cron_job(self, name: str) -> Optional[Job]:
        return self._async.trigger_cron_job_sync(name)

    # awa-pg's names for the blocking forms.
    list_cron_jobs_sync = list_cron_jobs
    delete_cron_job_sync = delete_cron_job
    pause_cron_job_sync = pause_cron_job
    resume_cron_job_sync = resume_cron_job
    trigger_cron_job_sync = trigger_cron_job

    def __getattr__(self, name: str) -> Any:
        # Every other AsyncClient coroutine method, run to completion on the private loop
        # (start() runs the handlers on that loop too).
        if name.startswith("_") or name not in _BLOCKING_MIRRORED:
            raise AttributeError(name)
        method = getattr(self._async, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(method(*args, **kwargs))

        call.__name__ = name
        call.__doc__ = method.__doc__
        return call

    def close(self) -> None:
        if self._runner.loop.is_closed():
            return
        try:
            self._run(self._async.shutdown())
            self._run(self._async.close())
        finally:
            self._runner.stop()


_BLOCKING_MIRRORED = frozenset({
    "start", "shutdown", "health_check", "cancel", "cancel_by_unique_key", "retry", "pause_queue",
    "resume_queue", "drain_queue", "queue_stats", "retry_failed", "discard_failed", "list_dlq",
    "get_dlq_job", "dlq_depth", "retry_from_dlq", "purge_dlq", "complete_external",
    "fail_external", "retry_external", "resume_external", "heartbeat_callback",
})
