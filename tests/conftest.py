"""Fixtures: every test session gets its own database, dropped at the end."""

from __future__ import annotations

import os
import urllib.parse
import uuid
from typing import AsyncIterator, Iterator

import pytest

import awa

BASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")

#: The storage engine the suite runs on (``AWA_ENGINE=canonical|queue_storage``; scripts/test.sh
#: runs both legs). On ``queue_storage`` the session database has queue storage installed and
#: emptied before each test. Every test runs on both; one that sets a state up with SQL writes
#: to the table of the engine at hand (``ENGINE``).
ENGINE = os.environ.get("AWA_ENGINE", "canonical")
if ENGINE not in ("canonical", "queue_storage"):
    raise RuntimeError(f"AWA_ENGINE must be canonical or queue_storage (got {ENGINE!r})")


def url_with_database(url: str, name: str) -> str:
    parts = urllib.parse.urlparse(url)
    return urllib.parse.urlunparse(parts._replace(path="/" + name))


def admin_execute(sql: str) -> None:
    with awa.Client(BASE_URL, max_connections=1) as admin:
        admin._run(admin._async._execute(sql))


@pytest.fixture(scope="session")
def fresh_database() -> Iterator[str]:
    """A factory-less session database; tests that need an unmigrated one use ``empty_database``."""
    name = f"awa_py_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin_execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(BASE_URL, name)
    try:
        with awa.Client(url) as c:
            c.migrate()
            if ENGINE == "queue_storage":
                c.install_queue_storage()
        yield url
    finally:
        admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A brand-new database with no schema, dropped after the test."""
    name = f"awa_py_empty_{uuid.uuid4().hex[:10]}"
    admin_execute(f'CREATE DATABASE "{name}"')
    try:
        yield url_with_database(BASE_URL, name)
    finally:
        admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _truncate(c: awa.Client) -> None:
    # A transaction a failed test left open would make the TRUNCATE wait for good.
    c._run(c._async._execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                               "current_database() AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"))
    c._run(c._async._execute("TRUNCATE awa.canonical_jobs, awa.jobs_dlq, awa.queue_meta, awa.cron_jobs, awa.runtime_instances, "
                               "awa.batch_operations, awa.queue_descriptors, awa.job_kind_descriptors RESTART IDENTITY"))
    if ENGINE == "queue_storage":
        c.install_queue_storage(reset=True)


@pytest.fixture
def database_url(fresh_database: str) -> str:
    with awa.Client(fresh_database) as c:
        _truncate(c)
    return fresh_database


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[awa.AsyncClient]:
    c = awa.AsyncClient(database_url)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def sync_client(database_url: str) -> Iterator[awa.Client]:
    with awa.Client(database_url) as c:
        yield c
