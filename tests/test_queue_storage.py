"""Queue storage from Python (issue 18; docs/storage-transition.md): awa-pg 0.6.9's
``install_queue_storage``, ``storage_status`` and ``start()`` keywords, inserts routed to the
active engine, and the live transition from canonical (prepare, enter the mixed phase, finalize
or abort) with its refusals. Each test has a database of its own: the storage state is one row
per database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator

import pytest

import awa
from helpers import FAST, wait_for, wait_for_state


@dataclass
class Work:
    n: int


@pytest.fixture
async def qdb(empty_database: str) -> AsyncIterator[str]:
    async with awa.AsyncClient(empty_database) as c:
        await c.migrate()
    yield empty_database


async def _canonical_count(client: awa.AsyncClient) -> int:
    tx = await client.transaction()
    try:
        row = await tx.fetch_one("SELECT count(*)::int AS n FROM awa.canonical_jobs")
    finally:
        await tx.rollback()
    return int(row["n"])


def _worker(url: str, seen: list[int], queue: str) -> awa.AsyncClient:
    c = awa.AsyncClient(url)

    @c.task(Work, queue=queue)
    async def handle(job: awa.Job) -> None:
        seen.append(job.args.n)

    return c


async def test_install_routes_every_insert_path_to_queue_storage_and_workers_run_them(qdb: str) -> None:
    async with awa.AsyncClient(qdb) as client:
        await client.install_queue_storage()
        status = json.loads(await client.storage_status())
        assert status["state"] == "active"
        assert status["current_engine"] == status["active_engine"] == "queue_storage"
        assert status["details"] == {"schema": "awa"}
        assert status["transition_epoch"] == 1
        assert len(status) == 17

        one = await client.insert(Work(1), queue="qs")
        many = await client.insert_many([Work(2), Work(3)], queue="qs")
        copied = await client.insert_many_copy([Work(4)], queue="qs")
        counted = await client.enqueue_many_copy([Work(5)], queue="qs")
        tx = await client.transaction()
        in_tx = await tx.insert(Work(6), queue="qs")
        await tx.commit()
        assert counted == 1
        assert await _canonical_count(client) == 0
        assert (await client.get_job(one.id)).state == "available"
        listed = await client.list_jobs(queue="qs")
        assert len(listed) == 6 and [j.id for j in listed] == sorted((j.id for j in listed), reverse=True)

        seen: list[int] = []
        worker = _worker(qdb, seen, "qs")
        await worker.start([("qs", 4)], **FAST)
        try:
            for job in [one, *many, *copied, in_tx]:
                await wait_for_state(client, job.id, "completed")
            await wait_for(lambda: len(seen) == 6, what="all six jobs ran")
            rows = await client.list_runtime_instances()
            assert [r.get("storage_capability") for r in rows] == ["queue_storage"]
        finally:
            await worker.shutdown()
            await worker.close()
        assert sorted(seen) == [1, 2, 3, 4, 5, 6]
        assert await _canonical_count(client) == 0


async def test_awa_jobs_shows_both_engines_to_sql_and_the_cli(qdb: str) -> None:
    """``awa.jobs`` stays a readable view of every job on either engine (migration 13): SQL
    inspection and ``awa job list`` see queue storage's jobs next to canonical's; a write through
    the view that reaches a queue-storage job is refused, typed, and changes nothing."""
    async with awa.AsyncClient(qdb) as client:
        old = await client.insert(Work(0), queue="view")
        assert await client.cancel(old.id)
        await client.install_queue_storage()
        new = await client.insert(Work(1), queue="view")
        tx = await client.transaction()
        try:
            rows = await tx.fetch_all("SELECT id, state, queue FROM awa.jobs ORDER BY id")
        finally:
            await tx.rollback()
        assert [(r["id"], r["state"], r["queue"]) for r in rows] == [
            (old.id, "cancelled", "view"), (new.id, "available", "view")]
        assert await _canonical_count(client) == 1
        tx = await client.transaction()
        try:
            with pytest.raises(awa.DatabaseError, match="is on queue storage"):
                await tx.execute("UPDATE awa.jobs SET priority = 1 WHERE id = $1", new.id)
        finally:
            await tx.rollback()
        assert (await client.get_job(new.id)).priority == 2

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    listed = subprocess.run([sys.executable, "-m", "awa", "--database-url", qdb, "job", "list", "--json"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert [(j["id"], j["state"]) for j in json.loads(listed.stdout)["jobs"]] == [
        (new.id, "available"), (old.id, "cancelled")]


async def test_install_refusals_are_typed_and_change_nothing(qdb: str) -> None:
    async with awa.AsyncClient(qdb) as client:
        with pytest.raises(awa.ValidationError, match="invalid SQL identifier: Bad-Name"):
            await client.install_queue_storage(schema="Bad-Name")
        with pytest.raises(awa.ValidationError, match="queue storage requires at least 4 queue slots"):
            await client.install_queue_storage(queue_slot_count=3)
        with pytest.raises(awa.ValidationError, match="queue storage requires at least 2 lease slots"):
            await client.install_queue_storage(lease_slot_count=1)
        # Live canonical jobs would be stranded: refused, the job stays where it is.
        job = await client.insert(Work(1), queue="c")
        with pytest.raises(awa.AwaError, match="canonical live backlog is 1"):
            await client.install_queue_storage()
        assert json.loads(await client.storage_status())["state"] == "canonical"
        assert (await client.get_job(job.id)).state == "available"

        seen: list[int] = []
        worker = _worker(qdb, seen, "c")
        await worker.start([("c", 1)], **FAST)
        try:
            with pytest.raises(awa.AwaError, match="cannot install queue storage while the worker runtime is running"):
                await worker.install_queue_storage()
        finally:
            await worker.shutdown()
            await worker.close()


async def test_reset_empties_queue_storage_and_keeps_it_active(qdb: str) -> None:
    with awa.Client(qdb) as client:
        client.install_queue_storage(schema="awa_q", queue_slot_count=4, lease_slot_count=2)
        job = client.insert(Work(1), queue="r")
        client.install_queue_storage(schema="awa_q", queue_slot_count=4, lease_slot_count=2)
        assert client.get_job(job.id).state == "available"  # installing again changes nothing
        client.install_queue_storage(schema="awa_q", reset=True)
        with pytest.raises(awa.JobNotFound):
            client.get_job(job.id)
        status = json.loads(client.storage_status())
        assert status["state"] == "active" and status["details"] == {"schema": "awa_q"}
        assert client.insert(Work(2), queue="r").state == "available"


async def test_start_keywords_are_checked(qdb: str) -> None:
    async with awa.AsyncClient(qdb) as client:
        @client.task(Work, queue="k")
        async def handle(job: awa.Job) -> None:
            return None

        with pytest.raises(awa.ConfigError, match=r"storage_transition_role must be one of 'auto', "
                           r"'canonical_drain', or 'queue_storage_target' \(got 'bogus'\)"):
            await client.start([("k", 1)], storage_transition_role="bogus")
        with pytest.raises(ValueError, match="queue_storage_queue_slot_count must be > 0"):
            await client.start([("k", 1)], queue_storage_queue_slot_count=0)
        with pytest.raises(ValueError, match="queue_storage_lease_rotate_interval_ms must be > 0"):
            await client.start([("k", 1)], queue_storage_lease_rotate_interval_ms=-5)
        with pytest.raises(awa.AwaError, match="queue_storage_target"):
            await client.start([("k", 1)], storage_transition_role="queue_storage_target")
        await client.install_queue_storage()
        with pytest.raises(awa.ValidationError, match="queue storage runtime configured for schema "
                           "'awa_other' but transition state requires 'awa'"):
            await client.start([("k", 1)], queue_storage_schema="awa_other")


async def test_a_live_transition_moves_producers_and_loses_nothing(qdb: str) -> None:
    async with awa.AsyncClient(qdb) as ops:
        old = await ops.insert(Work(1), queue="t")  # canonical, before anything

        prepared = await ops.storage_prepare(schema="awa")
        assert prepared["state"] == "prepared" and prepared["prepared_engine"] == "queue_storage"
        status = json.loads(await ops.storage_status())
        assert status["can_enter_mixed_transition"] is False
        assert any("queue_storage_target" in b for b in status["enter_mixed_transition_blockers"])
        with pytest.raises(awa.AwaError, match='queue storage schema "awa" is not prepared'):
            await ops.storage_enter_mixed_transition()
        await ops.prepare_queue_storage_schema(schema="awa")
        assert json.loads(await ops.storage_status())["state"] == "prepared"
        with pytest.raises(awa.AwaError, match="without a live runtime running with "
                           "transition_role=queue_storage_target"):
            await ops.storage_enter_mixed_transition()
        with pytest.raises(awa.AwaError, match="storage finalize is only allowed from mixed_transition state"):
            await ops.storage_finalize()
        during_prepare = await ops.insert(Work(2), queue="t")  # still canonical

        seen_new: list[int] = []
        target = _worker(qdb, seen_new, "t")
        await target.start([("t", 2)], storage_transition_role="queue_storage_target", **FAST)
        try:
            assert json.loads(await ops.storage_status())["prepared_schema_ready"] is True
            mixed = await ops.storage_enter_mixed_transition()
            assert mixed["state"] == "mixed_transition" and mixed["active_engine"] == "queue_storage"
            new = await ops.insert(Work(3), queue="t")  # routed to queue storage
            await wait_for_state(ops, new.id, "completed")
            assert seen_new == [3]
            assert await _canonical_count(ops) == 2

            with pytest.raises(awa.AwaError, match="cannot finalize while canonical live backlog is 2"):
                await ops.storage_finalize()
            status = json.loads(await ops.storage_status())
            assert status["finalize_blockers"] == ["canonical live backlog is 2"]

            seen_old: list[int] = []
            drain = _worker(qdb, seen_old, "t")
            await drain.start([("t", 2)], storage_transition_role="canonical_drain", **FAST)
            try:
                await wait_for_state(ops, old.id, "completed")
                await wait_for_state(ops, during_prepare.id, "completed")
            finally:
                await drain.shutdown()
                await drain.close()
            assert sorted(seen_old) == [1, 2]

            final = await ops.storage_finalize()
            assert final["state"] == "active" and final["current_engine"] == "queue_storage"
            assert final["finalized_at"] is not None
            # Canonical takes no new job now, whoever writes it.
            tx = await ops.transaction()
            with pytest.raises(awa.AwaError, match="canonical storage takes no new jobs: the active storage "
                               "engine is queue storage"):
                await tx.execute("INSERT INTO awa.jobs (kind, queue, args) VALUES ('x', 't', '{}')")
            await tx.rollback()
            after = await ops.insert(Work(4), queue="t")
            await wait_for_state(ops, after.id, "completed")
        finally:
            await target.shutdown()
            await target.close()
        assert sorted(seen_new) == [3, 4]


async def test_abort_goes_back_to_canonical_only_when_queue_storage_is_empty_and_unworked(qdb: str) -> None:
    async with awa.AsyncClient(qdb) as ops:
        await ops.storage_prepare()
        back = await ops.storage_abort()
        assert back["state"] == "canonical" and back["prepared_engine"] is None
        with pytest.raises(awa.AwaError, match="storage abort is only allowed from prepared or mixed_transition state"):
            await ops.storage_abort()

        await ops.storage_prepare()
        seen: list[int] = []
        target = _worker(qdb, seen, "a")
        await target.start([("a", 1)], storage_transition_role="queue_storage_target", **FAST)
        await ops.storage_enter_mixed_transition()
        try:
            with pytest.raises(awa.AwaError, match="cannot abort mixed transition while 1 queue-storage "
                               r"runtime\(s\) are still live"):
                await ops.storage_abort()
        finally:
            await target.shutdown()
            await target.close()
        stranded = await ops.insert(Work(1), queue="a")  # queue storage, and nobody works it now
        with pytest.raises(awa.AwaError, match=r"cannot abort mixed transition while queue storage contains 1 row\(s\)"):
            await ops.storage_abort()
        assert (await ops.get_job(stranded.id)).state == "available"
        assert json.loads(await ops.storage_status())["state"] == "mixed_transition"


async def test_storage_status_reports_awa_pg_keys(qdb: str) -> None:
    with awa.Client(qdb) as client:
        text = client.storage_status()
        status: dict[str, Any] = json.loads(text)
        assert "\n" in text  # pretty, as awa-pg prints it
        assert set(status) == {
            "current_engine", "active_engine", "prepared_engine", "state", "transition_epoch", "details",
            "entered_at", "updated_at", "finalized_at", "canonical_live_backlog",
            "prepared_queue_storage_schema", "prepared_schema_ready", "live_runtime_capability_counts",
            "can_enter_mixed_transition", "enter_mixed_transition_blockers", "can_finalize",
            "finalize_blockers",
        }
        assert status["state"] == "canonical" and status["transition_epoch"] == 0
        assert status["enter_mixed_transition_blockers"][0] == "state is 'canonical' (expected 'prepared')"
        assert status["finalize_blockers"][0] == "state is 'canonical' (expected 'mixed_transition')"


def test_the_cli_steps_through_a_transition_and_reports_refusals(qdb: str) -> None:
    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        return subprocess.run([sys.executable, "-m", "awa", "--database-url", qdb, "storage", *argv],
                              capture_output=True, text=True, env=env, timeout=120)

    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "canonical"
    prepared = cli("prepare", "--schema", "awa_move", "--json")
    assert prepared.returncode == 0, prepared.stderr
    assert json.loads(prepared.stdout)["details"] == {"schema": "awa_move"}
    refused = cli("enter-mixed-transition")
    assert refused.returncode == 1
    assert refused.stderr == 'awa: error: queue storage schema "awa_move" is not prepared\n'
    installed = cli("prepare-queue-storage-schema", "--schema", "awa_move", "--queue-slot-count", "4")
    assert installed.returncode == 0, installed.stderr
    assert json.loads(cli("status").stdout)["prepared_schema_ready"] is True
    bad = cli("prepare-queue-storage-schema", "--schema", "Bad-Name")
    assert bad.returncode == 2 and "invalid SQL identifier: Bad-Name" in bad.stderr
    aborted = cli("abort")
    assert aborted.returncode == 0 and "storage state: canonical" in aborted.stdout
    late = cli("finalize")
    assert late.returncode == 1
    assert late.stderr == "awa: error: storage finalize is only allowed from mixed_transition state\n"


async def test_unique_keys_hold_on_queue_storage_and_follow_ups_are_deduplicated(qdb: str) -> None:
    async with awa.AsyncClient(qdb) as client:
        await client.install_queue_storage()
        first = await client.insert(Work(1), queue="u", unique_opts={"by_args": True})
        with pytest.raises(awa.UniqueConflict):
            await client.insert(Work(1), queue="u", unique_opts={"by_args": True})
        tx = await client.transaction()
        with pytest.raises(awa.UniqueConflict):
            await tx.insert(Work(1), queue="u", unique_opts={"by_args": True})
        other = await tx.insert(Work(2), queue="u", unique_opts={"by_args": True})  # the transaction goes on
        await tx.commit()
        assert (await client.get_job(other.id)).state == "available"

        worker = awa.AsyncClient(qdb)
        staged: list[int] = []

        @worker.task(Work, queue="u")
        async def handle(job: awa.Job) -> None:
            staged.append(job.args.n)
            if job.args.n in (1, 2):
                # Both completions stage the same unique follow-up: one is inserted.
                job.enqueue_on_completion(Work(100), queue="u", unique_opts={"by_args": True})

        await worker.start([("u", 2)], **FAST)
        try:
            await wait_for_state(client, first.id, "completed")
            await wait_for_state(client, other.id, "completed")
            await wait_for(lambda: 100 in staged, what="the follow-up ran")
        finally:
            await worker.shutdown()
            await worker.close()
        assert sorted(staged) == [1, 2, 100]
        # Completed is among the default unique states: the key stays held.
        with pytest.raises(awa.UniqueConflict):
            await client.insert(Work(100), queue="u", unique_opts={"by_args": True})


def test_bridge_inserts_on_the_applications_connection_go_to_queue_storage(qdb: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from awa.bridge import insert_job_sync

    with awa.Client(qdb) as client:
        client.install_queue_storage()
        with psycopg.connect(qdb) as conn:
            row = insert_job_sync(conn, Work(7), queue="b", tags=["t"], unique_opts={"by_args": True})
            with pytest.raises(awa.UniqueConflict):
                insert_job_sync(conn, Work(7), queue="b", unique_opts={"by_args": True})
            conn.rollback()  # the application's transaction: nothing of it stays
        with pytest.raises(awa.JobNotFound):
            client.get_job(row["id"])
        with psycopg.connect(qdb) as conn:
            row = insert_job_sync(conn, Work(8), queue="b", tags=["t"])
            conn.commit()
        job = client.get_job(row["id"])
        assert (job.state, job.tags, row["state"], row["attempt"], row["tags"]) == (
            "available", ["t"], "available", 0, ["t"])
        tx = client.transaction()
        assert tx.fetch_one("SELECT count(*)::int AS n FROM awa.canonical_jobs")["n"] == 0
        tx.rollback()


async def test_an_older_librarys_functions_are_replaced_by_migrate_and_jobs_run_on(qdb: str) -> None:
    """Queue storage's functions are versioned (``awa.qs_substrate``): a substrate an older
    library installed (here: no version kept, an old overload of ``qs_claim`` and a
    ``qs_claim_queue`` that hands out nothing) gets this library's functions from ``migrate()``,
    with its jobs where they were."""
    async with awa.AsyncClient(qdb) as client:
        await client.install_queue_storage()
        waiting = await client.insert(Work(7), queue="upgraded")
        tx = await client.transaction()
        for sql in [
            "DROP TABLE awa.qs_substrate",
            "CREATE FUNCTION awa.qs_claim(p_queue text, p_priority smallint, p_n integer) "
            "RETURNS SETOF bigint LANGUAGE sql AS 'SELECT NULL::bigint WHERE false'",
            "DROP FUNCTION awa.qs_claim_queue(text, integer, interval, interval, smallint)",
            "CREATE FUNCTION awa.qs_claim_queue(p_queue text, p_n integer, p_deadline interval DEFAULT NULL, "
            "p_aging interval DEFAULT NULL) RETURNS SETOF awa.ready_entries LANGUAGE plpgsql "
            "AS 'BEGIN RETURN; END'",
        ]:
            await tx.execute(sql)
        await tx.commit()

        await client.migrate()
        tx = await client.transaction()
        try:
            version = await tx.fetch_one("SELECT version FROM awa.qs_substrate")
            claims = await tx.fetch_one(
                "SELECT count(*)::int AS n FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace "
                "WHERE s.nspname = 'awa' AND p.proname = 'qs_claim'")
        finally:
            await tx.rollback()
        assert version["version"] >= 2
        assert claims["n"] == 1
        assert (await client.get_job(waiting.id)).state == "available"

        seen: list[int] = []
        worker = _worker(qdb, seen, "upgraded")
        await worker.start([("upgraded", 1)], **FAST)
        try:
            await wait_for_state(client, waiting.id, "completed")
        finally:
            await worker.shutdown()
            await worker.close()
        assert seen == [7]


async def test_a_canonical_job_retried_after_the_move_goes_to_queue_storage_and_runs(qdb: str) -> None:
    from helpers import fail_jobs

    seen: list[int] = []
    client = _worker(qdb, seen, "old")
    try:
        # Failed on canonical, before queue storage took new jobs (finished jobs do not stop
        # the install); a runtime on queue storage no longer works canonical's table.
        jobs = [await client.insert(Work(n), queue="old") for n in (1, 2, 3)]
        keyed = await client.insert(Work(4), queue="old", unique_opts={})
        await fail_jobs(client, [j.id for j in jobs] + [keyed.id])
        await client.install_queue_storage()
        retried = await client.retry(jobs[0].id)
        assert (retried.id, retried.state) == (jobs[0].id, "available")
        again = await client.retry_failed(queue="old")
        assert sorted(j.id for j in again.jobs) == [jobs[1].id, jobs[2].id, keyed.id] and again.matched == 3
        assert await _canonical_count(client) == 0, "every retried job left canonical's table"
        # Its unique key went with it: held on queue storage now.
        with pytest.raises(awa.UniqueConflict):
            await client.insert(Work(4), queue="old", unique_opts={})
        await client.start([("old", 4)], **FAST)
        await wait_for(lambda: sorted(seen) == [1, 2, 3, 4], what="the retried jobs to run on queue storage")
        await client.shutdown()
        assert {j.state for j in await client.list_jobs(queue="old")} == {"completed"}
    finally:
        await client.close()


async def test_a_retry_whose_unique_key_was_taken_meanwhile_is_a_unique_conflict(qdb: str) -> None:
    from helpers import fail_jobs

    async with awa.AsyncClient(qdb) as client:
        # On canonical, a canonical job; then on queue storage, a job of its own: both refuse
        # typed and change nothing.
        for step in ("canonical", "queue_storage"):
            if step == "queue_storage":
                await client.install_queue_storage()
            old = await client.insert(Work(5), kind=f"k_{step}", unique_opts={})
            await client.cancel(old.id)
            taker = await client.insert(Work(5), kind=f"k_{step}", unique_opts={})
            with pytest.raises(awa.UniqueConflict, match=f"k_{step}"):
                await client.retry(old.id)
            assert (await client.get_job(old.id)).state == "cancelled"
            assert (await client.get_job(taker.id)).state == "available"
            await fail_jobs(client, [taker.id])
            taken = await client.insert(Work(5), kind=f"k_{step}", unique_opts={})
            with pytest.raises(awa.UniqueConflict):
                await client.retry_failed(kind=f"k_{step}")
            assert (await client.get_job(taker.id)).state == "failed", "nothing retried"
            if step == "canonical":
                await client.cancel(taken.id)
                canonical_failed = taker.id
        # Failed jobs on both engines, one of them blocked by its key: one call, nothing
        # retried on either (the canonical one would have moved to queue storage).
        with pytest.raises(awa.UniqueConflict):
            await client.retry_failed(queue="default")
        assert (await client.get_job(canonical_failed)).state == "failed"
        assert await _canonical_count(client) >= 1, "the canonical failed job did not move"
