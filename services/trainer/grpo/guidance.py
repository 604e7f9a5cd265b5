"""Guided rollouts (docs/design.md "Guided rollouts"): which guidance a guided episode shows, and the
check that a config asking for guidance gets some.

Where the guidance comes from. A capability environment supplies it per instance: the
`guidance` of the observation its `reset(seed)` returns (`trace_common.env.Observation`; for
the library families, the oracle's gold actions, `trace_common.env.guidance.gold_actions_text`),
never part of the conversation. `config.guidance_text` (or the trainer's `guidance_text`
argument) is an explicit override: when set, every guided episode shows that text instead.
A guided episode whose instance has none (and no override is set) is played unguided and
counted as unguided: nothing off-policy happened in it.

How it is shown. As an `<expert_guidance>` block at the end of the system prompt
(`trace_common.env.guidance.with_guidance_block`, rollouts.py), the format the base agents
learn to follow during their warm start; the update trains on the plain prompt (batch.py).

Who is guided. The first `guided_per_group` = round-half-up(guidance_fraction *
num_generations) episodes of every group (resampled groups included); the others never see the
block. What the trajectory records: the plain conversation, plus `info["guidance"]` = the
guidance text a guided episode was shown (`shown_guidance`; the block's content, without its
tags), which is how the trainer tells guided from unguided.

Asking for guidance from an environment that has none is an error before training starts
(`check_guidance`: the trainer runs it when it is built; a service validating a job can run it
too), not a run whose `guidance_fraction` silently does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trace_common.env import Environment, Trajectory
from trace_common.errors import FailedPrecondition

from .seeds import SeedSchedule

if TYPE_CHECKING:
    from .config import GRPOConfig

#: Trajectory.info key: the guidance text a guided episode was shown (absent for unguided episodes).
INFO_KEY = "guidance"

#: Instances whose reset is probed for a hint before training starts (the first ones the seed
#: schedule would play). An environment that supplies hints only for some instances needs one
#: among these; with none at all the check costs this many resets.
PROBE_INSTANCES = 8


def shown_guidance(traj: Trajectory) -> str:
    """The guidance text `traj` was played with, "" for an unguided episode."""
    value = traj.info.get(INFO_KEY)
    return value if isinstance(value, str) else ""


def is_guided(traj: Trajectory) -> bool:
    return bool(shown_guidance(traj))


def instance_guidance(env: Environment, seeds: Sequence[int]) -> str:
    """The first hint among the resets of `seeds` ("" when none has one). Each probed episode is
    released again (`episode_finished`), so a remote environment does not keep it open."""
    for seed in seeds:
        obs = env.reset(int(seed))
        finished: Callable[[], None] | None = getattr(env, "episode_finished", None)
        if callable(finished):
            finished()
        if obs.guidance:
            return obs.guidance
    return ""


def require_guidance(*, guidance_fraction: float, guided_per_group: int, override: str, env: Environment,
                     seeds: Sequence[int], split: str) -> None:
    """FailedPrecondition unless a config that asks for guided episodes gets a hint: from the
    override, or from the environment's resets of `seeds` (the first instances of the schedule).

    Semantics: asks = guided_per_group > 0; ok = not asks or override or any(reset(s).guidance for s in seeds)
    """
    if guided_per_group == 0 or override:
        return
    if instance_guidance(env, seeds):
        return
    name = getattr(env, "name", type(env).__name__)
    raise FailedPrecondition(
        f"config.guidance_fraction={guidance_fraction:g} asks for {guided_per_group} guided episode(s) per group, "
        f"but environment {name!r} supplies no guidance (Observation.guidance is empty on the first "
        f"{len(seeds)} instances of its {split!r} split) and config.guidance_text is empty: set "
        "guidance_fraction: 0 (no guided rollouts), or give guidance_text (one hint for every instance), or "
        "train on an environment that supplies a hint per instance")


def check_guidance(config: GRPOConfig, env: Environment, override: str | None = None) -> None:
    """`require_guidance` for `config` training on `env`: probes the first instances the config's
    seed schedule plays. `override`: the trainer's explicit hint (default: config.guidance_text).
    Callable wherever the environment is at hand before a job starts (the trainer calls it when built)."""
    if config.guided_per_group == 0:
        return
    split = env.splits()[config.train_split]
    seeds = SeedSchedule(split, config.seed).take(0, min(PROBE_INSTANCES, len(split)))
    require_guidance(guidance_fraction=config.guidance_fraction, guided_per_group=config.guided_per_group,
                     override=config.guidance_text if override is None else override, env=env, seeds=seeds,
                     split=config.train_split)
