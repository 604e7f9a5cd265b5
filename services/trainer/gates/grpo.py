"""Gate training of an MoE composition as one job: warm start from outcome labels (or, as the
ablation, provenance labels), then GRPO on the gates only (backbone and adapters frozen) over the
target's training tasks.

The warm start's labels (`warm_start_labels`):
* `outcome` (default; `outcomes.py`): every slot alone -- the plain base (slot 0) and each adapter
  (routing forced to it) -- replays `warm_start_tasks` of the target's training tasks
  (`warm_start_samples_per_slot` episodes each); each task is labelled with the slot that scores
  there (ties: the base, then the lowest index; no slot scoring: no label, or the
  `warm_start_fallback_score` entry of the reward breakdown), and the warm start fits the gates to
  that slot's own trajectories on it. The replays -- tasks x (K+1) x samples -- are played here and
  counted. The replay tasks are the last of GRPO's seed schedule, GRPO's the first (disjoint while
  GRPO draws fewer than the split minus the replay tasks).
* `provenance` (`provenance.py`), the ablation that measures what outcome labels add: each
  adapter's slot gets `warm_start_episodes` episodes of its capability environment, played here by
  the composition with routing forced to that slot; slot 0 (the plain base) gets the base agent's
  own trajectories on the target's training tasks (the rollout stage's output,
  `base_provenance_uris`; not played here and not counted here: the rollout stage played them). The
  episodes played here -- K * warm_start_episodes -- are counted.
Only the routing decisions that generate assistant tokens are labelled (`labelled_examples.py`).

GRPO. The adapters' GRPO loop (`services.trainer.grpo.trainer.GRPOTrainer`) runs unchanged with
`GateWeights` as its trainable weights, on the target environment's training split only (several
target environments: a seeded mixture of them, `build_mixture`; never the capability environments,
which the adapters already trained on): the policy is the composed model (hard top-1 routing per
token and layer; the gates learn through the straight-through factor of `composed.py`), rollouts
come from the same in-process backend, the loss is the clipped surrogate on assistant tokens plus
`load_balancing_coef` times the Switch load-balancing term, the KL reference (beta > 0) is the
plain base (slot 0 forced), and checkpoints carry the gates + optimizer + RNG + seed cursor.
Uninformative groups are re-collected by that loop's own mechanism (`max_resample_rounds`, 3 here
by default: fresh tasks from the seed schedule replace the dropped groups, up to that many rounds).

Semantics (one job):
    data <- stored warm-start data (replays or provenance) with the same digest, else play it (and store it)
    gates <- warm_start(data)                         if warm_start_steps > 0 (else the seeded init;
                                                      zeroed when no replay task gave a label)
    for it in 1..max_steps: GRPO iteration on the target's training tasks, only the gates in the optimizer
    write gates.safetensors + composition.json (composition_io.write_composition)

Budget (every "iteration" event, Job.metrics, metrics.jsonl): rollouts_total, prompt_tokens_total and
completion_tokens_total count every episode this job played -- the warm start's replays or
provenance episodes (iteration 0 reports them alone), then every GRPO episode, re-collected groups
included (the GRPO trainer's own totals, carried in its checkpoints) -- and warm_start_rollouts the
warm-start part. That part is read back from its stored record when a resumed job skips the warm
start, so a resumed job reports what an uninterrupted one does; a job resumed with nothing left to
run re-reports its last iteration, so its metrics carry the totals too.

Resume: a GRPO checkpoint under the job prefix (or the one named) restores gates, optimizer, RNG
and seed cursor and skips the warm start; otherwise the warm start continues from its newest
checkpoint fitted to the same data (`<prefix>/gates-ckpt/`), which also re-reports a finished
warm start without replaying any episode.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator, model_validator
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from services.trainer.gates.labelled_examples import pad_id, provenance_examples
from services.trainer.gates.outcomes import obtain_outcomes, recorded_outcome_budget
from services.trainer.gates.provenance import (
    PlayedBudget,
    obtain_provenance,
    play_provenance,
    recorded_budget,
    select_base_provenance,
)
from services.trainer.gates.warm_start import GateTrainer, GateTrainingConfig
from services.trainer.gates.warm_start_checkpoints import CKPT_DIR, list_gate_checkpoints
from services.trainer.grpo import checkpoint as ckpt
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.rollouts import EnvFactory, PolicyRollouts
from services.trainer.grpo.trainable import TrainableWeights
from services.trainer.grpo.trainer import EventFn
from trace_common.artifacts import ArtifactStore
from trace_common.env import Environment, Observation, StepResult
from trace_common.env.trajectory import Trajectory
from trace_common.errors import ArtifactCorrupted, FailedPrecondition, InvalidArgument, NotFound
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import (
    BASE_SLOT_NAME,
    GATES_FILE,
    MANIFEST_FILE,
    CompositionArtifact,
    gates_metadata,
    write_composition,
)
from trace_common.specs import check_uri

log = logging.getLogger(__name__)

_LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


#: Fields only one kind of warm-start label reads. Set to anything but its default under the other kind
#: a field would do nothing, so the config refuses it (a setting that is configured but inert is an
#: error, not a no-op); a default value passes, so a fully dumped config (ValidateTrainingConfig's
#: answer, the worker's spec) parses again, as the LoRA fields' rule does.
_ONLY_FOR: dict[str, frozenset[str]] = {
    "provenance": frozenset({"warm_start_episodes", "base_provenance", "base_provenance_uris"}),
    "outcome": frozenset({"warm_start_tasks", "warm_start_samples_per_slot", "warm_start_temperature",
                          "warm_start_fallback_score"}),
}


class GateGRPOConfig(GRPOConfig):
    """Gate-training job config: the GRPO fields (TRL names, same meaning, applied to the gates) plus
    the warm start's. `lora_*` do not apply (the adapters are frozen) and are refused when set to
    anything but their defaults."""

    max_steps: int = Field(20, ge=0, le=1_000_000,
                           description="GRPO iterations on the gates after the warm start (0 = warm start only).")
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0, description="AdamW learning rate of the gates in GRPO.")
    load_balancing_coef: float = Field(
        0.01, ge=0.0, le=10.0, description="Weight of the Switch load-balancing term added to the GRPO loss.")
    max_resample_rounds: int = Field(
        3, ge=0, le=16, description="Uninformative (constant-reward) GRPO groups on the gates, and groups cut short by a "
                                    "policy error or timeout, are dropped and up to this many extra rounds draw fresh "
                                    "target training tasks to replace them; every "
                                    "re-collected episode is counted in rollouts_total (0: train on the informative "
                                    "groups only). 3, as the reference re-collects.")
    warm_start_steps: int = Field(100, ge=0, le=1_000_000,
                                  description="Warm-start optimizer steps on the labelled sequences (0 = no warm start).")
    warm_start_labels: Literal["outcome", "provenance"] = Field(
        "outcome", description="Where the warm start's labels come from. `outcome` (default): every slot alone (the "
                               "base, each adapter) replays `warm_start_tasks` target training tasks and each task is "
                               "labelled with the slot that scores there, trained on that slot's own trajectory "
                               "(outcomes.py). `provenance`: each token is labelled with the environment its "
                               "trajectory came from (provenance.py) -- kept only as the ablation that measures what "
                               "outcome labels add (it learns which environment a prompt looks like, not which adapter "
                               "helps on the task).")
    warm_start_tasks: int = Field(
        32, ge=1, le=65_536, description="Outcome labels: target training tasks every slot replays (the last of GRPO's "
                                         "seed schedule, disjoint from the tasks GRPO on the gates draws first). The "
                                         "replays cost warm_start_tasks x (K+1) x warm_start_samples_per_slot episodes, "
                                         "counted in the job's budget.")
    warm_start_samples_per_slot: int = Field(
        1, ge=1, le=64, description="Outcome labels: episodes per slot and task, at the GRPO sampling settings; a "
                                    "slot's score on a task is its mean reward over them.")
    warm_start_temperature: float | None = Field(
        None, ge=0.0, le=5.0, description="Outcome labels: sampling temperature of the replays (0 = greedy, as the "
                                          "evaluation decodes; then warm_start_samples_per_slot must be 1). None "
                                          "(default): `temperature`, GRPO's.")
    warm_start_fallback_score: str = Field(
        "", max_length=64, pattern=r"^([a-z][a-z0-9_]*)?$",
        description="Outcome labels: a reward_breakdown entry (e.g. the store's `subrequests`, the share of "
                    "sub-requests fulfilled) that labels the tasks where no slot scores a reward above 0; the slot "
                    "with its highest mean wins, as for the reward. Empty (default): such tasks give no label.")
    warm_start_episodes: int = Field(
        16, ge=1, le=4096, description="Provenance labels only: episodes played per capability environment; also the "
                                       "most base trajectories slot 0 takes.")
    warm_start_learning_rate: float = Field(5e-3, gt=0.0, le=1.0, description="AdamW learning rate of the warm start.")
    warm_start_batch_size: int = Field(8, ge=1, le=4096, description="Provenance sequences per warm-start step.")
    warm_start_max_length: int = Field(
        8192, ge=8, le=1 << 17, description="Tokens kept per provenance sequence (GateTrainingConfig.max_length: keep "
                                            "it above the target's prompt, or its replies carry no label).")
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0,
                                    description="Share of provenance kept out of the warm start to measure routing "
                                                "accuracy.")
    base_provenance_uris: list[str] = Field(
        default_factory=list, max_length=64,
        description="Provenance labels only (outcome labels replay the base themselves): trajectory files (JSONL "
                    "artifacts in the trainer's store) of the base agent on the target's training tasks: slot 0's "
                    "warm-start examples. The pipeline passes the rollout stage's output. Empty: slot 0 gets no "
                    "example (logged; the gates then never learn to choose the base).")
    base_provenance: Literal["successful", "all", "none"] = Field(
        "successful", description="Provenance labels only: which base trajectories label slot 0: the successful ones "
                                  "(default: the base acted right there), all of them, or none (provenance.py says "
                                  "why).")

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "target_fraction" in data:
                raise ValueError("target_fraction: GRPO on the gates plays the target's training tasks only (the "
                                 "capability environments are the adapters' own); remove the field")
            if "warm_start_tokens" in data:
                raise ValueError("warm_start_tokens: provenance labels only the decisions that generate assistant "
                                 "tokens; remove the field")
        return data

    @field_validator("base_provenance_uris")
    @classmethod
    def _uris(cls, v: list[str]) -> list[str]:
        for i, uri in enumerate(v):
            check_uri(uri, f"base_provenance_uris[{i}]")
        return v

    @model_validator(mode="after")
    def _gates_only(self) -> GateGRPOConfig:
        if self.rollout_backend != "in_process":
            raise ValueError("rollout_backend must be 'in_process' for gate training: the composition routes every "
                             "token through its gates, which a vLLM LoRA server cannot do; remove rollout_backend")
        set_lora = sorted(f for f in _LORA_FIELDS
                          if f in self.model_fields_set and getattr(self, f) != GRPOConfig.model_fields[f].default)
        if set_lora:
            raise ValueError(f"{', '.join(set_lora)}: gate training composes frozen adapters, so LoRA settings do not "
                             "apply; remove them")
        if self.max_steps == 0 and self.warm_start_steps == 0:
            raise ValueError("max_steps=0 and warm_start_steps=0 train nothing; set warm_start_steps (e.g. 100) "
                             "and/or max_steps (GRPO iterations)")
        if self.warm_start_temperature == 0 and self.warm_start_samples_per_slot > 1:
            raise ValueError("warm_start_temperature 0 (greedy) replays the same episode every sample; set "
                             "warm_start_samples_per_slot 1, or a warm_start_temperature above 0")
        if self.gradient_checkpointing:
            raise ValueError("gradient_checkpointing does not apply to gate training (the backbone gets no "
                             "gradient); remove it")
        other = "provenance" if self.warm_start_labels == "outcome" else "outcome"
        inert = sorted(f for f in _ONLY_FOR[other] & self.model_fields_set
                       if getattr(self, f) != type(self).model_fields[f].get_default(call_default_factory=True))
        if inert:
            raise ValueError(f"{', '.join(inert)}: {other} labels only, and warm_start_labels is "
                             f"'{self.warm_start_labels}'; remove them, or set warm_start_labels: {other}")
        return self

    def warm_start_config(self, data_digest: str = "") -> GateTrainingConfig:
        return GateTrainingConfig(learning_rate=self.warm_start_learning_rate, max_steps=self.warm_start_steps,
                                  per_device_train_batch_size=self.warm_start_batch_size,
                                  max_length=self.warm_start_max_length, heldout_fraction=self.heldout_fraction,
                                  save_steps=self.save_steps, seed=self.seed, data_digest=data_digest)


# ---- the gates as GRPO's trainable weights -------------------------------------------------------
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


# ---- the mixture of environments ------------------------------------------------------------------
@dataclass(frozen=True)
class MixtureSource:
    """One environment of the GRPO mixture: a label (capability name or the target's), a factory,
    its training seeds and its sampling weight."""

    label: str
    factory: EnvFactory
    seeds: Sequence[int]
    weight: float


@dataclass(frozen=True)
class Mixture:
    sources: tuple[MixtureSource, ...]
    size: int = 1_000_000  # mixture seeds (each maps to one source instance)
    max_turns: int = 20

    def factory(self) -> MixtureEnv:
        return MixtureEnv(self)

    def pick(self, seed: int) -> tuple[MixtureSource, int]:
        """Semantics: u = Random(seed).random(); source j = first with cumulative weight > u;
        instance = Random(seed).choice(source j's seeds) (drawn after u)."""
        rng = random.Random(seed)
        u = rng.random() * sum(s.weight for s in self.sources)
        acc = 0.0
        chosen = self.sources[-1]
        for source in self.sources:
            acc += source.weight
            if u < acc:
                chosen = source
                break
        return chosen, int(chosen.seeds[rng.randrange(len(chosen.seeds))])


def build_mixture(target_envs: Sequence[tuple[str, EnvFactory]], *, split: str,
                  splits: Mapping[str, str] | None = None) -> Mixture:
    """The GRPO mixture of several target environments, equal weights (module docstring); each source's
    seeds (its `splits[label]`, default `split`) are read once here."""
    if not target_envs:
        raise InvalidArgument(field="spec.environments", expected="the target environment (GRPO on the gates plays "
                              "the target's training tasks)", fix="list the target after the capability environments, "
                              "with params split=train")
    sources: list[MixtureSource] = []
    max_turns = 1
    for label, factory in target_envs:
        probe = factory()
        have = probe.splits()
        want = (splits or {}).get(label) or split
        if want not in have or len(have[want]) == 0:
            raise InvalidArgument(field="spec.environments", expected=f"environment {probe.name!r} to define a "
                                  f"non-empty {want!r} split", got=sorted(have),
                                  fix="set config.train_split (or the environment's split param) to a split it "
                                      "defines")
        max_turns = max(max_turns, int(probe.default_max_turns))
        sources.append(MixtureSource(label, factory, have[want], 1.0 / len(target_envs)))
    return Mixture(tuple(sources), max_turns=max_turns)


class MixtureEnv(Environment):
    """Plays the instance a mixture seed maps to (`Mixture.pick`); everything else is delegated to
    that source's environment (created lazily, one per source, per MixtureEnv instance)."""

    name: ClassVar[str] = "gate-mixture"
    version: ClassVar[str] = "1.0.0"

    def __init__(self, mixture: Mixture):
        self.mixture = mixture
        self.default_max_turns = mixture.max_turns  # type: ignore[misc]
        self._envs: dict[str, Environment] = {}
        self._env: Environment | None = None
        self._label = ""

    def splits(self) -> dict[str, Sequence[int]]:
        return {"train": range(self.mixture.size)}

    def _current(self) -> Environment:
        if self._env is None:
            raise FailedPrecondition("reset the mixture environment first")
        return self._env

    def reset(self, seed: int) -> Observation:
        source, inner = self.mixture.pick(self.check_seed(seed))
        if source.label not in self._envs:
            self._envs[source.label] = source.factory()
        self._env, self._label = self._envs[source.label], source.label
        self.name = self._env.name  # type: ignore[misc] - trajectories name the environment actually played
        self.version = self._env.version  # type: ignore[misc]
        return self._env.reset(inner)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._current().tool_schemas()

    def step(self, action: Any) -> StepResult:
        return self._current().step(action)

    @property
    def done(self) -> bool:
        return self._current().done

    def reward(self) -> float:
        return self._current().reward()

    @property
    def task_id(self) -> str:
        return self._current().task_id

    def diagnostics(self) -> list[dict[str, Any]]:
        return self._current().diagnostics()

    def reward_breakdown(self) -> dict[str, float]:
        return self._current().reward_breakdown()

    def failure_reason(self) -> str | None:
        return self._current().failure_reason()

    def episode_info(self) -> dict[str, Any]:
        return {**self._current().episode_info(), "mixture_source": self._label}

    @property
    def termination(self):
        return self._current().termination


# ---- the job ----------------------------------------------------------------------------------------
@dataclass
class GateJobResult:
    iterations: int
    stop_reason: str
    stopped_early: bool
    warm_start: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    composition: CompositionArtifact | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)  # {"uri", "sha256", "size", "kind"}
    budget: PlayedBudget = field(default_factory=PlayedBudget)  # what the provenance episodes cost


def _matching_warm_start(store: ArtifactStore, prefix: str, digest: str) -> str | None:
    """Key of the newest warm-start checkpoint written with this config digest (provenance included)."""
    for _step, key in reversed(list_gate_checkpoints(store, prefix)):
        try:
            if json.loads(store.get_bytes(key)).get("config_digest") == digest:
                return key
        except (NotFound, ValueError):
            continue
    return None


def grpo_source(target_envs: Sequence[tuple[str, EnvFactory]], config: GateGRPOConfig,
                splits: Mapping[str, str] | None = None) -> tuple[EnvFactory, str, Sequence[int]]:
    """(environment factory, split name, its seeds) that GRPO on the gates plays: the one target's
    training split, or the mixture of several targets (its own `train` split). The outcome replays
    read the same seeds through the same schedule (outcomes.py)."""
    if len(target_envs) == 1:
        label, factory = target_envs[0]
        split = (splits or {}).get(label) or config.train_split
        return factory, split, factory().splits()[split]
    mixture = build_mixture(target_envs, split=config.train_split, splits=splits)
    return mixture.factory, "train", range(mixture.size)


@dataclass
class _LabelledData:
    """What the warm start fits, whichever labels: slot name -> trajectories, the episodes this job
    played for them, their digest, and a summary for the job's events."""

    trajectories: dict[str, list[Trajectory]]
    budget: PlayedBudget
    digest: str
    summary: dict[str, Any]


def _labelled_data(composed: ComposedMoEModel, tokenizer: Any, capability_envs: Mapping[str, EnvFactory],
                   target_envs: Sequence[tuple[str, EnvFactory]], base: Sequence[Trajectory], config: GateGRPOConfig,
                   *, store: ArtifactStore | None, prefix: str, splits: Mapping[str, str] | None) -> _LabelledData:
    if config.warm_start_labels == "outcome":
        factory, _split, seeds = grpo_source(target_envs, config, splits)
        outcomes = obtain_outcomes(composed, tokenizer, factory, seeds, config, targets=[t for t, _ in target_envs],
                                   store=store, prefix=prefix, splits=splits)
        return _LabelledData(outcomes.trajectories, outcomes.budget, outcomes.digest,
                             {"outcomes": outcomes.summary([BASE_SLOT_NAME, *composed.adapter_names])})
    provenance = obtain_provenance(composed, tokenizer, capability_envs, base, config, store=store, prefix=prefix,
                                   splits=splits)
    return _LabelledData(provenance.trajectories, provenance.budget, provenance.digest,
                         {"provenance_reward_mean": {c: sum(t.reward for t in ts) / len(ts)
                                                     for c, ts in provenance.trajectories.items() if ts}})


def _warm_start_gates(composed: ComposedMoEModel, tokenizer: Any, capability_envs: Mapping[str, EnvFactory],
                      target_envs: Sequence[tuple[str, EnvFactory]], base: Sequence[Trajectory],
                      config: GateGRPOConfig, *, store: ArtifactStore | None, prefix: str, emit: EventFn,
                      should_stop: Callable[[], bool], splits: Mapping[str, str] | None = None
                      ) -> tuple[dict[str, Any] | None, PlayedBudget]:
    """Warm start (module docstring): (its summary, or None when stopped on request; what its data cost).
    Outcome labels where no slot scored on any replay task leave nothing to fit: the gates are zeroed
    (every token to the base, the choice no replay contradicts) and the summary says so."""
    data = _labelled_data(composed, tokenizer, capability_envs, target_envs, base, config, store=store, prefix=prefix,
                          splits=splits)
    names = [BASE_SLOT_NAME, *composed.adapter_names]
    if not any(data.trajectories.values()):
        log.warning("no slot scored on any of the outcome replay tasks: the warm start has nothing to fit; the gates "
                    "are zeroed (every token to the base). Raise warm_start_tasks or warm_start_samples_per_slot, or "
                    "set warm_start_fallback_score to a denser reward_breakdown entry")
        with torch.no_grad():
            for gate in composed.gates:
                gate.weight.zero_()
                gate.bias.zero_()
        return {"steps": 0, "skipped": "no slot scored on any replay task", "examples_per_slot": [0] * len(names),
                **data.summary}, data.budget
    wcfg = config.warm_start_config(data.digest)
    examples = provenance_examples(tokenizer, data.trajectories, names, wcfg)

    def on_event(kind: str, payload: dict[str, Any]) -> None:
        if kind == "iteration":
            emit("warm_start", {"step": payload["step"], "loss": payload["loss"]})
        elif kind == "checkpoint":
            emit("checkpoint", {"iteration": 0, "warm_start_step": payload["step"], "uri": payload["uri"]})

    trainer = GateTrainer(composed, examples, wcfg, pad_id=pad_id(tokenizer), store=store, prefix=prefix,
                          on_event=on_event, should_stop=should_stop)
    key = _matching_warm_start(store, prefix, wcfg.digest()) if store is not None else None
    result = trainer.train(resume=key or False)
    if result.stopped_early:
        return None, data.budget
    return {**result.summary(), **data.summary}, data.budget


def _warm_start_values(summary: dict[str, Any], budget: PlayedBudget, names: Sequence[str],
                       labels: str = "provenance") -> dict[str, float]:
    """Iteration 0's values: the warm start's loss and routing, its labels, and what its data cost."""
    values = budget.add_to({"warm_start_loss": float(summary.get("final_loss") or float("nan")),
                            "warm_start_steps": float(summary["steps"])})
    outcomes = summary.get("outcomes")
    if outcomes:
        values["outcome_tasks"] = float(outcomes["tasks"])
        values["outcome_labelled_tasks"] = float(outcomes["labelled_tasks"])
        values["outcome_labelled_by_fallback"] = float(outcomes["labelled_by_fallback"])
        for name in names:
            values[f"outcome_labels_{name}"] = float(outcomes["labels"].get(name, 0))
            values[f"outcome_reward_{name}"] = float(outcomes["reward_mean"].get(name, 0.0))
    if summary.get("heldout_accuracy") is not None:
        values["routing_accuracy"] = float(summary["heldout_accuracy"])
    for name, v in zip(names, summary.get("heldout_accuracy_by_slot") or [], strict=False):
        if v is not None:
            values[f"routing_accuracy_{name}"] = float(v)
    for name, n in zip(names, summary.get("examples_per_slot") or [], strict=False):
        values[f"{labels}_examples_{name}"] = float(n)
    for name, v in zip(names, summary.get("routing_share") or [], strict=False):
        values[f"routing_share_{name}"] = float(v)
    return values


def train_gate_job(config: GateGRPOConfig, composed: ComposedMoEModel, tokenizer: Any, *,
                   capability_envs: Mapping[str, EnvFactory], target_envs: Sequence[tuple[str, EnvFactory]] = (),
                   base_trajectories: Sequence[Trajectory] = (), adapter_uris: Mapping[str, str], base_model: str,
                   store: ArtifactStore | None, prefix: str, splits: Mapping[str, str] | None = None,
                   capability: str = "moe", on_event: EventFn | None = None,
                   should_stop: Callable[[], bool] | None = None, resume: bool | str = True) -> GateJobResult:
    """Warm start, then GRPO on the gates, then the composition artifact (module docstring).

    Args:
        composed: base + the K frozen adapters (slot k = composed.adapter_names[k-1]).
        capability_envs: adapter name -> factory of that capability's environment (every adapter needs
            one): the provenance warm start's episodes.
        target_envs: (label, factory) of the target: GRPO plays its training split (required when
            max_steps > 0), the outcome warm start replays its training tasks (required then too), and
            slot 0's base trajectories (provenance labels) must come from it.
        base_trajectories: provenance labels only: the base agent's trajectories on the target's
            training tasks (slot 0's provenance, `provenance.select_base_provenance` picks among them).
        splits: label -> the split its seeds come from (default: config.train_split).
        adapter_uris: adapter name -> PEFT adapter directory URI, recorded in the manifest.
        store, prefix: checkpoints (`<prefix>/ckpt-<it>/` for GRPO, `<prefix>/gates-ckpt/` for the warm
            start), the warm start's data (`<prefix>/outcomes/` or `<prefix>/provenance/`) and the composition (`<prefix>/gates.safetensors`,
            `<prefix>/composition.json`).
        resume: True = latest GRPO checkpoint under the prefix (else the warm start's); a GRPO
            checkpoint.json key = that one; False = start fresh.

    Events (`on_event(kind, payload)`, the trainer-service worker's shapes): "warm_start" {step, loss};
    "checkpoint" {iteration, uri, ...}; "iteration" {iteration, values} -- iteration 0 summarises the
    warm start, 1..max_steps are GRPO iterations; "phase" {iteration, phase} while one runs;
    "stopped" {iteration, reason}.
    """
    from services.trainer.grpo.session import prompt_renderer
    from services.trainer.grpo.trainer import GRPOTrainer
    from trace_common.policy.transformers_backend import TransformersPolicy

    emit = on_event or (lambda kind, payload: None)
    stop = should_stop or (lambda: False)
    missing = [n for n in composed.adapter_names if n not in capability_envs]
    if missing:
        raise InvalidArgument(field="capability_envs", expected="an environment for every adapter", got=missing)
    if config.max_steps and not target_envs:
        raise InvalidArgument(field="spec.environments", expected="the target environment after the capability "
                              "environments: GRPO on the gates plays the target's training tasks only",
                              fix="add the target with params split=train, or set max_steps 0 (warm start only)")
    outcome = config.warm_start_steps > 0 and config.warm_start_labels == "outcome"
    if outcome and not target_envs:
        raise InvalidArgument(field="spec.environments", expected="the target environment after the capability "
                              "environments: the outcome warm start replays every slot on the target's training tasks",
                              fix="add the target with params split=train, or set warm_start_labels: provenance")
    if store is None and resume not in (False, True):
        raise InvalidArgument(field="resume", expected="True/False without a store")
    provenance = config.warm_start_steps > 0 and config.warm_start_labels == "provenance"
    base = select_base_provenance(base_trajectories, target_envs, config, splits) if provenance else []
    if provenance and not base and config.base_provenance != "none":
        log.warning("no base trajectories were given (config.base_provenance_uris): slot 0 (the base) gets no "
                    "warm-start example, so the gates will not learn to choose it")
    weights = GateWeights(composed, config.load_balancing_coef)
    prefix = prefix.rstrip("/")
    grpo_ckpt: str | None = None
    if store is not None and resume:
        if isinstance(resume, str):
            grpo_ckpt = resume
        else:
            found = ckpt.latest_checkpoint(store, prefix)
            grpo_ckpt = found.key if found is not None else None
    budget = PlayedBudget()
    warm: dict[str, Any] = {}
    if config.warm_start_steps and grpo_ckpt is None:
        summary, budget = _warm_start_gates(composed, tokenizer, capability_envs, target_envs, base, config,
                                            store=store, prefix=prefix, emit=emit, should_stop=stop, splits=splits)
        if summary is None:
            return GateJobResult(0, "stop requested", True, budget=budget)
        warm = summary
        # gate training leaves the gates frozen: GRPO trains them from here
        weights = GateWeights(composed, config.load_balancing_coef)
        warm["values"] = _warm_start_values(summary, budget, weights.names, config.warm_start_labels)
        emit("iteration", {"iteration": 0, "values": warm["values"]})
    elif outcome:  # resumed in GRPO: the replays were played by an earlier attempt
        budget = recorded_outcome_budget(store, prefix, config.warm_start_tasks * composed.num_slots
                                         * config.warm_start_samples_per_slot)
    elif config.warm_start_steps:  # resumed in GRPO: the provenance was played by an earlier attempt
        budget = recorded_budget(store, prefix, len(capability_envs) * config.warm_start_episodes)

    history: list[dict[str, float]] = []
    iterations, stop_reason, early = 0, "completed", False
    if config.max_steps:
        env_factory, train_split, _seeds = grpo_source(target_envs, config, splits)
        policy = TransformersPolicy.from_model(composed.base, tokenizer, name=base_model or "composition",
                                               max_batch=config.generation_batch_size, max_wait_s=0.0)
        grpo_config = GRPOConfig.model_validate(config.model_dump(include=set(GRPOConfig.model_fields)))
        grpo_config = grpo_config.model_copy(update={"train_split": train_split})
        reported = {"any": False}

        def forward(kind: str, payload: dict[str, Any]) -> None:
            if kind == "iteration":
                reported["any"] = True
                payload = dict(payload, values=budget.add_to(payload["values"]))
            emit(kind, payload)

        trainer = GRPOTrainer(grpo_config, composed.base, env_factory, CountingRollouts(policy, weights),
                              render=prompt_renderer(policy), pad_id=policy.pad_id, store=store, prefix=prefix,
                              capability=capability, on_event=forward, should_stop=stop, model_label=base_model,
                              weights=weights)
        result = trainer.train(resume=grpo_ckpt or False, write_adapter=False)
        iterations, stop_reason, early = result.iterations, result.stop_reason, result.stopped_early
        history = [budget.add_to(h) for h in result.history]
        if not reported["any"] and history:  # resumed with nothing left to run: the job's metrics need the totals
            emit("iteration", {"iteration": iterations, "values": dict(history[-1]), "replayed": True})
        if stop_reason == "stop requested":
            return GateJobResult(iterations, stop_reason, True, warm, history, budget=budget)
    share = _final_share(weights, history, warm)
    totals = history[-1] if history else budget.add_to({})
    training = {"warm_start": {k: v for k, v in warm.items() if k != "values"}, "grpo_iterations": iterations,
                "stop_reason": stop_reason, "config": config.model_dump(mode="json"),
                **{k: totals[k] for k in ("rollouts_total", "prompt_tokens_total", "completion_tokens_total",
                                          "warm_start_rollouts")}}
    out = GateJobResult(iterations, stop_reason, early, warm, history, budget=budget)
    if store is not None:
        art = write_composition(store, prefix, composed, base_model=base_model, adapter_uris=dict(adapter_uris),
                                routing_share=share, training=training)
        out.composition = art
        for uri, key, kind in ((art.manifest_uri, f"{prefix}/{MANIFEST_FILE}", "composition"),
                               (art.gates_uri, f"{prefix}/{GATES_FILE}", "gates")):
            stat = store.stat(key)
            out.outputs.append({"uri": uri, "sha256": stat.sha256, "size": stat.size, "kind": kind})
        if history:
            info = store.put_bytes(f"{prefix}/metrics.jsonl",
                                   "".join(json.dumps(h, sort_keys=True) + "\n" for h in history).encode())
            out.outputs.append({"uri": info.uri, "sha256": info.sha256, "size": info.size,
                                "kind": "training_metrics"})
    return out


def _final_share(weights: GateWeights, history: list[dict[str, float]], warm: dict[str, Any]) -> list[float]:
    """Routing share per slot: the last GRPO iteration's rollouts, else the warm start's held-out tokens."""
    if history:
        last = history[-1]
        share = [last.get(f"routing_share_{n}") for n in weights.names]
        if all(v is not None for v in share):
            return [float(v) for v in share]  # type: ignore[arg-type]
    return [float(v) for v in warm.get("routing_share") or []]


__all__ = ["CKPT_DIR", "CountingRollouts", "GateGRPOConfig", "GateJobResult", "GateWeights", "Mixture",
           "MixtureEnv", "PlayedBudget", "build_mixture", "play_provenance", "train_gate_job"]
