"""Prometheus metrics every service exports, and the /metrics endpoint.

Each service owns one `CollectorRegistry` (its `services/<name>/metrics.py` builds a
`ServiceMetrics` and adds its domain metrics to it), so five services embedded in one
process still expose five separate /metrics endpoints. Names follow
`trace_<service>_<noun>_<unit>`: counters end in `_total`, durations are `_seconds`
histograms, and label values are bounded (method names, status codes, job kinds, states).

`MetricsServer` serves one registry on its own port. With the service's token it answers only a
request carrying `authorization: Bearer <token>` (401 otherwise, the rule of `trace_common.grpc.auth`),
and with the service's TLS pair it speaks HTTPS, so a scrape never sends the token in the clear where
the gRPC calls would not.
"""

from __future__ import annotations

import logging
import platform
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)

from trace_common import __version__
from trace_common.grpc.auth import BearerToken

log = logging.getLogger(__name__)

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


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a failed TLS handshake, a plain-HTTP scrape of the HTTPS port or a client that times out:
        # one debug line, not socketserver's traceback on stderr at every scrape
        log.debug("metrics: connection from %s failed", client_address, exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # seconds a connection may sit without sending its request (or finishing TLS)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base's signature
        pass  # one line per scrape on stderr is noise


def _bearer_only(app: Callable, token: BearerToken) -> Callable:
    """`app` behind the bearer token: a request without it gets 401 and the reason, nothing else."""

    def guarded(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        refusal = token.refusal(environ.get("HTTP_AUTHORIZATION"))
        if refusal is None:
            return app(environ, start_response)
        body = f"401 Unauthorized: {refusal}\n".encode()
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", 'Bearer realm="metrics"'),
                                            ("Content-Length", str(len(body)))])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]  # HEAD: the headers only

    return guarded


class MetricsServer:
    """A /metrics HTTP endpoint for one registry, on its own daemon thread: behind `token` when given
    (a bearer token, as the service's gRPC calls), over HTTPS when `tls` (certificate chain, key) is.

    prometheus_client's `start_http_server` takes neither a token nor a wrapped app, so the server is
    put together here from the same parts (its WSGI app, a threading wsgiref server)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, token: str | None = None,
                 tls: tuple[Path, Path] | None = None):
        app = make_wsgi_app(registry)
        if token is not None:
            app = _bearer_only(app, BearerToken(token))
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsHTTPServer", (_ThreadingServer,), {"address_family": family})
        self._server: WSGIServer = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            # the handshake happens in the request's own thread, so a client that never finishes it
            # holds that thread (until the handler's timeout), not the accept loop
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True,
                                                      do_handshake_on_connect=False)
            self.scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self.host = host
        self.port = self._server.server_port
        self.authenticated = token is not None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
