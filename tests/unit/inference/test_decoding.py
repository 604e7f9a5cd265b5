"""The inference domain without gRPC: routing traces against a full forward, batch independence,
seeded sampling, export routing modes, cancellation, prompt limits, OpenAI body validation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.inference.decoding import RowRequest
from services.inference.openai_http import BadRequest, chat_request_from_body
from services.inference.service import ChatRequest, Completion, Inference, StreamDelta
from services.inference.settings import InferenceSettings
from services.inference.specs import AdapterRefModel, CompositionSpecModel
from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import FIXED_REPLY, TOOLS, prompt_messages
from trace_common.errors import InvalidArgument
from trace_common.model_refs import UNCONFINED
from trace_common.moe.export import choose_adapter_per_request


def _spec(world, gates_uri: str, name: str = "c", routing: str = "token") -> CompositionSpecModel:
    return CompositionSpecModel(name=name, base_model=str(world.model_dir), gates_uri=gates_uri, routing=routing,
                                adapters=[AdapterRefModel(name=n, uri=str(world.adapter_dirs[n]))
                                          for n in ("refunds", "addresses")])


def _request(model="c", capability="refunds", conversation=1, **kw) -> ChatRequest:
    kw.setdefault("max_tokens", 40)
    return ChatRequest(model=model, messages=prompt_messages(capability, conversation), tools=TOOLS[capability], **kw)


def _run(world, tmp_path, body, routing="token", **settings):
    art = write_tiny_composition(world, tmp_path / "store")

    async def main():
        domain = Inference(InferenceSettings(artifact_root=(tmp_path / "store").as_uri(),
                                             model_cache_dir=str(tmp_path / "cache"), **settings))
        await domain.load(_spec(world, art.gates_uri, routing=routing))
        try:
            return await body(domain)
        finally:
            await domain.stop()
    return asyncio.run(main())


def test_routing_trace_matches_a_full_forward(world, tmp_path):
    """KV-cache decoding routes each token as a full forward over prompt + reply does."""
    async def body(domain):
        completion = await domain.generate(_request(return_routing_trace=True))
        served = domain.registry.get("c")
        prompt = served.tokenizer(served.chat.render(prompt_messages("refunds", 1), TOOLS["refunds"]),
                                  add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + completion.token_ids[:-1]])
        with torch.no_grad(), served.loaded.composed.capture_routing() as trace:
            served.loaded.composed(input_ids=ids)
        return completion, trace.experts()[:, 0], len(prompt)

    completion, experts, n_prompt = _run(world, tmp_path, body)
    expected = experts[:, n_prompt - 1:].T.tolist()  # [tokens][layers]: the positions that produced each token
    assert [r.experts for r in completion.routing] == expected
    assert completion.text == FIXED_REPLY and completion.finish_reason == "tool_calls"


def test_a_reply_does_not_depend_on_its_batch_mates(world, tmp_path):
    async def body(domain):
        alone = await domain.generate(_request(conversation=3, return_routing_trace=True))
        together = await asyncio.gather(*[domain.generate(_request(capability=c, conversation=s,
                                                                   return_routing_trace=True))
                                          for c, s in [("addresses", 9), ("refunds", 3), ("addresses", 12)]])
        return alone, together[1], domain.registry.get("c").engine.batch_sizes

    alone, batched, sizes = _run(world, tmp_path, body, batch_wait_s=0.2)
    assert max(sizes) == 3
    assert batched.token_ids == alone.token_ids
    assert [r.experts for r in batched.routing] == [r.experts for r in alone.routing]


@pytest.mark.parametrize("seeds, same", [((7, 7), True), ((7, 8), False)])
def test_seeded_sampling(world, tmp_path, seeds, same):
    async def body(domain):
        return [await domain.generate(_request(temperature=3.0, seed=s, max_tokens=20)) for s in seeds]

    a, b = _run(world, tmp_path, body)
    assert (a.token_ids == b.token_ids) is same


def test_per_request_routing_forces_the_prompt_choice(world, tmp_path):
    async def body(domain):
        completion = await domain.generate(_request(return_routing_trace=True))
        served = domain.registry.get("c")
        prompt = served.tokenizer(served.chat.render(prompt_messages("refunds", 1), TOOLS["refunds"]),
                                  add_special_tokens=False)["input_ids"]
        choice = choose_adapter_per_request(served.loaded.composed, torch.tensor([prompt]))[0]
        return completion, choice

    completion, choice = _run(world, tmp_path, body, routing="per_request")
    assert completion.forced_slot == choice.slot
    assert {e for r in completion.routing for e in r.experts} == {choice.slot}


def test_merged_routing_serves_without_trace(world, tmp_path):
    async def body(domain):
        return await domain.generate(_request(return_routing_trace=True)), domain.list()

    completion, listed = _run(world, tmp_path, body, routing="merged")
    assert completion.routing == [] and completion.completion_tokens > 0
    assert listed[0]["routing"] == "merged" and listed[0]["gate_parameters"] == 0


def test_soft_trajectory_serves_what_the_in_process_policy_generates(world, tmp_path):
    """The service and the rollout backend's composition policy (RoutedPolicy) apply the same soft
    per-trajectory routing: same weights, same greedy reply; no per-token trace, weights instead."""
    from trace_common.moe.routed_policy import composition_policy
    from trace_common.moe.soft_routing import generate_soft_batch
    from trace_common.policy.base import PolicyRequest, SamplingParams
    from trace_common.policy.generation import RowParams

    async def body(domain):
        completion = await domain.generate(_request(return_routing_trace=True, max_tokens=12))
        served = domain.registry.get("c")
        prompt = served.tokenizer(served.chat.render(prompt_messages("refunds", 1), TOOLS["refunds"]),
                                  add_special_tokens=False)["input_ids"]
        outs, weights = generate_soft_batch(served.loaded.composed, [prompt], [RowParams(temperature=0.0,
                                            max_tokens=12)], stop_ids=served.engine.stop_ids,
                                            pad_id=served.engine.pad_id)
        return completion, outs[0], weights[:, 0], domain.list()

    completion, direct, weights, listed = _run(world, tmp_path, body, routing="soft_trajectory")
    assert completion.routing == [] and completion.forced_slot is None
    assert completion.token_ids == direct.token_ids
    torch.testing.assert_close(torch.tensor(completion.mixture), weights)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0]))
    assert weights.min() > 0.01  # random gates: every slot takes part
    assert listed[0]["routing"] == "soft_trajectory" and listed[0]["gate_parameters"] > 0

    art = write_tiny_composition(world, tmp_path / "store2")
    policy = composition_policy(art.manifest_uri, routing="soft_trajectory", allowed=UNCONFINED)

    async def generate():
        try:
            return await policy.generate([PolicyRequest(messages=prompt_messages("refunds", 1), tools=TOOLS["refunds"],
                                                        params=SamplingParams(temperature=0.0, max_tokens=12))])
        finally:
            await policy.close()
    turn = asyncio.run(generate())[0]
    assert turn.completion_token_ids == completion.token_ids
    assert sum(policy.mixture_sums.values()) == pytest.approx(1.0) and not policy.slot_requests


def test_cancel_flag_stops_a_row_at_the_next_step(world, tmp_path):
    async def body(domain):
        served = domain.registry.get("c")
        engine = served.engine
        # A prompt the tiny model answers with FIXED_REPLY (many tokens, test above): with an arbitrary
        # one ([5, 6, 7, 8]) the model may emit its stop token within 3 tokens on some CPUs, and did here.
        prompt = served.tokenizer(served.chat.render(prompt_messages("refunds", 1), TOOLS["refunds"]),
                                  add_special_tokens=False)["input_ids"]
        row = RowRequest(prompt_ids=prompt, max_tokens=200)
        seen = []

        def on_token(token, route):
            seen.append(token)
            if len(seen) == 3:
                row.cancelled.set()

        row.on_token = on_token
        other = RowRequest(prompt_ids=[9, 10, 11], max_tokens=6)
        return await asyncio.gather(engine.submit(row), engine.submit(other))

    cancelled, other = _run(world, tmp_path, body, batch_wait_s=0.2)
    assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) == 3
    assert len(other.token_ids) <= 6 and other.finish_reason in ("stop", "length")


def test_stream_yields_deltas_then_completion(world, tmp_path):
    async def body(domain):
        return [event async for event in domain.generate_stream(_request(return_routing_trace=True))]

    events = _run(world, tmp_path, body)
    *deltas, final = events
    assert all(isinstance(e, StreamDelta) for e in deltas) and isinstance(final, Completion)
    assert "".join(d.text for d in deltas) == FIXED_REPLY
    assert [d.route.experts for d in deltas] == [r.experts for r in final.routing]


@pytest.mark.parametrize("settings, content, needle", [
    ({"max_prompt_tokens": 16}, "Please refund order A17", "at most 16 tokens"),
    ({}, "refund " * 600, "shorter than the model's context (512 tokens)"),
])
def test_prompt_limits(world, tmp_path, settings, content, needle):
    from trace_common.env.messages import Message

    async def body(domain):
        with pytest.raises(InvalidArgument) as err:
            await domain.generate(ChatRequest(model="c", messages=[Message.user(content)]))
        return str(err.value)

    assert needle in _run(world, tmp_path, body, **settings)


@pytest.mark.parametrize("body, result", [
    ({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                    {"type": "text", "text": "b"}]}]},
     {"role": "system", "content": "ab"}),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7, "seed": 3,
      "top_k": 5, "temperature": 0.5}, {"max_tokens": 7, "seed": 3, "top_k": 5, "temperature": 0.5}),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": -1}, "seed"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "'temperature'"),
    ([], "JSON object"),
])
def test_openai_body_validation(body, result):
    if isinstance(result, str):
        with pytest.raises((BadRequest, InvalidArgument), match=result.replace("[", r"\[").replace("]", r"\]")):
            chat_request_from_body(body)
        return
    req = chat_request_from_body(body)
    if "role" in result:
        assert (req.messages[0].role, req.messages[0].content) == (result["role"], result["content"])
    else:
        assert {k: getattr(req, k) for k in result} == result
