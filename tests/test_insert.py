"""Foundation: migrations, inserts, validation, unique jobs, transactions, admin reads."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pydantic
import pytest

import awa
from helpers import complete_jobs, wait_for


@dataclasses.dataclass
class SendEmail:
    to: str
    subject: str = "hi"


class SMTPEmail(pydantic.BaseModel):
    to: str


@dataclasses.dataclass
class HTMLToPDF:
    url: str


def test_derive_kind() -> None:
    assert awa.derive_kind("SendEmail") == "send_email"
    assert awa.derive_kind("SMTPEmail") == "smtp_email"
    assert awa.derive_kind("HTMLToPDF") == "html_to_pdf"


async def test_insert_dataclass_pydantic_and_dict(client: awa.AsyncClient) -> None:
    a = await client.insert(SendEmail(to="a@example.com"))
    assert (a.kind, a.queue, a.priority, a.max_attempts, a.state) == ("send_email", "default", 2, 25, "available")
    assert a.args == {"to": "a@example.com", "subject": "hi"}
    b = await client.insert(SMTPEmail(to="b@example.com"), queue="mail", priority=1)
    assert (b.kind, b.queue, b.priority) == ("smtp_email", "mail", 1)
    c = await client.insert({"x": 1}, kind="raw_job", tags=["t1"], metadata={"m": True})
    assert (c.kind, c.tags, c.metadata) == ("raw_job", ["t1"], {"m": True})
    with pytest.raises(awa.ValidationError, match="kind is required"):
        await client.insert({"x": 1})


async def test_get_job_has_every_attribute(client: awa.AsyncClient) -> None:
    job = await client.insert(HTMLToPDF(url="u"), ordering_key="k1")
    got = await client.get_job(job.id)
    for attr in ["id", "kind", "queue", "state", "priority", "attempt", "max_attempts", "tags",
                 "args", "metadata", "errors", "run_at", "deadline", "created_at", "finalized_at",
                 "progress"]:
        assert hasattr(got, attr), attr
    assert got.kind == "html_to_pdf"
    assert got.attempt == 0 and got.errors == [] and got.deadline is None and got.progress is None
    # awa-pg's types: a JobState and RFC 3339 text that fromisoformat parses (aware, UTC).
    assert got.state is awa.JobState.Available and got.state == "available"
    assert isinstance(got.created_at, str) and isinstance(got.run_at, str)
    assert dt.datetime.fromisoformat(got.created_at).utcoffset() == dt.timedelta(0)
    assert got.ordering_key == "k1"
    with pytest.raises(awa.JobNotFound):
        await client.get_job(10**12)


async def test_run_at_in_future_is_scheduled(client: awa.AsyncClient) -> None:
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    job = await client.insert(SendEmail(to="x"), run_at=future)
    assert job.state == "scheduled"
    assert abs((dt.datetime.fromisoformat(job.run_at) - future).total_seconds()) < 0.001
    past = await client.insert(SendEmail(to="y"), run_at=dt.datetime(2000, 1, 1))
    assert past.state == "available"


async def test_list_jobs_filters(client: awa.AsyncClient) -> None:
    await client.insert(SendEmail(to="1"), queue="q1")
    await client.insert(SendEmail(to="2"), queue="q2")
    await client.insert(HTMLToPDF(url="3"), queue="q1")
    assert len(await client.list_jobs()) == 3
    assert {j.args["to"] for j in await client.list_jobs(kind="send_email")} == {"1", "2"}
    assert len(await client.list_jobs(queue="q1")) == 2
    assert len(await client.list_jobs(state="available", queue="q2")) == 1
    assert await client.list_jobs(state="completed") == []
    with pytest.raises(awa.ValidationError):
        await client.list_jobs(state="bogus")


# (options, ok) pairs: every rule at its limit and one past it.
VALIDATION_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("priority 1", {"priority": 1}, True),
    ("priority 4", {"priority": 4}, True),
    ("priority 0", {"priority": 0}, False),
    ("priority 5", {"priority": 5}, False),
    ("max_attempts 1", {"max_attempts": 1}, True),
    ("max_attempts 1000", {"max_attempts": 1000}, True),
    ("max_attempts 0", {"max_attempts": 0}, False),
    ("max_attempts 1001", {"max_attempts": 1001}, False),
    ("kind 200", {"kind": "k" * 200}, True),
    ("kind 201", {"kind": "k" * 201}, False),
    ("queue 200", {"queue": "q" * 200}, True),
    ("queue 201", {"queue": "q" * 201}, False),
    ("20 tags", {"tags": [f"t{i}" for i in range(20)]}, True),
    ("21 tags", {"tags": [f"t{i}" for i in range(21)]}, False),
    ("run_at year 9999", {"run_at": dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc)}, True),
    ("run_at year 1", {"run_at": dt.datetime(1, 1, 2, tzinfo=dt.timezone.utc)}, True),
    ("NUL in kind", {"kind": "a\x00b"}, False),
    ("NUL in queue", {"queue": "a\x00b"}, False),
    ("NUL in tag", {"tags": ["a\x00"]}, False),
    ("NUL in metadata value", {"metadata": {"a": "\x00"}}, False),
    ("NUL in metadata key", {"metadata": {"\x00": 1}}, False),
    ("huge priority", {"priority": 10**20}, False),
    ("unique states 0", {"unique_opts": {"states": 0}}, False),
    ("unique states 256", {"unique_opts": {"states": 256}}, False),
    ("unique by_period 0", {"unique_opts": {"by_period": 0}}, False),
    ("unique unknown key", {"unique_opts": {"by_colour": True}}, False),
]


@pytest.mark.parametrize("name,opts,ok", VALIDATION_CASES, ids=[c[0] for c in VALIDATION_CASES])
async def test_validation_table(client: awa.AsyncClient, name: str, opts: dict[str, Any], ok: bool) -> None:
    opts = {"kind": "validated", **opts}
    if ok:
        job = await client.insert({"n": 1}, **opts)
        assert job.id > 0
    else:
        with pytest.raises(awa.ValidationError) as info:
            await client.insert({"n": 1}, **opts)
        assert str(info.value)
        assert await client.list_jobs() == [], "nothing partial is written"


async def test_validation_messages_name_field_size_and_limit(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError, match=r"queue is 201 characters; the limit is 200"):
        await client.insert({"n": 1}, kind="k", queue="q" * 201)
    with pytest.raises(awa.ValidationError, match=r"tags has 21 entries; the limit is 20"):
        await client.insert({"n": 1}, kind="k", tags=["t"] * 21)
    with pytest.raises(awa.ValidationError, match=r"args.n contains a NUL byte"):
        await client.insert({"n": "\x00"}, kind="k")


async def test_serialization_errors(client: awa.AsyncClient) -> None:
    # NaN is a value JSON cannot hold: refused as invalid, with its path.
    with pytest.raises(awa.ValidationError, match=r"args\.f is nan"):
        await client.insert({"f": float("nan")}, kind="k")
    with pytest.raises(awa.SerializationError):
        await client.insert({"o": object()}, kind="k")
    with pytest.raises(awa.ValidationError, match="args must be a dataclass, a Pydantic model or a dict, not list"):
        await client.insert(["not", "a", "dict"], kind="k")


async def test_unique_defaults_and_conflict(client: awa.AsyncClient) -> None:
    await client.insert(SendEmail(to="u"), unique_opts={})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail(to="u"), unique_opts={})
    # by_args: different args are different keys; the queue is not part of the key by default.
    await client.insert(SendEmail(to="v"), unique_opts={})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail(to="u"), queue="other", unique_opts={})
    # Without unique options there is no deduplication.
    await client.insert(SendEmail(to="u"))


async def test_unique_by_queue_by_args_false_and_by_period(client: awa.AsyncClient) -> None:
    await client.insert(SendEmail(to="a"), queue="q1", unique_opts={"by_queue": True})
    await client.insert(SendEmail(to="a"), queue="q2", unique_opts={"by_queue": True})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail(to="a"), queue="q1", unique_opts={"by_queue": True})

    await client.insert(HTMLToPDF(url="1"), unique_opts={"by_args": False})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(HTMLToPDF(url="2"), unique_opts={"by_args": False})

    t0 = dt.datetime(2030, 1, 1, 0, 0, 10, tzinfo=dt.timezone.utc)
    p = {"by_period": 60}
    await client.insert({"a": 1}, kind="periodic", run_at=t0, unique_opts=p)
    with pytest.raises(awa.UniqueConflict):
        await client.insert({"a": 1}, kind="periodic", run_at=t0 + dt.timedelta(seconds=30), unique_opts=p)
    await client.insert({"a": 1}, kind="periodic", run_at=t0 + dt.timedelta(seconds=60), unique_opts=p)


async def test_states_mask_and_release(client: awa.AsyncClient) -> None:
    only_available = awa.unique_states(["available"])
    job = await client.insert({"a": 1}, kind="masked", unique_opts={"states": only_available})
    with pytest.raises(awa.UniqueConflict):
        await client.insert({"a": 1}, kind="masked", unique_opts={"states": only_available})
    # A job whose state leaves the mask releases its key.
    await complete_jobs(client, [job.id])
    again = await client.insert({"a": 1}, kind="masked", unique_opts={"states": only_available})
    assert again.id != job.id
    assert awa.DEFAULT_UNIQUE_STATES == 0b11111


async def test_transactional_enqueue(client: awa.AsyncClient) -> None:
    tx = await client.transaction()
    rolled = await tx.insert(SendEmail(to="rollback"))
    await tx.rollback()
    with pytest.raises(awa.JobNotFound):
        await client.get_job(rolled.id)

    async with client.transaction() as tx2:
        kept = await tx2.insert(SendEmail(to="commit"))
        row = await tx2.fetch_one("SELECT count(*) AS n, $1::text AS label FROM awa.jobs", "x")
        assert row == {"n": 1, "label": "x"}
        assert await tx2.fetch_optional("SELECT id FROM awa.jobs WHERE id = $1", -1) is None
        many = await tx2.insert_many([SendEmail(to="m1"), (SendEmail(to="m2"), {"priority": 3})])
        assert [j.priority for j in many] == [2, 3]
    assert (await client.get_job(kept.id)).args["to"] == "commit"

    with pytest.raises(RuntimeError):
        async with client.transaction() as tx3:
            await tx3.insert(SendEmail(to="boom"))
            raise RuntimeError("boom")
    assert [j for j in await client.list_jobs() if j.args.get("to") == "boom"] == []


async def test_insert_many_is_all_or_nothing(client: awa.AsyncClient) -> None:
    jobs = await client.insert_many([SendEmail(to=str(i)) for i in range(50)], queue="bulk")
    assert [j.args["to"] for j in jobs] == [str(i) for i in range(50)]
    await client.insert(SendEmail(to="dupe"), unique_opts={})
    with pytest.raises(awa.UniqueConflict):
        await client.insert_many([SendEmail(to="fresh"), SendEmail(to="dupe")], unique_opts={})
    assert [j for j in await client.list_jobs(limit=1000) if j.args["to"] == "fresh"] == []
    with pytest.raises(awa.ValidationError):
        await client.insert_many([SendEmail(to="ok"), (SendEmail(to="bad"), {"priority": 9})])
    assert len(await client.list_jobs(limit=1000)) == 51



# ----- enqueue_many_copy / insert_many_copy: the COPY bulk path -----------------------------

AWKWARD_ARGS = {
    "tab": "a\tb",
    "newline": "line1\nline2\r\nline3",
    "backslash": "C:\\path\\N and \\. and \\\\",
    "quotes": "\"double\" 'single'",
    "copy_null": "\\N",
    "csv": "a,b;\"c\"",
    "array_syntax": "{1,2} NULL",
    "control": "\x01\x07\x1b[0m",
    "unicode": "é 漢字 🎉 \u2028",
    "nested": [1, -2.5, 1e300, None, True, {"k": "v", "empty": {}}, []],
    "key with \"quote\" and \\": "ok",
}


def _columns(job: awa.Job) -> tuple[Any, ...]:
    return (job.kind, job.queue, job.state, job.priority, job.max_attempts, job.tags, job.args,
            job.metadata, job.ordering_key, job.attempt, job.errors, job.progress)


async def test_copy_stores_what_insert_many_stores(client: awa.AsyncClient) -> None:
    options = dict(queue="copy q", priority=1, max_attempts=7, tags=["a,b", "{x}", "\"q\"", "back\\slash", "NULL"],
                   metadata={"trace": "x\ny", "deep": {"a": [1, "\\"]}}, ordering_key="o\tk")
    batch: list[Any] = [
        SendEmail(to="a@example.com"),
        SMTPEmail(to="b@example.com"),
        (AWKWARD_ARGS, {"kind": "awkward", "priority": 3, "tags": []}),
        (HTMLToPDF(url="u"), {"queue": "other", "metadata": {"own": True}}),
    ]
    assert await client.enqueue_many_copy(batch, **options) == 4
    copied = sorted(await client.list_jobs(limit=100), key=lambda j: j.id)
    expected = await client.insert_many(batch, **options)
    assert [_columns(j) for j in copied] == [_columns(j) for j in expected]
    assert copied[2].args == AWKWARD_ARGS, "special characters survive"
    assert [j.kind for j in copied] == ["send_email", "smtp_email", "awkward", "html_to_pdf"]
    assert (copied[2].priority, copied[2].tags, copied[3].queue, copied[3].metadata) == (3, [], "other", {"own": True})
    assert all(j.state == "available" for j in copied)


async def test_copy_schedules_future_run_at(client: awa.AsyncClient) -> None:
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    past = dt.datetime(2000, 1, 1)  # naive: taken as UTC
    n = await client.enqueue_many_copy([
        (SendEmail(to="later"), {"run_at": future}),
        (SendEmail(to="past"), {"run_at": past}),
        SendEmail(to="now"),
    ])
    assert n == 3
    jobs = {j.args["to"]: j for j in await client.list_jobs()}
    assert jobs["later"].state == "scheduled"
    assert abs((dt.datetime.fromisoformat(jobs["later"].run_at) - future).total_seconds()) < 0.001
    assert (jobs["past"].state, dt.datetime.fromisoformat(jobs["past"].run_at)) == (
        "available", past.replace(tzinfo=dt.timezone.utc))
    assert jobs["now"].state == "available"
    assert abs((dt.datetime.fromisoformat(jobs["now"].run_at) - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 60
    # A shared run_at applies to every job.
    await client.enqueue_many_copy([SendEmail(to="s1"), SendEmail(to="s2")], run_at=future)
    assert len(await client.list_jobs(state="scheduled")) == 3


async def test_copy_unique_conflict_writes_nothing(client: awa.AsyncClient) -> None:
    await client.insert(SendEmail(to="dupe"), unique_opts={})
    fresh = [SendEmail(to=f"fresh{i}") for i in range(3000)]
    with pytest.raises(awa.UniqueConflict):
        await client.enqueue_many_copy([*fresh, SendEmail(to="dupe")], unique_opts={})
    with pytest.raises(awa.UniqueConflict):
        await client.enqueue_many_copy([SendEmail(to="twin"), SendEmail(to="twin")], unique_opts={})
    assert len(await client.list_jobs(limit=10_000)) == 1
    assert await client.enqueue_many_copy(fresh, unique_opts={}) == 3000
    assert len(await client.list_jobs(limit=10_000)) == 3001


BAD_COPY_INPUT: list[tuple[str, list[Any], dict[str, Any], type]] = [
    ("priority 9 on one job", [SendEmail(to="ok"), (SendEmail(to="bad"), {"priority": 9})], {}, awa.ValidationError),
    ("shared max_attempts 0", [SendEmail(to="a")], {"max_attempts": 0}, awa.ValidationError),
    ("21 tags", [SendEmail(to="a")], {"tags": [f"t{i}" for i in range(21)]}, awa.ValidationError),
    ("queue 201", [SendEmail(to="a")], {"queue": "q" * 201}, awa.ValidationError),
    ("NUL in args", [SendEmail(to="ok"), SendEmail(to="a\x00b")], {}, awa.ValidationError),
    ("NUL in a tag", [SendEmail(to="a")], {"tags": ["a\x00"]}, awa.ValidationError),
    ("dict without kind", [SendEmail(to="ok"), {"x": 1}], {}, awa.ValidationError),
    ("unknown unique option", [SendEmail(to="a")], {"unique_opts": {"by_colour": True}}, awa.ValidationError),
    ("run_at not a datetime", [SendEmail(to="a")], {"run_at": "tomorrow"}, awa.ValidationError),
    ("NaN in args", [{"f": float("nan")}], {"kind": "k"}, awa.ValidationError),
    ("object in args", [{"o": object()}], {"kind": "k"}, awa.SerializationError),
    ("args a list", [["not", "a", "dict"]], {"kind": "k"}, awa.ValidationError),
    ("metadata not JSON", [SendEmail(to="a")], {"metadata": {"o": object()}}, awa.SerializationError),
]


@pytest.mark.parametrize("name,batch,opts,error", BAD_COPY_INPUT, ids=[c[0] for c in BAD_COPY_INPUT])
async def test_copy_bad_input_is_typed_and_writes_nothing(
    client: awa.AsyncClient, name: str, batch: list[Any], opts: dict[str, Any], error: type
) -> None:
    with pytest.raises(error) as info:
        await client.enqueue_many_copy(batch, **opts)
    assert str(info.value)
    with pytest.raises(error):
        await client.insert_many_copy(batch, **opts)
    # insert_many refuses the same input with the same error.
    with pytest.raises(error):
        await client.insert_many(batch, **opts)
    assert await client.list_jobs() == [], "nothing partial is written"


async def test_copy_follows_the_transaction(client: awa.AsyncClient) -> None:
    tx = await client.transaction()
    assert await tx.enqueue_many_copy([SendEmail(to="r1"), SendEmail(to="r2")]) == 2
    assert [j.args["to"] for j in await tx.insert_many_copy([SendEmail(to="r3")])] == ["r3"]
    assert (await tx.fetch_one("SELECT count(*) AS n FROM awa.jobs"))["n"] == 3
    assert await client.list_jobs() == [], "invisible outside the transaction"
    await tx.rollback()
    assert await client.list_jobs() == []

    async with client.transaction() as tx2:
        await tx2.insert(SendEmail(to="own"))
        assert await tx2.enqueue_many_copy([SendEmail(to="c1"), (SendEmail(to="c2"), {"queue": "q2"})]) == 2
    assert sorted(j.args["to"] for j in await client.list_jobs()) == ["c1", "c2", "own"]

    with pytest.raises(awa.UniqueConflict):
        async with client.transaction() as tx3:
            await tx3.insert(SendEmail(to="lost"))
            await tx3.enqueue_many_copy([SendEmail(to="t"), SendEmail(to="t")], unique_opts={})
    assert len(await client.list_jobs()) == 3, "the conflict rolled the whole transaction back"

    tx4 = await client.transaction()
    await tx4.commit()
    with pytest.raises(awa.AwaError, match="already committed"):
        await tx4.enqueue_many_copy([SendEmail(to="late")])


async def test_copy_wakes_an_idle_worker(client: awa.AsyncClient) -> None:
    done: list[int] = []

    @client.task(SendEmail, queue="copy_wake")
    async def handle(job: awa.Job) -> None:
        done.append(job.id)

    # Polling every minute: only the insert trigger's NOTIFY can start these jobs in time.
    await client.start([("copy_wake", 4)], poll_interval_ms=60_000)
    try:
        # Insert only once the listener has subscribed (its LISTEN is its last statement).
        async def listening() -> bool:
            async with client.transaction() as tx:
                row = await tx.fetch_one(
                    "SELECT count(*) AS n FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%copy_wake%'"
                )
                await tx.commit()
            return bool(row["n"])

        await wait_for(listening, what="the listener to subscribe")
        assert await client.enqueue_many_copy([SendEmail(to=str(i)) for i in range(5)], queue="copy_wake") == 5
        await wait_for(lambda: len(done) == 5, timeout=10, what="the COPY-inserted jobs to run")
    finally:
        await client.shutdown()


async def test_insert_many_copy_returns_the_jobs_in_input_order(client: awa.AsyncClient) -> None:
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    batch: list[Any] = [SendEmail(to=f"j{i}") for i in range(300)]
    batch[7] = (SendEmail(to="j7"), {"run_at": future, "priority": 1})
    jobs = await client.insert_many_copy(batch, queue="ret", tags=["t"])
    assert [j.args["to"] for j in jobs] == [f"j{i}" for i in range(300)], "input order"
    assert len({j.id for j in jobs}) == 300
    assert all(isinstance(j, awa.Job) and j.queue == "ret" and j.tags == ["t"] for j in jobs)
    assert (jobs[7].state, jobs[7].priority) == ("scheduled", 1)
    assert jobs[0].state == "available" and jobs[0].created_at is not None
    for job in (jobs[0], jobs[7], jobs[-1]):
        assert _columns(await client.get_job(job.id)) == _columns(job), "what is stored"
    assert await client.insert_many_copy([]) == []


async def test_copy_takes_awa_pg_per_job_opts(client: awa.AsyncClient) -> None:
    jobs = await client.insert_many_copy(
        [SendEmail(to="a"), SendEmail(to="b"), SendEmail(to="c")],
        queue="shared", opts=[None, {"queue": "own", "ordering_key": "k1"}, {"priority": 4}],
    )
    assert [(j.queue, j.ordering_key, j.priority) for j in jobs] == [
        ("shared", None, 2), ("own", "k1", 2), ("shared", None, 4)]
    assert await client.enqueue_many_copy([SendEmail(to="d")], opts=[{"queue": "own"}]) == 1
    with pytest.raises(awa.ValidationError, match="opts has 1 entries for 2 jobs"):
        await client.enqueue_many_copy([SendEmail(to="e"), SendEmail(to="f")], opts=[None])
    with pytest.raises(awa.ValidationError):
        await client.insert_many_copy([SendEmail(to="g")], opts=[{"priority": 0}])
    assert len(await client.list_jobs(limit=100)) == 4, "the refused batches wrote nothing"


def test_blocking_copy(sync_client: awa.Client) -> None:
    assert sync_client.enqueue_many_copy([]) == 0
    assert sync_client.enqueue_many_copy([SendEmail(to=str(i)) for i in range(10)], queue="sync") == 10
    with sync_client.transaction() as tx:
        assert tx.enqueue_many_copy([SendEmail(to="tx")]) == 1
        assert [j.args["to"] for j in tx.insert_many_copy([SendEmail(to="tx2")])] == ["tx2"]
    assert [j.args["to"] for j in sync_client.insert_many_copy([SendEmail(to="s")], queue="sync")] == ["s"]
    assert len(sync_client.list_jobs(queue="sync")) == 11
    assert len(sync_client.list_jobs(kind="send_email")) == 13

def test_blocking_client(sync_client: awa.Client) -> None:
    job = sync_client.insert(SendEmail(to="sync"))
    assert sync_client.get_job(job.id).args["to"] == "sync"
    with sync_client.transaction() as tx:
        tx.insert(SendEmail(to="sync-tx"))
        assert tx.fetch_all("SELECT kind FROM awa.jobs ORDER BY id") == [{"kind": "send_email"}] * 2
    assert len(sync_client.list_jobs(kind="send_email")) == 2


def test_schema_not_migrated(empty_database: str) -> None:
    with awa.Client(empty_database) as c:
        with pytest.raises(awa.SchemaNotMigrated):
            c.insert(SendEmail(to="x"))


def test_concurrent_migrate_from_two_processes(empty_database: str) -> None:
    code = "import awa, sys; c = awa.Client(sys.argv[1]); c.migrate(); c.migrate(); print('ok')"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, empty_database], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    with awa.Client(empty_database) as c:
        assert c.insert(SendEmail(to="after")).id == 1


def test_wheel_installs_into_fresh_virtualenv(tmp_path: Path) -> None:
    wheel = os.environ.get("AWA_WHEEL")
    if not wheel:
        pytest.skip("AWA_WHEEL is set by scripts/test.sh after building the wheel")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", wheel], check=True)
    out = subprocess.run(
        [str(py), "-c", "import awa; print(awa.derive_kind('SMTPEmail'), awa.AsyncClient.__name__)"],
        check=True, capture_output=True, text=True,
    )
    assert out.stdout.split() == ["smtp_email", "AsyncClient"]
