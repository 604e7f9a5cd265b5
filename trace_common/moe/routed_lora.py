"""Routed LoRA on one linear layer: y = W x + s_e * B_e A_e x with e chosen per token.

Three implementations of the same per-linear math live here:

* `routed_lora_reference` -- the oracle: every expert's delta on every token, kept only where
  the token chose that expert. Obviously correct, costs K adapter passes; tests only.
* `routed_lora_grouped_` -- the fast path: tokens are grouped by expert once per layer
  (`RoutingPlan`: a stable sort by expert id), each linear gathers its input into that order once
  (shared by linears reading the same tensor), each expert's two small matmuls run on its own
  contiguous segment only, and one `index_add_` by the sort order puts the deltas back (one
  scatter per linear, not one per expert). When one expert owns every token (forced
  routing, per-request export, many decode steps) the grouping is skipped entirely. Plain torch
  ops, so the same code runs on CPU and GPU.
* `routed_lora_gathered_` -- the small-batch path (decode steps: B tokens, one per sequence):
  every linear keeps its experts stacked by slot ([S, in, r] and [S, r, out], zeros for the base
  slot and for adapters absent here), so one `index_select` per factor gathers each token's own
  factors and two `bmm` calls apply them -- five tensor ops per linear whatever K or the number
  of distinct experts, and no sort, count or host sync per layer. It copies N tokens' factors,
  so it only pays below a few tokens (`MoEConfig.gathered_max_tokens`); inference only.
* `dense_soft_lora_delta` -- NOT the TRACE semantics: a soft mixture weighting all K deltas by a
  per-token row of weights. With each token's own gate softmax it is the benchmark's dense
  baseline (`MoEConfig.implementation="dense_soft"`); with every token of a request given that
  request's mixture weights it is the soft per-trajectory ablation (`soft_routing`, routing mode
  `soft_trajectory`: a plan with `soft=True`, whatever the configured implementation).

`RoutedLoraLinear` attaches one of them to a frozen `nn.Linear` of the base as a forward hook:
the base module and its weights stay untouched, and the hook reads the routing decision that
the decoder layer's pre-forward hook stored in the shared `LayerRouting` for that layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from trace_common.errors import FailedPrecondition


@dataclass(frozen=True)
class LoraFactors:
    """One expert's factors on one linear: delta(x) = scaling * (x @ A^T) @ B^T."""

    lora_A: torch.Tensor  # [r, in]
    lora_B: torch.Tensor  # [out, r]
    scaling: float
    # Pre-transposed copies for the grouped path: one plain `mm` per factor and no scaling op
    # (F.linear's transpose/dispatch layers cost microseconds per call, which dominate at decode).
    # In a `RoutedLoraLinear` they are views into its slot stacks (A_t strided when ranks differ).
    A_t: torch.Tensor | None = None  # [in, r] = A^T
    scaled_B_t: torch.Tensor | None = None  # [r, out] = (scaling * B)^T, contiguous

    def transposed(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.A_t is not None and self.scaled_B_t is not None:
            return self.A_t, self.scaled_B_t
        return self.lora_A.t(), (self.lora_B * self.scaling).t()


# experts[slot] is None for slot 0 (the base) and for adapters that do not target this linear.
ExpertTable = Sequence[LoraFactors | None]


@dataclass
class RoutingPlan:
    """One layer's routing decision for one forward call, shared by all routed linears of the layer."""

    expert_ids: torch.Tensor  # [N] int64, slot per token
    num_slots: int
    sole_slot: int | None  # the slot that owns every token, when exactly one does
    groups: list[tuple[int, torch.Tensor]]  # (slot, token indices [n_slot]) for slots owning tokens
    st_factor: torch.Tensor | None = None  # [N], value 1, carries the straight-through gradient
    probs: torch.Tensor | None = None  # [N, K+1] gate softmax (dense_soft) or mixture weights (soft)
    order: torch.Tensor | None = None  # [N] token indices sorted by slot (stable)
    st_sorted: torch.Tensor | None = None  # [N] st_factor[order]
    # x[order] of the last input seen: q/k/v (and gate/up) projections share one input tensor,
    # so the gather runs once for them. Holds the input itself so its id cannot be reused.
    sorted_input: tuple[torch.Tensor, torch.Tensor] | None = None
    segments: list[tuple[int, int, int]] | None = None  # (slot, start, end) in sorted order, per group
    # True: no grouping was built (few tokens, inference); linears use `routed_lora_gathered_`.
    gathered: bool = False
    # True: soft per-trajectory routing; `probs` holds each token's request mixture weights and every
    # linear adds `dense_soft_lora_delta` (expert_ids only name each request's heaviest slot, for traces)
    soft: bool = False

    def gather_sorted(self, x: torch.Tensor) -> torch.Tensor:
        """x[..., in] flattened to tokens and sorted by slot ([N, in]); reused when x is the same tensor."""
        cached = self.sorted_input
        if cached is not None and cached[0] is x:
            return cached[1]
        assert self.order is not None
        x_sorted = x.reshape(-1, x.shape[-1]).index_select(0, self.order)  # [N, in]
        self.sorted_input = (x, x_sorted)
        return x_sorted


def build_routing_plan(expert_ids: torch.Tensor, num_slots: int, *, st_factor: torch.Tensor | None = None,
                       probs: torch.Tensor | None = None, sole_slot: int | None = None) -> RoutingPlan:
    """Group token indices by slot once per layer (one host sync for the counts, also on GPU).

    Semantics:
        counts[i] = #{n : expert_ids[n] == i}
        if exactly one slot i has counts[i] == N: sole_slot = i (no index lists needed)
        else: order = stable_argsort(expert_ids); groups[i] = order[start_i : start_i + counts[i]]
    """
    # expert_ids: [N]
    ids = expert_ids.reshape(-1)
    if sole_slot is not None:
        return RoutingPlan(ids, num_slots, sole_slot, [], st_factor, probs)
    counts = torch.bincount(ids, minlength=num_slots).tolist()  # [S] (one host sync per layer)
    owners = [slot for slot, count in enumerate(counts) if count]
    if len(owners) <= 1:
        only = owners[0] if owners else 0
        return RoutingPlan(ids, num_slots, only, [], st_factor, probs)
    order = torch.argsort(ids, stable=True)  # [N]
    chunks = order.split(counts)
    st_sorted = None if st_factor is None else st_factor.index_select(0, order)
    segments, start = [], 0
    for slot in owners:
        segments.append((slot, start, start + counts[slot]))
        start += counts[slot]
    return RoutingPlan(ids, num_slots, None, [(slot, chunks[slot]) for slot in owners], st_factor, probs,
                       order, st_sorted, segments=segments)


def _delta(x: torch.Tensor, factors: LoraFactors) -> torch.Tensor:
    # x: [n, in] -> [n, out]; same operation order as PEFT: B(A(x)) * scaling
    return F.linear(F.linear(x, factors.lora_A), factors.lora_B) * factors.scaling


def routed_lora_reference(x: torch.Tensor, expert_ids: torch.Tensor, experts: ExpertTable,
                          st_factor: torch.Tensor | None = None) -> torch.Tensor:
    """The oracle: the routed delta computed with every expert on every token, then masked.

    Semantics:
        delta[n] = 0                                   # slot 0 = base, or adapter absent here
        for each slot k >= 1 with factors (A_k, B_k, s_k):
            for each token n with expert_ids[n] == k:
                delta[n] = s_k * B_k @ A_k @ x[n] * g[n]   # g = straight-through factor (1 if None)
        return delta                                   # caller adds it to W x
    """
    # x: [N, in], expert_ids: [N] -> delta: [N, out]
    delta: torch.Tensor | None = None
    for slot, factors in enumerate(experts):
        if factors is None:
            continue
        candidate = _delta(x, factors)  # [N, out]
        if st_factor is not None:
            candidate = candidate * st_factor.unsqueeze(-1)
        chosen = (expert_ids == slot).unsqueeze(-1)  # [N, 1]
        masked = torch.where(chosen, candidate, torch.zeros_like(candidate))
        delta = masked if delta is None else delta + masked
    if delta is None:
        raise FailedPrecondition("routed linear has no expert factors; nothing targets it")
    return delta


def routed_lora_grouped_(y: torch.Tensor, x: torch.Tensor, plan: RoutingPlan,
                         experts: ExpertTable) -> torch.Tensor:
    """The fast path: add each token's chosen expert delta into `y`, one matmul pair per expert.

    Semantics:
        if plan.sole_slot is k:                        # one expert owns all tokens: no grouping
            y += s_k * B_k @ A_k @ x * g  (skipped when k is the base or absent here)
        else:
            xs = x[order]                              # one gather [N, in]: tokens sorted by slot
            for each slot k owning the contiguous segment xs[a_k : a_k + n_k]:
                d_k = s_k * B_k @ A_k @ xs[a_k : a_k + n_k]   # [n_k, out]; zeros for base/absent
            y[order] += concat_k(d_k) * g[order]       # one scatter-add back to token order
        never evaluates an expert on a token that did not choose it
    """
    # y: [N, out] (W x, modified in place), x: [N, in] or [..., in] with N tokens
    st = plan.st_factor  # [N] or None
    if plan.sole_slot is not None:
        factors = experts[plan.sole_slot]
        if factors is None:
            return y
        delta = _delta(x.reshape(-1, x.shape[-1]), factors)  # [N, out]
        if st is not None:
            delta = delta * st.unsqueeze(-1)
        return y.add_(delta)
    segments = plan.segments
    assert segments is not None and plan.order is not None
    if all(experts[slot] is None for slot, _, _ in segments):
        return y
    x_sorted = plan.gather_sorted(x)  # [N, in]
    if torch.is_grad_enabled():  # autograd: build the sorted deltas out of place
        parts = []
        for slot, start, end in segments:
            factors = experts[slot]
            if factors is None:
                parts.append(y.new_zeros(end - start, y.shape[1]))  # [n_k, out]
            else:
                a_t, b_t = factors.transposed()  # [in, r], [r, out] (scaling folded in)
                parts.append(torch.mm(torch.mm(x_sorted[start:end], a_t), b_t))  # [n_k, out]
        delta_sorted = torch.cat(parts)  # [N, out]
    else:  # inference: each expert writes its rows straight into one buffer (no concatenation copy)
        delta_sorted = y.new_empty(y.shape)  # [N, out]
        for slot, start, end in segments:
            factors = experts[slot]
            if factors is None:
                delta_sorted[start:end].zero_()
            else:
                a_t, b_t = factors.transposed()
                torch.mm(torch.mm(x_sorted[start:end], a_t), b_t, out=delta_sorted[start:end])
    if plan.st_sorted is not None:
        delta_sorted = delta_sorted * plan.st_sorted.unsqueeze(-1)
    return y.index_add_(0, plan.order, delta_sorted)


def stack_expert_factors(factors_by_slot: dict[int, tuple[torch.Tensor, torch.Tensor, float]], num_slots: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every slot's transposed factors in two tensors indexed by slot (the gathered path's layout).

    Semantics:
        r = max rank over the present slots
        A_stack[k] = [A_k^T | 0]             # [in, r]: zero columns pad a smaller rank
        B_stack[k] = [s_k * B_k^T ; 0]       # [r, out]: zero rows pad it
        A_stack[k] = 0, B_stack[k] = 0       for the base slot 0 and slots absent on this linear
        so x @ A_stack[k] @ B_stack[k] == s_k * B_k A_k x for present k, and 0 otherwise
    """
    first_A, first_B, _ = next(iter(factors_by_slot.values()))
    in_features, out_features = first_A.shape[1], first_B.shape[0]
    rank = max(lora_A.shape[0] for lora_A, _, _ in factors_by_slot.values())
    a_stack = first_A.new_zeros(num_slots, in_features, rank)  # [S, in, r]
    b_stack = first_B.new_zeros(num_slots, rank, out_features)  # [S, r, out]
    with torch.no_grad():
        for slot, (lora_A, lora_B, scaling) in factors_by_slot.items():
            a_stack[slot, :, :lora_A.shape[0]] = lora_A.detach().t()
            b_stack[slot, :lora_B.shape[1], :] = (lora_B.detach() * scaling).t()
    return a_stack, b_stack


def routed_lora_gathered_(y: torch.Tensor, x: torch.Tensor, expert_ids: torch.Tensor,
                          a_stack: torch.Tensor, b_stack: torch.Tensor) -> torch.Tensor:
    """The small-batch path: gather each token's own factors, two batched matmuls, one add.

    Semantics:
        for each token n with slot e = expert_ids[n]:
            y[n] += (x[n] @ A_stack[e]) @ B_stack[e]    # = s_e * B_e A_e x[n]; + 0 for the base slot
                                                        #   and absent adapters (finite x)
        the same per-token delta as `routed_lora_reference` (up to float summation order);
        cost: N copies of one expert's factors, no grouping, sort or host sync
    """
    # y: [N, out] (W x, modified in place), x: [..., in] with N tokens, expert_ids: [N]
    # a_stack: [S, in, r], b_stack: [S, r, out]
    x_rows = x.reshape(-1, 1, x.shape[-1])  # [N, 1, in]
    hidden = torch.bmm(x_rows, a_stack.index_select(0, expert_ids))  # [N, 1, r]
    delta = torch.bmm(hidden, b_stack.index_select(0, expert_ids))  # [N, 1, out]
    return y.add_(delta.view(y.shape))


def dense_soft_lora_delta(x: torch.Tensor, probs: torch.Tensor, experts: ExpertTable) -> torch.Tensor:
    """Not the TRACE semantics: every adapter on every token, weighted by a row of weights per token --
    the gate softmax of that token (the dense baseline) or the mixture weights of its request (the
    soft per-trajectory ablation, `soft_routing`).

    Semantics:
        delta[n] = sum_{k >= 1} p[n, k] * s_k * B_k @ A_k @ x[n]    # slot 0 (base) adds nothing
        (adapters absent on this linear add nothing either)
    """
    # x: [N, in], probs: [N, K+1] -> [N, out]
    delta: torch.Tensor | None = None
    for slot, factors in enumerate(experts):
        if factors is None:
            continue
        term = _delta(x, factors) * probs[:, slot:slot + 1].to(x.dtype)  # [N, out]
        delta = term if delta is None else delta + term
    if delta is None:
        raise FailedPrecondition("routed linear has no expert factors; nothing targets it")
    return delta


class LayerRouting:
    """Mutable holder of one decoder layer's current `RoutingPlan`, written by the layer's hook."""

    def __init__(self, layer: int):
        self.layer = layer
        self.plan: RoutingPlan | None = None


class RoutedLoraLinear(nn.Module):
    """The frozen experts of one base linear plus the hook that applies the routed delta.

    Holds each targeting adapter's factors as frozen parameters (`lora_A.<slot>`, `lora_B.<slot>`);
    `hook` is registered with `register_forward_hook` on the base `nn.Linear`.
    """

    def __init__(self, path: str, routing: LayerRouting, num_slots: int,
                 factors_by_slot: dict[int, tuple[torch.Tensor, torch.Tensor, float]],
                 implementation: str, straight_through: str):
        super().__init__()
        self.path = path
        self.routing = routing
        self.implementation = implementation
        self.straight_through = straight_through
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        self.num_slots = num_slots
        self.scalings: dict[int, float] = {}
        self.ranks: dict[int, int] = {}
        for slot, (lora_A, lora_B, scaling) in sorted(factors_by_slot.items()):
            if slot < 1 or slot >= num_slots:
                raise FailedPrecondition(f"expert slot {slot} of {path} outside 1..{num_slots - 1}")
            self.lora_A[str(slot)] = nn.Parameter(lora_A, requires_grad=False)  # [r, in]
            self.lora_B[str(slot)] = nn.Parameter(lora_B, requires_grad=False)  # [out, r]
            self.scalings[slot] = scaling
            self.ranks[slot] = lora_A.shape[0]
        # The transposed, scaled factors of every slot, stacked by slot (frozen, derived from the
        # parameters above, so not saved): the gathered path indexes them per token, and each
        # slot's LoraFactors.A_t / scaled_B_t used by the grouped path are views into them.
        a_stack, b_stack = stack_expert_factors(factors_by_slot, num_slots)
        self.register_buffer("A_t_stack", a_stack, persistent=False)  # [S, in, r_max]
        self.register_buffer("B_t_stack", b_stack, persistent=False)  # [S, r_max, out]
        self.experts: tuple[LoraFactors | None, ...] = ()
        self._rebuild_table()

    def _rebuild_table(self) -> None:
        table: list[LoraFactors | None] = [None] * self.num_slots
        for slot, scaling in self.scalings.items():
            rank = self.ranks[slot]
            table[slot] = LoraFactors(self.lora_A[str(slot)], self.lora_B[str(slot)], scaling,
                                      self.A_t_stack[slot, :, :rank], self.B_t_stack[slot, :rank, :])
        self.experts = tuple(table)

    def _apply(self, fn, recurse=True):
        # .to()/.double()/.cuda() may replace parameter and buffer objects: re-derive the stacks from
        # the converted parameters (so a wider dtype is not stuck with the old rounding of s * B)
        # and re-point the table at them
        result = super()._apply(fn, recurse)
        factors = {slot: (self.lora_A[str(slot)], self.lora_B[str(slot)], scaling)
                   for slot, scaling in self.scalings.items()}
        self.A_t_stack, self.B_t_stack = stack_expert_factors(factors, self.num_slots)
        self._rebuild_table()
        return result

    def hook(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        plan = self.routing.plan
        if plan is None:
            raise FailedPrecondition(
                f"{self.path} ran outside a decoder-layer forward, so no routing decision exists for it")
        if plan.soft:  # soft per-trajectory routing: every adapter, weighted by the request's mixture
            assert plan.probs is not None
            x2 = args[0].reshape(-1, args[0].shape[-1])  # [N, in]
            y2 = output.view(-1, output.shape[-1])  # [N, out]
            if y2.shape[0] != plan.probs.shape[0]:
                raise FailedPrecondition(
                    f"{self.path} saw {y2.shape[0]} tokens but layer {self.routing.layer} mixed "
                    f"{plan.probs.shape[0]}; routed linears must see the layer's tokens unchanged")
            return (y2 + dense_soft_lora_delta(x2, plan.probs, self.experts)).view(output.shape)
        if plan.gathered:  # few tokens (decode), inference: per-token factor gather, in place
            y2 = output.view(-1, output.shape[-1])  # [N, out], a view of `output`
            if y2.shape[0] != plan.expert_ids.shape[0]:
                raise FailedPrecondition(
                    f"{self.path} saw {y2.shape[0]} tokens but layer {self.routing.layer} routed "
                    f"{plan.expert_ids.shape[0]}; routed linears must see the layer's tokens unchanged")
            routed_lora_gathered_(y2, args[0], plan.expert_ids, self.A_t_stack, self.B_t_stack)
            return output
        if plan.sole_slot is not None and self.experts[plan.sole_slot] is None \
                and (plan.st_factor is None or self.straight_through == "delta"):
            return output  # every token is on the base (or an adapter absent here): y = W x
        x = args[0]  # [B, T, in]
        y2 = output.view(-1, output.shape[-1])  # [N, out], a view: in-place adds land in `output`
        if y2.shape[0] != plan.expert_ids.shape[0]:
            raise FailedPrecondition(
                f"{self.path} saw {y2.shape[0]} tokens but layer {self.routing.layer} routed "
                f"{plan.expert_ids.shape[0]}; routed linears must see the layer's tokens unchanged")
        st = plan.st_factor
        if self.implementation == "grouped" and (st is None or self.straight_through == "delta"):
            routed_lora_grouped_(y2, x, plan, self.experts)  # the fast path, in place (x as given:
            return output  # q/k/v share one input object, so its sorted gather is reused)
        x2 = x.reshape(-1, x.shape[-1])  # [N, in]
        if self.straight_through == "output" and st is not None:
            plan = replace(plan, st_factor=None, st_sorted=None)  # the factor scales the whole output below
        if self.implementation == "grouped":
            y2 = routed_lora_grouped_(y2, x2, plan, self.experts)
        elif self.implementation == "reference":
            y2 = y2 + routed_lora_reference(x2, plan.expert_ids, self.experts, plan.st_factor)
        else:  # dense_soft
            if plan.probs is None:
                raise FailedPrecondition(f"layer {self.routing.layer} has no gate probabilities "
                                         "(dense_soft cannot run under forced routing)")
            y2 = y2 + dense_soft_lora_delta(x2, plan.probs, self.experts)
        if self.straight_through == "output" and st is not None:
            y2 = y2 * st.unsqueeze(-1).to(y2.dtype)
        return y2.view(output.shape)
