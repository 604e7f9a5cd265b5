"""Policies the rollout service can run, built from a validated `PolicyRefModel`.

A policy here is a per-episode async function `(messages, tools) -> Message | PolicyTurn`
(`trace_common.env.AsyncPolicyFn`), made by a `PolicyFactory` once per job and asked for
one function per episode (scripted experts need the episode's environment; model backends
share one batched backend across all episodes of a job).

Backends:
  * POLICY_BACKEND_SCRIPTED -- `model` names a scripted policy of the environment's domain:
    `expert` (the domain expert with its default planted gaps) or `expert:perfect`, with an
    optional `@<ms>ms` suffix adding a fixed per-turn latency (benchmarks, e.g.
    `expert:perfect@20ms`). Trajectories record the policy as `scripted:<model>`.
  * POLICY_BACKEND_IN_PROCESS / POLICY_BACKEND_OPENAI_HTTP -- model backends from
    `trace_common.policy`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from trace_common.env import Environment, Message, PolicyInfo, PolicyTurn
from trace_common.errors import FailedPrecondition, InvalidArgument, Unimplemented
from trace_common.specs import PolicyRefModel, SamplingModel

EpisodePolicy = Callable[[list[Message], list[dict[str, Any]]], Awaitable["Message | PolicyTurn"]]

SCRIPTED_RE = re.compile(r"^(?P<name>expert(?::perfect)?)(?:@(?P<ms>\d+(?:\.\d+)?)ms)?$")


class PolicyFactory:
    """Makes one episode policy per (environment instance, seed, sample)."""

    info: PolicyInfo

    def for_episode(self, env: Environment, seed: int, sample_index: int, sampling_seed: int) -> EpisodePolicy:
        raise NotImplementedError

    async def close(self) -> None:
        """Release backend resources (models, HTTP clients) at the end of the job."""


def check_scripted(model: str, env_name: str) -> re.Match:
    """Cheap validation of a scripted policy name (done at job creation)."""
    m = SCRIPTED_RE.match(model)
    if m is None:
        raise InvalidArgument(field="spec.policy.model", expected="a scripted policy: 'expert' or "
                              "'expert:perfect', optionally with '@<ms>ms' latency", got=model)
    if env_name != "store":
        raise FailedPrecondition(f"scripted policy {model!r} exists only for the built-in 'store' domain, "
                                 f"not {env_name!r}; use a model backend for this environment")
    return m


class ScriptedFactory(PolicyFactory):
    def __init__(self, model: str, env_name: str):
        m = check_scripted(model, env_name)
        from trace_common.domains.store.expert import ExpertConfig, StoreExpert

        self.expert = StoreExpert(ExpertConfig.perfect() if m["name"] == "expert:perfect" else ExpertConfig())
        self.latency = float(m["ms"] or 0) / 1000.0
        self.info = PolicyInfo(model=f"scripted:{model}", version=self.expert.config.digest())

    def for_episode(self, env, seed, sample_index, sampling_seed):
        env.reset(seed)  # the expert plans from the episode's task; run_episode resets again (same seed)
        fn = self.expert.policy_for(env, self.expert.skill_flags(seed, sample_index))
        latency = self.latency

        async def policy(messages, tools):
            if latency:
                await asyncio.sleep(latency)
            return fn(messages, tools)
        return policy


def make_factory(policy: PolicyRefModel, sampling: SamplingModel, env_name: str) -> PolicyFactory:
    if policy.backend == "POLICY_BACKEND_SCRIPTED":
        return ScriptedFactory(policy.model, env_name)
    raise Unimplemented(f"policy backend {policy.backend} is not wired into the rollout service yet")
