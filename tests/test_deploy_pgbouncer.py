"""Behind PgBouncer in transaction pooling mode (issue 14, item 3).

Debian's ``pgbouncer`` (1.18 on Debian 12: no protocol-level prepared statement support) runs
in ``pool_mode = transaction`` with a server pool of 4 in front of a private cluster, and the
clients connect with ``?pool_mode=transaction`` (docs/deploying.md). A fleet of three clients
(twelve client connections over four server sessions) drains jobs that stage follow-ups, runs
external callbacks, inserts with COPY, takes the maintenance leadership and rescues the job of
a worker process killed with SIGKILL. A direct connection (session mode) is used only to
observe. On the queue-storage leg (``AWA_ENGINE=queue_storage``) the fleet and the killed
worker run on queue storage, installed through PgBouncer too.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from typing import Any, AsyncIterator, Iterator

import pytest

import awa
import test_roles
from clusters import Bouncer, Cluster
from conftest import ENGINE
from helpers import FAST, wait_for, wait_for_state


APP_ROLE = "awa_app_bouncer"


@dataclasses.dataclass
class Setup:
    cluster: Cluster
    bouncer: Bouncer

    def database(self) -> tuple[str, str]:
        """A new database: (URL through PgBouncer, direct URL)."""
        name = f"bnc_{uuid.uuid4().hex[:10]}"
        self.cluster.psql(f'CREATE DATABASE "{name}"')
        return self.bouncer.url(name), f"postgres://postgres@127.0.0.1:{self.cluster.port}/{name}"


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    cluster = Cluster()
    try:
        bouncer = Bouncer(cluster, pool_size=4, users=("postgres", APP_ROLE))
        try:
            yield Setup(cluster, bouncer)
        finally:
            bouncer.stop()
    finally:
        cluster.stop()


@dataclasses.dataclass
class Parent:
    n: int


@dataclasses.dataclass
class Child:
    parent: int


@dataclasses.dataclass
class Charge:
    order: int


@dataclasses.dataclass
class Slow:
    tag: str


async def count(direct: awa.AsyncClient, sql: str) -> int:
    async with direct.transaction() as tx:
        row = await tx.fetch_one(sql)
    return int(next(iter(row.values())))


@pytest.fixture
async def observer(setup: Setup) -> AsyncIterator[tuple[str, awa.AsyncClient]]:
    via_bouncer, direct_url = setup.database()
    direct = awa.AsyncClient(direct_url, max_connections=1)
    try:
        yield via_bouncer, direct
    finally:
        await direct.close()


async def test_a_fleet_drains_stages_and_runs_callbacks_through_pgbouncer(
        observer: tuple[str, awa.AsyncClient]) -> None:
    url, direct = observer
    fleet = [awa.AsyncClient(url, max_connections=4) for _ in range(3)]
    await fleet[0].migrate()  # through PgBouncer as well
    if ENGINE == "queue_storage":
        await fleet[0].install_queue_storage()
    runs: dict[int, int] = {}
    tokens: dict[int, str] = {}
    for c in fleet:
        @c.task(Parent)
        async def parent(job: awa.Job) -> None:
            runs[job.args.n] = runs.get(job.args.n, 0) + 1
            job.enqueue_on_completion(Child(parent=job.args.n))

        @c.task(Child)
        async def child(job: awa.Job) -> None:
            pass

        @c.task(Charge)
        async def charge(job: awa.Job) -> Any:
            token = await job.register_callback(timeout_seconds=120)
            tokens[job.args.order] = token
            return awa.WaitForCallback(token)

    n = 300
    await fleet[0].insert_many([Parent(n=i) for i in range(n // 2)])
    await fleet[1].enqueue_many_copy([Parent(n=i) for i in range(n // 2, n)])
    charges = [await fleet[2].insert(Charge(order=i)) for i in range(2)]
    for c in fleet:
        await c.start([("default", 8)], **FAST)
    try:
        await wait_for(lambda: _completed_children(direct, n), timeout=120, what=f"{n} follow-ups completed")
        assert await count(direct, "SELECT count(*) FROM awa.jobs WHERE kind = 'parent' AND state <> 'completed'") == 0
        # Each parent ran once and staged exactly one follow-up.
        assert sorted(runs) == list(range(n)) and set(runs.values()) == {1}
        assert await count(direct, "SELECT count(*) FROM (SELECT args->>'parent' FROM awa.jobs "
                                   "WHERE kind = 'child' GROUP BY 1 HAVING count(*) <> 1) d") == 0
        # External callbacks through PgBouncer.
        for j in charges:
            await wait_for_state(fleet[0], j.id, "waiting_external", timeout=30)
        await wait_for(lambda: len(tokens) == 2, what="two callback tokens")
        assert (await fleet[1].complete_external(tokens[0], {"ok": True})).state == "completed"
        assert (await fleet[2].fail_external(tokens[1], "declined")).state == "failed"
        # One maintenance leader among the three, through PgBouncer.
        async def one_leader() -> bool:
            leaders = [(await c.health_check()).leader for c in fleet]
            return leaders.count(True) == 1
        await wait_for(one_leader, timeout=30, what="one leader")
        # PgBouncer multiplexed: the fleet's twelve connections used at most four sessions.
        sessions = await count(direct, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND pid <> pg_backend_pid() AND application_name = ''")
        assert sessions <= 4, sessions
    finally:
        for c in fleet:
            await c.shutdown()
            await c.close()


async def _completed_children(direct: awa.AsyncClient, n: int) -> bool:
    return await count(direct, "SELECT count(*) FROM awa.jobs WHERE kind = 'child' AND state = 'completed'") == n


WORKER = textwrap.dedent("""
    import asyncio, dataclasses, sys
    import awa

    @dataclasses.dataclass
    class Slow:
        tag: str

    async def main() -> None:
        client = awa.AsyncClient(sys.argv[1])

        @client.task(Slow)
        async def slow(job: awa.Job) -> None:
            await asyncio.Event().wait()  # until SIGKILL

        await client.start([("default", 1)], poll_interval_ms=50, heartbeat_interval_ms=100,
                           heartbeat_staleness_ms=1500, leader_election_interval_ms=100)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


async def test_a_killed_worker_is_rescued_through_pgbouncer(observer: tuple[str, awa.AsyncClient]) -> None:
    url, direct = observer
    producer = awa.AsyncClient(url, max_connections=2)
    await producer.migrate()
    if ENGINE == "queue_storage":
        await producer.install_queue_storage()
    job = await producer.insert(Slow(tag="x"))
    proc = subprocess.Popen([sys.executable, "-c", WORKER, url], env={**os.environ})
    survivor = awa.AsyncClient(url, max_connections=4)
    try:
        running = await wait_for_state(direct, job.id, "running", timeout=60)
        assert running.attempt == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        attempts: list[int] = []

        @survivor.task(Slow)
        async def slow(j: awa.Job) -> None:
            attempts.append(j.attempt)

        await survivor.start([("default", 1)], **{**FAST, "heartbeat_staleness_ms": 1500})
        done = await wait_for_state(direct, job.id, "completed", timeout=60)
        assert attempts == [2] and done.attempt == 2
        assert (await survivor.health_check()).leader is True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await survivor.shutdown()
        await survivor.close()
        await producer.close()


def test_pool_mode_session_through_pgbouncer_in_transaction_mode_is_what_breaks(setup: Setup) -> None:
    """The control: without ``pool_mode=transaction`` sqlx's named statements collide across
    PgBouncer's server sessions, the failure awa-pg 0.6.9 shows. Proves that the fleet test
    above exercises what the mode fixes."""
    url, direct_url = setup.database()
    with awa.Client(direct_url) as direct:
        direct.migrate()
    session_url = url.replace("pool_mode=transaction", "pool_mode=session")
    clients = [awa.Client(session_url, max_connections=3) for _ in range(3)]
    try:
        errors = []
        for _ in range(20):
            for c in clients:
                try:
                    c.insert(Slow(tag="y"))
                except awa.DatabaseError as e:
                    errors.append(str(e))
        assert any("prepared statement" in e for e in errors), errors[:3]
    finally:
        for c in clients:
            c.close()


async def test_the_least_privilege_role_works_through_pgbouncer(setup: Setup) -> None:
    """tests/test_roles.py's worker, producer and admin scenario, as a role holding only the
    documented grants, through PgBouncer in transaction mode."""
    url, direct_url = setup.database()
    with awa.Client(direct_url) as owner:
        owner.migrate()
        if ENGINE == "queue_storage":
            owner.install_queue_storage()
    db = url.split("/")[-1].split("?")[0]
    setup.cluster.psql(f'CREATE ROLE "{APP_ROLE}" LOGIN')
    try:
        grants = "\n".join(ln for ln in test_roles.documented_grants(APP_ROLE).splitlines()
                           if not ln.strip().startswith("--"))
        setup.cluster.psql(grants, db=db)
        await test_roles.test_worker_producer_and_admin_calls_run_as_the_application_role(
            setup.bouncer.url(db, user=APP_ROLE))
    finally:
        setup.cluster.psql(f'DROP OWNED BY "{APP_ROLE}"', db=db)
        setup.cluster.psql(f'DROP ROLE "{APP_ROLE}"')
