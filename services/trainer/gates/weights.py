"""The per-layer gates of a composition as the GRPO loop's trainable weights (`GateWeights`, the
MoE case of `grpo/trainable.py`), and in-process rollouts that count its routing decisions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from services.trainer.grpo.rollouts import PolicyRollouts
from services.trainer.grpo.trainable import TrainableWeights
from trace_common.errors import ArtifactCorrupted
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import BASE_SLOT_NAME, GATES_FILE, gates_metadata


class GateWeights(TrainableWeights):
    """The per-layer gates of a composition as the GRPO loop's trainable weights (trainable.py).

    Freezes everything but the gates. While `counting()` is active (the rollouts), every routing
    decision on a real (non-padding) token is counted per slot; `iteration_metrics` reports the
    shares since the previous call as `routing_share_<slot name>`.
    """

    weights_file = GATES_FILE
    config_file = "gates_config.json"

    def __init__(self, composed: ComposedMoEModel, load_balancing_coef: float = 0.0):
        self.composed = composed
        self.coef = load_balancing_coef
        composed.requires_grad_(False)
        for p in composed.gate_parameters():
            p.grad = None  # a gradient left by earlier training must not enter GRPO's first step
            p.requires_grad_(True)
        self.names = [BASE_SLOT_NAME, *composed.adapter_names]
        self.counts = torch.zeros(composed.num_slots, dtype=torch.float64)

    def parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(f"gates.{n}", p) for n, p in self.composed.gates.named_parameters()]

    def state_bytes(self) -> bytes:
        tensors = {k: v.contiguous().cpu() for k, v in self.composed.gate_state_dict().items()}
        return st_save(tensors, metadata=gates_metadata(self.composed))

    def config_bytes(self) -> bytes:
        c = self.composed
        return json.dumps({"adapters": list(c.adapter_names), "num_layers": c.num_layers,
                           "hidden_size": c.hidden_size, "num_slots": c.num_slots,
                           "load_balancing_coef": self.coef}, sort_keys=True).encode()

    def load_state_bytes(self, data: bytes) -> None:
        try:
            state = st_load(data)
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types
            raise ArtifactCorrupted(f"gate weights are not a valid safetensors file: {exc}") from exc
        self.composed.load_gate_state_dict({k: v.float() for k, v in state.items()})

    @contextmanager
    def reference(self) -> Iterator[None]:
        with self.composed.forced(0):  # the plain base
            yield

    def aux_loss(self) -> torch.Tensor | None:
        if not self.coef or not torch.is_grad_enabled():
            return None
        # the last forward ran the decoder directly (logprobs.py), so the padding mask recorded by the
        # base's forward hook belongs to an older call: drop it rather than risk a stale match
        self.composed._last_mask = None
        return self.coef * self.composed.load_balancing_loss()

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count routing decisions of the forwards inside the block (padding excluded when known)."""
        composed = self.composed
        from trace_common.moe.backbone import decoder_layout

        def hook(layer: int):
            def count(_module, _args, _output) -> None:
                ids = composed._last_ids[layer]
                if ids is None or composed.is_forced:
                    return
                mask = composed._last_mask
                if mask is not None and mask.numel() == ids.numel():
                    ids = ids[mask.reshape(-1).to(ids.device)]
                self.counts += torch.bincount(ids.reshape(-1).cpu(), minlength=composed.num_slots).double()
            return count

        layers = decoder_layout(composed.base).layers
        handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def routing_share(self, reset: bool = True) -> list[float]:
        total = float(self.counts.sum())
        share = (self.counts / total).tolist() if total > 0 else []
        if reset:
            self.counts.zero_()
        return share

    def iteration_metrics(self) -> dict[str, float]:
        share = self.routing_share()
        return {f"routing_share_{name}": float(v) for name, v in zip(self.names, share, strict=True)}


class CountingRollouts(PolicyRollouts):
    """In-process rollouts of the composition that count its routing decisions (GateWeights)."""

    def __init__(self, policy, weights: GateWeights):
        super().__init__(policy)
        self.weights = weights

    async def play(self, env_factory, specs, **kwargs):
        with self.weights.counting():
            return await super().play(env_factory, specs, **kwargs)


__all__ = ["CountingRollouts", "GateWeights"]
