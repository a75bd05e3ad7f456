"""Insert Awa jobs inside the application's own transaction, on the application's own driver.

``insert_job(conn, args, ...)`` (asyncio) and ``insert_job_sync(conn, args, ...)`` (blocking)
write one job through a connection the application already holds, so the job commits or rolls
back with the application's rows, with no second Awa connection::

    async with conn.transaction():                      # asyncpg
        await conn.execute("INSERT INTO orders ...")
        job = await insert_job(conn, SendEmail(to="a@b.com"))

    with transaction.atomic():                          # Django
        insert_job_sync(connection, SendEmail(to="a@b.com"))

Supported connections: asyncpg (``Connection``, a pool's connection), psycopg 3
(``AsyncConnection`` / ``Connection``), SQLAlchemy (``AsyncConnection`` / ``AsyncSession`` and
``Connection`` / ``Session``) and Django (``django.db.connection`` or ``connections[alias]``).

The job is validated, and its unique key computed, by the native module exactly as
``AsyncClient.insert`` does it (same options, same limits, same ``awa.ValidationError`` /
``awa.SerializationError`` before anything is sent); only the final statement runs on the
caller's driver. A unique conflict raises ``awa.UniqueConflict`` and a missing Awa schema
``awa.SchemaNotMigrated`` (each chained to the driver's error); any other database error is
the driver's own (``psycopg.errors.*``, ``asyncpg.exceptions.*``, SQLAlchemy's or Django's
wrappers). As with any failed statement, the driver's transaction is then aborted: roll it back
(or use a savepoint around the call if the transaction must go on).

The result is a dict with the row's ``id, kind, queue, args, state, priority, attempt,
max_attempts, run_at, created_at, metadata, tags`` (timestamps as aware ``datetime``), the keys
awa-pg's bridge returns.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Optional, Sequence

from . import _awa
from ._convert import OrderingKey, RunAt, build_request
from ._job import parse_timestamp

__all__ = ["insert_job", "insert_job_sync"]

_SUPPORTED = "asyncpg, psycopg 3, SQLAlchemy (Connection, Session and their async forms) and Django"
_PLACEHOLDER = re.compile(r"\$(\d+)")


def _statement(
    args: Any,
    *,
    kind: Optional[str],
    queue: str,
    priority: int,
    max_attempts: int,
    tags: Optional[Sequence[str]],
    metadata: Optional[Mapping[str, Any]],
    run_at: Optional[RunAt],
    ordering_key: Optional[OrderingKey],
    unique_opts: Optional[Mapping[str, Any]],
) -> tuple[str, list[Optional[str]], str]:
    """The validated statement (``$n`` placeholders), its text parameters and the job's kind."""
    request = build_request(
        args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
        metadata=metadata, run_at=run_at, unique_opts=unique_opts, ordering_key=ordering_key,
    )
    sql, params = _awa.driver_insert(request)
    return sql, params, json.loads(request)["kind"]


def _driver(conn: Any) -> str:
    """Which driver a connection belongs to, from its class's module (no driver is imported)."""
    cls = type(conn)
    module = cls.__module__ or ""
    name = cls.__name__
    if module.startswith("asyncpg"):
        return "asyncpg"
    if module.startswith("psycopg"):
        return "psycopg_async" if name.startswith("Async") else "psycopg_sync"
    if module.startswith("sqlalchemy"):
        return "sqlalchemy_async" if name.startswith("Async") else "sqlalchemy_sync"
    if module.startswith("django") or getattr(conn, "vendor", None) == "postgresql":
        return "django"
    raise TypeError(f"unsupported connection type {module}.{name}: awa.bridge supports {_SUPPORTED}")


def _named(sql: str, style: str) -> str:
    """``$n`` → the driver's named placeholder (each parameter appears once in the statement)."""
    if style == "pyformat":
        return _PLACEHOLDER.sub(lambda m: f"%(p{m.group(1)})s", sql)
    return _PLACEHOLDER.sub(lambda m: f":p{m.group(1)}", sql)


def _by_name(params: list[Optional[str]]) -> dict[str, Optional[str]]:
    return {f"p{i}": value for i, value in enumerate(params, start=1)}


def _server_error(exc: BaseException) -> tuple[Optional[str], Optional[str], str]:
    """SQLSTATE, constraint and message of a driver's server error (SQLAlchemy and Django wrap
    the DBAPI error: look through ``orig`` / ``__cause__``)."""
    err: Optional[BaseException] = exc
    for _ in range(4):
        if err is None:
            break
        # psycopg: .sqlstate and .diag; asyncpg: .sqlstate, .constraint_name.
        code = getattr(err, "sqlstate", None)
        if isinstance(code, str):
            diag = getattr(err, "diag", None)
            constraint = getattr(diag, "constraint_name", None) or getattr(err, "constraint_name", None)
            primary = getattr(diag, "message_primary", None) or str(err)
            return code, constraint, str(primary)
        err = getattr(err, "orig", None) or err.__cause__
    return None, None, str(exc)


def _translate(exc: BaseException, kind: str) -> Optional[BaseException]:
    code, constraint, message = _server_error(exc)
    if code is None:
        return None
    found: Optional[BaseException] = _awa.driver_error(kind, code, constraint, message)
    return found


def _row(text: Any) -> dict[str, Any]:
    row: dict[str, Any] = json.loads(text) if isinstance(text, str) else dict(text)
    for key in ("run_at", "created_at"):
        row[key] = parse_timestamp(row[key])
    return row


def _sqlalchemy_text(sql: str) -> Any:
    from sqlalchemy import text  # the caller uses SQLAlchemy: it is importable

    return text(_named(sql, "named"))


async def insert_job(
    conn: Any,
    args: Any,
    *,
    kind: Optional[str] = None,
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: Optional[Sequence[str]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    run_at: Optional[RunAt] = None,
    ordering_key: Optional[OrderingKey] = None,
    unique_opts: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """Insert one job through an asyncio connection (asyncpg, psycopg ``AsyncConnection``,
    SQLAlchemy ``AsyncConnection`` / ``AsyncSession``) inside the caller's transaction. The
    options, validation and errors are :meth:`awa.AsyncClient.insert`'s."""
    sql, params, job_kind = _statement(
        args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
        metadata=metadata, run_at=run_at, ordering_key=ordering_key, unique_opts=unique_opts,
    )
    driver = _driver(conn)
    try:
        if driver == "asyncpg":
            return _row(await conn.fetchval(sql, *params))
        if driver == "psycopg_async":
            cursor = await conn.execute(_named(sql, "pyformat"), _by_name(params))
            return _row((await cursor.fetchone())[0])
        if driver == "sqlalchemy_async":
            result = await conn.execute(_sqlalchemy_text(sql), _by_name(params))
            return _row(result.scalar_one())
    except Exception as exc:
        found = _translate(exc, job_kind)
        if found is not None:
            raise found from exc
        raise
    raise TypeError(
        f"insert_job() needs an asyncio connection; for {type(conn).__name__} use insert_job_sync()"
    )


def insert_job_sync(
    conn: Any,
    args: Any,
    *,
    kind: Optional[str] = None,
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: Optional[Sequence[str]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    run_at: Optional[RunAt] = None,
    ordering_key: Optional[OrderingKey] = None,
    unique_opts: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """Insert one job through a blocking connection (psycopg ``Connection``, SQLAlchemy
    ``Connection`` / ``Session``, Django's ``connection``) inside the caller's transaction.
    The options, validation and errors are :meth:`awa.Client.insert`'s."""
    sql, params, job_kind = _statement(
        args, kind=kind, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
        metadata=metadata, run_at=run_at, ordering_key=ordering_key, unique_opts=unique_opts,
    )
    driver = _driver(conn)
    try:
        if driver == "psycopg_sync":
            return _row(conn.execute(_named(sql, "pyformat"), _by_name(params)).fetchone()[0])
        if driver == "sqlalchemy_sync":
            return _row(conn.execute(_sqlalchemy_text(sql), _by_name(params)).scalar_one())
        if driver == "django":
            with conn.cursor() as cursor:
                cursor.execute(_named(sql, "pyformat"), _by_name(params))
                return _row(cursor.fetchone()[0])
    except Exception as exc:
        found = _translate(exc, job_kind)
        if found is not None:
            raise found from exc
        raise
    raise TypeError(
        f"insert_job_sync() needs a blocking connection; for {type(conn).__name__} use insert_job()"
    )
