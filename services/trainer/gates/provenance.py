"""The gate warm start's provenance: which trajectories label which slot, played once and kept.

* Slot k >= 1 (adapter c): `warm_start_episodes` episodes of c's environment, played by the
  composition itself with routing forced to slot k at every layer -- the base with adapter c, the
  policy c's adapter was trained to be -- at the GRPO sampling settings (`play_provenance`). Playing
  the adapters, not an oracle, teaches the gates the text each adapter actually produces and reads.
  These episodes are played by the gates job and count in its budget.
* Slot 0 (the plain base): the base agent's own trajectories on the target's training tasks -- the
  pipeline's rollout stage output, already in the artifact store (`config.base_provenance_uris`);
  the gates job plays none of them (that stage's episodes are counted where it ran). By default only
  the *successful* ones (`base_provenance: successful`), at most `warm_start_episodes` of them (the
  same count as each adapter's slot), drawn with a seeded choice (`select_base_provenance`). Why
  successful: slot 0 should win where the plain base already acts right. A failed base trajectory's
  replies are exactly the decisions an adapter should take over (the failures the analysis found and
  the adapters were trained for), so labelling them "base" would teach the gates to keep the failing
  behaviour. `all` (every base trajectory not cut short by a policy error or timeout) is there for a
  target the base rarely solves; `none` leaves slot 0 without examples (then the gates learn never to
  choose the base). Base trajectories must be the target's training tasks: one from another
  environment or outside the split GRPO trains on is refused (that would train on held-out tasks).

Stored under `<prefix>/provenance/`: `<slot name>.jsonl` per slot, then, written last,
`provenance.json` with the digest of everything that determined them and what playing them cost
(`PlayedBudget`). A resumed job whose digest matches reloads them instead of replaying: the same
examples, and no episode played or counted twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.trainer.grpo.rollouts import EnvFactory, EpisodeSpec, play_groups
from trace_common.artifacts import ArtifactStore
from trace_common.env import Termination
from trace_common.env.trajectory import Trajectory, dumps_jsonl, loads_jsonl
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import BASE_SLOT_NAME
from trace_common.policy.base import SamplingParams, derive_seed

log = logging.getLogger(__name__)

PROVENANCE_DIR = "provenance"
RECORD_FILE = "provenance.json"
#: Config fields that decide which episodes the provenance holds (part of its digest).
_PLAY_FIELDS = ("warm_start_episodes", "seed", "temperature", "top_p", "top_k", "max_completion_length", "max_turns",
                "episode_timeout_s", "train_split", "generation_batch_size", "base_provenance")


@dataclass(frozen=True)
class PlayedBudget:
    """Episodes the gates job played for its provenance, with their tokens (as the backend reported
    them: every turn's full prompt, and its completion -- the GRPO trainer's convention)."""

    episodes: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> PlayedBudget:
        return cls(episodes=len(trajectories),
                   prompt_tokens=sum(len(r.prompt_token_ids or []) for t in trajectories for r in t.turns),
                   completion_tokens=sum(len(r.completion_token_ids or []) for t in trajectories for r in t.turns))

    def add_to(self, values: Mapping[str, float]) -> dict[str, float]:
        """`values` with this budget added to its running totals (missing totals count from 0)."""
        out = dict(values)
        for key, extra in (("rollouts_total", self.episodes), ("prompt_tokens_total", self.prompt_tokens),
                           ("completion_tokens_total", self.completion_tokens)):
            out[key] = float(out.get(key, 0.0)) + float(extra)
        out["warm_start_rollouts"] = float(self.episodes)
        return out


@dataclass
class Provenance:
    """Slot name ("base" or an adapter) -> its trajectories, what playing them cost, and their digest."""

    trajectories: dict[str, list[Trajectory]]
    budget: PlayedBudget
    digest: str


def select_base_provenance(trajectories: Sequence[Trajectory], targets: Sequence[tuple[str, EnvFactory]],
                           config: Any, splits: Mapping[str, str] | None = None) -> list[Trajectory]:
    """Slot 0's trajectories among the base agent's (module docstring): every one must come from a
    target environment's GRPO split; then the successful ones (or all), at most `warm_start_episodes`,
    a seeded choice kept in file order."""
    if config.base_provenance == "none" or not trajectories:
        return []
    allowed: dict[str, Any] = {}
    for label, factory in targets:
        env = factory()
        split = (splits or {}).get(label) or config.train_split
        seeds = env.splits().get(split, ())
        allowed.setdefault(env.name, []).append(seeds if isinstance(seeds, range) else frozenset(seeds))
    outside = [t for t in trajectories if not any(t.seed in seeds for seeds in allowed.get(t.env.name, []))]
    if outside:
        first = outside[0]
        raise InvalidArgument(
            field="config.base_provenance_uris",
            expected=f"the base agent's trajectories on the target's training tasks ({sorted(allowed)}, the split GRPO "
                     "on the gates trains on)", got=f"{len(outside)} of {len(trajectories)} trajectories outside it, "
                     f"e.g. {first.env.name!r} seed {first.seed}",
            fix="pass the rollout stage's trajectories of the target's train split (rollout.split: train)")
    if config.base_provenance == "successful":
        pool = [t for t in trajectories if t.success]
        if not pool:
            raise FailedPrecondition(f"none of the {len(trajectories)} base trajectories succeeded, so slot 0 (the "
                                     "base) would get no warm-start example; set base_provenance: all to label them "
                                     "all, or none to leave the base without examples")
    else:
        pool = [t for t in trajectories if t.termination not in (Termination.POLICY_ERROR, Termination.TIMEOUT)]
    keep = sorted(random.Random(f"base-provenance:{config.seed}").sample(range(len(pool)),
                                                                         min(len(pool), config.warm_start_episodes)))
    return [pool[i] for i in keep]


def play_provenance(composed: ComposedMoEModel, tokenizer: Any, capability_envs: Mapping[str, EnvFactory],
                    config: Any, splits: Mapping[str, str] | None = None) -> dict[str, list[Trajectory]]:
    """capability -> `warm_start_episodes` trajectories of its environment played with routing forced
    to its slot (module docstring). Instances: a seeded draw from each environment's train split."""
    from trace_common.policy.transformers_backend import TransformersPolicy

    slots = {name: i for i, name in enumerate(composed.adapter_names, start=1)}
    params = SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                            max_tokens=config.max_completion_length)
    out: dict[str, list[Trajectory]] = {}
    for cap, factory in capability_envs.items():
        seeds = list(factory().splits()[(splits or {}).get(cap) or config.train_split])
        rng = random.Random(f"provenance:{config.seed}:{cap}")
        specs = [EpisodeSpec(seed=int(seeds[rng.randrange(len(seeds))]), group=i, index=0, guided=False,
                             sampling_seed=derive_seed(config.seed, slots[cap], i))
                 for i in range(config.warm_start_episodes)]
        policy = TransformersPolicy.from_model(composed.base, tokenizer, name=f"provenance-{cap}",
                                               max_batch=config.generation_batch_size, max_wait_s=0.0)

        async def play(policy=policy, factory=factory, specs=specs) -> list[Trajectory]:
            try:
                return await play_groups(policy, factory, specs, params=params, max_turns=config.max_turns or None,
                                         deadline_s=config.episode_timeout_s)
            finally:
                await policy.close()

        with composed.forced(slots[cap]):
            out[cap] = asyncio.run(play())
    return out


def played_config(config: Any, fields: Sequence[str]) -> dict[str, Any]:
    """The config `fields` that decide a warm start's episodes, and the precision they were played in when
    it is not float32 (float32 leaves the key out: the digests written before the field stay valid)."""
    keep = {f: getattr(config, f) for f in fields}
    if getattr(config, "dtype", "float32") != "float32":
        keep["dtype"] = config.dtype
    return keep


def provenance_digest(config: Any, adapter_names: Sequence[str], base: Sequence[Trajectory],
                      splits: Mapping[str, str] | None = None, models: Mapping[str, Any] | None = None) -> str:
    """What determines the provenance: the playing config, the adapters in slot order, their splits,
    the selected base trajectories themselves and the models that play (`models`, as in
    `outcomes.outcomes_digest`)."""
    payload = {"config": played_config(config, _PLAY_FIELDS), "adapters": list(adapter_names), "splits": dict(sorted((splits or {}).items())),
               "base": hashlib.sha256(dumps_jsonl(base)).hexdigest()}
    if models:
        payload["models"] = dict(models)
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_slot_files(store: ArtifactStore, base: str, record_file: str, slots: Mapping[str, Sequence[Trajectory]],
                    record: dict[str, Any]) -> None:
    """Every slot's JSONL under `base`, then `record` (with "slots" added) as `record_file`: last, so a
    record never names files that are not there. The provenance and the outcome replays are both kept so."""
    for name, trajs in slots.items():
        store.put_bytes(f"{base}/{name}.jsonl", dumps_jsonl(trajs))
    store.put_bytes(f"{base}/{record_file}", json.dumps({**record, "slots": list(slots)}, sort_keys=True).encode())


def load_slot_files(store: ArtifactStore, base: str, record_file: str, digest: str | None
                    ) -> tuple[dict[str, Any], dict[str, list[Trajectory]]] | None:
    """(record, {slot: trajectories}) that `save_slot_files` kept under `base`; None when there is no
    record, or when `digest` is given and the record's differs."""
    try:
        record = json.loads(store.get_bytes(f"{base}/{record_file}"))
    except NotFound:
        return None
    if digest is not None and record.get("digest") != digest:
        return None
    slots = {name: loads_jsonl(store.get_bytes(f"{base}/{name}.jsonl"), source=f"{base}/{name}.jsonl")
             for name in record["slots"]}
    return record, slots


def budget_dict(budget: PlayedBudget) -> dict[str, int]:
    return {"episodes": budget.episodes, "prompt_tokens": budget.prompt_tokens,
            "completion_tokens": budget.completion_tokens}


def load_provenance(store: ArtifactStore, prefix: str, digest: str | None = None) -> Provenance | None:
    """The stored provenance (None when there is none, or when `digest` is given and differs)."""
    loaded = load_slot_files(store, f"{prefix}/{PROVENANCE_DIR}", RECORD_FILE, digest)
    if loaded is None:
        return None
    record, trajectories = loaded
    return Provenance(trajectories, PlayedBudget(**record["budget"]), str(record["digest"]))


def save_provenance(store: ArtifactStore, prefix: str, provenance: Provenance) -> None:
    """Every slot's JSONL, then the record (`save_slot_files`)."""
    save_slot_files(store, f"{prefix}/{PROVENANCE_DIR}", RECORD_FILE, provenance.trajectories,
                    {"digest": provenance.digest, "budget": budget_dict(provenance.budget),
                     "played_by_this_job": [n for n in provenance.trajectories if n != BASE_SLOT_NAME]})


def obtain_provenance(composed: ComposedMoEModel, tokenizer: Any, capability_envs: Mapping[str, EnvFactory],
                      base: Sequence[Trajectory], config: Any, *, store: ArtifactStore | None, prefix: str,
                      splits: Mapping[str, str] | None = None, models: Mapping[str, Any] | None = None
                      ) -> Provenance:
    """The stored provenance when its digest matches, else the adapters' episodes played now (and
    stored) plus slot 0's given base trajectories."""
    digest = provenance_digest(config, composed.adapter_names, base, splits, models)
    if store is not None:
        found = load_provenance(store, prefix, digest)
        if found is not None:
            log.info("gate provenance under %s reused (digest %s): no episode replayed", prefix, digest)
            return found
        legacy = provenance_digest(config, composed.adapter_names, base, splits) if models else None
        found = load_provenance(store, prefix, legacy) if legacy else None
        if found is not None:   # written before the models were part of the digest: as then, reused
            log.warning("gate provenance under %s was recorded before its models were part of the digest: "
                        "reused without checking that these adapters played it", prefix)
            return found
    played = play_provenance(composed, tokenizer, capability_envs, config, splits)
    trajectories = {BASE_SLOT_NAME: list(base), **played} if base else dict(played)
    provenance = Provenance(trajectories, PlayedBudget.of([t for ts in played.values() for t in ts]), digest)
    if store is not None:
        save_provenance(store, prefix, provenance)
    return provenance


def recorded_budget(store: ArtifactStore | None, prefix: str, fallback_episodes: int) -> PlayedBudget:
    """What the provenance of an earlier attempt of this job cost (a GRPO resume skips the warm start).
    Without a record (none was written: no warm start, or an artifact older than the record) the
    episodes are `fallback_episodes` (K x warm_start_episodes) and their tokens unknown (0)."""
    found = load_provenance(store, prefix) if store is not None else None
    if found is not None:
        return found.budget
    if fallback_episodes:
        log.warning("no provenance record under %s: counting %d warm-start episodes without their tokens",
                    prefix, fallback_episodes)
    return PlayedBudget(episodes=fallback_episodes)
