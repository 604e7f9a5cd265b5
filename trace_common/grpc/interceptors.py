"""Server interceptors: metrics (outermost), bearer-token auth, domain errors -> status codes.

Order matters and is fixed in `server.py`: metrics sees every call with its final code; auth
rejects before any handler runs; error mapping sits closest to the handler so that every
`trace_common.errors.TraceError` becomes its documented status with the reason as details,
pydantic validation errors become INVALID_ARGUMENT, and anything unexpected becomes INTERNAL
with an incident id (the traceback goes to the log, never to the client).

Every handler kind is wrapped the same way (`_rewrap`): unary or streaming requests, and a
streaming response produced either by an async generator (the TRACE servicers) or by a
coroutine that calls `context.write` itself (grpc.health.v1 `Watch`). The wrappers are plain
coroutines that drive a streaming response with `context.write`, so one wrapper fits both
styles and interceptors stack without caring which style the one below uses.

The error interceptor also owns two things every method needs and no servicer should repeat:
  * request bytes that do not decode as the method's message become INVALID_ARGUMENT with one
    short fixed message naming the method (its request deserializer is wrapped so that a
    decode failure reaches the handler wrapper as a marker instead of escaping to grpc as
    UNKNOWN with protobuf's internal text);
  * every status detail it sends is bounded (`bound_detail`): an unbroken run of more than
    MAX_ECHO_CHARS characters (an echoed id, a blob) is cut there, and the whole message is cut
    at MAX_DETAIL_CHARS, so an echoed 70 KB field never grows a status past gRPC's metadata limit.

It also hands memory back after a large refused request: a request of LARGE_REQUEST_BYTES or more
that ends in an error schedules, TRIM_DELAY_S after the call is done and at most once per
TRIM_INTERVAL_S, a collection of reference cycles (an exception re-raised inside an `except` block
keeps the request's copies alive in a cycle until the cyclic GC runs) and then `malloc_trim`
(trace_common/malloc.py), since glibc keeps freed pages otherwise. Measured with 40 concurrent refused
CreateRolloutJob calls of a 15 MiB `environment.uri`, three rounds: before, the rollout service went
from 73 MiB to 2 GiB RSS and stayed at 1.6 GiB; with this, it returns to ~100 MiB.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio
from pydantic import ValidationError

from trace_common.errors import InvalidArgument, TraceError
from trace_common.grpc.auth import BearerToken
from trace_common.malloc import DeferredRelease
from trace_common.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: Methods reachable without a token: Kubernetes probes and grpcurl discovery.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

#: Longest status detail sent (characters, the ellipsis included).
MAX_DETAIL_CHARS = 1000
#: Longest unbroken run of non-space characters kept in a detail (an echoed value), before "...".
MAX_ECHO_CHARS = 200
ELLIPSIS = "..."

#: A refused request at least this large (serialized bytes) schedules a heap trim.
LARGE_REQUEST_BYTES = 1 << 20
#: Seconds from the end of the refused call to the trim, and the least time between two trims
#: (malloc_trim walks the whole heap: a few ms per hundred MiB).
TRIM_DELAY_S, TRIM_INTERVAL_S = 0.2, 1.0

_LONG_RUN = re.compile(rf"\S{{{MAX_ECHO_CHARS + 1},}}")

_KINDS = {"unary_unary": grpc.unary_unary_rpc_method_handler,
          "unary_stream": grpc.unary_stream_rpc_method_handler,
          "stream_unary": grpc.stream_unary_rpc_method_handler,
          "stream_stream": grpc.stream_stream_rpc_method_handler}

#: (behaviour, request_streaming, response_streaming) -> wrapped behaviour
Wrap = Callable[[Callable, bool, bool], Callable]


def bound_detail(text: str) -> str:
    """`text` with every unbroken run longer than MAX_ECHO_CHARS cut to that length + "...", then
    the whole cut to MAX_DETAIL_CHARS (the ellipsis included).

    Semantics:
        for run in maximal runs of non-whitespace in text with len(run) > E: run = run[:E] + "..."
        if len(text) > D: text = text[:D - 3] + "..."
    """
    text = _LONG_RUN.sub(lambda m: m.group(0)[:MAX_ECHO_CHARS] + ELLIPSIS, text)
    if len(text) > MAX_DETAIL_CHARS:
        text = text[:MAX_DETAIL_CHARS - len(ELLIPSIS)] + ELLIPSIS
    return text


def _method_name(full: str) -> str:
    return full.rsplit("/", 1)[-1] if full else "unknown"


def _behaviour(handler: grpc.RpcMethodHandler) -> tuple[str, Callable]:
    for kind in _KINDS:
        fn = getattr(handler, kind)
        if fn is not None:
            return kind, fn
    raise TypeError(f"RPC method handler without a behaviour: {handler!r}")


def _rewrap(handler: grpc.RpcMethodHandler, wrap: Wrap,
            request_deserializer: Callable | None = None) -> grpc.RpcMethodHandler:
    """A copy of `handler` of the same kind whose behaviour is `wrap(behaviour, req_stream, resp_stream)`."""
    kind, fn = _behaviour(handler)
    request_streaming, response_streaming = kind.startswith("stream"), kind.endswith("stream")
    return _KINDS[kind](wrap(fn, request_streaming, response_streaming),
                        request_deserializer=request_deserializer or handler.request_deserializer,
                        response_serializer=handler.response_serializer)


async def _await_result(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


async def run_behaviour(fn: Callable, request: Any, context: Any, response_streaming: bool) -> Any:
    """Run one handler behaviour whatever its style and return its unary response (None when streaming).

    A streaming response is written here with `context.write` when `fn` returns an (async)
    iterator; a coroutine that writes for itself (health Watch) is awaited. An async generator is
    closed on the way out, so its `finally` runs when the call is cancelled between two items."""
    result = fn(request, context)
    if not response_streaming:
        return await _await_result(result)
    if hasattr(result, "__aiter__"):
        try:
            async for item in result:
                await context.write(item)
        finally:
            aclose = getattr(result, "aclose", None)
            if aclose is not None:
                await aclose()
    elif inspect.isawaitable(result):
        await result
    elif result is not None:  # a plain iterator of responses
        for item in result:
            await context.write(item)
    return None


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


class _Undecodable:
    """What a wrapped request deserializer returns for bytes that are not the method's message."""

    __slots__ = ()


UNDECODABLE = _Undecodable()


def _safe_deserializer(deserialize: Callable | None) -> Callable | None:
    if deserialize is None:
        return None

    def run(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception:  # noqa: BLE001 -- DecodeError and kin: answered as INVALID_ARGUMENT by the handler
            return UNDECODABLE
    return run


def _message_type(deserialize: Callable | None) -> str:
    cls = getattr(deserialize, "__self__", None)  # `Message.FromString` bound to its class
    descriptor = getattr(cls, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "") or "request"


def _undecodable_error(method: str, type_name: str) -> InvalidArgument:
    return InvalidArgument(f"{method}: the request bytes do not decode as a {type_name} message; "
                           "send that message serialized with protobuf")


async def _checked_stream(requests: AsyncIterator, method: str, type_name: str) -> AsyncIterator:
    async for item in requests:
        if item is UNDECODABLE:
            raise _undecodable_error(method, type_name)
        yield item


def _request_bytes(request: Any) -> int:
    size = getattr(request, "ByteSize", None)
    return size() if callable(size) else 0


class ErrorMappingInterceptor(aio.ServerInterceptor):
    """The one place where domain exceptions become gRPC status codes (with bounded details),
    and where undecodable request bytes become INVALID_ARGUMENT. A large request that ends in an
    error has its memory handed back to the OS (module docstring)."""

    def __init__(self) -> None:
        #: Collects cycles, then trims; one release for a burst (trace_common/malloc.py).
        self.trim = DeferredRelease(TRIM_DELAY_S, TRIM_INTERVAL_S, collect=True)

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.lstrip("/") or "unknown"
        type_name = _message_type(handler.request_deserializer)

        def wrap(fn, request_streaming: bool, response_streaming: bool):
            async def run(request, context):
                try:
                    if request_streaming:
                        request = _checked_stream(request, method, type_name)
                    elif request is UNDECODABLE:
                        raise _undecodable_error(method, type_name)
                    return await run_behaviour(fn, request, context, response_streaming)
                except aio.AbortError:
                    raise
                except Exception as err:  # noqa: BLE001 -- mapped, never leaked
                    code, msg = _status_of(err)
                # Aborting here, after the except block, and not inside it: an exception raised in the
                # block keeps `err` bound in this frame, a cycle (frame -> err -> traceback -> frame)
                # that holds the request and every copy the handler made of it until the cyclic GC runs
                # (40 refused 15 MiB requests kept 1 GiB of RSS).
                if not request_streaming and _request_bytes(request) >= LARGE_REQUEST_BYTES:
                    loop = asyncio.get_running_loop()
                    context.add_done_callback(lambda _call: self.trim.request(loop))
                await context.abort(code, bound_detail(msg))
            return run

        return _rewrap(handler, wrap, request_deserializer=_safe_deserializer(handler.request_deserializer))


class AuthInterceptor(aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every call except health and reflection."""

    def __init__(self, token: str):
        self._token = BearerToken(token)

    def _refusal(self, details: grpc.HandlerCallDetails) -> str | None:
        if details.method.startswith(UNAUTHENTICATED_PREFIXES):
            return None
        got = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                got = value
        return self._token.refusal(got)

    async def intercept_service(self, continuation, details):
        why = self._refusal(details)
        handler = await continuation(details)
        if why is None or handler is None:
            return handler

        def deny(_fn, _request_streaming: bool, _response_streaming: bool):
            async def run(request, context):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
            return run

        return _rewrap(handler, deny)


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

        def wrap(fn, _request_streaming: bool, response_streaming: bool):
            async def run(request, context):
                started, err = time.perf_counter(), None
                try:
                    return await run_behaviour(fn, request, context, response_streaming)
                except BaseException as e:
                    err = e
                    raise
                finally:
                    record(method, context, started, err)
            return run

        return _rewrap(handler, wrap)
