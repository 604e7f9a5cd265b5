"""In-process backend on a tiny random Qwen3 model built in code: token data, logprobs against a
plain forward pass, seeds, batch independence, request batching, prefix cache, adapters."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.unit.policy.helpers import store_trajectories, tiny_model, tiny_tokenizer
from trace_common.env.messages import Message
from trace_common.errors import ContextExhausted
from trace_common.policy.base import PolicyRequest, SamplingParams
from trace_common.policy.generation import RowParams, generate_batch, sample_tokens
from trace_common.policy.transformers_backend import TransformersPolicy


def conversation(i: int = 0) -> tuple[list[Message], list[dict]]:
    traj = store_trajectories()[i]
    cut = [k for k, m in enumerate(traj.messages) if m.role == "assistant"][1]  # before the 2nd reply
    return list(traj.messages[:cut]), list(traj.tools)


def make_policy(**kwargs) -> TransformersPolicy:
    return TransformersPolicy.from_model(tiny_model(), tiny_tokenizer(), name="tiny", **kwargs)


def run(coro):
    return asyncio.run(coro)


def request(i: int = 0, **params) -> PolicyRequest:
    messages, tools = conversation(i)
    params.setdefault("max_tokens", 12)
    return PolicyRequest(messages=messages, tools=tools, params=SamplingParams(**params))


def full_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature  # [T, V]
    logp = torch.log_softmax(logits, -1)
    start = len(prompt) - 1
    return [float(logp[start + j, tok]) for j, tok in enumerate(completion)]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_turn_carries_aligned_token_data_and_exact_logprobs(temperature):
    policy = make_policy()
    params = {"temperature": temperature, "seed": 3, "max_tokens": 10}
    turns = run(policy.generate([request(0, **params), request(1, **params), request(2, **params)]))
    for turn in turns:
        assert turn.message.role == "assistant"
        assert len(turn.completion_token_ids) == len(turn.logprobs) == turn.completion_tokens
        assert 1 <= len(turn.completion_token_ids) <= 10
        assert turn.finish_reason in ("stop", "length")
        assert turn.prompt_token_ids == policy.encode(policy.render(request(turns.index(turn))))
        ref = full_logprobs(policy.model, turn.prompt_token_ids, turn.completion_token_ids,
                            temperature if temperature > 0 else 1.0)
        assert turn.logprobs == pytest.approx(ref, abs=2e-4)
    assert policy.stats.requests == 3


def test_greedy_matches_hf_generate():
    policy = make_policy()
    turn = run(policy.complete(request(0, temperature=0.0, max_tokens=8)))
    ids = torch.tensor([turn.prompt_token_ids])
    ref = policy.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8,
                                eos_token_id=policy.stop_ids, pad_token_id=policy.pad_id)[0, ids.shape[1]:]
    assert turn.completion_token_ids == ref.tolist()


def test_same_seed_same_reply_other_seed_other_reply():
    policy = make_policy()
    a = run(policy.complete(request(0, seed=11, max_tokens=16)))
    b = run(policy.complete(request(0, seed=11, max_tokens=16)))
    c = run(policy.complete(request(0, seed=12, max_tokens=16)))
    assert a.completion_token_ids == b.completion_token_ids
    assert a.completion_token_ids != c.completion_token_ids


def test_reply_does_not_depend_on_batch_mates():
    policy = make_policy()
    alone = run(policy.complete(request(1, seed=5, max_tokens=16)))
    mixed = run(policy.generate([request(0, seed=1, max_tokens=3), request(1, seed=5, max_tokens=16),
                                 request(2, seed=9, max_tokens=30, temperature=0.5, top_k=5)]))
    assert mixed[1].completion_token_ids == alone.completion_token_ids
    assert mixed[1].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert len(mixed[0].completion_token_ids) <= 3


def test_concurrent_requests_are_batched():
    policy = make_policy(max_batch=8, max_wait_s=0.05)

    async def many():
        return await asyncio.gather(*(policy.complete(request(i % 3, seed=i, max_tokens=4)) for i in range(6)))

    turns = run(many())
    assert len(turns) == 6
    assert sum(policy.batch_sizes) == 6
    assert max(policy.batch_sizes) > 1


def test_max_batch_bounds_batches():
    policy = make_policy(max_batch=2, max_wait_s=0.05)
    run(policy.generate([request(i % 3, seed=i, max_tokens=2) for i in range(5)]))
    assert policy.batch_sizes and max(policy.batch_sizes) <= 2 and sum(policy.batch_sizes) == 5


def test_prefix_cache_is_used_and_changes_nothing():
    cached = make_policy()
    plain = make_policy(prefix_cache_bytes=0)
    reqs = [request(i, seed=i, max_tokens=8) for i in range(3)]
    first = run(cached.generate(reqs))
    second = run(cached.generate(reqs))  # served from the cached shared prefix
    ref = run(plain.generate(reqs))
    assert cached.prefix_cache.hits >= 1
    assert plain.prefix_cache.hits == 0
    for x, y, z in zip(first, second, ref, strict=True):
        assert x.completion_token_ids == y.completion_token_ids == z.completion_token_ids
        assert x.logprobs == pytest.approx(z.logprobs, abs=1e-4)


def test_prefix_cache_is_dropped_when_weights_change():
    policy = make_policy()
    req = request(0, temperature=0.0, max_tokens=6)
    run(policy.complete(req))
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)  # in-place update, as an optimizer step does
    after = run(policy.complete(req))
    ref = full_logprobs(policy.model, after.prompt_token_ids, after.completion_token_ids)
    assert after.logprobs == pytest.approx(ref, abs=2e-4)


def test_prompt_longer_than_context_fails_only_that_request():
    policy = make_policy(max_context=200)
    short = PolicyRequest(messages=[Message.user("hi")], params=SamplingParams(max_tokens=4, seed=0))
    with pytest.raises(ContextExhausted, match="context"):
        run(policy.generate([short, request(0)]))
    turn = run(policy.complete(short))
    assert len(turn.completion_token_ids) <= 4


def test_stop_token_ends_the_reply_and_is_kept():
    model = tiny_model()
    prompt = [[5, 6, 7, 8]]
    out = generate_batch(model, prompt, [RowParams(temperature=1.0, max_tokens=20, seed=0)],
                         stop_ids=list(range(model.config.vocab_size)), pad_id=0)
    assert out[0].finish_reason == "stop" and len(out[0].token_ids) == 1


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "uniform", "expected"), [
    (0.0, 0, 1.0, 0.99, 1),      # greedy ignores the draw
    (1.0, 1, 1.0, 0.99, 1),      # top_k=1 is greedy
    (1.0, 0, 0.5, 0.99, 1),      # nucleus 0.5 keeps only the top token (p=0.6)
    (1.0, 0, 1.0, 0.0, 0),       # inverse CDF: u=0 -> first token with mass
    (1.0, 0, 1.0, 0.999999, 2),  # u near 1 -> last token with mass
    (1.0, 2, 1.0, 0.999999, 1),  # top_k=2 keeps tokens 0 and 1: cdf [1/3, 1, 1] -> u~1 lands on token 1
    (1.0, 2, 1.0, 0.3, 0),       # ... and u < 1/3 on token 0
], ids=["greedy", "top_k=1", "top_p", "u=0", "u~1", "top_k=2 upper", "top_k=2 lower"])
def test_sample_tokens_table(temperature, top_k, top_p, uniform, expected):
    probs = torch.tensor([[0.3, 0.6, 0.1]])
    token, logprob = sample_tokens(probs.log(), torch.tensor([temperature]), torch.tensor([top_k]),
                                   torch.tensor([top_p]), torch.tensor([uniform]))
    assert int(token) == expected
    assert float(logprob) == pytest.approx(float(probs[0, expected].log()), abs=1e-5)


def test_from_dir_with_lora_adapter_merged_equals_unmerged(tmp_path):
    from peft import LoraConfig, get_peft_model

    model, tok = tiny_model(), tiny_tokenizer()
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    merged = TransformersPolicy.from_dir(tmp_path / "base", adapter_dir=tmp_path / "adapter")
    unmerged = TransformersPolicy.from_dir(tmp_path / "base", adapter_dir=tmp_path / "adapter", merge_adapter=False)
    base = TransformersPolicy.from_dir(tmp_path / "base")
    req = request(0, temperature=0.0, max_tokens=8)
    a, b, c = (run(p.complete(req)) for p in (merged, unmerged, base))
    assert merged.adapter == str(tmp_path / "adapter")
    assert a.completion_token_ids == b.completion_token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert a.logprobs != pytest.approx(c.logprobs, abs=1e-4)  # the adapter does change the model


def test_a_half_precision_model_keeps_its_adapter_unmerged(tmp_path):
    """bfloat16 cannot hold most of a LoRA delta, so from_dir applies the adapter unmerged (PEFT) there."""
    from peft import LoraConfig, PeftModel, get_peft_model

    model, tok = tiny_model(), tiny_tokenizer()
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                     init_lora_weights=False)).save_pretrained(tmp_path / "adapter")
    half = TransformersPolicy.from_dir(tmp_path / "base", adapter_dir=tmp_path / "adapter", dtype="bfloat16")
    full = TransformersPolicy.from_dir(tmp_path / "base", adapter_dir=tmp_path / "adapter")
    assert isinstance(half.model, PeftModel) and not isinstance(full.model, PeftModel)


def test_next_turn_reuses_the_rows_own_kv_and_stays_exact():
    """Turn 2 of two episodes starts with turn 1's prompt + reply: those tokens come from the
    cache (different lengths per row, holes in the batch), the third row is cold."""
    policy = make_policy()
    first = run(policy.generate([request(0, seed=1, max_tokens=5), request(1, seed=2, max_tokens=9)]))
    follow = []
    for i, turn in enumerate(first):
        messages, tools = conversation(i)
        messages = messages + [turn.message, Message.user("and then?")]
        follow.append(PolicyRequest(messages=messages, tools=tools, params=SamplingParams(seed=3, max_tokens=6)))
    before = policy.prefix_cache.reused_tokens
    second = run(policy.generate([*follow, request(2, seed=4, max_tokens=6)]))
    reused = policy.prefix_cache.reused_tokens - before
    assert reused > sum(len(t.prompt_token_ids) for t in first)  # both rows resumed from their own turn 1
    for turn in second:
        ref = full_logprobs(policy.model, turn.prompt_token_ids, turn.completion_token_ids)
        assert turn.logprobs == pytest.approx(ref, abs=2e-4)
