"""Prometheus text exposition (format 0.0.4) of Awa's gauges and counters.

Two sources: the database (per-queue depth by state, lag of the oldest due available job,
pause flag and DLQ depth: the same for every process that asks) and this process's engine
counters (``awa._awa.NativeClient.metrics()``: claims, finalizations, finalize retries and
stale finalizations, staged follow-ups inserted / skipped as duplicates / discarded). In
``awa serve`` the engine counters stay at zero unless jobs run in that process: a worker's
own counters are served by :func:`awa.serve_metrics` in the worker process.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

__all__ = ["render_metrics", "render_counters", "serve_metrics", "MetricsServer"]

#: Engine counter -> (metric name, help). The names follow Prometheus conventions
#: (``_total`` for counters); docs/operating.md lists them with awa-pg's OTLP names.
COUNTERS = {
    "JOBS_CLAIMED": ("awa_jobs_claimed_total", "Jobs claimed by this process's dispatchers."),
    "JOBS_CLAIMED_AHEAD": ("awa_jobs_claimed_ahead_total", "Claimed jobs that waited in a dispatcher buffer."),
    "JOBS_RELEASED": ("awa_jobs_released_total", "Claimed-ahead jobs given back unstarted."),
    "JOBS_COMPLETED_BATCHED": ("awa_jobs_completed_batched_total", "Completions applied on the batched path."),
    "JOBS_FINALIZED_PER_JOB": ("awa_jobs_finalized_per_job_total", "Finalizations committed on the per-job path."),
    "FINALIZE_STALE": ("awa_finalize_stale_total", "Finalizations whose lease guard matched no row (stale)."),
    "FINALIZE_RETRIES": ("awa_finalize_retries_total", "Finalizations retried after a transient error."),
    "FINALIZE_GAVE_UP": ("awa_finalize_gave_up_total", "Finalizations abandoned after the last retry."),
    "FOLLOW_UPS_INSERTED": ("awa_follow_ups_inserted_total", "Follow-up jobs inserted."),
    "FOLLOW_UPS_SKIPPED_DUPLICATE": ("awa_follow_ups_skipped_duplicate_total",
                                     "Follow-ups skipped because their unique key was held (deduplicated)."),
    "STAGED_DISCARDED_WAIT_FOR_CALLBACK": ("awa_staged_discarded_wait_for_callback_total",
                                           "Staged follow-ups discarded because the handler returned WaitForCallback."),
    "STAGED_DISCARDED": ("awa_staged_discarded_total",
                         "Staged follow-ups discarded on an outcome other than a committed completion."),
    "ATTEMPTS_POISONED": ("awa_attempts_poisoned_total", "Attempts failed terminally after a failed stage."),
    "JOBS_RESCUED": ("awa_jobs_rescued_total", "Running jobs rescued (stale heartbeat or passed deadline)."),
    "JOBS_ABANDONED": ("awa_jobs_abandoned_total", "Handlers abandoned locally (deadline or shutdown)."),
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, kind: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        number = repr(float(value)) if isinstance(value, float) else str(int(value))
        lines.append(f"{name}{{{label_text}}} {number}" if label_text else f"{name} {number}")
    return lines


def render_counters(counters: Mapping[str, int]) -> list[str]:
    lines: list[str] = []
    for key, (name, help_text) in COUNTERS.items():
        lines += _family(name, "counter", help_text, [({}, counters.get(key, 0))])
    return lines


def render_metrics(queues: list[dict[str, Any]], counters: Mapping[str, int]) -> str:
    """The whole exposition: database gauges per queue, then the engine counters."""
    lines: list[str] = []
    lines += _family("awa_queue_depth", "gauge", "Jobs in a queue by state.",
                     [({"queue": q["queue"], "state": s}, n) for q in queues for s, n in q["counts"].items()])
    lines += _family("awa_queue_lag_seconds", "gauge", "Age of the oldest due available job of a queue.",
                     [({"queue": q["queue"]}, float(q["lag_seconds"])) for q in queues])
    lines += _family("awa_queue_paused", "gauge", "1 when the queue is paused.",
                     [({"queue": q["queue"]}, 1 if q["paused"] else 0) for q in queues])
    lines += _family("awa_dlq_depth", "gauge", "Rows in the dead-letter queue by queue.",
                     [({"queue": q["queue"]}, q["dlq_depth"]) for q in queues])
    lines += render_counters(counters)
    return "\n".join(lines) + "\n"


class MetricsServer:
    """A worker process's ``GET /metrics`` (this process's engine counters), on a daemon
    thread; from :func:`serve_metrics`. ``url`` is where it listens; ``close()`` stops it."""

    def __init__(self, native: Any, host: str, port: int) -> None:
        import http.server
        import threading

        def body() -> bytes:
            return render_text(json.loads(native.metrics())).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802 - the base class's naming
                status, data, ctype = (200, body(), "text/plain; version=0.0.4; charset=utf-8") \
                    if self.path.split("?")[0] == "/metrics" else (404, b"not found\n", "text/plain")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="awa-metrics", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def render_text(counters: Mapping[str, int]) -> str:
    return "\n".join(render_counters(counters)) + "\n"


def serve_metrics(client: Any, port: int = 9464, host: str = "127.0.0.1") -> MetricsServer:
    """Serve this process's engine counters as Prometheus text on ``http://host:port/metrics``
    (a worker's scrape target; ``awa serve`` covers the database-wide gauges). ``client`` is an
    ``awa.AsyncClient`` or ``awa.Client``. Binds to 127.0.0.1 unless told otherwise."""
    native = getattr(client, "_native", None) or getattr(getattr(client, "_async", None), "_native", None)
    if native is None:
        raise TypeError("serve_metrics() needs an awa.AsyncClient or awa.Client")
    return MetricsServer(native, host, port)
