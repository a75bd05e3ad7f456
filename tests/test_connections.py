"""Closing a client gives every server connection back (found while hunting CI flakes).

sqlx 0.8's ``Pool::close`` could return with one connection still parked in the pool's idle
queue: about one client in four closed right after a query kept an idle backend for as long as
the client object lived, and a full run of this suite climbed to 150 such backends, past the
server's ``max_connections``; later tests then failed with "too many clients already". The
engine now closes a pool so that nothing is left (``awa_core::close_pool``).
"""

from __future__ import annotations

import time

import awa

BACKENDS = (
    "SELECT count(*) AS n FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def _backends(admin: awa.Client) -> int:
    with admin.transaction() as tx:
        return int(tx.fetch_one(BACKENDS)["n"])


def _settles_to(admin: awa.Client, want: int) -> int:
    """The backend count once it stops falling: a closed connection's server process leaves
    ``pg_stat_activity`` a moment after the client hung up, so poll (for at most 10 s) rather
    than read once; a leaked connection never leaves, and the test fails with the count."""
    deadline = time.monotonic() + 10
    while (n := _backends(admin)) > want and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


async def test_closing_a_client_releases_every_server_connection(database_url: str) -> None:
    with awa.Client(database_url, max_connections=1) as admin:
        before = _backends(admin)
        kept = []  # the leak lived as long as the client object: keep every one alive
        for i in range(40):
            client = awa.AsyncClient(database_url, max_connections=4)
            kept.append(client)
            await client.insert({"i": i}, kind="probe")
            await client.list_jobs(kind="probe", limit=1)
            await client.close()
        assert _settles_to(admin, before) == before, "a closed client left a server connection open"


def test_closing_a_blocking_client_releases_every_server_connection(database_url: str) -> None:
    with awa.Client(database_url, max_connections=1) as admin:
        before = _backends(admin)
        kept = []
        for i in range(40):
            client = awa.Client(database_url, max_connections=4)
            kept.append(client)
            client.insert({"i": i}, kind="probe")
            client.close()
        assert _settles_to(admin, before) == before, "a closed client left a server connection open"
