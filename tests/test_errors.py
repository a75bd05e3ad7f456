"""Errors say what happened (issue 12, items 3, 4 and 5).

- Exception classes read as ``awa.<Name>`` in tracebacks and pickle.
- ``SchemaNotMigrated`` only when Awa's own schema is missing; a user's own typo is a
  ``DatabaseError`` with the server's message and SQLSTATE.
- Values the engine cannot store exactly (integers beyond 64 bits, NaN/infinity, nesting past
  ``MAX_JSON_DEPTH``) are refused with ``ValidationError`` naming the path, on every path that
  takes user JSON.
- Every duration, interval and count keyword is range-checked: ``ValidationError`` naming the
  field and the range, never a panic in Rust.
- A claimed job whose kind has no handler fails with ``UnknownJobKind`` in its errors.
"""

from __future__ import annotations

import dataclasses
import pickle
import traceback
from typing import Any

import awa
import pytest
from awa import _awa
from awa.testing import AwaTestClient
from helpers import FAST, wait_for_state

EXCEPTIONS = [
    "AwaError", "UniqueConflict", "SchemaNotMigrated", "UnknownJobKind", "SerializationError",
    "ValidationError", "TerminalError", "StagingError", "DatabaseError", "CallbackNotFound",
    "JobNotFound", "ForeignSchema",
]


# ----- item 5: names, pickling, SQLSTATE, SchemaNotMigrated -------------------------------------

@pytest.mark.parametrize("name", EXCEPTIONS)
def test_exceptions_are_named_as_the_package_exports_them(name: str) -> None:
    cls = getattr(awa, name)
    assert cls.__module__ == "awa" and cls.__qualname__ == name and cls.__name__ == name
    assert repr(cls) == f"<class 'awa.{name}'>"
    exc = cls("boom")
    assert repr(exc) == f"{name}('boom')"
    text = "".join(traceback.format_exception_only(type(exc), exc))
    assert text == f"awa.{name}: boom\n"
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and back.args == ("boom",)


async def test_a_typo_in_user_sql_is_a_database_error_with_the_servers_message(client: awa.AsyncClient) -> None:
    tx = await client.transaction()
    try:
        with pytest.raises(awa.DatabaseError) as raised:
            await tx.fetch_all("SELECT * FROM orderz")
    finally:
        await tx.rollback()
    assert not isinstance(raised.value, awa.SchemaNotMigrated)
    assert raised.value.sqlstate == "42P01"
    assert str(raised.value) == 'database error (SQLSTATE 42P01): relation "orderz" does not exist'
    with pytest.raises(awa.DatabaseError, match=r"SQLSTATE 42883.*function no_such_fn"):
        await client._execute("SELECT no_such_fn()")
    back = pickle.loads(pickle.dumps(raised.value))
    assert back.sqlstate == "42P01" and str(back) == str(raised.value)
    assert awa.DatabaseError("no code").sqlstate is None


def test_schema_not_migrated_names_the_missing_awa_object(empty_database: str) -> None:
    with awa.Client(empty_database) as c:
        with pytest.raises(awa.SchemaNotMigrated, match=r'relation "awa\.canonical_jobs" does not exist.*call migrate\(\)'):
            c.insert({"n": 1}, kind="k")
        with pytest.raises(awa.SchemaNotMigrated):
            c.enqueue_many_copy([{"n": 1}], kind="k")
        # The caller's own missing table in the same unmigrated database is not "migrate".
        with pytest.raises(awa.DatabaseError) as raised:
            c._run(c._async._execute("SELECT * FROM my_table"))
        assert not isinstance(raised.value, awa.SchemaNotMigrated)
        assert raised.value.sqlstate == "42P01"


# ----- item 5: UnknownJobKind --------------------------------------------------------------------

@dataclasses.dataclass
class Known:
    n: int


async def test_a_claimed_job_of_an_unknown_kind_fails_naming_unknown_job_kind(client: awa.AsyncClient) -> None:
    @client.task(Known, queue="mixed")
    async def known(job: awa.Job) -> None:
        return None

    stray = await client.insert({"n": 1}, kind="nobody_handles_this", queue="mixed")
    await client.start([("mixed", 1)], **FAST)
    try:
        job = await wait_for_state(client, stray.id, "failed")
    finally:
        await client.shutdown()
    assert job.errors[-1]["error"] == 'UnknownJobKind: no handler registered for job kind "nobody_handles_this"'


# ----- item 3: values stored exactly or refused --------------------------------------------------

BIG = [2**64, 10**30, -(2**63) - 1]


@pytest.mark.parametrize("big", BIG)
async def test_integers_beyond_64_bits_are_refused_on_every_insert_path(client: awa.AsyncClient, big: int) -> None:
    args = {"items": [{"n": 1}, {"n": 2}, {"n": 3}, {"n": big}]}
    path = r"args\.items\[3\]\.n is an integer beyond 64 bits"
    with pytest.raises(awa.ValidationError, match=path):
        await client.insert(args, kind="k")
    with pytest.raises(awa.ValidationError, match=path):
        await client.insert_many([{"ok": 1}, args], kind="k")
    with pytest.raises(awa.ValidationError, match=r"jobs\[1\]: " + path):
        await client.insert_many_copy([{"ok": 1}, args], kind="k")
    with pytest.raises(awa.ValidationError, match=r"jobs\[0\]: " + path):
        await client.enqueue_many_copy([args], kind="k")
    with pytest.raises(awa.ValidationError, match=r"metadata\.deep\[0\] is an integer beyond 64 bits"):
        await client.insert({"n": 1}, kind="k", metadata={"deep": [big]})
    async with client.transaction() as tx:
        for call in (tx.insert(args, kind="k"), tx.insert_many([args], kind="k"),
                     tx.insert_many_copy([args], kind="k"), tx.enqueue_many_copy([args], kind="k")):
            with pytest.raises(awa.ValidationError, match=r"beyond 64 bits"):
                await call
        with pytest.raises(awa.ValidationError, match=r"beyond 64 bits"):
            await tx.execute("SELECT $1::bigint", big)
        with pytest.raises(awa.ValidationError, match=r"the SQL parameter\.x is an integer beyond 64 bits"):
            await tx.execute("SELECT $1::jsonb", {"x": big})
    assert await client.list_jobs(kind="k") == []


async def test_64_bit_integers_at_the_edges_are_stored_exactly(client: awa.AsyncClient) -> None:
    edges = {"lo": -(2**63), "hi": 2**64 - 1, "i64": 2**63 - 1, "float": 1e20, "long_text": "1" * 40}
    job = await client.insert(edges, kind="edges", metadata={"m": 2**64 - 1})
    stored = await client.get_job(job.id)
    assert stored.args == edges and stored.metadata == {"m": 2**64 - 1}
    assert type(stored.args["hi"]) is int
    async with client.transaction() as tx:
        row = await tx.fetch_one("SELECT args #>> '{hi}' AS hi FROM awa.jobs WHERE id = $1", job.id)
    assert row["hi"] == str(2**64 - 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_nan_and_infinity_are_refused_with_their_path(client: awa.AsyncClient, bad: float) -> None:
    with pytest.raises(awa.ValidationError, match=r"args\.a\.b\[1\] is (nan|inf|-inf); JSON cannot hold"):
        await client.insert({"a": {"b": [0.5, bad]}}, kind="k")
    with pytest.raises(awa.ValidationError, match=r"jobs\[0\]: args\.f is"):
        await client.enqueue_many_copy([{"f": bad}], kind="k")
    with pytest.raises(awa.ValidationError, match=r"metadata\.f is"):
        await client.insert({"n": 1}, kind="k", metadata={"f": bad})


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"n": value}
    return value


@pytest.mark.parametrize("levels", [65, 200, 5000])
async def test_nesting_past_the_limit_is_a_validation_error_not_a_recursion_error(client: awa.AsyncClient, levels: int) -> None:
    assert awa.MAX_JSON_DEPTH == _awa.MAX_JSON_DEPTH == 64
    for call in (lambda: client.insert(_nested(levels), kind="k"),
                 lambda: client.enqueue_many_copy([_nested(levels)], kind="k"),
                 lambda: client.insert({"n": 1}, kind="k", metadata=_nested(levels))):
        with pytest.raises(awa.ValidationError, match=r"deeper than 64 levels"):
            await call()
    await client.insert(_nested(64), kind="deep_ok")


async def test_handler_paths_refuse_unstorable_values(client: awa.AsyncClient) -> None:
    """Staging (a StagingError chained from the ValidationError, ADR-046), update_metadata and
    callback payloads."""
    seen: dict[str, BaseException] = {}

    async def handler(job: awa.Job) -> Any:
        try:
            job.enqueue_on_completion({"n": 2**64}, kind="follow")
        except awa.StagingError as exc:
            seen["stage"] = exc
        try:
            job.update_metadata({"n": 10**30})
        except awa.ValidationError as exc:
            seen["metadata"] = exc
        try:
            job.update_metadata({"d": _nested(5000)})
        except awa.ValidationError as exc:
            seen["metadata_deep"] = exc
        return None

    await client.insert({"n": 1}, kind="stager")
    result = await AwaTestClient(client).work_one(dict, handler, kind="stager")
    stage = seen["stage"]
    assert isinstance(stage.__cause__, awa.ValidationError)
    assert "args.n is an integer beyond 64 bits" in str(stage)
    assert "metadata.n is an integer beyond 64 bits" in str(seen["metadata"])
    assert "deeper than 64 levels" in str(seen["metadata_deep"])
    # The swallowed stage still poisons the attempt (ADR-046); nothing was inserted.
    assert result.outcome == "failed"
    assert await client.list_jobs(kind="follow") == []
    with pytest.raises(awa.ValidationError, match=r"payload\.total is an integer beyond 64 bits"):
        await client.complete_external("00000000-0000-0000-0000-000000000000", {"total": 2**64})
    with pytest.raises(awa.ValidationError, match=r"payload\[0\] is nan"):
        await client.resume_external("00000000-0000-0000-0000-000000000000", [float("nan")])


# ----- item 4: no panics from user numbers -------------------------------------------------------

BAD_NUMBERS = [float("nan"), float("inf"), float("-inf"), -1, 1e16, 10**400]
START_KEYWORDS = [
    "poll_interval_ms", "heartbeat_interval_ms", "heartbeat_staleness_ms",
    "heartbeat_rescue_interval_ms", "deadline_rescue_interval_ms", "callback_rescue_interval_ms",
    "promote_interval_ms", "leader_election_interval_ms", "prune_interval_ms",
    "finalize_deadline_ms", "completed_retention_hours", "failed_retention_hours", "claim_batch",
    "completion_batch",
]


@pytest.mark.parametrize("keyword", START_KEYWORDS)
async def test_start_refuses_out_of_range_numbers_naming_the_keyword(client: awa.AsyncClient, keyword: str) -> None:
    @client.task(Known)
    async def known(job: awa.Job) -> None:
        return None

    for bad in BAD_NUMBERS:
        with pytest.raises(awa.ValidationError, match=rf"{keyword} is .*; it must be .* between .* and ") as raised:
            await client.start([("default", 1)], **{keyword: bad})
        assert keyword in str(raised.value)
    with pytest.raises(awa.ValidationError, match=rf"{keyword} must be a number, not str"):
        await client.start([("default", 1)], **{keyword: "fast"})
    # Nothing started: a good call still works.
    await client.start([("default", 1)], **{keyword: 100 if keyword.endswith("_ms") else 1})
    await client.shutdown()


@pytest.mark.parametrize("bad", BAD_NUMBERS + [0, 2.5])
async def test_queue_counts_and_deadlines_are_checked(client: awa.AsyncClient, bad: Any) -> None:
    @client.task(Known)
    async def known(job: awa.Job) -> None:
        return None

    with pytest.raises(awa.ValidationError, match=r"queue 'default': max_workers is .* whole number between 1 and 10000"):
        await client.start([("default", bad)])
    if bad != 2.5:
        with pytest.raises(awa.ValidationError, match=r"queue 'default': deadline_ms is "):
            await client.start([{"name": "default", "max_workers": 1, "deadline_ms": bad}])


@pytest.mark.parametrize("bad", BAD_NUMBERS)
async def test_shutdown_and_callback_timeouts_are_checked(client: awa.AsyncClient, bad: Any) -> None:
    with pytest.raises(awa.ValidationError, match=r"timeout_ms is .* between 0 and 2592000000"):
        await client.shutdown(timeout_ms=bad)
    with pytest.raises(awa.ValidationError, match=r"timeout_seconds is .* between 0\.001 and 31536000"):
        await client.heartbeat_callback("00000000-0000-0000-0000-000000000000", timeout_seconds=bad)
    # The native entry point checks too (what a caller bypassing the package would hit).
    if isinstance(bad, float):
        with pytest.raises(awa.ValidationError, match="timeout_seconds"):
            await client._native.callback("heartbeat", "00000000-0000-0000-0000-000000000000", None, None, bad)


async def test_register_callback_timeout_is_checked(client: awa.AsyncClient) -> None:
    seen: list[BaseException] = []

    async def handler(job: awa.Job) -> Any:
        for bad in BAD_NUMBERS:
            try:
                await job.register_callback(timeout_seconds=bad)
            except awa.ValidationError as exc:
                seen.append(exc)
        return None

    await client.insert({"n": 1}, kind="cb")
    result = await AwaTestClient(client).work_one(dict, handler, kind="cb")
    assert result.outcome == "completed"
    assert len(seen) == len(BAD_NUMBERS)
    assert all("timeout_seconds" in str(e) for e in seen)


@pytest.mark.parametrize("bad", [*BAD_NUMBERS, 0, 2.5])
def test_max_connections_is_checked(database_url: str, bad: Any) -> None:
    with pytest.raises(awa.ValidationError, match=r"max_connections is .* whole number between 1 and 10000"):
        awa.AsyncClient(database_url, max_connections=bad)
    with pytest.raises(awa.ValidationError, match="max_connections"):
        awa.Client(database_url, max_connections=bad)


def test_the_blocking_client_checks_the_same_numbers(sync_client: awa.Client) -> None:
    @sync_client.task(Known)
    async def known(job: awa.Job) -> None:
        return None

    with pytest.raises(awa.ValidationError, match="poll_interval_ms"):
        sync_client.start([("default", 1)], poll_interval_ms=1e16)
    with pytest.raises(awa.ValidationError, match="timeout_ms"):
        sync_client.shutdown(timeout_ms=float("nan"))
