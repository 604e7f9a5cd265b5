"""Server interceptors: metrics (outermost), bearer-token auth, the streaming-call cap, domain
errors -> status codes.

Order matters and is fixed in `server.py`: metrics sees every call with its final code; auth
rejects before any handler runs (so a caller without the token never holds a streaming slot); the
streaming-call cap (`StreamLimitInterceptor`) keeps STREAM_HEADROOM of the server's
`max_concurrent_rpcs` free of streams, so however many Watch streams are open, the kubelet's health
Check and unary calls (which end by themselves) keep room; error mapping sits closest to the handler so that every
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

#: Methods reachable without a token: the health Check only (Kubernetes' native gRPC probes send no
#: metadata). Not health Watch nor reflection: both are streams a caller may hold open for ever, and
#: open streams count against the server's `max_concurrent_rpcs`, so leaving them open let anyone who
#: reaches the port fill it; they need the token like every other method (grpcurl: `-H
#: "authorization: Bearer $TOKEN"`). Exact method names, not prefixes.
UNAUTHENTICATED_METHODS = frozenset({"/grpc.health.v1.Health/Check"})

#: Slots of the server's `max_concurrent_rpcs` that streaming calls (a streaming request or response:
#: the Watch*Job streams, GenerateStream, health Watch, reflection) may not take, so that unary
#: calls -- the kubelet's startup, liveness and readiness Checks (one each in flight per pod) among
#: them -- keep room: a stream may stay open as long as its caller likes, a unary call ends by
#: itself. 8 covers the three probes plus a few unary calls at once, and costs a 256-call server 3%
#: of its streams. At most half of a small cap is kept (`stream_cap`), so a cap of 2 still serves
#: one stream.
STREAM_HEADROOM = 8

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


def stream_cap(max_concurrent_rpcs: int) -> int:
    """Streaming calls a server with `max_concurrent_rpcs` runs at once: that cap less STREAM_HEADROOM,
    the headroom being at most half of it (256 -> 248, 64 -> 56, 16 -> 8, 2 -> 1, 1 -> 1)."""
    return max_concurrent_rpcs - min(STREAM_HEADROOM, max_concurrent_rpcs // 2)


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
    """Requires `authorization: Bearer <token>` on every call except the health Check
    (UNAUTHENTICATED_METHODS)."""

    def __init__(self, token: str):
        self._token = BearerToken(token)

    def _refusal(self, details: grpc.HandlerCallDetails) -> str | None:
        if details.method in UNAUTHENTICATED_METHODS:
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


class StreamLimitInterceptor(aio.ServerInterceptor):
    """Refuses a streaming call (a streaming request or response) with RESOURCE_EXHAUSTED while
    `limit` of them are running on this server (`stream_cap` of its `max_concurrent_rpcs`), so that
    open streams never take the slots unary calls and the health Check need. Unary calls pass as they
    are (grpc's own `maximum_concurrent_rpcs` bounds them with everything else).

    The count lives on the event loop's thread (grpc.aio runs every handler there) and is checked and
    taken with no `await` in between; it is given back in a `finally` around the call, so on every way
    out: the stream's normal end, an error or abort, the client cancelling or its deadline (grpc cancels
    the handler's task) and the server stopping."""

    def __init__(self, limit: int, max_concurrent_rpcs: int, setting: str = "max_concurrent_rpcs"):
        self.limit = limit
        #: Streaming calls running now.
        self.active = 0
        self._refusal = (f"too many streaming calls in progress: this server runs at most {limit} at once "
                         f"(max_concurrent_rpcs {max_concurrent_rpcs}, less {max_concurrent_rpcs - limit} kept for "
                         f"unary calls and health checks); retry when one has ended, or raise {setting}")

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.unary_unary is not None:
            return handler

        def wrap(fn, _request_streaming: bool, response_streaming: bool):
            async def run(request, context):
                if self.active >= self.limit:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._refusal)
                self.active += 1
                try:
                    return await run_behaviour(fn, request, context, response_streaming)
                finally:
                    self.active -= 1
            return run

        return _rewrap(handler, wrap)


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
