"""What a new user does first, run inside a fresh virtualenv that holds only an installed wheel.

Run by tests/test_wheel.py as ``<venv python> wheel_smoke.py DATABASE_URL`` under each Python
version the wheel claims to support, from a directory outside the checkout, so that what is
imported is the installed wheel and nothing else. It migrates an empty database, inserts a job,
starts a worker whose handler stages a follow-up, and waits until both have run. It prints one
``ok`` line (Python version, where awa was imported from, the native module's file) and exits 0,
or raises.

Standard library only: the virtualenv has no pytest, and the wheel depends on nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

import awa
import awa._awa


@dataclasses.dataclass
class Greet:
    name: str


@dataclasses.dataclass
class Greeted:
    name: str


async def wait_completed(client: awa.AsyncClient, job_id: int, timeout: float = 60.0) -> awa.Job:
    """Completions are batched: the handler having returned is not yet the row saying so."""
    deadline = time.monotonic() + timeout
    while True:
        job = await client.get_job(job_id)
        if job.state == "completed":
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job.state!r} after {timeout} s")
        await asyncio.sleep(0.05)


async def main(url: str) -> None:
    client = awa.AsyncClient(url)
    try:
        await client.migrate()
        followed_up = asyncio.Event()
        seen: list[str] = []

        @client.task(Greet, queue="smoke")
        async def greet(job: awa.Job) -> None:
            seen.append(job.args.name)
            job.enqueue_on_completion(Greeted(job.args.name), queue="smoke")

        @client.task(Greeted, queue="smoke")
        async def greeted(job: awa.Job) -> None:
            seen.append("followed up " + job.args.name)
            followed_up.set()

        job = await client.insert(Greet("ada"), queue="smoke")
        await client.start([("smoke", 2)])
        try:
            await asyncio.wait_for(followed_up.wait(), timeout=60)
            done = await wait_completed(client, job.id)
        finally:
            await client.shutdown()
        assert done.attempt == 1, done
        assert seen == ["ada", "followed up ada"], seen
    finally:
        await client.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: wheel_smoke.py DATABASE_URL")
    asyncio.run(main(sys.argv[1]))
    version = ".".join(map(str, sys.version_info[:3]))
    print(f"ok python={version} awa={awa.__version__} package={awa.__file__} native={awa._awa.__file__}")
