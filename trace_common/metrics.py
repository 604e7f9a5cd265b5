"""Prometheus metrics every service exports, and the /metrics endpoint.

Each service owns one `CollectorRegistry` (its `services/<name>/metrics.py` builds a
`ServiceMetrics` and adds its domain metrics to it), so five services embedded in one
process still expose five separate /metrics endpoints. Names follow
`trace_<service>_<noun>_<unit>`: counters end in `_total`, durations are `_seconds`
histograms, and label values are bounded (method names, status codes, job kinds, states).
"""

from __future__ import annotations

import platform
import threading
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from trace_common import __version__

# `_created` series double the exposition size and no dashboard uses them.
disable_created_metrics()

#: RPC latency buckets: sub-millisecond health checks up to minute-long unary calls.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class ServiceMetrics:
    """The metrics common to every service, registered in the service's own registry."""

    service: str
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        s, r = self.service, self.registry
        self.build_info = Gauge("trace_build_info", "Build of the running TRACE service (value 1).",
                                ["service", "version", "python"], registry=r)
        self.build_info.labels(s, __version__, platform.python_version()).set(1)
        self.rpc_requests = Counter(f"trace_{s}_rpc_requests", "RPCs handled, by method and status code.",
                                    ["method", "code"], registry=r)
        self.rpc_duration = Histogram(f"trace_{s}_rpc_duration_seconds", "RPC handling time by method.",
                                      ["method"], buckets=RPC_BUCKETS, registry=r)
        self.jobs = Counter(f"trace_{s}_jobs", "Jobs that reached a state, by kind and state.",
                            ["kind", "state"], registry=r)
        self.jobs_active = Gauge(f"trace_{s}_jobs_active", "Jobs pending or running now, by kind.",
                                 ["kind"], registry=r)
        self.artifact_operations = Counter(f"trace_{s}_artifact_operations",
                                           "Artifact store operations by op, backend and outcome.",
                                           ["op", "backend", "outcome"], registry=r)
        self.artifact_bytes = Counter(f"trace_{s}_artifact_bytes", "Bytes moved through the artifact store.",
                                      ["op", "backend"], registry=r)
        self.artifact_duration = Histogram(f"trace_{s}_artifact_operation_duration_seconds",
                                           "Artifact store operation time.", ["op", "backend"],
                                           buckets=RPC_BUCKETS, registry=r)

    def artifact_observer(self, op: str, backend: str, outcome: str, nbytes: int, seconds: float) -> None:
        """Plug into `open_store(observer=...)`."""
        self.artifact_operations.labels(op, backend, outcome).inc()
        if nbytes:
            self.artifact_bytes.labels(op, backend).inc(nbytes)
        self.artifact_duration.labels(op, backend).observe(seconds)


class MetricsServer:
    """A /metrics HTTP endpoint for one registry, on its own daemon thread."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        self._server: WSGIServer
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.host = host
        self.port = self._server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if isinstance(self._thread, threading.Thread):
            self._thread.join(timeout=5)
