"""The gate warm start's outcome labels: which slot actually scores on each target training task.

Provenance labels (`provenance.py`) say which environment a token came from, not which adapter
helps on a task: where a capability environment does not look like the target, they teach the
gates to recognise the environment's prompts, which never occur in the target. Outcome labels
measure instead (as the reference fits its warm start to each adapter's per-seed reward): the
gates job replays every slot alone -- the base (slot 0, routing forced to 0) and each adapter
(slot k, routing forced to k at every layer) -- on `warm_start_tasks` of the target's training
tasks, `warm_start_samples_per_slot` episodes per slot and task, at the GRPO sampling settings (its
temperature unless `warm_start_temperature` is set: 0 asks which slot scores under greedy decoding,
as the evaluation decodes), and records each slot's reward per task. Every replay episode is played by the gates job and counted
in its budget (`PlayedBudget`: `warm_start_rollouts`, inside `rollouts_total`).

Which tasks. The target GRPO on the gates plays (one target: its training split; several: their
seeded mixture, `mixture.build_mixture`), read through GRPO's own seed schedule
(`services.trainer.grpo.seeds.SeedSchedule`, same split, same seed): the replays take the *last*
`warm_start_tasks` positions of its first pass, GRPO draws from the first. The two are disjoint as
long as GRPO draws fewer than `len(split) - warm_start_tasks` seeds (max_steps x groups_per_batch x
(1 + max_resample_rounds) at most; a run that could draw more is logged as overlapping). With a
mixture, disjoint means distinct mixture seeds: two mixture seeds may still map to one instance.
Every slot plays the same sampling seed on the same task and sample (common random numbers), so
the slots differ by their routing only.

The label of a task (`label_task`; `warm_start_fallback_score` names an optional denser score):

Semantics:
    r[s] = mean reward of slot s's samples on the task                         # [K+1]
    if max r > 0:  score = reward                                             ("reward")
    elif fallback key f and max_s mean breakdown[f] > 0:  score = breakdown[f] ("fallback"; missing = 0)
    else:  no label (the task gives no example)
    winners = {s : mean score of s == max_s mean score of s}
    if winners == every slot and warm_start_tie_label == "none":  no label (an uninformative task)
    label = 0 if 0 in winners else min(winners)   # ties: the base, then the lowest adapter index
    examples = label's samples on the task whose score equals its best sample's score

Ties prefer the base: where the plain base already scores, no adapter is needed, and routing to it
keeps the base's behaviour (docs/design.md: slot 0, "no adapter"). A tie among *every* slot says
nothing about which slot helps; with `warm_start_tie_label: none` such a task gives no label (with
the default, `base`, it labels the base like any other tie). Measured on the demo's seed-0 run
(2026-12-05): 8 of its 16 replay tasks were such ties, every slot meeting the same share of
sub-requests, and all of them labelled the base. The examples are the winning slot's
*own* trajectories, so the warm start's teacher forcing (routing forced to the label) replays
exactly the computation that scored.

Stored under `<prefix>/outcomes/`: `<slot name>.jsonl` per slot (task-major: task i's samples in
order), then, written last, `outcomes.json` with the digest of everything that determined them,
the task seeds, the per-task table and what playing them cost. A resumed job whose digest matches
reloads them instead of replaying: the same labels, and no episode played or counted twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from services.trainer.gates.provenance import (
    PlayedBudget,
    budget_dict,
    load_slot_files,
    played_config,
    save_slot_files,
)
from services.trainer.grpo.rollouts import EnvFactory, EpisodeSpec, play_groups
from services.trainer.grpo.seeds import SeedSchedule
from trace_common.artifacts import ArtifactStore
from trace_common.env.trajectory import Trajectory
from trace_common.errors import ArtifactCorrupted, InvalidArgument, NotFound
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import BASE_SLOT_NAME
from trace_common.policy.base import SamplingParams, derive_seed

log = logging.getLogger(__name__)

OUTCOMES_DIR = "outcomes"
RECORD_FILE = "outcomes.json"
#: Config fields that decide which episodes the replays hold and how they are labelled (the digest).
_PLAY_FIELDS = ("warm_start_tasks", "warm_start_samples_per_slot", "warm_start_fallback_score",
                "warm_start_temperature", "seed",
                "temperature", "top_p", "top_k", "max_completion_length", "max_turns", "episode_timeout_s",
                "train_split", "generation_batch_size")


@dataclass(frozen=True)
class TaskOutcome:
    """One replayed task: its seed, each slot's mean score, and the label it gives (None: none)."""

    seed: int
    rewards: list[float]  # [K+1] mean reward per slot
    label: int | None
    by: Literal["reward", "fallback", ""] = ""  # which score decided the label ("" = no label)
    scores: list[float] = field(default_factory=list)  # [K+1] mean of the deciding score per slot

    @property
    def tied(self) -> bool:
        """Every slot scored the same (above 0) on the deciding score."""
        return bool(self.scores) and max(self.scores) > 0 and all(_close(x, self.scores[0]) for x in self.scores)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "rewards": self.rewards, "label": self.label, "by": self.by,
                "scores": self.scores}


@dataclass
class Outcomes:
    """The replays, their per-task table, the warm start's labelled trajectories, cost and digest."""

    seeds: list[int]
    replays: dict[str, list[Trajectory]]  # slot name -> [tasks x samples] trajectories, task-major
    table: list[TaskOutcome]
    trajectories: dict[str, list[Trajectory]]  # slot name -> the examples it labels
    budget: PlayedBudget
    digest: str

    def summary(self, names: Sequence[str]) -> dict[str, Any]:
        """Counts and per-slot means for the job's events and the composition manifest."""
        labelled = [t for t in self.table if t.label is not None]
        n = max(len(self.table), 1)
        return {"tasks": len(self.table), "labelled_tasks": len(labelled),
                "labelled_by_fallback": sum(t.by == "fallback" for t in labelled),
                "tied_tasks": sum(t.tied for t in self.table),
                "labels": {name: sum(t.label == k for t in labelled) for k, name in enumerate(names)},
                "reward_mean": {name: sum(t.rewards[k] for t in self.table) / n for k, name in enumerate(names)},
                "table": [t.to_dict() for t in self.table]}


def replay_seeds(split: Sequence[int], config: Any) -> list[int]:
    """The replay tasks: the last `warm_start_tasks` positions of the first pass of GRPO's seed
    schedule over `split` (module docstring), logged when GRPO could reach them."""
    n = len(split)
    tasks = min(int(config.warm_start_tasks), n)
    if tasks < config.warm_start_tasks:
        log.warning("warm_start_tasks=%d but the target's training split has %d tasks: replaying all of them",
                    config.warm_start_tasks, n)
    drawn = config.max_steps * config.groups_per_batch * (1 + config.max_resample_rounds)
    if drawn > n - tasks:
        log.warning("GRPO on the gates may draw up to %d of the %d training tasks; the %d replay tasks are the "
                    "schedule's last, so some GRPO tasks may repeat replay tasks", drawn, n, tasks)
    return SeedSchedule(split, config.seed).take(n - tasks, tasks)


def play_replays(composed: ComposedMoEModel, tokenizer: Any, factory: EnvFactory, seeds: Sequence[int],
                 config: Any) -> dict[str, list[Trajectory]]:
    """slot name -> its `len(seeds) x warm_start_samples_per_slot` episodes with routing forced to it."""
    from trace_common.policy.transformers_backend import TransformersPolicy

    temperature = config.temperature if config.warm_start_temperature is None else config.warm_start_temperature
    params = SamplingParams(temperature=temperature, top_p=config.top_p, top_k=config.top_k,
                            max_tokens=config.max_completion_length)
    samples = int(config.warm_start_samples_per_slot)
    specs = [EpisodeSpec(seed=int(seed), group=i, index=j, guided=False,
                         sampling_seed=derive_seed(config.seed, "outcome", int(seed), j))  # the same for every slot
             for i, seed in enumerate(seeds) for j in range(samples)]
    out: dict[str, list[Trajectory]] = {}
    for slot, name in enumerate([BASE_SLOT_NAME, *composed.adapter_names]):
        policy = TransformersPolicy.from_model(composed.base, tokenizer, name=f"replay-{name}",
                                               max_batch=config.generation_batch_size, max_wait_s=0.0)

        async def play(policy=policy) -> list[Trajectory]:
            try:
                return await play_groups(policy, factory, specs, params=params, max_turns=config.max_turns or None,
                                         deadline_s=config.episode_timeout_s)
            finally:
                await policy.close()

        with composed.forced(slot):
            out[name] = asyncio.run(play())
        if slot == 0:
            check_fallback(out[name], str(config.warm_start_fallback_score))
    return out


def _score(trajectory: Trajectory, key: str) -> float:
    return float(trajectory.reward if not key else trajectory.reward_breakdown.get(key, 0.0))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=0.0, abs_tol=1e-9)


def label_task(per_slot: Sequence[Sequence[Trajectory]], fallback: str = "", ties: str = "base"
               ) -> tuple[int | None, str, list[float]]:
    """(label slot or None, which score decided it, that score's mean per slot) of one task, from
    each slot's samples on it (module docstring, Semantics); `ties`: warm_start_tie_label."""
    for key, by in (("", "reward"), *(((fallback, "fallback"),) if fallback else ())):
        means = [sum(_score(t, key) for t in ts) / len(ts) if ts else 0.0 for ts in per_slot]  # [K+1]
        best = max(means)
        if best > 0:
            winners = [s for s, m in enumerate(means) if _close(m, best)]
            if ties == "none" and len(winners) == len(means):
                return None, "", means
            return (0 if 0 in winners else min(winners)), by, means
    return None, "", []


def check_fallback(episodes: Sequence[Trajectory], fallback: str) -> None:
    """Refuse a fallback score none of `episodes` reports: a misspelt or foreign key would score every
    slot 0 and silently label nothing by the fallback. The keys are the target's, not the slot's, so the
    base's replays (played first, over every replay task) decide before the adapters play."""
    if fallback and episodes and not any(fallback in t.reward_breakdown for t in episodes):
        seen = sorted({k for t in episodes for k in t.reward_breakdown})
        raise InvalidArgument("no replay's reward_breakdown has it", field="warm_start_fallback_score",
                              expected=f"an entry of the target's reward_breakdown (these replays have "
                                       f"{', '.join(seen) or 'none'})", got=fallback,
                              fix="Set one of those, or leave it empty to label only the tasks some slot scores on")


def outcome_table(replays: Mapping[str, Sequence[Trajectory]], names: Sequence[str], seeds: Sequence[int],
                  samples: int, fallback: str = "", ties: str = "base"
                  ) -> tuple[list[TaskOutcome], dict[str, list[Trajectory]]]:
    """(per-task outcomes, slot name -> the trajectories it labels): the pure labelling of stored replays."""
    for name in names:
        if len(replays.get(name, ())) != len(seeds) * samples:
            raise ArtifactCorrupted(f"replays of slot {name!r}: {len(replays.get(name, ()))} episodes, expected "
                                    f"{len(seeds)} tasks x {samples} samples; delete <prefix>/{OUTCOMES_DIR}/ and rerun")
    check_fallback([t for name in names for t in replays[name]], fallback)
    table: list[TaskOutcome] = []
    labelled: dict[str, list[Trajectory]] = {}
    for i, seed in enumerate(seeds):
        per_slot = [list(replays[name][i * samples:(i + 1) * samples]) for name in names]  # [K+1][samples]
        rewards = [sum(t.reward for t in ts) / len(ts) for ts in per_slot]
        label, by, scores = label_task(per_slot, fallback, ties)
        table.append(TaskOutcome(int(seed), rewards, label, by, scores))
        if label is None:
            continue
        key = "" if by == "reward" else fallback
        own = per_slot[label]
        top = max(_score(t, key) for t in own)
        labelled.setdefault(names[label], []).extend(t for t in own if _close(_score(t, key), top))
    return table, labelled


def outcomes_digest(config: Any, adapter_names: Sequence[str], targets: Sequence[str],
                    splits: Mapping[str, str] | None = None, models: Mapping[str, Any] | None = None) -> str:
    """What determines the replays and their labels: the playing config, the adapters in slot order,
    the target environments and their splits, and the models that play (`models`: the base model and
    each adapter's fingerprint, `grpo.composition_identity`; replays of another base or of a retrained
    adapter are no labels for this composition)."""
    played = played_config(config, _PLAY_FIELDS)
    if getattr(config, "warm_start_tie_label", "base") != "base":  # the default leaves earlier digests valid
        played["warm_start_tie_label"] = config.warm_start_tie_label
    payload = {"config": played, "adapters": list(adapter_names),
               "targets": list(targets), "splits": dict(sorted((splits or {}).items())), "kind": "outcome"}
    if models:
        payload["models"] = dict(models)
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_outcomes(store: ArtifactStore, prefix: str, digest: str | None = None) -> Outcomes | None:
    """The stored replays, relabelled (None when there are none, or when `digest` is given and differs)."""
    loaded = load_slot_files(store, f"{prefix}/{OUTCOMES_DIR}", RECORD_FILE, digest)
    if loaded is None:
        return None
    record, replays = loaded
    seeds = [int(s) for s in record["seeds"]]
    ties = str(record.get("tie_label", "base"))   # records written before the field: the base, as then
    if ties not in ("base", "none"):
        raise ArtifactCorrupted(f"{prefix}/{OUTCOMES_DIR}/{RECORD_FILE}: tie_label {ties!r} is neither 'base' nor "
                                f"'none'; delete <prefix>/{OUTCOMES_DIR}/ and rerun")
    table, labelled = outcome_table(replays, list(record["slots"]), seeds, int(record["samples"]),
                                    str(record.get("fallback", "")), ties)
    return Outcomes(seeds, replays, table, labelled, PlayedBudget(**record["budget"]), str(record["digest"]))


def save_outcomes(store: ArtifactStore, prefix: str, outcomes: Outcomes, samples: int, fallback: str,
                  ties: str = "base") -> None:
    """Every slot's JSONL, then the record (`provenance.save_slot_files`)."""
    save_slot_files(store, f"{prefix}/{OUTCOMES_DIR}", RECORD_FILE, outcomes.replays,
                    {"digest": outcomes.digest, "seeds": outcomes.seeds, "samples": samples, "fallback": fallback,
                     "tie_label": ties,
                     "table": [t.to_dict() for t in outcomes.table], "budget": budget_dict(outcomes.budget)})


def obtain_outcomes(composed: ComposedMoEModel, tokenizer: Any, factory: EnvFactory, split: Sequence[int],
                    config: Any, *, targets: Sequence[str], store: ArtifactStore | None, prefix: str,
                    splits: Mapping[str, str] | None = None, models: Mapping[str, Any] | None = None) -> Outcomes:
    """The stored outcomes when their digest matches, else every slot replayed now (and stored)."""
    names = [BASE_SLOT_NAME, *composed.adapter_names]
    samples, fallback = int(config.warm_start_samples_per_slot), str(config.warm_start_fallback_score)
    ties = str(config.warm_start_tie_label)
    digest = outcomes_digest(config, composed.adapter_names, targets, splits, models)
    if store is not None:
        found = load_outcomes(store, prefix, digest)
        if found is not None:
            log.info("gate outcome replays under %s reused (digest %s): no episode replayed", prefix, digest)
            return found
        legacy = outcomes_digest(config, composed.adapter_names, targets, splits) if models else None
        found = load_outcomes(store, prefix, legacy) if legacy else None
        if found is not None:   # written before the models were part of the digest: as then, reused
            log.warning("gate outcome replays under %s were recorded before their models were part of the "
                        "digest: reused without checking that this base model and these adapters played them",
                        prefix)
            return found
    seeds = replay_seeds(split, config)
    replays = play_replays(composed, tokenizer, factory, seeds, config)
    table, labelled = outcome_table(replays, names, seeds, samples, fallback, ties)
    outcomes = Outcomes(seeds, replays, table, labelled,
                        PlayedBudget.of([t for ts in replays.values() for t in ts]), digest)
    if store is not None:
        save_outcomes(store, prefix, outcomes, samples, fallback, ties)
    return outcomes


def recorded_outcome_budget(store: ArtifactStore | None, prefix: str, fallback_episodes: int) -> PlayedBudget:
    """What the replays of an earlier attempt of this job cost (a GRPO resume skips the warm start);
    without a record, `fallback_episodes` (tasks x (K+1) x samples) without their tokens."""
    if store is not None:
        try:
            record = json.loads(store.get_bytes(f"{prefix}/{OUTCOMES_DIR}/{RECORD_FILE}"))
            return PlayedBudget(**record["budget"])
        except NotFound:
            pass
    if fallback_episodes:
        log.warning("no outcome record under %s: counting %d replay episodes without their tokens", prefix,
                    fallback_episodes)
    return PlayedBudget(episodes=fallback_episodes)
