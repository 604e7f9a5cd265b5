"""Loading, swapping and unloading compositions while requests run, through a real inference service on
loopback (gRPC + the OpenAI-compatible HTTP front, one event loop per test).

  * an unload or a hot swap whose drain time runs out answers every caller still waiting -- in the
    running batch or queued behind it, unary, stream or HTTP -- with UNAVAILABLE "... was
    unloaded/replaced; retry" at once, stops the worker at its next step and removes the model's
    hooks only once the worker has left the batch (before: callers waited for ever, the worker kept
    decoding, a swap pulled the hooks out from under the running batch);
  * a request taken by the previous composition just before a hot swap (still being tokenized) is
    served by it, and refused with UNAVAILABLE only if the drain runs out -- never the
    FAILED_PRECONDITION "the policy was closed" it got before;
  * LoadComposition calls cancelled by their deadline build one at a time and leave nothing registered
    (before: each cancellation released the lock and its build kept running beside the next);
  * a tool schema nested past the JSON decoder's recursion limit is INVALID_ARGUMENT naming tools[0]
    (before: INTERNAL).

Races are widened by monkeypatching delays into the decoding steps, request preparation and builds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from services.inference import compositions, decoding
from services.inference.app import create_service
from services.inference.decoding import CompositionEngine
from services.inference.service import Inference
from services.inference.settings import InferenceSettings
from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import cached_world
from trace_common.grpc.client import messages
from trace_common.grpc.server import TraceServer
from trace_common.moe import ComposedMoEModel
from trace_common.proto.trace.v1 import inference_service_pb2_grpc as pb_grpc
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
INF = messages("inference")
NAME = "m"
#: seconds every decoding step takes once `slow_steps` is on: the tiny model's 29-token reply then takes ~6 s
STEP_S = 0.2


@pytest.fixture(scope="module")
def world():
    return cached_world()


@dataclass
class Store:
    root: Path
    gates_uri: str


@pytest.fixture(scope="module")
def store(world, tmp_path_factory) -> Store:
    root = tmp_path_factory.mktemp("store")
    return Store(root, write_tiny_composition(world, root, prefix="runs/lifecycle/moe").gates_uri)


@dataclass
class Live:
    stub: pb_grpc.InferenceServiceStub
    http: httpx.AsyncClient
    domain: Inference
    world: object
    gates_uri: str

    def spec(self, name: str = NAME) -> INF.CompositionSpec:
        return INF.CompositionSpec(name=name, base_model=str(self.world.model_dir), gates_uri=self.gates_uri,
                                   adapters=[INF.AdapterRef(name=n, uri=str(self.world.adapter_dirs[n]))
                                             for n in ("refunds", "addresses")])

    async def load(self, name: str = NAME, timeout: float = 60):
        return await self.stub.LoadComposition(INF.LoadCompositionRequest(spec=self.spec(name)), timeout=timeout)

    async def names(self) -> set[str]:
        listed = await self.stub.ListCompositions(INF.ListCompositionsRequest(), timeout=10)
        return {c.spec.name for c in listed.compositions}


@contextlib.asynccontextmanager
async def serving(world, store: Store, tmp_path: Path, **settings) -> AsyncIterator[Live]:
    """The inference service on loopback with composition NAME loaded."""
    s = InferenceSettings(port=0, metrics_port=0, artifact_root=store.root.as_uri(),
                          model_roots=[Path(world.model_dir).parent.as_uri()], model_cache_dir=str(tmp_path / "cache"),
                          **settings)
    definition = create_service(s)
    server = TraceServer(s, definition, warn_without_auth=False)
    await server.start()
    channel = grpc.aio.insecure_channel(server.target)
    http = httpx.AsyncClient(base_url=definition.http.url, timeout=60)
    live = Live(pb_grpc.InferenceServiceStub(channel), http, definition.domain, world, store.gates_uri)
    try:
        await live.load()
        yield live
    finally:
        await http.aclose()
        await channel.close()
        await server.stop(0)


def _messages() -> list[t.ChatMessage]:
    return [t.ChatMessage(role="user", content="refund order A17")]


def _generate(live: Live, max_tokens: int = 40, timeout: float = 20):
    return live.stub.Generate(INF.GenerateRequest(model=NAME, messages=_messages(),
                                                  sampling=t.SamplingParams(max_tokens=max_tokens)), timeout=timeout)


async def _stream(live: Live, timeout: float = 20) -> list:
    call = live.stub.GenerateStream(INF.GenerateStreamRequest(model=NAME, messages=_messages(),
                                                              sampling=t.SamplingParams(max_tokens=40)), timeout=timeout)
    return [chunk async for chunk in call]


def _http(live: Live, max_tokens: int = 40):
    return live.http.post("/chat/completions", json={"model": NAME, "max_tokens": max_tokens,
                                                     "messages": [{"role": "user", "content": "refund order A17"}]})


async def _outcome(awaitable, timeout: float = 15) -> tuple[str, str]:
    """(status, message) of one caller: a gRPC code name or an HTTP status; "HUNG" if it never answered."""
    try:
        result = await asyncio.wait_for(awaitable, timeout)
    except grpc.aio.AioRpcError as err:
        return err.code().name, err.details() or ""
    except TimeoutError:
        return "HUNG", ""
    if isinstance(result, httpx.Response):
        return str(result.status_code), result.json().get("error", {}).get("message", "") if result.is_error else ""
    return "OK", ""


class Worker:
    """Watches the decoding worker: whether it is inside a batch, how many steps it took, and whether
    the model's hooks were removed while it was inside."""

    def __init__(self, monkeypatch):
        self.inside = threading.Event()
        self.steps = 0
        self.removed_while_inside: list[bool] = []
        decode, sample, remove = CompositionEngine._decode, decoding.sample_tokens, ComposedMoEModel.remove

        def slow_decode(engine, requests):
            self.inside.set()
            try:
                return decode(engine, requests)
            finally:
                self.inside.clear()

        def slow_sample(*args, **kwargs):
            time.sleep(STEP_S)
            self.steps += 1
            return sample(*args, **kwargs)

        def spied_remove(model):
            self.removed_while_inside.append(self.inside.is_set())
            return remove(model)

        monkeypatch.setattr(CompositionEngine, "_decode", slow_decode)
        monkeypatch.setattr(decoding, "sample_tokens", slow_sample)
        monkeypatch.setattr(ComposedMoEModel, "remove", spied_remove)

    async def wait_steps(self, n: int) -> None:
        deadline = time.monotonic() + 20
        while self.steps < n:
            assert time.monotonic() < deadline, "the generation never started"
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("action, word", [("unload", "unloaded"), ("swap", "replaced")])
def test_unload_or_swap_answers_every_waiting_caller_at_once(world, store, tmp_path, monkeypatch, action, word):
    """The drain runs out (0.2 s) while a batch decodes (~6 s left) and a request queues behind it."""
    monkeypatch.setattr(decoding, "DRAIN_S", 0.2, raising=False)
    worker = Worker(monkeypatch)

    async def main():
        async with serving(world, store, tmp_path) as live:
            running = [asyncio.ensure_future(_generate(live)), asyncio.ensure_future(_stream(live))]
            await worker.wait_steps(2)
            queued = asyncio.ensure_future(_http(live))     # waits for the next batch
            await asyncio.sleep(0.5)
            started = time.monotonic()
            if action == "unload":
                await live.stub.UnloadComposition(INF.UnloadCompositionRequest(name=NAME), timeout=20)
            else:
                await live.load()
            returned = time.monotonic() - started
            steps, inside, removed = worker.steps, worker.inside.is_set(), list(worker.removed_while_inside)
            outcomes = [await _outcome(c) for c in (*running, queued)]
            await asyncio.sleep(2 * STEP_S)
            after = worker.steps - steps
            names = await live.names()
            retry = None
            if action == "swap":    # the new version serves (steps are still slow: a short reply)
                retry = await _outcome(_generate(live, max_tokens=2))
            return returned, inside, removed, after, outcomes, names, retry

    returned, inside, removed, after, outcomes, names, retry = asyncio.run(main())
    assert [o[0] for o in outcomes] == ["UNAVAILABLE", "UNAVAILABLE", "503"], outcomes
    assert all(f"composition '{NAME}' was {word}" in msg and "retry" in msg for _, msg in outcomes), outcomes
    assert returned < 5, f"{action} took {returned:.1f} s"
    assert not inside and after == 0, "the worker kept decoding the abandoned batch"
    assert removed == [False], "the hooks were removed while the worker was in the batch"
    assert names == ({NAME} if action == "swap" else set())
    assert retry in (None, ("OK", ""))


@pytest.mark.parametrize("drain_s, expected", [
    (60.0, "OK"),              # the previous composition serves what it took, as the module docstring says
    (0.1, "UNAVAILABLE"),      # the drain ran out while they were being tokenized: refused, retry-able
])
def test_requests_taken_just_before_a_hot_swap(world, store, tmp_path, monkeypatch, drain_s, expected):
    """Callers whose preparation (rendering, tokenizing: stretched to 1.5 s here) straddles a hot swap."""
    monkeypatch.setattr(decoding, "DRAIN_S", drain_s, raising=False)
    prepare = Inference._prepare

    def slow_prepare(*args):
        out = prepare(*args)
        time.sleep(1.5)   # stands in for tokenizing a long prompt
        return out

    monkeypatch.setattr(Inference, "_prepare", slow_prepare)

    async def main():
        async with serving(world, store, tmp_path) as live:
            callers = [asyncio.ensure_future(_generate(live)), asyncio.ensure_future(_stream(live)),
                       asyncio.ensure_future(_http(live))]
            await asyncio.sleep(0.3)
            await live.load()                               # hot swap of the same name
            return [await _outcome(c) for c in callers], await _outcome(_generate(live, max_tokens=3))

    outcomes, after = asyncio.run(main())
    http_status = {"OK": "200", "UNAVAILABLE": "503"}[expected]
    assert [o[0] for o in outcomes] == [expected, expected, http_status], outcomes
    if expected == "UNAVAILABLE":
        assert all(f"composition '{NAME}' was replaced" in msg for _, msg in outcomes), outcomes
    assert after == ("OK", "")


def test_cancelled_loads_build_one_at_a_time_and_register_nothing(world, store, tmp_path, monkeypatch):
    """Three LoadComposition calls give up after 0.2 s while their builds take ~1 s each."""
    build = compositions.load_composition
    active, peak = [0], [0]
    lock = threading.Lock()

    def slow_build(**kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.8)
            return build(**kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(compositions, "load_composition", slow_build)

    async def main():
        async with serving(world, store, tmp_path, max_compositions=2) as live:
            codes = [await _outcome(live.load(f"c{i}", timeout=0.2)) for i in range(3)]
            meanwhile = await _outcome(_http(live, max_tokens=2), timeout=10)   # NAME keeps serving
            # waits behind the cancelled builds (the lock is theirs until they finish), then fits the limit
            last = await _outcome(live.load("c3", timeout=30), timeout=30)
            return codes, meanwhile, last, await live.names()

    codes, meanwhile, last, names = asyncio.run(main())
    assert [c for c, _ in codes] == ["DEADLINE_EXCEEDED"] * 3
    assert peak[0] == 1, f"{peak[0]} builds ran at once"
    assert meanwhile == ("200", "") and last == ("OK", "")
    assert names == {NAME, "c3"}      # a cancelled load registers nothing, even once its build finished


@pytest.mark.parametrize("schema", ["[" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_a_tool_schema_nested_too_deep_is_invalid_argument(world, store, tmp_path, schema):
    async def main():
        async with serving(world, store, tmp_path) as live:
            req = INF.GenerateRequest(model=NAME, messages=_messages(), tools=[t.ToolSchema(json=schema)])
            refused = await _outcome(live.stub.Generate(req, timeout=20))
            return refused, await _outcome(_generate(live, max_tokens=2))

    (code, message), after = asyncio.run(main())
    assert code == "INVALID_ARGUMENT" and "tools[0]" in message, (code, message)
    assert after == ("OK", "")


def test_a_stream_whose_reader_stalls_holds_no_swap_once_generated(world, store, tmp_path, monkeypatch):
    """A stream counts as in flight until its generation ends, not until its reader has taken the last
    delta: an unload after the generation ended returns at once although the reader (here: a consumer
    that stopped after one delta) never came back (before: it waited the whole drain, DRAIN_S)."""
    from services.inference.service import ChatRequest
    from trace_common.env.messages import Message

    monkeypatch.setattr(decoding, "DRAIN_S", 30.0, raising=False)

    async def main():
        async with serving(world, store, tmp_path) as live:
            served = live.domain.registry.get(NAME)
            stream = live.domain.generate_stream(ChatRequest(model=NAME, max_tokens=8,
                                                             messages=[Message(role="user", content="refund A17")]))
            await stream.__anext__()                        # one delta read, then the reader stalls
            deadline = time.monotonic() + 20
            while served.engine._inflight and time.monotonic() < deadline:
                await asyncio.sleep(0.05)                   # the generation runs to its end meanwhile
            started = time.monotonic()
            await live.stub.UnloadComposition(INF.UnloadCompositionRequest(name=NAME), timeout=60)
            took = time.monotonic() - started
            await stream.aclose()
            return took

    took = asyncio.run(main())
    assert took < 5, f"the unload waited {took:.1f} s for a reader that had stopped reading"
