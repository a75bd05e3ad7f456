"""Callbacks with CEL rules, as awa-pg 0.6.9 (issue 13, item 3): register_callback's filter,
on_complete, on_fail and transform; resolve_callback → ResolveResult; resume_external's
metadata["_awa_callback_result"] (ADR-021); malformed ids and bad timeouts."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import uuid
from typing import Any, Optional

import awa
import pytest
from awa.testing import AwaTestClient
from helpers import FAST, wait_for_state

RULES = dict(
    filter='payload.status != ""',
    on_complete='payload.status == "ok"',
    on_fail='payload.status == "bad"',
)


@dataclasses.dataclass
class Order:
    n: int
    rules: str = "probe"


#: The tokens the ``parking`` fixture's handler registered, by Order.n.
TOKENS: dict[int, awa.CallbackToken] = {}

RULE_SETS: dict[str, dict[str, Optional[str]]] = {
    "probe": dict(RULES),
    "transform": {**RULES, "transform": '{"paid": payload.amount, "ok": true}'},
    "none": {},
}


async def _park(client: awa.AsyncClient, n: int, rules: str = "probe") -> tuple[awa.Job, awa.CallbackToken]:
    """Insert an Order whose handler registers a callback with RULE_SETS[rules] and parks."""
    tokens = TOKENS
    job = await client.insert(Order(n=n, rules=rules))
    parked = await wait_for_state(client, job.id, "waiting_external")
    for _ in range(500):
        if n in tokens:
            return parked, tokens[n]
        await asyncio.sleep(0.02)
    raise AssertionError("no token")


@pytest.fixture
async def parking(client: awa.AsyncClient) -> Any:
    tokens = TOKENS
    tokens.clear()

    @client.task(Order)
    async def handle(job: awa.Job) -> Any:
        token = await job.register_callback(60, **RULE_SETS[job.args.rules])
        tokens[job.args.n] = token
        return awa.WaitForCallback(token)

    await client.start([("default", 4)], **FAST)
    try:
        yield client
    finally:
        await client.shutdown()


async def test_resolve_completes_fails_or_ignores_by_the_rules(parking: awa.AsyncClient) -> None:
    c = parking
    ok_job, ok = await _park(c, 1)
    result = await c.resolve_callback(ok.id, {"status": "ok"})
    assert isinstance(result, awa.ResolveResult)
    assert result.is_completed() and not result.is_failed() and not result.is_ignored()
    assert result.outcome == "completed" and result.reason is None and result.payload == {"status": "ok"}
    assert result.job is not None and result.job.id == ok_job.id and result.job.state is awa.JobState.Completed
    with pytest.raises(awa.CallbackNotFound):
        await c.resolve_callback(ok.id, {"status": "ok"})  # resolved once only

    bad_job, bad = await _park(c, 2)
    failed = await c.resolve_callback(bad, {"status": "bad"})  # a token works as well as its id
    assert failed.is_failed() and failed.job is not None and failed.job.state is awa.JobState.Failed
    assert "on_fail" in failed.job.errors[-1]["error"]

    pending_job, pending = await _park(c, 3)
    ignored = await c.resolve_callback(pending.id, {"status": "pending"}, default_action="ignore")
    assert ignored.is_ignored() and ignored.job is None and ignored.reason
    assert (await c.get_job(pending_job.id)).state is awa.JobState.WaitingExternal
    # The filter ignores whatever the default: an empty status is dropped.
    filtered = await c.resolve_callback(pending.id, {"status": ""}, default_action="complete")
    assert filtered.is_ignored() and "filter" in (filtered.reason or "")
    # No rule matches: the default decides.
    defaulted = await c.resolve_callback(pending.id, {"status": "later"}, default_action="fail")
    assert defaulted.is_failed()


async def test_transform_reshapes_the_completion_payload(parking: awa.AsyncClient) -> None:
    job, token = await _park(parking, 1, "transform")
    result = await parking.resolve_callback(token.id, {"status": "ok", "amount": 12})
    assert result.is_completed() and result.payload == {"paid": 12, "ok": True}
    # A payload of an unexpected shape: the filter errors (fail-open), no rule matches.
    job2, token2 = await _park(parking, 2, "transform")
    odd = await parking.resolve_callback(token2.id, {"unexpected": 1})
    assert odd.is_ignored()
    assert (await parking.get_job(job2.id)).state is awa.JobState.WaitingExternal


async def test_without_rules_the_default_action_decides(parking: awa.AsyncClient) -> None:
    _, a = await _park(parking, 1, "none")
    assert (await parking.resolve_callback(a.id, {"x": 1})).is_ignored()
    completed = await parking.resolve_callback(a.id, {"x": 1}, default_action="complete")
    assert completed.is_completed() and completed.payload == {"x": 1}
    _, b = await _park(parking, 2, "none")
    assert (await parking.resolve_callback(b.id, default_action="fail")).is_failed()
    with pytest.raises(awa.ValidationError, match="default_action"):
        await parking.resolve_callback(b.id, default_action="maybe")


async def test_bad_expressions_are_refused_at_registration(client: awa.AsyncClient) -> None:
    errors: list[str] = []

    async def handler(job: awa.Job) -> None:
        for rules in ({"filter": "payload.status =="}, {"on_complete": "other == 1"},
                      {"transform": "payload." + "a" * 5000}):
            try:
                await job.register_callback(60, **rules)
            except awa.ValidationError as exc:
                errors.append(str(exc))
        with pytest.raises(TypeError):
            await job.register_callback(60, filter=1)  # type: ignore[arg-type]
        # Nothing was registered by the refused calls.
        assert job.callback_id is None

    await client.insert(Order(n=1), kind="cel_bad")
    result = await AwaTestClient(client).work_one(dict, handler, kind="cel_bad")
    assert result.is_completed(), result
    assert len(errors) == 3
    assert "invalid CEL expression for filter" in errors[0]
    assert "references other" in errors[1]
    assert "limit is 4096" in errors[2]


async def test_rules_belong_to_their_own_callback(client: awa.AsyncClient) -> None:
    """A second registration in the same attempt replaces the first one's rules."""
    tokens: list[awa.CallbackToken] = []

    @client.task(Order)
    async def handle(job: awa.Job) -> Any:
        await job.register_callback(60, filter="false")
        tokens.append(await job.register_callback(60))
        return awa.WaitForCallback(tokens[-1])

    job = await client.insert(Order(n=1))
    await client.start([("default", 1)], **FAST)
    try:
        await wait_for_state(client, job.id, "waiting_external")
        result = await client.resolve_callback(tokens[-1].id, {"a": 1}, default_action="complete")
    finally:
        await client.shutdown()
    assert result.is_completed(), result


async def test_resume_external_leaves_the_job_running_with_the_payload_in_metadata(client: awa.AsyncClient) -> None:
    tokens: asyncio.Queue[awa.CallbackToken] = asyncio.Queue()
    go = asyncio.Event()
    seen: list[Any] = []

    @client.task(Order)
    async def handle(job: awa.Job) -> None:
        token = await job.register_callback(60)
        await tokens.put(token)
        await go.wait()
        seen.append(await job.wait_for_callback(token))

    job = await client.insert(Order(n=1))
    await client.start([("default", 1)], **FAST)
    try:
        token = await asyncio.wait_for(tokens.get(), 10)
        resumed = await client.resume_external(token.id, {"step": 2})
        assert resumed.state is awa.JobState.Running
        assert resumed.metadata["_awa_callback_result"] == {"step": 2}
        go.set()
        done = await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    assert seen == [{"step": 2}]
    assert "_awa_callback_result" not in done.metadata, "the wait took the payload"


async def test_a_parked_job_resumed_runs_again_and_finds_the_payload(client: awa.AsyncClient) -> None:
    attempts: list[dict[str, Any]] = []
    tokens: list[awa.CallbackToken] = []

    @client.task(Order)
    async def handle(job: awa.Job) -> Any:
        attempts.append(dict(job.metadata))
        if len(attempts) == 1:
            tokens.append(await job.register_callback(60))
            return awa.WaitForCallback(tokens[0])
        return None

    job = await client.insert(Order(n=1))
    await client.start([("default", 1)], **FAST)
    try:
        await wait_for_state(client, job.id, "waiting_external")
        resumed = await client.resume_external(tokens[0], {"approved": True})
        assert resumed.metadata["_awa_callback_result"] == {"approved": True}
        await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    assert attempts[1]["_awa_callback_result"] == {"approved": True}


@pytest.mark.parametrize("call", ["complete", "fail", "retry", "resume", "heartbeat", "resolve"])
async def test_a_malformed_callback_id_is_a_validation_error(client: awa.AsyncClient, call: str) -> None:
    calls = {
        "complete": lambda cid: client.complete_external(cid),
        "fail": lambda cid: client.fail_external(cid, "x"),
        "retry": lambda cid: client.retry_external(cid),
        "resume": lambda cid: client.resume_external(cid),
        "heartbeat": lambda cid: client.heartbeat_callback(cid),
        "resolve": lambda cid: client.resolve_callback(cid, {"a": 1}),
    }
    with pytest.raises(awa.ValidationError, match="invalid callback id"):
        await calls[call]("not-a-uuid")
    with pytest.raises(awa.CallbackNotFound):  # well-formed but unknown
        await calls[call](str(uuid.uuid4()))
    with pytest.raises(TypeError):
        await calls[call](42)


async def test_negative_or_nan_timeouts_are_validation_errors(client: awa.AsyncClient) -> None:
    seen: list[BaseException] = []

    async def handler(job: awa.Job) -> None:
        for bad in (-1, -0.5, math.nan, math.inf):
            try:
                await job.register_callback(timeout_seconds=bad)
            except awa.ValidationError as exc:
                seen.append(exc)
        assert job.callback_id is None

    await client.insert(Order(n=1), kind="cb_timeout")
    result = await AwaTestClient(client).work_one(dict, handler, kind="cb_timeout")
    assert result.is_completed(), result
    assert len(seen) == 4
    # awa-pg raises ValueError here: the same exception is both.
    assert all(isinstance(e, ValueError) and "timeout_seconds" in str(e) for e in seen)
    with pytest.raises(awa.ValidationError, match="timeout_seconds"):
        await client.heartbeat_callback(str(uuid.uuid4()), -1.0)  # checked before the lookup
