"""Queue and job-kind descriptors (awa-pg 0.6.9's ``queue_descriptor`` / ``job_kind_descriptor``
and ``start(descriptor_retention_days=...)``; docs/operating.md, "Descriptors"): declared,
written by ``start()``, refreshed with the runtime registry, pruned by the maintenance leader
after the retention, refused when bad, and shown by ``/api/queues`` and ``/api/kinds``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import pytest

import awa
from awa._serve import ServeConfig
from helpers import FAST, wait_for


@dataclass
class DescUnit:
    n: int


async def rows(client: awa.AsyncClient, sql: str, *args: Any) -> list[dict[str, Any]]:
    async with client.transaction() as tx:
        return await tx.fetch_all(sql, *args)


async def queue_row(client: awa.AsyncClient, queue: str) -> Optional[dict[str, Any]]:
    found = await rows(client, "SELECT *, extract(epoch FROM now() - last_seen_at)::float8 AS age "
                               "FROM awa.queue_descriptors WHERE queue = $1", queue)
    return found[0] if found else None


def declare(client: awa.AsyncClient, display_name: str = "Outbound email") -> None:
    @client.task(DescUnit, queue="desc_q")
    async def handle(job: awa.Job) -> None:
        return None

    client.queue_descriptor(
        "desc_q", display_name=display_name, description="Sends what the app renders.",
        owner="growth@example.com", docs_url="https://runbook.example.com/email",
        tags=["user-facing", "email"], extra={"tier": 1, "pager": {"team": "growth"}})
    client.job_kind_descriptor("desc_unit", display_name="Send one email")
    client.job_kind_descriptor("elsewhere_kind", description="Handled by another service.")


async def test_start_writes_declared_and_bare_descriptors(client: awa.AsyncClient) -> None:
    declare(client)
    await client.start([("desc_q", 1), ("plain_q", 1)], **FAST)
    try:
        # start() returned: the rows are there already (written before the runtime starts).
        q = {r["queue"]: r for r in await rows(client, "SELECT * FROM awa.queue_descriptors")}
        assert set(q) == {"desc_q", "plain_q"}
        d = q["desc_q"]
        assert (d["display_name"], d["description"], d["owner"], d["docs_url"]) == (
            "Outbound email", "Sends what the app renders.", "growth@example.com",
            "https://runbook.example.com/email")
        assert d["tags"] == ["user-facing", "email"]
        assert d["extra"] == {"tier": 1, "pager": {"team": "growth"}}
        assert len(d["descriptor_hash"]) == 64 and d["sync_interval_ms"] == FAST["heartbeat_interval_ms"]
        bare = q["plain_q"]  # worked, not described: listed with no metadata
        assert bare["display_name"] is None and bare["tags"] == [] and bare["extra"] == {}
        k = {r["kind"]: r for r in await rows(client, "SELECT * FROM awa.job_kind_descriptors")}
        assert set(k) == {"desc_unit", "elsewhere_kind"}
        assert k["desc_unit"]["display_name"] == "Send one email"
        assert k["elsewhere_kind"]["description"] == "Handled by another service."
        # The registry row carries the declared hashes (what the API's mismatch flag reads).
        async def hashes() -> Any:
            found = await rows(client, "SELECT queue_descriptor_hashes AS q, job_kind_descriptor_hashes AS k "
                                       "FROM awa.runtime_instances")
            return found[0] if found else None
        reg = await wait_for(hashes, what="the registry row")
        assert reg["q"] == {"desc_q": d["descriptor_hash"]}
        assert set(reg["k"]) == {"desc_unit", "elsewhere_kind"}
    finally:
        await client.shutdown()


async def test_heartbeats_refresh_and_a_change_moves_updated_at(database_url: str) -> None:
    first = awa.AsyncClient(database_url, max_connections=4)
    declare(first)
    await first.start([("desc_q", 1)], **FAST)
    try:
        before = await queue_row(first, "desc_q")
        assert before is not None
        await first._execute("UPDATE awa.queue_descriptors SET last_seen_at = now() - interval '1 hour'")

        async def refreshed() -> Any:
            row = await queue_row(first, "desc_q")
            return row if row is not None and row["age"] < 60 else None
        again = await wait_for(refreshed, what="a heartbeat refreshes last_seen_at")
        assert again["updated_at"] == before["updated_at"]  # same content: not an update
        assert again["descriptor_hash"] == before["descriptor_hash"]
    finally:
        await first.shutdown()
        await first.close()
    second = awa.AsyncClient(database_url, max_connections=4)
    declare(second, display_name="Transactional email")
    await second.start([("desc_q", 1)], **FAST)
    try:
        after = await queue_row(second, "desc_q")
        assert after is not None and after["display_name"] == "Transactional email"
        assert after["descriptor_hash"] != before["descriptor_hash"]
        assert after["updated_at"] > before["updated_at"] and after["created_at"] == before["created_at"]
    finally:
        await second.shutdown()
        await second.close()


async def test_a_client_that_does_not_describe_a_queue_keeps_what_another_declared(database_url: str) -> None:
    describer = awa.AsyncClient(database_url, max_connections=4)
    declare(describer)
    await describer.start([("desc_q", 1)], **FAST)
    await describer.shutdown()
    await describer.close()
    plain = awa.AsyncClient(database_url, max_connections=4)

    @plain.task(DescUnit, queue="desc_q")
    async def handle(job: awa.Job) -> None:
        return None

    await plain._execute("UPDATE awa.queue_descriptors SET last_seen_at = now() - interval '1 hour'")
    await plain.start([("desc_q", 1)], **FAST)
    try:
        row = await queue_row(plain, "desc_q")
        assert row is not None and row["age"] < 60  # refreshed ...
        assert row["display_name"] == "Outbound email"  # ... not erased
    finally:
        await plain.shutdown()
        await plain.close()


# A runtime that died a day ago: its row goes on the same prune tick as the descriptors, so its
# absence proves a tick ran.
DEAD_RUNTIME = ("INSERT INTO awa.runtime_instances (pid, version, snapshot_interval_ms, last_seen_at) "
                "VALUES (1, 'dead', 1000, now() - interval '1 day')")
GHOSTS = [
    "INSERT INTO awa.queue_descriptors (queue, display_name, descriptor_hash, last_seen_at) "
    "VALUES ('ghost_old', 'Gone', 'h', now() - interval '2 days'), "
    "('ghost_recent', 'Recent', 'h', now() - interval '6 hours')",
    "INSERT INTO awa.job_kind_descriptors (kind, descriptor_hash, last_seen_at) "
    "VALUES ('ghost_kind_old', 'h', now() - interval '2 days')",
    DEAD_RUNTIME,
]


async def _names(client: awa.AsyncClient) -> set[str]:
    q = await rows(client, "SELECT queue AS n FROM awa.queue_descriptors")
    k = await rows(client, "SELECT kind AS n FROM awa.job_kind_descriptors")
    return {r["n"] for r in q + k}


async def _dead_runtime_gone(client: awa.AsyncClient) -> bool:
    return not await rows(client, "SELECT 1 FROM awa.runtime_instances WHERE version = 'dead'")


async def test_the_leader_prunes_descriptors_past_the_retention(client: awa.AsyncClient) -> None:
    declare(client)
    for sql in GHOSTS:
        await client._execute(sql)
    await client.start([("desc_q", 1)], descriptor_retention_days=1, prune_interval_ms=100, **FAST)
    try:
        async def pruned() -> bool:
            return "ghost_old" not in await _names(client)
        await wait_for(pruned, what="the two-day-old descriptors are pruned")
        await wait_for(lambda: _dead_runtime_gone(client), what="a prune tick")
        names = await _names(client)
        assert "ghost_kind_old" not in names
        assert {"ghost_recent", "desc_q", "desc_unit", "elsewhere_kind"} <= names  # within a day / live
    finally:
        await client.shutdown()


async def test_retention_zero_keeps_descriptors(client: awa.AsyncClient) -> None:
    declare(client)
    for sql in GHOSTS:
        await client._execute(sql)
    await client.start([("desc_q", 1)], descriptor_retention_days=0, prune_interval_ms=100, **FAST)
    try:
        await wait_for(lambda: _dead_runtime_gone(client), what="a prune tick")
        # A second tick, so the first one's descriptor step (after the registry's) is done too.
        await client._execute(DEAD_RUNTIME)
        await wait_for(lambda: _dead_runtime_gone(client), what="another prune tick")
        assert {"ghost_old", "ghost_kind_old", "ghost_recent"} <= await _names(client)
    finally:
        await client.shutdown()


# ----- bad input -------------------------------------------------------------------------------

BAD = [
    ("display_name", {"display_name": "d" * 201}, "display_name is 201 characters; the limit is 200"),
    ("description", {"description": "d" * 2001}, "description is 2001 characters; the limit is 2000"),
    ("owner", {"owner": "o" * 201}, "owner is 201 characters; the limit is 200"),
    ("docs_url", {"docs_url": "https://" + "d" * 2041}, "docs_url is 2049 characters; the limit is 2048"),
    ("tags", {"tags": [str(i) for i in range(21)]}, "tags has 21 entries; the limit is 20"),
    ("nul", {"owner": "a\x00b"}, "owner contains a NUL byte"),
    ("extra_nul", {"extra": {"k": "a\x00"}}, "extra.k contains a NUL byte"),
]


@pytest.mark.parametrize(("case", "fields", "message"), BAD, ids=[b[0] for b in BAD])
async def test_a_bad_declaration_is_refused_where_it_is_made(
        client: awa.AsyncClient, case: str, fields: dict[str, Any], message: str) -> None:
    for declare_one in (client.queue_descriptor, client.job_kind_descriptor):
        with pytest.raises(awa.ConfigError, match=message) as info:
            declare_one("desc_q", **fields)
        assert isinstance(info.value, awa.ValidationError) and isinstance(info.value, ValueError)


async def test_names_and_types_are_checked(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ConfigError, match="queue descriptor name must not be empty"):
        client.queue_descriptor("")
    with pytest.raises(awa.ConfigError, match="kind is 201 characters"):
        client.job_kind_descriptor("k" * 201)
    with pytest.raises(TypeError, match="tags must be a list of str"):
        client.queue_descriptor("desc_q", tags=[1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="tags must be a list of str"):
        client.queue_descriptor("desc_q", tags="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="extra must be JSON-serializable"):
        client.queue_descriptor("desc_q", extra={"a": object()})
    with pytest.raises(TypeError):
        client.queue_descriptor("desc_q", "positional")  # type: ignore[misc]
    # awa-pg stores any JSON as extra, and a docs_url of any text (the UI links only http(s)).
    client.queue_descriptor("desc_q", extra=[1, 2], docs_url="javascript:alert(1)")


async def test_start_refuses_a_descriptor_of_a_queue_it_does_not_work(client: awa.AsyncClient) -> None:
    declare(client)
    client.queue_descriptor("other_q", display_name="Other")
    with pytest.raises(awa.ConfigError, match="queue descriptor declared for unknown queue \"other_q\""):
        await client.start([("desc_q", 1)], **FAST)
    assert not await rows(client, "SELECT 1 FROM awa.queue_descriptors")  # nothing written


@pytest.mark.parametrize("days", [-1, float("nan"), float("inf"), 3651])
async def test_descriptor_retention_days_is_range_checked(client: awa.AsyncClient, days: float) -> None:
    declare(client)
    with pytest.raises(awa.ConfigError, match="descriptor_retention_days is"):
        await client.start([("desc_q", 1)], descriptor_retention_days=days, **FAST)


# ----- the web API -----------------------------------------------------------------------------


async def test_the_api_shows_descriptors(client: awa.AsyncClient, database_url: str) -> None:
    from test_serve import start as serve_start

    declare(client)
    await client.start([("desc_q", 1), ("plain_q", 1)], **FAST)
    try:
        for api in serve_start(ServeConfig(database_url, port=0)):
            queues = {q["queue"]: q for q in api.get("/api/queues")}
            assert set(queues) == {"desc_q", "plain_q"}  # listed with no jobs: they are described
            q = api.get("/api/queues/desc_q")
            # The running client refreshes its descriptors on every snapshot, so the time it
            # last did may move between the two reads; everything else is the same.
            def steady(d: dict[str, Any]) -> dict[str, Any]:
                return {k: v for k, v in d.items() if k != "descriptor_last_seen_at"}

            assert steady(q) == steady(queues["desc_q"])
            assert (q["display_name"], q["owner"], q["docs_url"]) == (
                "Outbound email", "growth@example.com", "https://runbook.example.com/email")
            assert q["description"] == "Sends what the app renders." and q["tags"] == ["user-facing", "email"]
            assert q["extra"] == {"tier": 1, "pager": {"team": "growth"}}
            assert q["descriptor_last_seen_at"].endswith("Z")
            assert q["descriptor_stale"] is False and q["descriptor_mismatch"] is False
            assert queues["plain_q"]["display_name"] is None and queues["plain_q"]["counts"]["available"] == 0
            kinds = {k["kind"]: k for k in api.get("/api/kinds")}
            assert set(kinds) == {"desc_unit", "elsewhere_kind"}
            assert kinds["desc_unit"]["display_name"] == "Send one email"

            # Another live client declaring desc_q differently; an old, unrefreshed kind row.
            await client._execute(
                "INSERT INTO awa.runtime_instances (pid, version, snapshot_interval_ms, queue_descriptor_hashes) "
                "VALUES (2, 'other', 60000, $1::jsonb)", json.dumps({"desc_q": "f" * 64}))
            await client._execute("INSERT INTO awa.job_kind_descriptors (kind, descriptor_hash, last_seen_at) "
                                  "VALUES ('old_kind', 'h', now() - interval '1 day')")
            assert api.get("/api/queues/desc_q")["descriptor_mismatch"] is True
            assert api.get("/api/queues/plain_q")["descriptor_mismatch"] is False
            kinds = {k["kind"]: k for k in api.get("/api/kinds")}
            assert kinds["old_kind"]["descriptor_stale"] is True and kinds["desc_unit"]["descriptor_stale"] is False
            assert api.status("GET", "/api/queues/nowhere")[0] == 404
    finally:
        await client.shutdown()
