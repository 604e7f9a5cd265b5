"""Configuration of an MoE composition (frozen base + frozen LoRA experts + trainable gates)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class MoEConfig(BaseModel):
    """How a composed model routes and computes its LoRA experts.

    The defaults are the TRACE semantics: hard top-1 routing per token per layer computed by the
    grouped implementation (each token's one chosen adapter only).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    implementation: Literal["grouped", "reference", "dense_soft"] = Field(
        default="grouped",
        description=(
            "`grouped` (the fast path): tokens are grouped by their chosen expert and each adapter "
            "runs once on its own tokens. `reference`: the straightforward oracle (every adapter on "
            "every token, masked by the routing) used by tests. `dense_soft`: NOT the TRACE "
            "semantics -- a soft mixture that weights all K deltas by the gate's softmax, kept only "
            "as the benchmark's dense baseline."),
    )
    straight_through: Literal["delta", "output"] = Field(
        default="delta",
        description=(
            "Where the straight-through factor g = p_e / stop_grad(p_e) (value 1) is applied. "
            "`delta`: to the chosen adapter's delta only (tokens routed to the base slot reach the "
            "gate only through the softmax coupling and the load-balancing term). `output`: to the "
            "whole output of every routed linear, so base-routed tokens also send a gradient."),
    )
    gathered_max_tokens: int = Field(
        default=8, ge=0,
        description=(
            "Forward calls of at most this many tokens (decode steps: one token per sequence) "
            "take the gathered path when gradients are off and routing comes from the gates: each "
            "token's own adapter factors are gathered from per-slot stacks and applied with two "
            "batched matmuls, skipping the per-layer count/sort/grouping whose fixed cost dominates "
            "tiny steps. Same math as `grouped`; it copies N tokens' factors, so it stops paying "
            "beyond a few tokens. 0 disables it. Only used with implementation='grouped'."),
    )
    gate_seed: int = Field(
        default=0,
        description="Seed of the gates' initialisation (torch's nn.Linear default init under this seed).",
    )
