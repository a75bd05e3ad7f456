"""``start()`` configuration that does what it says (issue 13, item 4; docs/workers.md).

Shares are measured by counting running handlers (each counts itself in and waits on a gate
the test opens one pass at a time); rate limits and claim sizes from the claim timestamps the
database gave each attempt (``attempted_at``: one claim statement shares one ``now()``), read off
the jobs the handlers receive, which both engines return from the claim itself. No test waits for
time to pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections import Counter
from typing import Any

import pytest

import awa
from helpers import FAST, wait_for


@dataclasses.dataclass
class Unit:
    n: int = 0


@dataclasses.dataclass
class Other:
    n: int = 0


async def _completed(client: awa.AsyncClient) -> int:
    # Through the client, which reads whichever engine holds the jobs (tests/conftest.py).
    return len(await client.list_jobs(state="completed", limit=100_000))


def _claims(attempted: list[str]) -> list[tuple[dt.datetime, int]]:
    """``(attempted_at, jobs)`` per claim statement, in order, from the ``attempted_at`` of each
    job a handler received (the claim's ``now()``, the same for every job one claim took)."""
    per_claim = Counter(dt.datetime.fromisoformat(a.replace("Z", "+00:00")) for a in attempted)
    return sorted(per_claim.items())


# ----- the weighted pool ------------------------------------------------------------------------


async def test_two_saturated_weighted_queues_share_the_global_pool(client: awa.AsyncClient) -> None:
    """global 6; "big" (min 1, weight 3) and "small" (min 1, weight 1): the pool of 4 splits
    3 : 1, so a full pool runs exactly 1 + 3 and 1 + 1 once every handler has turned over."""
    running: Counter[str] = Counter()
    gate = asyncio.Semaphore(0)

    @client.task(Unit, queue="big")
    async def big(job: awa.Job) -> None:
        running["big"] += 1
        await gate.acquire()
        running["big"] -= 1

    @client.task(Other, queue="small")
    async def small(job: awa.Job) -> None:
        running["small"] += 1
        await gate.acquire()
        running["small"] -= 1

    await client.insert_many([Unit(n) for n in range(40)], queue="big")
    await client.insert_many([Other(n) for n in range(40)], queue="small")
    await client.start(
        [{"name": "big", "min_workers": 1, "weight": 3}, {"name": "small", "min_workers": 1, "weight": 1}],
        global_max_workers=6,
        **FAST,
    )
    try:
        await wait_for(lambda: sum(running.values()) == 6, what="the pool to fill")
        shares = []
        for round_ in range(1, 5):
            for _ in range(6):
                gate.release()

            async def refilled(r: int = round_) -> bool:
                return await _completed(client) == 6 * r and sum(running.values()) == 6

            await wait_for(refilled, timeout=30, what=f"round {round_}")
            shares.append((running["big"], running["small"]))
        assert shares == [(4, 2)] * 4
    finally:
        for _ in range(1000):
            gate.release()
        await client.shutdown()


async def test_weighted_queue_with_no_minimum_runs_on_the_pool(client: awa.AsyncClient) -> None:
    @client.task(Unit, queue="pool_only")
    async def handle(job: awa.Job) -> None:
        return None

    ids = await client.insert_many([Unit(n) for n in range(5)], queue="pool_only")
    await client.start([{"name": "pool_only", "min_workers": 0}], global_max_workers=2, **FAST)
    try:
        async def all_done() -> bool:
            return await _completed(client) == len(ids)

        await wait_for(all_done, what="jobs on a min_workers=0 queue")
    finally:
        await client.shutdown()


# ----- rate limit, claim batch, claimers, deadline, aging ----------------------------------------


async def test_rate_limit_never_exceeds_the_bucket(client: awa.AsyncClient) -> None:
    rate, burst, jobs = 20.0, 3, 25
    attempted: list[str] = []

    @client.task(Unit, queue="limited")
    async def handle(job: awa.Job) -> None:
        assert job.attempted_at is not None
        attempted.append(job.attempted_at)

    await client.insert_many([Unit(n) for n in range(jobs)], queue="limited")
    await client.start([{"name": "limited", "max_workers": 8, "rate_limit": (rate, burst)}], **FAST)
    try:
        async def all_done() -> bool:
            return await _completed(client) == jobs

        await wait_for(all_done, timeout=30, what="every job")
    finally:
        await client.shutdown()
    claims = _claims(attempted)
    assert sum(n for _, n in claims) == jobs
    # One claim in flight at a time: claim i's tokens were taken after claim i-1 started in the
    # database, claim j's before claim j did, so claims i..j took at most
    # burst + rate * (t[j] - t[i-1]) (+ 5 ms of refill for the two clocks drifting apart).
    assert claims[0][1] <= burst
    for i in range(1, len(claims)):
        total = 0
        for j in range(i, len(claims)):
            total += claims[j][1]
            elapsed = (claims[j][0] - claims[i - 1][0]).total_seconds()
            assert total <= burst + rate * (elapsed + 0.005), (i, j, total, elapsed, claims)
    # The limit bit (not vacuous): by the bound for claims 1..last, the jobs after the first
    # claim took at least (jobs - first - burst) / rate from the first claim's time.
    least = (jobs - claims[0][1] - burst) / rate - 0.005
    assert (claims[-1][0] - claims[0][0]).total_seconds() >= least


async def test_claim_batch_size_and_claimers(client: awa.AsyncClient) -> None:
    seen: Counter[int] = Counter()
    attempted: list[str] = []

    @client.task(Unit, queue="batched")
    async def handle(job: awa.Job) -> None:
        seen[job.id] += 1
        assert job.attempted_at is not None
        attempted.append(job.attempted_at)

    ids = [j.id for j in await client.insert_many([Unit(n) for n in range(60)], queue="batched")]
    await client.start(
        [{"name": "batched", "max_workers": 6, "claim_batch_size": 2, "claimers": 2}], **FAST
    )
    try:
        async def all_done() -> bool:
            return await _completed(client) == len(ids)

        await wait_for(all_done, timeout=30, what="every job")
    finally:
        await client.shutdown()
    assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}
    claims = _claims(attempted)
    assert sum(n for _, n in claims) == len(ids) and max(n for _, n in claims) <= 2


async def test_deadline_duration_ms_sets_the_attempts_deadline(client: awa.AsyncClient) -> None:
    # Read while the attempt runs: a running attempt's claim and deadline are in awa.jobs on
    # both engines (queue storage's completion receipts are narrow and keep neither).
    running = asyncio.Event()
    release = asyncio.Event()

    @client.task(Unit, queue="deadlined")
    async def handle(job: awa.Job) -> None:
        running.set()
        await release.wait()

    job = await client.insert(Unit(), queue="deadlined")
    await client.start([{"name": "deadlined", "max_workers": 1, "deadline_duration_ms": 90_000}], **FAST)
    try:
        await asyncio.wait_for(running.wait(), 10)
        async with client.transaction() as tx:
            row = await tx.fetch_one(
                "SELECT state, extract(epoch FROM deadline_at - attempted_at)::float8 AS s "
                "FROM awa.jobs WHERE id = $1",
                job.id,
            )
        release.set()

        async def done() -> bool:
            return (await client.get_job(job.id)).state == "completed"

        await wait_for(done, what="the job")
    finally:
        release.set()
        await client.shutdown()
    assert row["state"] == "running"
    assert row["s"] == pytest.approx(90.0)


@pytest.mark.parametrize("aging", [None, 60_000])
async def test_priority_aging_lets_an_old_low_priority_job_go_first(client: awa.AsyncClient, aging: Any) -> None:
    order: list[str] = []

    @client.task(Unit, queue="aged")
    async def handle(job: awa.Job) -> None:
        order.append("old" if job.args.n == 4 else "new")

    # Due for an hour: ten 60 s intervals bring priority 4 to 1, and it is older.
    await client.insert(Unit(4), queue="aged", priority=4,
                        run_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1))
    await client.insert(Unit(1), queue="aged", priority=1)
    spec: dict[str, Any] = {"name": "aged", "max_workers": 1, "claim_batch_size": 1}
    if aging is not None:
        spec["priority_aging_interval_ms"] = aging
    await client.start([spec], **FAST)
    try:
        await wait_for(lambda: len(order) == 2, what="both jobs")
    finally:
        await client.shutdown()
    assert order == (["old", "new"] if aging else ["new", "old"])


async def test_every_awa_pg_keyword_is_accepted(client: awa.AsyncClient) -> None:
    @client.task(Unit, queue="cfgq")
    async def handle(job: awa.Job) -> None:
        return None

    await client.start(
        [{"name": "cfgq", "min_workers": 1, "weight": 2, "rate_limit": (100.0, 10), "claimers": 2,
          "claim_batch_size": 4, "deadline_duration_ms": 60_000, "priority_aging_interval_ms": 1000}],
        poll_interval_ms=100, global_max_workers=4, completed_retention_hours=1.0,
        failed_retention_hours=2.0, descriptor_retention_days=0, cleanup_batch_size=100,
        leader_election_interval_ms=1000, heartbeat_interval_ms=1000, promote_interval_ms=500,
        heartbeat_rescue_interval_ms=5000, heartbeat_staleness_ms=30000,
        deadline_rescue_interval_ms=5000, callback_rescue_interval_ms=5000,
        terminal_count_rollup_interval_ms=1000,
    )
    job = await client.insert(Unit(), queue="cfgq")
    try:
        async def done() -> bool:
            return (await client.get_job(job.id)).state == "completed"

        await wait_for(done, what="the job")
    finally:
        await client.shutdown()


# ----- bad configurations ----------------------------------------------------------------------

ConfigError = awa.ConfigError

BAD: list[tuple[str, Any, dict[str, Any], type[BaseException], str]] = [
    ("missing_task_queue", [("other_q", 1)], {}, ValueError,
     r"^start\(\) must configure the worker queues declared via @client\.worker\(\.\.\., queue=\.\.\.\): default$"),
    ("empty_list", [], {}, ValueError, r"declared via .*: default$"),
    ("tuple_with_global", [("default", 1)], {"global_max_workers": 4}, ValueError,
     r"^tuple queue config is not supported with global_max_workers; use dict form with min_workers/weight$"),
    ("global_with_none", None, {"global_max_workers": 4}, ValueError,
     r"^weighted mode requires explicit queue configs \(global_max_workers set but queues=None\)$"),
    ("dict_no_name", [{"max_workers": 1}], {}, ValueError, r"^queue config dict must have 'name' key$"),
    ("dict_no_max_workers", [{"name": "default"}], {}, ValueError,
     r"^max_workers required in hard-reserved mode \(no global_max_workers set\)$"),
    ("min_workers_without_global", [{"name": "default", "min_workers": 1}], {}, ValueError,
     r"min_workers and weight need global_max_workers"),
    ("both_modes", [{"name": "default", "max_workers": 1, "min_workers": 1}], {"global_max_workers": 4}, ValueError,
     r"^use max_workers for hard-reserved mode or min_workers for weighted mode, not both$"),
    ("sum_exceeds", [{"name": "default", "min_workers": 3}, {"name": "r", "min_workers": 3}],
     {"global_max_workers": 4}, awa.AwaError, r"sum of min_workers \(6\) exceeds global_max_workers \(4\)"),
    ("weight_zero", [{"name": "default", "min_workers": 1, "weight": 0}], {"global_max_workers": 4}, ValueError,
     r"queue 'default': weight is 0; it must be a whole number between 1 and 10000"),
    ("global_zero", [{"name": "default", "min_workers": 0}], {"global_max_workers": 0}, ValueError,
     r"global_max_workers is 0"),
    ("rate_limit_shape", [{"name": "default", "max_workers": 1, "rate_limit": 5}], {}, TypeError,
     r"^rate_limit must be a \(max_rate: float, burst: int\) tuple or None$"),
    ("rate_limit_zero_rate", [{"name": "default", "max_workers": 1, "rate_limit": (0.0, 2)}], {}, awa.AwaError,
     r"rate_limit\.max_rate is 0"),
    ("rate_limit_nan", [{"name": "default", "max_workers": 1, "rate_limit": (float("nan"), 2)}], {}, ValueError,
     r"rate_limit\.max_rate is NaN"),
    ("rate_limit_zero_burst", [{"name": "default", "max_workers": 1, "rate_limit": (1.0, 0)}], {}, ValueError,
     r"rate_limit\.burst is 0"),
    ("claimers_zero", [{"name": "default", "max_workers": 1, "claimers": 0}], {}, ValueError, r"claimers is 0"),
    ("claim_batch_size_zero", [{"name": "default", "max_workers": 1, "claim_batch_size": 0}], {}, ValueError,
     r"claim_batch_size is 0"),
    ("deadline_zero", [{"name": "default", "max_workers": 1, "deadline_duration_ms": 0}], {}, ValueError,
     r"deadline_duration_ms is 0"),
    ("aging_negative", [{"name": "default", "max_workers": 1, "priority_aging_interval_ms": -1}], {}, ValueError,
     r"priority_aging_interval_ms is -1"),
    ("unknown_dict_key", [{"name": "default", "max_workers": 1, "bogus": 1}], {}, ValueError,
     r"queue 'default': unknown queue config key\(s\) 'bogus'"),
    ("dup_queue", [("default", 1), ("default", 2)], {}, awa.AwaError, r"^queue 'default' configured more than once$"),
    ("entry_string", ["default"], {}, TypeError,
     r"^queue config must be a \(name, max_workers\) tuple or a dict$"),
    ("entry_3_tuple", [("default", 1, 2)], {}, TypeError, r"tuple or a dict"),
    ("name_not_str", [{"name": 5, "max_workers": 1}], {}, TypeError, r"'name' must be a str"),
    ("cleanup_zero", [("default", 1)], {"cleanup_batch_size": 0}, ValueError, r"cleanup_batch_size is 0"),
    ("rollup_zero", [("default", 1)], {"terminal_count_rollup_interval_ms": 0}, ValueError,
     r"terminal_count_rollup_interval_ms is 0"),
    ("completed_negative", [("default", 1)], {"completed_retention_hours": -1.0}, ValueError,
     r"completed_retention_hours is -1"),
    ("descriptor_negative", [("default", 1)], {"descriptor_retention_days": -1.0}, ValueError,
     r"descriptor_retention_days is -1"),
    ("unknown_keyword", [("default", 1)], {"bogus_keyword": 1}, TypeError, r"unexpected keyword argument 'bogus_keyword'"),
    ("queue_storage_schema_type", [("default", 1)], {"queue_storage_schema": 5}, TypeError, r"queue_storage_schema must be a str"),
]


@pytest.mark.parametrize(("case", "queues", "kwargs", "exc", "message"), BAD, ids=[b[0] for b in BAD])
async def test_bad_configurations_raise_awa_pgs_class_and_start_nothing(
    client: awa.AsyncClient, case: str, queues: Any, kwargs: dict[str, Any], exc: type[BaseException], message: str
) -> None:
    @client.task(Unit)
    async def handle(job: awa.Job) -> None:
        return None

    with pytest.raises(exc, match=message) as raised:
        await client.start(queues, **kwargs)
    if not isinstance(raised.value, TypeError):
        # Every setting error is an awa.ConfigError: a ValidationError and a ValueError.
        assert isinstance(raised.value, ConfigError), type(raised.value)
    # Nothing started: a good configuration still starts.
    await client.start([("default", 1)], **FAST)
    await client.shutdown()


def test_config_error_is_a_validation_error_and_a_value_error() -> None:
    assert issubclass(awa.ConfigError, awa.ValidationError)
    assert issubclass(awa.ConfigError, awa.AwaError)
    assert issubclass(awa.ConfigError, ValueError)
    assert awa.ConfigError.__module__ == "awa"


async def test_start_without_tasks_and_twice(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.AwaError, match=r"^register at least one worker before starting the runtime$"):
        await client.start([("default", 1)])

    @client.task(Unit)
    async def handle(job: awa.Job) -> None:
        return None

    await client.start([("default", 1)], **FAST)
    try:
        with pytest.raises(awa.AwaError, match=r"^worker runtime is already running$"):
            await client.start([("default", 1)])
    finally:
        await client.shutdown()


async def test_the_native_entry_point_refuses_unknown_fields_too(client: awa.AsyncClient) -> None:
    """A key can never be accepted and dropped between the package and the engine."""
    with pytest.raises(awa.ConfigError, match="unknown field `bogus`"):
        await client._native.start('{"queues": [{"name": "q", "max_workers": 1, "bogus": 1}]}', ["unit"])
    with pytest.raises(awa.ConfigError, match="unknown field `bogus`"):
        await client._native.start('{"queues": [], "bogus": 1}', ["unit"])
