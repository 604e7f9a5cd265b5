"""Soft per-trajectory routing (trace_common.moe.soft_routing): the mixture math by hand, the model
against an independent PEFT reference, one-hot weights against forcing, and generation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from peft import PeftModel

from tests.unit.moe.conftest import randomize_gates, token_batch
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.moe.gating import trajectory_mixture
from trace_common.moe.soft_routing import generate_soft_batch
from trace_common.policy.generation import RowParams, generate_batch

TOL = 1e-5
FAMILIES = ["qwen3", "llama"]


@pytest.mark.parametrize("probs, mask, expected", [
    ([[[0.5, 0.5], [1.0, 0.0]]], None, [[0.75, 0.25]]),
    ([[[0.5, 0.5], [1.0, 0.0]]], [[False, True]], [[1.0, 0.0]]),             # padding left out of the mean
    ([[[0.2, 0.8], [0.6, 0.4], [0.1, 0.9]], [[0.0, 1.0], [0.3, 0.7], [0.9, 0.1]]],
     [[True, True, True], [False, True, True]], [[0.3, 0.7], [0.6, 0.4]]),   # one row per sequence
])
def test_trajectory_mixture_hand_computed(probs, mask, expected):
    mask_t = None if mask is None else torch.tensor(mask)
    got = trajectory_mixture(torch.tensor(probs), mask_t)
    torch.testing.assert_close(got, torch.tensor(expected))


def test_trajectory_mixture_refuses_an_empty_sequence():
    with pytest.raises(InvalidArgument, match="no token"):
        trajectory_mixture(torch.full((2, 3, 2), 0.5), torch.tensor([[True, True, True], [False, False, False]]))


# ---- the reference: PEFT with every adapter active and each layer's lora_B scaled by its weight ---------
def _peft_all_adapters(fam):
    model = PeftModel.from_pretrained(fam.base(), str(fam.adapter_dirs[0]), adapter_name="s1")
    for k, directory in enumerate(fam.adapter_dirs[1:], start=2):
        model.load_adapter(str(directory), adapter_name=f"s{k}")
    model.base_model.set_adapter([f"s{k}" for k in range(1, len(fam.adapter_dirs) + 1)])
    originals = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_B") and ".layers." in name:
            layer = int(name.split(".layers.")[1].split(".")[0])
            for adapter, linear in module.lora_B.items():
                originals[(layer, adapter, name)] = (linear, linear.weight.detach().clone())
    return model.eval(), originals


def _scale_layers(originals, weights: torch.Tensor) -> None:
    """lora_B of adapter s<k> at layer l <- w[l, k] * its own value (PEFT then sums the active adapters)."""
    with torch.no_grad():
        for (layer, adapter, _), (linear, value) in originals.items():
            linear.weight.copy_(value * float(weights[layer, int(adapter[1:])]))


def _reference(fam, gates, prompt: torch.Tensor, continuation: torch.Tensor):
    """(weights [L, K+1], logits [T+C, V]) for one unpadded sequence, layer by layer: layer l's
    weights from hidden_states[l] (its input) computed with the weights of the layers below."""
    model, originals = _peft_all_adapters(fam)
    num_layers, slots = len(gates), gates[0].out_features
    weights = torch.zeros(num_layers, slots)
    with torch.no_grad():
        for layer in range(num_layers):
            _scale_layers(originals, weights)  # layers >= `layer` still 0: they do not reach its input
            hidden = model(input_ids=prompt[None], output_hidden_states=True).hidden_states[layer][0]  # [T, H]
            probs = F.softmax(F.linear(hidden, gates[layer].weight, gates[layer].bias), dim=-1)  # [T, K+1]
            weights[layer] = probs.mean(0)
        _scale_layers(originals, weights)
        logits = model(input_ids=torch.cat([prompt, continuation])[None]).logits[0]
    return weights, logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_soft_trajectory_matches_the_peft_reference(families, family, padded):
    fam = families[family]
    model = fam.composed()
    randomize_gates(model, seed=3, scale=6.0)
    prompts = token_batch(2, 9, seed=5)
    continuation = token_batch(2, 4, seed=6)
    mask = torch.ones_like(prompts)
    if padded:
        mask[1, :4] = 0  # left padding, as a batched server sends a shorter prompt
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    from trace_common.policy.generation import new_kv_cache

    cache = new_kv_cache(model.base)
    with torch.no_grad(), model.soft_trajectory() as mix:
        first = model(input_ids=prompts, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).logits
        full_mask = torch.cat([mask, torch.ones_like(continuation)], dim=1)
        cont_pos = positions[:, -1:] + 1 + torch.arange(continuation.shape[1])
        second = model(input_ids=continuation, attention_mask=full_mask, position_ids=cont_pos, cache=cache,
                       use_cache=True).logits
    weights = mix.weights()  # [L, B, K+1]
    for row in range(2):
        keep = mask[row].bool()
        ref_w, ref_logits = _reference(fam, model.gates, prompts[row][keep], continuation[row])
        torch.testing.assert_close(weights[:, row], ref_w, rtol=TOL, atol=TOL)
        ours = torch.cat([first[row][keep], second[row]])
        assert (ours - ref_logits).abs().max().item() <= TOL
    assert weights[:, 0].max() < 0.99  # a real mixture: no slot takes everything
    assert (weights[:, 0] - weights[:, 1]).abs().max() > 1e-3  # each request gets its own weights


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("slot", [0, 1, 2, 3])
def test_one_hot_weights_equal_forcing_that_slot(families, family, slot):
    fam = families[family]
    model = fam.composed()
    randomize_gates(model, seed=1)
    ids = token_batch(2, 8, seed=slot)
    one_hot = F.one_hot(torch.full((model.num_layers,), slot), model.num_slots).float()  # [L, K+1]
    with torch.no_grad():
        with model.mixing(one_hot):
            mixed = model(input_ids=ids).logits
        with model.forced(slot):
            forced = model(input_ids=ids).logits
    assert (mixed - forced).abs().max().item() <= TOL


@pytest.mark.parametrize("slot", [0, 2])
def test_soft_generation_with_one_hot_gates_equals_forced_generation(families, slot):
    """Gates whose bias puts all the softmax mass on `slot` give weights e_slot at every layer, so
    soft generation is the forced one token for token."""
    fam = families["qwen3"]
    model = fam.composed()
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.zero_()
            gate.bias.fill_(-200.0)
            gate.bias[slot] = 200.0
    prompts = [token_batch(1, 7, seed=2)[0].tolist(), token_batch(1, 4, seed=3)[0].tolist()]
    params = [RowParams(temperature=0.0, max_tokens=6), RowParams(temperature=1.0, max_tokens=5, seed=11)]
    soft, weights = generate_soft_batch(model, prompts, params, stop_ids=[], pad_id=0)
    with model.forced(slot):
        forced = generate_batch(model.base, prompts, params, stop_ids=[], pad_id=0)
    assert [o.token_ids for o in soft] == [o.token_ids for o in forced]
    torch.testing.assert_close(weights, F.one_hot(torch.full((model.num_layers, 2), slot), model.num_slots).float())


def test_a_soft_row_does_not_depend_on_its_batch_mates(families):
    fam = families["llama"]
    model = fam.composed()
    randomize_gates(model, seed=7, scale=6.0)
    prompts = [token_batch(1, 9, seed=4)[0].tolist(), token_batch(1, 5, seed=8)[0].tolist()]
    params = [RowParams(temperature=0.0, max_tokens=5), RowParams(temperature=0.0, max_tokens=3)]
    together, w_both = generate_soft_batch(model, prompts, params, stop_ids=[], pad_id=0)
    for row in range(2):
        alone, w_alone = generate_soft_batch(model, [prompts[row]], [params[row]], stop_ids=[], pad_id=0)
        assert alone[0].token_ids == together[row].token_ids
        assert len(together[row].token_ids) == params[row].max_tokens
        torch.testing.assert_close(w_alone[:, 0], w_both[:, row], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("case, error, needle", [
    ("force_inside_mixing", FailedPrecondition, "forcing cannot be combined"),
    ("mixing_inside_force", FailedPrecondition, "cannot be combined with forcing"),
    ("weights_wrong_layers", InvalidArgument, "shaped [L=2"),
    ("weights_wrong_slots", InvalidArgument, "slots (K+1)"),
    ("weights_not_a_distribution", InvalidArgument, "summing to 1"),
    ("weights_before_forward", FailedPrecondition, "no forward ran"),
    ("batch_changes_inside_block", FailedPrecondition, "its own soft_trajectory() block"),
])
def test_soft_routing_misuse_is_refused(families, case, error, needle):
    model = families["qwen3"].composed()
    ids = token_batch(2, 5, seed=0)
    uniform = torch.full((model.num_layers, model.num_slots), 1.0 / model.num_slots)
    with pytest.raises(error) as err, torch.no_grad():
        if case == "force_inside_mixing":
            with model.mixing(uniform), model.forced(1):
                pass
        elif case == "mixing_inside_force":
            with model.forced(1), model.soft_trajectory():
                pass
        elif case == "weights_wrong_layers":
            with model.mixing(torch.full((3, model.num_slots), 0.25)):
                pass
        elif case == "weights_wrong_slots":
            with model.mixing(torch.full((model.num_layers, 2), 0.5)):
                pass
        elif case == "weights_not_a_distribution":
            with model.mixing(torch.full((model.num_layers, model.num_slots), 0.5)):
                pass
        elif case == "weights_before_forward":
            with model.soft_trajectory() as mix:
                mix.weights()
        else:
            with model.soft_trajectory():
                model(input_ids=ids)
                model(input_ids=ids[:1])
    assert needle in str(err.value)
    assert not model.is_mixing and not model.is_forced  # every block restored the gates
