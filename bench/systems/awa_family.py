"""Workloads for the two systems with the awa Python API: ours (``awa-queue``, built from this
repository) and ``awa-pg`` 0.6.9. Both import as ``awa`` and share the names (``AsyncClient``,
``insert``, ``task``, ``start``, ``shutdown``), so one module drives both; the differences are
in :class:`Flavour`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any

import awa  # the one installed in the running virtualenv
from common import (
    FOLLOW_UP_QUEUE,
    QUEUE,
    Workload,
    pace_inserts,
    psql,
    psql_int,
    soak_loop,
    wait_drained,
)

PENDING_STATES = "('available', 'running', 'scheduled', 'retryable')"


@dataclasses.dataclass
class Noop:
    i: int


@dataclasses.dataclass
class StageJob:
    i: int


@dataclasses.dataclass
class FollowUp:
    i: int


@dataclasses.dataclass
class Tick:
    i: int


class Flavour:
    """What differs between our package and awa-pg."""

    name = "awa"
    pool_size = 20

    async def prepare_schema(self, client: Any) -> None:
        await client.migrate()

    # The bulk calls, one per shape of result: ours, both COPY-based (docs: README "Inserting").
    count_api = "enqueue_many_copy"  # returns how many rows were written
    jobs_api = "insert_many_copy"  # returns the inserted Jobs
    setup_api = "enqueue_many_copy"

    def queues(self, workers: int) -> list[Any]:
        return [(QUEUE, workers)]

    async def stage(self, client: Any, job: Any) -> None:
        job.enqueue_on_completion(FollowUp(i=job.args.i), kind="follow_up", queue=FOLLOW_UP_QUEUE, unique_opts={})

    staging_note = "job.enqueue_on_completion (inserted in the completion transaction)"


class AwaPg(Flavour):
    name = "awa-pg"
    # AWA_PG_ENGINE=queue_storage | canonical (see docs/benchmarks.md for which is used).
    engine = os.environ.get("AWA_PG_ENGINE", "queue_storage")

    async def prepare_schema(self, client: Any) -> None:
        await client.migrate()
        if self.engine == "queue_storage":
            # awa-pg 0.6's README: "Fresh installs go straight to the queue-storage engine";
            # activate it explicitly so its COPY ingestion (enqueue_many_copy) is available.
            await client.install_queue_storage()

    # awa-pg 0.6.9's README ("COPY ingestion"): enqueue_many_copy streams into queue storage
    # and returns a count (so it needs the queue-storage engine); insert_many_copy is "the
    # compatibility insert surface for canonical-storage" and returns the Jobs.
    count_api = "enqueue_many_copy"
    jobs_api = "insert_many_copy"
    # The drains' backlog: the canonical engine's COPY, or queue storage's (the orchestrator
    # drains awa-pg on the canonical engine; queue storage only in probes).
    setup_api = "enqueue_many_copy" if engine == "queue_storage" else "insert_many_copy"
    # Probe knob (not used by the orchestrator): AWA_PG_CLAIMERS=N adds awa-pg's documented
    # `claimers` queue option ("for hot queue-storage queues ... benchmark 2 or 4").
    claimers = int(os.environ.get("AWA_PG_CLAIMERS", "0"))

    def queues(self, workers: int) -> list[Any]:
        if self.claimers:
            return [{"name": QUEUE, "max_workers": workers, "claimers": self.claimers}]
        return [(QUEUE, workers)]

    async def stage(self, client: Any, job: Any) -> None:
        # awa-pg 0.6.9 has no handler-staged follow-ups: the handler inserts the follow-up
        # itself (not atomic with the completion).
        await client.insert(FollowUp(i=job.args.i), kind="follow_up", queue=FOLLOW_UP_QUEUE, unique_opts={})

    staging_note = "client.insert from inside the handler (awa-pg has no staging; not atomic)"


def describe(flavour: Flavour) -> dict[str, Any]:
    version = getattr(awa, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as _v

            version = _v("awa-pg" if flavour.name == "awa-pg" else "awa-queue")
        except Exception:  # noqa: BLE001
            version = "unknown"
    return {"name": flavour.name, "version": version}


async def _schema(flavour: Flavour, url: str, items: list[Any] | None = None) -> None:
    client = awa.AsyncClient(url, max_connections=4)
    await flavour.prepare_schema(client)
    if items:
        # The drains' backlog (not timed): each package's bulk call that works on the engine
        # its drain runs on.
        await getattr(client, flavour.setup_api)(items, queue=QUEUE)
    await client.close()


async def setup_schema(flavour: Flavour, args: Any) -> None:
    await _schema(flavour, args.url)


async def setup_noop_jobs(flavour: Flavour, args: Any) -> None:
    await _schema(flavour, args.url, [Noop(i=i) for i in range(args.jobs)])


async def setup_stage_jobs(flavour: Flavour, args: Any) -> None:
    await _schema(flavour, args.url, [StageJob(i=i) for i in range(args.jobs)])


async def enqueue_single(flavour: Flavour, args: Any) -> dict[str, Any]:
    client = awa.AsyncClient(args.url, max_connections=4)
    await client.insert(Noop(i=-1), queue="warmup")  # open the connection outside the clock
    t0 = time.perf_counter()
    for i in range(args.jobs):
        await client.insert(Noop(i=i), queue=QUEUE)
    seconds = time.perf_counter() - t0
    await client.close()
    return {"jobs": args.jobs, "seconds": seconds, "jobs_per_s": args.jobs / seconds, "api": "insert"}


async def _enqueue_bulk(flavour: Flavour, args: Any, api: str, want_jobs: bool) -> dict[str, Any]:
    client = awa.AsyncClient(args.url, max_connections=4)
    await client.insert(Noop(i=-1), queue="warmup")
    items = [Noop(i=i) for i in range(args.jobs)]
    call = getattr(client, api)
    t0 = time.perf_counter()
    out = await call(items, queue=QUEUE)
    seconds = time.perf_counter() - t0
    await client.close()
    got = len(out) if want_jobs else int(out)
    if got != args.jobs:
        raise RuntimeError(f"{api} reported {got} of {args.jobs} jobs")
    if want_jobs and not all(hasattr(j, "id") for j in out):
        raise RuntimeError(f"{api} did not return Job objects")
    return {"jobs": args.jobs, "seconds": seconds, "jobs_per_s": args.jobs / seconds, "api": api,
            "returns": "Jobs" if want_jobs else "a count"}


async def enqueue_bulk_count(flavour: Flavour, args: Any) -> dict[str, Any]:
    return await _enqueue_bulk(flavour, args, flavour.count_api, want_jobs=False)


async def enqueue_bulk_jobs(flavour: Flavour, args: Any) -> dict[str, Any]:
    return await _enqueue_bulk(flavour, args, flavour.jobs_api, want_jobs=True)


async def verify_bulk(flavour: Flavour, args: Any) -> dict[str, Any]:
    n = psql_int(args.url, f"SELECT count(*) FROM awa.jobs WHERE queue = '{QUEUE}'")
    if n != args.jobs:
        raise RuntimeError(f"bulk insert stored {n} of {args.jobs} jobs")
    return {"stored": n}


async def _drain(flavour: Flavour, args: Any, staging: bool) -> dict[str, Any]:
    client = awa.AsyncClient(args.url, max_connections=flavour.pool_size)
    handled = [0]

    if staging:

        @client.task(StageJob, queue=QUEUE)
        async def stage_handler(job: Any) -> None:
            await flavour.stage(client, job)
            handled[0] += 1

    else:

        @client.task(Noop, queue=QUEUE)
        async def noop_handler(job: Any) -> None:
            handled[0] += 1

    async def pending() -> int:
        # One transaction per poll (subtracted from the commit count as own_txns).
        tx = await client.transaction()
        row = await tx.fetch_one(
            f"SELECT count(*)::int8 AS n FROM awa.jobs WHERE queue = $1 AND state IN {PENDING_STATES}", QUEUE
        )
        await tx.commit()
        return int(row["n"])

    counters = getattr(client, "metrics", None) if flavour.name == "awa" else None
    before = counters() if counters else {}
    t0 = time.perf_counter()
    await client.start(flavour.queues(args.workers), poll_interval_ms=args.poll_ms)
    polls = await wait_drained(handled, args.jobs, pending, args.timeout_s)
    seconds = time.perf_counter() - t0
    await client.shutdown()
    after = counters() if counters else {}
    await client.close()
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "workers": args.workers,
        "seconds": seconds,
        "jobs_per_s": args.jobs / seconds,
        "own_txns": polls,
        "settings": f"start({flavour.queues(args.workers)!r}, poll_interval_ms={args.poll_ms}), "
        f"AsyncClient(max_connections={flavour.pool_size})"
        + (f", engine={flavour.engine}" if flavour.name == "awa-pg" else ""),
    }
    if staging:
        out["staging_api"] = flavour.staging_note
    if counters:
        # Where the commits go (ours only): claim statements and batched completions, one commit each.
        def per_job(name: str) -> float:
            return (after.get(name, 0) - before.get(name, 0)) / max(args.jobs, 1)

        out["engine"] = {
            "claims_per_job": per_job("CLAIM_STATEMENTS"),
            "completion_batches_per_job": per_job("COMPLETION_BATCHES"),
            "per_job_finalizations_per_job": per_job("JOBS_FINALIZED_PER_JOB"),
        }
    return out


async def verify_drain(flavour: Flavour, args: Any) -> dict[str, Any]:
    completed = psql_int(args.url, f"SELECT count(*) FROM awa.jobs WHERE queue = '{QUEUE}' AND state = 'completed'")
    return {"completed": completed}


async def verify_staging(flavour: Flavour, args: Any) -> dict[str, Any]:
    out = await verify_drain(flavour, args)
    rows = psql(
        args.url,
        f"SELECT count(*), count(DISTINCT args->>'i') FROM awa.jobs "
        f"WHERE queue = '{FOLLOW_UP_QUEUE}' AND kind = 'follow_up'",
    )
    total, distinct = int(rows[0][0]), int(rows[0][1])
    out.update(follow_ups=total, follow_ups_distinct=distinct, exactly_once=(total == args.jobs and distinct == args.jobs))
    return out


async def drain(flavour: Flavour, args: Any) -> dict[str, Any]:
    return await _drain(flavour, args, staging=False)


async def staging(flavour: Flavour, args: Any) -> dict[str, Any]:
    return await _drain(flavour, args, staging=True)


async def latency(flavour: Flavour, args: Any) -> dict[str, Any]:
    client = awa.AsyncClient(args.url, max_connections=flavour.pool_size)
    started: dict[int, float] = {}

    @client.task(Tick, queue=QUEUE)
    async def tick(job: Any) -> None:
        started[job.args.i] = time.perf_counter()

    await client.start(flavour.queues(args.workers), poll_interval_ms=args.poll_ms)
    await client.insert(Tick(i=-1), queue="warmup")  # warm the producer's connection
    await asyncio.sleep(1.5)  # let the worker go idle
    result = await pace_inserts(
        args.jobs, args.interval_ms / 1000.0, lambda i: client.insert(Tick(i=i), queue=QUEUE), started
    )
    await client.shutdown()
    await client.close()
    result["settings"] = f"poll_interval_ms={args.poll_ms}; LISTEN/NOTIFY wake-ups"
    return result


async def soak(flavour: Flavour, args: Any) -> dict[str, Any]:
    """A steady offered load for a long time, completed jobs pruned after ``--retention-s``:
    what the database looks like after it (dead tuples, size, backlog), not how fast it goes."""
    client = awa.AsyncClient(args.url, max_connections=flavour.pool_size)
    handled = [0]

    @client.task(Noop, queue=QUEUE)
    async def noop_handler(job: Any) -> None:
        handled[0] += 1

    # Only keywords both packages have (awa-pg's pruner interval is fixed; ours is left at its
    # default, 60 s, to match).
    settings = {"poll_interval_ms": args.poll_ms, "completed_retention_hours": args.retention_s / 3600.0}
    await client.start(flavour.queues(args.workers), **settings)
    bulk = getattr(client, flavour.setup_api)

    async def insert_batch(first: int, n: int) -> None:
        await bulk([Noop(i=first + k) for k in range(n)], queue=QUEUE)

    out = await soak_loop(args, insert_batch, handled)
    await client.shutdown()
    await client.close()
    out["settings"] = (f"start({flavour.queues(args.workers)!r}, {settings}), inserts: {flavour.setup_api} "
                       f"every 50 ms" + (f", engine={flavour.engine}" if flavour.name == "awa-pg" else ""))
    return out


def workloads(flavour: Flavour) -> dict[str, Workload]:
    def bind(fn: Any) -> Any:
        return lambda a: fn(flavour, a)

    return {
        "enqueue_single": Workload(bind(enqueue_single), setup=bind(setup_schema)),
        "enqueue_bulk_count": Workload(bind(enqueue_bulk_count), setup=bind(setup_schema), verify=bind(verify_bulk)),
        "enqueue_bulk_jobs": Workload(bind(enqueue_bulk_jobs), setup=bind(setup_schema), verify=bind(verify_bulk)),
        "drain": Workload(bind(drain), setup=bind(setup_noop_jobs), verify=bind(verify_drain)),
        "latency": Workload(bind(latency), setup=bind(setup_schema)),
        "staging": Workload(bind(staging), setup=bind(setup_stage_jobs), verify=bind(verify_staging)),
        "soak": Workload(bind(soak), setup=bind(setup_schema)),
    }
