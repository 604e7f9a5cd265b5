"""The composed model: frozen base + K frozen LoRA experts + one trainable gate per decoder layer.

TRACE composes its capability adapters into a token-level mixture of experts. At every
LoRA-targeted linear of decoder layer l,

    y = W x + s_e * B_e A_e x,    e = argmax softmax(G_l h)   (per token; slot 0 = base, no delta)

where h is the hidden state entering layer l and G_l = Linear(H, K+1, bias). The composition is
attached to the base with hooks instead of module replacement, so the base keeps its module
tree, state-dict keys and `generate()`:

* a pre-forward hook on each decoder layer runs the gate on the layer's input and stores a
  `RoutingPlan` (tokens grouped by slot, once per layer);
* a forward hook on each targeted `nn.Linear` adds the routed delta (`routed_lora`).

Inference calls with only a few tokens (KV-cache decode steps) skip the grouping: the plan only
carries the slot ids and each linear gathers every token's own stacked factors
(`routed_lora_gathered_`, `MoEConfig.gathered_max_tokens`), the same math with fewer ops.

With a KV cache each decode step's forward sees only the new tokens, so each is routed on its
own hidden state, exactly as in a full forward. Only the gates require grad; the forward is hard
top-1 and the gates learn through a straight-through factor and the Switch load-balancing term
(`load_balancing_loss`).

Two ways to override the gates' per-token decisions: `forced(spec)` (fixed slots: tests, the
per-request export, the KV reference) and `soft_trajectory()` / `mixing(weights)` (the soft
per-trajectory ablation, `soft_routing`: one mixture of all adapters per request and layer). They
cannot be combined.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.moe.adapters import LoraAdapter, load_lora_adapter
from trace_common.moe.backbone import decoder_layout
from trace_common.moe.config import MoEConfig
from trace_common.moe.forcing import ForceSpec, RoutingForce, RoutingTrace
from trace_common.moe.gating import (
    gate_param_count,
    load_balancing_loss,
    route_top1,
    straight_through_factor,
    trajectory_mixture,
)
from trace_common.moe.routed_lora import LayerRouting, RoutedLoraLinear, RoutingPlan, build_routing_plan
from trace_common.moe.soft_mixture import SoftMixture

_COMPOSED_MARK = "_trace_moe_composed"


class ComposedMoEModel(nn.Module):
    """Token-level top-1 routing over K frozen LoRA adapters plus the base (slot 0).

    Slot k >= 1 is `adapter_names[k-1]`. The base model is frozen in place (`requires_grad_(False)`)
    and hooked; call `remove()` to detach the composition and get the plain base back.
    """

    def __init__(self, base: nn.Module, adapters: Sequence[LoraAdapter], config: MoEConfig | None = None):
        super().__init__()
        self.config = config or MoEConfig()
        if not adapters:
            raise InvalidArgument(field="adapters", expected="at least one LoRA adapter", got=0)
        names = [adapter.name for adapter in adapters]
        if len(set(names)) != len(names):
            raise InvalidArgument(field="adapters", expected="distinct adapter names", got=names,
                                  fix="pass names=... (e.g. the capability names) when loading")
        if getattr(base, _COMPOSED_MARK, False):
            raise FailedPrecondition("this base model already carries an MoE composition; call remove() "
                                     "on the old one (or load a fresh base) first")
        layout = decoder_layout(base)
        self.base = base
        self.base.requires_grad_(False)
        self.adapter_names: tuple[str, ...] = tuple(names)
        self.num_layers = layout.num_layers
        self.hidden_size = layout.hidden_size
        self.num_slots = len(adapters) + 1
        device = next(base.parameters()).device

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.gate_seed)
            gates = [nn.Linear(self.hidden_size, self.num_slots, bias=True) for _ in range(self.num_layers)]
        self.gates = nn.ModuleList(gates).to(device=device, dtype=torch.float32)

        self._routing = [LayerRouting(layer) for layer in range(self.num_layers)]
        base_modules = dict(base.named_modules())
        by_path: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {}
        for slot, adapter in enumerate(adapters, start=1):
            for path, weights in adapter.modules.items():
                target = base_modules.get(path)
                if not isinstance(target, nn.Linear) or tuple(weights.lora_A.shape[1:]) != (target.in_features,) \
                        or weights.lora_B.shape[0] != target.out_features:
                    raise InvalidArgument(field=f"adapter {adapter.name!r}",
                                          reason=f"was loaded against a different base: {path} does not match "
                                                 "this model", fix="load it with load_lora_adapter(dir, base)")
                lora_A = weights.lora_A.to(device=target.weight.device, dtype=target.weight.dtype)
                lora_B = weights.lora_B.to(device=target.weight.device, dtype=target.weight.dtype)
                by_path.setdefault(path, {})[slot] = (lora_A, lora_B, weights.scaling)
        self.routed = nn.ModuleDict()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        for path in sorted(by_path):
            layer = layout.layer_index_of(path)
            assert layer is not None  # checked when the adapter was loaded
            module = RoutedLoraLinear(path, self._routing[layer], self.num_slots, by_path[path],
                                      self.config.implementation, self.config.straight_through)
            self.routed[path.replace(".", "__")] = module
            self._handles.append(base_modules[path].register_forward_hook(module.hook))
        for layer, decoder_layer in enumerate(layout.layers):
            self._handles.append(decoder_layer.register_forward_pre_hook(
                self._layer_hook(layer), with_kwargs=True))
        self._handles.append(base.register_forward_pre_hook(self._on_base_forward, with_kwargs=True))
        setattr(base, _COMPOSED_MARK, True)

        # the gathered small-batch path serves the grouped implementation only
        self._gathered_max_tokens = self.config.gathered_max_tokens if self.config.implementation == "grouped" else -1
        self._force: RoutingForce | None = None
        self._mix: SoftMixture | None = None
        self._trace: RoutingTrace | None = None
        self._last_logits: list[torch.Tensor | None] = [None] * self.num_layers  # [N, K+1] each
        self._last_ids: list[torch.Tensor | None] = [None] * self.num_layers  # [N] each
        self._last_mask: torch.Tensor | None = None  # [B, T] bool, tokens of the last forward call

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_adapter_dirs(cls, base: nn.Module, adapter_dirs: Sequence[str | Path], *,
                          names: Sequence[str] | None = None,
                          config: MoEConfig | None = None) -> ComposedMoEModel:
        """Load PEFT adapter directories (slot k = adapter_dirs[k-1]) and compose them with `base`."""
        if names is not None and len(names) != len(adapter_dirs):
            raise InvalidArgument(field="names", expected=f"{len(adapter_dirs)} names (one per adapter)",
                                  got=list(names))
        layout = decoder_layout(base)
        adapters = [load_lora_adapter(directory, base, name=None if names is None else names[i], layout=layout)
                    for i, directory in enumerate(adapter_dirs)]
        return cls(base, adapters, config)

    def remove(self) -> nn.Module:
        """Detach every hook; the base computes exactly as before composition. Returns the base."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if hasattr(self.base, _COMPOSED_MARK):
            delattr(self.base, _COMPOSED_MARK)
        return self.base

    # ---- hooks --------------------------------------------------------------------------
    def _on_base_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        mask = kwargs.get("attention_mask")
        self._last_mask = None
        if tokens is not None and isinstance(mask, torch.Tensor) and mask.dim() == 2:
            seq = tokens.shape[1]
            if mask.shape[0] == tokens.shape[0] and mask.shape[1] >= seq:
                self._last_mask = mask[:, -seq:].bool()  # the tokens this call processes are the last ones

    def _layer_hook(self, layer: int):
        def route(module: nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]  # [B, T, H]
            self._route(layer, hidden, kwargs.get("position_ids"))
        return route

    def _route(self, layer: int, hidden: torch.Tensor, position_ids: torch.Tensor | None) -> None:
        batch, seq, width = hidden.shape
        slots = self.num_slots
        logits: torch.Tensor | None = None
        if self._mix is not None:
            self._route_soft(layer, hidden)
            return
        if self._force is not None:
            ids = self._force.slots(layer, batch, seq, position_ids, hidden.device).reshape(-1)  # [N]
            plan = build_routing_plan(ids, slots, sole_slot=self._force.sole_slot(layer))
        else:
            gate = self.gates[layer]
            weight = gate.weight  # [K+1, H]
            logits = F.linear(hidden.reshape(-1, width).to(weight.dtype), weight, gate.bias)  # [N, K+1]
            ids = route_top1(logits)  # [N]
            if ids.shape[0] <= self._gathered_max_tokens and not torch.is_grad_enabled():
                # few tokens (decode step), inference: no grouping; linears gather per-token factors
                plan = RoutingPlan(ids, slots, None, [], gathered=True)
            elif self.config.implementation == "dense_soft":
                probs = F.softmax(logits, dim=-1).to(hidden.dtype)  # [N, K+1]
                plan = RoutingPlan(ids, slots, None, [], None, probs)
            else:
                st = None
                if torch.is_grad_enabled() and weight.requires_grad:
                    st = straight_through_factor(logits, ids).to(hidden.dtype)  # [N], value 1
                plan = build_routing_plan(ids, slots, st_factor=st)
        self._routing[layer].plan = plan
        self._last_logits[layer] = logits
        self._last_ids[layer] = ids
        if self._trace is not None:
            probs_bt = None if logits is None else F.softmax(logits.float(), dim=-1).view(batch, seq, slots)
            self._trace.record(layer, ids.view(batch, seq), probs_bt)

    def _route_soft(self, layer: int, hidden: torch.Tensor) -> None:
        """Soft per-trajectory routing at one layer (soft_routing's Semantics): the weights of each
        sequence, computed from the gate over this call's real tokens when the layer has none yet."""
        batch, seq, width = hidden.shape
        slots = self.num_slots
        mix = self._mix
        assert mix is not None
        weights = mix.layers[layer]
        if weights is None:
            gate = self.gates[layer]
            logits = F.linear(hidden.reshape(-1, width).to(gate.weight.dtype), gate.weight, gate.bias)  # [N, K+1]
            probs = F.softmax(logits.float(), dim=-1).view(batch, seq, slots)  # [B, T, K+1]
            mask = self._last_mask if self._last_mask is not None and self._last_mask.shape == (batch, seq) else None
            weights = trajectory_mixture(probs, None if mask is None else mask.to(probs.device))  # [B, K+1]
            mix.layers[layer] = weights
        if weights.shape[0] not in (1, batch) or weights.shape[-1] != slots:
            raise FailedPrecondition(f"the soft mixture holds weights for {weights.shape[0]} sequences x "
                                     f"{weights.shape[-1]} slots, but layer {layer} runs {batch} sequences x {slots} "
                                     "slots; run every forward of one batch inside its own soft_trajectory() block")
        rows = weights.to(device=hidden.device).expand(batch, slots)  # [B, K+1]
        per_token = rows.unsqueeze(1).expand(batch, seq, slots)  # [B, T, K+1]
        ids = rows.argmax(dim=-1).unsqueeze(1).expand(batch, seq).reshape(-1)  # [N]: each request's heaviest slot
        plan = RoutingPlan(ids, slots, None, [], probs=per_token.reshape(-1, slots).to(hidden.dtype), soft=True)
        self._routing[layer].plan = plan
        self._last_logits[layer] = None
        self._last_ids[layer] = ids
        if self._trace is not None:
            self._trace.record(layer, ids.view(batch, seq), per_token.float())

    # ---- model API ----------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        """The base model's forward (e.g. input_ids, attention_mask -> logits) under routing."""
        return self.base(*args, **kwargs)

    def generate(self, *args, **kwargs):
        """The base model's `generate` under routing (KV-cache decode steps route their new tokens)."""
        return self.base.generate(*args, **kwargs)

    def gate_parameters(self) -> list[nn.Parameter]:
        """The only trainable parameters: every gate's weight and bias."""
        return list(self.gates.parameters())

    def num_gate_parameters(self) -> int:
        """Counted from the gate modules; equals L * (H * (K+1) + (K+1))."""
        counted = sum(p.numel() for p in self.gates.parameters())
        expected = gate_param_count(self.num_layers, self.hidden_size, self.num_slots - 1)
        if counted != expected:  # pragma: no cover - construction guarantees it
            raise FailedPrecondition(f"gate parameter count {counted} != L*(H*(K+1)+(K+1)) = {expected}")
        return counted

    def adapter_fingerprints(self) -> dict[str, str]:
        """Adapter name -> sha256 (16 hex) of its frozen factors (every routed path's A, B and scaling,
        in path order): what the adapter computes, whatever URI it was loaded from, so a retrained
        adapter at the same URI gets another fingerprint."""
        digests = {slot: hashlib.sha256() for slot in range(1, self.num_slots)}
        for key in sorted(self.routed):
            module = self.routed[key]
            for slot, scaling in sorted(module.scalings.items()):
                h = digests[slot]
                h.update(f"{module.path}|{scaling!r}|".encode())
                for t in (module.lora_A[str(slot)], module.lora_B[str(slot)]):
                    h.update(str(tuple(t.shape)).encode() + str(t.dtype).encode())
                    h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        return {name: digests[k].hexdigest()[:16] for k, name in enumerate(self.adapter_names, start=1)}

    def parameter_report(self) -> dict[str, int]:
        """Parameter counts by role: trainable gates, frozen adapter factors, frozen base."""
        return {
            "gate": self.num_gate_parameters(),
            "adapter_frozen": sum(p.numel() for p in self.routed.parameters()),
            "base_frozen": sum(p.numel() for p in self.base.parameters()),
            "trainable": sum(p.numel() for p in self.parameters() if p.requires_grad),
        }

    def gate_state_dict(self) -> dict[str, torch.Tensor]:
        """Gate weights only (`<layer>.weight` [K+1, H], `<layer>.bias` [K+1]) -- what gate training produces."""
        return {key: value.detach().clone() for key, value in self.gates.state_dict().items()}

    def load_gate_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        expected = {key: tuple(value.shape) for key, value in self.gates.state_dict().items()}
        got = {key: tuple(value.shape) for key, value in state.items()}
        if got != expected:
            raise InvalidArgument(field="gate state", expected=f"{len(expected)} tensors shaped like "
                                  f"L={self.num_layers}, H={self.hidden_size}, K+1={self.num_slots}",
                                  got=sorted(set(got.items()) ^ set(expected.items()))[:4],
                                  fix="load gates trained for this same base and adapter list")
        self.gates.load_state_dict(state)

    def load_balancing_loss(self) -> torch.Tensor:
        """Switch auxiliary loss of the last forward call, averaged over layers (padding excluded).

        Differentiable with respect to the gates when that forward ran with grad enabled.
        """
        terms = []
        for layer in range(self.num_layers):
            logits, ids = self._last_logits[layer], self._last_ids[layer]
            if logits is None or ids is None:
                raise FailedPrecondition("no gate probabilities for the last forward (none ran, or routing was "
                                         "forced); run an unforced forward first")
            mask = None if self._last_mask is None else self._last_mask.reshape(-1)
            if mask is not None and mask.shape[0] != ids.shape[0]:
                mask = None
            terms.append(load_balancing_loss(F.softmax(logits.float(), dim=-1), ids, mask))
        return torch.stack(terms).mean()

    # ---- forcing and tracing ------------------------------------------------------------
    def set_forcing(self, spec: ForceSpec | None) -> None:
        """Replace the gates' decisions (see `forcing` for the spec shapes); None restores the gates."""
        if spec is not None and self._mix is not None:
            raise FailedPrecondition("soft per-trajectory routing is active; forcing cannot be combined with it")
        self._force = None if spec is None else RoutingForce(spec, self.num_layers, self.num_slots)

    @contextmanager
    def forced(self, spec: ForceSpec) -> Iterator[None]:
        """`with model.forced(2): ...` -- route as the spec says inside the block."""
        previous = self._force
        self.set_forcing(spec)
        try:
            yield
        finally:
            self._force = previous

    @property
    def is_forced(self) -> bool:
        return self._force is not None

    @contextmanager
    def soft_trajectory(self) -> Iterator[SoftMixture]:
        """`with model.soft_trajectory() as mix: model(prompt...); model(next token...)` -- soft
        per-trajectory routing (`soft_routing`): the first forward call in the block computes each
        sequence's mixture weights per layer from the gates over that call's real tokens (its
        attention mask) and applies them; later calls (KV-cache decode steps) apply the same weights.
        `mix.weights()` is [L, B, K+1] once the first call ran."""
        with self._mixture(SoftMixture(self.num_layers)) as mix:
            yield mix

    @contextmanager
    def mixing(self, weights: torch.Tensor) -> Iterator[SoftMixture]:
        """Apply given mixture weights ([L, K+1] for every sequence, or [L, B, K+1]) to every token:
        y = W x + sum_e w[l, e] s_e B_e A_e x at layer l; the gates are not used."""
        with self._mixture(SoftMixture(self.num_layers, weights)) as mix:
            yield mix

    @contextmanager
    def _mixture(self, mix: SoftMixture) -> Iterator[SoftMixture]:
        if self._force is not None:
            raise FailedPrecondition("routing is forced; soft per-trajectory routing cannot be combined with forcing")
        if mix.layers[0] is not None and mix.layers[0].shape[-1] != self.num_slots:
            raise InvalidArgument(field="weights", expected=f"{self.num_slots} slots (K+1) per layer",
                                  got=int(mix.layers[0].shape[-1]))
        previous = self._mix
        self._mix = mix
        try:
            yield mix
        finally:
            self._mix = previous

    @property
    def is_mixing(self) -> bool:
        """True inside `soft_trajectory()` / `mixing()`."""
        return self._mix is not None

    @contextmanager
    def capture_routing(self) -> Iterator[RoutingTrace]:
        """`with model.capture_routing() as trace: ...; trace.experts()` -> slots [L, B, T]."""
        previous = self._trace
        trace = RoutingTrace(self.num_layers)
        self._trace = trace
        try:
            yield trace
        finally:
            self._trace = previous
