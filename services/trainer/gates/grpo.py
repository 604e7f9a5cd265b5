"""Gate training of an MoE composition as one job: warm start from outcome labels (or, as the
ablation, provenance labels), then GRPO on the gates only (backbone and adapters frozen) over the
target's training tasks.

The warm start's labels (`warm_start_labels`):
* `outcome` (default; `outcomes.py`): every slot alone -- the plain base (slot 0) and each adapter
  (routing forced to it) -- replays `warm_start_tasks` of the target's training tasks
  (`warm_start_samples_per_slot` episodes each); each task is labelled with the slot that scores
  there (ties: the base, then the lowest index, or no label for a tie of every slot with
  `warm_start_tie_label: none`; no slot scoring: no label, or the
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
target environments: a seeded mixture of them, `mixture.build_mixture`; never the capability environments,
which the adapters already trained on): the policy is the composed model (hard top-1 routing per
token and layer; the gates learn through the straight-through factor of `composed.py`), rollouts
come from the same in-process backend, the loss is the clipped surrogate on assistant tokens plus
`load_balancing_coef` times the Switch load-balancing term, the KL reference (beta > 0) is the
plain base (slot 0 forced), and checkpoints carry the gates + optimizer + RNG + seed cursor.
Uninformative groups are re-collected by that loop's own mechanism (`max_resample_rounds`, 3 here
by default: fresh tasks from the seed schedule replace the dropped groups, up to that many rounds).

Semantics (one job):
    data <- stored warm-start data (replays or provenance) with the same digest (config, environments,
            splits, and the models: base model and each adapter's fingerprint), else play it (and store it)
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

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from services.trainer.gates import outcomes as outcome_labels
from services.trainer.gates import provenance as provenance_labels
from services.trainer.gates.config import GateGRPOConfig
from services.trainer.gates.labelled_examples import pad_id, provenance_examples
from services.trainer.gates.mixture import grpo_source
from services.trainer.gates.outcomes import obtain_outcomes, outcomes_digest, recorded_outcome_budget
from services.trainer.gates.provenance import (
    PlayedBudget,
    obtain_provenance,
    provenance_digest,
    recorded_budget,
    select_base_provenance,
)
from services.trainer.gates.warm_start import GateTrainer
from services.trainer.gates.warm_start_checkpoints import list_gate_checkpoints
from services.trainer.gates.weights import CountingRollouts, GateWeights
from services.trainer.grpo import checkpoint as ckpt
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.rollouts import EnvFactory
from services.trainer.grpo.trainer import EventFn
from trace_common.artifacts import ArtifactStore
from trace_common.env.trajectory import Trajectory
from trace_common.errors import InvalidArgument, NotFound
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import (
    BASE_SLOT_NAME,
    GATES_FILE,
    MANIFEST_FILE,
    CompositionArtifact,
    write_composition,
)

log = logging.getLogger(__name__)


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


def composition_identity(composed: ComposedMoEModel, base_model: str) -> dict[str, Any]:
    """The models a gate job's warm-start data comes from, part of that data's digest: the base model
    as the job names it, a built-in agent's build key (a rebuilt agent keeps its name) and each
    adapter's fingerprint (a retrained adapter may keep its URI)."""
    from services.trainer.worker import built_in_key

    return {"base_model": base_model, "base_key": built_in_key(base_model),
            "adapters": composed.adapter_fingerprints()}


def _same_composition(record: Any, base_model: str, models_key: str) -> bool:
    """Whether a GRPO checkpoint's record was written for this composition: its identity's model_key is
    the digest of `composition_identity` (base model, build key, adapter fingerprints). One written
    before identities were recorded, or before gate jobs recorded a model_key (""), is judged by its
    base model alone, as then."""
    if record.identity is None:
        return record.model in (None, base_model)
    return record.model == base_model and record.identity.get("model_key") in ("", models_key)


def _followed_this_warm_start(store: ArtifactStore, prefix: str, composed: ComposedMoEModel,
                              target_envs: Sequence[tuple[str, EnvFactory]], base: Sequence[Trajectory],
                              config: GateGRPOConfig, splits: Mapping[str, str] | None,
                              models: Mapping[str, Any] | None = None) -> bool:
    """Whether the GRPO checkpoints under `prefix` continue the warm start this config asks for: the
    stored warm-start data has the digest this config gives it (labels, tasks, samples, tie rule,
    fallback, ...), and, where a warm-start checkpoint exists, one was written with this config's
    warm-start settings. The GRPO resume check compares GRPO's own fields only, so without this a
    gate job re-run with other warm-start settings under the same prefix would skip its warm start
    and continue gates fitted to the old labels, while its composition recorded the new config."""
    if not config.warm_start_steps:
        return True
    if config.warm_start_labels == "outcome":
        where = f"{prefix}/{outcome_labels.OUTCOMES_DIR}/{outcome_labels.RECORD_FILE}"
        targets = [t for t, _ in target_envs]
        wanted = {outcomes_digest(config, composed.adapter_names, targets, splits, models),
                  outcomes_digest(config, composed.adapter_names, targets, splits)}  # + as recorded before models
    else:
        where = f"{prefix}/{provenance_labels.PROVENANCE_DIR}/{provenance_labels.RECORD_FILE}"
        wanted = {provenance_digest(config, composed.adapter_names, base, splits, models),
                  provenance_digest(config, composed.adapter_names, base, splits)}
    try:
        stored = json.loads(store.get_bytes(where)).get("digest")
    except (NotFound, ValueError):
        return False
    if stored not in wanted:
        return False
    return not list_gate_checkpoints(store, prefix) or \
        _matching_warm_start(store, prefix, config.warm_start_config(stored).digest()) is not None


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
                   *, store: ArtifactStore | None, prefix: str, splits: Mapping[str, str] | None,
                   models: Mapping[str, Any] | None = None) -> _LabelledData:
    if config.warm_start_labels == "outcome":
        factory, _split, seeds = grpo_source(target_envs, config, splits)
        outcomes = obtain_outcomes(composed, tokenizer, factory, seeds, config, targets=[t for t, _ in target_envs],
                                   store=store, prefix=prefix, splits=splits, models=models)
        return _LabelledData(outcomes.trajectories, outcomes.budget, outcomes.digest,
                             {"outcomes": outcomes.summary([BASE_SLOT_NAME, *composed.adapter_names])})
    provenance = obtain_provenance(composed, tokenizer, capability_envs, base, config, store=store, prefix=prefix,
                                   splits=splits, models=models)
    return _LabelledData(provenance.trajectories, provenance.budget, provenance.digest,
                         {"provenance_reward_mean": {c: sum(t.reward for t in ts) / len(ts)
                                                     for c, ts in provenance.trajectories.items() if ts}})


def _warm_start_gates(composed: ComposedMoEModel, tokenizer: Any, capability_envs: Mapping[str, EnvFactory],
                      target_envs: Sequence[tuple[str, EnvFactory]], base: Sequence[Trajectory],
                      config: GateGRPOConfig, *, store: ArtifactStore | None, prefix: str, emit: EventFn,
                      should_stop: Callable[[], bool], splits: Mapping[str, str] | None = None,
                      models: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, PlayedBudget]:
    """Warm start (module docstring): (its summary, or None when stopped on request; what its data cost).
    Outcome labels where no replay task gave a label (no slot scored, or, with warm_start_tie_label none,
    every slot tied) leave nothing to fit: the gates are zeroed (every token to the base, the choice no
    replay contradicts) and the summary says so."""
    data = _labelled_data(composed, tokenizer, capability_envs, target_envs, base, config, store=store, prefix=prefix,
                          splits=splits, models=models)
    names = [BASE_SLOT_NAME, *composed.adapter_names]
    if not any(data.trajectories.values()):
        tied = int(data.summary.get("outcomes", {}).get("tied_tasks", 0))
        why = (f"every slot tied on the {tied} tasks where one scored (warm_start_tie_label none: set it to base to "
               "label them with the base)" if tied else "no slot scored on any replay task (raise warm_start_tasks or "
               "warm_start_samples_per_slot, or set warm_start_fallback_score to a denser reward_breakdown entry)")
        log.warning("no outcome replay task gave a label: %s; the warm start has nothing to fit and the gates are "
                    "zeroed (every token to the base)", why)
        with torch.no_grad():
            for gate in composed.gates:
                gate.weight.zero_()
                gate.bias.zero_()
        return {"steps": 0, "skipped": "no replay task gave a label", "examples_per_slot": [0] * len(names),
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
        values["outcome_tied_tasks"] = float(outcomes.get("tied_tasks", 0))
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
    models = composition_identity(composed, base_model)
    models_key = hashlib.sha256(json.dumps(models, sort_keys=True).encode()).hexdigest()[:16]
    grpo_ckpt: str | None = None
    if store is not None and resume:
        if isinstance(resume, str):
            grpo_ckpt = resume
        else:
            # the newest trained on this composition (one of another base or of other adapters is no
            # continuation: a re-run of the run id with another base agent, or with retrained adapters,
            # trains its gates anew)
            found = ckpt.latest_checkpoint(store, prefix,
                                           accept=lambda c: _same_composition(ckpt.read_record(store, c.key),
                                                                              base_model, models_key))
            grpo_ckpt = found.key if found is not None else None
            if grpo_ckpt and not _followed_this_warm_start(store, prefix, composed, target_envs, base, config,
                                                           splits, models):
                log.warning("the GRPO checkpoints under %s followed a warm start with other settings or models: warm-starting "
                            "again and training GRPO on the gates from there", prefix)
                grpo_ckpt = None
    budget = PlayedBudget()
    warm: dict[str, Any] = {}
    if config.warm_start_steps and grpo_ckpt is None:
        summary, budget = _warm_start_gates(composed, tokenizer, capability_envs, target_envs, base, config,
                                            store=store, prefix=prefix, emit=emit, should_stop=stop, splits=splits,
                                            models=models)
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
                              weights=weights, model_key=models_key)
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


__all__ = ["GateJobResult", "train_gate_job"]
