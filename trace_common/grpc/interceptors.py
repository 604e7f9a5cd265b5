"""Server interceptors: metrics (outermost), bearer-token auth, domain errors -> status codes.

Order matters and is fixed in `server.py`: metrics sees every call with its final code; auth
rejects before any handler runs; error mapping sits closest to the handler so that every
`trace_common.errors.TraceError` becomes its documented status with the reason as details,
pydantic validation errors become INVALID_ARGUMENT, and anything unexpected becomes INTERNAL
with an incident id (the traceback goes to the log, never to the client).
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc
from grpc import aio
from pydantic import ValidationError

from trace_common.errors import TraceError
from trace_common.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: Methods reachable without a token: Kubernetes probes and grpcurl discovery.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _method_name(full: str) -> str:
    return full.rsplit("/", 1)[-1] if full else "unknown"


def _rewrap(handler: grpc.RpcMethodHandler, wrap_unary: Callable, wrap_stream: Callable) -> grpc.RpcMethodHandler:
    """A copy of `handler` whose behaviour is wrapped (unary-response vs streaming-response)."""
    kw = dict(request_deserializer=handler.request_deserializer,
              response_serializer=handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(wrap_unary(handler.unary_unary), **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(wrap_stream(handler.unary_stream), **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(wrap_unary(handler.stream_unary), **kw)
    return grpc.stream_stream_rpc_method_handler(wrap_stream(handler.stream_stream), **kw)


def _status_of(err: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(err, TraceError):
        return grpc.StatusCode[err.code], err.reason
    if isinstance(err, ValidationError):
        parts = []
        for e in err.errors()[:5]:
            loc = ".".join(str(p) for p in e["loc"]) or "request"
            parts.append(f"{loc}: {e['msg']}")
        return grpc.StatusCode.INVALID_ARGUMENT, "; ".join(parts)
    incident = uuid.uuid4().hex[:12]
    log.error("unhandled error (incident %s)", incident, exc_info=err)
    return grpc.StatusCode.INTERNAL, f"internal error (incident {incident}); the server log has details"


class ErrorMappingInterceptor(aio.ServerInterceptor):
    """The one place where domain exceptions become gRPC status codes."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler

        def wrap_unary(fn):
            async def run(request, context):
                try:
                    return await fn(request, context)
                except aio.AbortError:
                    raise
                except Exception as err:  # noqa: BLE001 -- mapped, never leaked
                    code, msg = _status_of(err)
                    await context.abort(code, msg)
            return run

        def wrap_stream(fn):
            async def run(request, context):
                try:
                    async for item in fn(request, context):
                        yield item
                except aio.AbortError:
                    raise
                except Exception as err:  # noqa: BLE001
                    code, msg = _status_of(err)
                    await context.abort(code, msg)
            return run

        return _rewrap(handler, wrap_unary, wrap_stream)


class AuthInterceptor(aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every call except health and reflection."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("AuthInterceptor needs a non-empty token")
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, details: grpc.HandlerCallDetails) -> tuple[bool, str]:
        if details.method.startswith(UNAUTHENTICATED_PREFIXES):
            return True, ""
        got = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else value
        if got is None:
            return False, "missing 'authorization: Bearer <token>' metadata; pass the service's auth token"
        if not hmac.compare_digest(got, self._expected):
            return False, "invalid bearer token; check the token the server was started with"
        return True, ""

    async def intercept_service(self, continuation, details):
        ok, why = self._allowed(details)
        handler = await continuation(details)
        if ok or handler is None:
            return handler

        def deny_unary(_fn):
            async def run(request, context):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
            return run

        def deny_stream(_fn):
            async def run(request, context):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
                yield  # pragma: no cover -- makes this an async generator
            return run

        return _rewrap(handler, deny_unary, deny_stream)


class MetricsInterceptor(aio.ServerInterceptor):
    """Counts every RPC by method and final status code, and times it."""

    def __init__(self, metrics: ServiceMetrics):
        self._m = metrics

    def _record(self, method: str, context, started: float, err: BaseException | None) -> None:
        code = context.code()
        if code is None:
            code = grpc.StatusCode.OK if err is None else grpc.StatusCode.UNKNOWN
            if isinstance(err, BaseException) and type(err).__name__ == "CancelledError":
                code = grpc.StatusCode.CANCELLED
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        self._m.rpc_requests.labels(method, name).inc()
        self._m.rpc_duration.labels(method).observe(time.perf_counter() - started)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return handler
        method = _method_name(details.method)
        record = self._record

        def wrap_unary(fn):
            async def run(request, context):
                started, err = time.perf_counter(), None
                try:
                    return await fn(request, context)
                except BaseException as e:
                    err = e
                    raise
                finally:
                    record(method, context, started, err)
            return run

        def wrap_stream(fn):
            async def run(request, context):
                started, err = time.perf_counter(), None
                try:
                    async for item in fn(request, context):
                        yield item
                except BaseException as e:
                    err = e
                    raise
                finally:
                    record(method, context, started, err)
            return run

        return _rewrap(handler, wrap_unary, wrap_stream)
