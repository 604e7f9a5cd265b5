"""The inference service through real gRPC and HTTP (embedded stack): loading with validation and
keep-previous-on-failure, the routing a spec names (token-level or an export mode), unary and
streaming generation with routing traces, batching of concurrent
requests, stream cancellation, the OpenAI-compatible endpoint as the rollout service's OpenAIPolicy
calls it, documented errors, and per-expert metrics.

The served model is the tiny world of tests/unit/inference/tiny.py: its base answers every
conversation with one fixed `<tool_call>` (so tool-call parsing is checked end to end), composed
with two random LoRA adapters and random gates (so routing varies from token to token).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import grpc
import httpx
import pytest

from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import (
    FIXED_CALL,
    FIXED_REPLY,
    TOOLS,
    cached_world,
    prompt_messages,
    random_base_dir,
)
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
INF = messages("inference")
NAME = "tiny-moe"


@pytest.fixture(scope="module")
def world():
    return cached_world()


def _spec(world, gates_uri: str, name: str = NAME, adapters=("refunds", "addresses")) -> INF.CompositionSpec:
    return INF.CompositionSpec(name=name, base_model=str(world.model_dir), gates_uri=gates_uri,
                               adapters=[INF.AdapterRef(name=n, uri=str(world.adapter_dirs.get(n, world.adapter_dirs["refunds"])))
                                         for n in adapters])


@pytest.fixture(scope="module")
def served(embedded_stack, world):
    art = write_tiny_composition(world, embedded_stack.root, prefix="runs/inference-it/moe")
    resp = embedded_stack.stub("inference").LoadComposition(INF.LoadCompositionRequest(spec=_spec(world, art.gates_uri)))
    return resp.composition


def _chat(capability="refunds", seed=1) -> list[t.ChatMessage]:
    return [t.ChatMessage(role=m.role, content=m.content or "") for m in prompt_messages(capability, seed)]


def _tools(capability="refunds") -> list[t.ToolSchema]:
    return [t.ToolSchema(json=json.dumps(x)) for x in TOOLS[capability]]


def _generate(stub, **kw) -> INF.GenerateResponse:
    req = INF.GenerateRequest(model=kw.pop("model", NAME), messages=kw.pop("messages", _chat()), tools=_tools(),
                              sampling=t.SamplingParams(max_tokens=kw.pop("max_tokens", 40)), **kw)
    return stub.Generate(req, timeout=120)


def test_load_reports_the_composition(embedded_stack, served):
    assert served.num_layers == 2 and served.hidden_size == 64
    assert served.gate_parameters == 2 * (64 * 3 + 3)
    listed = embedded_stack.stub("inference").ListCompositions(INF.ListCompositionsRequest()).compositions
    assert [c.spec.name for c in listed if c.spec.name == NAME] == [NAME]
    assert [a.name for a in next(c for c in listed if c.spec.name == NAME).spec.adapters] == ["refunds", "addresses"]


def test_generate_returns_parsed_tool_call_and_routing_trace(embedded_stack, served):
    resp = _generate(embedded_stack.stub("inference"), return_routing_trace=True)
    assert resp.finish_reason == "tool_calls"
    (call,) = resp.message.tool_calls
    assert call.name == FIXED_CALL["name"] and json.loads(call.arguments_json) == FIXED_CALL["arguments"]
    assert resp.usage.completion_tokens == len(resp.routing_trace) > 0
    assert all(len(r.experts) == served.num_layers for r in resp.routing_trace)  # [tokens][layers]
    slots = {e for r in resp.routing_trace for e in r.experts}
    assert slots <= {0, 1, 2} and len(slots) > 1
    assert "".join(r.token_text for r in resp.routing_trace).startswith(FIXED_REPLY)


def test_generate_without_trace_has_none(embedded_stack, served):
    assert len(_generate(embedded_stack.stub("inference")).routing_trace) == 0


def test_stream_sends_deltas_then_the_parsed_message(embedded_stack, served):
    req = INF.GenerateStreamRequest(model=NAME, messages=_chat(seed=2), tools=_tools(),
                                    sampling=t.SamplingParams(max_tokens=40), return_routing_trace=True)
    chunks = list(embedded_stack.stub("inference").GenerateStream(req, timeout=120))
    *deltas, last = chunks
    assert "".join(c.delta for c in deltas) == FIXED_REPLY
    assert all(len(c.routing) == 1 and len(c.routing[0].experts) == 2 for c in deltas)
    assert last.finish_reason == "tool_calls" and last.message.tool_calls[0].name == FIXED_CALL["name"]
    assert last.usage.completion_tokens == len(deltas)


def test_concurrent_requests_are_batched(embedded_stack, served):
    stub = embedded_stack.stub("inference")
    engine = embedded_stack.domain("inference").registry.get(NAME).engine
    before = len(engine.batch_sizes)
    results, errors = [], []

    def one(i):
        try:
            results.append(_generate(stub, messages=_chat("addresses", seed=i)))
        except grpc.RpcError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors and len(results) == 4
    assert all(r.usage.completion_tokens > 0 for r in results)
    assert max(engine.batch_sizes[before:]) > 1  # at least two requests shared a batch


@pytest.fixture(scope="module")
def chatter(embedded_stack, world, tmp_path_factory):
    """An untrained base (no adapters) that never says <|im_end|> under greedy decoding: a long generation."""
    root = random_base_dir(tmp_path_factory.mktemp("chatter") / "base", len(world.tokenizer), seed=11)
    world.tokenizer.save_pretrained(root)
    spec = INF.CompositionSpec(name="chatter", base_model=str(root))
    embedded_stack.stub("inference").LoadComposition(INF.LoadCompositionRequest(spec=spec))
    return "chatter"


def _metric(embedded_stack, name: str, labels: str = "") -> float:
    text = httpx.get(embedded_stack.metrics_urls["inference"], timeout=10).text
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_cancelling_a_stream_stops_its_generation(embedded_stack, chatter):
    stub = embedded_stack.stub("inference")
    cancelled_before = _metric(embedded_stack, "trace_inference_requests_cancelled_total")
    tokens_before = _metric(embedded_stack, "trace_inference_generated_tokens_total")
    call = stub.GenerateStream(INF.GenerateStreamRequest(model=chatter, messages=_chat(),
                                                         sampling=t.SamplingParams(max_tokens=400)), timeout=120)
    received = 0
    for _ in call:
        received += 1
        if received == 3:
            call.cancel()
            break
    deadline = time.time() + 30
    while _metric(embedded_stack, "trace_inference_requests_cancelled_total") <= cancelled_before:
        assert time.time() < deadline, "the cancelled generation never stopped"
        time.sleep(0.1)
    generated = _metric(embedded_stack, "trace_inference_generated_tokens_total") - tokens_before
    assert 3 <= generated < 400
    # the service keeps serving
    assert _generate(stub, model=chatter, max_tokens=5).finish_reason == "length"


@pytest.mark.parametrize("how", ["grpc_unary_cancel", "http_disconnect"])
def test_a_caller_that_goes_away_stops_its_generation(embedded_stack, chatter, how):
    """Not only streams: a unary call cancelled, or an HTTP client that disconnects, cancels its row
    (the caller leaves as soon as its generation is under way; the chatter then runs to its context)."""
    stub = embedded_stack.stub("inference")
    cancelled_before = _metric(embedded_stack, "trace_inference_requests_cancelled_total")
    body = {"model": chatter, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}

    def running() -> None:
        deadline = time.time() + 60
        while _metric(embedded_stack, "trace_inference_requests_active") < 1:
            assert time.time() < deadline, "the generation never started"
            time.sleep(0.01)

    if how == "grpc_unary_cancel":
        call = stub.Generate.future(INF.GenerateRequest(model=chatter, messages=_chat(),
                                                        sampling=t.SamplingParams(max_tokens=4000)), timeout=120)
        running()
        call.cancel()
    else:   # a raw connection, so that closing it is a disconnect the server sees
        url = httpx.URL(embedded_stack.http_url("inference") + "/chat/completions")
        payload = json.dumps(body).encode()
        with socket.create_connection((url.host, url.port), timeout=30) as conn:
            conn.sendall(f"POST {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
            running()
    deadline = time.time() + 30
    while _metric(embedded_stack, "trace_inference_requests_cancelled_total") <= cancelled_before:
        assert time.time() < deadline, "the abandoned generation was never cancelled"
        time.sleep(0.05)
    assert _generate(stub, model=chatter, max_tokens=5).finish_reason == "length"   # the service keeps serving


@pytest.mark.parametrize("case, code, needle", [
    ("over_long_prompt", grpc.StatusCode.INVALID_ARGUMENT, "at most 8192 tokens"),
    ("bad_tool_json", grpc.StatusCode.INVALID_ARGUMENT, "tools[0].json"),
    ("tool_message_without_id", grpc.StatusCode.INVALID_ARGUMENT, "tool_call_id"),
    ("unknown_model", grpc.StatusCode.NOT_FOUND, "no loaded composition 'ghost'"),
    ("nan_temperature", grpc.StatusCode.INVALID_ARGUMENT, "request.sampling.temperature"),
])
def test_bad_requests_get_documented_errors_and_service_stays_healthy(embedded_stack, served, case, code, needle):
    stub = embedded_stack.stub("inference")
    req = INF.GenerateRequest(model=NAME, messages=_chat(), tools=_tools(), sampling=t.SamplingParams(max_tokens=5))
    if case == "over_long_prompt":
        req.messages[1].content = "refund " * 9000
    elif case == "bad_tool_json":
        req.tools[0].json = "{not json"
    elif case == "tool_message_without_id":
        req.messages.append(t.ChatMessage(role="tool", content="{}"))
    elif case == "unknown_model":
        req.model = "ghost"
    elif case == "nan_temperature":
        req.sampling.temperature = float("nan")
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(req, timeout=60)
    assert err.value.code() == code and needle in err.value.details()
    assert _generate(stub, max_tokens=3).usage.completion_tokens == 3


def test_failed_loads_keep_the_previous_composition_serving(embedded_stack, served, world, tmp_path):
    from tests.unit.inference.test_composition_io import _gates_of_other_base

    stub = embedded_stack.stub("inference")
    other_gates, _ = _gates_of_other_base(world, tmp_path, hidden=128, layers=2)
    cases = [
        (_spec(world, str(other_gates)), grpc.StatusCode.INVALID_ARGUMENT, "hidden size 64"),
        (_spec(world, served.spec.gates_uri, adapters=("refunds", "shipping")), grpc.StatusCode.INVALID_ARGUMENT,
         "unknown adapter"),
        (_spec(world, (tmp_path / "missing" / "gates.safetensors").as_uri()), grpc.StatusCode.NOT_FOUND,
         "does not exist"),
        (INF.CompositionSpec(name=NAME, base_model=(tmp_path / "nonexistent-model").as_uri()),  # a model root
         grpc.StatusCode.NOT_FOUND, "nonexistent"),
        (INF.CompositionSpec(name=NAME, base_model="file:///nonexistent/model"),  # outside the store and roots
         grpc.StatusCode.PERMISSION_DENIED, "base_model"),
    ]
    for spec, code, needle in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.LoadComposition(INF.LoadCompositionRequest(spec=spec), timeout=120)
        assert err.value.code() == code and needle in err.value.details(), err.value.details()
        listed = {c.spec.name: c for c in stub.ListCompositions(INF.ListCompositionsRequest()).compositions}
        assert listed[NAME].spec.gates_uri == served.spec.gates_uri
        assert _generate(stub).finish_reason == "tool_calls"


def test_openai_policy_gets_parsed_tool_calls(embedded_stack, served):
    from trace_common.policy import OpenAIPolicy, PolicyRequest, SamplingParams

    async def run():
        policy = OpenAIPolicy(embedded_stack.http_url("inference"), NAME, timeout_s=120, max_retries=0)
        try:
            return await policy.complete(PolicyRequest(prompt_messages("refunds", 4), TOOLS["refunds"],
                                                       SamplingParams(temperature=0, max_tokens=40)))
        finally:
            await policy.close()

    turn = asyncio.run(run())
    assert turn.finish_reason == "tool_calls" and not turn.parse_errors
    (call,) = turn.message.tool_calls
    assert call.function.name == FIXED_CALL["name"] and json.loads(call.function.arguments) == FIXED_CALL["arguments"]
    assert turn.logprobs is not None and len(turn.logprobs) == turn.completion_tokens


def test_openai_stream_and_routing_extension(embedded_stack, served):
    url = embedded_stack.http_url("inference") + "/chat/completions"
    body = {"model": NAME, "messages": [m.to_dict() for m in prompt_messages("refunds", 5)],
            "tools": TOOLS["refunds"], "temperature": 0, "max_tokens": 40}
    plain = httpx.post(url, json=dict(body, return_routing_trace=True), timeout=120).json()
    assert plain["experts"] == ["base", "refunds", "addresses"]
    assert len(plain["routing_trace"]) == plain["usage"]["completion_tokens"]
    with httpx.stream("POST", url, json=dict(body, stream=True), timeout=120) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == FIXED_REPLY
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == FIXED_CALL["name"]


@pytest.mark.parametrize("body, status, kind, needle", [
    ("{not json", 400, "invalid_request_error", "not JSON"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "'model' is required"),
    ({"model": NAME, "messages": []}, 400, "invalid_request_error", "non-empty list"),
    ({"model": NAME, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_request_error", "messages[0]"),
    ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "invalid_request_error", "n=1"),
    ({"model": NAME, "messages": [{"role": "user", "content": "refund " * 9000}]}, 400, "invalid_request_error",
     "at most 8192 tokens"),
    ({"model": "ghost", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found", "ghost"),
    # far more text than the token cap could hold: refused before it is tokenized
    ({"model": NAME, "messages": [{"role": "user", "content": "x" * (16 * 8192 + 1)}]}, 400, "invalid_request_error",
     "131073 characters, more than 16 per token"),
    # values torch cannot take would fail every request batched with them: refused before the batch
    ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "seed": 2**64}, 400, "invalid_request_error",
     "seed"),
    ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "top_k": 10**20}, 400, "invalid_request_error",
     "top_k"),
    ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "top_k": 10**400}, 400, "invalid_request_error",
     "top_k"),                                                  # a JSON integer past any float: not a 500
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")}), 400,
     "invalid_request_error", "'temperature' must be a finite number"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": float("inf")}), 400,
     "invalid_request_error", "'max_tokens' must be a finite integer"),
])
def test_openai_errors_are_documented(embedded_stack, served, body, status, kind, needle):
    base = embedded_stack.http_url("inference")
    content = body if isinstance(body, str) else json.dumps(body)
    resp = httpx.post(base + "/chat/completions", content=content, headers={"Content-Type": "application/json"},
                      timeout=60)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["type"] == kind and needle in error["message"]
    assert httpx.get(base.removesuffix("/v1") + "/health", timeout=10).json()["status"] == "ok"


def test_metrics_count_tokens_per_expert(embedded_stack, served):
    before = {e: _metric(embedded_stack, "trace_inference_tokens_routed_total", f'{{expert="{e}"}}')
              for e in ("base", "refunds", "addresses")}
    resp = _generate(embedded_stack.stub("inference"), return_routing_trace=True)
    after = {e: _metric(embedded_stack, "trace_inference_tokens_routed_total", f'{{expert="{e}"}}') for e in before}
    delta = {e: after[e] - before[e] for e in before}
    # every processed token (prompt + generated, the last one is never fed) is routed once per layer
    assert sum(delta.values()) == (resp.usage.prompt_tokens + resp.usage.completion_tokens - 1) * 2
    # the generated tokens' own decisions are part of the count
    for slot, name in enumerate(("base", "refunds", "addresses")):
        traced = sum(list(r.experts).count(slot) for r in resp.routing_trace)
        assert delta[name] >= traced
    assert _metric(embedded_stack, "trace_inference_request_duration_seconds_count", '{api="grpc"}') > 0
    assert _metric(embedded_stack, "trace_inference_time_to_first_token_seconds_count") > 0


@pytest.mark.parametrize("routing, served_as, check", [
    ("COMPOSITION_ROUTING_UNSPECIFIED", "COMPOSITION_ROUTING_TOKEN", "varies"),
    ("COMPOSITION_ROUTING_TOKEN", "COMPOSITION_ROUTING_TOKEN", "varies"),
    ("COMPOSITION_ROUTING_PER_REQUEST", "COMPOSITION_ROUTING_PER_REQUEST", "one_slot"),
    ("COMPOSITION_ROUTING_MERGED", "COMPOSITION_ROUTING_MERGED", "no_trace"),
])
def test_load_serves_the_routing_the_spec_names(embedded_stack, served, world, routing, served_as, check):
    """CompositionSpec.routing chooses token-level routing or an export mode; the answer names it."""
    stub = embedded_stack.stub("inference")
    spec = _spec(world, served.spec.gates_uri, name="routed")
    spec.routing = INF.CompositionRouting.Value(routing)
    try:
        info = stub.LoadComposition(INF.LoadCompositionRequest(spec=spec), timeout=120).composition
        assert INF.CompositionRouting.Name(info.spec.routing) == served_as
        listed = {c.spec.name: c for c in stub.ListCompositions(INF.ListCompositionsRequest()).compositions}
        assert listed["routed"].spec.routing == info.spec.routing
        trace = _generate(stub, model="routed", return_routing_trace=True).routing_trace
        slots = {e for r in trace for e in r.experts}
        if check == "varies":  # the gates pick per token and layer
            assert info.gate_parameters == served.gate_parameters and len(slots) > 1
        elif check == "one_slot":  # one slot chosen for the request, forced at every layer of every token
            assert len(trace) > 0 and len(slots) == 1
        else:  # one adapter folded into the weights: nothing is routed
            assert info.gate_parameters == 0 and len(trace) == 0
    finally:
        stub.UnloadComposition(INF.UnloadCompositionRequest(name="routed"))


def test_an_unknown_routing_is_refused_and_the_previous_keeps_serving(embedded_stack, served, world):
    stub = embedded_stack.stub("inference")
    spec = _spec(world, served.spec.gates_uri)  # NAME: would replace the serving composition
    spec.routing = 42  # a value of a newer client
    with pytest.raises(grpc.RpcError) as err:
        stub.LoadComposition(INF.LoadCompositionRequest(spec=spec), timeout=120)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.routing" in err.value.details() and "COMPOSITION_ROUTING_TOKEN" in err.value.details()
    listed = {c.spec.name: c for c in stub.ListCompositions(INF.ListCompositionsRequest()).compositions}
    assert INF.CompositionRouting.Name(listed[NAME].spec.routing) == "COMPOSITION_ROUTING_TOKEN"
    assert _generate(stub).finish_reason == "tool_calls"


def test_unload(embedded_stack, world):
    art = write_tiny_composition(world, embedded_stack.root, prefix="runs/inference-unload/moe")
    stub = embedded_stack.stub("inference")
    stub.LoadComposition(INF.LoadCompositionRequest(spec=_spec(world, art.gates_uri, name="gone")))
    stub.UnloadComposition(INF.UnloadCompositionRequest(name="gone"))
    with pytest.raises(grpc.RpcError) as err:
        _generate(stub, model="gone")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
