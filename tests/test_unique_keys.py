"""Unique keys as awa computes them, ``cancel_by_unique_key`` in awa-pg's form, and awa-pg's
own schema refused (issue 13, items 6 and 8; docs/unique-keys.md).

The key vectors were produced by awa-pg 0.6.9 (``bench/compat/unique_key_vectors.py``); here
our package inserts the same jobs and must store the same bytes. The foreign-schema tests run
awa-pg 0.6.9's own ``migrate`` from a virtualenv cached under ``bench/.venvs/`` (created with pip
on first use; set ``AWA_PG_VENV`` to use another, or ``AWA_SKIP_AWA_PG=1`` to skip them offline).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys
import time
import uuid
from typing import Any, Iterator

import awa
import pytest
from conftest import BASE_URL, admin_execute, url_with_database

ROOT = pathlib.Path(__file__).resolve().parents[1]
VECTORS = json.loads((ROOT / "awa-core" / "src" / "model" / "unique_key_vectors.json").read_text("utf-8"))


async def stored_key(client: awa.AsyncClient, job_id: int) -> str:
    async with client.transaction() as tx:
        row = await tx.fetch_one("SELECT encode(unique_key, 'hex') AS k FROM awa.jobs WHERE id = $1", job_id)
    return str(row["k"])


def _opts(v: dict[str, Any]) -> dict[str, Any]:
    opts: dict[str, Any] = {"by_queue": v["by_queue"], "by_args": v["by_args"]}
    if v["by_period"] is not None:
        opts["by_period"] = v["by_period"]
    return opts


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS["vectors"] if v["by_period"] is None], ids=lambda v: v["name"])
async def test_insert_stores_awa_pgs_key(client: awa.AsyncClient, vector: dict[str, Any]) -> None:
    if vector["name"] == "by_args_beyond_u64":
        # awa-pg silently turns 2**70 into a float (and hashes that); we refuse an int we
        # cannot store exactly (docs/unique-keys.md). The Rust vector test covers its key.
        with pytest.raises(awa.ValidationError, match="beyond 64 bits"):
            await client.insert(json.loads(vector["args"]), kind=vector["kind"], unique_opts=_opts(vector))
        return
    job = await client.insert(json.loads(vector["args"]), kind=vector["kind"], queue=vector["queue"],
                              unique_opts=_opts(vector))
    key = await stored_key(client, job.id)
    if vector["differs"] is None:
        assert key == vector["awa_pg_key"]
    else:  # documented: awa-pg hashes the int as the float it turned it into
        assert key != vector["awa_pg_key"]


async def test_by_period_hashes_the_bucket_and_cancel_finds_it_by_bucket(client: awa.AsyncClient) -> None:
    run_at = datetime.datetime(2099, 1, 1, 5, 30, tzinfo=datetime.timezone.utc)
    job = await client.insert({"x": 1}, kind="kv_period_3600", run_at=run_at,
                              unique_opts={"by_args": False, "by_period": 3600})
    bucket = int(run_at.timestamp()) // 3600
    # awa-pg 0.6.9 would hash 3600 itself here (its vector); we hash the bucket.
    awa_pg = next(v for v in VECTORS["vectors"] if v["name"] == "by_period_3600")
    assert await stored_key(client, job.id) != awa_pg["awa_pg_key"]
    assert await client.cancel_by_unique_key("kv_period_3600", period_bucket=3600) is None
    got = await client.cancel_by_unique_key("kv_period_3600", period_bucket=bucket)
    assert got is not None and got.id == job.id and str(got.state) == "cancelled"


async def test_cancel_by_unique_key_rebuilds_the_key_from_exactly_the_parts_given(client: awa.AsyncClient) -> None:
    job = await client.insert({"to": "a"}, kind="mail", queue="q", unique_opts={"by_args": True})
    # The key has no queue part: naming the queue builds another key.
    assert await client.cancel_by_unique_key("mail", queue="q", args={"to": "a"}) is None
    assert await client.cancel_by_unique_key("mail", args={"to": "b"}) is None
    assert await client.cancel_by_unique_key("mail") is None
    got = await client.cancel_by_unique_key("mail", args={"to": "a"})
    assert got is not None and got.id == job.id and str(got.state) == "cancelled"
    # Nothing unfinished holds the key any more.
    assert await client.cancel_by_unique_key("mail", args={"to": "a"}) is None
    both = await client.insert({"to": "c"}, kind="mail", queue="q", unique_opts={"by_queue": True})
    got = await client.cancel_by_unique_key(kind="mail", queue="q", args={"to": "c"})
    assert got is not None and got.id == both.id


async def test_cancel_by_unique_key_keeps_the_earlier_args_object_form(client: awa.AsyncClient) -> None:
    from dataclasses import dataclass

    @dataclass
    class Report:
        day: int

    job = await client.insert(Report(day=1), queue="r", unique_opts={"by_queue": True})
    got = await client.cancel_by_unique_key(Report(day=1), queue="r", unique_opts={"by_queue": True})
    assert got is not None and got.id == job.id


async def test_cancel_by_unique_key_bad_input_is_a_validation_error(client: awa.AsyncClient) -> None:
    for bad in ("x", 1.5, True, 2**63):
        with pytest.raises(awa.ValidationError, match="period_bucket"):
            await client.cancel_by_unique_key("k", period_bucket=bad)  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="unique_opts"):
        await client.cancel_by_unique_key("k", unique_opts={})
    with pytest.raises(awa.ValidationError, match="args object"):
        await client.cancel_by_unique_key({"a": 1}, args={"a": 1})
    # As insert (and awa-pg) refuse args of a type args can never be.
    with pytest.raises(awa.ValidationError, match="args must be"):
        await client.cancel_by_unique_key("k", args=object())


def test_cancel_by_unique_key_on_the_blocking_client(sync_client: awa.Client) -> None:
    job = sync_client.insert({"n": 1}, kind="blocking", unique_opts={})
    assert sync_client.cancel_by_unique_key("blocking", args={"n": 2}) is None
    got = sync_client.cancel_by_unique_key("blocking", args={"n": 1})
    assert got is not None and got.id == job.id


# ----- item 8: awa-pg's own schema is refused ------------------------------------------------

AWA_PG = "0.6.9"


def _awa_pg_python() -> pathlib.Path:
    """The Python of a virtualenv with awa-pg 0.6.9, created with pip on first use."""
    venv = pathlib.Path(os.environ.get("AWA_PG_VENV", ROOT / "bench" / ".venvs" / f"awa-pg-{AWA_PG}"))
    python = venv / "bin" / "python"
    probe = [str(python), "-c", f"import importlib.metadata as m; assert m.version('awa-pg') == '{AWA_PG}'"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"awa-pg=={AWA_PG}"], check=True)
    return python


@pytest.fixture(scope="module")
def awa_pg_database() -> Iterator[str]:
    """A database whose ``awa`` schema awa-pg 0.6.9's own migrate created."""
    if os.environ.get("AWA_SKIP_AWA_PG") == "1":
        pytest.skip("AWA_SKIP_AWA_PG=1: awa-pg is not installed in this environment")
    python = _awa_pg_python()
    name = f"awa_py_awapg_{uuid.uuid4().hex[:10]}"
    admin_execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(BASE_URL, name)
    try:
        started = time.monotonic()
        subprocess.run([str(python), "-m", "awa", "--database-url", url, "migrate"], check=True,
                       capture_output=True, timeout=600)
        print(f"awa-pg {AWA_PG} migrate took {time.monotonic() - started:.1f}s")
        yield url
    finally:
        admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_READ_BACK = """
import asyncio, json, sys, awa
async def main():
    client = awa.AsyncClient(sys.argv[1])
    tx = await client.transaction()
    row = await tx.fetch_one(
        "SELECT (SELECT max(version) FROM awa.schema_version) AS version, "
        "(SELECT count(*) FROM pg_tables WHERE schemaname = 'awa' "
        " AND tablename IN ('pending_steps', 'jobs_dlq', 'runtime_instances_v')) AS ours")
    await tx.rollback()
    print(json.dumps({"version": row["version"], "ours": row["ours"]}))
asyncio.run(main())
"""


def _read_back_with_awa_pg(url: str) -> dict[str, int]:
    """awa-pg's schema version and the count of our own tables in it, read with awa-pg."""
    out = subprocess.run([str(_awa_pg_python()), "-c", _READ_BACK, url], check=True,
                         capture_output=True, text=True, timeout=120)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


async def test_migrate_on_awa_pgs_schema_raises_foreign_schema_and_changes_nothing(awa_pg_database: str) -> None:
    client = awa.AsyncClient(awa_pg_database)
    try:
        with pytest.raises(awa.ForeignSchema) as raised:
            await client.migrate()
        msg = str(raised.value)
        assert "awa-pg" in msg and "schema version 40" in msg and "another database" in msg, msg
        # awa-pg-style handlers still catch it.
        assert isinstance(raised.value, awa.SchemaNotMigrated)
        assert isinstance(raised.value, awa.AwaError)
    finally:
        await client.close()
    # Nothing of ours was created in it: awa-pg's bookkeeping is as awa-pg left it.
    assert _read_back_with_awa_pg(awa_pg_database) == {"version": 40, "ours": 0}


@pytest.mark.parametrize("call", ["insert", "queue_stats", "get_job", "transaction", "start", "list_cron_jobs",
                                  "list_runtime_instances", "cancel_by_unique_key"])
async def test_every_client_call_on_awa_pgs_schema_raises_foreign_schema(awa_pg_database: str, call: str) -> None:
    client = awa.AsyncClient(awa_pg_database)
    try:
        with pytest.raises(awa.ForeignSchema, match="awa-pg"):
            if call == "insert":
                await client.insert({"a": 1}, kind="k")
            elif call == "queue_stats":
                await client.queue_stats()
            elif call == "get_job":
                await client.get_job(1)
            elif call == "transaction":
                await client.transaction()
            elif call == "list_cron_jobs":
                await client.list_cron_jobs()
            elif call == "list_runtime_instances":
                await client.list_runtime_instances()
            elif call == "cancel_by_unique_key":
                await client.cancel_by_unique_key("k", args={"a": 1})
            else:
                @client.task(dict, kind="k")
                async def handle(job: awa.Job) -> None:
                    return None
                await client.start()
    finally:
        await client.shutdown()
        await client.close()


def test_the_blocking_client_raises_foreign_schema_too(awa_pg_database: str) -> None:
    with awa.Client(awa_pg_database) as client:
        with pytest.raises(awa.ForeignSchema):
            client.migrate()
        with pytest.raises(awa.ForeignSchema):
            client.insert({"a": 1}, kind="k")
        with pytest.raises(awa.ForeignSchema):
            client.list_cron_jobs()
