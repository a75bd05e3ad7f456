"""Outcome values from Python handlers: delays are validated at the boundary (issue 12, item 4).

``awa.RetryAfter`` and ``awa.Snooze`` refuse NaN, infinite, negative and over-the-limit delays
when constructed; a handler that hands a bad value over anyway (a mutated attribute, a subclass
that skips the check) fails its attempt cleanly as a handler error naming the field and the
limit: the job is not left running and its worker slot is released.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import awa
import pytest
from awa._outcomes import MAX_DELAY_SECONDS
from helpers import FAST, wait_for_state

BAD = [1e300, math.inf, math.nan, -1, -math.inf, MAX_DELAY_SECONDS + 1, "soon", True, None]


@pytest.mark.parametrize("cls", [awa.RetryAfter, awa.Snooze], ids=lambda c: c.__name__)
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_a_bad_delay_is_refused_when_constructed(cls: Any, value: Any) -> None:
    with pytest.raises(awa.ValidationError) as info:
        cls(value)
    message = str(info.value)
    assert f"{cls.__name__}.seconds" in message, message
    assert str(MAX_DELAY_SECONDS) in message and "10 years" in message, message


@pytest.mark.parametrize("cls", [awa.RetryAfter, awa.Snooze], ids=lambda c: c.__name__)
def test_delays_within_the_limit_are_accepted(cls: Any) -> None:
    assert MAX_DELAY_SECONDS == 10 * 365 * 24 * 3600
    assert cls(0).seconds == 0
    assert cls(0.5).seconds == 0.5
    assert cls(MAX_DELAY_SECONDS).seconds == MAX_DELAY_SECONDS


@dataclasses.dataclass
class Outcome:
    n: int


@dataclasses.dataclass(frozen=True)
class Unchecked(awa.RetryAfter):
    """A subclass that skips the constructor's check."""

    def __post_init__(self) -> None:
        pass


async def test_a_bad_delay_handed_over_anyway_fails_the_attempt_cleanly(client: awa.AsyncClient) -> None:
    cases: list[tuple[str, Any]] = [
        (cls.__name__, value) for cls in (awa.RetryAfter, awa.Snooze) for value in (1e300, math.inf, math.nan, -1)
    ]

    @client.task(Outcome)
    async def handle(job: awa.Job) -> Any:
        n = job.args.n
        if n == len(cases):
            return Unchecked(1e300)
        if n > len(cases):
            return None  # proves the single worker slot was released by every bad outcome
        name, value = cases[n]
        outcome = awa.RetryAfter(1) if name == "RetryAfter" else awa.Snooze(1)
        object.__setattr__(outcome, "seconds", value)  # bypass the frozen dataclass
        return outcome

    bad = [(await client.insert(Outcome(n=n))).id for n in range(len(cases) + 1)]
    last = (await client.insert(Outcome(n=len(cases) + 1))).id
    # One worker, and no stale-heartbeat rescue within the test: a job left running would stay
    # running, and a held slot would keep the last job from ever starting.
    await client.start([("default", 1)], **{**FAST, "heartbeat_staleness_ms": 600_000})
    try:
        await wait_for_state(client, last, "completed", timeout=20)
        for i, job_id in enumerate(bad):
            job = await wait_for_state(client, job_id, "retryable")
            field = "RetryAfter.seconds" if i == len(cases) or cases[i][0] == "RetryAfter" else "Snooze.seconds"
            error = job.errors[-1]["error"]
            assert job.attempt == 1
            assert "invalid outcome" in error and field in error, error
            assert str(MAX_DELAY_SECONDS) in error and "10 years" in error, error
    finally:
        await client.shutdown()


async def test_register_callback_refuses_a_bad_timeout(client: awa.AsyncClient) -> None:
    errors: list[str] = []

    @client.task(Outcome)
    async def handle(job: awa.Job) -> None:
        for bad in (1e300, math.inf, -1):
            try:
                await job.register_callback(bad)
            except awa.ValidationError as exc:
                errors.append(str(exc))

    job = await client.insert(Outcome(n=0))
    await client.start([("default", 1)], **FAST)
    try:
        await wait_for_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    assert len(errors) == 3 and all("timeout_seconds" in e for e in errors), errors
