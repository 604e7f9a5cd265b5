"""Per-linear routed LoRA math: grouped fast path vs the oracle vs a per-token loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from trace_common.moe import (
    LoraFactors,
    build_routing_plan,
    dense_soft_lora_delta,
    routed_lora_grouped_,
    routed_lora_reference,
)

IN, OUT = 24, 40


def _experts(ranks: list[int | None], seed: int, pretransposed: bool = True) -> list[LoraFactors | None]:
    g = torch.Generator().manual_seed(seed)
    table: list[LoraFactors | None] = [None]  # slot 0 = base
    for i, rank in enumerate(ranks):
        if rank is None:
            table.append(None)
            continue
        a, b, s = torch.randn(rank, IN, generator=g), torch.randn(OUT, rank, generator=g), 0.5 + i
        extra = (a.t().contiguous(), (b * s).t().contiguous()) if pretransposed else ()
        table.append(LoraFactors(a, b, s, *extra))
    return table


def _per_token(x, ids, experts):
    rows = []
    for n in range(x.shape[0]):
        factors = experts[int(ids[n])]
        rows.append(torch.zeros(OUT) if factors is None
                    else factors.scaling * factors.lora_B @ (factors.lora_A @ x[n]))
    return torch.stack(rows) if rows else torch.zeros(0, OUT)


ROUTINGS = {
    "mixed": [0, 1, 2, 3, 1, 1, 0, 3, 2, 2, 3],
    "all_base": [0] * 7,
    "sole_adapter": [2] * 9,
    "sole_absent_adapter": [4] * 5,  # adapter 4 does not target this linear
    "absent_and_present": [4, 1, 4, 0, 1],
    "single_token": [3],
    "empty": [],
}


@pytest.mark.parametrize("name", list(ROUTINGS))
@pytest.mark.parametrize("with_st", [False, True])
@pytest.mark.parametrize("pretransposed", [True, False])
@pytest.mark.parametrize("grad_enabled", [True, False])  # out-of-place (autograd) vs buffered inference path
def test_grouped_equals_reference_equals_per_token(name, with_st, pretransposed, grad_enabled):
    experts = _experts([4, 2, 8, None], seed=1, pretransposed=pretransposed)
    ids = torch.tensor(ROUTINGS[name], dtype=torch.long)
    n = ids.numel()
    x = torch.randn(n, IN, generator=torch.Generator().manual_seed(2))
    base = torch.randn(n, OUT, generator=torch.Generator().manual_seed(3))
    st = torch.ones(n) if with_st else None
    plan = build_routing_plan(ids, len(experts), st_factor=st)
    with torch.set_grad_enabled(grad_enabled):
        grouped = routed_lora_grouped_(base.clone(), x, plan, experts)
    reference = base + routed_lora_reference(x, ids, experts, st)
    expected = base + _per_token(x, ids, experts)
    torch.testing.assert_close(grouped, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(reference, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ids,sole,groups", [
    ([0, 0, 0], 0, []),
    ([2, 2], 2, []),
    ([1, 0, 1, 2], None, [(0, [1]), (1, [0, 2]), (2, [3])]),
    ([3, 3, 1], None, [(1, [2]), (3, [0, 1])]),
])
def test_routing_plan_groups_tokens_by_slot(ids, sole, groups):
    plan = build_routing_plan(torch.tensor(ids), 4)
    assert plan.sole_slot == sole
    assert [(slot, index.tolist()) for slot, index in plan.groups] == groups


class _RowCounter(TorchFunctionMode):
    """Counts the rows each LoRA A factor is applied to (F.linear with A, or mm with A^T)."""

    def __init__(self, watched: dict[int, int]):
        super().__init__()
        self.watched = watched  # id(lora_A) or id(A_t) -> slot
        self.rows: dict[int, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.linear, torch.mm) and id(args[1]) in self.watched:
            slot = self.watched[id(args[1])]
            self.rows[slot] = self.rows.get(slot, 0) + args[0].shape[0]
        return func(*args, **kwargs)


@pytest.mark.parametrize("ids", [[1, 2, 3, 1, 0, 0, 2, 1], [3] * 6, [0, 0, 2], [1, 2, 3, 4, 4, 1]])
def test_grouped_path_runs_each_adapter_only_on_its_tokens(ids):
    experts = _experts([4, 2, 8, 3], seed=4)
    ids_t = torch.tensor(ids)
    x = torch.randn(len(ids), IN)
    watched = {id(f.lora_A): slot for slot, f in enumerate(experts) if f is not None}
    watched.update({id(f.A_t): slot for slot, f in enumerate(experts) if f is not None})
    counter = _RowCounter(watched)
    with counter:
        routed_lora_grouped_(torch.zeros(len(ids), OUT), x, build_routing_plan(ids_t, len(experts)), experts)
    expected = {slot: ids.count(slot) for slot in set(ids) if slot != 0}
    assert counter.rows == expected  # sum over adapters == routed tokens, never K x N


@pytest.mark.parametrize("seed", [0, 1])
def test_dense_soft_baseline_weights_every_adapter(seed):
    experts = _experts([4, 2, None], seed=seed)
    x = torch.randn(5, IN)
    probs = torch.softmax(torch.randn(5, len(experts)), -1)
    expected = sum(probs[:, k:k + 1] * f.scaling * (x @ f.lora_A.T @ f.lora_B.T)
                   for k, f in enumerate(experts) if f is not None)
    torch.testing.assert_close(dense_soft_lora_delta(x, probs, experts), expected)


def test_sorted_gather_is_shared_by_linears_reading_the_same_input():
    experts = _experts([4, 2], seed=5)
    ids = torch.tensor([2, 1, 0, 1, 2])
    plan = build_routing_plan(ids, len(experts))
    x = torch.randn(1, 5, IN)  # [B, T, in] as a projection receives it
    first = routed_lora_grouped_(torch.zeros(5, OUT), x, plan, experts)
    gathered = plan.sorted_input[1]
    second = routed_lora_grouped_(torch.zeros(5, OUT), x, plan, experts)
    assert plan.sorted_input[1] is gathered  # q/k/v-style reuse: one gather for the same tensor
    torch.testing.assert_close(first, second)
    routed_lora_grouped_(torch.zeros(5, OUT), x.clone(), plan, experts)
    assert plan.sorted_input[1] is not gathered  # a different input tensor is gathered afresh
