"""The operations behind the ``awa`` command line and ``awa serve``: reads and admin actions
returning plain JSON-ready values (dicts, lists, strings, numbers).

Built on the native module's JSON-level calls (``awa._awa.NativeClient``) and on read-only
SQL of its own, never on the public wrapper objects of ``_client.py``, so the command line and
the HTTP API keep their shapes when the Python API's return types change.

Reads stay cheap on big tables (docs/operating.md, "Fast on big tables"): lists page by id
(``before_id``), state counts stop at :data:`COUNT_CAP` rows and fall back to the planner's
estimate past it, kinds come from a loose scan of the kind index. Only the queue overview
(``queues``) and the throughput series count every row they cover.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Iterable, Optional, cast

from . import _awa

__all__ = ["Ops", "NotFound", "BadRequest", "STATES", "COUNT_CAP"]

#: Every job state, in the engine's order.
STATES = ("scheduled", "available", "running", "completed", "retryable", "failed", "cancelled", "waiting_external")
#: Exact counts stop here; past it a count is the planner's estimate, marked as such.
COUNT_CAP = 1_000
#: A state whose planner estimate passes this many times COUNT_CAP is not counted at all.
ESTIMATE_FACTOR = 10
#: The largest page of jobs or DLQ rows one call returns.
MAX_LIMIT = 1000
#: The maintenance leader's session advisory lock (awa-core maintenance::LEADER_LOCK), as
#: pg_locks shows a bigint key: high and low 32 bits. Queue storage's leader holds the next
#: key (low bits + 1).
_LEADER_KEY = (0x6177_615F, 0x6C65_6164)

# Which rows of each state a capped count reads, written so that a partial index matches
# (waiting_external has none of its own: its rows carry a callback id, which has one).
_STATE_PREDICATE = {s: f"state = '{s}'" for s in STATES}
_STATE_PREDICATE["waiting_external"] = "callback_id IS NOT NULL AND state = 'waiting_external'"

# _PLANS: limits, cursors and spans are checked integers written into the SQL, not bound
# parameters. The driver prepares statements, and after a few runs PostgreSQL may switch a
# prepared statement to a generic plan, which cannot know that `LIMIT $1` is 51 or that
# `id < $2` leaves a small range: on a million rows such a plan sorts the whole table.
# Text filters (state, kind, queue, tag) stay bound parameters.

# Queue storage's per-table row estimates, from the statistics of each partition of its
# partitioned tables (and of deferred_jobs, a plain table): (tbl, state, n), for the schema
# awa.jobs reads (no rows when it reads none). ready_entries' row is every entry, under
# "available"; the caller takes the consumed away.
_QS_ESTIMATES_SQL = """
WITH schema AS (
    SELECT awa.readable_queue_storage_schema() AS name
), parts AS (
    SELECT p.relname AS tbl, c.relname AS part, greatest(c.reltuples, 0)::float8 AS n
    FROM pg_class p
    JOIN pg_namespace ns ON ns.oid = p.relnamespace AND ns.nspname = (SELECT name FROM schema)
    JOIN pg_inherits i ON i.inhparent = p.oid
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE p.relname IN ('ready_entries', 'receipts', 'done_entries', 'leases')
    UNION ALL
    SELECT c.relname, c.relname, greatest(c.reltuples, 0)::float8
    FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace AND ns.nspname = (SELECT name FROM schema)
    WHERE c.relname = 'deferred_jobs'
), stats AS (
    SELECT s.tablename, s.attname, s.most_common_vals::text::text[] AS vals,
           s.most_common_freqs AS freqs, s.elem_count_histogram AS hist
    FROM pg_stats s
    WHERE s.schemaname = (SELECT name FROM schema) AND NOT s.inherited
      AND s.attname IN ('seqs', 'state', 'waiting')
)
SELECT p.tbl, 'available' AS state, sum(p.n) AS n FROM parts p
WHERE p.tbl = 'ready_entries' GROUP BY p.tbl
UNION ALL
SELECT p.tbl, 'completed', sum(p.n * coalesce(st.hist[cardinality(st.hist)], 1)) FROM parts p
LEFT JOIN stats st ON st.tablename = p.part AND st.attname = 'seqs'
WHERE p.tbl = 'receipts' GROUP BY p.tbl
UNION ALL
SELECT p.tbl, v.state, sum(p.n * v.freq) FROM parts p
JOIN stats st ON st.tablename = p.part AND st.attname = 'state'
CROSS JOIN LATERAL unnest(st.vals, st.freqs) AS v(state, freq)
WHERE p.tbl IN ('done_entries', 'deferred_jobs') GROUP BY p.tbl, v.state
UNION ALL
SELECT p.tbl, CASE WHEN v.waiting = 't' THEN 'waiting_external' ELSE 'running' END, sum(p.n * v.freq)
FROM parts p
JOIN stats st ON st.tablename = p.part AND st.attname = 'waiting'
CROSS JOIN LATERAL unnest(st.vals, st.freqs) AS v(waiting, freq)
WHERE p.tbl = 'leases' GROUP BY 1, 2
"""

_JOB_COLUMNS = (
    "id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, "
    "deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_states, "
    "callback_id::text AS callback_id, callback_timeout_at, run_lease, progress, ordering_key"
)
_DLQ_COLUMNS = (
    "id, kind, queue, args, priority, attempt, max_attempts, created_at, errors, metadata, tags, "
    "reason, original_run_lease, dlq_at"
)


class NotFound(_awa.AwaError):
    """No such job, queue, schedule or DLQ row (HTTP 404, exit code 3)."""


class BadRequest(_awa.ValidationError):
    """A parameter is missing or malformed (HTTP 400, exit code 2)."""


def plain(value: Any) -> Any:
    """A fetched value as JSON-ready data (timestamps as RFC 3339 text)."""
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


#: What a queue or kind entry of the API says about its descriptor, named as awa-pg's admin API
#: names them; the values when there is none.
DESCRIPTOR_DEFAULTS: dict[str, Any] = {
    "display_name": None, "description": None, "owner": None, "docs_url": None, "tags": [],
    "extra": None, "descriptor_last_seen_at": None, "descriptor_stale": False,
    "descriptor_mismatch": False,
}


def descriptor_fields(row: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The API fields of one catalogue row (``storage::descriptors::DescriptorRow``)."""
    if row is None:
        return dict(DESCRIPTOR_DEFAULTS)
    return {k: row.get(k, v) for k, v in DESCRIPTOR_DEFAULTS.items()}


def check_state(state: Optional[str]) -> Optional[str]:
    if state is not None and state not in STATES:
        raise BadRequest(f"unknown state {state!r}; one of: {', '.join(STATES)}")
    return state


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """An integer parameter in [low, high] (text from a URL or a JSON number)."""
    if isinstance(value, bool):
        raise BadRequest(f"{name} must be an integer")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, float) and value != number:
        raise BadRequest(f"{name} must be an integer, got {value!r}")
    if not low <= number <= high:
        raise BadRequest(f"{name} must be between {low} and {high}, got {number}")
    return number


def _job(row: dict[str, Any]) -> dict[str, Any]:
    """A job as the API shows it: the native module's job JSON without the raw unique key."""
    out = {k: v for k, v in row.items() if k != "unique_key"}
    return cast("dict[str, Any]", plain(out))


def attempts_of(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per attempt so far (1..attempt): when it ended in an error, that error."""
    errors = {e.get("attempt"): e for e in job.get("errors") or [] if isinstance(e, dict)}
    out = []
    for n in range(1, int(job.get("attempt") or 0) + 1):
        err = errors.get(n)
        current = n == job.get("attempt")
        out.append({
            "attempt": n,
            "current": current,
            "outcome": "error" if err else (job.get("state") if current else "unknown"),
            "at": err.get("at") if err else (job.get("attempted_at") if current else None),
            "error": err.get("error") if err else None,
            "traceback": err.get("traceback") if err else None,
        })
    return out


class Ops:
    """Operations over one native client (``awa._awa.NativeClient``)."""

    def __init__(self, native: Any) -> None:
        self.native = native

    # ----- plumbing ---------------------------------------------------------------------

    async def read(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        """Rows of one read-only statement, in a transaction that is rolled back."""
        return (await self.read_many([(sql, list(params))]))[0]

    async def read_many(self, statements: list[tuple[str, list[Any]]]) -> list[list[dict[str, Any]]]:
        """Several reads in one transaction (one snapshot, one connection), rolled back."""
        tx = await self.native.transaction()
        try:
            # UTC timestamps; and plan each statement for its own values (see _PLANS)
            await tx.fetch_all("SELECT set_config('TimeZone', 'UTC', true), "
                               "set_config('plan_cache_mode', 'force_custom_plan', true)", [])
            return [cast("list[dict[str, Any]]", await tx.fetch_all(sql, params)) for sql, params in statements]
        finally:
            await tx.rollback()

    async def read_rows_json(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        """The rows of ``sql`` as one JSON array built by the server (``json_agg``, in the
        statement's order, timestamps in UTC): one text cell to decode instead of a Python
        value per column, several times faster for pages of wide rows."""
        rows = await self.read(f"SELECT coalesce(json_agg(r), '[]')::text AS rows FROM ({sql}) r", *params)
        return cast("list[dict[str, Any]]", json.loads(rows[0]["rows"]))

    async def read_only(self) -> bool:
        """Whether this server (or role) runs transactions read-only
        (``default_transaction_read_only``, a hot standby)."""
        rows = await self.read("SELECT current_setting('transaction_read_only') AS ro")
        return bool(rows and rows[0]["ro"] == "on")

    async def schema_version(self) -> int:
        """The applied schema version; 0 when there is no awa schema."""
        exists = await self.read("SELECT to_regclass('awa.schema_version') IS NOT NULL AS e")
        if not exists[0]["e"]:
            return 0
        rows = await self.read("SELECT coalesce(max(version), 0) AS v FROM awa.schema_version")
        return int(rows[0]["v"])

    # ----- overview ---------------------------------------------------------------------

    async def _estimates(self) -> tuple[dict[str, int], set[str]]:
        """The planner's row estimate per state (pg_stats x reltuples); empty before ANALYZE.
        Canonical's table and, when ``awa.jobs`` reads one, queue storage's schema (see
        :meth:`_queue_storage_estimates`), added up: during a transition both hold jobs. With
        the states whose estimate is too rough to skip their capped count: queue storage's
        ``available`` (entries a retry or a rescue consumed still count in it)."""
        canonical, found = await self.read_many([
            ("SELECT v.state, (v.freq * greatest(c.reltuples, 0))::bigint AS n "
             "FROM pg_stats s CROSS JOIN pg_class c "
             "CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(state, freq) "
             "WHERE s.schemaname = 'awa' AND s.tablename = 'canonical_jobs' AND s.attname = 'state' "
             "AND c.oid = 'awa.canonical_jobs'::regclass", []),
            # (A schema older than migration 13 has no queue storage to read.)
            ("SELECT to_regprocedure('awa.readable_queue_storage_schema()') IS NOT NULL AS f", []),
        ])
        guesses = {r["state"]: int(r["n"]) for r in canonical}
        rough: set[str] = set()
        if found[0]["f"]:
            qs = await self._queue_storage_estimates()
            for state, n in qs.items():
                guesses[state] = guesses.get(state, 0) + n
            if qs:
                rough.add("available")
        return guesses, rough

    async def _queue_storage_estimates(self) -> dict[str, int]:
        """The same estimate for the jobs of the queue-storage schema ``awa.jobs`` reads (none
        when it reads canonical's table only), from each partition's statistics, which
        autovacuum keeps (it never analyzes a partitioned table as a whole): completed jobs
        are receipts' rows times their average number of seqs (``elem_count_histogram``'s
        last value), failed and cancelled ones are ``done_entries`` by their ``state``'s
        frequencies, scheduled and retryable ones ``deferred_jobs`` the same way, running and
        waiting ones the leases by ``waiting``, and available ones the ready entries left over
        when those consumed by a completion, a failure, a cancel or a lease are taken away (an
        entry a retry or a rescue consumed still counts as available: it errs high)."""
        per_table: dict[str, dict[str, float]] = {}
        for r in await self.read(_QS_ESTIMATES_SQL):
            per_table.setdefault(r["tbl"], {})[r["state"]] = float(r["n"])
        if not per_table:
            return {}
        estimates = {s: n for t in ("receipts", "done_entries", "deferred_jobs", "leases")
                     for s, n in per_table.get(t, {}).items()}
        consumed = sum(estimates.get(s, 0.0) for s in ("completed", "failed", "cancelled", "running", "waiting_external"))
        estimates["available"] = max(0.0, per_table.get("ready_entries", {}).get("available", 0.0) - consumed)
        return {s: int(n) for s, n in estimates.items()}

    def _capped_counts_sql(self, states: Iterable[str]) -> str:
        return " UNION ALL ".join(
            f"SELECT '{s}' AS state, (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE "
            f"{_STATE_PREDICATE[s]} LIMIT {COUNT_CAP}) t) AS n"
            for s in states
        )

    async def state_counts(self) -> tuple[dict[str, int], list[str]]:
        """Rows per state and the states whose number is the planner's estimate.

        A state the statistics put far past the cap (ESTIMATE_FACTOR x COUNT_CAP rows) is not
        counted at all: its estimate is the answer. The others are counted exactly up to
        COUNT_CAP rows through their partial indexes; one that reaches the cap (stale
        statistics) falls back to the estimate too. So the cost is bounded whatever the size
        of the table: on a million jobs, one read of pg_stats plus a few small index scans."""
        guesses, rough = await self._estimates()
        to_count = [s for s in STATES if guesses.get(s, 0) < ESTIMATE_FACTOR * COUNT_CAP or s in rough]
        counts = {s: guesses[s] for s in STATES if s not in to_count}
        estimated = [s for s in STATES if s not in to_count]
        if to_count:
            rows = await self.read(self._capped_counts_sql(to_count))
            for r in rows:
                n = int(r["n"])
                if n >= COUNT_CAP:
                    estimated.append(r["state"])
                    n = max(COUNT_CAP, guesses.get(r["state"], 0))
                counts[r["state"]] = n
        return {s: counts[s] for s in STATES}, [s for s in STATES if s in estimated]

    async def stats(self) -> dict[str, Any]:
        # Counts per state (state_counts); finalized in the last hour per state, capped (a
        # range scan of the (state, finalized_at) index that stops at the cap); the DLQ's
        # depth, capped.
        recent_sql = " UNION ALL ".join(
            f"SELECT '{s}' AS state, (SELECT count(*) FROM (SELECT 1 FROM awa.jobs WHERE state = '{s}' "
            f"AND finalized_at >= now() - interval '1 hour' LIMIT {COUNT_CAP}) t) AS n"
            for s in ("completed", "failed", "cancelled"))
        counts, estimated = await self.state_counts()
        recent, dlq = await self.read_many([
            (recent_sql, []),
            (f"SELECT count(*) AS n FROM (SELECT 1 FROM awa.jobs_dlq LIMIT {COUNT_CAP}) t", []),
        ])
        last_hour = {r["state"]: int(r["n"]) for r in recent}
        dlq_n = int(dlq[0]["n"])
        return {
            "counts": counts,
            "estimated": estimated,
            "total": sum(counts.values()),
            "last_hour": last_hour,
            "last_hour_capped": [s for s, n in last_hour.items() if n >= COUNT_CAP],
            "dlq_depth": dlq_n,
            "dlq_estimated": dlq_n >= COUNT_CAP,
            "count_cap": COUNT_CAP,
        }

    async def timeseries(self, minutes: int) -> dict[str, Any]:
        """Jobs finalized per minute over the last ``minutes``, by state (oldest first; every
        minute present, zeros included)."""
        minutes = check_int("minutes", minutes, 1, 1440)
        now = _dt.datetime.now(_dt.timezone.utc).replace(second=0, microsecond=0)
        first = now - _dt.timedelta(minutes=minutes - 1)
        # One range per state: `state = 'x' AND finalized_at >= $1` is a range scan of the
        # (state, finalized_at) index; `state IN (...)` is implied by that partial index's
        # predicate, so the planner drops it and the range would not lead: a scan of the
        # whole index. The cutoff is a bound value so the planner knows how narrow it is.
        rows = await self.read(
            "WITH m AS (SELECT generate_series($1::timestamptz, $2::timestamptz, interval '1 minute') AS minute), "
            "f AS (" + " UNION ALL ".join(
                f"SELECT state, finalized_at FROM awa.jobs WHERE state = '{s}' AND finalized_at >= $1::timestamptz"
                for s in ("completed", "failed", "cancelled")) + "), "
            "c AS (SELECT date_trunc('minute', finalized_at) AS minute, state, count(*) AS n FROM f GROUP BY 1, 2) "
            "SELECT m.minute, "
            "coalesce(sum(c.n) FILTER (WHERE c.state = 'completed'), 0)::bigint AS completed, "
            "coalesce(sum(c.n) FILTER (WHERE c.state = 'failed'), 0)::bigint AS failed, "
            "coalesce(sum(c.n) FILTER (WHERE c.state = 'cancelled'), 0)::bigint AS cancelled "
            "FROM m LEFT JOIN c ON c.minute = m.minute GROUP BY m.minute ORDER BY m.minute",
            first, now,
        )
        return {"minutes": minutes, "points": plain(rows)}

    # ----- jobs -------------------------------------------------------------------------

    async def list_jobs(
        self, *, state: Optional[str] = None, kind: Optional[str] = None, queue: Optional[str] = None,
        tag: Optional[str] = None, limit: Any = 50, before_id: Any = None,
    ) -> dict[str, Any]:
        """Newest first; ``next_before_id`` continues the listing (None on the last page)."""
        check_state(state)
        limit = check_int("limit", limit, 1, MAX_LIMIT)
        where: list[str] = []
        params: list[Any] = []

        def add(clause: str, value: Any) -> None:
            params.append(value)
            where.append(clause.format(f"${len(params)}"))

        if state is not None:
            add("state = {}", state)
        if kind is not None:
            add("kind = {}", kind)
        if queue is not None:
            add("queue = {}", queue)
        if tag is not None:
            add("tags @> ARRAY[{}::text]", tag)
        if before_id is not None:
            where.append(f"id < {check_int('before_id', before_id, 1, 2**63 - 1)}")  # inlined: see _PLANS
        sql = f"SELECT {_JOB_COLUMNS} FROM awa.jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY id DESC LIMIT {limit + 1}"
        rows = await self.read_rows_json(sql, *params)
        more = len(rows) > limit
        jobs = [_job(r) for r in rows[:limit]]
        return {"jobs": jobs, "next_before_id": jobs[-1]["id"] if more else None}

    async def get_job(self, job_id: int) -> dict[str, Any]:
        try:
            job = _job(json.loads(await self.native.get_job(job_id)))
        except _awa.JobNotFound:
            raise NotFound(f"job {job_id} not found") from None
        job["attempts"] = attempts_of(job)
        return job

    async def job_run(self, job_id: int, attempt: Optional[int]) -> dict[str, Any]:
        """One attempt of a job (the current one by default)."""
        job = await self.get_job(job_id)
        runs = job["attempts"]
        if not runs:
            raise NotFound(f"job {job_id} has not run yet (attempt 0)")
        n = runs[-1]["attempt"] if attempt is None else attempt
        if not 1 <= n <= len(runs):
            raise NotFound(f"job {job_id} has no attempt {n} (attempts 1..{len(runs)})")
        return {"job_id": job_id, "kind": job["kind"], "queue": job["queue"], "state": job["state"], **runs[n - 1]}

    async def retry_job(self, job_id: int) -> dict[str, Any]:
        try:
            return _job(json.loads(await self.native.retry(job_id)))
        except _awa.JobNotFound:
            raise NotFound(f"job {job_id} not found") from None

    async def cancel_job(self, job_id: int) -> dict[str, Any]:
        try:
            return _job(json.loads(await self.native.cancel(job_id)))
        except _awa.JobNotFound:
            raise NotFound(f"job {job_id} not found") from None

    async def retry_failed(self, kind: Optional[str], queue: Optional[str]) -> int:
        # The CLI and the API always name a kind or a queue, so allow_all stays off.
        result = json.loads(await self.native.retry_failed(kind, queue, False))
        return len(result["jobs"])

    async def discard_failed(self, kind: str) -> int:
        return int(json.loads(await self.native.discard_failed(kind, None)))

    # ----- queues and kinds -------------------------------------------------------------

    async def _queue_rows(self, queue: Optional[str]) -> list[dict[str, Any]]:
        where = "" if queue is None else "WHERE queue = $1"
        params = [] if queue is None else [queue]
        counts = await self.read(
            f"SELECT queue, state, count(*) AS n, "
            f"extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'available' AND run_at <= now()))::float8 AS lag "
            f"FROM awa.jobs {where} GROUP BY queue, state",
            *params,
        )
        meta = await self.read(f"SELECT queue, paused, dlq_enabled FROM awa.queue_meta {where}", *params)
        dlq = await self.read(f"SELECT queue, count(*) AS n FROM awa.jobs_dlq {where} GROUP BY queue", *params)
        out: dict[str, dict[str, Any]] = {}

        def entry(name: str) -> dict[str, Any]:
            return out.setdefault(name, {
                "queue": name, "paused": False, "dlq_enabled": False,
                "counts": {s: 0 for s in STATES}, "lag_seconds": 0.0, "dlq_depth": 0,
            })

        for r in counts:
            e = entry(r["queue"])
            e["counts"][r["state"]] = int(r["n"])
            if r["lag"] is not None:
                e["lag_seconds"] = max(e["lag_seconds"], round(float(r["lag"]), 3))
        for r in meta:
            e = entry(r["queue"])
            e["paused"], e["dlq_enabled"] = bool(r["paused"]), bool(r["dlq_enabled"])
        for r in dlq:
            entry(r["queue"])["dlq_depth"] = int(r["n"])
        described = await self.descriptors("queue")
        for name in described:
            if queue is None or name == queue:
                entry(name)
        for name, e in out.items():
            e["total"] = sum(e["counts"].values())
            e.update(descriptor_fields(described.get(name)))
        return [out[k] for k in sorted(out)]

    async def descriptors(self, subject: str) -> dict[str, dict[str, Any]]:
        """The queue (``"queue"``) or kind (``"kind"``) descriptor catalogue by name; empty
        on a schema without it (docs/operating.md, "Descriptors")."""
        table = "awa.queue_descriptors" if subject == "queue" else "awa.job_kind_descriptors"
        exists = await self.read(f"SELECT to_regclass('{table}') IS NOT NULL AS e")
        if not exists[0]["e"]:
            return {}
        rows = json.loads(await self.native.list_descriptors(subject))
        return {str(r["name"]): cast("dict[str, Any]", r) for r in rows}

    async def queues(self) -> list[dict[str, Any]]:
        return await self._queue_rows(None)

    async def queue(self, name: str) -> dict[str, Any]:
        rows = await self._queue_rows(name)
        if not rows:
            raise NotFound(f"queue {name!r} not found (no jobs, settings, DLQ rows or descriptor)")
        return rows[0]

    async def pause_queue(self, name: str, paused: bool) -> dict[str, Any]:
        await self.native.set_queue_paused(name, paused)
        return {"queue": name, "paused": paused}

    async def drain_queue(self, name: str) -> int:
        return int(json.loads(await self.native.drain_queue(name)))

    async def kind_names(self) -> list[str]:
        """Distinct kinds of ``awa.jobs`` by a loose scan of the kind index (one probe per kind)."""
        rows = await self.read(
            "WITH RECURSIVE k AS ((SELECT kind FROM awa.jobs ORDER BY kind LIMIT 1) UNION ALL "
            "SELECT (SELECT j.kind FROM awa.jobs j WHERE j.kind > k.kind ORDER BY j.kind LIMIT 1) "
            "FROM k WHERE k.kind IS NOT NULL) SELECT kind FROM k WHERE kind IS NOT NULL"
        )
        return [r["kind"] for r in rows]

    async def kinds(self) -> list[dict[str, Any]]:
        """Every kind with jobs or a descriptor, by name, each with its descriptor's fields."""
        described = await self.descriptors("kind")
        names = sorted(set(await self.kind_names()) | set(described))
        return [{"kind": k, **descriptor_fields(described.get(k))} for k in names]

    # ----- runtime ----------------------------------------------------------------------

    async def runtime(self) -> dict[str, Any]:
        """The maintenance leader (who holds its advisory lock) and the live instances of
        ``awa.runtime_instances``, an empty list on a schema without that table."""
        leader = await self.read(
            "SELECT l.pid, a.application_name, a.client_addr::text AS client_addr, a.backend_start "
            "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND l.classid = $1::bigint::oid AND l.objid IN ($2::bigint::oid, ($2::bigint + 1)::oid) "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY l.objid",
            *_LEADER_KEY,
        )
        instances: list[dict[str, Any]] = []
        exists = await self.read("SELECT to_regclass('awa.runtime_instances') IS NOT NULL AS e")
        if exists[0]["e"]:
            rows = await self.read("SELECT to_jsonb(r) AS row FROM awa.runtime_instances r LIMIT 1000")
            instances = [cast("dict[str, Any]", r["row"]) for r in rows]
        return {
            "leader": plain(leader[0]) if leader else None,
            "instances": instances,
            "schema_version": await self.schema_version(),
            "library_schema_version": _awa.SCHEMA_VERSION,
        }

    # ----- cron -------------------------------------------------------------------------

    async def cron(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", json.loads(await _awa.cron_list(self.native)))

    async def cron_remove(self, name: str) -> None:
        if not await _awa.cron_delete(self.native, name):
            raise NotFound(f"cron schedule {name!r} not found")

    async def cron_pause(self, name: str, paused: bool) -> dict[str, Any]:
        if not await _awa.cron_set_paused(self.native, name, paused):
            raise NotFound(f"cron schedule {name!r} not found")
        return {"name": name, "paused": paused}

    async def cron_trigger(self, name: str) -> dict[str, Any]:
        text = await _awa.cron_trigger(self.native, name)
        if text is None:
            raise NotFound(f"cron schedule {name!r} not found")
        return _job(json.loads(text))

    # ----- dead-letter queue ------------------------------------------------------------

    @staticmethod
    def _dlq_filter(kind: Optional[str], queue: Optional[str], tag: Optional[str],
                    before_id: Any = None) -> tuple[str, list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        for clause, value in (("kind = {}", kind), ("queue = {}", queue), ("tags @> ARRAY[{}::text]", tag)):
            if value is not None:
                params.append(value)
                where.append(clause.format(f"${len(params)}"))
        if before_id is not None:
            where.append(f"id < {check_int('before_id', before_id, 1, 2**63 - 1)}")  # inlined: see _PLANS
        return (" WHERE " + " AND ".join(where)) if where else "", params

    async def dlq_depth(self, queue: Optional[str] = None) -> dict[str, Any]:
        where, params = self._dlq_filter(None, queue, None)
        rows = await self.read(f"SELECT queue, count(*) AS n FROM awa.jobs_dlq{where} GROUP BY queue ORDER BY queue", *params)
        by_queue = {r["queue"]: int(r["n"]) for r in rows}
        return {"total": sum(by_queue.values()), "by_queue": by_queue}

    async def dlq_list(self, *, kind: Optional[str] = None, queue: Optional[str] = None, tag: Optional[str] = None,
                       limit: Any = 50, before_id: Any = None) -> dict[str, Any]:
        limit = check_int("limit", limit, 1, MAX_LIMIT)
        where, params = self._dlq_filter(kind, queue, tag, before_id)
        rows = await self.read_rows_json(
            f"SELECT {_DLQ_COLUMNS} FROM awa.jobs_dlq{where} ORDER BY id DESC LIMIT {limit + 1}", *params
        )
        more = len(rows) > limit
        items = [cast("dict[str, Any]", plain(r)) for r in rows[:limit]]
        return {"jobs": items, "next_before_id": items[-1]["id"] if more else None}

    async def dlq_get(self, job_id: int) -> dict[str, Any]:
        entry = json.loads(await self.native.get_dlq_job(job_id))
        if entry is None:  # the engine answers null for an id not in the DLQ
            raise NotFound(f"DLQ job {job_id} not found")
        return cast("dict[str, Any]", entry)

    async def dlq_retry(self, job_id: int) -> dict[str, Any]:
        job = json.loads(await self.native.retry_from_dlq(job_id, None, None, None))
        if job is None:  # null: no such id in the DLQ
            raise NotFound(f"DLQ job {job_id} not found")
        return _job(job)

    async def dlq_delete(self, job_id: int) -> None:
        n = await self.native.execute("DELETE FROM awa.jobs_dlq WHERE id = $1", [job_id])
        if not n:
            raise NotFound(f"DLQ job {job_id} not found")

    async def dlq_ids(self, kind: Optional[str], queue: Optional[str], tag: Optional[str]) -> list[int]:
        where, params = self._dlq_filter(kind, queue, tag)
        return [int(r["id"]) for r in await self.read(f"SELECT id FROM awa.jobs_dlq{where} ORDER BY id", *params)]

    async def dlq_purge(self, kind: Optional[str], queue: Optional[str], tag: Optional[str]) -> int:
        where, params = self._dlq_filter(kind, queue, tag)
        return int(await self.native.execute(f"DELETE FROM awa.jobs_dlq{where}", params))

    async def failed_ids(self, kind: Optional[str], queue: Optional[str]) -> list[int]:
        """Failed jobs in awa.jobs (what ``dlq move`` moves), oldest first."""
        where, params = self._dlq_filter(kind, queue, None)
        cond = where.replace(" WHERE ", " AND ", 1)
        rows = await self.read(f"SELECT id FROM awa.jobs WHERE state = 'failed'{cond} ORDER BY id", *params)
        return [int(r["id"]) for r in rows]

    async def dlq_move(self, ids: list[int], reason: str) -> int:
        return int(await _awa.dlq_move(self.native, ids, reason))

    # ----- callbacks --------------------------------------------------------------------

    async def callback(self, action: str, callback_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Resolve a waiting job's callback: ``complete`` (body ``payload``), ``fail`` (body
        ``error``, required) or ``heartbeat`` (body ``timeout_seconds``)."""
        payload = body.get("payload")
        error = body.get("error")
        timeout = body.get("timeout_seconds", 3600.0)
        if action == "fail" and (not isinstance(error, str) or not error):
            raise BadRequest("fail needs a non-empty string 'error'")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise BadRequest("timeout_seconds must be a number")
        if action == "heartbeat":
            timeout = _awa.check_setting("timeout_seconds", float(timeout))
        payload_json = None if payload is None else json.dumps(payload)
        try:
            text = await self.native.callback(action, callback_id, payload_json,
                                              error if action == "fail" else None, float(timeout))
        except _awa.CallbackNotFound:
            raise NotFound(f"callback {callback_id} not found (or its job is not waiting)") from None
        return _job(json.loads(text))

    # ----- metrics ----------------------------------------------------------------------

    async def queue_gauges(self) -> list[dict[str, Any]]:
        """Per queue and state, the capped depth; per queue, the lag of its oldest due
        available job (for /metrics)."""
        return await self.queues()


def ids_in(values: Iterable[Any]) -> list[int]:
    """Job ids from a request body's ``ids`` (400 unless every one is a positive integer)."""
    return [check_int("ids[]", v, 1, 2**63 - 1) for v in values]
