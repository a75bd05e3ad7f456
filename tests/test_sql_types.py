"""Raw SQL through ``Transaction.fetch_*``: the column types a row decodes to, exactly (a
NUMERIC is a ``decimal.Decimal`` with every digit, a UUID its text), and a clear error naming
the column for a type that has no Python value here (awa-pg 0.6.9 returns ``None`` for those,
silently; ours says what to do)."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest

import awa
from helpers import FAST


async def one(client: awa.AsyncClient, sql: str, *args: Any) -> Any:
    tx = await client.transaction()
    try:
        return (await tx.fetch_one(sql, *args))["v"]
    finally:
        await tx.rollback()


@pytest.mark.parametrize("sql, expected", [
    ("SELECT '6f1c1b5e-2d3a-4b8e-9c7f-0a1b2c3d4e5f'::uuid AS v", "6f1c1b5e-2d3a-4b8e-9c7f-0a1b2c3d4e5f"),
    ("SELECT NULL::uuid AS v", None),
    ("SELECT 1.5::numeric AS v", Decimal("1.5")),
    ("SELECT -0.0001::numeric AS v", Decimal("-0.0001")),
    ("SELECT 12345678901234567890123::numeric AS v", Decimal("12345678901234567890123")),
    ("SELECT 10000::numeric AS v", Decimal("10000")),
    ("SELECT 0::numeric AS v", Decimal("0")),
    ("SELECT 123.450::numeric(10,3) AS v", Decimal("123.450")),
    ("SELECT 0.00000000000000000001::numeric AS v", Decimal("1E-20")),
    ("SELECT 99999.99999::numeric AS v", Decimal("99999.99999")),
    ("SELECT '2020-01-02'::date AS v", dt.date(2020, 1, 2)),
    ("SELECT '10:11:12.5'::time AS v", dt.time(10, 11, 12, 500000)),
    ("SELECT ARRAY[true, false] AS v", [True, False]),
    ("SELECT ARRAY[1.5::float8, -2] AS v", [1.5, -2.0]),
])
async def test_columns_decode_exactly(client: awa.AsyncClient, sql: str, expected: Any) -> None:
    value = await one(client, sql)
    assert value == expected
    assert type(value) is type(expected)


async def test_an_enum_reads_as_its_label(client: awa.AsyncClient) -> None:
    tx = await client.transaction()
    try:
        await tx.execute("CREATE TYPE pg_mood AS ENUM ('happy', 'sad')")
        assert (await tx.fetch_one("SELECT 'sad'::pg_mood AS v"))["v"] == "sad"
    finally:
        await tx.rollback()


async def test_numeric_nan_and_a_random_uuid(client: awa.AsyncClient) -> None:
    assert (await one(client, "SELECT 'NaN'::numeric AS v")).is_nan()
    u = uuid.uuid4()
    assert await one(client, "SELECT $1::text::uuid AS v", str(u)) == str(u)


async def test_a_type_without_a_python_value_is_a_clear_error(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.AwaError, match=r'column "v" \(INTERVAL\).*cast it to text'):
        await one(client, "SELECT '1 day'::interval AS v")


async def test_select_star_from_awas_own_tables(client: awa.AsyncClient, database_url: str) -> None:
    """awa.runtime_instances and awa.jobs hold UUIDs and enums: SELECT * reads them."""
    worker = awa.AsyncClient(database_url)

    @worker.task(dict, kind="sqltypes", queue="sqltypes")
    async def handle(job: awa.Job) -> None:
        return None

    await worker.start([("sqltypes", 1)], **FAST)
    try:
        tx = await client.transaction()
        try:
            row = await tx.fetch_one("SELECT * FROM awa.runtime_instances LIMIT 1")
            job = await client.insert({"x": 1}, kind="sqltypes_idle", queue="nobody")
            jrow = await tx.fetch_one("SELECT * FROM awa.jobs WHERE id = $1", job.id)
        finally:
            await tx.rollback()
        assert str(uuid.UUID(row["instance_id"])) == row["instance_id"]
        assert jrow["state"] == "available"
    finally:
        await worker.shutdown()
        await worker.close()
