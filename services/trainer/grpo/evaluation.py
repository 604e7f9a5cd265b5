"""Held-out evaluation of a policy on an environment split (greedy by default), for reports and
experiments: the same lockstep episode player the trainer uses, one episode per seed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from trace_common.env import Trajectory
from trace_common.policy.base import Policy, SamplingParams

from .rollouts import EnvFactory, EpisodeSpec, play_groups


@dataclass
class EvalResult:
    episodes: int
    pass_rate: float
    reward_mean: float
    by_type: dict[str, tuple[int, float]] = field(default_factory=dict)  # info key value -> (n, pass rate)
    trajectories: list[Trajectory] = field(default_factory=list)


def summarize(trajs: Sequence[Trajectory], group_key: str = "task_type") -> EvalResult:
    n = len(trajs)
    by: dict[str, list[bool]] = {}
    for t in trajs:
        by.setdefault(str(t.info.get(group_key, "all")), []).append(t.success)
    return EvalResult(episodes=n, pass_rate=sum(t.success for t in trajs) / n if n else 0.0,
                      reward_mean=sum(t.reward for t in trajs) / n if n else 0.0,
                      by_type={k: (len(v), sum(v) / len(v)) for k, v in sorted(by.items())}, trajectories=list(trajs))


async def evaluate_async(policy: Policy, env_factory: EnvFactory, seeds: Sequence[int], *,
                         params: SamplingParams | None = None, max_turns: int | None = None,
                         group_key: str = "task_type") -> EvalResult:
    params = params or SamplingParams(temperature=0.0, max_tokens=128)
    specs = [EpisodeSpec(seed=s, group=i, index=0, guided=False, sampling_seed=s) for i, s in enumerate(seeds)]
    trajs = await play_groups(policy, env_factory, specs, params=params, max_turns=max_turns)
    return summarize(trajs, group_key)


def evaluate(policy: Policy, env_factory: EnvFactory, seeds: Sequence[int], **kwargs) -> EvalResult:
    """Synchronous wrapper (own event loop)."""
    return asyncio.run(evaluate_async(policy, env_factory, seeds, **kwargs))
