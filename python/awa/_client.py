"""``AsyncClient``, its blocking mirror ``Client``, and ``Transaction``."""

from __future__ import annotations

import asyncio
import atexit
import datetime as _dt
import threading
from typing import Any, Awaitable, Mapping, Optional, Sequence, TypeVar, Union, cast

import json
import logging
import warnings

from . import _awa
from . import _cron
from ._convert import OrderingKey, RunAt, args_to_json_text, build_request, checked_setting, copy_batch, derive_kind, json_text, run_at_text
from ._batch_ops import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
    filter_json,
    instant_text,
    spec_json,
)
from ._dump import dump_job_text, dump_run_text
from ._job import Job, job_from_json, jobs_from_json
from ._outcomes import CallbackToken, callback_id_of
from ._results import (
    DlqEntry,
    HealthCheck,
    QueueHealth,
    QueueStat,
    ResolveResult,
    RetryFailedResult,
    dlq_entry_from_dict,
    retry_failed_result_from_dict,
)
from ._worker import Pump, TaskSpec
from ._worker_config import queue_storage_config, start_config

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

    async def execute(self, query: str, *args: Any) -> int:
        """Run one statement; returns the number of rows it affected."""
        return cast("int", await self._native.execute(query, list(args)))

    async def fetch_one(self, query: str, *args: Any) -> dict[str, Any]:
        """The one row the query returns; ``awa.DatabaseError`` when it returns none."""
        return cast("dict[str, Any]", await self._native.fetch_one(query, list(args)))

    async def fetch_optional(self, query: str, *args: Any) -> Optional[dict[str, Any]]:
        """The first row the query returns, or None."""
        return cast("Optional[dict[str, Any]]", await self._native.fetch_optional(query, list(args)))

    async def fetch_all(self, query: str, *args: Any) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", await self._native.fetch_all(query, list(args)))

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
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> Job:
        """:meth:`AsyncClient.insert` inside this transaction."""
        return await _insert_one(self._native, _request(
            args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
        ))

    async def insert_many(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> list[Job]:
        """:meth:`AsyncClient.insert_many` inside this transaction."""
        opts = _shared_opts(kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key)
        return jobs_from_json(await self._native.insert_many(_many(jobs, opts)))

    async def insert_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
    ) -> list[Job]:
        """``AsyncClient.insert_many_copy`` inside this transaction."""
        kw = _shared_opts(kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key)
        return jobs_from_json(await self._native.insert_many_copy(*copy_batch(jobs, kw, opts), returning=True))

    async def enqueue_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
    ) -> int:
        """``AsyncClient.enqueue_many_copy`` inside this transaction."""
        kw = _shared_opts(kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key)
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


def _shared_opts(
    kind: Optional[str], queue: str, priority: int, max_attempts: int, tags: Optional[Sequence[str]],
    metadata: Optional[Mapping[str, Any]], run_at: Optional[RunAt],
    unique_opts: Optional[Mapping[str, Any]], ordering_key: Optional[OrderingKey],
) -> dict[str, Any]:
    """The batch-wide options of a bulk insert as the keyword dict ``_many``/``copy_batch``
    merge per-job options into."""
    return {
        "kind": kind, "queue": queue, "priority": priority, "max_attempts": max_attempts,
        "tags": tags, "metadata": metadata, "run_at": run_at, "unique_opts": unique_opts,
        "ordering_key": ordering_key,
    }


def _descriptor(subject: str, name: str, display_name: Optional[str], description: Optional[str],
                owner: Optional[str], docs_url: Optional[str], tags: Optional[list[str]],
                extra: Optional[Any]) -> dict[str, Any]:
    """One descriptor declaration as the JSON the runtime reads, checked now by the engine's
    own rules (``awa_core::storage::descriptors``) so a bad one fails where it is declared."""
    if not isinstance(name, str):
        raise TypeError(f"descriptor name must be a str, not {type(name).__name__}")
    fields = {"display_name": display_name, "description": description, "owner": owner, "docs_url": docs_url}
    for field, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{field} must be a str or None, not {type(value).__name__}")
    tag_list = [] if tags is None else list(tags)
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tag_list):
        raise TypeError("tags must be a list of str")
    spec: dict[str, Any] = {**fields, "tags": tag_list, "extra": {} if extra is None else extra}
    try:
        text = json.dumps(spec, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"extra must be JSON-serializable: {exc}") from None
    _awa.check_descriptor(subject, name, text)
    return cast("dict[str, Any]", json.loads(text))


def _one_stripe(count: Any) -> None:
    if isinstance(count, bool) or count != 1:
        raise _awa.ValidationError(
            f"queue_storage_queue_stripe_count is {count!r}; the canonical engine has one stripe "
            "(queue storage is not supported), so it must be 1"
        )


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


def _move_spec(queue: str, priority: Optional[int]) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": queue}
    if priority is not None:
        spec["priority"] = priority
    return spec


class AsyncClient:
    """The asyncio client: inserts, admin, and the worker runtime.

    ``AsyncClient(database_url, max_connections=10)``; usable as ``async with``. The
    constructor opens one connection to check the server, so a wrong URL or an unreachable
    server raises ``awa.DatabaseError`` (naming host, port and cause) within the URL's
    ``connect_timeout`` (default 5 s). TLS (``sslmode``, ...), the timeout and
    ``pool_mode=transaction`` for PgBouncer are URL parameters: see docs/deploying.md.
    """

    def __init__(self, database_url: str, max_connections: int = 10) -> None:
        self.database_url = database_url
        connections = int(checked_setting("max_connections", max_connections))
        self._native = _awa.NativeClient(database_url, connections)
        self._tasks: dict[str, TaskSpec] = {}
        self._pump: Optional[Pump] = None
        self._periodic: dict[str, str] = {}  # name -> registration JSON (see _cron.py)
        # queue_descriptor / job_kind_descriptor declarations: "queue"/"kind" -> name -> fields
        self._descriptors: dict[str, dict[str, dict[str, Any]]] = {"queue": {}, "kind": {}}
        self._started_queues: dict[str, Optional[int]] = {}  # health_check's queues: name -> max_workers
        self._shutting_down = False
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

    async def install_queue_storage(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
        reset: bool = False,
    ) -> None:
        """Install queue storage in ``schema`` and make it the engine of every new job at once
        (docs/storage-transition.md). For a fresh database or a test; a database whose canonical engine
        still holds live jobs is refused (``awa.AwaError``) and moves with the live transition
        instead. Installing where it is installed changes nothing; ``reset=True`` first drops
        the schema's queue-storage tables and every job in them (canonical's tables are kept).
        Refused while this client's worker runtime is running. A bad schema name or slot count
        raises ``awa.ValidationError``."""
        if self._pump is not None:
            raise _awa.AwaError("cannot install queue storage while the worker runtime is running")
        await self._native.install_queue_storage(schema, queue_slot_count, lease_slot_count, reset)

    async def prepare_queue_storage_schema(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
    ) -> None:
        """Install queue storage's tables and functions in ``schema`` without changing where
        new jobs go: a step of the live transition (docs/storage-transition.md)."""
        await self._native.prepare_queue_storage_schema(schema, queue_slot_count, lease_slot_count)

    async def storage_status(self) -> str:
        """The storage state as pretty JSON: the state row, the canonical backlog, live
        runtimes by capability, and whether the next transition step may run now and what
        blocks it (awa-pg's report)."""
        return json.dumps(json.loads(await self._native.storage_status()), indent=2)

    async def storage_prepare(self, *, schema: str = "awa") -> dict[str, Any]:
        """Start a transition to queue storage in ``schema``; writes stay on canonical
        (``awa.storage_prepare``). Returns the state after the step."""
        return dict(json.loads(await self._native.storage_transition("prepare", schema)))

    async def storage_enter_mixed_transition(self) -> dict[str, Any]:
        """Route new jobs to queue storage; runtimes started earlier drain canonical. Needs a
        live ``queue_storage_target`` runtime (``awa.AwaError`` says what blocks it)."""
        return dict(json.loads(await self._native.storage_transition("enter_mixed_transition")))

    async def storage_finalize(self) -> dict[str, Any]:
        """Make queue storage the only engine, once canonical holds no live job."""
        return dict(json.loads(await self._native.storage_transition("finalize")))

    async def storage_abort(self) -> dict[str, Any]:
        """Go back to canonical from ``prepared``, or from ``mixed_transition`` while queue
        storage holds nothing live and no runtime works it."""
        return dict(json.loads(await self._native.storage_transition("abort")))

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
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> Job:
        """Insert one job. ``args`` is a dataclass, a Pydantic model or a dict (then ``kind=``
        is required); ``run_at`` a ``datetime`` (naive means UTC) or an RFC 3339 string; a
        future ``run_at`` makes the job ``scheduled``. Bad input raises ``awa.ValidationError``
        (also a ``ValueError``) naming the field, before anything is written."""
        request = _request(
            args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts,
            tags=tags, metadata=metadata, run_at=run_at, unique_opts=unique_opts,
            ordering_key=ordering_key,
        )
        return await _insert_one(self._native, request)

    async def insert_many(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> list[Job]:
        """Insert many jobs in one statement (all or nothing). Each item is args or
        ``(args, {options})``; keyword options apply to every item."""
        opts = _shared_opts(kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key)
        return jobs_from_json(await self._native.insert_many(_many(jobs, opts)))

    async def insert_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
    ) -> list[Job]:
        """Insert many jobs with one ``COPY`` (all or nothing) and return them, as awa-pg's
        ``insert_many_copy`` does. The same arguments and errors as :meth:`insert_many`;
        ``opts`` gives per-job options (one entry per job, ``None`` or a dict). Reading the
        rows back costs most of what COPY saves: use :meth:`enqueue_many_copy` when a count
        is enough."""
        kw = _shared_opts(kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key)
        return jobs_from_json(await self._native.insert_many_copy(*copy_batch(jobs, kw, opts), returning=True))

    async def enqueue_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
        queue_storage_queue_stripe_count: int = 1,
    ) -> int:
        """Insert many jobs with one ``COPY`` (all or nothing) and return how many were
        written: the fastest bulk insert (awa-pg's ``enqueue_many_copy`` returns a count too).
        The same arguments as :meth:`insert_many_copy`. ``queue_storage_queue_stripe_count``
        is awa-pg's queue-storage setting: the canonical engine has one stripe, so only ``1``
        is accepted (anything else is a ``ValidationError``, not silently ignored)."""
        _one_stripe(queue_storage_queue_stripe_count)
        kw = _shared_opts(kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key)
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

    def worker(self, args_type: Any, *, kind: Optional[str] = None, queue: str = "default") -> Any:
        """Deprecated alias of :meth:`task` (awa-pg's old name); warns once per call."""
        warnings.warn("client.worker() is deprecated, use client.task() instead", DeprecationWarning, stacklevel=2)
        return self.task(args_type, kind=kind, queue=queue)

    # ----- descriptors (docs/operating.md, "Descriptors") -----------------------------------

    def queue_descriptor(
        self,
        queue: str,
        *,
        display_name: Optional[str] = None,
        description: Optional[str] = None,
        owner: Optional[str] = None,
        docs_url: Optional[str] = None,
        tags: Optional[list[str]] = None,
        extra: Optional[Any] = None,
    ) -> None:
        """Describe ``queue`` for the web UI and the ``/api/queues`` endpoints (awa-pg's
        ``queue_descriptor``): a display name, what it is for, who owns it, a runbook link,
        tags and any JSON ``extra``. Call before :meth:`start`, for a queue ``start()`` works
        (another raises ``awa.ConfigError`` at ``start()``); a second call replaces the first.
        ``start()`` writes it to ``awa.queue_descriptors`` and every heartbeat refreshes it.

        Limits (awa-pg's): names, ``display_name`` and ``owner`` 200 characters,
        ``description`` 2,000, ``docs_url`` 2,048, 20 tags; past one, or a NUL byte, raises
        ``awa.ConfigError`` (a ``ValidationError`` and ``ValueError``) here."""
        self._descriptors["queue"][queue] = _descriptor(
            "queue", queue, display_name, description, owner, docs_url, tags, extra)

    def job_kind_descriptor(
        self,
        kind: str,
        *,
        display_name: Optional[str] = None,
        description: Optional[str] = None,
        owner: Optional[str] = None,
        docs_url: Optional[str] = None,
        tags: Optional[list[str]] = None,
        extra: Optional[Any] = None,
    ) -> None:
        """Describe a job kind (the string ``@client.task`` registers) for the web UI and
        ``/api/kinds`` (awa-pg's ``job_kind_descriptor``); the same fields and limits as
        :meth:`queue_descriptor`. Any kind may be described, handled here or not."""
        self._descriptors["kind"][kind] = _descriptor(
            "kind", kind, display_name, description, owner, docs_url, tags, extra)

    async def start(
        self,
        queues: Optional[Sequence[Any]] = None,
        *,
        poll_interval_ms: float = 200,
        global_max_workers: Optional[int] = None,
        completed_retention_hours: Optional[float] = None,
        failed_retention_hours: Optional[float] = None,
        descriptor_retention_days: Optional[float] = None,
        cleanup_batch_size: Optional[int] = None,
        leader_election_interval_ms: Optional[float] = None,
        heartbeat_interval_ms: Optional[float] = None,
        promote_interval_ms: Optional[float] = None,
        heartbeat_rescue_interval_ms: Optional[float] = None,
        heartbeat_staleness_ms: Optional[float] = None,
        deadline_rescue_interval_ms: Optional[float] = None,
        callback_rescue_interval_ms: Optional[float] = None,
        terminal_count_rollup_interval_ms: Optional[float] = None,
        prune_interval_ms: Optional[float] = None,
        finalize_deadline_ms: Optional[float] = None,
        claim_batch: Optional[int] = None,
        completion_batch: Optional[int] = None,
        batch_follow_ups: Optional[bool] = None,
        queue_storage_schema: Optional[str] = None,
        queue_storage_queue_slot_count: int = 16,
        queue_storage_lease_slot_count: int = 8,
        queue_storage_claim_slot_count: int = 8,
        queue_storage_queue_stripe_count: int = 1,
        queue_storage_queue_rotate_interval_ms: int = 1000,
        queue_storage_lease_rotate_interval_ms: int = 250,
        queue_storage_claim_rotate_interval_ms: Optional[int] = None,
        storage_transition_role: Optional[str] = "auto",
    ) -> None:
        """Start working ``queues``; handlers run on this loop. See docs/workers.md.

        ``queues`` is a list of ``("name", max_workers)`` tuples or dicts with ``name`` and
        either ``max_workers`` (hard-reserved) or, with ``global_max_workers``, ``min_workers``
        and ``weight`` (a guaranteed minimum plus a weighted share of the global pool), and
        optionally ``rate_limit=(max_rate, burst)``, ``claimers``, ``claim_batch_size``,
        ``deadline_duration_ms`` (or ``deadline_ms``), ``priority_aging_interval_ms`` and
        ``dlq``. ``None`` works every queue a ``@task`` uses with 10 workers each.

        Everything is checked before the worker starts: an unknown queue key, a missing or
        contradictory mode, or a ``@task`` queue the list leaves out raises ``awa.ConfigError``
        (a ``ValidationError`` and a ``ValueError``); a queue entry or ``rate_limit`` of the
        wrong shape raises ``TypeError``; a number out of range raises ``awa.ConfigError``
        naming the field and its range. ``terminal_count_rollup_interval_ms`` is checked and
        has no effect (terminal counters belong to queue storage).

        ``descriptor_retention_days`` (default 30; ``0`` keeps them for good): how long a queue
        or kind descriptor (:meth:`queue_descriptor`) may go without a refresh by any live
        client before the maintenance leader deletes it from ``awa.queue_descriptors`` /
        ``awa.job_kind_descriptors``. A queue descriptor for a queue this client does not work
        raises ``awa.ConfigError``.

        ``batch_follow_ups`` (an addition to awa-pg's ``start()``; default ``True``): completions
        that insert follow-ups commit many per transaction with the rest of their batch; ``False``
        gives each its own transaction. Both keep every guarantee of staged follow-ups
        (docs/follow-ups.md, "How they are inserted").

        The engine this runtime works is decided once, here, from ``storage_transition_role``
        and the database's storage state (docs/storage-transition.md): ``"auto"`` (the default) works
        canonical until a transition routes new jobs to queue storage, then queue storage;
        ``"canonical_drain"`` keeps draining canonical; ``"queue_storage_target"`` works queue
        storage at once (installing ``queue_storage_schema`` with the slot counts if missing).
        ``queue_storage_schema`` must match the state's schema when given (else
        ``awa.ValidationError``). The rotate intervals set how often the maintenance leader
        moves the rings on; the claim-slot, stripe and claim-rotate settings are checked and
        have no effect (this engine has no claim ring or stripes)."""
        if self._pump is not None:
            raise _awa.AwaError("worker runtime is already running")
        if not self._tasks:
            raise _awa.ConfigError("register at least one worker before starting the runtime")
        config = start_config(
            queues,
            [spec.queue for spec in self._tasks.values()],
            {
                "poll_interval_ms": poll_interval_ms,
                "global_max_workers": global_max_workers,
                "completed_retention_hours": completed_retention_hours,
                "failed_retention_hours": failed_retention_hours,
                "descriptor_retention_days": descriptor_retention_days,
                "cleanup_batch_size": cleanup_batch_size,
                "leader_election_interval_ms": leader_election_interval_ms,
                "heartbeat_interval_ms": heartbeat_interval_ms,
                "promote_interval_ms": promote_interval_ms,
                "heartbeat_rescue_interval_ms": heartbeat_rescue_interval_ms,
                "heartbeat_staleness_ms": heartbeat_staleness_ms,
                "deadline_rescue_interval_ms": deadline_rescue_interval_ms,
                "callback_rescue_interval_ms": callback_rescue_interval_ms,
                "terminal_count_rollup_interval_ms": terminal_count_rollup_interval_ms,
                "prune_interval_ms": prune_interval_ms,
                "finalize_deadline_ms": finalize_deadline_ms,
                "claim_batch": claim_batch,
                "completion_batch": completion_batch,
            },
        )
        config["queue_storage"] = queue_storage_config(
            queue_storage_schema,
            {
                "queue_storage_queue_slot_count": queue_storage_queue_slot_count,
                "queue_storage_lease_slot_count": queue_storage_lease_slot_count,
                "queue_storage_claim_slot_count": queue_storage_claim_slot_count,
                "queue_storage_queue_stripe_count": queue_storage_queue_stripe_count,
            },
            {
                "queue_storage_queue_rotate_interval_ms": queue_storage_queue_rotate_interval_ms,
                "queue_storage_lease_rotate_interval_ms": queue_storage_lease_rotate_interval_ms,
                "queue_storage_claim_rotate_interval_ms": queue_storage_claim_rotate_interval_ms,
            },
            storage_transition_role,
        )
        config["queue_descriptors"] = self._descriptors["queue"]
        config["job_kind_descriptors"] = self._descriptors["kind"]
        if batch_follow_ups is not None:
            if not isinstance(batch_follow_ups, bool):
                raise _awa.ConfigError(
                    f"batch_follow_ups is {batch_follow_ups!r}; it must be True or False")
            config["batch_follow_ups"] = batch_follow_ups
        self._started_queues = {
            str(q.get("name")): None if q.get("max_workers") is None else int(q["max_workers"])
            for q in config["queues"]
        }
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
        pump = self._pump
        if pump is not None:
            self._shutting_down = True
            try:
                await pump.shutdown(timeout)
            finally:
                self._pump, self._shutting_down = None, False

    async def health_check(self) -> HealthCheck:
        """The client's health, as awa-pg reports it (:class:`awa.HealthCheck`): a client whose
        worker runs is ``healthy`` with one :class:`awa.QueueHealth` per configured queue; one
        that never started (or has shut down) is not, though ``postgres_connected`` may be."""
        pump = self._pump
        if pump is None:
            try:
                version = await self._schema_version()
                connected = True
            except _awa.DatabaseError:
                version, connected = 0, False
            return HealthCheck(
                healthy=False, postgres_connected=connected, poll_loop_alive=False,
                heartbeat_alive=False, shutting_down=self._shutting_down, leader=False,
                queues={}, schema_version=version,
            )
        native = json.loads(await pump._native.health_check())
        available = {s.queue: s.available for s in await self.queue_stats()}
        in_flight = pump.in_flight_by_queue()
        queues = {
            name: QueueHealth(in_flight=in_flight.get(name, 0), available=available.get(name, 0), max_workers=workers)
            for name, workers in self._started_queues.items()
        }
        running = bool(native.get("running"))
        connected = bool(native.get("database"))
        return HealthCheck(
            healthy=running and connected and not self._shutting_down,
            postgres_connected=connected, poll_loop_alive=running, heartbeat_alive=running,
            shutting_down=self._shutting_down, leader=bool(native.get("leader")), queues=queues,
            schema_version=int(native.get("schema_version") or 0),
            instance_id=None if native.get("instance_id") is None else str(native["instance_id"]),
        )

    async def _schema_version(self) -> int:
        tx = await self._native.transaction()
        try:
            row = await tx.fetch_optional(
                "SELECT coalesce((SELECT max(version) FROM awa.schema_version), 0)::int AS v "
                "WHERE to_regclass('awa.schema_version') IS NOT NULL", [])
        finally:
            await tx.rollback()
        return 0 if row is None else int(row["v"])

    # ----- admin ----------------------------------------------------------------------------

    async def cancel(self, job_id: int) -> Job:
        """Cancel a job; a running job is signalled (``job.is_cancelled()``)."""
        return job_from_json(await self._native.cancel(job_id))

    async def cancel_by_unique_key(
        self, kind: Any, *, queue: Optional[str] = None, args: Any = None,
        period_bucket: Optional[int] = None, unique_opts: Optional[Mapping[str, Any]] = None,
        run_at: Optional[_dt.datetime] = None,
    ) -> Optional[Job]:
        """Cancel the unfinished job holding the unique key built from exactly the parts given
        (awa-pg's form): ``kind``, plus ``queue`` if the key has ``by_queue``, ``args`` if it
        has ``by_args`` and ``period_bucket`` (whole periods since the epoch of its ``run_at``)
        if it has ``by_period``. ``None`` when no unfinished job holds the key.

        The earlier form ``cancel_by_unique_key(args_object, queue=..., unique_opts=...,
        run_at=...)`` still works: a first argument that is not a ``str`` is an args object
        (kinds are strings, args never are), and the key is the one an insert with these options
        computes. See docs/unique-keys.md."""
        if not isinstance(kind, str):
            if args is not None or period_bucket is not None:
                raise _awa.ValidationError(
                    "cancel_by_unique_key: args and period_bucket go with a kind string as the first "
                    "argument, not with an args object")
            request = _request(kind, queue=queue or "default", unique_opts=unique_opts or {}, run_at=run_at)
            text = await self._native.cancel_by_unique_key(request)
        else:
            if unique_opts is not None or run_at is not None:
                raise _awa.ValidationError(
                    "cancel_by_unique_key(kind, ...) takes the key's parts (queue, args, "
                    "period_bucket), not unique_opts or run_at")
            if period_bucket is not None and (
                    isinstance(period_bucket, bool) or not isinstance(period_bucket, int)
                    or not -(2**63) <= period_bucket < 2**63):
                raise _awa.ValidationError(f"period_bucket must be a 64-bit int, got {period_bucket!r}")
            args_json = None if args is None else args_to_json_text(args)
            text = await self._native.cancel_by_unique_parts(kind, queue, args_json, period_bucket)
        return None if text == "null" else job_from_json(text)

    async def list_runtime_instances(self) -> list[dict[str, Any]]:
        """Every client running against this database, from the runtime registry
        (``awa.runtime_instances``, docs/runtime-registry.md): one dict per client with
        ``instance_id``, ``hostname``, ``pid``, ``version``, ``queues`` (name, max_workers,
        deadline_ms, dlq), ``leader``, ``started_at`` and ``last_seen_at`` (RFC 3339),
        ``snapshot_interval_ms`` and ``stale``. The leader first, then by start time."""
        return cast("list[dict[str, Any]]", json.loads(await self._native.list_runtime_instances()))

    async def retry(self, job_id: int) -> Job:
        return job_from_json(await self._native.retry(job_id))

    async def pause_queue(self, queue: str, paused_by: Optional[str] = None) -> None:
        """Stop every client claiming from ``queue`` (running jobs finish). ``paused_by`` (free
        text: an operator, a deploy) is recorded with the time, for the operator tools."""
        await self._native.pause_queue(queue, paused_by)

    async def resume_queue(self, queue: str) -> None:
        await self._native.set_queue_paused(queue, False)

    async def drain_queue(self, queue: str) -> int:
        """Cancel every job of ``queue`` that has not started; returns how many."""
        return cast("int", json.loads(await self._native.drain_queue(queue)))

    async def queue_stats(self) -> list[QueueStat]:
        """One :class:`awa.QueueStat` per queue that holds jobs or has settings (paused)."""
        return [QueueStat.from_native(d) for d in json.loads(await self._native.queue_stats())]

    async def flush_admin_metadata(self) -> None:
        """awa-pg recomputes cached admin counters here. Awa's ``queue_stats()`` counts live,
        so there is nothing to flush: kept so code written for awa-pg runs unchanged."""

    async def retry_failed(
        self, *, kind: Optional[str] = None, queue: Optional[str] = None, allow_all: bool = False
    ) -> RetryFailedResult:
        """Make the failed jobs of a kind and/or queue available again. Without a filter
        ``awa.ValidationError`` (also a ``ValueError``, as awa-pg raises) unless
        ``allow_all=True``: a bare call must not rerun every failed job by accident."""
        text = await self._native.retry_failed(kind, queue, allow_all)
        return retry_failed_result_from_dict(json.loads(text))

    async def discard_failed(self, kind: str, *, queue: Optional[str] = None) -> int:
        """Delete the failed jobs of ``kind`` (optionally only in ``queue``); returns how many.
        ``kind`` is required: no call deletes every failed job at once."""
        if not isinstance(kind, str):
            raise _awa.ValidationError(f"kind must be a str, not {type(kind).__name__}")
        return cast("int", json.loads(await self._native.discard_failed(kind, queue)))

    async def dump_job(self, job_id: int) -> str:
        """The job, a summary (can it be retried or cancelled, its errors) and its timeline, as
        indented JSON (awa-pg's shape: keys ``job``, ``summary``, ``timeline``).
        ``awa.JobNotFound`` for an unknown id."""
        return dump_job_text(json.loads(await self._native.get_job(job_id)))

    async def dump_run(self, job_id: int, attempt: Optional[int] = None) -> str:
        """One attempt of the job (default: the current one) as indented JSON. An attempt that
        is neither current nor in the job's error history raises ``awa.ValidationError``."""
        return dump_run_text(json.loads(await self._native.get_job(job_id)), attempt)

    # ----- dead-letter queue -------------------------------------------------------------------
    #
    # Failed jobs of a queue started with {"dlq": True} move to awa.jobs_dlq; any failed job can
    # be moved by hand. Bulk calls that change or delete rows refuse an empty filter unless
    # allow_all=True.

    async def list_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        tag: Optional[str] = None,
        before_id: Optional[int] = None,
        before_dlq_at: Optional[_dt.datetime] = None,
        limit: int = 100,
    ) -> list[DlqEntry]:
        """Dead-lettered jobs, newest first. Page with the last entry's
        ``(before_dlq_at=entry.dlq_at, before_id=entry.job.id)``."""
        text = await self._native.list_dlq(kind, queue, tag, before_id, run_at_text(before_dlq_at), limit)
        return [dlq_entry_from_dict(d) for d in json.loads(text)]

    async def get_dlq_job(self, job_id: int) -> Optional[DlqEntry]:
        """The DLQ entry of a job, or None when it is not in the DLQ."""
        d = json.loads(await self._native.get_dlq_job(job_id))
        return None if d is None else dlq_entry_from_dict(d)

    async def dlq_depth(self, queue: Optional[str] = None) -> int:
        """How many jobs are dead-lettered (in ``queue``, or in all queues)."""
        return cast("int", json.loads(await self._native.dlq_depth(queue)))

    async def dlq_depth_by_queue(self) -> list[tuple[str, int]]:
        """``(queue, depth)`` of every queue with dead-lettered jobs, deepest first."""
        return [(q, int(n)) for q, n in json.loads(await self._native.dlq_depth_by_queue())]

    async def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: Optional[_dt.datetime] = None,
        priority: Optional[int] = None,
        queue: Optional[str] = None,
    ) -> Optional[Job]:
        """Move a dead-lettered job back as a fresh job (attempts reset, same id): available,
        or scheduled for a future ``run_at``; ``priority`` and ``queue`` override the stored
        ones (checked as for an insert). None when the job is not in the DLQ."""
        text = await self._native.retry_from_dlq(job_id, run_at_text(run_at), priority, queue)
        return None if text == "null" else job_from_json(text)

    async def bulk_retry_from_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        tag: Optional[str] = None,
        allow_all: bool = False,
    ) -> int:
        """Revive every dead-lettered job of a kind, queue and/or tag; returns how many.
        Without a filter ``awa.ValidationError`` unless ``allow_all=True``."""
        return cast("int", json.loads(await self._native.bulk_retry_from_dlq(kind, queue, tag, allow_all)))

    async def move_failed_to_dlq(self, job_id: int, reason: str) -> Optional[DlqEntry]:
        """Move one failed job into the DLQ; None when no failed job has this id."""
        d = json.loads(await self._native.move_failed_to_dlq(job_id, reason))
        return None if d is None else dlq_entry_from_dict(d)

    async def bulk_move_failed_to_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        """Move every failed job of a kind and/or queue into the DLQ; returns how many.
        Without a filter ``awa.ValidationError`` unless ``allow_all=True``."""
        text = await self._native.bulk_move_failed_to_dlq(kind, queue, reason, allow_all)
        return cast("int", json.loads(text))

    async def purge_dlq_job(self, job_id: int) -> bool:
        """Delete one dead-lettered job; True when it was there."""
        return cast("bool", json.loads(await self._native.purge_dlq_job(job_id)))

    async def purge_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        tag: Optional[str] = None,
        before_id: Optional[int] = None,
        before_dlq_at: Optional[_dt.datetime] = None,
        allow_all: bool = False,
    ) -> int:
        """Delete the dead-lettered jobs matching the filter (older than the cursor, if
        given); returns how many. Without kind, queue or tag ``awa.ValidationError`` unless
        ``allow_all=True``: a bare ``purge_dlq()`` must not empty the DLQ."""
        text = await self._native.purge_dlq(kind, queue, tag, before_id, run_at_text(before_dlq_at), allow_all)
        return cast("int", json.loads(text))

    # ----- durable batch operations (docs/batch-operations.md) ------------------------------
    #
    # An operation is a row in awa.batch_operations that the maintenance leader applies in
    # chunks of 500 jobs, to queued (available / scheduled) jobs only. Submitting needs no
    # runtime in this process: any client's runtime that leads maintenance runs it.

    async def preview_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict[str, Any],
        filter: Optional[BatchOperationFilter] = None,
    ) -> BatchOperationPreview:
        """How many queued jobs the operation would touch now, and the first ten of them (job
        dicts, by id). Checks ``op_kind``, ``spec`` and ``filter`` as a submit does; changes
        nothing."""
        text = await self._native.preview_batch_operation(op_kind, spec_json(spec), filter_json(filter))
        return cast("BatchOperationPreview", json.loads(text))

    async def submit_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict[str, Any],
        filter: Optional[BatchOperationFilter] = None,
        submitted_by: Optional[str] = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Record an operation for the maintenance leader; returns it (``pending``). A filter
        that narrows nothing raises ``awa.ValidationError`` unless ``allow_all=True``."""
        text = await self._native.submit_batch_operation(
            op_kind, spec_json(spec), filter_json(filter), submitted_by, allow_all
        )
        return cast("BatchOperation", json.loads(text))

    async def preview_set_priority(
        self, priority: int, *, filter: Optional[BatchOperationFilter] = None
    ) -> BatchOperationPreview:
        """Preview giving the matching queued (available / scheduled) jobs ``priority``."""
        return await self.preview_batch_operation("set_priority", spec={"priority": priority}, filter=filter)

    async def set_priority(
        self,
        priority: int,
        *,
        filter: Optional[BatchOperationFilter] = None,
        submitted_by: Optional[str] = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation giving the matching queued jobs ``priority`` (1 to 4)."""
        return await self.submit_batch_operation(
            "set_priority", spec={"priority": priority}, filter=filter,
            submitted_by=submitted_by, allow_all=allow_all,
        )

    async def preview_move_queue(
        self,
        queue: str,
        *,
        priority: Optional[int] = None,
        filter: Optional[BatchOperationFilter] = None,
    ) -> BatchOperationPreview:
        """Preview moving the matching queued (available / scheduled) jobs to ``queue``."""
        return await self.preview_batch_operation("move_queue", spec=_move_spec(queue, priority), filter=filter)

    async def move_queue(
        self,
        queue: str,
        *,
        priority: Optional[int] = None,
        filter: Optional[BatchOperationFilter] = None,
        submitted_by: Optional[str] = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation moving the matching queued jobs to ``queue`` (and, when given,
        to ``priority``)."""
        return await self.submit_batch_operation(
            "move_queue", spec=_move_spec(queue, priority), filter=filter,
            submitted_by=submitted_by, allow_all=allow_all,
        )

    async def list_batch_operations(
        self, *, state: Optional[BatchOperationState] = None, limit: int = 100
    ) -> list[BatchOperation]:
        """Operations, newest first; ``limit`` below 1 counts as 1 (as in awa-pg)."""
        text = await self._native.list_batch_operations(state, limit)
        return cast("list[BatchOperation]", json.loads(text))

    async def get_batch_operation(self, operation_id: str) -> BatchOperation:
        """One operation by its UUID; a malformed or unknown id raises ``awa.ValidationError``."""
        return cast("BatchOperation", json.loads(await self._native.get_batch_operation(operation_id)))

    async def cancel_batch_operation(self, operation_id: str) -> BatchOperation:
        """Stop an operation: a pending one is ``cancelled`` at once (nothing was touched); a
        running one becomes ``cancelling`` and the leader ends it before its next chunk. One
        already cancelling or finished raises ``awa.ValidationError``."""
        return cast("BatchOperation", json.loads(await self._native.cancel_batch_operation(operation_id)))

    async def purge_batch_operations(self, before: _dt.datetime, *, limit: int = 1000) -> int:
        """Delete finished operations whose ``finalized_at`` is before ``before`` (at most
        ``limit``, at least 1); returns how many. The leader also deletes them on its own
        once their ``retention_until`` (90 days after finishing) has passed."""
        if not isinstance(before, _dt.datetime):
            raise TypeError(f"before must be a datetime, not {type(before).__name__}")
        text = await self._native.purge_batch_operations(instant_text(before), limit)
        return cast("int", json.loads(text))

    # ----- external callbacks ----------------------------------------------------------------

    async def _callback(self, action: str, callback_id: Union[CallbackToken, str], payload: Any = None,
                        error: Optional[str] = None, timeout_seconds: float = 3600) -> Job:
        cid = callback_id_of(callback_id)
        payload_json = None if payload is None else json_text(payload, "payload")
        return job_from_json(await self._native.callback(action, cid, payload_json, error, float(timeout_seconds)))

    async def complete_external(self, callback_id: Union[CallbackToken, str], payload: Any = None) -> Job:
        """Complete the job waiting on ``callback_id`` (a malformed id is ``awa.ValidationError``,
        an unknown one ``awa.CallbackNotFound``). A :class:`CallbackToken` works too."""
        return await self._callback("complete", callback_id, payload)

    async def fail_external(self, callback_id: Union[CallbackToken, str], error: str) -> Job:
        return await self._callback("fail", callback_id, error=error)

    async def retry_external(self, callback_id: Union[CallbackToken, str]) -> Job:
        return await self._callback("retry", callback_id)

    async def resume_external(self, callback_id: Union[CallbackToken, str], payload: Any = None) -> Job:
        """Deliver ``payload`` to the handler waiting on ``callback_id`` (ADR-021): a handler in
        ``wait_for_callback`` continues and the returned job is ``running`` with the payload
        under ``metadata["_awa_callback_result"]``; a job parked by returning
        ``WaitForCallback`` becomes available again and its next attempt finds the payload
        there."""
        return await self._callback("resume", callback_id, payload)

    async def heartbeat_callback(self, callback_id: Union[CallbackToken, str], timeout_seconds: float = 3600) -> Job:
        """Extend a waiting job's callback timeout to ``timeout_seconds`` from now (more than
        0, at most 365 days; ``awa.ValidationError`` otherwise)."""
        seconds = checked_setting("timeout_seconds", timeout_seconds)
        return await self._callback("heartbeat", callback_id, timeout_seconds=seconds)

    async def resolve_callback(
        self, callback_id: Union[CallbackToken, str], payload: Any = None, default_action: str = "ignore",
    ) -> ResolveResult:
        """Resolve the callback with the CEL expressions its handler registered (see
        ``Job.register_callback``), evaluated against ``payload``: ``filter`` false ignores it,
        ``on_fail`` true fails the job, ``on_complete`` true completes it (returning the
        ``transform``ed payload); otherwise, or with no expressions, ``default_action``
        (``"complete"``, ``"fail"`` or ``"ignore"``) decides. An ignored callback leaves the
        job waiting. An expression that errors at run time counts as not matching (a
        ``filter`` error lets the payload through)."""
        if default_action not in ("complete", "fail", "ignore"):
            raise _awa.ValidationError(
                f"default_action must be 'complete', 'fail' or 'ignore', got {default_action!r}")
        cid = callback_id_of(callback_id)
        payload_json = None if payload is None else json_text(payload, "payload")
        return ResolveResult.from_native(json.loads(await self._native.resolve_callback(cid, payload_json, default_action)))

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
            # The coroutine was built by the caller already: close it, or Python warns that
            # it was never awaited. DatabaseError, as a call on the closed async client raises.
            close = getattr(coro, "close", None)
            if close is not None:
                close()
            raise _awa.DatabaseError("the client is closed")
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

    def execute(self, query: str, *args: Any) -> int:
        return self._run(self._tx.execute(query, *args))

    def fetch_one(self, query: str, *args: Any) -> dict[str, Any]:
        return self._run(self._tx.fetch_one(query, *args))

    def fetch_optional(self, query: str, *args: Any) -> Optional[dict[str, Any]]:
        return self._run(self._tx.fetch_optional(query, *args))

    def fetch_all(self, query: str, *args: Any) -> list[dict[str, Any]]:
        return self._run(self._tx.fetch_all(query, *args))

    def insert(
        self,
        args: Any,
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> Job:
        return self._run(self._tx.insert(
            args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
        ))

    def insert_many(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> list[Job]:
        return self._run(self._tx.insert_many(
            jobs, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
        ))

    def insert_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
    ) -> list[Job]:
        return self._run(self._tx.insert_many_copy(
            jobs, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
            opts=opts,
        ))

    def enqueue_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
    ) -> int:
        return self._run(self._tx.enqueue_many_copy(
            jobs, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
            opts=opts,
        ))

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

    def install_queue_storage(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
        reset: bool = False,
    ) -> None:
        self._run(
            self._async.install_queue_storage(
                schema=schema,
                queue_slot_count=queue_slot_count,
                lease_slot_count=lease_slot_count,
                reset=reset,
            )
        )

    def prepare_queue_storage_schema(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
    ) -> None:
        self._run(
            self._async.prepare_queue_storage_schema(
                schema=schema, queue_slot_count=queue_slot_count, lease_slot_count=lease_slot_count
            )
        )

    def storage_status(self) -> str:
        return self._run(self._async.storage_status())

    def storage_prepare(self, *, schema: str = "awa") -> dict[str, Any]:
        return self._run(self._async.storage_prepare(schema=schema))

    def storage_enter_mixed_transition(self) -> dict[str, Any]:
        return self._run(self._async.storage_enter_mixed_transition())

    def storage_finalize(self) -> dict[str, Any]:
        return self._run(self._async.storage_finalize())

    def storage_abort(self) -> dict[str, Any]:
        return self._run(self._async.storage_abort())

    def insert(
        self,
        args: Any,
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> Job:
        return self._run(self._async.insert(
            args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
        ))

    def insert_many(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
    ) -> list[Job]:
        return self._run(self._async.insert_many(
            jobs, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
        ))

    def insert_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
    ) -> list[Job]:
        return self._run(self._async.insert_many_copy(
            jobs, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
            opts=opts,
        ))

    def enqueue_many_copy(
        self,
        jobs: Sequence[Any],
        *,
        kind: Optional[str] = None,
        queue: str = "default",
        priority: int = 2,
        max_attempts: int = 25,
        tags: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        run_at: Optional[RunAt] = None,
        unique_opts: Optional[Mapping[str, Any]] = None,
        ordering_key: Optional[OrderingKey] = None,
        opts: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
        queue_storage_queue_stripe_count: int = 1,
    ) -> int:
        return self._run(self._async.enqueue_many_copy(
            jobs, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
            metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
            opts=opts, queue_storage_queue_stripe_count=queue_storage_queue_stripe_count,
        ))

    def transaction(self) -> SyncTransaction:
        return SyncTransaction(self._runner, self._run(self._async.transaction()._open()))

    def get_job(self, job_id: int) -> Job:
        return self._run(self._async.get_job(job_id))

    def list_jobs(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        limit: int = 100,
    ) -> list[Job]:
        return self._run(self._async.list_jobs(state=state, kind=kind, queue=queue, limit=limit))

    def task(self, args_type: Any, *, kind: Optional[str] = None, queue: str = "default") -> Any:
        return self._async.task(args_type, kind=kind, queue=queue)

    def worker(self, args_type: Any, *, kind: Optional[str] = None, queue: str = "default") -> Any:
        """Deprecated alias of :meth:`task`; warns once per call."""
        warnings.warn("client.worker() is deprecated, use client.task() instead", DeprecationWarning, stacklevel=2)
        return self._async.task(args_type, kind=kind, queue=queue)

    def metrics(self) -> dict[str, int]:
        return self._async.metrics()

    # ----- admin (see AsyncClient for each call's contract) ----------------------------------

    def cancel(self, job_id: int) -> Job:
        return self._run(self._async.cancel(job_id))

    def retry(self, job_id: int) -> Job:
        return self._run(self._async.retry(job_id))

    def pause_queue(self, queue: str, paused_by: Optional[str] = None) -> None:
        self._run(self._async.pause_queue(queue, paused_by))

    def resume_queue(self, queue: str) -> None:
        self._run(self._async.resume_queue(queue))

    def drain_queue(self, queue: str) -> int:
        return self._run(self._async.drain_queue(queue))

    def queue_stats(self) -> list[QueueStat]:
        return self._run(self._async.queue_stats())

    def flush_admin_metadata(self) -> None:
        self._run(self._async.flush_admin_metadata())

    def retry_failed(
        self, *, kind: Optional[str] = None, queue: Optional[str] = None, allow_all: bool = False
    ) -> RetryFailedResult:
        return self._run(self._async.retry_failed(kind=kind, queue=queue, allow_all=allow_all))

    def discard_failed(self, kind: str, *, queue: Optional[str] = None) -> int:
        return self._run(self._async.discard_failed(kind, queue=queue))

    def dump_job(self, job_id: int) -> str:
        return self._run(self._async.dump_job(job_id))

    def dump_run(self, job_id: int, attempt: Optional[int] = None) -> str:
        return self._run(self._async.dump_run(job_id, attempt))

    # ----- dead-letter queue ------------------------------------------------------------------

    def list_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        tag: Optional[str] = None,
        before_id: Optional[int] = None,
        before_dlq_at: Optional[_dt.datetime] = None,
        limit: int = 100,
    ) -> list[DlqEntry]:
        return self._run(self._async.list_dlq(
            kind=kind, queue=queue, tag=tag, before_id=before_id, before_dlq_at=before_dlq_at, limit=limit,
        ))

    def get_dlq_job(self, job_id: int) -> Optional[DlqEntry]:
        return self._run(self._async.get_dlq_job(job_id))

    def dlq_depth(self, queue: Optional[str] = None) -> int:
        return self._run(self._async.dlq_depth(queue))

    def dlq_depth_by_queue(self) -> list[tuple[str, int]]:
        return self._run(self._async.dlq_depth_by_queue())

    def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: Optional[_dt.datetime] = None,
        priority: Optional[int] = None,
        queue: Optional[str] = None,
    ) -> Optional[Job]:
        return self._run(self._async.retry_from_dlq(job_id, run_at=run_at, priority=priority, queue=queue))

    def bulk_retry_from_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        tag: Optional[str] = None,
        allow_all: bool = False,
    ) -> int:
        return self._run(self._async.bulk_retry_from_dlq(kind=kind, queue=queue, tag=tag, allow_all=allow_all))

    def move_failed_to_dlq(self, job_id: int, reason: str) -> Optional[DlqEntry]:
        return self._run(self._async.move_failed_to_dlq(job_id, reason))

    def bulk_move_failed_to_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        return self._run(self._async.bulk_move_failed_to_dlq(
            kind=kind, queue=queue, reason=reason, allow_all=allow_all,
        ))

    def purge_dlq_job(self, job_id: int) -> bool:
        return self._run(self._async.purge_dlq_job(job_id))

    def purge_dlq(
        self,
        *,
        kind: Optional[str] = None,
        queue: Optional[str] = None,
        tag: Optional[str] = None,
        before_id: Optional[int] = None,
        before_dlq_at: Optional[_dt.datetime] = None,
        allow_all: bool = False,
    ) -> int:
        return self._run(self._async.purge_dlq(
            kind=kind, queue=queue, tag=tag, before_id=before_id, before_dlq_at=before_dlq_at,
            allow_all=allow_all,
        ))

    # ----- durable batch operations -----------------------------------------------------------

    def preview_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict[str, Any],
        filter: Optional[BatchOperationFilter] = None,
    ) -> BatchOperationPreview:
        return self._run(self._async.preview_batch_operation(op_kind, spec=spec, filter=filter))

    def submit_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict[str, Any],
        filter: Optional[BatchOperationFilter] = None,
        submitted_by: Optional[str] = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        return self._run(self._async.submit_batch_operation(
            op_kind, spec=spec, filter=filter, submitted_by=submitted_by, allow_all=allow_all,
        ))

    def preview_set_priority(
        self, priority: int, *, filter: Optional[BatchOperationFilter] = None
    ) -> BatchOperationPreview:
        return self._run(self._async.preview_set_priority(priority, filter=filter))

    def set_priority(
        self,
        priority: int,
        *,
        filter: Optional[BatchOperationFilter] = None,
        submitted_by: Optional[str] = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        return self._run(self._async.set_priority(
            priority, filter=filter, submitted_by=submitted_by, allow_all=allow_all,
        ))

    def preview_move_queue(
        self,
        queue: str,
        *,
        priority: Optional[int] = None,
        filter: Optional[BatchOperationFilter] = None,
    ) -> BatchOperationPreview:
        return self._run(self._async.preview_move_queue(queue, priority=priority, filter=filter))

    def move_queue(
        self,
        queue: str,
        *,
        priority: Optional[int] = None,
        filter: Optional[BatchOperationFilter] = None,
        submitted_by: Optional[str] = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        return self._run(self._async.move_queue(
            queue, priority=priority, filter=filter, submitted_by=submitted_by, allow_all=allow_all,
        ))

    def list_batch_operations(
        self, *, state: Optional[BatchOperationState] = None, limit: int = 100
    ) -> list[BatchOperation]:
        return self._run(self._async.list_batch_operations(state=state, limit=limit))

    def get_batch_operation(self, operation_id: str) -> BatchOperation:
        return self._run(self._async.get_batch_operation(operation_id))

    def cancel_batch_operation(self, operation_id: str) -> BatchOperation:
        return self._run(self._async.cancel_batch_operation(operation_id))

    def purge_batch_operations(self, before: _dt.datetime, *, limit: int = 1000) -> int:
        return self._run(self._async.purge_batch_operations(before, limit=limit))

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


# Forwarded through __getattr__ (the rest of the blocking surface is real methods above).
_BLOCKING_MIRRORED = frozenset({
    "start", "shutdown", "health_check", "cancel_by_unique_key", "list_runtime_instances", "complete_external",
    "fail_external", "retry_external", "resume_external", "heartbeat_callback", "resolve_callback",
})
