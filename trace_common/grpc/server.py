"""Server bootstrap shared by the five services.

`TraceServer` owns one grpc.aio server with: the service's own servicer(s), grpc.health.v1,
reflection, interceptors (metrics -> auth -> streaming-call cap -> error mapping), max message sizes,
a cap on calls in progress (`max_concurrent_rpcs`: past it grpc refuses a call with RESOURCE_EXHAUSTED)
of which streams may take all but a few (`stream_cap`: the health Check and unary calls keep room
however many Watch streams are open), optional TLS, and a Prometheus /metrics endpoint on its own port
(behind the same token unless `metrics_auth` is false, over HTTPS with the same TLS pair).
Only the health Check answers without the token (Kubernetes probes); health Watch and reflection need
it. `run_forever` adds graceful stop on SIGTERM/SIGINT: health flips to NOT_SERVING, new calls are
refused, in-flight calls get `grace_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from trace_common.config import ServiceSettings, token_env
from trace_common.grpc.interceptors import (
    AuthInterceptor,
    ErrorMappingInterceptor,
    MetricsInterceptor,
    StreamLimitInterceptor,
    stream_cap,
)
from trace_common.metrics import MetricsServer, ServiceMetrics

log = logging.getLogger(__name__)


@dataclass
class ServiceDefinition:
    """What a service contributes to a TraceServer. Built by `services/<name>/app.py`."""

    name: str
    #: Fully qualified gRPC service names, e.g. ["trace.v1.RolloutService"].
    full_names: list[str]
    metrics: ServiceMetrics
    #: Adds the servicer(s) to the server.
    add_to_server: Callable[[aio.Server], None]
    #: Optional async hooks, e.g. starting the inference HTTP API or draining jobs.
    on_start: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    #: The service's domain object (tests and the embedded orchestrator reach it in-process).
    domain: object = None
    #: An HTTP front served beside gRPC (the inference service's OpenAI-compatible API), with a
    #: `url` once started; its start/stop are among the hooks above.
    http: object = None

    @property
    def http_url(self) -> str | None:
        return getattr(self.http, "url", None) if self.http is not None else None


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


class TraceServer:
    """One service's gRPC server + health + reflection + metrics endpoint.

    A server without an auth token logs a warning when it starts (`warn_without_auth=False`
    leaves that to the caller: the embedded stack says it once for all five)."""

    def __init__(self, settings: ServiceSettings, definition: ServiceDefinition, *, warn_without_auth: bool = True):
        self.settings = settings
        self.definition = definition
        self.warn_without_auth = warn_without_auth
        self.port: int | None = None
        self.metrics_server: MetricsServer | None = None
        self.health: health.aio.HealthServicer | None = None
        self.stream_limit: StreamLimitInterceptor | None = None
        self._server: aio.Server | None = None
        #: The step `start` is at, or stopped at when it failed ("metrics", "hooks", "grpc"); "" when serving.
        self.starting = ""

    def _build(self) -> aio.Server:
        """grpc.aio objects bind to the running event loop, so they are built in `start`."""
        settings, definition = self.settings, self.definition
        self.health = health.aio.HealthServicer()
        interceptors: list[aio.ServerInterceptor] = [MetricsInterceptor(definition.metrics)]
        if self.auth:  # ServiceSettings refuses a blank token, so a token here is a real one
            interceptors.append(AuthInterceptor(settings.auth_token.get_secret_value()))
        # after auth: a caller without the token is refused before it can hold a streaming slot
        setting = f"TRACE_{(settings.service_name or definition.name).upper()}_MAX_CONCURRENT_RPCS"
        self.stream_limit = StreamLimitInterceptor(stream_cap(settings.max_concurrent_rpcs),
                                                   settings.max_concurrent_rpcs, setting)
        interceptors += [self.stream_limit, ErrorMappingInterceptor()]
        server = aio.server(interceptors=interceptors, options=server_options(settings.max_message_bytes),
                            maximum_concurrent_rpcs=settings.max_concurrent_rpcs)
        definition.add_to_server(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [*definition.full_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        return server

    @property
    def auth(self) -> bool:
        """Whether calls need the bearer token (gRPC, and the HTTP front where there is one)."""
        return self.settings.auth_token is not None

    @property
    def target(self) -> str:
        return f"{self.settings.host}:{self.port}"

    def _bind(self) -> int:
        address = f"{self.settings.host}:{self.settings.port}"
        s = self.settings
        if s.tls_pair is not None:
            cert, key = s.tls_pair
            creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
            port = self._server.add_secure_port(address, creds)
        else:
            port = self._server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"could not bind gRPC port {address}; is it in use?")
        return port

    async def start(self) -> None:
        """/metrics, then the start hooks (the inference HTTP API), then the gRPC port, bound last: grpc
        holds a bound server's listener until the process exits unless that server is started (stop
        without start does not release it), so binding is followed by nothing but starting. `starting`
        names the step under way ("metrics", "hooks", "grpc"; "" once serving). A start that fails stops
        what it had started, the stop hooks included."""
        self._server = self._build()
        s = self.settings
        try:
            self.starting = "metrics"
            token = s.auth_token.get_secret_value() if s.auth_token is not None and s.metrics_auth else None
            self.metrics_server = MetricsServer(self.definition.metrics.registry, s.metrics_host, s.metrics_port,
                                                token=token, tls=s.tls_pair)
            self.starting = "hooks"
            for hook in self.definition.on_start:
                await hook()
            self.starting = "grpc"
            self.port = self._bind()
            await self._server.start()
        except BaseException:
            self._server = None   # stop() has nothing left to do
            await self._stopped_after_failed_start()
            raise
        self.starting = ""
        for name in ("", *self.definition.full_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s serving gRPC on %s, metrics on %s", self.definition.name, self.target,
                 self.metrics_server.url)
        if self.auth and not self.metrics_server.authenticated:
            log.warning("%s serves /metrics WITHOUT AUTH (%s=false): anyone who can reach %s may read it",
                        self.definition.name, f"TRACE_{self.definition.name.upper()}_METRICS_AUTH",
                        self.metrics_server.url)
        if not self.auth and self.warn_without_auth:
            where = f" and {self.definition.http_url}" if self.definition.http_url else ""
            log.warning("%s runs WITHOUT AUTH: no token set (%s), so anyone who can reach %s%s may call every "
                        "method", self.definition.name, token_env(self.definition.name), self.target, where)

    async def _stopped_after_failed_start(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.stop()
        await self._run_stop_hooks()   # the hooks tolerate a start hook that never ran

    async def _run_stop_hooks(self) -> None:
        for hook in self.definition.on_stop:
            try:
                await hook()
            except Exception:  # noqa: BLE001 -- stopping must finish
                log.exception("%s: stop hook failed", self.definition.name)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop: NOT_SERVING first, then refuse new calls, then wait for in-flight ones."""
        if self._server is None:
            return
        await self.health.enter_graceful_shutdown()
        grace = self.settings.grace_seconds if grace is None else grace
        await self._server.stop(grace)
        await self._run_stop_hooks()
        if self.metrics_server is not None:
            self.metrics_server.stop()

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


async def run_forever(servers: list[TraceServer], on_ready: Callable[[], None] | None = None) -> None:
    """Start `servers`, then block until SIGTERM/SIGINT and stop them gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started: list[TraceServer] = []
    try:
        for s in servers:
            await s.start()
            started.append(s)
        if on_ready is not None:
            on_ready()
        await stop.wait()
        log.info("signal received: stopping gracefully")
    finally:
        await asyncio.gather(*(s.stop() for s in started), return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
