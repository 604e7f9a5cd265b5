"""Calibration of a candidate environment with the base policy: is it learnable by GRPO from here?

GRPO learns only from groups whose rewards differ (docs/design.md, "GRPO"), so an environment
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

Waves and the sequential rule (calibration_stop.py). The groups are played in seed order, in
waves of max(1, concurrency // group_size) groups (every episode of a wave in flight at once);
after each wave the stop rule is asked whether the groups played so far already settle the
verdict, and if so the rest are never played. Deciding only at wave boundaries makes the groups
played a function of the rewards alone, never of which episode happened to finish first, so the
episodes counted in TRACE's budget are reproducible. `rewards` holds the played groups only.

The played episodes themselves are kept (`trajectories`, groups in seed order, samples in
order), so an accepted level's calibration can become the first GRPO batches of its adapter
(trace_common/env/calibration_batches.py); `sampling` says how they were sampled.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from trace_common.env import Termination, Trajectory, run_episode_async
from trace_common.errors import Cancelled, DeadlineExceeded, Unavailable

from .calibration_stop import StopRule, decide
from .sandbox.environment import SandboxEnvironment


class CalibrationPolicyFailed(Unavailable):
    """The calibration policy's backend failed (not the candidate's fault): the job fails."""


class CalibrationTimedOut(DeadlineExceeded):
    """Calibration episodes ran past their deadline (not the candidate's fault): the job fails."""


@dataclass
class CalibrationResult:
    policy: str
    seeds: list[int]                                # every planned group's seed, in play order
    group_size: int
    rewards: list[list[float]]                      # [played groups, group_size]
    mean: float
    informative_fraction: float
    band: tuple[float, float]
    min_informative: float
    errors: list[str] = field(default_factory=list)
    stop_rule: str = "none"
    stopped_early: bool = False
    stop_reason: str = ""
    #: The played episodes ([played groups x group_size], flattened in play order); not in to_dict.
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)
    #: How the policy sampled (temperature, top_p, top_k, max_tokens), when its factory says.
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def played_groups(self) -> int:
        return len(self.rewards)

    @property
    def in_band(self) -> bool:
        return self.band[0] <= self.mean <= self.band[1]

    @property
    def informative_ok(self) -> bool:
        return self.informative_fraction >= self.min_informative

    @property
    def passed(self) -> bool:
        return self.in_band and self.informative_ok and not self.errors and not self.stopped_early

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trajectories"}
        out.update(seeds=list(self.seeds), rewards=[list(r) for r in self.rewards], band=tuple(self.band),
                   errors=list(self.errors), sampling=dict(self.sampling))
        return {**out, "planned_groups": len(self.seeds), "played_groups": self.played_groups,
                "in_band": self.in_band, "informative_ok": self.informative_ok, "passed": self.passed}


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
                    on_progress: Callable[[int, int], None] | None = None, stop: StopRule = "predictive",
                    min_groups: int = 4) -> CalibrationResult:
    """Play the groups in waves, stopping when `stop` settles the verdict, and summarise the played
    groups (see module docstring)."""
    per_wave = max(1, concurrency // group_size)
    table: list[list[Trajectory | None]] = [[None] * group_size for _ in seeds]   # [groups, group_size]
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
                table[g][k] = traj
            finally:
                env.close()
            done += 1
            if on_progress is not None:
                on_progress(done, total)

    played = 0
    decision = None
    try:
        while played < len(seeds) and decision is None:
            wave = range(played, min(len(seeds), played + per_wave))
            await asyncio.gather(*(one(g, seeds[g], k) for g in wave for k in range(group_size)))
            played = wave.stop
            rewards_so_far = [[t.reward for t in row if t is not None] for row in table[:played]]
            informative = sum(max(r) - min(r) > 1e-9 for r in rewards_so_far)
            decision = decide([sum(r) / len(r) for r in rewards_so_far], informative, len(seeds), band,
                              min_informative, rule=stop, min_groups=min_groups)
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
    trajectories = [t for row in table[:played] for t in row if t is not None]
    rewards = [[t.reward for t in row if t is not None] for row in table[:played]]
    mean, frac = summarise(rewards)
    describe = getattr(factory, "sampling", None)
    return CalibrationResult(policy=factory.info.model, seeds=list(seeds), group_size=group_size, rewards=rewards,
                             mean=mean, informative_fraction=frac, band=band, min_informative=min_informative,
                             errors=errors[:10], stop_rule=stop, stopped_early=decision is not None,
                             stop_reason=decision.reason(played, len(seeds), band, min_informative) if decision else "",
                             trajectories=trajectories, sampling=dict(describe()) if callable(describe) else {})
