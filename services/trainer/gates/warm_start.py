"""Gate-only training of an MoE composition: the supervised warm start from labelled trajectories.

The backbone and the K adapters stay frozen; only the per-layer gates (L * (H*(K+1) + (K+1))
parameters) change. The warm start teaches each gate which slot a token belongs to from a label
per trajectory, keyed by slot name. The gates job supplies one of two kinds (`grpo.py`):
* outcome labels (the default, `outcomes.py`): each slot alone replays target training tasks, and
  a task's label is the slot that scores there; the examples are that slot's own trajectories.
* provenance labels (the ablation, `provenance.py`): the trajectories of capability c's environment
  are labelled slot c, and the base's own trajectories on the target's tasks slot 0 ("base", no
  adapter) -- without them slot 0 gets no example and the gates learn never to choose the base.
Only the routing decisions that generate an assistant token carry the label (`labelled_examples.py`).
The gates are fitted to each layer's input with routing forced to the label (`teacher_forcing.py`):

Semantics (one step, a batch of sequences b with label slots c_b):
    with no grad, routing forced to c_b at every layer:  h[l, b, t] = input of layer l   # [L, B, T, H]
    s_l = RMS of h[l] over the labelled positions of step 0's batch (1 when precondition=False)
    z[l, b, t] = V_l (h[l, b, t] / s_l) + b_l, the trained parameters V_l, b_l          # [L, B, T, K+1]
    (the gate's weight is W_l = V_l / s_l, so the served gate computes the same z on raw h)
    loss = mean over layers l and labelled positions (b, t) of  CE(z[l, b, t], c_b)
           + lb_coef * mean_l SwitchLB(softmax z[l], argmax z[l])                   (lb_coef default 0)
    AdamW step on (V_l, b_l) only; W_l <- V_l / s_l

Since the backbone does not need gradients, one step costs one no-grad forward plus L small
linear layers. After training, the gates' own routing on held-out labelled positions is measured
(`routing_report.py`); its share of decisions per slot goes into the composition manifest.

This module is the warm start only; the gates job (`grpo.py`) plays the labelled trajectories
(replays or provenance), runs this warm start and then GRPO on the gates over the target's training
tasks.

Checkpoints (`warm_start_checkpoints.py`): the batch of step s is a pure function of (seed, s) (a
per-epoch permutation), so resuming from step s continues exactly as an uninterrupted run would; a
run whose config differs from the checkpoint's is refused (FailedPrecondition).

Entry point for the trainer service: `train_gates(...)` (signature and result documented there).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.trainer.gates.labelled_examples import (
    ProvenanceExample,
    collate,
    pad_id,
    provenance_examples,
    split_heldout,
)
from services.trainer.gates.routing_report import routing_report
from services.trainer.gates.teacher_forcing import layer_inputs_under_forcing
from services.trainer.gates.warm_start_checkpoints import (
    CKPT_MANIFEST,
    OPTIMIZER_FILE,
    STATE_FILE,
    gates_file_bytes,
    gates_file_tensors,
    list_gate_checkpoints,
    read_gate_checkpoint,
    write_gate_checkpoint,
)
from services.trainer.grpo.lora import torch_bytes, torch_load_bytes
from trace_common.artifacts import ArtifactStore, S3Settings
from trace_common.env.trajectory import Trajectory
from trace_common.errors import InvalidArgument
from trace_common.hf_load import load_causal_lm
from trace_common.model_refs import ModelRoots, materialize
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import (
    BASE_SLOT_NAME,
    GATES_FILE,
    CompositionArtifact,
    write_composition,
)
from trace_common.moe.gating import load_balancing_loss


class GateTrainingConfig(BaseModel):
    """Hyper-parameters of gate training (names follow TRL where the meaning is the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(5e-3, gt=0, le=1.0, description="AdamW learning rate of the gates.")
    weight_decay: float = Field(0.0, ge=0, le=1.0, description="AdamW weight decay.")
    max_steps: int = Field(100, ge=0, le=1_000_000, description="Warm-start optimizer steps.")
    per_device_train_batch_size: int = Field(
        8, ge=1, le=4096, description="Sequences per step (each labelled with its provenance slot).")
    max_length: int = Field(8192, ge=8, le=1 << 17,
                            description="Tokens kept per sequence (longer renderings are truncated at the end; the "
                                        "replies past it carry no label, so keep it above the target's prompt: the "
                                        "store's system prompt and tools alone are ~1,200 tokens).")
    load_balancing_coef: float = Field(0.0, ge=0, le=10.0,
                                       description="Weight of the Switch load-balancing term (0 = off).")
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0,
                                    description="Share of each capability's trajectories kept out of training "
                                                "to measure routing accuracy.")
    save_steps: int = Field(50, ge=0, description="Checkpoint every N steps (0 = only at the end).")
    seed: int = Field(0, ge=0, description="Seed of the batch order and the held-out split.")
    cache_layer_inputs_mb: int = Field(
        512, ge=0, description="Layer inputs under forcing do not depend on the gates, so each training sequence's "
                               "are computed once and kept when all of them fit in this many MiB (0 = never); "
                               "steps then cost only the L gate projections.")
    init: Literal["zeros", "keep"] = Field(
        "zeros", description="Gate weights at step 0: `zeros` (uniform gate probabilities; the bias is zeroed too) "
                             "or `keep` the composed model's current gates (e.g. to refine trained gates).")
    precondition: bool = Field(
        True, description="Train each gate on its layer's input scaled to unit RMS and fold the scale back into "
                          "the exported weight (same logits on raw inputs). Layer inputs differ in scale by orders of "
                          "magnitude (x90 between layers 0 and 1 of the test model), so one Adam learning rate is "
                          "otherwise too small for some layers and too large for others.")
    data_digest: str = Field("", max_length=64,
                             description="Digest of the labelled trajectories the gates are fitted to (outcome replays "
                                         "or provenance; the gates job sets it); part of the checkpoint's config "
                                         "digest, so a checkpoint fitted to other data is never resumed.")
    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tokens" in data:
            raise ValueError("tokens: provenance labels only the decisions that generate assistant tokens (no "
                             "system, user or tool token carries a label); remove the field")
        if isinstance(data, dict) and "grpo_steps" in data:
            raise ValueError("grpo_steps: removed; this config is the warm start only, and GRPO on the gates "
                             "runs in the gates job: set its max_steps (GateGRPOConfig.max_steps) and remove the field")
        return data

    def digest(self) -> str:
        # grpo_steps: 0 -- a removed field every earlier digest covered at that value, so those
        # warm-start checkpoints still resume
        keep = {**self.model_dump(exclude={"save_steps", "max_steps"}), "grpo_steps": 0}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class GateTrainingResult:
    """What `GateTrainer.train` / `train_gates` report."""

    steps: int
    resumed_from: int | None
    losses: list[float]
    train_accuracy: float | None
    heldout_accuracy: float | None
    routing_share: list[float]
    seconds: float
    stopped_early: bool = False
    composition: CompositionArtifact | None = None
    checkpoints: list[str] = field(default_factory=list)
    heldout_accuracy_by_slot: list[float | None] = field(default_factory=list)  # [K+1], None: no held-out label
    examples_per_slot: list[int] = field(default_factory=list)  # [K+1] training + held-out sequences

    def summary(self) -> dict[str, Any]:
        return {"steps": self.steps, "resumed_from": self.resumed_from,
                "final_loss": self.losses[-1] if self.losses else None,
                "train_accuracy": self.train_accuracy, "heldout_accuracy": self.heldout_accuracy,
                "heldout_accuracy_by_slot": self.heldout_accuracy_by_slot,
                "examples_per_slot": self.examples_per_slot,
                "routing_share": self.routing_share, "seconds": round(self.seconds, 3),
                "stopped_early": self.stopped_early}


# ---- the trainer -------------------------------------------------------------------------------
class GateTrainer:
    """Warm-start gate training of one composed model, with checkpoints under `prefix`."""

    def __init__(self, model: ComposedMoEModel, examples: Sequence[ProvenanceExample], config: GateTrainingConfig,
                 *, pad_id: int, store: ArtifactStore | None = None, prefix: str = "",
                 on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 should_stop: Callable[[], bool] | None = None):
        if store is not None and not prefix:
            raise InvalidArgument(field="prefix", expected="an artifact key prefix for checkpoints, e.g. runs/r1/moe")
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.on_event = on_event or (lambda kind, payload: None)
        self.should_stop = should_stop or (lambda: False)
        self.train_set, self.heldout = split_heldout(examples, config.heldout_fraction, config.seed)
        if not self.train_set:
            raise InvalidArgument(field="provenance", expected="trajectories left for training after the held-out split",
                                  fix="lower heldout_fraction or add trajectories")
        model.set_forcing(None)
        model.base.requires_grad_(False)
        for p in model.gate_parameters():
            p.requires_grad_(False)
        self.scales = self._input_scales()
        with torch.no_grad():
            if config.init == "zeros":
                for gate in model.gates:
                    gate.weight.zero_()
                    gate.bias.zero_()
            self.weights = [torch.nn.Parameter(gate.weight.detach() * scale)  # V_l [K+1, H]
                            for gate, scale in zip(model.gates, self.scales, strict=True)]
        self.biases = [gate.bias for gate in model.gates]
        for b in self.biases:
            b.requires_grad_(True)
        self.optimizer = torch.optim.AdamW([*self.weights, *self.biases], lr=config.learning_rate,
                                           weight_decay=config.weight_decay)
        self.step_count = 0
        self.losses: list[float] = []
        self.checkpoints: list[str] = []
        tokens = sum(len(e.token_ids) for e in self.train_set)
        need_mb = tokens * model.num_layers * model.hidden_size * 4 / 2**20
        self._cache: dict[int, list[torch.Tensor]] | None = {} if need_mb <= config.cache_layer_inputs_mb else None

    def _fill_cache(self) -> None:
        """Layer inputs of every training sequence, computed in fixed chunks (the same floats whatever
        the step a run starts or resumes at)."""
        assert self._cache is not None
        size = self.config.per_device_train_batch_size
        for start in range(0, len(self.train_set), size):
            chunk = self.train_set[start:start + size]
            self._cache.update(self._compute_inputs(chunk))

    def _compute_inputs(self, examples: Sequence[ProvenanceExample]) -> dict[int, list[torch.Tensor]]:
        device = next(self.model.gates.parameters()).device
        ids, attn, labels, slots = collate(examples, self.pad_id, device)
        inputs = layer_inputs_under_forcing(self.model, ids, attn, slots)  # L x [B, T, H]
        return {id(e): [h[b][labels[b]].float() for h in inputs] for b, e in enumerate(examples)}  # L x [N_b, H]

    def _inputs(self, examples: Sequence[ProvenanceExample]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(per layer: the labelled tokens' inputs [N, H], their slots [N]) of a batch."""
        if self._cache is not None and not self._cache:
            self._fill_cache()
        found = self._cache if self._cache is not None else self._compute_inputs(examples)
        per_example = [found[id(e)] for e in examples]
        device = per_example[0][0].device
        layers = [torch.cat([x[layer] for x in per_example]) for layer in range(self.model.num_layers)]
        target = torch.cat([torch.full((x[0].shape[0],), e.slot, dtype=torch.long, device=device)
                            for x, e in zip(per_example, examples, strict=True)])
        return layers, target

    def _input_scales(self) -> list[float]:
        """s_l: RMS of each layer's input over the labelled tokens of step 0's batch (gate-independent:
        routing is forced), so a resumed run recomputes the same values."""
        if not self.config.precondition:
            return [1.0] * self.model.num_layers
        device = next(self.model.gates.parameters()).device
        ids, attn, labels, slots = collate(self.batch_for(0), self.pad_id, device)
        inputs = layer_inputs_under_forcing(self.model, ids, attn, slots)
        keep = labels.reshape(-1)
        return [max(float(h.reshape(-1, h.shape[-1])[keep].float().pow(2).mean().sqrt()), 1e-6) for h in inputs]

    def _write_back(self) -> None:
        with torch.no_grad():
            for gate, weight, scale in zip(self.model.gates, self.weights, self.scales, strict=True):
                gate.weight.copy_(weight / scale)

    # batch of step s: a pure function of (seed, s)
    def batch_for(self, step: int) -> list[ProvenanceExample]:
        n = len(self.train_set)
        size = min(self.config.per_device_train_batch_size, n)
        per_epoch = max(n // size, 1)
        epoch, index = divmod(step, per_epoch)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.config.seed * 100_003 + epoch)).tolist()
        return [self.train_set[i] for i in order[index * size:(index + 1) * size]]

    def loss_on(self, examples: Sequence[ProvenanceExample]) -> torch.Tensor:
        """The warm-start loss of one batch (module docstring), differentiable in (V, b) only."""
        inputs, target = self._inputs(examples)  # L x [N, H], [N]
        terms = []
        for layer, hidden in enumerate(inputs):
            logits = F.linear(hidden / self.scales[layer], self.weights[layer], self.biases[layer])  # [N, K+1]
            loss = F.cross_entropy(logits, target)
            if self.config.load_balancing_coef:
                probs = F.softmax(logits, dim=-1)
                loss = loss + self.config.load_balancing_coef * load_balancing_loss(probs, logits.argmax(-1))
            terms.append(loss)
        return torch.stack(terms).mean()

    def step(self) -> float:
        self.model.train(False)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_on(self.batch_for(self.step_count))
        loss.backward()
        self.optimizer.step()
        self._write_back()
        self.step_count += 1
        value = float(loss.detach())
        self.losses.append(value)
        return value

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self) -> str | None:
        if self.store is None:
            return None
        parts = {GATES_FILE: gates_file_bytes(self.model),
                 OPTIMIZER_FILE: torch_bytes({"optimizer": self.optimizer.state_dict(),
                                              "weights": [w.detach().clone() for w in self.weights]}),
                 STATE_FILE: json.dumps({"step": self.step_count, "losses": self.losses,
                                         "config_digest": self.config.digest()}).encode()}
        uri = write_gate_checkpoint(self.store, self.prefix, self.step_count, self.config.digest(), parts)
        self.checkpoints.append(uri)
        self.on_event("checkpoint", {"step": self.step_count, "uri": uri})
        return uri

    def resume(self, manifest_key: str | None = None) -> int | None:
        """Load the latest (or the given) checkpoint; returns its step, None when there is none."""
        if self.store is None:
            return None
        if manifest_key is None:
            found = list_gate_checkpoints(self.store, self.prefix)
            if not found:
                return None
            manifest_key = found[-1][1]
        data = read_gate_checkpoint(self.store, manifest_key, self.config.digest())
        self.model.load_gate_state_dict(gates_file_tensors(data[GATES_FILE]))
        saved = torch_load_bytes(data[OPTIMIZER_FILE])
        with torch.no_grad():
            for weight, value in zip(self.weights, saved["weights"], strict=True):
                weight.copy_(value)
        self.optimizer.load_state_dict(saved["optimizer"])
        state = json.loads(data[STATE_FILE])
        self.step_count = int(state["step"])
        self.losses = [float(x) for x in state.get("losses", [])]
        self.checkpoints = [self.store.uri_for(manifest_key)]  # this step's checkpoint exists: not rewritten
        return self.step_count

    # -- the loop -----------------------------------------------------------------------------
    def train(self, *, resume: bool | str = True) -> GateTrainingResult:
        started = time.perf_counter()
        resumed = None
        if resume:
            resumed = self.resume(None if resume is True else str(resume))
        stopped = False
        while self.step_count < self.config.max_steps:
            if self.should_stop():
                stopped = True
                break
            loss = self.step()
            self.on_event("iteration", {"step": self.step_count, "loss": loss})
            if self.config.save_steps and self.step_count % self.config.save_steps == 0:
                self.save_checkpoint()
        if self.step_count and (not self.checkpoints or not self.checkpoints[-1].endswith(
                f"/ckpt-{self.step_count}/{CKPT_MANIFEST}")):
            self.save_checkpoint()
        self.optimizer.zero_grad(set_to_none=True)  # no warm-start gradient may leak into a later optimizer
        for b in self.biases:
            b.requires_grad_(False)
        train = routing_report(self.model, self.train_set, pad_id=self.pad_id)
        held = routing_report(self.model, self.heldout, pad_id=self.pad_id)
        measured = held if held is not None else train
        assert measured is not None and train is not None  # the training set is never empty
        slots_n = self.model.num_slots
        result = GateTrainingResult(
            steps=self.step_count, resumed_from=resumed, losses=list(self.losses), train_accuracy=train.accuracy,
            heldout_accuracy=None if held is None else held.accuracy, routing_share=measured.share,
            seconds=time.perf_counter() - started, stopped_early=stopped, checkpoints=list(self.checkpoints),
            heldout_accuracy_by_slot=[None if held is None else held.accuracy_of(k) for k in range(slots_n)],
            examples_per_slot=[sum(1 for e in [*self.train_set, *self.heldout] if e.slot == k)
                               for k in range(slots_n)])
        self.on_event("result", result.summary())
        return result


def train_gates(base_model: str, adapters: Mapping[str, str], provenance: Mapping[str, Sequence[Trajectory]],
                config: GateTrainingConfig | Mapping[str, Any] | None = None, *, store: ArtifactStore, prefix: str,
                cache_dir: str | Path | None = None, s3: S3Settings | None = None, device: str = "cpu",
                resume: bool | str = True, on_event: Callable[[str, dict[str, Any]], None] | None = None,
                should_stop: Callable[[], bool] | None = None, allowed: ModelRoots) -> GateTrainingResult:
    """Train the gates of base + adapters on provenance and write the composition artifact.

    Args:
        base_model: base model reference (HF dir, artifact URI of one, or built-in agent name); recorded
            as is in the manifest.
        allowed: where base_model and the adapters may lie (`trace_common.model_refs.ModelRoots`; a
            service passes its own, a trusted in-process caller `UNCONFINED`).
        adapters: capability name -> PEFT adapter directory (artifact URI or local path). The dict order
            is the slot order (slot k = k-th entry; slot 0 = base).
        provenance: capability name -> trajectories played in that capability's environment, and "base"
            -> the base's own trajectories on the target's tasks (slot 0). The assistant-generating
            positions of capability c's trajectories are labelled slot c (`labelled_examples.py`).
        config: `GateTrainingConfig` (or a dict of its fields).
        store, prefix: where checkpoints (`<prefix>/gates-ckpt/`) and the composition
            (`<prefix>/gates.safetensors`, `<prefix>/composition.json`) go, e.g. prefix `runs/<run>/moe`.
        resume: True = from the latest checkpoint under the prefix (if any); a checkpoint.json key to
            resume from that one; False = start fresh.

    Returns a `GateTrainingResult`; `.composition.manifest_uri` is what `LoadComposition` /
    `PolicyRef.composition_uri` / `load_composition` take. Events: ("iteration", {step, loss}),
    ("checkpoint", {step, uri}), ("result", summary).
    """
    from transformers import AutoTokenizer

    cfg = config if isinstance(config, GateTrainingConfig) else GateTrainingConfig(**dict(config or {}))
    if not adapters:
        raise InvalidArgument(field="adapters", expected="at least one capability adapter to compose")
    cache = Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir()) / "trace-compositions"
    base_dir = materialize(base_model, allowed=allowed, cache_dir=cache / "dirs", s3=s3, field="base_model")
    names = list(adapters)
    dirs = [materialize(uri, allowed=allowed, cache_dir=cache / "dirs", s3=s3, field="adapter_uris")
            for uri in adapters.values()]
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = load_causal_lm(base_dir, device=device).eval()
    model = ComposedMoEModel.from_adapter_dirs(base, dirs, names=names)
    examples = provenance_examples(tokenizer, provenance, [BASE_SLOT_NAME, *names], cfg)
    trainer = GateTrainer(model, examples, cfg, pad_id=pad_id(tokenizer), store=store, prefix=prefix,
                          on_event=on_event, should_stop=should_stop)
    result = trainer.train(resume=resume)
    if not result.stopped_early:
        result.composition = write_composition(
            store, prefix, model, base_model=base_model, adapter_uris=dict(adapters),
            routing_share=result.routing_share, training=result.summary())
        on_event and on_event("composition", {"uri": result.composition.manifest_uri,
                                              "gates_uri": result.composition.gates_uri})
    return result
