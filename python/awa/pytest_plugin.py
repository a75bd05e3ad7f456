"""The ``awa_client`` pytest fixture, registered as a pytest plugin (entry point ``pytest11``
``awa``): installing the package makes it available to every test, no import needed.

``awa_client`` is an :class:`awa.testing.AwaTestClient` wrapping an :class:`awa.AsyncClient` on
a database of its own: a fresh database is created next to the one ``DATABASE_URL`` names
(:func:`awa.testing.get_database_url`), migrated, and dropped after the test. A role that may
not create databases gets the named database itself, migrated and cleaned (every job, DLQ
entry and queue setting deleted) before and after the test. The fixture is async: it needs
pytest-asyncio, as awa-pg's does (without it, using the fixture fails with a message saying
so; the plugin itself loads without it).
"""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Any, AsyncIterator

import pytest

from ._awa import DatabaseError
from ._client import AsyncClient
from .testing import AwaTestClient, get_database_url

__all__ = ["awa_client"]

#: SQLSTATE insufficient_privilege: the role may not create databases.
_NO_CREATEDB = "42501"


def _with_database(url: str, name: str) -> str:
    parts = urllib.parse.urlparse(url)
    return urllib.parse.urlunparse(parts._replace(path="/" + name))


async def _admin(url: str, sql: str) -> None:
    admin = AsyncClient(url, max_connections=1)
    try:
        await admin._execute(sql)
    finally:
        await admin.close()


async def _awa_client() -> AsyncIterator[AwaTestClient]:
    base = get_database_url()
    name = f"awa_test_{uuid.uuid4().hex[:12]}"
    try:
        await _admin(base, f'CREATE DATABASE "{name}"')
        url, own = _with_database(base, name), True
    except DatabaseError as exc:
        if getattr(exc, "sqlstate", None) != _NO_CREATEDB:
            raise
        url, own = base, False
    client = AsyncClient(url)
    tc = AwaTestClient(client)
    try:
        await tc.migrate()
        if not own:
            await tc.clean()
        yield tc
        if not own:
            await tc.clean()
    finally:
        await client.close()
        if own:
            await _admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fixture() -> Any:
    try:
        import pytest_asyncio
    except ImportError:  # pragma: no cover - exercised only without pytest-asyncio

        def missing() -> Any:
            raise pytest.UsageError("the awa_client fixture is async: install pytest-asyncio")

        return pytest.fixture(missing, name="awa_client")
    return pytest_asyncio.fixture(_awa_client, name="awa_client")


#: An :class:`awa.testing.AwaTestClient` on a fresh, migrated database (see the module doc).
awa_client = _fixture()
