"""The ``awa`` command line against a real database: every command's output, ``--json``,
exit codes and one-line errors (no tracebacks). Each test runs ``python -m awa`` (and one the
console script) as a subprocess, as an operator would."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import awa
from awa._cli import Progress, main
from helpers import fail_jobs

BIN = pathlib.Path(sys.executable).parent


def run(url: str | None, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``awa [--database-url URL] ARGV...`` in this process (what the console script runs:
    ``awa._cli.main``), without DATABASE_URL unless ``env`` gives it."""
    prefix = ["--database-url", url] if url else []
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.pop("DATABASE_URL", None)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([*prefix, *argv])
            except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
                code = int(exc.code or 0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def run_process(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m awa ARGV...`` as a real process."""
    full_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "awa", *argv], capture_output=True, text=True, env=full_env,
                          timeout=120)


def ok(url: str | None, *argv: str) -> str:
    p = run(url, *argv)
    assert p.returncode == 0, (argv, p.stdout, p.stderr)
    return p.stdout


def as_json(url: str | None, *argv: str) -> Any:
    return json.loads(ok(url, *argv, "--json"))


def fails(url: str | None, code: int, *argv: str, env: dict[str, str] | None = None) -> str:
    p = run(url, *argv, env=env)
    assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr  # one line, never a traceback
    assert "Traceback" not in p.stderr
    return lines[0]


def insert(sync_client: awa.Client, n: int = 1, **opts: Any) -> list[int]:
    opts.setdefault("kind", "demo")
    return [sync_client.insert({"n": i}, **opts).id for i in range(n)]


def fail_job(sync_client: awa.Client, job_id: int, error: str = "boom") -> None:
    """Fail a job as a worker does on a terminal error (``helpers.fail_jobs``)."""
    sync_client._run(fail_jobs(sync_client._async, [job_id], error))


# ----- help, usage, connection -----------------------------------------------------------


@pytest.mark.parametrize("argv", [
    [], ["job"], ["queue"], ["dlq"], ["cron"], ["migrate"], ["serve"], ["callbacks", "serve"],
    ["job", "list"], ["dlq", "retry-bulk"], ["dlq", "move"],
])
def test_help_everywhere(argv: list[str]) -> None:
    p = run(None, *argv, "--help")
    assert p.returncode == 0
    assert p.stdout.startswith("usage: awa")


def test_console_script_is_installed() -> None:
    p = subprocess.run([str(BIN / "awa"), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "migrate" in p.stdout and "serve" in p.stdout


def test_python_dash_m_runs_the_command_line_as_a_process(database_url: str) -> None:
    p = run_process("job", "dump", "999999", env={"DATABASE_URL": database_url})
    assert (p.returncode, p.stdout, p.stderr) == (3, "", "awa: error: job 999999 not found\n")
    p = run_process("nope")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2_with_one_line() -> None:
    assert "invalid choice" in fails(None, 2, "nope")
    assert "positive integer" in fails("postgres://x@127.0.0.1:1/x", 2, "job", "dump", "abc")
    assert "invalid choice" in fails("postgres://x@127.0.0.1:1/x", 2, "job", "list", "--state", "sleeping")


def test_no_database_url_is_a_usage_error() -> None:
    assert "DATABASE_URL" in fails(None, 2, "job", "list")


def test_unreachable_database_exits_4_quickly() -> None:
    line = fails("postgres://postgres@127.0.0.1:1/postgres", 4, "queue", "stats")
    assert "cannot reach the database at 127.0.0.1:1" in line


def test_url_from_the_environment(database_url: str) -> None:
    p = run(None, "queue", "stats", env={"DATABASE_URL": database_url})
    assert p.returncode == 0 and p.stdout == "No queues found.\n"


def test_json_flag_before_or_after_the_command(database_url: str) -> None:
    assert json.loads(ok(database_url, "--json", "queue", "stats")) == []
    assert json.loads(ok(database_url, "queue", "stats", "--json")) == []


# ----- migrate ---------------------------------------------------------------------------


def test_migrate_applies_then_is_a_no_op(empty_database: str) -> None:
    out = ok(empty_database, "migrate")
    assert out == f"Migrated the awa schema from version 0 to {awa._awa.SCHEMA_VERSION}.\n"
    assert "nothing to apply" in ok(empty_database, "migrate")
    assert as_json(empty_database, "migrate")["from_version"] == awa._awa.SCHEMA_VERSION


def test_migrate_on_an_unmigrated_schema_error_names_the_fix(empty_database: str) -> None:
    line = fails(empty_database, 4, "job", "list")
    assert line.startswith("awa: error: the awa schema is not migrated")


def test_migrate_sql_needs_no_database() -> None:
    sql = ok(None, "migrate", "--sql")
    assert sql.startswith("BEGIN;") and sql.rstrip().endswith("COMMIT;")
    assert "CREATE TABLE awa.jobs" in sql
    partial = ok(None, "migrate", "--sql", "--from", "4", "--to", "5")
    assert "-- awa migration 5" in partial and "-- awa migration 4" not in partial
    doc = as_json(None, "migrate", "--sql", "--from", "1", "--to", "3")
    assert doc["versions"] == [2, 3]


def psql(url: str, script: str) -> None:
    """Run a multi-statement script the way a schema owner would (psql, stop on error)."""
    found = shutil.which("psql") or next(iter(sorted(pathlib.Path("/usr/lib/postgresql").glob("*/bin/psql"),
                                                      reverse=True)), None)
    if found is None:
        pytest.skip("psql is not installed")
    subprocess.run([str(found), "-q", "-v", "ON_ERROR_STOP=1", url], input=script, text=True, check=True,
                   capture_output=True, timeout=120)


def test_migrate_sql_applies_cleanly(empty_database: str) -> None:
    sql = ok(None, "migrate", "--sql", "--to", "3")
    psql(empty_database, sql)
    pending = ok(empty_database, "migrate", "--pending", "--sql")
    assert "-- awa migration 4" in pending and "-- awa migration 3" not in pending
    psql(empty_database, pending)
    assert "nothing to apply" in ok(empty_database, "migrate")


def test_migrate_extract_to(tmp_path: pathlib.Path) -> None:
    out = ok(None, "migrate", "--extract-to", str(tmp_path / "m"))
    files = sorted(p.name for p in (tmp_path / "m").iterdir())
    versions = [v for v, _, _ in awa.migrations()]  # versions need not be contiguous
    assert versions[-1] == awa._awa.SCHEMA_VERSION
    assert files == sorted(f"V{v}__awa.sql" for v in versions)
    assert len(out.splitlines()) == len(versions)
    assert "INSERT INTO awa.schema_version (version) VALUES (2);" in (tmp_path / "m" / "V2__awa.sql").read_text()


def test_migrate_bad_ranges() -> None:
    assert "after --to" in fails(None, 2, "migrate", "--sql", "--from", "3", "--to", "2")
    assert "versions run from 0" in fails(None, 2, "migrate", "--sql", "--to", "999")


def test_migrate_extract_to_an_unwritable_place(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "cannot write to" in fails(None, 1, "migrate", "--extract-to", str(blocker / "sub"))


# ----- job -------------------------------------------------------------------------------


def test_job_list_table_json_filters_and_paging(database_url: str, sync_client: awa.Client) -> None:
    assert ok(database_url, "job", "list") == "No jobs found.\n"
    ids = insert(sync_client, 3, queue="q1", tags=["red"])
    other = insert(sync_client, 1, kind="other", queue="q2")[0]
    out = ok(database_url, "job", "list")
    assert out.splitlines()[0].split() == ["ID", "KIND", "QUEUE", "STATE", "ATTEMPT", "MAX", "RUN_AT"]
    assert len(out.splitlines()) == 5
    page = as_json(database_url, "job", "list", "--limit", "2")
    assert [j["id"] for j in page["jobs"]] == [other, ids[2]]
    assert page["next_before_id"] == ids[2]
    rest = as_json(database_url, "job", "list", "--limit", "2", "--before-id", str(ids[2]))
    assert [j["id"] for j in rest["jobs"]] == [ids[1], ids[0]] and rest["next_before_id"] is None
    assert [j["id"] for j in as_json(database_url, "job", "list", "--kind", "other")["jobs"]] == [other]
    assert len(as_json(database_url, "job", "list", "--queue", "q1")["jobs"]) == 3
    assert len(as_json(database_url, "job", "list", "--tag", "red")["jobs"]) == 3
    assert as_json(database_url, "job", "list", "--state", "failed")["jobs"] == []
    assert "More: --before-id" in ok(database_url, "job", "list", "--limit", "1")


def test_job_dump_and_dump_run(database_url: str, sync_client: awa.Client) -> None:
    job_id = insert(sync_client)[0]
    doc = json.loads(ok(database_url, "job", "dump", str(job_id)))
    assert doc["id"] == job_id and doc["args"] == {"n": 0} and doc["attempts"] == []
    assert "has not run yet" in fails(database_url, 3, "job", "dump-run", str(job_id))
    fail_job(sync_client, job_id, "it broke")
    run_doc = json.loads(ok(database_url, "job", "dump-run", str(job_id)))
    assert run_doc["attempt"] == 1 and run_doc["error"] == "it broke"
    assert run_doc["traceback"].startswith("Traceback")
    assert json.loads(ok(database_url, "job", "dump-run", str(job_id), "--attempt", "1"))["attempt"] == 1
    assert "has no attempt 2" in fails(database_url, 3, "job", "dump-run", str(job_id), "--attempt", "2")
    assert fails(database_url, 3, "job", "dump", "999999") == "awa: error: job 999999 not found"


def test_job_cancel_and_retry(database_url: str, sync_client: awa.Client) -> None:
    job_id = insert(sync_client)[0]
    assert ok(database_url, "job", "cancel", str(job_id)) == f"Cancelled job {job_id}.\n"
    assert ok(database_url, "job", "cancel", str(job_id)) == f"Job {job_id} is already cancelled.\n"
    assert ok(database_url, "job", "retry", str(job_id)) == f"Retried job {job_id} (now available).\n"
    line = fails(database_url, 1, "job", "retry", str(job_id))
    assert "only failed, cancelled, retryable or scheduled jobs can be retried" in line
    assert as_json(database_url, "job", "cancel", str(job_id))["state"] == "cancelled"
    assert as_json(database_url, "job", "retry", str(job_id))["state"] == "available"
    assert fails(database_url, 3, "job", "cancel", "999999") == "awa: error: job 999999 not found"
    assert fails(database_url, 3, "job", "retry", "999999") == "awa: error: job 999999 not found"


def test_job_retry_failed_and_discard(database_url: str, sync_client: awa.Client) -> None:
    a = insert(sync_client, 2, kind="a", queue="qa")
    b = insert(sync_client, 1, kind="b", queue="qb")
    for job_id in a + b:
        fail_job(sync_client, job_id)
    assert "exactly one of --kind or --queue" in fails(database_url, 2, "job", "retry-failed")
    assert "exactly one" in fails(database_url, 2, "job", "retry-failed", "--kind", "a", "--queue", "qa")
    assert ok(database_url, "job", "retry-failed", "--kind", "a") == "Retried 2 failed jobs of kind 'a'.\n"
    assert as_json(database_url, "job", "retry-failed", "--queue", "qb") == {"retried": 1}
    fail_job(sync_client, b[0])
    assert ok(database_url, "job", "discard", "--kind", "b") == "Discarded 1 failed jobs of kind 'b'.\n"
    assert as_json(database_url, "job", "discard", "--kind", "b") == {"discarded": 0}
    assert "--kind" in fails(database_url, 2, "job", "discard")


# ----- queue -----------------------------------------------------------------------------


def test_queue_stats_pause_resume_drain(database_url: str, sync_client: awa.Client) -> None:
    insert(sync_client, 3, queue="mail")
    out = ok(database_url, "queue", "stats")
    header, row = out.splitlines()
    assert header.split()[:3] == ["QUEUE", "PAUSED", "AVAILABLE"]
    assert row.split()[:3] == ["mail", "no", "3"]
    assert ok(database_url, "queue", "pause", "mail") == "Paused queue 'mail'.\n"
    stats = as_json(database_url, "queue", "stats")
    assert stats[0]["paused"] is True and stats[0]["counts"]["available"] == 3
    assert ok(database_url, "queue", "resume", "mail") == "Resumed queue 'mail'.\n"
    assert as_json(database_url, "queue", "pause", "mail") == {"queue": "mail", "paused": True}
    assert ok(database_url, "queue", "drain", "mail") == "Drained queue 'mail': cancelled 3 pending jobs.\n"
    assert as_json(database_url, "queue", "drain", "mail") == {"queue": "mail", "cancelled": 0}
    assert as_json(database_url, "queue", "stats")[0]["counts"]["cancelled"] == 3


# ----- cron ------------------------------------------------------------------------------


def test_cron_list_and_remove(database_url: str, sync_client: awa.Client) -> None:
    assert ok(database_url, "cron", "list") == "No cron schedules found.\n"
    sync_client._run(sync_client._async._execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args) "
        "VALUES ('nightly', '0 3 * * *', 'UTC', 'report', 'default', '{}')"))
    out = ok(database_url, "cron", "list")
    assert out.splitlines()[1].split()[:2] == ["nightly", "0"]
    assert as_json(database_url, "cron", "list")[0]["name"] == "nightly"
    assert ok(database_url, "cron", "remove", "nightly") == "Removed cron schedule 'nightly'.\n"
    assert fails(database_url, 3, "cron", "remove", "nightly") == "awa: error: cron schedule 'nightly' not found"


# ----- dlq -------------------------------------------------------------------------------


def dead(sync_client: awa.Client, n: int, **opts: Any) -> list[int]:
    ids = insert(sync_client, n, **opts)
    for job_id in ids:
        fail_job(sync_client, job_id)
    return ids


def test_dlq_move_depth_list_retry_purge(database_url: str, sync_client: awa.Client) -> None:
    a = dead(sync_client, 3, kind="a", queue="qa", tags=["x"])
    b = dead(sync_client, 2, kind="b", queue="qb")
    assert ok(database_url, "dlq", "depth") == "Total: 0\n"
    assert "pass a filter" in fails(database_url, 2, "dlq", "move")
    assert "cannot be combined" in fails(database_url, 2, "dlq", "move", "--all", "--kind", "a")
    assert ok(database_url, "dlq", "move", "--kind", "a") == "Moved 3 failed jobs to the DLQ.\n"
    assert as_json(database_url, "dlq", "move", "--all", "--reason", "manual") == {"moved": 2}
    assert ok(database_url, "dlq", "depth") == "Total: 5\n  qa: 3\n  qb: 2\n"
    assert ok(database_url, "dlq", "depth", "--queue", "qa") == "qa: 3\n"
    assert as_json(database_url, "dlq", "depth") == {"total": 5, "by_queue": {"qa": 3, "qb": 2}}
    listing = as_json(database_url, "dlq", "list", "--limit", "2")
    assert [r["id"] for r in listing["jobs"]] == [b[1], b[0]] and listing["next_before_id"] == b[0]
    assert listing["jobs"][0]["reason"] == "manual"
    assert [r["id"] for r in as_json(database_url, "dlq", "list", "--tag", "x")["jobs"]] == a[::-1]
    assert "REASON" in ok(database_url, "dlq", "list")
    assert ok(database_url, "dlq", "retry", str(a[0])) == f"Retried DLQ job {a[0]} (now available).\n"
    assert fails(database_url, 3, "dlq", "retry", str(a[0])) == f"awa: error: DLQ job {a[0]} not found"
    assert "pass a filter" in fails(database_url, 2, "dlq", "retry-bulk")
    assert ok(database_url, "dlq", "retry-bulk", "--queue", "qa") == "Retried 2 DLQ jobs.\n"
    assert as_json(database_url, "dlq", "retry-all", "--kind", "nothing") == {"retried": 0}
    assert "pass a filter" in fails(database_url, 2, "dlq", "purge")
    assert ok(database_url, "dlq", "purge", "--kind", "b") == "Purged 2 DLQ jobs.\n"
    assert as_json(database_url, "dlq", "purge", "--all") == {"purged": 0}
    assert ok(database_url, "dlq", "list") == "The DLQ is empty (no matching rows).\n"


def test_progress_bar_renders_on_a_terminal() -> None:
    import io

    stream = io.StringIO()
    bar = Progress(4, "moving", stream=stream, force=True)
    bar.advance(2)
    bar.advance(2)
    bar.close()
    assert stream.getvalue().endswith("] 4/4\n") and "#" * 15 in stream.getvalue()
    quiet = io.StringIO()
    Progress(4, "moving", stream=quiet).advance(4)  # not a terminal: silent
    assert quiet.getvalue() == ""


# ----- serve and callbacks serve (start-up checks; the routes are in test_serve.py) -------


def test_serve_refuses_a_port_in_use(database_url: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = fails(database_url, 1, "serve", "--port", str(port))
        assert line.startswith(f"awa: error: cannot listen on 127.0.0.1:{port}")


def test_callbacks_serve_needs_a_secret_or_an_explicit_opt_out(database_url: str) -> None:
    assert "--allow-unsigned" in fails(database_url, 2, "callbacks", "serve")
    # The key of awa-pg's signature is 32 bytes: 64 hex characters or 32 bytes of text.
    assert "64 hex characters or 32 bytes (got 5 bytes)" in fails(
        database_url, 2, "callbacks", "serve", "--secret", "short")


def test_callback_secret_forms() -> None:
    from awa._cli import UsageError, callback_secret

    assert callback_secret("00" * 32) == bytes(32)
    assert callback_secret("k" * 32) == b"k" * 32
    with pytest.raises(UsageError):
        callback_secret("zz" * 32)  # 64 characters, not hex, and not 32 bytes
