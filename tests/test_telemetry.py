"""``awa.init_telemetry`` / ``shutdown_telemetry``: OpenTelemetry metrics over OTLP/gRPC with
awa-pg's instrument names, received by a real gRPC collector (grpcio serving the OTLP
``MetricsService`` from ``opentelemetry-proto``), and the per-kind/queue series behind both it
and ``/metrics``."""

from __future__ import annotations

import json
import socket
import threading
from concurrent import futures
from typing import Any, Iterator

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

import awa
from helpers import FAST, wait_for, wait_for_state


class Collector(metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP metrics receiver on a free loopback port that keeps every request."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the generated name
        with self.lock:
            self.requests.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def points(self, name: str, kind: str) -> list[Any]:
        """Every data point of metric ``name`` for ``awa.job.kind == kind``, oldest first."""
        out = []
        with self.lock:
            for req in self.requests:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            if m.name != name:
                                continue
                            data = m.sum if m.HasField("sum") else m.histogram
                            for p in data.data_points:
                                attrs = {a.key: a.value.string_value for a in p.attributes}
                                if attrs.get("awa.job.kind") == kind:
                                    out.append((attrs, p))
        return out

    def service_names(self) -> set[str]:
        with self.lock:
            return {a.value.string_value for req in self.requests for rm in req.resource_metrics
                    for a in rm.resource.attributes if a.key == "service.name"}


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    try:
        yield c
    finally:
        awa.shutdown_telemetry()
        c.server.stop(None)


def series_count(kind: str, event: str) -> int:
    data = json.loads(awa._awa.metric_series())
    return sum(dict(s["events"])[event] for s in data["series"] if s["kind"] == kind)


async def test_jobs_are_exported_with_awa_pg_names_to_a_grpc_collector(
        collector: Collector, client: awa.AsyncClient) -> None:
    assert awa.init_telemetry(f"http://127.0.0.1:{collector.port}", "awa-telemetry-test",
                              export_interval_ms=100) is True

    @client.task(dict, kind="otlp_ok", queue="otlp")
    async def ok(job: awa.Job) -> None:
        return None

    @client.task(dict, kind="otlp_fail", queue="otlp")
    async def fail(job: awa.Job) -> None:
        raise awa.TerminalError("no")

    done = [await client.insert({"n": i}, kind="otlp_ok", queue="otlp") for i in range(3)]
    bad = await client.insert({}, kind="otlp_fail", queue="otlp")
    await client.start([("otlp", 2)], **FAST)
    try:
        for job in done:
            await wait_for_state(client, job.id, "completed")
        await wait_for_state(client, bad.id, "failed")
        # Counted (and handed to the exporter first) just after the commit the test saw.
        await wait_for(lambda: series_count("otlp_ok", "completed") >= 3, what="completions counted")
        await wait_for(lambda: series_count("otlp_fail", "failed") >= 1, what="failure counted")
    finally:
        await client.shutdown()
    awa.shutdown_telemetry()  # exports what is pending, then stops

    assert "awa-telemetry-test" in collector.service_names()
    completed = collector.points("awa.job.completed", "otlp_ok")
    assert completed, "no awa.job.completed point for otlp_ok"
    attrs, last = completed[-1]
    assert attrs == {"awa.job.kind": "otlp_ok", "awa.job.queue": "otlp"}
    assert last.as_int == 3  # cumulative, as awa-pg exports
    assert collector.points("awa.job.inserted", "otlp_ok")[-1][1].as_int == 3
    assert collector.points("awa.job.claimed", "otlp_ok")[-1][1].as_int == 3
    assert collector.points("awa.job.failed", "otlp_fail")[-1][1].as_int == 1
    _, duration = collector.points("awa.job.duration", "otlp_ok")[-1]
    assert duration.count == 3 and sum(duration.bucket_counts) == 3
    assert list(duration.explicit_bounds)[:2] == [0.001, 0.0025]
    _, wait = collector.points("awa.job.wait_duration", "otlp_ok")[-1]
    assert wait.count == 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_an_unreachable_collector_is_not_an_error() -> None:
    # Like awa-pg: set-up succeeds, exports are retried each interval; stopping returns.
    assert awa.init_telemetry(f"http://127.0.0.1:{free_port()}", "nobody-listens", 50) is True
    awa.shutdown_telemetry()
    awa.shutdown_telemetry()  # twice, or never started: a no-op


@pytest.mark.parametrize("endpoint, service, interval, error", [
    ("localhost:4317", "svc", 5000, awa.ValidationError),
    ("", "svc", 5000, awa.ValidationError),
    ("http://127.0.0.1:4317", "", 5000, awa.ValidationError),
    ("http://127.0.0.1:4317", "  ", 5000, awa.ValidationError),
    ("http://127.0.0.1:4317", "svc", 0, awa.ValidationError),
    ("http://127.0.0.1:4317", "svc", -1, awa.ValidationError),
    ("http://127.0.0.1:4317", "svc", 86_400_001, awa.ValidationError),
    ("http://127.0.0.1:4317", "svc", "5000", TypeError),
    ("http://127.0.0.1:4317", "svc", 5.5, TypeError),
    (4317, "svc", 5000, TypeError),
])
def test_bad_settings_are_refused(endpoint: Any, service: Any, interval: Any, error: type) -> None:
    with pytest.raises(error):
        awa.init_telemetry(endpoint, service, interval)
    # A refused call starts nothing (and a ValidationError is also a ValueError, as awa-pg's).
    assert issubclass(awa.ValidationError, ValueError)
