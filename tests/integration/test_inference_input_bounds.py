"""The inference service (real gRPC and HTTP servers on loopback, the tiny world's composition) facing input
that used to end in INTERNAL / 500 or in unbounded work: references holding a NUL or another control
character are INVALID_ARGUMENT naming the field; malformed HTTP bodies are 400s naming what is wrong and
bodies past the service's max_message_bytes are 413s; `/./` and `//` spellings of one gates file share one
cache copy; a streamed completion carries the routing trace and logprobs it was asked for, the same as the
unary one."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import grpc
import httpx
import pytest

from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import cached_world
from trace_common.grpc.client import messages

pytestmark = pytest.mark.integration
INF = messages("inference")
MAX_MESSAGE_BYTES = 1 << 20
NAME = "m"


class Service:
    """One inference service on its own event-loop thread, its composition `m` loaded from a file store."""

    def __init__(self, root: Path, world):
        from services.inference.app import create_service
        from services.inference.settings import InferenceSettings
        from trace_common.grpc.server import TraceServer
        from trace_common.proto.trace.v1 import inference_service_pb2_grpc as pbg

        self.world, self.root = world, root
        self.art = write_tiny_composition(world, root / "store", prefix="runs/r/moe")
        settings = InferenceSettings(artifact_root=(root / "store").as_uri(),
                                     model_roots=[Path(world.model_dir).parent.as_uri()],
                                     model_cache_dir=str(root / "cache"), metrics_port=0,
                                     max_message_bytes=MAX_MESSAGE_BYTES)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.definition = create_service(settings)
        self.server = TraceServer(settings, self.definition, warn_without_auth=False)
        self._call(self.server.start())
        self.channel = grpc.insecure_channel(self.server.target)
        self.stub = pbg.InferenceServiceStub(self.channel)
        self.url = self.definition.http.url
        self.stub.LoadComposition(INF.LoadCompositionRequest(spec=self.spec()), timeout=120)

    def spec(self, name: str = NAME, base: str | None = None, gates: str | None = None,
             adapter_uri: str | None = None) -> INF.CompositionSpec:
        return INF.CompositionSpec(
            name=name, base_model=str(self.world.model_dir) if base is None else base,
            gates_uri=self.art.gates_uri if gates is None else gates,
            adapters=[INF.AdapterRef(name=n, uri=adapter_uri or str(self.world.adapter_dirs[n]))
                      for n in ("refunds", "addresses")])

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def close(self) -> None:
        self.channel.close()
        self._call(self.server.stop(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    s = Service(tmp_path_factory.mktemp("inference-bounds"), cached_world())
    yield s
    s.close()


@pytest.mark.parametrize("spec, field", [
    (dict(base="/x/a\x00b"), "base_model"),
    (dict(base="file:///x/a\nb"), "base_model"),
    (dict(gates="/x/g\x00"), "gates_uri"),
    (dict(gates="{gates}\x00"), "gates_uri"),
    (dict(adapter_uri="/x/\x00/refunds"), "adapter uri"),
])
def test_references_with_control_characters_are_invalid_arguments(service, spec, field):
    spec = {k: v.format(gates=service.art.gates_uri) for k, v in spec.items()}
    with pytest.raises(grpc.RpcError) as err:
        service.stub.LoadComposition(INF.LoadCompositionRequest(spec=service.spec(name="n", **spec)), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert field in err.value.details() and "control character" in err.value.details()


HI = '"messages":[{"role":"user","content":"hi"}]'


def _raw(**fields: str) -> str:
    """A completion body for model 'm' saying "hi", with `fields` written in as raw JSON text."""
    return '{"model":"m",' + HI + "".join(f',"{k}":{v}' for k, v in fields.items()) + "}"


@pytest.mark.parametrize("body, status, needle", [
    (_raw(temperature="1" + "0" * 400), 400, "'temperature' must be a finite number"),
    (_raw(top_k="1" + "0" * 5000), 400, "'top_k' is an integer of 5001 digits"),
    ("[" * 5000, 400, "nests JSON values deeper"),
    (_raw(tools="[" + '{"a":' * 5000 + "1" + "}" * 5000 + "]"), 400, "nests JSON values deeper"),
    ("[" * 100_000, 413, "3 x max_message_bytes (1048576)"),
    (_raw(user=f'"{"x" * MAX_MESSAGE_BYTES}"'), 413, "max_message_bytes (1048576 bytes)"),
])
def test_bad_http_bodies_are_client_errors(service, body, status, needle):
    resp = httpx.post(service.url + "/chat/completions", content=body, timeout=60,
                      headers={"Content-Type": "application/json"})
    assert resp.status_code == status, resp.text[:300]
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"], error


def test_spellings_of_one_gates_uri_share_one_cache_copy(service):
    gates = service.art.gates_uri
    head, tail = gates.split("/runs/")
    for spelling in (head + "/./runs/" + tail, head + "/././runs/" + tail, head + "//runs/" + tail,
                     gates.replace("/moe/", "/./moe/")):
        service.stub.LoadComposition(INF.LoadCompositionRequest(spec=service.spec(gates=spelling)), timeout=120)
    assert len(list((service.root / "cache" / "files").iterdir())) == 1


def _body(**kw) -> dict:
    from tests.unit.inference.tiny import TOOLS, prompt_messages

    return {"model": NAME, "messages": [m.to_dict() for m in prompt_messages("refunds", 5)],
            "tools": TOOLS["refunds"], "temperature": 0, "max_tokens": 24, **kw}


def test_a_stream_carries_the_routing_trace_and_logprobs_of_the_unary_reply(service):
    url = service.url + "/chat/completions"
    plain = httpx.post(url, json=_body(return_routing_trace=True, logprobs=True), timeout=120).json()
    with httpx.stream("POST", url, json=_body(return_routing_trace=True, logprobs=True, stream=True),
                      timeout=120) as resp:
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    routes = [r for e in events for r in e.get("routing_trace", [])]
    assert routes == plain["routing_trace"] and len(routes) == plain["usage"]["completion_tokens"]
    # each token's route travels no later than the chunk that carries its text
    assert all(e.get("routing_trace") for e in events if e["choices"][0]["delta"].get("content"))
    assert events[-1]["experts"] == plain["experts"] == ["base", "refunds", "addresses"]
    streamed = [x for e in events for x in (e["choices"][0]["logprobs"] or {}).get("content", [])]
    unary = plain["choices"][0]["logprobs"]["content"]
    assert [x["token"] for x in streamed] == [x["token"] for x in unary]
    assert [x["logprob"] for x in streamed] == pytest.approx([x["logprob"] for x in unary], abs=1e-4)
    without = httpx.post(url, json=_body(stream=True), timeout=120).text
    assert "routing_trace" not in without and '"logprobs": {' not in without
