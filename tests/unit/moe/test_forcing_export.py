"""Forcing specs, routing traces, and the export helpers (per-request adapter, merged weights)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.moe.conftest import randomize_gates, token_batch
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.moe import MoEConfig, PerRequestChooser, choose_adapter_per_request, merge_single_adapter


@pytest.mark.parametrize("spec,fragment", [
    (4, "0..3"),
    (-1, "0..3"),
    (True, "slot"),
    ([1, 2, 3], "number of layers (2)"),
    (torch.zeros(2, 5), "integer slots"),
    (torch.full((2, 5), 7), "slots in 0..3"),
    (torch.zeros(2, 2, 3, 4, dtype=torch.long), "[L, P] or [L, B, P]"),
])
def test_invalid_forcing_spec_is_rejected(families, spec, fragment):
    model = families["qwen3"].composed()
    with pytest.raises(InvalidArgument) as caught:
        model.set_forcing(spec)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("spec,batch,fragment", [
    (torch.zeros(2, 4, dtype=torch.long), 2, "covering positions 0..5"),  # schedule too short
    (torch.zeros(2, 3, 6, dtype=torch.long), 2, "batch dimension 2"),
])
def test_schedule_that_does_not_fit_the_call_is_rejected(families, spec, batch, fragment):
    model = families["qwen3"].composed()
    with pytest.raises(InvalidArgument, match="force") as caught, model.forced(spec), torch.no_grad():
        model(input_ids=token_batch(batch, 6, seed=0))
    assert fragment in str(caught.value)


@pytest.mark.parametrize("schedule_shape", ["per_layer", "per_position", "per_sequence"])
def test_forced_routing_is_what_the_trace_reports(families, schedule_shape):
    model = families["qwen3"].composed()
    batch, seq = 2, 7
    g = torch.Generator().manual_seed(1)
    if schedule_shape == "per_layer":
        spec = torch.tensor([2, 3])
        expected = spec[:, None, None].expand(2, batch, seq)
    elif schedule_shape == "per_position":
        spec = torch.randint(0, 4, (2, seq), generator=g)
        expected = spec[:, None, :].expand(2, batch, seq)
    else:
        spec = torch.randint(0, 4, (2, batch, seq), generator=g)
        expected = spec
    with torch.no_grad(), model.forced(spec), model.capture_routing() as trace:
        model(input_ids=token_batch(batch, seq, seed=2))
    assert torch.equal(trace.experts(), expected)
    with pytest.raises(FailedPrecondition, match="forced"):
        trace.probs()
    with pytest.raises(FailedPrecondition, match="forced"):
        model.load_balancing_loss()
    assert not model.is_forced  # the context restored the gates


def test_trace_covers_prompt_and_decode_steps(families):
    model = families["llama"].composed()
    randomize_gates(model, seed=1)
    ids = token_batch(3, 5, seed=3)
    with torch.no_grad(), model.capture_routing() as trace:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    assert trace.num_calls == 4  # prefill + 3 decode steps (the last token is never fed back)
    assert trace.experts().shape == (model.num_layers, 3, out.shape[1] - 1)
    probs = trace.probs()  # [L, B, T, K+1]
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    assert torch.equal(probs.argmax(-1), trace.experts())


def _bias_gates(model, per_layer_bias):
    with torch.no_grad():
        for gate, bias in zip(model.gates, per_layer_bias, strict=True):
            gate.weight.zero_()
            gate.bias.copy_(torch.tensor(bias))


@pytest.mark.parametrize("biases,allow_base,slot,fractions", [
    ([[0, 5, 0, 0], [0, 5, 0, 0]], True, 1, [0, 1, 0, 0]),
    ([[0, 0, 4, 0], [0, 0, 0, 5]], True, 3, [0, 0, 0.5, 0.5]),  # tie on fraction -> higher mean prob wins
    ([[5, 0, 0, 1], [5, 0, 0, 2]], True, 0, [1, 0, 0, 0]),
    ([[5, 0, 0, 1], [5, 0, 0, 2]], False, 3, [1, 0, 0, 0]),  # base excluded: best adapter by mean prob
])
def test_choose_adapter_per_request(families, biases, allow_base, slot, fractions):
    model = families["qwen3"].composed()
    _bias_gates(model, biases)
    ids = token_batch(2, 6, seed=4)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    choices = choose_adapter_per_request(model, ids, mask, allow_base=allow_base)
    assert [c.slot for c in choices] == [slot, slot]
    assert choices[0].adapter == (None if slot == 0 else model.adapter_names[slot - 1])
    assert list(choices[1].slot_fractions) == pytest.approx(fractions)


def test_per_request_choice_follows_the_gates_on_content(families):
    """With content-dependent gates, each sequence's choice is the majority slot of its own trace."""
    model = families["qwen3"].composed()
    randomize_gates(model, seed=9)
    ids = token_batch(4, 10, seed=5)
    choices = choose_adapter_per_request(model, ids)
    with torch.no_grad(), model.capture_routing() as trace:
        model(input_ids=ids)
    experts = trace.experts()  # [L, B, T]
    for b, choice in enumerate(choices):
        counts = torch.bincount(experts[:, b].reshape(-1), minlength=model.num_slots)
        assert counts[choice.slot] == counts.max()
        assert sum(choice.slot_fractions) == pytest.approx(1.0)


def _conversation(kind: str) -> tuple[list[list[int]], list[int]]:
    """Prompts sent one after another, and the prompt tokens the chooser may reuse for each."""
    a, b, c = (token_batch(1, n, seed=s)[0].tolist() for n, s in ((40, 11), (30, 12), (50, 13)))
    if kind == "turns":          # one episode: each prompt extends the previous one
        return [a, a + b, a + b + c], [0, 40, 70]
    if kind == "branches":       # two episodes on the same 40-token system prompt
        return [a + b, a + c, a + b + c], [0, 40, 70]
    if kind == "unrelated":      # nothing shared (c's first tokens differ from a's)
        return [a, c], [0, 0]
    return [a + b, (a + b)[:50]], [0, 49]   # a shorter prompt: all but its last token reused


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("kind", ["turns", "branches", "unrelated", "shorter"])
def test_per_request_chooser_matches_the_uncached_choice(families, family, kind):
    """The cached chooser gives choose_adapter_per_request's answer for every prompt of a
    conversation while running only the tokens no earlier prompt covered."""
    model = families[family].composed()
    randomize_gates(model, seed=3)
    chooser = PerRequestChooser(model)
    prompts, reused = _conversation(kind)
    for prompt, expect_reused in zip(prompts, reused, strict=True):
        before = chooser.cache.reused_tokens
        got = chooser.choose(prompt)
        want = choose_adapter_per_request(model, torch.tensor([prompt]))[0]
        assert chooser.cache.reused_tokens - before == expect_reused
        assert got.slot == want.slot
        assert got.slot_fractions == pytest.approx(want.slot_fractions, abs=1e-12)
        assert got.mean_probs == pytest.approx(want.mean_probs, abs=1e-5)


def test_per_request_chooser_drops_its_cache_when_the_gates_change(families):
    model = families["qwen3"].composed()
    randomize_gates(model, seed=3)
    chooser = PerRequestChooser(model)
    prompt = token_batch(1, 60, seed=2)[0].tolist()
    chooser.choose(prompt[:40])
    _bias_gates(model, [[0, 0, 9, 0], [0, 0, 9, 0]])           # every token now goes to slot 2
    got = chooser.choose(prompt)
    assert chooser.cache.reused_tokens == 0
    assert got.slot == 2 and got.slot_fractions == pytest.approx((0, 0, 1, 0))
    with model.forced(1), pytest.raises(FailedPrecondition, match="forced"):
        chooser.choose(prompt)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("slot", [1, 2, 3])
def test_merged_single_adapter_matches_forced_routing(families, family, slot):
    fam = families[family]
    ids = token_batch(2, 9, seed=slot)
    merged = merge_single_adapter(fam.base(), fam.adapter_dirs[slot - 1])
    assert not any("lora" in name for name, _ in merged.named_parameters())
    model = fam.composed()
    with torch.no_grad(), model.forced(slot):
        routed = model(input_ids=ids).logits
    with torch.no_grad():
        folded = merged(input_ids=ids).logits
    assert (routed - folded).abs().max().item() <= 1e-4


def test_merge_refuses_a_composed_base(families):
    fam = families["qwen3"]
    model = fam.composed()
    with pytest.raises(FailedPrecondition, match="remove"):
        merge_single_adapter(model.base, fam.adapter_dirs[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_merge_refuses_half_precision_weights(families, dtype):
    """Half precision cannot hold most of a LoRA delta: merging into it is refused, naming routing."""
    with pytest.raises(InvalidArgument) as err:
        merge_single_adapter(families["qwen3"].base().to(dtype), families["qwen3"].adapter_dirs[0])
    assert err.value.reason.startswith("routing") and "mostly lost" in err.value.reason


def test_dense_soft_baseline_cannot_run_forced(families):
    model = families["qwen3"].composed(MoEConfig(implementation="dense_soft"))
    with torch.no_grad():
        model(input_ids=token_batch(1, 4, seed=0))  # runs with the gates
        with pytest.raises(FailedPrecondition, match="dense_soft"), model.forced(1):
            model(input_ids=token_batch(1, 4, seed=0))
