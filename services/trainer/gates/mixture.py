"""What GRPO on the gates plays: the target's training split, or, with several target environments,
a seeded mixture of them with equal weights (`build_mixture`, `MixtureEnv`); `grpo_source` picks
which. The outcome replays read the same seeds through the same schedule (outcomes.py)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from services.trainer.gates.config import GateGRPOConfig
from services.trainer.grpo.rollouts import EnvFactory
from trace_common.env import Environment, Observation, StepResult
from trace_common.errors import FailedPrecondition, InvalidArgument


@dataclass(frozen=True)
class MixtureSource:
    """One environment of the GRPO mixture: a label (capability name or the target's), a factory,
    its training seeds and its sampling weight."""

    label: str
    factory: EnvFactory
    seeds: Sequence[int]
    weight: float


@dataclass(frozen=True)
class Mixture:
    sources: tuple[MixtureSource, ...]
    size: int = 1_000_000  # mixture seeds (each maps to one source instance)
    max_turns: int = 20

    def factory(self) -> MixtureEnv:
        return MixtureEnv(self)

    def pick(self, seed: int) -> tuple[MixtureSource, int]:
        """Semantics: u = Random(seed).random(); source j = first with cumulative weight > u;
        instance = Random(seed).choice(source j's seeds) (drawn after u)."""
        rng = random.Random(seed)
        u = rng.random() * sum(s.weight for s in self.sources)
        acc = 0.0
        chosen = self.sources[-1]
        for source in self.sources:
            acc += source.weight
            if u < acc:
                chosen = source
                break
        return chosen, int(chosen.seeds[rng.randrange(len(chosen.seeds))])


def build_mixture(target_envs: Sequence[tuple[str, EnvFactory]], *, split: str,
                  splits: Mapping[str, str] | None = None) -> Mixture:
    """The GRPO mixture of several target environments, equal weights (module docstring); each source's
    seeds (its `splits[label]`, default `split`) are read once here."""
    if not target_envs:
        raise InvalidArgument(field="spec.environments", expected="the target environment (GRPO on the gates plays "
                              "the target's training tasks)", fix="list the target after the capability environments, "
                              "with params split=train")
    sources: list[MixtureSource] = []
    max_turns = 1
    for label, factory in target_envs:
        probe = factory()
        have = probe.splits()
        want = (splits or {}).get(label) or split
        if want not in have or len(have[want]) == 0:
            raise InvalidArgument(field="spec.environments", expected=f"environment {probe.name!r} to define a "
                                  f"non-empty {want!r} split", got=sorted(have),
                                  fix="set config.train_split (or the environment's split param) to a split it "
                                      "defines")
        max_turns = max(max_turns, int(probe.default_max_turns))
        sources.append(MixtureSource(label, factory, have[want], 1.0 / len(target_envs)))
    return Mixture(tuple(sources), max_turns=max_turns)


class MixtureEnv(Environment):
    """Plays the instance a mixture seed maps to (`Mixture.pick`); everything else is delegated to
    that source's environment (created lazily, one per source, per MixtureEnv instance)."""

    name: ClassVar[str] = "gate-mixture"
    version: ClassVar[str] = "1.0.0"

    def __init__(self, mixture: Mixture):
        self.mixture = mixture
        self.default_max_turns = mixture.max_turns  # type: ignore[misc]
        self._envs: dict[str, Environment] = {}
        self._env: Environment | None = None
        self._label = ""

    def splits(self) -> dict[str, Sequence[int]]:
        return {"train": range(self.mixture.size)}

    def _current(self) -> Environment:
        if self._env is None:
            raise FailedPrecondition("reset the mixture environment first")
        return self._env

    def reset(self, seed: int) -> Observation:
        source, inner = self.mixture.pick(self.check_seed(seed))
        if source.label not in self._envs:
            self._envs[source.label] = source.factory()
        self._env, self._label = self._envs[source.label], source.label
        self.name = self._env.name  # type: ignore[misc] - trajectories name the environment actually played
        self.version = self._env.version  # type: ignore[misc]
        return self._env.reset(inner)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._current().tool_schemas()

    def step(self, action: Any) -> StepResult:
        return self._current().step(action)

    @property
    def done(self) -> bool:
        return self._current().done

    def reward(self) -> float:
        return self._current().reward()

    @property
    def task_id(self) -> str:
        return self._current().task_id

    def diagnostics(self) -> list[dict[str, Any]]:
        return self._current().diagnostics()

    def reward_breakdown(self) -> dict[str, float]:
        return self._current().reward_breakdown()

    def failure_reason(self) -> str | None:
        return self._current().failure_reason()

    def episode_info(self) -> dict[str, Any]:
        return {**self._current().episode_info(), "mixture_source": self._label}

    @property
    def termination(self):
        return self._current().termination


def grpo_source(target_envs: Sequence[tuple[str, EnvFactory]], config: GateGRPOConfig,
                splits: Mapping[str, str] | None = None) -> tuple[EnvFactory, str, Sequence[int]]:
    """(environment factory, split name, its seeds) that GRPO on the gates plays: the one target's
    training split, or the mixture of several targets (its own `train` split). The outcome replays
    read the same seeds through the same schedule (outcomes.py)."""
    if len(target_envs) == 1:
        label, factory = target_envs[0]
        split = (splits or {}).get(label) or config.train_split
        return factory, split, factory().splits()[split]
    mixture = build_mixture(target_envs, split=config.train_split, splits=splits)
    return mixture.factory, "train", range(mixture.size)


__all__ = ["Mixture", "MixtureEnv", "MixtureSource", "build_mixture", "grpo_source"]
