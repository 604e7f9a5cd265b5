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
    `trace_common.policy` (built by `trace_common.policy.factory.open_policy`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from trace_common.env import Environment, Message, PolicyInfo, PolicyTurn
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.model_refs import ModelRoots
from trace_common.specs import PolicyRefModel, SamplingModel

from .metrics import POLICY_ERRORS, TOKENS

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
        # The expert plans from the episode's task: at its first turn, when the episode driver
        # has reset `env` to `seed` and nothing has changed it yet (no reset of our own).
        flags = self.expert.skill_flags(seed, sample_index)
        latency = self.latency
        fn = None

        async def policy(messages, tools):
            nonlocal fn
            if latency:
                await asyncio.sleep(latency)
            if fn is None:
                fn = self.expert.policy_for(env, flags)
            return fn(messages, tools)
        return policy


class ModelFactory(PolicyFactory):
    """Episodes share one batched model backend; each turn's sampling seed derives from the
    episode's sampling seed and the turn index, so a job is reproducible."""

    def __init__(self, policy, ref: PolicyRefModel, sampling: SamplingModel):
        from trace_common.policy import SamplingParams

        self.policy = policy
        self.params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p or 1.0,
                                     top_k=sampling.top_k, max_tokens=sampling.max_tokens or 256)
        self.info = PolicyInfo(model=ref.model, adapter=ref.adapter_uri or ref.adapter_name or ref.composition_uri or None,
                               version=ref.routing or None)

    def for_episode(self, env, seed, sample_index, sampling_seed):
        from trace_common.policy import PolicyRequest, derive_seed

        async def policy(messages, tools):
            request = PolicyRequest(messages=messages, tools=tools, params=self.params)
            if self.params.temperature > 0:
                request.params = self.params.model_copy(update={"seed": derive_seed(sampling_seed, request.turn_index)})
            turn = await self.policy.complete(request)
            TOKENS.labels("prompt").inc(turn.prompt_tokens)
            TOKENS.labels("completion").inc(turn.completion_tokens)
            if turn.parse_errors:
                POLICY_ERRORS.labels("malformed_tool_call").inc(len(turn.parse_errors))
            return turn.to_policy_turn()
        return policy

    async def close(self) -> None:
        await self.policy.close()


async def make_factory(policy: PolicyRefModel, sampling: SamplingModel, env_name: str, s3=None, *,
                       allowed: ModelRoots) -> PolicyFactory:
    """`allowed`: the service's ModelRoots (what a model backend may load)."""
    if policy.backend == "POLICY_BACKEND_SCRIPTED":
        return ScriptedFactory(policy.model, env_name)
    from trace_common.policy.factory import open_policy

    return ModelFactory(await open_policy(policy, s3, allowed=allowed), policy, sampling)
