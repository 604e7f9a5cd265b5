"""Playing GRPO groups: every episode of a group on the same environment instance (seed), a
fraction of them guided, all episodes advanced in lockstep so batches are deterministic.

Why lockstep: a batched backend's output depends on which requests share a batch, up to
float rounding (see `trace_common.policy.base.Policy`). Gathering requests by arrival time
makes batch composition -- and so, occasionally, a sampled token -- vary from run to run;
a resumed run would then not reproduce an uninterrupted one. Here every live episode
submits its next turn and one batch is generated once all of them have (ordered by episode
index); an episode that ends simply leaves the round. The in-process backend additionally
reuses the KV cache of the prompt prefix the batch shares (system prompt + tools; a guided
episode's prompt shares only the system text before its guidance block with the others).

Guidance (guidance.py): a guided episode's requests show the guidance -- the override text when
one is given, else the text its own instance's reset returned (`Observation.guidance`) -- as an
`<expert_guidance>` block at the end of the system prompt (`trace_common.env.guidance.
with_guidance_block`, the one format the environments and the base agents' imitation data use).
The trajectory itself keeps the plain conversation, which is what the trainer re-renders for the
loss (batch.py), and records the text it was shown in `info["guidance"]`; a guided spec whose
instance has no guidance plays unguided.

Semantics (one call of `play_groups`):
    for every spec (seed, group, index, guided, sampling_seed):
        env = env_factory(); obs = env.reset(seed); hint = (guidance_text or obs.guidance).strip()
        play env with the policy; turn k of the episode uses sampling seed derive_seed(sampling_seed, k);
        requests = with_guidance_block(messages, hint) iff spec.guided and hint, else messages;
        then info["guidance"] = hint (shown ones only)
    returns trajectories in spec order
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trace_common.env import (
    Environment,
    Message,
    Observation,
    PolicyInfo,
    PolicyTurn,
    Trajectory,
    run_episode_async,
)
from trace_common.env.guidance import with_guidance_block
from trace_common.policy.base import Policy, PolicyRequest, SamplingParams, derive_seed

from .guidance import INFO_KEY

EnvFactory = Callable[[], Environment]


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: environment seed, its place in the batch, guidance, sampling seed."""

    seed: int
    group: int
    index: int
    guided: bool
    sampling_seed: int


class _ResetHint:
    """An environment seen through its reset: every call is the environment's own, and the hint of
    the last reset's observation is kept (the episode loop hands the policy messages only)."""

    def __init__(self, env: Environment):
        self._env = env
        self.guidance = ""     # the last reset's hint
        self.shown = ""        # the hint a request of this episode showed

    def reset(self, seed: int) -> Observation:
        obs = self._env.reset(seed)
        self.guidance = obs.guidance or ""
        return obs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class _Lockstep:
    """Generates one batch per round, once every live episode has submitted its request."""

    def __init__(self, policy: Policy, live: int):
        self.policy = policy
        self.live = live
        self.pending: dict[int, tuple[PolicyRequest, asyncio.Future]] = {}
        self.tasks: set[asyncio.Task] = set()
        self.batches: list[int] = []

    def submit(self, idx: int, request: PolicyRequest) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.pending[idx] = (request, fut)
        self._maybe_flush()
        return fut

    def finished(self) -> None:
        self.live -= 1
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if not self.pending or len(self.pending) < self.live:
            return
        batch = [self.pending[i] for i in sorted(self.pending)]
        self.pending = {}
        self.batches.append(len(batch))
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, batch: list[tuple[PolicyRequest, asyncio.Future]]) -> None:
        requests = [r for r, _ in batch]
        try:
            results: list[Any] = list(await self.policy.generate(requests))
        except Exception:  # noqa: BLE001 - see below
            # `generate` raises the first failure of the batch for all of it. One request's own
            # failure (its conversation outgrew the context: that episode ends, the others go on)
            # must not end its neighbours' episodes, so each request is asked again on its own and
            # gets its own outcome; a backend that is down fails every one of them (policy_error).
            alone = await asyncio.gather(*(self.policy.generate([r]) for r in requests), return_exceptions=True)
            results = [a if isinstance(a, BaseException) else a[0] for a in alone]
        for (_, fut), result in zip(batch, results, strict=True):
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)


async def play_groups(policy: Policy, env_factory: EnvFactory, specs: Sequence[EpisodeSpec], *,
                      params: SamplingParams, guidance_text: str = "",
                      max_turns: int | None = None, deadline_s: float | None = None,
                      policy_info: PolicyInfo | None = None) -> list[Trajectory]:
    """Play every spec (module docstring); trajectories in spec order. `guidance_text`: the override
    guidance (empty: each guided episode shows its instance's own `Observation.guidance`)."""
    gate = _Lockstep(policy, len(specs))
    info = policy_info or PolicyInfo(model=policy.name, adapter=policy.adapter)

    def make_fn(idx: int, spec: EpisodeSpec, env: _ResetHint):
        async def fn(messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
            hint = ((guidance_text or env.guidance) if spec.guided else "").strip()  # "": nothing to show
            if hint:
                env.shown = hint
            shown = with_guidance_block(messages, hint) if hint else messages
            request = PolicyRequest(messages=shown, tools=tools, params=params)
            request.params = params.model_copy(update={"seed": derive_seed(spec.sampling_seed, request.turn_index)})
            turn = await gate.submit(idx, request)
            return turn.to_policy_turn()
        return fn

    async def one(idx: int, spec: EpisodeSpec) -> Trajectory:
        try:
            env = _ResetHint(env_factory())
            traj = await run_episode_async(env, make_fn(idx, spec, env), spec.seed, max_turns,  # type: ignore[arg-type]
                                           policy=info, deadline_s=deadline_s, sample_index=spec.index)
        finally:
            gate.finished()
        if env.shown:
            traj.info[INFO_KEY] = env.shown
        return traj

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(specs))))


class RolloutEngine(ABC):
    """Where training rollouts come from. The trainer calls `publish` after each optimizer
    step (the new policy version) and `play` to collect a batch of groups."""

    @abstractmethod
    async def play(self, env_factory: EnvFactory, specs: Sequence[EpisodeSpec], *, params: SamplingParams,
                   guidance_text: str, max_turns: int | None,
                   deadline_s: float | None) -> list[Trajectory]: ...

    async def publish(self, version: int) -> None:  # noqa: B027 - in-process engines share the weights
        """Make policy version `version` (the trainer's current weights) the one rollouts use."""

    async def close(self) -> None:  # noqa: B027 - optional
        """Release the backend."""


class PolicyRollouts(RolloutEngine):
    """Rollouts from any `trace_common.policy.Policy`; with `TransformersPolicy.from_model(model)`
    the trained model itself generates (in-process: every optimizer step is visible at once)."""

    def __init__(self, policy: Policy, info: PolicyInfo | None = None):
        self.policy = policy
        self.info = info
        self.version = 0

    async def play(self, env_factory, specs, *, params, guidance_text, max_turns, deadline_s):
        # A prefix KV cache kept from an earlier call would make this call's numerics depend on
        # history (a resumed run starts empty): start every batch of groups from an empty cache.
        cache = getattr(self.policy, "prefix_cache", None)
        if cache is not None:
            cache.clear()
        info = self.info or PolicyInfo(model=self.policy.name, adapter=self.policy.adapter)
        info = info.model_copy(update={"version": str(self.version)})
        return await play_groups(self.policy, env_factory, specs, params=params, guidance_text=guidance_text,
                                 max_turns=max_turns, deadline_s=deadline_s,
                                 policy_info=info)

    async def publish(self, version: int) -> None:
        self.version = version

    async def close(self) -> None:
        await self.policy.close()
