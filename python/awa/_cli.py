"""The ``awa`` command line (console script ``awa`` and ``python -m awa``).

awa-cli 0.6.9's command tree (docs/operating.md lists it and the differences). Tables for
people by default, ``--json`` for scripts; errors are one line on stderr, never a traceback.

Exit codes: 0 done; 1 the operation failed (a database error, a job in the wrong state);
2 bad usage or input; 3 not found; 4 the database is unreachable or its schema is not migrated;
130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Coroutine, NoReturn, Optional, Sequence, TextIO

from . import _awa
from ._ops import STATES, BadRequest, NotFound, Ops

__all__ = ["main"]

EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_UNAVAILABLE = 1, 2, 3, 4
#: Bulk operations work in batches of this many ids (one progress step each).
BULK_BATCH = 500


class Unavailable(_awa.AwaError):
    """The database cannot be reached (exit code 4)."""


class UsageError(_awa.AwaError):
    """Arguments that parse but do not make sense together (exit code 2)."""


# ----- output ------------------------------------------------------------------------------


def emit_json(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    """Left-aligned columns as wide as their widest cell."""
    cells = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    for r in [list(headers)] + cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


class Progress:
    """A one-line progress bar on stderr for bulk operations; silent unless stderr is a
    terminal (or ``force``), so scripts and logs stay clean."""

    def __init__(self, total: int, label: str, stream: Optional[TextIO] = None, force: bool = False) -> None:
        self.total, self.label, self.done = total, label, 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = force or (hasattr(self.stream, "isatty") and self.stream.isatty())

    def advance(self, n: int) -> None:
        self.done += n
        if self.enabled and self.total:
            width = 30
            filled = int(width * min(self.done, self.total) / self.total)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.total:
            self.stream.write("\n")
            self.stream.flush()


# ----- connecting --------------------------------------------------------------------------


def database_url(args: argparse.Namespace) -> str:
    url = getattr(args, "database_url", None) or os.environ.get("DATABASE_URL")
    if not url:
        raise UsageError("no database: pass --database-url URL or set DATABASE_URL")
    return str(url)


def probe(url: str, timeout: float = 5.0) -> None:
    """Fail fast (exit 4) when the server's TCP port does not answer, instead of waiting out
    the pool's 30-second acquire timeout. Unix-socket URLs are not probed."""
    parts = urllib.parse.urlparse(url)
    query_host = urllib.parse.parse_qs(parts.query).get("host", [""])[0]
    host = parts.hostname or ""
    if not host or host.startswith("/") or query_host.startswith("/"):
        return
    try:
        port = parts.port or 5432
    except ValueError:
        raise UsageError(f"bad port in the database URL {redact(url)}") from None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise Unavailable(f"cannot reach the database at {host}:{port}: {exc.strerror or exc}") from None


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urllib.parse.urlparse(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunparse(parts._replace(netloc=netloc))


def connect(args: argparse.Namespace, max_connections: int = 4) -> Any:
    url = database_url(args)
    probe(url)
    return _awa.NativeClient(url, max_connections)


def run_with_client(args: argparse.Namespace, body: Callable[[Ops], Coroutine[Any, Any, int]]) -> int:
    native = connect(args)

    async def go() -> int:
        try:
            return await body(Ops(native))
        finally:
            await native.close()

    return asyncio.run(go())


# ----- commands ----------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    latest = _awa.SCHEMA_VERSION
    out: TextIO = sys.stdout
    selecting = args.sql or args.extract_to or args.pending or args.from_version is not None or args.to is not None
    if not selecting:
        async def apply(ops: Ops) -> int:
            before = await ops.schema_version()
            await ops.native.migrate()
            after = await ops.schema_version()
            if args.json:
                emit_json({"from_version": before, "to_version": after, "latest": latest}, out)
            elif before == after:
                out.write(f"Schema is current (version {after}); nothing to apply.\n")
            else:
                out.write(f"Migrated the awa schema from version {before} to {after}.\n")
            return 0
        return run_with_client(args, apply)

    start = args.from_version
    if args.pending:
        if start is not None:
            raise UsageError("--pending reads --from from the database; pass one or the other")

        async def current(ops: Ops) -> int:
            return await ops.schema_version()
        start = run_with_client(args, current)
    start = 0 if start is None else start
    end = latest if args.to is None else args.to
    if not 0 <= start <= latest or not 0 <= end <= latest:
        raise UsageError(f"versions run from 0 to {latest} (this library's latest)")
    if start > end:
        raise UsageError(f"--from {start} is after --to {end}")
    versions = [v for v, _ in _awa.migration_scripts() if start < v <= end]
    if args.extract_to:
        target = Path(args.extract_to)
        try:
            target.mkdir(parents=True, exist_ok=True)
            written = []
            for v in versions:
                path = target / f"V{v}__awa.sql"
                path.write_text(_awa.migration_sql(v - 1, v), encoding="utf-8")
                written.append(str(path))
        except OSError as exc:
            raise _awa.AwaError(f"cannot write to {target}: {exc.strerror or exc}") from None
        if args.json:
            emit_json({"from_version": start, "to_version": end, "files": written}, out)
        else:
            for path_text in written:
                out.write(path_text + "\n")
            if not written:
                sys.stderr.write(f"no migrations after version {start} up to {end}\n")
        return 0
    if args.json:
        emit_json({"from_version": start, "to_version": end, "versions": versions,
                   "sql": _awa.migration_sql(start, end)}, out)
    else:
        if not versions:
            sys.stderr.write(f"no migrations after version {start} up to {end}\n")
        out.write(_awa.migration_sql(start, end))
    return 0


def _job_rows(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    return [[j["id"], j["kind"], j["queue"], j["state"], j["attempt"], j["max_attempts"], j["run_at"]] for j in jobs]


JOB_HEADERS = ["ID", "KIND", "QUEUE", "STATE", "ATTEMPT", "MAX", "RUN_AT"]


def cmd_job(args: argparse.Namespace) -> int:
    out = sys.stdout
    sub = args.job_cmd
    if sub == "retry-failed" and bool(args.kind) == bool(args.queue):
        raise UsageError("job retry-failed needs exactly one of --kind or --queue")

    async def body(ops: Ops) -> int:
        if sub == "list":
            page = await ops.list_jobs(state=args.state, kind=args.kind, queue=args.queue, tag=args.tag,
                                       limit=args.limit, before_id=args.before_id)
            if args.json:
                emit_json(page, out)
            elif not page["jobs"]:
                out.write("No jobs found.\n")
            else:
                table(_job_rows(page["jobs"]), JOB_HEADERS, out)
                if page["next_before_id"] is not None:
                    out.write(f"\nMore: --before-id {page['next_before_id']}\n")
        elif sub == "dump":
            emit_json(await ops.get_job(args.id), out)
        elif sub == "dump-run":
            emit_json(await ops.job_run(args.id, args.attempt), out)
        elif sub == "retry":
            job = await ops.retry_job(args.id)
            emit_json(job, out) if args.json else out.write(f"Retried job {job['id']} (now {job['state']}).\n")
        elif sub == "cancel":
            before = (await ops.get_job(args.id))["state"]
            job = await ops.cancel_job(args.id)
            if args.json:
                emit_json(job, out)
            elif before in ("completed", "failed", "cancelled"):
                out.write(f"Job {job['id']} is already {before}.\n")
            elif job["state"] == "cancelled":
                out.write(f"Cancelled job {job['id']}.\n")
            elif job["state"] == "running":
                out.write(f"Job {job['id']} is running: cancellation requested (its handler is signalled).\n")
            else:
                out.write(f"Job {job['id']} is {job['state']}.\n")
        elif sub == "retry-failed":
            n = await ops.retry_failed(args.kind, args.queue)
            scope = f"kind {args.kind!r}" if args.kind else f"queue {args.queue!r}"
            emit_json({"retried": n}, out) if args.json else out.write(f"Retried {n} failed jobs of {scope}.\n")
        elif sub == "discard":
            n = await ops.discard_failed(args.kind)
            emit_json({"discarded": n}, out) if args.json else out.write(f"Discarded {n} failed jobs of kind {args.kind!r}.\n")
        return 0

    return run_with_client(args, body)


def _lag(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def cmd_queue(args: argparse.Namespace) -> int:
    out = sys.stdout
    sub = args.queue_cmd

    async def body(ops: Ops) -> int:
        if sub == "stats":
            queues = await ops.queues()
            if args.json:
                emit_json(queues, out)
            elif not queues:
                out.write("No queues found.\n")
            else:
                rows = [[q["queue"], "yes" if q["paused"] else "no", q["counts"]["available"], q["counts"]["running"],
                         q["counts"]["scheduled"], q["counts"]["retryable"], q["counts"]["waiting_external"],
                         q["counts"]["failed"], q["counts"]["completed"], q["counts"]["cancelled"],
                         _lag(q["lag_seconds"]), q["dlq_depth"]] for q in queues]
                table(rows, ["QUEUE", "PAUSED", "AVAILABLE", "RUNNING", "SCHEDULED", "RETRYABLE", "WAITING",
                             "FAILED", "COMPLETED", "CANCELLED", "LAG", "DLQ"], out)
        elif sub in ("pause", "resume"):
            result = await ops.pause_queue(args.name, sub == "pause")
            emit_json(result, out) if args.json else out.write(f"{'Paused' if sub == 'pause' else 'Resumed'} queue {args.name!r}.\n")
        elif sub == "drain":
            n = await ops.drain_queue(args.name)
            emit_json({"queue": args.name, "cancelled": n}, out) if args.json else out.write(
                f"Drained queue {args.name!r}: cancelled {n} pending jobs.\n")
        return 0

    return run_with_client(args, body)


def cmd_cron(args: argparse.Namespace) -> int:
    out = sys.stdout

    async def body(ops: Ops) -> int:
        if args.cron_cmd == "list":
            rows = await ops.cron()
            if args.json:
                emit_json(rows, out)
            elif not rows:
                out.write("No cron schedules found.\n")
            else:
                table([[r.get("name"), r.get("cron_expr"), r.get("timezone"), r.get("kind"), r.get("queue"),
                        "yes" if r.get("paused") else "no", r.get("missed_fire_policy"), r.get("next_fire_at")]
                       for r in rows],
                      ["NAME", "CRON", "TIMEZONE", "KIND", "QUEUE", "PAUSED", "MISSED", "NEXT_FIRE_AT"], out)
        else:
            await ops.cron_remove(args.name)
            emit_json({"removed": args.name}, out) if args.json else out.write(f"Removed cron schedule {args.name!r}.\n")
        return 0

    return run_with_client(args, body)


def cmd_storage(args: argparse.Namespace) -> int:
    """The storage engine and the live transition to queue storage (docs/storage-transition.md)."""
    out = sys.stdout

    async def body(ops: Ops) -> int:
        native = ops.native
        if args.storage_cmd == "status":
            status = json.loads(await native.storage_status())
            out.write(json.dumps(status, indent=None if args.json else 2) + "\n")
            return 0
        if args.storage_cmd == "prepare-queue-storage-schema":
            await native.prepare_queue_storage_schema(args.schema, args.queue_slot_count, args.lease_slot_count)
            state = {"prepared_schema": args.schema}
        else:
            action = args.storage_cmd.replace("-", "_")
            state = json.loads(await native.storage_transition(action, getattr(args, "schema", None)))
        if args.json:
            emit_json(state, out)
        elif "state" in state:
            out.write(f"storage state: {state['state']} (active engine {state['active_engine']}, "
                      f"epoch {state['transition_epoch']})\n")
        else:
            out.write(f"queue storage schema {args.schema!r} is installed\n")
        return 0

    return run_with_client(args, body)


def _need_filter(args: argparse.Namespace, what: str, names: Sequence[str]) -> None:
    given = any(getattr(args, n, None) for n in names)
    if given and args.all:
        raise UsageError(f"{what}: --all cannot be combined with a filter")
    if not given and not args.all:
        flags = "/".join("--" + n for n in names)
        raise UsageError(f"{what}: pass a filter ({flags}) or --all to act on every row")


async def _in_batches(ids: list[int], label: str, step: Callable[[list[int]], Coroutine[Any, Any, int]]) -> int:
    done = 0
    bar = Progress(len(ids), label)
    try:
        for i in range(0, len(ids), BULK_BATCH):
            batch = ids[i:i + BULK_BATCH]
            done += await step(batch)
            bar.advance(len(batch))
    finally:
        bar.close()
    return done


def cmd_dlq(args: argparse.Namespace) -> int:
    out = sys.stdout
    sub = args.dlq_cmd
    if sub in ("retry-bulk", "purge"):
        _need_filter(args, f"dlq {sub}", ["kind", "queue", "tag"])
    if sub == "move":
        _need_filter(args, "dlq move", ["kind", "queue"])

    async def body(ops: Ops) -> int:
        if sub == "depth":
            depth = await ops.dlq_depth(args.queue)
            if args.json:
                emit_json(depth, out)
            elif args.queue:
                out.write(f"{args.queue}: {depth['by_queue'].get(args.queue, 0)}\n")
            else:
                out.write(f"Total: {depth['total']}\n")
                for q, n in depth["by_queue"].items():
                    out.write(f"  {q}: {n}\n")
        elif sub == "list":
            page = await ops.dlq_list(kind=args.kind, queue=args.queue, tag=args.tag, limit=args.limit,
                                      before_id=args.before_id)
            if args.json:
                emit_json(page, out)
            elif not page["jobs"]:
                out.write("The DLQ is empty (no matching rows).\n")
            else:
                table([[r["id"], r["kind"], r["queue"], r["attempt"], _short(r["reason"], 40), r["dlq_at"]]
                       for r in page["jobs"]], ["ID", "KIND", "QUEUE", "ATTEMPT", "REASON", "DLQ_AT"], out)
                if page["next_before_id"] is not None:
                    out.write(f"\nMore: --before-id {page['next_before_id']}\n")
        elif sub == "retry":
            job = await ops.dlq_retry(args.id)
            emit_json(job, out) if args.json else out.write(f"Retried DLQ job {job['id']} (now {job['state']}).\n")
        elif sub == "retry-bulk":
            ids = await ops.dlq_ids(args.kind, args.queue, args.tag)

            async def retry(batch: list[int]) -> int:
                n = 0
                for job_id in batch:
                    try:
                        await ops.dlq_retry(job_id)
                        n += 1
                    except NotFound:
                        pass  # retried or purged by someone else meanwhile
                return n
            n = await _in_batches(ids, "retrying", retry)
            emit_json({"retried": n}, out) if args.json else out.write(f"Retried {n} DLQ jobs.\n")
        elif sub == "move":
            ids = await ops.failed_ids(args.kind, args.queue)

            async def move(batch: list[int]) -> int:
                return await ops.dlq_move(batch, args.reason)
            n = await _in_batches(ids, "moving", move)
            emit_json({"moved": n}, out) if args.json else out.write(f"Moved {n} failed jobs to the DLQ.\n")
        elif sub == "purge":
            n = await ops.dlq_purge(args.kind, args.queue, args.tag)
            emit_json({"purged": n}, out) if args.json else out.write(f"Purged {n} DLQ jobs.\n")
        return 0

    return run_with_client(args, body)


def _short(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def cmd_serve(args: argparse.Namespace) -> int:
    from ._serve import ServeConfig, serve

    url = database_url(args)
    probe(url)
    token = args.auth_token or os.environ.get("AWA_AUTH_TOKEN") or None
    return serve(ServeConfig(url, args.host, args.port, read_only=args.read_only, auth_token=token))


def cmd_callbacks(args: argparse.Namespace) -> int:
    from ._serve import ServeConfig, serve

    secret_text = (args.secret or os.environ.get("AWA_CALLBACK_SECRET")
                   or os.environ.get("AWA_CALLBACK_HMAC_SECRET") or "")
    if not secret_text and not args.allow_unsigned:
        raise UsageError("callbacks serve needs --secret (or AWA_CALLBACK_SECRET) to check X-Awa-Signature, "
                         "or --allow-unsigned to accept unsigned callbacks")
    secret = callback_secret(secret_text) if secret_text else None
    url = database_url(args)
    probe(url)
    return serve(ServeConfig(url, args.host, args.port, callbacks_only=True, callback_secret=secret))


def callback_secret(text: str) -> bytes:
    """The 32-byte key of ``X-Awa-Signature`` (awa.callback_contract): 64 hex characters, as
    awa-pg's examples keep it (``bytes.fromhex(...)``), or exactly 32 bytes of text."""
    if len(text) == 64:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    raw = text.encode()
    if len(raw) != 32:
        raise UsageError(f"the callback secret must be 64 hex characters or 32 bytes (got {len(raw)} bytes)")
    return raw


# ----- the parser --------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2 (its own convention too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a schema version number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"versions are 0 or more, got {value}")
    return value


def _port(text: str) -> int:
    value = _version(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # --database-url and --json are accepted before or after the subcommand.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", default=argparse.SUPPRESS, metavar="URL",
                        help="PostgreSQL URL (default: $DATABASE_URL)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable JSON on stdout")

    parser = _Parser(prog="awa", description="Operate an Awa job queue: inspect, retry, cancel, pause, purge, serve the web UI.",
                     parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def leaf(group: Any, name: str, help_text: str, **kw: Any) -> argparse.ArgumentParser:
        return group.add_parser(name, help=help_text, description=help_text, parents=[common], **kw)  # type: ignore[no-any-return]

    m = leaf(sub, "migrate", "Apply the schema migrations, or print/extract their SQL.")
    m.add_argument("--sql", action="store_true", help="print the SQL instead of applying it")
    m.add_argument("--extract-to", metavar="DIR", help="write one file per migration (V<n>__awa.sql) into DIR")
    m.add_argument("--from", dest="from_version", type=_version, metavar="V", help="start after version V (default 0)")
    m.add_argument("--to", type=_version, metavar="V", help="end at version V (default: the latest)")
    m.add_argument("--pending", action="store_true", help="only what the database still lacks (reads its version)")
    m.set_defaults(run=cmd_migrate)

    job = leaf(sub, "job", "Inspect and act on jobs.")
    js = job.add_subparsers(dest="job_cmd", metavar="SUBCOMMAND", parser_class=_Parser)
    js.required = True
    jl = leaf(js, "list", "List jobs, newest first.")
    jl.add_argument("--state", choices=STATES)
    jl.add_argument("--kind")
    jl.add_argument("--queue")
    jl.add_argument("--tag")
    jl.add_argument("--limit", type=_positive, default=50, help="at most this many (default 50, max 1000)")
    jl.add_argument("--before-id", type=_positive, metavar="ID", help="the page after the one ending at ID")
    leaf(js, "dump", "Print one job as JSON.").add_argument("id", type=_positive)
    dr = leaf(js, "dump-run", "Print one attempt of a job as JSON.")
    dr.add_argument("id", type=_positive)
    dr.add_argument("--attempt", type=_positive, metavar="N", help="attempt number (default: the latest)")
    leaf(js, "retry", "Retry a failed, cancelled, retryable or scheduled job now.").add_argument("id", type=_positive)
    leaf(js, "cancel", "Cancel a job (a running one is signalled).").add_argument("id", type=_positive)
    rf = leaf(js, "retry-failed", "Retry every failed job of a kind or a queue.")
    rf.add_argument("--kind")
    rf.add_argument("--queue")
    leaf(js, "discard", "Delete the failed jobs of a kind.").add_argument("--kind", required=True)
    job.set_defaults(run=cmd_job)

    queue = leaf(sub, "queue", "Queue statistics and controls.")
    qs = queue.add_subparsers(dest="queue_cmd", metavar="SUBCOMMAND", parser_class=_Parser)
    qs.required = True
    leaf(qs, "stats", "Jobs per state, lag and DLQ depth of every queue.")
    leaf(qs, "pause", "Stop workers claiming from a queue.").add_argument("name")
    leaf(qs, "resume", "Let workers claim from a paused queue again.").add_argument("name")
    leaf(qs, "drain", "Cancel every pending (scheduled, available, retryable) job of a queue.").add_argument("name")
    queue.set_defaults(run=cmd_queue)

    cron = leaf(sub, "cron", "Periodic job schedules.")
    cs = cron.add_subparsers(dest="cron_cmd", metavar="SUBCOMMAND", parser_class=_Parser)
    cs.required = True
    leaf(cs, "list", "List the schedules.")
    leaf(cs, "remove", "Delete a schedule (jobs it enqueued stay).").add_argument("name")
    cron.set_defaults(run=cmd_cron)

    dlq = leaf(sub, "dlq", "The dead-letter queue.")
    ds = dlq.add_subparsers(dest="dlq_cmd", metavar="SUBCOMMAND", parser_class=_Parser)
    ds.required = True
    leaf(ds, "depth", "Rows in the DLQ, by queue.").add_argument("--queue")
    dl = leaf(ds, "list", "List DLQ rows, newest first.")
    for flag in ("--kind", "--queue", "--tag"):
        dl.add_argument(flag)
    dl.add_argument("--limit", type=_positive, default=50)
    dl.add_argument("--before-id", type=_positive, metavar="ID")
    leaf(ds, "retry", "Move one DLQ row back into the queue as a fresh available job.").add_argument("id", type=_positive)
    for name, help_text, aliases in (("retry-bulk", "Retry the DLQ rows matching a filter (or --all).", ["retry-all"]),
                                     ("purge", "Delete the DLQ rows matching a filter (or --all).", [])):
        p = leaf(ds, name, help_text, aliases=aliases)
        for flag in ("--kind", "--queue", "--tag"):
            p.add_argument(flag)
        p.add_argument("--all", action="store_true", help="every row (needed when no filter is given)")
        p.set_defaults(dlq_cmd=name)
    mv = leaf(ds, "move", "Move failed jobs from the queue into the DLQ.")
    mv.add_argument("--kind")
    mv.add_argument("--queue")
    mv.add_argument("--all", action="store_true", help="every failed job (needed when no filter is given)")
    mv.add_argument("--reason", default="moved by awa dlq move")
    dlq.set_defaults(run=cmd_dlq)

    storage = leaf(sub, "storage", "The storage engine and the live move from canonical to queue storage.")
    ss = storage.add_subparsers(dest="storage_cmd", metavar="SUBCOMMAND", parser_class=_Parser)
    ss.required = True
    leaf(ss, "status", "The transition state, the canonical backlog, live runtimes and what blocks the next step.")
    sp = leaf(ss, "prepare", "Name the queue-storage schema to move to; new jobs stay on canonical.")
    sp.add_argument("--schema", default="awa", help="queue-storage schema (default awa)")
    sps = leaf(ss, "prepare-queue-storage-schema", "Install queue storage's tables in a schema without routing to it.")
    sps.add_argument("--schema", default="awa", help="queue-storage schema (default awa)")
    sps.add_argument("--queue-slot-count", type=_positive, default=16, help="queue ring slots (default 16)")
    sps.add_argument("--lease-slot-count", type=_positive, default=8, help="lease ring slots (default 8)")
    leaf(ss, "enter-mixed-transition", "Route new jobs to queue storage; earlier runtimes drain canonical.")
    leaf(ss, "finalize", "Make queue storage the only engine (canonical must hold no live job).")
    leaf(ss, "abort", "Go back to canonical (from mixed only while queue storage is empty and unworked).")
    storage.set_defaults(run=cmd_storage)

    serve = leaf(sub, "serve", "Serve the web UI, the JSON API (/api), /metrics, /healthz and /readyz.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=_port, default=3000, help="port (default 3000)")
    serve.add_argument("--read-only", action="store_true", help="refuse every mutation (503) and hide the UI's buttons")
    serve.add_argument("--auth-token", metavar="TOKEN",
                       help="require 'Authorization: Bearer TOKEN' (default: $AWA_AUTH_TOKEN; none when unset)")
    serve.set_defaults(run=cmd_serve)

    cb = leaf(sub, "callbacks", "The HTTP receiver for external callbacks.")
    cbs = cb.add_subparsers(dest="callbacks_cmd", metavar="SUBCOMMAND", parser_class=_Parser)
    cbs.required = True
    cserve = leaf(cbs, "serve", "Serve POST /api/callbacks/<id>/complete|fail|heartbeat, checking X-Awa-Signature.")
    cserve.add_argument("--host", default="127.0.0.1")
    cserve.add_argument("--port", type=_port, default=3001)
    cserve.add_argument("--secret", metavar="SECRET",
                        help="the 32-byte key of X-Awa-Signature (BLAKE3 keyed hash, awa-pg's format): 64 hex "
                             "characters or 32 bytes (default: $AWA_CALLBACK_SECRET, then $AWA_CALLBACK_HMAC_SECRET)")
    cserve.add_argument("--allow-unsigned", action="store_true", help="accept callbacks without a valid signature")
    cb.set_defaults(run=cmd_callbacks)
    return parser


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, (UsageError, BadRequest, _awa.ValidationError)):
        return EXIT_USAGE
    if isinstance(exc, (NotFound, _awa.JobNotFound, _awa.CallbackNotFound)):
        return EXIT_NOT_FOUND
    if isinstance(exc, (Unavailable, _awa.SchemaNotMigrated)):
        return EXIT_UNAVAILABLE
    if isinstance(exc, _awa.DatabaseError):
        state = exc.sqlstate or ""
        # connection failures (08xxx), no such database (3D000), bad credentials (28xxx)
        if state.startswith(("08", "28")) or state == "3D000" or "pool timed out" in str(exc):
            return EXIT_UNAVAILABLE
    return EXIT_FAILED


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "json"):
        args.json = False
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        sys.stderr.write("awa: interrupted\n")
        return 130
    except _awa.AwaError as exc:
        sys.stderr.write(f"awa: error: {' '.join(str(exc).split())}\n")
        return _exit_code(exc)
    except Exception as exc:  # a bug or an unexpected failure: still one line, no traceback
        if os.environ.get("AWA_DEBUG"):
            raise
        sys.stderr.write(f"awa: unexpected error: {type(exc).__name__}: {' '.join(str(exc).split())} "
                         "(set AWA_DEBUG=1 for a traceback)\n")
        return EXIT_FAILED


def _entry() -> NoReturn:
    """The console script ``awa``."""
    sys.exit(main())
