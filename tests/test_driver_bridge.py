"""``awa.bridge`` against each real driver (issue 13 item 5): a job inserted through the
application's own asyncpg, psycopg (sync and async), SQLAlchemy (sync and async, Connection
and Session) or Django connection commits and rolls back with the application's transaction,
is validated and deduplicated exactly as ``insert`` does it, and raises Awa's errors."""

from __future__ import annotations

import dataclasses
import datetime as dt
import urllib.parse
from typing import Any, Iterator

import asyncpg
import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import awa
from awa.bridge import insert_job, insert_job_sync

KEYS = ["args", "attempt", "created_at", "id", "kind", "max_attempts", "metadata", "priority",
        "queue", "run_at", "state", "tags"]


@dataclasses.dataclass
class SendEmail:
    to: str


def _sqlalchemy_url(url: str, driver: str) -> str:
    return "postgresql+" + driver + "://" + url.split("://", 1)[1]


@pytest.fixture
def apps_table(database_url: str) -> str:
    """An application table the bridge's job must commit or roll back with."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, note text)")
        conn.execute("TRUNCATE orders")
    return database_url


def _committed(url: str) -> tuple[int, list[str]]:
    with psycopg.connect(url) as conn:
        orders = conn.execute("SELECT count(*) FROM orders").fetchone()
    assert orders is not None
    # Through the client, which reads whichever engine holds the jobs (tests/conftest.py).
    with awa.Client(url) as client:
        jobs = sorted(client.list_jobs(limit=1000), key=lambda j: j.id)
    return orders[0], [j.kind for j in jobs]


def _check_row(row: dict[str, Any], **expect: Any) -> None:
    assert sorted(row) == KEYS
    assert isinstance(row["id"], int) and isinstance(row["created_at"], dt.datetime)
    assert row["run_at"].tzinfo is not None
    for key, value in expect.items():
        assert row[key] == value, key


# ----- one test per driver: commit, rollback, the row, a unique conflict --------------------


async def test_asyncpg(apps_table: str) -> None:
    conn = await asyncpg.connect(apps_table)
    try:
        async with conn.transaction():
            await conn.execute("INSERT INTO orders (note) VALUES ('a')")
            row = await insert_job(conn, SendEmail(to="a@b"), queue="mail", tags=["t"], metadata={"m": 1})
        _check_row(row, kind="send_email", queue="mail", state="available", tags=["t"],
                   metadata={"m": 1}, args={"to": "a@b"}, priority=2, attempt=0, max_attempts=25)
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders (note) VALUES ('b')")
                await insert_job(conn, SendEmail(to="rolled back"))
                raise RuntimeError("the application fails")
        async with conn.transaction():
            await insert_job(conn, SendEmail(to="u"), unique_opts={"by_args": True})
        with pytest.raises(awa.UniqueConflict, match="send_email") as info:
            async with conn.transaction():
                await insert_job(conn, SendEmail(to="u"), unique_opts={"by_args": True})
        assert isinstance(info.value.__cause__, asyncpg.UniqueViolationError)
    finally:
        await conn.close()
    assert _committed(apps_table) == (1, ["send_email", "send_email"])
    async with awa.AsyncClient(apps_table) as client:
        assert (await client.get_job(row["id"])).queue == "mail", "visible to the client"


async def test_psycopg_async(apps_table: str) -> None:
    async with await psycopg.AsyncConnection.connect(apps_table) as conn:
        async with conn.transaction():
            await conn.execute("INSERT INTO orders (note) VALUES ('a')")
            row = await insert_job(conn, {"to": "x"}, kind="mail", run_at="2099-01-01T00:00:00Z")
        _check_row(row, kind="mail", state="scheduled")
        assert row["run_at"] == dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)
        async with conn.transaction():
            await insert_job(conn, {"to": "x"}, kind="mail", unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            async with conn.transaction():
                await insert_job(conn, {"to": "x"}, kind="mail", unique_opts={})
    assert _committed(apps_table) == (1, ["mail", "mail"])


def test_psycopg_sync(apps_table: str) -> None:
    with psycopg.connect(apps_table) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO orders (note) VALUES ('a')")
            row = insert_job_sync(conn, SendEmail(to="s"), priority=1, ordering_key=b"cust-1")
        _check_row(row, priority=1, state="available")
        with pytest.raises(RuntimeError):
            with conn.transaction():
                insert_job_sync(conn, SendEmail(to="rolled back"))
                raise RuntimeError("the application fails")
    assert _committed(apps_table) == (1, ["send_email"])


def test_sqlalchemy_sync_connection_and_session(apps_table: str) -> None:
    engine = sqlalchemy.create_engine(_sqlalchemy_url(apps_table, "psycopg"))
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("INSERT INTO orders (note) VALUES ('a')"))
            _check_row(insert_job_sync(conn, SendEmail(to="c")), kind="send_email")
        with Session(engine) as session, session.begin():
            session.execute(sqlalchemy.text("INSERT INTO orders (note) VALUES ('b')"))
            _check_row(insert_job_sync(session, {"n": 1}, kind="by_session"), kind="by_session")
        with pytest.raises(awa.UniqueConflict):
            with Session(engine) as session, session.begin():
                insert_job_sync(session, {"n": 2}, kind="uniq", unique_opts={})
                insert_job_sync(session, {"n": 2}, kind="uniq", unique_opts={})
    finally:
        engine.dispose()
    assert _committed(apps_table) == (2, ["send_email", "by_session"])


async def test_sqlalchemy_async_connection_and_session(apps_table: str) -> None:
    for driver in ("asyncpg", "psycopg"):
        engine = create_async_engine(_sqlalchemy_url(apps_table, driver))
        try:
            async with engine.begin() as conn:
                _check_row(await insert_job(conn, {"d": driver}, kind="async_conn"), kind="async_conn")
            async with AsyncSession(engine) as session, session.begin():
                _check_row(await insert_job(session, {"d": driver}, kind="async_session"), kind="async_session")
            with pytest.raises(RuntimeError):
                async with AsyncSession(engine) as session, session.begin():
                    await insert_job(session, {"d": driver}, kind="rolled_back")
                    raise RuntimeError("the application fails")
        finally:
            await engine.dispose()
    assert _committed(apps_table)[1] == ["async_conn", "async_session"] * 2


@pytest.fixture(scope="module")
def django_connection(fresh_database: str) -> Iterator[Any]:
    import django
    from django.conf import settings

    u = urllib.parse.urlparse(fresh_database)
    if not settings.configured:
        settings.configure(DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": u.path.lstrip("/"),
            "USER": u.username or "postgres", "PASSWORD": u.password or "",
            "HOST": u.hostname or "127.0.0.1", "PORT": str(u.port or 5432),
        }}, USE_TZ=True)
        django.setup()
    from django.db import connection

    yield connection
    connection.close()


def test_django(apps_table: str, django_connection: Any) -> None:
    from django.db import transaction

    with transaction.atomic():
        with django_connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (note) VALUES ('a')")
        _check_row(insert_job_sync(django_connection, SendEmail(to="dj"), tags=["web"]), tags=["web"])
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            insert_job_sync(django_connection, SendEmail(to="rolled back"))
            raise RuntimeError("the application fails")
    with pytest.raises(awa.UniqueConflict):
        with transaction.atomic():
            insert_job_sync(django_connection, SendEmail(to="once"), unique_opts={})
            insert_job_sync(django_connection, SendEmail(to="once"), unique_opts={})
    assert _committed(apps_table) == (1, ["send_email"])


# ----- the same validation, key and errors as insert ---------------------------------------


BAD = [
    ({"priority": 9}, "priority is 9"),
    ({"max_attempts": 0}, "max_attempts is 0"),
    ({"queue": ""}, "queue must not be empty"),
    ({"tags": "notalist"}, "tags must be a list of str"),
    ({"run_at": "tomorrow"}, "run_at"),
    ({"unique_opts": {"bogus": True}}, "bogus"),
    ({"kind": None, "args": {"to": "dict without kind"}}, "kind is required"),
]


@pytest.mark.parametrize("opts,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_what_insert_raises_and_sends_nothing(
    apps_table: str, opts: dict[str, Any], message: str
) -> None:
    opts = dict(opts)
    args = opts.pop("args", SendEmail(to="x"))
    with awa.Client(apps_table) as client:
        with pytest.raises(awa.ValidationError, match=message):
            client.insert(args, **opts)
    with psycopg.connect(apps_table) as conn:
        with pytest.raises(awa.ValidationError, match=message):
            insert_job_sync(conn, args, **opts)
        # Nothing reached the server: the transaction is still usable.
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _committed(apps_table) == (0, [])


def test_the_unique_key_is_the_one_insert_computes(apps_table: str) -> None:
    with psycopg.connect(apps_table) as conn:
        insert_job_sync(conn, SendEmail(to="k"), queue="q", unique_opts={"by_queue": True})
        conn.commit()
    with awa.Client(apps_table) as client:
        with pytest.raises(awa.UniqueConflict):
            client.insert(SendEmail(to="k"), queue="q", unique_opts={"by_queue": True})
        client.insert(SendEmail(to="k"), queue="other", unique_opts={"by_queue": True})
    with psycopg.connect(apps_table) as conn:
        keys = conn.execute("SELECT unique_key, unique_states FROM awa.jobs ORDER BY id").fetchall()
    assert keys[0][0] is not None and keys[0][0] != keys[1][0] and keys[0][1] == keys[1][1]


def test_a_missing_schema_is_schema_not_migrated(empty_database: str) -> None:
    with psycopg.connect(empty_database) as conn:
        with pytest.raises(awa.SchemaNotMigrated) as info:
            insert_job_sync(conn, SendEmail(to="x"))
        # The driver's own error stays attached (the insert calls awa.driver_insert: no schema).
        assert isinstance(info.value.__cause__, psycopg.errors.InvalidSchemaName)


async def test_wrong_function_or_driver_is_a_type_error(apps_table: str) -> None:
    with psycopg.connect(apps_table) as conn:
        with pytest.raises(TypeError, match="use insert_job_sync"):
            await insert_job(conn, SendEmail(to="x"))
    async with await psycopg.AsyncConnection.connect(apps_table) as aconn:
        with pytest.raises(TypeError, match="use insert_job\\(\\)"):
            insert_job_sync(aconn, SendEmail(to="x"))
    for fn in (insert_job_sync, insert_job):
        with pytest.raises(TypeError, match="awa.bridge supports asyncpg, psycopg 3"):
            await _maybe(fn(object(), SendEmail(to="x")))
    assert _committed(apps_table) == (0, [])


async def _maybe(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value
