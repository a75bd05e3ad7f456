"""A transaction that hit an error never pretends to commit (issue 12, item 2).

A ``UniqueConflict`` inside a transaction is an answer, not a failure: the insert runs under a
savepoint, and the transaction's earlier and later work commits. Any other failed statement
leaves the transaction unable to commit: ``commit()`` (and a normal ``async with``/``with``
exit) rolls back and raises ``awa.DatabaseError`` with SQLSTATE 25P02 saying why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import awa
import pytest
from conftest import ENGINE


@dataclasses.dataclass
class Ship:
    order: int


@asynccontextmanager
async def _explicit(client: awa.AsyncClient) -> AsyncIterator[awa.Transaction]:
    """A transaction the test commits itself; rolled back if the test fails first, so a failed
    assertion cannot leave a connection holding locks (and hang the next test's TRUNCATE)."""
    tx = await client.transaction()
    try:
        yield tx
    finally:
        if not await tx._native.is_closed():
            await tx.rollback()


async def _is_closed(tx: awa.Transaction) -> bool:
    return bool(await tx._native.is_closed())


async def _kinds(client: awa.AsyncClient) -> list[int]:
    jobs = await client.list_jobs(kind="ship", limit=100)
    return sorted(j.args["order"] for j in jobs)


async def test_unique_conflict_leaves_the_transaction_usable(client: awa.AsyncClient) -> None:
    await client.insert(Ship(order=1), unique_opts={})
    async with client.transaction() as tx:
        await tx.insert(Ship(order=0))
        with pytest.raises(awa.UniqueConflict):
            await tx.insert(Ship(order=1), unique_opts={})
        # The same for a batch and for COPY: the conflict rolls back to its savepoint only.
        with pytest.raises(awa.UniqueConflict):
            await tx.insert_many([Ship(order=5), Ship(order=1)], unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            await tx.enqueue_many_copy([Ship(order=1)], unique_opts={})
        await tx.insert(Ship(order=2))
        await tx.insert_many([Ship(order=3)], unique_opts={})
        assert (await tx.fetch_one("SELECT count(*)::int AS n FROM awa.jobs"))["n"] == 4
    # Earlier and later inserts committed; the conflicting ones (and their batch) did not.
    assert await _kinds(client) == [0, 1, 2, 3]


async def test_commit_after_a_failed_statement_raises_and_commits_nothing(client: awa.AsyncClient) -> None:
    async with _explicit(client) as tx:
        await tx.insert(Ship(order=10))
        with pytest.raises(awa.DatabaseError) as failed:
            await tx.execute("SELEC 1")
        assert failed.value.sqlstate == "42601"
        with pytest.raises(awa.DatabaseError) as raised:
            await tx.commit()
        assert raised.value.sqlstate == "25P02"
        assert "rolled back" in str(raised.value) and "nothing was committed" in str(raised.value)
        assert "SELEC" in str(raised.value), "the message says which statement failed"
        assert await _kinds(client) == []
        with pytest.raises(awa.AwaError, match="already committed or rolled back"):
            await tx.commit()


async def test_async_with_exiting_normally_after_a_swallowed_error_raises(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.DatabaseError, match="rolled back") as raised:
        async with client.transaction() as tx:
            await tx.insert(Ship(order=20))
            try:
                await tx.fetch_all("SELECT * FROM no_such_table")
            except awa.DatabaseError:
                pass  # swallowed: the exit must still not pretend to commit
    assert raised.value.sqlstate == "25P02"
    assert await _kinds(client) == []


async def test_a_failed_insert_marks_the_transaction_failed(client: awa.AsyncClient) -> None:
    # A database-side insert failure (the row breaks a CHECK the validator cannot see here:
    # a trigger raising stands in for any server-side rejection), on the table the engine's
    # new jobs go to: canonical's, or queue storage's ready entries (a row trigger on the
    # partitioned table reaches every partition).
    table = "awa.ready_entries" if ENGINE == "queue_storage" else "awa.canonical_jobs"
    await client._execute(
        "CREATE OR REPLACE FUNCTION pg_temp_reject() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN IF NEW.kind = 'rejected' THEN RAISE EXCEPTION 'rejected by trigger'; END IF; RETURN NEW; END $$"
    )
    await client._execute(f"DROP TRIGGER IF EXISTS reject_kind ON {table}")
    await client._execute(
        f"CREATE TRIGGER reject_kind BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION pg_temp_reject()"
    )
    try:
        for unique in (None, {}):
            async with _explicit(client) as tx:
                await tx.insert(Ship(order=30))
                with pytest.raises(awa.DatabaseError, match="rejected by trigger"):
                    await tx.insert({"x": 1}, kind="rejected", unique_opts=unique)
                with pytest.raises(awa.DatabaseError, match="rolled back"):
                    await tx.commit()
            assert await _kinds(client) == []
    finally:
        await client._execute(f"DROP TRIGGER IF EXISTS reject_kind ON {table}")
        await client._execute("DROP FUNCTION IF EXISTS pg_temp_reject()")


async def test_a_caller_savepoint_that_recovers_still_commits(client: awa.AsyncClient) -> None:
    async with client.transaction() as tx:
        await tx.insert(Ship(order=40))
        await tx.execute("SAVEPOINT mine")
        with pytest.raises(awa.DatabaseError):
            await tx.execute("SELECT 1/0")
        await tx.execute("ROLLBACK TO SAVEPOINT mine")
        await tx.insert(Ship(order=41))
    assert await _kinds(client) == [40, 41]


async def test_validation_errors_do_not_spoil_the_transaction(client: awa.AsyncClient) -> None:
    async with client.transaction() as tx:
        await tx.insert(Ship(order=50))
        with pytest.raises(awa.ValidationError):
            await tx.insert(Ship(order=51), priority=9)
        await tx.insert(Ship(order=52))
    assert await _kinds(client) == [50, 52]


async def test_rollback_after_a_failure_is_quiet(client: awa.AsyncClient) -> None:
    async with _explicit(client) as tx:
        await tx.insert(Ship(order=60))
        with pytest.raises(awa.DatabaseError):
            await tx.execute("SELEC 1")
        await tx.rollback()
    assert await _kinds(client) == []


def test_blocking_transaction_mirrors_every_path(sync_client: awa.Client) -> None:
    sync_client.insert(Ship(order=1), unique_opts={})
    with sync_client.transaction() as tx:
        tx.insert(Ship(order=70))
        with pytest.raises(awa.UniqueConflict):
            tx.insert(Ship(order=1), unique_opts={})
        tx.insert(Ship(order=71))
    orders = sorted(j.args["order"] for j in sync_client.list_jobs(kind="ship"))
    assert orders == [1, 70, 71]

    with pytest.raises(awa.DatabaseError, match="rolled back") as raised, sync_client.transaction() as tx:
        tx.insert(Ship(order=72))
        try:
            tx.execute("SELEC 1")
        except awa.DatabaseError:
            pass
    assert raised.value.sqlstate == "25P02"

    tx = sync_client.transaction()
    try:
        tx.insert(Ship(order=73))
        with pytest.raises(awa.DatabaseError):
            tx.fetch_one("SELECT * FROM no_such_table")
        with pytest.raises(awa.DatabaseError, match="rolled back"):
            tx.commit()
    finally:
        if not sync_client._run(_is_closed(tx._tx)):
            tx.rollback()
    orders = sorted(j.args["order"] for j in sync_client.list_jobs(kind="ship"))
    assert orders == [1, 70, 71]
