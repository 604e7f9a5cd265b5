"""Calibration of a candidate environment with the base policy: is it learnable by GRPO from here?

GRPO learns only from groups whose rewards differ (DESIGN.md, "GRPO"), so an environment
is useful for training a policy only when that policy sometimes succeeds and sometimes
fails on the same instance. Calibration plays `groups` seeds, `group_size` times each,
with the base policy and measures:

Semantics:
    rewards[g][k]      = reward of sample k on seed g          # [groups, group_size]
    mean               = mean over all g, k
    informative(g)     = max_k rewards[g][k] - min_k rewards[g][k] > 1e-9
    informative_frac   = mean over g of informative(g)
    passed             = band_lo <= mean <= band_hi  and  informative_frac >= min_informative

The policy comes from a factory with the rollout service's `PolicyFactory` shape
(`for_episode(env, seed, sample_index, sampling_seed) -> async policy`, `info`, `close()`),
so the service passes the real base agent (calibration_policy.py: in-process model or
OpenAI-compatible endpoint) where tests may pass `policies.ScriptedSkillFactory`. Episodes
of all groups run concurrently on one event loop, at most `concurrency` at a time (a model
backend batches them); the environment side runs in the sandbox worker through
`SandboxEnvironment`.

A factory that exposes `unavailable` (the first backend failure its episodes met) makes a
backend outage raise `CalibrationPolicyFailed` instead of scoring the episodes 0: an
unreachable base model says nothing about the candidate. Likewise an episode that runs past
`deadline_s` (wall clock, which includes waiting for a shared model: with `concurrency`
episodes in flight on a slow backend each one takes about `concurrency` times longer) raises
`CalibrationTimedOut`: its 0 reward would measure the machine, not the candidate. (Found by the
SmolLM2 run on a 2-core CPU, where every calibration episode timed out and all three library
environments were rejected as "mean reward 0.00".)

`on_progress(done, total)`, when given, is called after each episode (from the thread running
`calibrate`'s event loop), so a job can show calibration progress: with a slow base model it is
most of a generation job's time (47 min for two environments with SmolLM2 on 2 CPU cores).
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trace_common.env import Termination, run_episode_async
from trace_common.errors import Cancelled, DeadlineExceeded, Unavailable

from .sandbox.environment import SandboxEnvironment


class CalibrationPolicyFailed(Unavailable):
    """The calibration policy's backend failed (not the candidate's fault): the job fails."""


class CalibrationTimedOut(DeadlineExceeded):
    """Calibration episodes ran past their deadline (not the candidate's fault): the job fails."""


@dataclass
class CalibrationResult:
    policy: str
    seeds: list[int]
    group_size: int
    rewards: list[list[float]]                      # [groups, group_size]
    mean: float
    informative_fraction: float
    band: tuple[float, float]
    min_informative: float
    errors: list[str] = field(default_factory=list)

    @property
    def in_band(self) -> bool:
        return self.band[0] <= self.mean <= self.band[1]

    @property
    def informative_ok(self) -> bool:
        return self.informative_fraction >= self.min_informative

    @property
    def passed(self) -> bool:
        return self.in_band and self.informative_ok and not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "in_band": self.in_band, "informative_ok": self.informative_ok,
                "passed": self.passed}


def sampling_seed(base: int, seed: int, k: int) -> int:
    digest = hashlib.sha256(f"calibration:{base}:{seed}:{k}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def summarise(rewards: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(mean reward, informative-group fraction) of a [groups, group_size] table."""
    flat = [r for group in rewards for r in group]
    if not flat:
        return 0.0, 0.0
    informative = [max(g) - min(g) > 1e-9 for g in rewards if g]
    return statistics.fmean(flat), sum(informative) / len(informative)


async def calibrate(make_env: Callable[[], SandboxEnvironment], factory: Any, seeds: Sequence[int], group_size: int,
                    band: tuple[float, float], min_informative: float, *, base_seed: int = 0,
                    max_turns: int | None = None, deadline_s: float | None = 120.0,
                    cancel: threading.Event | None = None, concurrency: int = 32,
                    on_progress: Callable[[int, int], None] | None = None) -> CalibrationResult:
    """Play the groups and summarise them (see module docstring)."""
    rewards: list[list[float]] = [[0.0] * group_size for _ in seeds]  # [groups, group_size]
    total, done = len(seeds) * group_size, 0
    errors: list[str] = []
    timed_out: list[str] = []
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(g: int, seed: int, k: int) -> None:
        nonlocal done
        async with slots:
            if cancel is not None and cancel.is_set():
                raise Cancelled("calibration cancelled")
            env = make_env()
            try:
                policy = factory.for_episode(env, seed, k, sampling_seed(base_seed, seed, k))
                traj = await run_episode_async(env, policy, seed, max_turns, policy=factory.info,
                                               deadline_s=deadline_s, sample_index=k)
                if traj.error:
                    errors.append(f"seed {seed} sample {k}: {traj.error}")
                if traj.termination == Termination.TIMEOUT:
                    timed_out.append(f"seed {seed} sample {k}")
                rewards[g][k] = traj.reward
            finally:
                env.close()
            done += 1
            if on_progress is not None:
                on_progress(done, total)

    try:
        await asyncio.gather(*(one(g, seed, k) for g, seed in enumerate(seeds) for k in range(group_size)))
    finally:
        close = getattr(factory, "close", None)
        if close is not None:
            await close()
    failure = getattr(factory, "unavailable", None)
    if failure is not None:
        raise CalibrationPolicyFailed(f"the calibration policy {factory.info.model!r} failed, so the candidate "
                                      f"could not be judged: {failure}. Check that the base model's backend is up "
                                      "(spec.calibration_policy) and retry the job")
    if timed_out:
        raise CalibrationTimedOut(
            f"{len(timed_out)} of {total} calibration episodes of {factory.info.model!r} ran past their {deadline_s:g} s "
            f"deadline (first: {timed_out[0]}) with up to {concurrency} in flight, so their reward says nothing about "
            "the candidate. Raise TRACE_ENVIRONMENT_VALIDATION_EPISODE_DEADLINE_S or lower "
            "TRACE_ENVIRONMENT_VALIDATION_CALIBRATION_CONCURRENCY for a slow base model, and retry the job")
    mean, frac = summarise(rewards)
    return CalibrationResult(policy=factory.info.model, seeds=list(seeds), group_size=group_size, rewards=rewards,
                             mean=mean, informative_fraction=frac, band=band, min_informative=min_informative,
                             errors=errors[:10])
