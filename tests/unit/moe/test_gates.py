"""Gate training surface: only gates get gradients, straight-through, load balancing, parameter count."""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.moe.conftest import build_base, randomize_gates, save_adapter, tiny_config, token_batch
from trace_common.errors import InvalidArgument
from trace_common.moe import (
    ComposedMoEModel,
    MoEConfig,
    gate_param_count,
    load_balancing_loss,
    load_lora_adapter,
    straight_through_factor,
)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("straight_through", ["delta", "output"])
@pytest.mark.parametrize("implementation", ["grouped", "reference"])
def test_only_gates_receive_gradients(families, family, straight_through, implementation):
    model = families[family].composed(MoEConfig(implementation=implementation, straight_through=straight_through))
    randomize_gates(model, seed=2)
    ids = token_batch(2, 10, seed=1)
    out = model(input_ids=ids, labels=ids)
    (out.loss + 0.01 * model.load_balancing_loss()).backward()
    for name, param in model.base.named_parameters():
        assert param.grad is None, name
    for name, param in model.routed.named_parameters():
        assert not param.requires_grad and param.grad is None, name
    assert [p.requires_grad for p in model.parameters()].count(True) == 2 * model.num_layers
    for layer, gate in enumerate(model.gates):
        for param in (gate.weight, gate.bias):
            assert param.grad is not None and torch.isfinite(param.grad).all(), layer
            assert param.grad.abs().sum() > 0, layer


@pytest.mark.parametrize("straight_through", ["delta", "output"])
def test_straight_through_gradient_is_nonzero_finite_and_matches_reference(families, straight_through):
    """The task-loss gradient reaches every gate, and the grouped path's gradient equals the oracle's."""
    grads = {}
    for implementation in ("grouped", "reference"):
        model = families["qwen3"].composed(MoEConfig(implementation=implementation,
                                                     straight_through=straight_through))
        randomize_gates(model, seed=6)
        ids = token_batch(3, 9, seed=8)
        model(input_ids=ids, labels=ids).loss.backward()  # task loss only, no balancing term
        grads[implementation] = torch.cat([p.grad.reshape(-1) for p in model.gate_parameters()])
    assert torch.isfinite(grads["grouped"]).all()
    assert grads["grouped"].abs().max() > 0
    torch.testing.assert_close(grads["grouped"], grads["reference"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("logits,chosen", [
    ([[2.0, 0.0, -1.0]], [0]),
    ([[0.1, 0.3, 0.2], [-3.0, 4.0, 0.0]], [1, 1]),
    ([[1.0, 1.0, 5.0, 0.0]], [2]),
])
def test_straight_through_factor_is_one_with_softmax_gradient(logits, chosen):
    logits = torch.tensor(logits, requires_grad=True)
    ids = torch.tensor(chosen)
    factor = straight_through_factor(logits, ids)
    assert torch.equal(factor.detach(), torch.ones(len(chosen)))
    weights = torch.arange(1, len(chosen) + 1, dtype=torch.float32)
    (factor * weights).sum().backward()
    probs = torch.softmax(logits.detach(), dim=-1)
    expected = weights[:, None] * (torch.nn.functional.one_hot(ids, logits.shape[1]) - probs)  # d log p_e
    torch.testing.assert_close(logits.grad, expected)


# Hand-computed Switch terms: S * sum_i f_i * P_i
LB_CASES = [
    # probs, mask, expected
    ([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]], None,
     3 * (0.5 * 0.375 + 0.25 * 0.3125 + 0.25 * 0.3125)),  # = 1.03125
    ([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]], [1, 1, 1, 0],
     3 * ((2 / 3) * (1.3 / 3) + (1 / 3) * (1.05 / 3))),  # padding excluded
    ([[0.9, 0.1], [0.8, 0.2]], None, 2 * (1.0 * 0.85)),  # collapsed onto slot 0
    ([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]], None, 1.0),  # perfectly balanced
]


@pytest.mark.parametrize("probs,mask,expected", LB_CASES)
def test_load_balancing_loss_hand_computed(probs, mask, expected):
    probs = torch.tensor(probs)
    ids = probs.argmax(-1)
    token_mask = None if mask is None else torch.tensor(mask, dtype=torch.bool)
    assert load_balancing_loss(probs, ids, token_mask).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("bias", [[0.0, 2.0, 0.0, -1.0], [1.5, 0.0, 0.5, 0.5], [-1.0, 0.0, 0.0, 3.0]])
def test_composed_load_balancing_loss_with_constant_gates(families, bias):
    """Zero gate weights: every token gets softmax(bias); the term is S * softmax(bias)[argmax]."""
    model = families["qwen3"].composed()
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.zero_()
            gate.bias.copy_(torch.tensor(bias))
    ids = token_batch(2, 7, seed=0)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    model(input_ids=ids, attention_mask=mask)
    expected = len(bias) * torch.softmax(torch.tensor(bias), -1).max().item()
    assert model.load_balancing_loss().item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("layers,hidden,adapters,expected", [
    (48, 2048, 4, 491_760),  # docs/design.md "MoE composition": Qwen3-30B-A3B, 4 adapters + base slot
    (2, 64, 1, 2 * (64 * 2 + 2)),
    (3, 128, 2, 3 * (128 * 3 + 3)),
    (4, 64, 3, 4 * (64 * 4 + 4)),
])
def test_gate_param_count_formula(layers, hidden, adapters, expected):
    assert gate_param_count(layers, hidden, adapters) == expected


@pytest.mark.parametrize("layers,hidden,num_adapters", [(2, 64, 1), (3, 128, 2), (4, 64, 3)])
def test_composed_gate_parameter_count(tmp_path, layers, hidden, num_adapters):
    config = tiny_config("qwen3", layers=layers, hidden=hidden)
    directory = save_adapter(build_base(config), tmp_path / "a", seed=1, r=2, lora_alpha=2,
                             target_modules=["q_proj", "down_proj"])
    base = build_base(config)
    adapter = load_lora_adapter(directory, base)
    adapters = [adapter.__class__(name=f"cap{i}", source=adapter.source, modules=adapter.modules)
                for i in range(num_adapters)]
    model = ComposedMoEModel(base, adapters)
    expected = layers * (hidden * (num_adapters + 1) + (num_adapters + 1))
    report = model.parameter_report()
    assert model.num_gate_parameters() == expected == report["gate"] == report["trainable"]
    assert report["adapter_frozen"] == num_adapters * sum(
        w.lora_A.numel() + w.lora_B.numel() for w in adapter.modules.values())
    assert math.isclose(report["base_frozen"], sum(p.numel() for p in base.parameters()))


def test_gate_state_roundtrip_and_shape_check(families):
    model = families["qwen3"].composed()
    randomize_gates(model, seed=3)
    state = model.gate_state_dict()
    other = families["qwen3"].composed()
    other.load_gate_state_dict(state)
    ids = token_batch(1, 6, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, other(input_ids=ids).logits)
    smaller = families["qwen3"].composed(num_adapters=2)
    with pytest.raises(InvalidArgument, match="gate state"):
        smaller.load_gate_state_dict(state)
