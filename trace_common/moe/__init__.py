"""MoE composition of frozen LoRA capability adapters with per-layer top-1 gates.

Frozen base + K frozen PEFT LoRA adapters + one gate per decoder layer (Linear(H, K+1), slot 0 =
base). See `composed` for the model, `routed_lora` for the per-linear math (reference, grouped
fast path, gathered small-batch path, dense baseline), `gating` for the gate math, `forcing` for forced routing and traces,
`export` for per-request adapter choice and merged weights, `soft_routing` for the soft per-trajectory
ablation (one mixture of the adapters per request; its weights are `soft_mixture.SoftMixture`).
"""

from trace_common.moe.adapters import LoraAdapter, LoraModuleWeights, load_lora_adapter
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.config import MoEConfig
from trace_common.moe.export import (
    PerRequestChooser,
    RequestChoice,
    choose_adapter_per_request,
    merge_single_adapter,
)
from trace_common.moe.forcing import RoutingForce, RoutingTrace
from trace_common.moe.gating import (
    gate_param_count,
    load_balancing_loss,
    route_top1,
    straight_through_factor,
    trajectory_mixture,
)
from trace_common.moe.routed_lora import (
    LoraFactors,
    RoutingPlan,
    build_routing_plan,
    dense_soft_lora_delta,
    routed_lora_gathered_,
    routed_lora_grouped_,
    routed_lora_reference,
    stack_expert_factors,
)
from trace_common.moe.soft_mixture import SoftMixture
from trace_common.moe.soft_routing import generate_soft_batch

__all__ = [
    "ComposedMoEModel",
    "LoraAdapter",
    "LoraFactors",
    "LoraModuleWeights",
    "MoEConfig",
    "RequestChoice",
    "RoutingForce",
    "RoutingPlan",
    "RoutingTrace",
    "SoftMixture",
    "build_routing_plan",
    "choose_adapter_per_request",
    "PerRequestChooser",
    "dense_soft_lora_delta",
    "gate_param_count",
    "generate_soft_batch",
    "load_balancing_loss",
    "load_lora_adapter",
    "merge_single_adapter",
    "route_top1",
    "routed_lora_gathered_",
    "routed_lora_grouped_",
    "routed_lora_reference",
    "stack_expert_factors",
    "straight_through_factor",
    "trajectory_mixture",
]
