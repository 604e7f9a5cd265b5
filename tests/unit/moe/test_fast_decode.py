"""The gathered small-batch path (decode steps) against the reference math and the grouped path."""

from __future__ import annotations

import pytest
import torch

from tests.unit.moe.conftest import randomize_gates, token_batch
from trace_common.moe import ComposedMoEModel, MoEConfig, routed_lora_gathered_, routed_lora_reference
from trace_common.moe.routed_lora import LayerRouting, RoutedLoraLinear

IN, OUT = 24, 40
TOL = 1e-5


def _linear(ranks: list[int | None], seed: int, dtype=torch.float32) -> tuple[RoutedLoraLinear, dict]:
    """A routed linear whose slot k (1-based) has rank ranks[k-1]; None = adapter absent here."""
    g = torch.Generator().manual_seed(seed)
    factors = {}
    for slot, rank in enumerate(ranks, start=1):
        if rank is not None:
            factors[slot] = (torch.randn(rank, IN, generator=g, dtype=dtype),
                             torch.randn(OUT, rank, generator=g, dtype=dtype), 0.25 * slot)
    return RoutedLoraLinear("lin", LayerRouting(0), len(ranks) + 1, factors, "grouped", "delta"), factors


def _per_token(x: torch.Tensor, ids: list[int], factors: dict) -> torch.Tensor:
    rows = []
    for n, slot in enumerate(ids):
        if slot in factors:
            lora_A, lora_B, scaling = factors[slot]
            rows.append(scaling * lora_B @ (lora_A @ x[n]))
        else:  # base slot or an adapter that does not target this linear
            rows.append(torch.zeros(OUT, dtype=x.dtype))
    return torch.stack(rows) if rows else torch.zeros(0, OUT, dtype=x.dtype)


RANKS = {
    "equal_ranks": [4, 4, 4],
    "mixed_ranks_padded": [4, 2, 8],
    "absent_adapter": [4, None, 8],
}
ROUTINGS = {
    "decode_batch_distinct": [1, 2, 3, 0],
    "all_base": [0, 0, 0],
    "one_adapter": [2, 2, 2, 2],
    "absent_only": [2, 2],
    "repeated_mix": [3, 1, 3, 0, 1, 2, 2, 3],
    "single_token": [3],
    "empty": [],
}


@pytest.mark.parametrize("ranks", list(RANKS))
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_gathered_equals_reference_and_per_token(ranks, routing):
    linear, factors = _linear(RANKS[ranks], seed=1)
    ids = ROUTINGS[routing]
    ids_t = torch.tensor(ids, dtype=torch.long)
    x = torch.randn(len(ids), IN, generator=torch.Generator().manual_seed(2))
    base = torch.randn(len(ids), OUT, generator=torch.Generator().manual_seed(3))
    gathered = routed_lora_gathered_(base.clone(), x, ids_t, linear.A_t_stack, linear.B_t_stack)
    reference = base + routed_lora_reference(x, ids_t, linear.experts)
    expected = base + _per_token(x, ids, factors)
    torch.testing.assert_close(gathered, expected, rtol=TOL, atol=TOL)
    torch.testing.assert_close(reference, expected, rtol=TOL, atol=TOL)
    on_base = [n for n, slot in enumerate(ids) if slot not in factors]
    assert torch.equal(gathered[on_base], base[on_base])  # base / absent slots add exactly nothing


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.bfloat16, 5e-2)])
def test_stack_views_follow_dtype_conversion(dtype, tol):
    linear, _ = _linear(RANKS["mixed_ranks_padded"], seed=5)
    linear = linear.to(dtype)
    assert linear.A_t_stack.dtype == dtype
    for factors in linear.experts[1:]:  # the grouped path's factors are views into the converted stacks
        assert factors.A_t.untyped_storage().data_ptr() == linear.A_t_stack.untyped_storage().data_ptr()
        assert factors.scaled_B_t.untyped_storage().data_ptr() == linear.B_t_stack.untyped_storage().data_ptr()
    ids = torch.tensor([1, 3, 2, 0])
    x = torch.randn(4, IN, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).to(dtype)
    gathered = routed_lora_gathered_(torch.zeros(4, OUT, dtype=dtype), x, ids, linear.A_t_stack, linear.B_t_stack)
    reference = routed_lora_reference(x, ids, linear.experts)
    assert (gathered.double() - reference.double()).abs().max().item() <= tol * reference.abs().max().item()


def _composed(fam, **config) -> ComposedMoEModel:
    model = fam.composed(MoEConfig(**config))
    randomize_gates(model, seed=3)
    return model


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("batch,seq,max_tokens,grad,expect_gathered", [
    (4, 1, 8, False, True),  # a decode step of 4 sequences
    (1, 1, 8, False, True),
    (2, 4, 8, False, True),  # exactly at the threshold
    (3, 3, 8, False, False),  # 9 tokens: grouped
    (4, 1, 0, False, False),  # disabled
    (4, 1, 8, True, False),  # gradients on: grouped (straight-through factor)
])
def test_model_takes_gathered_path_only_when_it_should_and_matches(families, family, batch, seq, max_tokens,
                                                                    grad, expect_gathered):
    fam = families[family]
    ids = token_batch(batch, seq, seed=7)
    model = _composed(fam, gathered_max_tokens=max_tokens)
    with torch.set_grad_enabled(grad):
        ours = model(input_ids=ids).logits
    assert all(routing.plan.gathered == expect_gathered for routing in model._routing)
    reference = _composed(fam, implementation="reference")
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
    assert (ours.detach() - expected).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_generate_decodes_the_same_with_and_without_gathered_path(families, family):
    ids = token_batch(4, 6, seed=8)
    outputs, traces = {}, {}
    for max_tokens in (0, 8):
        model = _composed(families[family], gathered_max_tokens=max_tokens)
        with torch.no_grad(), model.capture_routing() as trace:
            outputs[max_tokens] = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                                                 min_new_tokens=5, do_sample=False, output_logits=True,
                                                 return_dict_in_generate=True, pad_token_id=0)
        traces[max_tokens] = trace.experts()
    assert torch.equal(outputs[0].sequences, outputs[8].sequences)
    assert torch.equal(traces[0], traces[8])
    assert traces[8].unique().numel() >= 2  # routing really mixes slots across decode steps
    diff = max((a - b).abs().max().item() for a, b in zip(outputs[0].logits, outputs[8].logits, strict=True))
    assert diff <= TOL


@pytest.mark.parametrize("slot", [0, 2])
def test_forced_decode_step_keeps_the_sole_slot_path(families, slot):
    fam = families["qwen3"]
    model = _composed(fam)
    ids = token_batch(4, 1, seed=9)
    with torch.no_grad(), model.forced(slot):
        ours = model(input_ids=ids).logits
    assert all(not routing.plan.gathered and routing.plan.sole_slot == slot for routing in model._routing)
    with torch.no_grad():
        expected = (fam.base() if slot == 0 else fam.peft(slot))(input_ids=ids).logits
    if slot == 0:
        assert torch.equal(ours, expected)  # forced base is exactly the base
    else:
        assert (ours - expected).abs().max().item() <= TOL
