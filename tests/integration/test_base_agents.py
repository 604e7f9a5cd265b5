"""SmolLM2 from the installed PyPI package: GGUF -> safetensors conversion, cached reload, and real
generation through the in-process policy backend (integration + slow: ~1-2 minutes on 2 cores)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from trace_common.agents import gguf_path, read_meta, smollm2_base_dir
from trace_common.env.messages import Message
from trace_common.policy import PolicyRequest, SamplingParams
from trace_common.policy.transformers_backend import TransformersPolicy

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    cache = tmp_path_factory.mktemp("agents")
    started = time.perf_counter()
    model_dir = smollm2_base_dir(cache)
    return cache, model_dir, time.perf_counter() - started


def test_conversion_writes_a_plain_llama_dir_and_is_cached(converted):
    cache, model_dir, first_seconds = converted
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    meta = read_meta(model_dir)
    assert meta["kind"] == "smollm2-base" and meta["build_seconds"] > 0
    assert meta["metrics"]["parameters"] > 100_000_000
    started = time.perf_counter()
    assert smollm2_base_dir(cache) == model_dir  # second call: the cache, no conversion
    assert time.perf_counter() - started < min(5.0, first_seconds / 2)


def test_converted_weights_match_the_gguf(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, model_dir, _ = converted
    path = gguf_path()
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert type(ours).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        a, b = ref(input_ids=ids).logits[0, -1], ours(input_ids=ids).logits[0, -1]
    assert int(a.argmax()) == int(b.argmax())
    assert torch.allclose(torch.log_softmax(a, -1), torch.log_softmax(b, -1), atol=0.15)  # bf16 storage


def test_reloaded_model_generates_through_the_policy_backend(converted):
    _, model_dir, _ = converted
    policy = TransformersPolicy.from_dir(model_dir)
    assert policy.chat.mode == "hermes"  # SmolLM2's own template knows no tools
    request = PolicyRequest(messages=[Message.user("What is the capital of France? Answer in one word.")],
                            params=SamplingParams(temperature=0.0, max_tokens=12))
    turn = asyncio.run(policy.complete(request))
    assert "Paris" in turn.text
    assert turn.finish_reason in ("stop", "length")
    assert len(turn.logprobs) == len(turn.completion_token_ids) > 0
