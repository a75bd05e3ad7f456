"""What ``pool_mode=transaction`` through PgBouncer costs next to a direct connection.

Starts a private cluster and Debian's pgbouncer (transaction pooling, pool of 4) with the test
helpers, then, for each URL: 300 sequential single inserts (latency), and 3,000 jobs inserted
with ``insert_many`` and drained by one client with 16 workers (throughput).

    .venv/bin/python bench/pgbouncer_overhead.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import awa  # noqa: E402
from clusters import Bouncer, Cluster  # noqa: E402


@dataclasses.dataclass
class Work:
    n: int


async def measure(url: str, label: str) -> None:
    client = awa.AsyncClient(url, max_connections=8)
    await client.migrate()
    lat = []
    for i in range(300):
        t = time.perf_counter()
        await client.insert(Work(n=i), queue="lat")
        lat.append(time.perf_counter() - t)
    done = asyncio.Event()
    seen = 0
    total = 3000

    @client.task(Work, queue="thr")
    async def work(job: awa.Job) -> None:
        nonlocal seen
        seen += 1
        if seen == total:
            done.set()

    for start in range(0, total, 500):
        await client.insert_many([Work(n=i) for i in range(start, start + 500)], queue="thr")
    t = time.perf_counter()
    await client.start([("thr", 16)], poll_interval_ms=50)
    await asyncio.wait_for(done.wait(), 300)
    took = time.perf_counter() - t
    await client.shutdown()
    await client.close()
    print(f"{label:>22}: insert p50 {statistics.median(lat) * 1e3:.2f} ms, "
          f"p95 {sorted(lat)[int(len(lat) * 0.95)] * 1e3:.2f} ms; drain {total / took:.0f} jobs/s")


async def main() -> None:
    cluster = Cluster()
    bouncer = Bouncer(cluster, pool_size=4)
    try:
        for label, make in [
            ("direct", lambda db: f"postgres://postgres@127.0.0.1:{cluster.port}/{db}"),
            ("pgbouncer transaction", lambda db: bouncer.url(db)),
        ]:
            db = f"bench_{uuid.uuid4().hex[:8]}"
            cluster.psql(f'CREATE DATABASE "{db}"')
            await measure(make(db), label)
    finally:
        bouncer.stop()
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
