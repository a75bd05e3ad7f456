"""Prometheus text exposition (format 0.0.4) of Awa's gauges and counters, and the
OpenTelemetry export (:func:`init_telemetry`, awa-pg's names).

Three sources: the database (per-queue depth by state, lag of the oldest due available job,
pause flag and DLQ depth: the same for every process that asks), this process's engine
counters (``awa._awa.NativeClient.metrics()``: claims, finalizations, finalize retries and
stale finalizations, staged follow-ups inserted / skipped as duplicates / discarded), and this
process's job series per kind and queue (``awa._awa.metric_series()``: inserted, claimed,
completed, failed, retried, cancelled, snoozed, waiting_external, rescued, dlq_moved, and the
handler-duration and queue-wait histograms). In ``awa serve`` the process's own counters count
only what that process did (no jobs run there): a worker's are served by
:func:`awa.serve_metrics` in the worker process.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from . import _awa

__all__ = ["render_metrics", "render_counters", "render_series", "serve_metrics", "MetricsServer",
           "init_telemetry", "shutdown_telemetry"]

#: Histogram of the series -> (metric name, help).
HISTOGRAMS = {
    "duration": ("awa_job_duration_seconds", "Handler run time, from start to outcome, by kind and queue."),
    "wait": ("awa_job_wait_seconds", "Time from a job being due (run_at, or creation if later) to its claim."),
}

#: Engine counter -> (metric name, help). The names follow Prometheus conventions
#: (``_total`` for counters); docs/operating.md lists them with awa-pg's OTLP names. Claims and
#: rescues are not here: ``awa_jobs_claimed_total`` and ``awa_jobs_rescued_total`` are series
#: by kind and queue (:func:`render_series`), whose sum is the engine's counter.
COUNTERS = {
    "JOBS_CLAIMED_AHEAD": ("awa_jobs_claimed_ahead_total", "Claimed jobs that waited in a dispatcher buffer."),
    "JOBS_RELEASED": ("awa_jobs_released_total", "Claimed-ahead jobs given back unstarted."),
    "JOBS_COMPLETED_BATCHED": ("awa_jobs_completed_batched_total", "Completions applied on the batched path."),
    "CLAIM_STATEMENTS": ("awa_claim_statements_total", "Claim statements run (one commit each)."),
    "COMPLETION_BATCHES": ("awa_completion_batches_total", "Batched completions committed (one commit each)."),
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


def _number(v: float) -> str:
    return "+Inf" if v == float("inf") else repr(float(v))


def render_series(data: Mapping[str, Any]) -> list[str]:
    """Job counters (``awa_jobs_<event>_total{kind,queue}``) and the two histograms, from
    ``awa._awa.metric_series()``. Every family is declared even before any job ran."""
    series = list(data.get("series", []))
    bounds = [float(b) for b in data.get("buckets", [])]
    events = [name for name, _ in series[0]["events"]] if series else [
        "inserted", "claimed", "completed", "failed", "retried", "cancelled", "snoozed", "waiting_external",
        "rescued", "dlq_moved"]
    lines: list[str] = []
    for event in events:
        samples = [({"kind": s["kind"], "queue": s["queue"]}, dict(s["events"]).get(event, 0)) for s in series]
        lines += _family(f"awa_jobs_{event}_total", "counter", f"Jobs {event.replace('_', ' ')}, by kind and queue.",
                         samples)
    for key, (name, help_text) in HISTOGRAMS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for s in series:
            hist = dict(s["timings"]).get(key)
            if hist is None:
                continue
            labels = f'kind="{_label(s["kind"])}",queue="{_label(s["queue"])}"'
            cumulative = 0
            for le, n in zip(bounds + [float("inf")], hist["bucket_counts"], strict=True):
                cumulative += int(n)
                lines.append(f'{name}_bucket{{{labels},le="{_number(le)}"}} {cumulative}')
            lines.append(f"{name}_sum{{{labels}}} {_number(hist['sum_seconds'])}")
            lines.append(f"{name}_count{{{labels}}} {int(hist['count'])}")
    return lines


def _series() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_awa.metric_series())
    return data


def render_metrics(queues: list[dict[str, Any]], counters: Mapping[str, int],
                   series: Mapping[str, Any] | None = None) -> str:
    """The whole exposition: database gauges per queue, the engine counters, the job series."""
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
    lines += render_series(_series() if series is None else series)
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
    return "\n".join(render_counters(counters) + render_series(_series())) + "\n"


def init_telemetry(endpoint: str, service_name: str, export_interval_ms: int = 5000) -> bool:
    """Export this process's job metrics as OpenTelemetry metrics over OTLP/gRPC (awa-pg's
    call and instrument names): ``awa.job.inserted``, ``awa.job.claimed``, ``awa.job.completed``,
    ``awa.job.failed``, ``awa.job.retried``, ``awa.job.cancelled``, ``awa.job.snoozed``,
    ``awa.job.waiting_external``, ``awa.job.dlq_moved``, ``awa.maintenance.rescues`` (counters)
    and ``awa.job.duration``, ``awa.job.wait_duration`` (histograms, seconds), each attributed
    ``awa.job.kind`` and ``awa.job.queue``. ``endpoint`` is the collector's gRPC URL, e.g.
    ``"http://localhost:4317"``. Returns True once set up; a collector that is not up yet is
    retried every interval. A bad endpoint, empty service name or interval outside 1 ms to
    a day raises ``ValidationError``. Calling it again replaces the export."""
    if not isinstance(endpoint, str) or not isinstance(service_name, str):
        raise TypeError("init_telemetry() takes endpoint and service_name as str")
    if isinstance(export_interval_ms, bool) or not isinstance(export_interval_ms, int):
        raise TypeError(f"export_interval_ms must be an int, not {type(export_interval_ms).__name__}")
    return bool(_awa.init_telemetry(endpoint, service_name, export_interval_ms))


def shutdown_telemetry() -> None:
    """Export what is pending, then stop the export started by :func:`init_telemetry` (a
    no-op when none runs)."""
    _awa.shutdown_telemetry()


def serve_metrics(client: Any, port: int = 9464, host: str = "127.0.0.1") -> MetricsServer:
    """Serve this process's engine counters as Prometheus text on ``http://host:port/metrics``
    (a worker's scrape target; ``awa serve`` covers the database-wide gauges). ``client`` is an
    ``awa.AsyncClient`` or ``awa.Client``. Binds to 127.0.0.1 unless told otherwise."""
    native = getattr(client, "_native", None) or getattr(getattr(client, "_async", None), "_native", None)
    if native is None:
        raise TypeError("serve_metrics() needs an awa.AsyncClient or awa.Client")
    return MetricsServer(native, host, port)
