"""Least privilege from Python: with only the grants of docs/deploying.md, ``migrate()`` is a
no-op, and a worker, producers and admin calls work (design §7), on either engine
(``AWA_ENGINE``)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import urllib.parse
import uuid
from typing import Any, Iterator

import pytest

import awa
from conftest import ENGINE, admin_execute
from helpers import FAST, wait_for, wait_for_state

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "deploying.md"


def documented_grants(role: str) -> str:
    """The SQL between the grants markers of docs/deploying.md, for ``role``."""
    text = DOC.read_text()
    block = text.split("<!-- grants:begin -->", 1)[1].split("<!-- grants:end -->", 1)[0]
    sql = block.strip().removeprefix("```sql").removesuffix("```")
    return sql.replace("awa_app", f'"{role}"')


def as_role(url: str, role: str) -> str:
    parts = urllib.parse.urlparse(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{role}@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunparse(parts._replace(netloc=netloc))


def owner_execute(url: str, sql: str) -> None:
    with awa.Client(url, max_connections=1) as owner:
        owner._run(owner._async._execute(sql))


@pytest.fixture
def app_url(empty_database: str) -> Iterator[str]:
    """The empty database migrated by its owner (``empty_database``'s URL), and the URL of a
    fresh role holding exactly the documented grants (roles are cluster-wide: unique name,
    dropped afterwards)."""
    with awa.Client(empty_database) as owner:
        owner.migrate()
        if ENGINE == "queue_storage":
            owner.install_queue_storage()  # the role's worker then runs on queue storage
    role = f"awa_py_role_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin_execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        sql = "\n".join(
            ln for ln in documented_grants(role).splitlines() if not ln.strip().startswith("--")
        )
        for statement in sql.split(";"):
            if statement.strip():
                owner_execute(empty_database, statement)
        yield as_role(empty_database, role)
    finally:
        owner_execute(empty_database, f'DROP OWNED BY "{role}"')
        admin_execute(f'DROP ROLE IF EXISTS "{role}"')


@dataclasses.dataclass
class Chore:
    mode: str
    n: int = 0


@dataclasses.dataclass
class Receipt:
    n: int


async def schema_version(client: awa.AsyncClient) -> Any:
    async with client.transaction() as tx:
        row = await tx.fetch_one("SELECT max(version) AS v FROM awa.schema_version")
        await tx.commit()
    return row["v"]


async def test_migrate_is_a_no_op_for_the_application_role(app_url: str) -> None:
    async with awa.AsyncClient(app_url) as app:
        await app.migrate()
        await app.migrate()
        assert await schema_version(app) == awa._awa.SCHEMA_VERSION
        with pytest.raises(awa.DatabaseError):
            await app._execute("CREATE TABLE awa.not_allowed (x int)")


def test_migrate_as_the_application_role_on_an_older_schema_names_the_versions(
    app_url: str, empty_database: str
) -> None:
    latest = awa._awa.SCHEMA_VERSION
    owner_url = empty_database
    owner_execute(owner_url, f"DELETE FROM awa.schema_version WHERE version = {latest}")
    with awa.Client(app_url) as app:
        with pytest.raises(awa.AwaError) as raised:
            app.migrate()
    message = str(raised.value)
    previous = awa.migrations()[-2][0]  # versions need not be contiguous
    assert f"version {previous}" in message and f"version {latest}" in message, message
    assert "owner must run" in message, message
    with awa.Client(owner_url) as owner:
        owner.migrate()
    with awa.Client(app_url) as app:
        app.migrate()


async def test_worker_producer_and_admin_calls_run_as_the_application_role(app_url: str) -> None:
    tokens: list[Any] = []
    async with awa.AsyncClient(app_url) as app:
        await app.migrate()

        @app.task(Chore)
        async def chore(job: awa.Job) -> Any:
            mode = job.args.mode
            if mode == "stage":
                job.enqueue_on_completion(Receipt(n=job.args.n), queue="sink")
            elif mode == "progress":
                job.set_progress(50, "half")
                await job.flush_progress()
            elif mode == "park":
                token = await job.register_callback(timeout_seconds=3600)
                tokens.append(token)
                return awa.WaitForCallback(token)
            elif mode == "fail":
                raise awa.TerminalError("bad input")
            return None

        one = await app.insert(Chore("ok", 1))
        many = await app.insert_many([Chore("stage", 2), Chore("progress", 3)])
        copied = await app.insert_many_copy([Chore("ok", 4), Chore("ok", 5)])
        async with app.transaction() as tx:
            in_tx = await tx.insert(Chore("ok", 6))
            await tx.commit()
        parked = await app.insert(Chore("park", 7))
        failing = await app.insert(Chore("fail", 8))

        await app.start([("default", 4)], **FAST)
        try:
            for job in [one, *many, *copied, in_tx]:
                await wait_for_state(app, job.id, "completed")
            await wait_for_state(app, parked.id, "waiting_external")
            await wait_for_state(app, failing.id, "failed")
            receipts = await wait_for(
                lambda: app.list_jobs(queue="sink"), what="the staged follow-up"
            )
            assert [r.kind for r in receipts] == ["receipt"]

            # Callbacks and admin calls.
            jobs = await app.list_jobs(state="waiting_external")
            assert [j.id for j in jobs] == [parked.id]
            await wait_for(lambda: tokens, what="the callback token")
            await app.heartbeat_callback(tokens[0], timeout_seconds=60)
            assert (await app.complete_external(tokens[0], {"ok": True})).state == "completed"
            assert (await app.health_check()).schema_version == awa._awa.SCHEMA_VERSION
            await app.queue_stats()
            await app.pause_queue("idle", "ops")
            idle = await app.insert(Chore("ok", 9), queue="idle")
            await app.cancel(idle.id)
            await app.retry(idle.id)
            assert await app.drain_queue("idle") == 1
            await app.resume_queue("idle")
            assert len((await app.retry_failed(allow_all=True)).jobs) == 1
            await wait_for_state(app, failing.id, "failed")
            assert await app.discard_failed(failing.kind) == 1
            assert await app.dlq_depth() == 0
            assert await app.dlq_depth_by_queue() == []
            await app.list_dlq(kind="chore", tag="t")
            await app.purge_dlq(allow_all=True)
            await app.bulk_retry_from_dlq(allow_all=True)
            await app.bulk_move_failed_to_dlq(allow_all=True)
            await app.purge_dlq_job(failing.id)
            await app.dump_job(idle.id)
        finally:
            await app.shutdown()
