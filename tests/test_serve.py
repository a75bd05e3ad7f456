"""``awa serve`` over real HTTP against a real database: every /api route (including 404,
400 and read-only 503, by the flag and by a role whose transactions are read-only), the
security defaults, /metrics parsed as Prometheus text, /healthz and /readyz, and the
signature check of ``awa callbacks serve`` (awa.callback_contract)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, Iterator, Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

import awa
from awa._serve import ServeConfig, Server
from awa.callback_contract import sign as sign_callback
from conftest import ENGINE, admin_execute
from helpers import complete_jobs, wait_for
from test_cli import dead, fail_job, insert
from test_roles import as_role, owner_execute

JSON = {"Content-Type": "application/json"}


class Api:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.base = server.url

    def request(self, method: str, path: str, body: Any = None, headers: Optional[dict[str, str]] = None,
                raw: Optional[bytes] = None) -> tuple[int, Any, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = dict(headers if headers is not None else (JSON if method in ("POST", "DELETE") else {}))
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, text, got = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as err:
            status, text, got = err.code, err.read(), err.headers
        ctype = got.get("Content-Type", "")
        value = json.loads(text) if ctype.startswith("application/json") else text.decode()
        return status, value, got

    def get(self, path: str, **kw: Any) -> Any:
        status, value, _ = self.request("GET", path, **kw)
        assert status == 200, (path, status, value)
        return value

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        status, value, _ = self.request("POST", path, body if body is not None else {}, **kw)
        assert status == 200, (path, status, value)
        return value

    def status(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, value, _ = self.request(method, path, body, **kw)
        if status >= 400:
            assert set(value) == {"error", "status"} and value["status"] == status, value
        return status, value


def start(config: ServeConfig) -> Iterator[Api]:
    server = Server(config)
    thread = threading.Thread(target=server.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Api(server)
    finally:
        server.httpd.shutdown()
        thread.join(10)
        server.close()


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    yield from start(ServeConfig(database_url, port=0))


# ----- reads ------------------------------------------------------------------------------


def test_stats_and_timeseries(api: Api, sync_client: awa.Client) -> None:
    done = insert(sync_client, 1)[0]
    insert(sync_client, 2)
    sync_client._run(complete_jobs(sync_client._async, [done]))
    stats = api.get("/api/stats")
    assert stats["counts"]["available"] == 2 and stats["counts"]["completed"] == 1
    assert stats["estimated"] == [] and stats["total"] == 3 and stats["last_hour"]["completed"] == 1
    series = api.get("/api/stats/timeseries?minutes=5")
    assert series["minutes"] == 5 and len(series["points"]) == 5
    assert sum(p["completed"] for p in series["points"]) == 1
    assert len(api.get("/api/stats/timeseries")["points"]) == 60
    assert api.status("GET", "/api/stats/timeseries?minutes=0")[0] == 400
    assert api.status("GET", "/api/stats/timeseries?minutes=abc")[0] == 400


def _complete_in_bulk(sync_client: awa.Client, n: int) -> None:
    """``n`` completed jobs of kind ``bulk``, and fresh statistics for their tables."""
    if ENGINE == "canonical":
        sync_client._run(sync_client._async._execute(
            "INSERT INTO awa.jobs (kind, state, finalized_at) SELECT 'bulk', 'completed', now() "
            "FROM generate_series(1, $1::int)", n))
        sync_client._run(sync_client._async._execute("ANALYZE awa.canonical_jobs"))
        return

    # Queue storage's completed jobs are receipts over ready entries, made by running them.
    async def run() -> None:
        c = sync_client._async

        @c.task(dict, kind="bulk")
        async def bulk(job: awa.Job) -> None:
            return None

        await c.insert_many([{"n": i} for i in range(n)], kind="bulk")
        await c.start([("default", 32)], poll_interval_ms=50)
        try:
            async def all_done() -> bool:
                async with c.transaction() as tx:
                    row = await tx.fetch_one("SELECT count(*) AS n FROM awa.jobs WHERE state = 'completed'")
                return bool(row["n"] == n)

            await wait_for(all_done, timeout=60, what=f"{n} completed jobs")
        finally:
            await c.shutdown()
        await c._execute("ANALYZE awa.receipts, awa.ready_entries")

    sync_client._run(run())


def test_stats_estimate_past_the_cap(api: Api, sync_client: awa.Client) -> None:
    from awa._ops import COUNT_CAP

    _complete_in_bulk(sync_client, COUNT_CAP * 3)
    stats = api.get("/api/stats")
    assert stats["estimated"] == ["completed"] and stats["count_cap"] == COUNT_CAP
    assert COUNT_CAP * 2 <= stats["counts"]["completed"] <= COUNT_CAP * 4  # the planner's estimate
    assert stats["last_hour_capped"] == ["completed"] and stats["last_hour"]["completed"] == COUNT_CAP


def test_stats_estimate_running_past_the_cap(api: Api, sync_client: awa.Client) -> None:
    from awa._ops import COUNT_CAP

    n = COUNT_CAP * 3 // 2
    run = sync_client._run
    if ENGINE == "canonical":
        run(sync_client._async._execute(
            "INSERT INTO awa.jobs (kind, state, attempt, attempted_at, heartbeat_at, deadline_at) "
            "SELECT 'held', 'running', 1, now(), now(), now() + interval '1 hour' FROM generate_series(1, $1::int)", n))
        run(sync_client._async._execute("ANALYZE awa.canonical_jobs"))
    else:
        # Queue storage's running jobs are leases: taken by one claim of every job.
        assert run(sync_client._async.enqueue_many_copy([{"i": i} for i in range(n)], kind="held")) == n
        run(sync_client._async._execute("SELECT count(*) FROM awa.qs_claim_queue('default', $1::int)", n))
        run(sync_client._async._execute("ANALYZE awa.leases, awa.ready_entries"))
    stats = api.get("/api/stats")
    assert stats["estimated"] == ["running"]
    assert n * 0.8 <= stats["counts"]["running"] <= n * 1.2, stats["counts"]  # the planner's estimate


def test_jobs_list_filters_paging_and_detail(api: Api, sync_client: awa.Client) -> None:
    ids = insert(sync_client, 3, queue="q1", tags=["red"])
    other = insert(sync_client, 1, kind="other", queue="q2")[0]
    page = api.get("/api/jobs?limit=2")
    assert [j["id"] for j in page["jobs"]] == [other, ids[2]] and page["next_before_id"] == ids[2]
    rest = api.get(f"/api/jobs?limit=2&before_id={ids[2]}")
    assert [j["id"] for j in rest["jobs"]] == [ids[1], ids[0]] and rest["next_before_id"] is None
    assert [j["id"] for j in api.get("/api/jobs?kind=other")["jobs"]] == [other]
    assert len(api.get("/api/jobs?queue=q1&tag=red&state=available")["jobs"]) == 3
    assert api.get("/api/jobs?state=&kind=")["jobs"]  # empty filters are no filters
    for bad in ("state=sleeping", "limit=0", "limit=5000", "limit=x", "before_id=-1"):
        assert api.status("GET", f"/api/jobs?{bad}")[0] == 400, bad
    fail_job(sync_client, ids[0], "broken")
    job = api.get(f"/api/jobs/{ids[0]}")
    assert job["state"] == "failed" and job["attempts"][0]["error"] == "broken"
    assert job["attempts"][0]["traceback"].startswith("Traceback")
    assert api.status("GET", "/api/jobs/999999") == (404, {"error": "job 999999 not found", "status": 404})
    assert api.status("GET", "/api/jobs/abc")[0] == 400


def test_queues_kinds_runtime_cron_capabilities(api: Api, sync_client: awa.Client) -> None:
    insert(sync_client, 2, queue="mail", kind="send")
    insert(sync_client, 1, queue="sms", kind="text")
    queues = api.get("/api/queues")
    assert [q["queue"] for q in queues] == ["mail", "sms"]
    assert queues[0]["counts"]["available"] == 2 and queues[0]["lag_seconds"] >= 0
    assert api.get("/api/queues/mail")["total"] == 2
    assert api.status("GET", "/api/queues/nope")[0] == 404
    kinds = api.get("/api/kinds")  # each with its descriptor's fields (none declared here)
    assert [k["kind"] for k in kinds] == ["send", "text"]
    assert kinds[0]["display_name"] is None and kinds[0]["tags"] == [] and kinds[0]["descriptor_stale"] is False
    assert queues[0]["display_name"] is None and queues[0]["descriptor_mismatch"] is False
    runtime = api.get("/api/runtime")
    assert runtime["leader"] is None and runtime["instances"] == []
    assert runtime["schema_version"] == awa._awa.SCHEMA_VERSION
    assert api.get("/api/cron") == []
    caps = api.get("/api/capabilities")
    assert caps["read_only"] is False and caps["auth"] is False


def test_runtime_shows_the_leader_of_a_running_worker(api: Api, database_url: str) -> None:
    async def body() -> None:
        client = awa.AsyncClient(database_url)

        @client.task(dict, kind="noop")
        async def noop(job: Any) -> None:
            return None

        await client.start([("default", 1)], leader_election_interval_ms=50)
        try:
            from helpers import wait_for
            await wait_for(lambda: api.get("/api/runtime")["leader"] is not None, 20, "a leader")
            assert isinstance(api.get("/api/runtime")["leader"]["pid"], int)
        finally:
            await client.shutdown()
            await client.close()

    asyncio.run(body())


# ----- mutations --------------------------------------------------------------------------


def test_job_retry_cancel_and_bulk(api: Api, sync_client: awa.Client) -> None:
    a, b, c = insert(sync_client, 3)
    assert api.post(f"/api/jobs/{a}/cancel")["state"] == "cancelled"
    assert api.post(f"/api/jobs/{a}/retry")["state"] == "available"
    status, value = api.status("POST", f"/api/jobs/{a}/retry", {})
    assert status == 409 and "can be retried" in value["error"]
    assert api.status("POST", "/api/jobs/999999/cancel", {})[0] == 404
    assert api.status("POST", "/api/jobs/999999/retry", {})[0] == 404
    result = api.post("/api/jobs/bulk-cancel", {"ids": [b, c, 999999]})
    assert result["done"] == [b, c] and list(result["errors"]) == ["999999"]
    assert api.post("/api/jobs/bulk-retry", {"ids": [b, c]}) == {"done": [b, c], "errors": {}}
    for bad in ({}, {"ids": []}, {"ids": "1"}, {"ids": ["x"]}, {"ids": [True]}):
        assert api.status("POST", "/api/jobs/bulk-retry", bad)[0] == 400, bad
    assert api.status("POST", "/api/jobs/bulk-retry", raw=b"{not json", headers=JSON)[0] == 400
    assert api.status("POST", "/api/jobs/bulk-retry", raw=b"[1]", headers=JSON)[0] == 400


def test_queue_pause_resume_drain(api: Api, sync_client: awa.Client) -> None:
    insert(sync_client, 2, queue="mail")
    assert api.post("/api/queues/mail/pause") == {"queue": "mail", "paused": True}
    assert api.get("/api/queues/mail")["paused"] is True
    assert api.post("/api/queues/mail/resume") == {"queue": "mail", "paused": False}
    assert api.post("/api/queues/mail/drain") == {"queue": "mail", "cancelled": 2}


def test_cron_trigger_pause_resume(api: Api, sync_client: awa.Client) -> None:
    sync_client._run(sync_client._async._execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args) "
        "VALUES ('nightly', '0 3 * * *', 'UTC', 'report', 'default', '{\"x\": 1}')"))
    assert api.post("/api/cron/nightly/pause") == {"name": "nightly", "paused": True}
    assert api.get("/api/cron")[0]["paused"] is True
    assert api.post("/api/cron/nightly/resume") == {"name": "nightly", "paused": False}
    job = api.post("/api/cron/nightly/trigger")
    assert job["kind"] == "report" and job["args"] == {"x": 1}
    for action in ("trigger", "pause", "resume"):
        assert api.status("POST", f"/api/cron/nope/{action}", {})[0] == 404


def test_dlq_routes(api: Api, sync_client: awa.Client) -> None:
    a = dead(sync_client, 3, kind="a", queue="qa", tags=["x"])
    b = dead(sync_client, 2, kind="b", queue="qb")

    async def move() -> None:
        native = awa._awa.NativeClient(sync_client._async.database_url, 1)
        await awa._awa.dlq_move(native, a + b, "test")
        await native.close()

    import asyncio
    asyncio.run(move())
    assert api.get("/api/dlq/depth") == {"total": 5, "by_queue": {"qa": 3, "qb": 2}}
    assert api.get("/api/dlq/depth?queue=qa") == {"total": 3, "by_queue": {"qa": 3}}
    page = api.get("/api/dlq?limit=2")
    assert [r["id"] for r in page["jobs"]] == [b[1], b[0]] and page["next_before_id"] == b[0]
    assert [r["id"] for r in api.get("/api/dlq?tag=x")["jobs"]] == a[::-1]
    assert api.get(f"/api/dlq/{a[0]}")["reason"] == "test"
    assert api.status("GET", "/api/dlq/999999")[0] == 404
    assert api.post(f"/api/dlq/{a[0]}/retry")["state"] == "available"
    assert api.status("POST", f"/api/dlq/{a[0]}/retry", {})[0] == 404
    status, value, _ = api.request("DELETE", f"/api/dlq/{a[1]}")
    assert (status, value) == (200, {"deleted": a[1]})
    assert api.status("DELETE", f"/api/dlq/{a[1]}")[0] == 404
    assert api.status("POST", "/api/dlq/bulk-retry", {})[0] == 400
    assert api.status("POST", "/api/dlq/bulk-purge", {"kind": 5})[0] == 400
    assert api.post("/api/dlq/bulk-retry", {"queue": "qa"}) == {"retried": 1}
    assert api.post("/api/dlq/bulk-purge", {"all": True}) == {"purged": 2}


def test_callback_routes(api: Api, database_url: str) -> None:
    async def body() -> None:
        client = awa.AsyncClient(database_url)
        registered: dict[str, str] = {}

        @client.task(dict, kind="waits")
        async def waits(job: Any) -> Any:
            token = await job.register_callback(timeout_seconds=600)
            registered[str(job.id)] = token
            return awa.WaitForCallback(token)

        jobs = [await client.insert({}, kind="waits") for _ in range(2)]
        from helpers import FAST, wait_for, wait_for_state
        await client.start([("default", 2)], **FAST)
        try:
            for j in jobs:
                await wait_for_state(client, j.id, "waiting_external")
            await wait_for(lambda: len(registered) == 2, 10, "callbacks")
            first, second = (registered[str(j.id)] for j in jobs)
            assert api.post(f"/api/callbacks/{first}/heartbeat", {"timeout_seconds": 120})["state"] == "waiting_external"
            assert api.status("POST", f"/api/callbacks/{first}/heartbeat", {"timeout_seconds": "x"})[0] == 400
            assert api.post(f"/api/callbacks/{first}/complete", {"payload": {"ok": 1}})["state"] == "completed"
            assert api.status("POST", f"/api/callbacks/{second}/fail", {})[0] == 400
            failed = api.post(f"/api/callbacks/{second}/fail", {"error": "remote said no"})
            assert failed["state"] in ("retryable", "failed", "available")
            assert api.status("POST", f"/api/callbacks/{uuid.uuid4()}/complete", {})[0] == 404
        finally:
            await client.shutdown()
            await client.close()

    asyncio.run(body())


# ----- errors, methods, security ----------------------------------------------------------


def test_unknown_routes_and_methods(api: Api) -> None:
    assert api.status("GET", "/api/nope")[0] == 404
    assert api.status("GET", "/nope")[0] == 404
    assert api.status("GET", "/api/jobs/1/retry")[0] == 405  # mutations are never GET
    assert api.status("POST", "/api/stats", {})[0] == 405
    assert api.status("PUT", "/api/jobs/1/retry", {})[0] == 405


def test_mutations_need_a_json_body_or_the_token(api: Api, sync_client: awa.Client) -> None:
    job_id = insert(sync_client)[0]
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, value = api.status("POST", f"/api/jobs/{job_id}/cancel", raw=b"a=1", headers=form)
    assert status == 415 and "JSON" in value["error"]
    assert api.status("POST", f"/api/jobs/{job_id}/cancel", raw=b"", headers={})[0] == 415
    assert api.get(f"/api/jobs/{job_id}")["state"] == "available"  # nothing happened


def test_loopback_server_refuses_foreign_host_names(api: Api) -> None:
    status, _ = api.status("GET", "/api/stats", headers={"Host": "attacker.example"})
    assert status == 421
    assert api.get("/api/stats", headers={"Host": "localhost:3000"})["total"] == 0


def test_security_headers_and_body_limit(api: Api) -> None:
    _, _, headers = api.request("GET", "/api/stats")
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert api.status("POST", "/api/jobs/bulk-retry", raw=b"x" * (2 << 20), headers=JSON)[0] == 413


def test_auth_token(database_url: str) -> None:
    for api in start(ServeConfig(database_url, port=0, auth_token="s3cret")):
        status, value, headers = api.request("GET", "/api/stats")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert api.status("GET", "/api/stats", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert api.status("GET", "/metrics")[0] == 401
        good = {"Authorization": "Bearer s3cret"}
        assert api.get("/api/stats", headers=good)["total"] == 0
        assert api.get("/api/capabilities", headers=good)["auth"] is True
        assert "awa_queue_depth" in api.get("/metrics", headers=good)
        # the token header alone makes a request a deliberate mutation (no JSON body needed)
        assert api.status("POST", "/api/queues/q/pause", raw=b"", headers=good)[0] == 200
        # probes and the page shell stay open
        assert api.get("/healthz") == {"status": "ok"} and api.get("/readyz")["ready"] is True
        assert "<html" in api.get("/").lower()


# ----- read-only --------------------------------------------------------------------------

MUTATIONS = [
    ("POST", "/api/jobs/1/retry"), ("POST", "/api/jobs/1/cancel"), ("POST", "/api/jobs/bulk-retry"),
    ("POST", "/api/jobs/bulk-cancel"), ("POST", "/api/queues/q/pause"), ("POST", "/api/queues/q/resume"),
    ("POST", "/api/queues/q/drain"), ("POST", "/api/cron/c/trigger"), ("POST", "/api/cron/c/pause"),
    ("POST", "/api/cron/c/resume"), ("POST", "/api/dlq/1/retry"), ("DELETE", "/api/dlq/1"),
    ("POST", "/api/dlq/bulk-retry"), ("POST", "/api/dlq/bulk-purge"),
    ("POST", f"/api/callbacks/{uuid.uuid4()}/complete"), ("POST", f"/api/callbacks/{uuid.uuid4()}/fail"),
    ("POST", f"/api/callbacks/{uuid.uuid4()}/heartbeat"),
]


def assert_read_only(api: Api, sync_client: awa.Client) -> None:
    job_id = insert(sync_client)[0]
    assert api.get("/api/capabilities")["read_only"] is True
    for method, path in MUTATIONS:
        status, value = api.status(method, path.replace("/1/", f"/{job_id}/"), {"ids": [job_id], "all": True})
        assert status == 503 and "read-only" in value["error"], (method, path, status)
    assert api.get(f"/api/jobs/{job_id}")["state"] == "available"
    assert api.get("/api/stats")["total"] == 1  # reads still work


def test_read_only_flag(database_url: str, sync_client: awa.Client) -> None:
    for api in start(ServeConfig(database_url, port=0, read_only=True)):
        assert api.get("/api/capabilities")["read_only_flag"] is True
        assert_read_only(api, sync_client)


@pytest.fixture
def read_only_url(database_url: str) -> Iterator[str]:
    """A role whose transactions are read-only (default_transaction_read_only = on), with
    read and write grants: only the server's setting stops its writes."""
    role = f"awa_py_ro_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin_execute(f'CREATE ROLE "{role}" LOGIN')
    admin_execute(f'ALTER ROLE "{role}" SET default_transaction_read_only = on')
    try:
        for sql in (f'GRANT USAGE ON SCHEMA awa TO "{role}"',
                    f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA awa TO "{role}"',
                    f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA awa TO "{role}"'):
            owner_execute(database_url, sql)
        yield as_role(database_url, role)
    finally:
        owner_execute(database_url, f'DROP OWNED BY "{role}"')
        admin_execute(f'DROP ROLE IF EXISTS "{role}"')


def test_read_only_server(read_only_url: str, sync_client: awa.Client) -> None:
    for api in start(ServeConfig(read_only_url, port=0)):
        caps = api.get("/api/capabilities")
        assert caps["server_read_only"] is True and caps["read_only_flag"] is False
        assert_read_only(api, sync_client)


# ----- metrics, health, assets ------------------------------------------------------------


def test_metrics_parse_as_prometheus_text(api: Api, sync_client: awa.Client) -> None:
    insert(sync_client, 2, queue="mail")
    text = api.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    depth = {(s.labels["queue"], s.labels["state"]): s.value for s in families["awa_queue_depth"].samples}
    assert depth[("mail", "available")] == 2 and depth[("mail", "failed")] == 0
    assert families["awa_queue_lag_seconds"].type == "gauge"
    assert families["awa_dlq_depth"].samples[0].labels == {"queue": "mail"}
    for name in ("awa_jobs_claimed", "awa_finalize_retries", "awa_finalize_stale", "awa_follow_ups_inserted",
                 "awa_follow_ups_skipped_duplicate", "awa_staged_discarded_wait_for_callback"):
        assert families[name].type == "counter", name


def test_healthz_and_readyz(api: Api, empty_database: str) -> None:
    assert api.get("/healthz") == {"status": "ok"}
    assert api.get("/readyz") == {"ready": True, "schema_version": awa._awa.SCHEMA_VERSION}
    for unready in start(ServeConfig(empty_database, port=0)):
        status, value, _ = unready.request("GET", "/readyz")
        assert status == 503 and value["ready"] is False and "run awa migrate" in value["reason"]
        assert unready.get("/healthz") == {"status": "ok"}


def test_page_assets_ship_in_the_package(api: Api) -> None:
    assert "/assets/app.js" in api.get("/")
    _, _, headers = api.request("GET", "/assets/app.js")
    assert headers["Content-Type"].startswith("text/javascript")
    _, _, headers = api.request("GET", "/assets/app.css")
    assert headers["Content-Type"].startswith("text/css")


# ----- the processes ----------------------------------------------------------------------


def test_awa_serve_process_prints_its_url_and_stops_on_sigterm(database_url: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "awa", "--database-url", database_url, "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("awa serve: listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        with urllib.request.urlopen(url + "/healthz", timeout=30) as resp:
            assert json.loads(resp.read()) == {"status": "ok"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_callbacks_serve_checks_the_signature(database_url: str) -> None:
    secret = b"k" * 32
    for api in start(ServeConfig(database_url, port=0, callbacks_only=True, callback_secret=secret)):
        callback_id = str(uuid.uuid4())
        path = f"/api/callbacks/{callback_id}/complete"
        assert api.status("POST", path, {})[0] == 401
        assert api.status("POST", path, {}, headers={**JSON, "X-Awa-Signature": "00" * 32})[0] == 401
        signed = {**JSON, "X-Awa-Signature": sign_callback(secret, callback_id)}
        assert api.status("POST", path, {}, headers=signed)[0] == 404  # signed, but no such callback
        assert api.status("GET", "/api/stats")[0] == 404  # only the callback routes
        assert api.status("GET", "/")[0] == 404
    for api in start(ServeConfig(database_url, port=0, callbacks_only=True)):  # --allow-unsigned
        assert api.status("POST", f"/api/callbacks/{uuid.uuid4()}/complete", {})[0] == 404


def test_worker_metrics_endpoint_counts_this_process(database_url: str) -> None:
    async def body() -> None:
        client = awa.AsyncClient(database_url)

        @client.task(dict, kind="noop_metrics")
        async def noop(job: Any) -> None:
            return None

        server = awa.serve_metrics(client, port=0)
        try:
            def families() -> dict[str, Any]:
                with urllib.request.urlopen(server.url, timeout=30) as resp:
                    return {f.name: f for f in text_string_to_metric_families(resp.read().decode())}

            def of_kind(family: str, suffix: str = "") -> float:
                return sum(float(s.value) for s in families()[family].samples
                           if s.labels.get("kind") == "noop_metrics" and s.name == family + suffix)

            def claimed() -> float:
                return of_kind("awa_jobs_claimed", "_total")

            before = claimed()
            job = await client.insert({}, kind="noop_metrics")
            from helpers import FAST, wait_for_state
            await client.start([("default", 1)], **FAST)
            await wait_for_state(client, job.id, "completed")
            assert claimed() >= before + 1
            # Per kind and queue: inserted, completed, and one handler run in the histogram.
            assert of_kind("awa_jobs_inserted", "_total") >= 1
            # Counted just after the commit the test saw: wait for it, boundedly.
            deadline = time.monotonic() + 30
            while of_kind("awa_jobs_completed", "_total") < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert of_kind("awa_jobs_completed", "_total") >= 1
            assert of_kind("awa_job_duration_seconds", "_count") >= 1
            assert of_kind("awa_job_wait_seconds", "_count") >= 1
            inf = [s for s in families()["awa_job_duration_seconds"].samples
                   if s.labels.get("kind") == "noop_metrics" and s.labels.get("le") == "+Inf"]
            assert inf and inf[0].labels["queue"] == "default" and inf[0].value >= 1
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=30)
        finally:
            server.close()
            await client.shutdown()
            await client.close()
        with pytest.raises(TypeError):
            awa.serve_metrics(object())

    asyncio.run(body())


def test_a_call_after_the_loop_stopped_is_refused_and_its_coroutine_closed() -> None:
    """A request that arrives while the server shuts down gets an error, and the coroutine
    built for it is closed, not left to be collected unawaited (a RuntimeWarning)."""
    import gc
    import warnings

    from awa._serve import LoopThread

    runner = LoopThread()

    async def answer() -> int:
        return 42

    assert runner.run(answer()) == 42
    runner.stop()
    coro = answer()
    with pytest.raises(RuntimeError, match="shutting down"):
        runner.run(coro)
    assert coro.cr_frame is None, "the coroutine was closed"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del coro
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_copy_inserts_and_rescues_are_counted_on_either_engine(database_url: str) -> None:
    from helpers import FAST, wait_for

    async def body() -> None:
        client = awa.AsyncClient(database_url)
        started = asyncio.Event()
        release = asyncio.Event()

        @client.task(dict, kind="held_metrics")
        async def held(job: Any) -> None:
            started.set()
            await release.wait()

        server = awa.serve_metrics(client, port=0)
        try:
            def count(family: str, kind: str) -> float:
                with urllib.request.urlopen(server.url, timeout=30) as resp:
                    text = resp.read().decode()
                return sum(float(s.value) for f in text_string_to_metric_families(text) if f.name == family
                           for s in f.samples if s.labels.get("kind") == kind and s.name == family + "_total")

            before = count("awa_jobs_inserted", "copied_metrics")
            assert await client.enqueue_many_copy([{"n": i} for i in range(3)], kind="copied_metrics") == 3
            assert count("awa_jobs_inserted", "copied_metrics") == before + 3

            job = await client.insert({}, kind="held_metrics")
            await client.start([("default", 1)], **FAST)
            await asyncio.wait_for(started.wait(), 10)
            # The attempt's deadline moved into the past where its engine keeps it: the
            # runtime's deadline rescue takes the job back.
            table = "awa.leases" if ENGINE == "queue_storage" else "awa.jobs"
            async with client.transaction() as tx:
                await tx.execute(f"UPDATE {table} SET deadline_at = now() - interval '1 second' WHERE id = $1", job.id)
            await wait_for(lambda: count("awa_jobs_rescued", "held_metrics") >= 1, timeout=20, what="a rescue counted")
        finally:
            release.set()
            server.close()
            await client.shutdown()
            await client.close()

    asyncio.run(body())
