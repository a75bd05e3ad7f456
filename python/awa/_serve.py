"""``awa serve`` and ``awa callbacks serve``: the web UI, its JSON API under ``/api``,
``/metrics``, ``/healthz`` and ``/readyz``, on the standard library's threading HTTP server.

Request threads hand every database call to one private asyncio loop that owns the native
client (``awa._awa.NativeClient``); the routes are thin: parse and check the parameters,
call :class:`awa._ops.Ops`, write JSON. Why the standard library and not a web framework:
docs/operating.md, "Design".

Security defaults (docs/operating.md, "Security"): binds to 127.0.0.1; with an auth token
every API and metrics request needs ``Authorization: Bearer <token>``; a mutation is only a
POST or DELETE that carries a JSON body (``Content-Type: application/json``) or the token
header, which a cross-site form or image cannot send; a loopback server only answers
loopback ``Host`` names (no DNS rebinding); in read-only mode (``--read-only`` or a server
whose transactions are read-only) every mutation is 503.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import http.server
import importlib.resources
import json
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any, Callable, Coroutine, Optional, TypeVar

from . import _awa, callback_contract
from ._metrics import render_metrics
from ._ops import BadRequest, NotFound, Ops, check_int, check_state, ids_in

__all__ = ["ServeConfig", "Server", "serve", "sign_callback"]

T = TypeVar("T")

#: The largest request body accepted (413 past it).
MAX_BODY = 1 << 20
#: How much of a refused body is read (and dropped) before answering 413.
DRAIN_LIMIT = 16 << 20
#: How long a read-only probe of the server stays valid.
READ_ONLY_TTL = 5.0
#: SQLSTATE read_only_sql_transaction.
READ_ONLY_SQLSTATE = "25006"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
SIGNATURE_HEADER = callback_contract.SIGNATURE_HEADER


def sign_callback(secret: bytes, callback_id: str) -> str:
    """The ``X-Awa-Signature`` of a callback id (``awa.callback_contract.sign``: BLAKE3 keyed
    hash under a 32-byte secret, awa-pg's format)."""
    return callback_contract.sign(secret, callback_id)


@dataclasses.dataclass
class ServeConfig:
    database_url: str
    host: str = "127.0.0.1"
    port: int = 3000
    read_only: bool = False
    auth_token: Optional[str] = None
    callbacks_only: bool = False
    callback_secret: Optional[bytes] = None


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: Any
    body: bytes

    def json_body(self) -> dict[str, Any]:
        if not self.body.strip():
            return {}
        try:
            value = json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "the body must be a JSON object")
        return value


class LoopThread:
    """The asyncio loop (on a daemon thread) that owns the native client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="awa-serve", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the loop and wait for it. (A coroutine, not any awaitable: the
        native module's calls need the loop running on the calling thread, so they must only
        start inside the coroutine.)

        A coroutine that can no longer run (the loop has stopped: a request that arrived while
        the server shut down) is closed rather than left to be collected unawaited, and one
        that outlives ``timeout`` is cancelled rather than left running."""
        if not self.loop.is_running():
            coro.close()
            raise RuntimeError("the server is shutting down")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:  # not the builtin one before Python 3.11
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


Handler = Callable[[Request, "re.Match[str]"], Any]


class App:
    """Routing, checks and error mapping, independent of the HTTP transport."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.runner = LoopThread()
        self.native = _awa.NativeClient(config.database_url, 8)
        self.ops = Ops(self.native)
        self._read_only_at = 0.0
        self._server_read_only = False
        self.routes: list[tuple[str, re.Pattern[str], Handler, bool]] = []
        self._register()

    def close(self) -> None:
        async def close_pool() -> None:
            await self.native.close()  # the native call must start on the loop's thread

        try:
            self.runner.run(close_pool(), 10)
        finally:
            self.runner.stop()

    # ----- helpers ----------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def server_read_only(self) -> bool:
        now = time.monotonic()
        if now - self._read_only_at > READ_ONLY_TTL:
            self._server_read_only = self.call(self.ops.read_only())
            self._read_only_at = now
        return self._server_read_only

    def read_only(self) -> bool:
        return self.config.read_only or self.server_read_only()

    def route(self, method: str, pattern: str, mutation: bool = False) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.routes.append((method, re.compile("^" + pattern + "$"), fn, mutation))
            return fn
        return register

    # ----- routes -----------------------------------------------------------------------

    def _register(self) -> None:
        r = self.route
        ops = self.ops
        q = _query_value

        def job_id(m: "re.Match[str]") -> int:
            return check_int("id", m.group("id"), 1, 2**63 - 1)

        if not self.config.callbacks_only:
            r("GET", "/api/stats")(lambda req, m: self.call(ops.stats()))
            r("GET", "/api/stats/timeseries")(
                lambda req, m: self.call(ops.timeseries(check_int("minutes", req.query.get("minutes", "60"), 1, 1440))))
            r("GET", "/api/jobs")(lambda req, m: self.call(ops.list_jobs(
                state=check_state(q(req, "state")), kind=q(req, "kind"), queue=q(req, "queue"), tag=q(req, "tag"),
                limit=req.query.get("limit") or 50, before_id=q(req, "before_id"))))
            r("GET", r"/api/jobs/(?P<id>[^/]+)")(lambda req, m: self.call(ops.get_job(job_id(m))))
            r("POST", r"/api/jobs/(?P<id>[^/]+)/retry", True)(lambda req, m: self.call(ops.retry_job(job_id(m))))
            r("POST", r"/api/jobs/(?P<id>[^/]+)/cancel", True)(lambda req, m: self.call(ops.cancel_job(job_id(m))))
            r("POST", "/api/jobs/bulk-retry", True)(lambda req, m: self._bulk(req, ops.retry_job))
            r("POST", "/api/jobs/bulk-cancel", True)(lambda req, m: self._bulk(req, ops.cancel_job))
            r("GET", "/api/queues")(lambda req, m: self.call(ops.queues()))
            r("GET", r"/api/queues/(?P<name>[^/]+)")(lambda req, m: self.call(ops.queue(_name(m))))
            r("POST", r"/api/queues/(?P<name>[^/]+)/pause", True)(
                lambda req, m: self.call(ops.pause_queue(_name(m), True)))
            r("POST", r"/api/queues/(?P<name>[^/]+)/resume", True)(
                lambda req, m: self.call(ops.pause_queue(_name(m), False)))
            r("POST", r"/api/queues/(?P<name>[^/]+)/drain", True)(
                lambda req, m: {"queue": _name(m), "cancelled": self.call(ops.drain_queue(_name(m)))})
            r("GET", "/api/kinds")(lambda req, m: self.call(ops.kinds()))
            r("GET", "/api/runtime")(lambda req, m: self.call(ops.runtime()))
            r("GET", "/api/cron")(lambda req, m: self.call(ops.cron()))
            r("POST", r"/api/cron/(?P<name>[^/]+)/trigger", True)(lambda req, m: self.call(ops.cron_trigger(_name(m))))
            r("POST", r"/api/cron/(?P<name>[^/]+)/pause", True)(lambda req, m: self.call(ops.cron_pause(_name(m), True)))
            r("POST", r"/api/cron/(?P<name>[^/]+)/resume", True)(
                lambda req, m: self.call(ops.cron_pause(_name(m), False)))
            r("GET", "/api/dlq")(lambda req, m: self.call(ops.dlq_list(
                kind=q(req, "kind"), queue=q(req, "queue"), tag=q(req, "tag"),
                limit=req.query.get("limit") or 50, before_id=q(req, "before_id"))))
            r("GET", "/api/dlq/depth")(lambda req, m: self.call(ops.dlq_depth(q(req, "queue"))))
            r("GET", r"/api/dlq/(?P<id>[^/]+)")(lambda req, m: self.call(ops.dlq_get(job_id(m))))
            r("POST", r"/api/dlq/(?P<id>[^/]+)/retry", True)(lambda req, m: self.call(ops.dlq_retry(job_id(m))))
            r("DELETE", r"/api/dlq/(?P<id>[^/]+)", True)(lambda req, m: self._dlq_delete(job_id(m)))
            r("POST", "/api/dlq/bulk-retry", True)(lambda req, m: self._dlq_bulk(req, retry=True))
            r("POST", "/api/dlq/bulk-purge", True)(lambda req, m: self._dlq_bulk(req, retry=False))
            r("GET", "/api/capabilities")(lambda req, m: self._capabilities())
        for action in ("complete", "fail", "heartbeat"):
            r("POST", rf"/api/callbacks/(?P<id>[^/]+)/{action}", True)(self._callback_route(action))

    def _capabilities(self) -> dict[str, Any]:
        server = self.server_read_only()
        return {
            "read_only": self.config.read_only or server,
            "read_only_flag": self.config.read_only,
            "server_read_only": server,
            "auth": self.config.auth_token is not None,
            "schema_version": _awa.SCHEMA_VERSION,
            "version": _version(),
        }

    def _bulk(self, req: Request, action: Callable[[int], Coroutine[Any, Any, dict[str, Any]]]) -> dict[str, Any]:
        ids = req.json_body().get("ids")
        if not isinstance(ids, list) or not ids or len(ids) > 1000:
            raise HttpError(400, "the body needs 'ids': a list of 1 to 1000 job ids")
        done: list[int] = []
        errors: dict[str, str] = {}
        for job_id in ids_in(ids):
            try:
                self.call(action(job_id))
                done.append(job_id)
            except (NotFound, _awa.AwaError) as exc:
                if _is_read_only_error(exc):
                    raise
                errors[str(job_id)] = str(exc)
        return {"done": done, "errors": errors}

    def _dlq_delete(self, job_id: int) -> dict[str, Any]:
        self.call(self.ops.dlq_delete(job_id))
        return {"deleted": job_id}

    def _dlq_bulk(self, req: Request, retry: bool) -> dict[str, Any]:
        body = req.json_body()
        filters = {k: body.get(k) for k in ("kind", "queue", "tag")}
        for k, v in filters.items():
            if v is not None and not isinstance(v, str):
                raise HttpError(400, f"'{k}' must be a string")
        if not any(filters.values()) and body.get("all") is not True:
            raise HttpError(400, "pass a filter (kind, queue, tag) or \"all\": true")
        if not retry:
            return {"purged": self.call(self.ops.dlq_purge(filters["kind"], filters["queue"], filters["tag"]))}
        ids = self.call(self.ops.dlq_ids(filters["kind"], filters["queue"], filters["tag"]))
        retried = 0
        for job_id in ids:
            try:
                self.call(self.ops.dlq_retry(job_id))
                retried += 1
            except NotFound:
                pass
        return {"retried": retried}

    def _callback_route(self, action: str) -> Handler:
        def handle(req: Request, m: "re.Match[str]") -> Any:
            callback_id = urllib.parse.unquote(m.group("id"))
            secret = self.config.callback_secret
            if secret is not None:
                given = req.headers.get(SIGNATURE_HEADER) or ""
                if not callback_contract.verify(secret, callback_id, given.strip()):
                    raise HttpError(401, f"missing or wrong {SIGNATURE_HEADER}")
            return self.call(self.ops.callback(action, callback_id, req.json_body()))
        return handle

    # ----- dispatch ---------------------------------------------------------------------

    def authorized(self, headers: Any) -> bool:
        token = self.config.auth_token
        if token is None:
            return True
        given = headers.get("Authorization") or ""
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def handle(self, req: Request) -> tuple[int, Any]:
        """(status, JSON value) for an /api request."""
        allowed: list[str] = []
        for method, pattern, fn, mutation in self.routes:
            m = pattern.match(req.path)
            if m is None:
                continue
            if method != req.method:
                allowed.append(method)
                continue
            if mutation:
                self._check_mutation(req)
            return 200, fn(req, m)
        if allowed:
            raise HttpError(405, f"{req.method} is not allowed here (use {', '.join(sorted(set(allowed)))})")
        raise HttpError(404, f"no such route: {req.path}")

    def _check_mutation(self, req: Request) -> None:
        content_type = (req.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        has_token = self.config.auth_token is not None and "Authorization" in req.headers
        if content_type != "application/json" and not has_token:
            raise HttpError(415, "a mutation needs a JSON body (Content-Type: application/json) or the token header")
        if self.read_only():
            raise HttpError(503, "read-only mode: mutations are disabled")


def _query_value(req: Request, key: str) -> Optional[str]:
    value = req.query.get(key)
    return value if value else None


def _name(m: "re.Match[str]") -> str:
    return urllib.parse.unquote(m.group("name"))


def _version() -> str:
    from . import __version__
    return __version__


def _is_read_only_error(exc: BaseException) -> bool:
    return isinstance(exc, _awa.DatabaseError) and exc.sqlstate == READ_ONLY_SQLSTATE


def error_status(exc: BaseException) -> int:
    if isinstance(exc, HttpError):
        return exc.status
    if isinstance(exc, (NotFound, _awa.JobNotFound, _awa.CallbackNotFound)):
        return 404
    if isinstance(exc, (BadRequest, _awa.ValidationError)):
        return 400
    if _is_read_only_error(exc) or isinstance(exc, _awa.SchemaNotMigrated):
        return 503
    if isinstance(exc, _awa.DatabaseError):
        return 500
    if isinstance(exc, _awa.AwaError):
        return 409  # the engine refused the action in the job's current state
    return 500


def _asset(name: str) -> bytes:
    return importlib.resources.files("awa").joinpath("_ui").joinpath(name).read_bytes()


ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/assets/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/assets/app.css": ("app.css", "text/css; charset=utf-8"),
}
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
}


def make_handler(app: App) -> type[http.server.BaseHTTPRequestHandler]:
    class RequestHandler(http.server.BaseHTTPRequestHandler):
        server_version = "awa"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # quiet: an access log is the reverse proxy's job

        def _send(self, status: int, body: bytes, content_type: str, extra: Optional[dict[str, str]] = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in {**SECURITY_HEADERS, **(extra or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, value: Any, extra: Optional[dict[str, str]] = None) -> None:
            self._send(status, json.dumps(value).encode(), "application/json", extra)

        def _error(self, status: int, message: str) -> None:
            extra = {"WWW-Authenticate": 'Bearer realm="awa"'} if status == 401 else None
            self._json(status, {"error": " ".join(message.split()), "status": status}, extra)

        def _discard(self, n: int) -> None:
            """Read and drop ``n`` bytes of a refused body, so a client that sends the whole
            body before reading (most do) gets the 413 instead of a broken pipe; past
            ``DRAIN_LIMIT`` the connection is just closed."""
            self.connection.settimeout(10)
            try:
                while n > 0:
                    chunk = self.rfile.read(min(n, 1 << 16))
                    if not chunk:
                        return
                    n -= len(chunk)
            except OSError:
                return

        def _host_ok(self) -> bool:
            if app.config.host not in LOOPBACK_HOSTS:
                return True
            host = (self.headers.get("Host") or "").strip().lower()
            if host.startswith("["):
                name = host[1:host.find("]")] if "]" in host else host
            else:
                name = host.rsplit(":", 1)[0] if ":" in host else host
            return name in LOOPBACK_HOSTS

        def _dispatch(self) -> None:
            try:
                self._route()
            except Exception as exc:  # one JSON error, never a traceback to the client
                status = error_status(exc)
                try:
                    self._error(status, str(exc) if status != 500 or isinstance(exc, _awa.AwaError)
                                else f"internal error: {type(exc).__name__}")
                except OSError:
                    pass

        def _route(self) -> None:
            if not self._host_ok():
                raise HttpError(421, "this server only answers requests for localhost")
            parts = urllib.parse.urlsplit(self.path)
            path = parts.path
            length_text = self.headers.get("Content-Length") or "0"
            try:
                length = int(length_text)
            except ValueError:
                raise HttpError(400, "bad Content-Length") from None
            if length < 0 or length > MAX_BODY:
                self.close_connection = True
                self._discard(min(length, DRAIN_LIMIT))
                raise HttpError(413, f"the body may have at most {MAX_BODY} bytes")
            body = self.rfile.read(length) if length else b""
            if path == "/healthz":
                self._json(200, {"status": "ok"})
                return
            if path == "/readyz":
                self._ready()
                return
            if not app.config.callbacks_only and self.command in ("GET", "HEAD") and path in ASSETS:
                name, content_type = ASSETS[path]
                self._send(200, _asset(name), content_type)
                return
            if not app.authorized(self.headers):
                raise HttpError(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
            if path == "/metrics" and not app.config.callbacks_only:
                if self.command != "GET":
                    raise HttpError(405, "use GET")
                text = render_metrics(app.call(app.ops.queue_gauges()), json.loads(app.native.metrics()))
                self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
                return
            if not path.startswith("/api/"):
                raise HttpError(404, f"not found: {path}")
            query = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()}
            status, value = app.handle(Request(self.command, path, query, self.headers, body))
            self._json(status, value)

        def _ready(self) -> None:
            try:
                version = app.call(app.ops.schema_version(), )
            except Exception as exc:
                self._json(503, {"ready": False, "reason": f"database unreachable: {' '.join(str(exc).split())}"})
                return
            if version < _awa.SCHEMA_VERSION:
                self._json(503, {"ready": False, "reason": f"schema at version {version}, "
                                 f"this library needs {_awa.SCHEMA_VERSION} (run awa migrate)"})
                return
            self._json(200, {"ready": True, "schema_version": version})

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = _dispatch

    return RequestHandler


class _HTTPServer6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


class Server:
    """A running server (started by :func:`serve`, or by tests in a thread)."""

    def __init__(self, config: ServeConfig) -> None:
        self.app = App(config)
        server_class = _HTTPServer6 if ":" in config.host else http.server.ThreadingHTTPServer
        try:
            self.httpd = server_class((config.host, config.port), make_handler(self.app))
        except BaseException:
            self.app.close()
            raise
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        host_text = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{host_text}]" if ":" in host_text else host_text
        return f"http://{shown}:{port}"

    def close(self) -> None:
        self.httpd.server_close()
        self.app.close()


def serve(config: ServeConfig) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM); prints the URL once listening."""
    try:
        server = Server(config)
    except OSError as exc:
        raise _awa.AwaError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    what = "callback receiver" if config.callbacks_only else "awa serve"
    mode = " (read-only)" if config.read_only else ""
    sys.stdout.write(f"{what}: listening on {server.url}{mode}\n")
    sys.stdout.flush()

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.httpd.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0
