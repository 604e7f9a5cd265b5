"""What a caller can hold open on a TraceServer, over a real grpc.aio server on loopback
(trace_common/grpc/server.py, interceptors.py).

Only the health Check answers without the token: health Watch and reflection are streams a caller
may keep open for ever, so they need the token like every other method. And streams, with the token
or where auth is off, take at most `max_concurrent_rpcs` less a headroom (STREAM_HEADROOM, at most
half of a small cap): past it a new stream is RESOURCE_EXHAUSTED naming the setting, while the health
Check (the kubelet's liveness probe) and unary calls still get a slot; the slot comes back however
the stream ends (client cancel, deadline, normal end, error). Before this, 256 open Watch streams
without a token made every further call RESOURCE_EXHAUSTED, the liveness probe included, and
Kubernetes restarted the pod.

The server carries a small test service beside health and reflection (`trace.test.Probe`, raw bytes):
`Echo` (unary), `Hold` (unary, sleeps until cancelled) and `Ticks` (an async generator, the style
of the TRACE Watch*Job servicers: `forever` yields once and stays open, `end` yields twice and
ends, `error` yields once and raises a domain error).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.stack import TOKEN
from trace_common.config import settings_class
from trace_common.errors import InvalidArgument
from trace_common.grpc.server import ServiceDefinition, TraceServer
from trace_common.metrics import ServiceMetrics

pytestmark = pytest.mark.integration

AUTH = (("authorization", f"Bearer {TOKEN}"),)
WRONG = (("authorization", "Bearer wrong-token"),)
PROBE = "trace.test.Probe"
SETTING = "TRACE_ROLLOUT_MAX_CONCURRENT_RPCS"
#: (max_concurrent_rpcs, streams it lets run at once): the documented numbers, not computed here.
CAPS = [(12, 6), (20, 12)]


# -- the server under test --

async def _echo(request: bytes, _context) -> bytes:
    return request


async def _hold(_request: bytes, _context) -> bytes:
    await asyncio.sleep(3600)
    return b""


async def _ticks(request: bytes, _context):
    yield b"0"
    if request == b"error":
        raise InvalidArgument("ticks asked to fail")
    if request == b"end":
        yield b"1"
        return
    await asyncio.sleep(3600)


def _add_probe(server) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(PROBE, {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Hold": grpc.unary_unary_rpc_method_handler(_hold),
        "Ticks": grpc.unary_stream_rpc_method_handler(_ticks),
    }),))


class Served:
    """A TraceServer (the rollout service's settings, the probe service) on its own event-loop thread."""

    def __init__(self, tmp_path, max_concurrent_rpcs: int, token: str | None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stream-cap-server", daemon=True)
        self.thread.start()
        settings = settings_class("rollout")(
            port=0, metrics_port=0, artifact_root=tmp_path.as_uri(), auth_token=token,
            max_concurrent_rpcs=max_concurrent_rpcs)
        definition = ServiceDefinition(name="rollout", full_names=[PROBE], metrics=ServiceMetrics("rollout"),
                                       add_to_server=_add_probe)
        self.server = TraceServer(settings, definition, warn_without_auth=False)
        self.call(self.server.start())
        self.channel = grpc.insecure_channel(self.server.target)

    def call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.channel.close()
        try:
            self.call(self.server.stop(0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def serve(tmp_path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(max_concurrent_rpcs: int = 256, token: str | None = TOKEN) -> Served:
        started.append(Served(tmp_path / str(len(started)), max_concurrent_rpcs, token))
        return started[-1]

    yield start
    for s in started:
        s.close()


# -- calls, each answering its status name --

def _code(fn: Callable[[], object]) -> str:
    try:
        fn()
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


def _check(ch, md=()) -> str:
    def go():
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), metadata=md,
                                                    timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    return _code(go)


def _watch_first(ch, md=()) -> str:
    def go():
        call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), metadata=md, timeout=10)
        try:
            assert next(call).status == health_pb2.HealthCheckResponse.SERVING
        finally:
            call.cancel()
    return _code(go)


def _reflection_list(ch, md=()) -> str:
    def go():
        out = list(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=md, timeout=10))
        assert PROBE in {s.name for s in out[0].list_services_response.service}
    return _code(go)


def _echo_call(ch, md=()) -> str:
    return _code(lambda: ch.unary_unary(f"/{PROBE}/Echo")(b"hi", metadata=md, timeout=10))


def _ticks_first(ch, md=()) -> str:
    def go():
        call = ch.unary_stream(f"/{PROBE}/Ticks")(b"forever", metadata=md, timeout=10)
        try:
            assert next(call) == b"0"
        finally:
            call.cancel()
    return _code(go)


# -- (a) without a token only the health Check answers --

# (call, metadata sent, expected status)
AUTH_CASES = [
    ("health Check", _check, (), "OK"),
    ("health Check", _check, WRONG, "OK"),
    ("health Check", _check, AUTH, "OK"),
    ("health Watch", _watch_first, (), "UNAUTHENTICATED"),
    ("health Watch", _watch_first, WRONG, "UNAUTHENTICATED"),
    ("health Watch", _watch_first, AUTH, "OK"),
    ("reflection", _reflection_list, (), "UNAUTHENTICATED"),
    ("reflection", _reflection_list, WRONG, "UNAUTHENTICATED"),
    ("reflection", _reflection_list, AUTH, "OK"),
    ("unary", _echo_call, (), "UNAUTHENTICATED"),
    ("unary", _echo_call, AUTH, "OK"),
    ("stream", _ticks_first, (), "UNAUTHENTICATED"),
    ("stream", _ticks_first, AUTH, "OK"),
]


@pytest.mark.parametrize(("what", "call", "md", "code"), AUTH_CASES,
                         ids=[f"{c[0]}-{'token' if c[2] == AUTH else 'wrong' if c[2] == WRONG else 'none'}"
                              for c in AUTH_CASES])
def test_only_the_health_check_answers_without_a_token(serve, what, call, md, code):
    s = serve()
    assert call(s.channel, md) == code, what


def test_without_auth_every_method_answers(serve):
    s = serve(token=None)
    assert [f(s.channel) for f in (_check, _watch_first, _reflection_list, _echo_call, _ticks_first)] == ["OK"] * 5


# -- (b) open streams leave room for the health Check and unary calls --

class _Streams:
    """Streams held open on the server (each has answered once), cancelled on close."""

    def __init__(self, ch, md=AUTH):
        self.ch, self.md, self.calls, self._done = ch, md, [], threading.Event()

    def watch(self):
        call = health_pb2_grpc.HealthStub(self.ch).Watch(health_pb2.HealthCheckRequest(), metadata=self.md, timeout=60)
        self.calls.append(call)
        assert next(call).status == health_pb2.HealthCheckResponse.SERVING

    def ticks(self):
        call = self.ch.unary_stream(f"/{PROBE}/Ticks")(b"forever", metadata=self.md, timeout=60)
        self.calls.append(call)
        assert next(call) == b"0"

    def reflection(self):
        def requests():  # one question, then the request stream stays open
            yield reflection_pb2.ServerReflectionRequest(list_services="")
            self._done.wait(60)
        call = reflection_pb2_grpc.ServerReflectionStub(self.ch).ServerReflectionInfo(requests(), metadata=self.md,
                                                                                       timeout=60)
        self.calls.append(call)
        assert next(call).list_services_response.service

    def close(self):
        self._done.set()
        for call in self.calls:
            call.cancel()
        self.calls.clear()


def _refused_stream(ch) -> grpc.RpcError:
    call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), metadata=AUTH, timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        next(call)
    return info.value


def _until(what: str, ok: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# (a call made while the streaming cap is full, expected status)
FULL_CASES = [
    ("health Check without a token", lambda ch: _check(ch), "OK"),
    ("health Check with the token", lambda ch: _check(ch, AUTH), "OK"),
    ("unary call", lambda ch: _echo_call(ch, AUTH), "OK"),
    ("health Watch", lambda ch: _watch_first(ch, AUTH), "RESOURCE_EXHAUSTED"),
    ("reflection", lambda ch: _reflection_list(ch, AUTH), "RESOURCE_EXHAUSTED"),
    ("async-generator stream", lambda ch: _ticks_first(ch, AUTH), "RESOURCE_EXHAUSTED"),
    ("health Watch without a token", lambda ch: _watch_first(ch), "UNAUTHENTICATED"),  # auth answers first
]


@pytest.mark.parametrize(("max_rpcs", "cap"), CAPS, ids=[f"max{m}" for m, _ in CAPS])
@pytest.mark.parametrize("filler", ["watch", "ticks", "reflection"])
@pytest.mark.parametrize(("what", "call", "code"), FULL_CASES, ids=[c[0] for c in FULL_CASES])
def test_open_streams_leave_room_for_health_checks_and_unary_calls(serve, max_rpcs, cap, filler, what, call, code):
    s = serve(max_rpcs)
    with ExitStack() as stack:
        streams = _Streams(s.channel)
        stack.callback(streams.close)
        for _ in range(cap):
            getattr(streams, filler)()
        assert call(s.channel) == code, what
        refused = _refused_stream(s.channel)       # still full: the refusal says which cap, and how to raise it
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
        assert f"at most {cap} at once" in refused.details() and f"max_concurrent_rpcs {max_rpcs}" in refused.details()
        assert SETTING in refused.details()
    # the cancelled streams give their slots back: a full set of new streams is accepted again
    _until("streams still refused after the open ones were cancelled", lambda: _watch_first(s.channel, AUTH) == "OK")
    _until("slots not all given back", lambda: s.server.stream_limit.active == 0)
    again = _Streams(s.channel)
    try:
        for _ in range(cap):
            again.watch()
        assert _refused_stream(s.channel).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _check(s.channel) == "OK"
    finally:
        again.close()


def _try_open(streams: _Streams, kind: str) -> str:
    """Open one more stream of `kind` (kept open when it answers); its status name."""
    try:
        getattr(streams, kind)()
        return "OK"
    except grpc.RpcError as err:
        streams.calls.pop().cancel()
        return err.code().name


# (metadata the flood sends, stream kind, statuses of its max_concurrent_rpcs streams)
FLOODS = [
    ((), "watch", ["UNAUTHENTICATED"] * 12),
    ((), "reflection", ["UNAUTHENTICATED"] * 12),
    (AUTH, "watch", ["OK"] * 6 + ["RESOURCE_EXHAUSTED"] * 6),
    (AUTH, "reflection", ["OK"] * 6 + ["RESOURCE_EXHAUSTED"] * 6),
    (AUTH, "ticks", ["OK"] * 6 + ["RESOURCE_EXHAUSTED"] * 6),
]


@pytest.mark.parametrize(("md", "kind", "codes"), FLOODS,
                         ids=[f"{k}-{'token' if m else 'none'}" for m, k, _ in FLOODS])
def test_a_flood_of_streams_never_starves_the_liveness_probe(serve, md, kind, codes):
    """The reported attack: as many never-ending streams as max_concurrent_rpcs (12 here), then the
    kubelet's Check. Before the fix, health Watch and reflection opened without a token and took every
    slot, and the Check was RESOURCE_EXHAUSTED."""
    s = serve(12)
    streams = _Streams(s.channel, md)
    try:
        opened = [_try_open(streams, kind) for _ in range(12)]
        assert (_check(s.channel), _echo_call(s.channel, AUTH), opened) == ("OK", "OK", codes)
    finally:
        streams.close()


def test_without_auth_the_cap_holds_too(serve):
    s = serve(12, token=None)
    streams = _Streams(s.channel)
    try:
        for _ in range(6):
            streams.watch()
        assert (_watch_first(s.channel), _check(s.channel), _echo_call(s.channel)) == ("RESOURCE_EXHAUSTED", "OK", "OK")
    finally:
        streams.close()


def _ended_by_deadline(ch) -> str:
    call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), metadata=AUTH, timeout=0.5)
    return _code(lambda: list(call))


def _ticks_to(request: bytes) -> Callable:
    return lambda ch: _code(lambda: list(ch.unary_stream(f"/{PROBE}/Ticks")(request, metadata=AUTH, timeout=10)))


# (how a stream ends, the call, its status)
EXITS = [
    ("client cancel (health Watch)", lambda ch: _watch_first(ch, AUTH), "OK"),
    ("client cancel (async generator)", lambda ch: _ticks_first(ch, AUTH), "OK"),
    ("client cancel (reflection)", lambda ch: _reflection_list(ch, AUTH), "OK"),
    ("deadline", _ended_by_deadline, "DEADLINE_EXCEEDED"),
    ("normal end", _ticks_to(b"end"), "OK"),
    ("error in the handler", _ticks_to(b"error"), "INVALID_ARGUMENT"),
]


@pytest.mark.parametrize(("how", "call", "code"), EXITS, ids=[c[0] for c in EXITS])
def test_every_way_a_stream_ends_gives_its_slot_back(serve, how, call, code):
    s = serve(12)                                   # 6 streams at once
    for _ in range(8):                              # more ends than the cap: a leak would fill it
        assert call(s.channel) == code, how
    _until(f"slots not given back after {how}", lambda: s.server.stream_limit.active == 0)
    streams = _Streams(s.channel)
    try:
        for _ in range(6):
            streams.watch()
        assert _watch_first(s.channel, AUTH) == "RESOURCE_EXHAUSTED"
    finally:
        streams.close()


def test_max_concurrent_rpcs_still_bounds_every_call(serve):
    """The headroom is room inside the cap, not beside it: with the streams at their cap and unary
    calls in the headroom, grpc refuses the next call of any kind; it answers again once they end."""
    s = serve(12)
    streams = _Streams(s.channel)
    hold = s.channel.unary_unary(f"/{PROBE}/Hold")
    held = []
    try:
        for _ in range(6):
            streams.watch()
        held = [hold.future(b"", metadata=AUTH, timeout=60) for _ in range(6)]
        _until("the held unary calls never filled the cap", lambda: _check(s.channel) == "RESOURCE_EXHAUSTED")
    finally:
        for f in held:
            f.cancel()
        streams.close()
    _until("calls still refused after the held ones ended", lambda: _check(s.channel) == "OK")
