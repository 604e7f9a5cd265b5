"""Measure a base agent on the built-in domain's test split: pass rate with a Wilson 95 %
interval, per task type (each tests one planted capability), tool-call well-formedness,
capability diagnostics, generation speed, and the warm-start wall time from the cache record.

    report = await evaluate_model_dir(model_dir, episodes=200)   # an AgentReport
    print(report.format())

The command line (`python -m trace_common.agents.evaluate_cli micro`) is `evaluate_cli.py`: it
resolves a base agent by name first, and the builders it reaches (`micro.py`) call back into
this module for their pass-rate probe, so this module imports no resolver.

Episodes are sampled at temperature 1 with top_k=0 / top_p=1 (the rollout setting): an
agent that imitates a partially skilled expert shows the skill in a fraction of its
episodes only under true sampling; greedy decoding would always pick the majority action.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_common import stats
from trace_common.env.trajectory import Trajectory
from trace_common.errors import InvalidArgument


@dataclass
class PassRate:
    passed: int
    total: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def __str__(self) -> str:
        return f"{self.passed}/{self.total} = {self.rate:.1%} [{self.low:.1%}, {self.high:.1%}]"


def wilson_interval(passed: int, total: int) -> tuple[float, float]:
    """`trace_common.stats.wilson_interval` (95 %), refusing impossible counts with InvalidArgument."""
    if total < 0 or not 0 <= passed <= max(total, 0):
        raise InvalidArgument(field="passed", expected=f"0 <= passed <= total ({total})", got=passed)
    return stats.wilson_interval(passed, total)


def pass_rate(passed: int, total: int) -> PassRate:
    low, high = wilson_interval(passed, total)
    return PassRate(passed, total, low, high)


@dataclass
class AgentReport:
    agent: str
    model_dir: str
    episodes: int
    overall: PassRate
    per_task_type: dict[str, PassRate]
    capability_of: dict[str, str]
    mean_reward: float
    turns: int
    tool_call_turns: int
    well_formed_call_fraction: float
    malformed_turns: int
    diagnostics: dict[str, int]
    terminations: dict[str, int]
    completion_tokens: int
    generate_seconds: float
    wall_seconds: float
    warm_start_seconds: float | None
    temperature: float = 1.0
    build_metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.generate_seconds if self.generate_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["overall"]["rate"] = self.overall.rate
        for name, pr in self.per_task_type.items():
            out["per_task_type"][name]["rate"] = pr.rate
        out["tokens_per_second"] = self.tokens_per_second
        return out

    def format(self) -> str:
        decoding = "greedy" if self.temperature == 0 else f"sampled at T={self.temperature:g}"
        lines = [f"agent {self.agent} ({self.model_dir}), {self.episodes} test episodes, {decoding}",
                 f"  pass rate      {self.overall}   mean reward {self.mean_reward:.3f}"]
        for name, pr in sorted(self.per_task_type.items()):
            lines.append(f"  {name:<20} {pr}   (capability {self.capability_of.get(name, '?')})")
        lines.append(f"  tool-call turns {self.tool_call_turns}/{self.turns}; well-formed calls "
                     f"{self.well_formed_call_fraction:.1%}; malformed turns {self.malformed_turns}")
        lines.append(f"  diagnostics    {dict(sorted(self.diagnostics.items()))}")
        lines.append(f"  terminations   {self.terminations}")
        lines.append(f"  generation     {self.completion_tokens} tokens in {self.generate_seconds:.1f}s "
                     f"({self.tokens_per_second:.0f} tok/s, batched); episodes wall {self.wall_seconds:.1f}s")
        if self.warm_start_seconds is not None:
            lines.append(f"  warm start     {self.warm_start_seconds:.1f}s wall (build record)")
        return "\n".join(lines)


def summarise(agent: str, model_dir: str, trajectories: Sequence[Trajectory], stats: dict[str, Any],
              wall_seconds: float, meta: dict[str, Any] | None, temperature: float = 1.0) -> AgentReport:
    from trace_common.domains.store import CAPABILITY_OF

    by_type: dict[str, list[bool]] = defaultdict(list)
    diagnostics: Counter[str] = Counter()
    calls = bad_calls = 0
    for t in trajectories:
        by_type[str(t.info.get("task_type", "?"))].append(t.success)
        for d in t.diagnostics:
            diagnostics[f"{d.capability}/{d.event}"] += 1
        for m in t.messages:
            if m.role == "assistant" and m.tool_calls:
                calls += len(m.tool_calls)
        bad_calls += sum(len(e["errors"]) for e in t.info.get("parse_errors", []))
    n_success = sum(t.success for t in trajectories)
    return AgentReport(
        agent=agent, model_dir=model_dir, episodes=len(trajectories), overall=pass_rate(n_success, len(trajectories)),
        per_task_type={k: pass_rate(sum(v), len(v)) for k, v in by_type.items()},
        capability_of={k: CAPABILITY_OF.get(k, "?") for k in by_type},
        mean_reward=sum(t.reward for t in trajectories) / max(1, len(trajectories)),
        turns=sum(t.assistant_turns() for t in trajectories), tool_call_turns=stats["tool_call_turns"],
        well_formed_call_fraction=1.0 - bad_calls / calls if calls else 0.0, malformed_turns=stats["malformed_turns"],
        diagnostics=dict(diagnostics), terminations=dict(Counter(str(t.termination) for t in trajectories)),
        completion_tokens=stats["completion_tokens"], generate_seconds=stats["generate_seconds"],
        wall_seconds=wall_seconds, warm_start_seconds=(meta or {}).get("build_seconds"), temperature=temperature,
        build_metrics={k: v for k, v in ((meta or {}).get("metrics") or {}).items()
                       if k not in ("loss_curve", "loss_trace")})


async def evaluate_model_dir(model_dir: str | Path, *, agent: str | None = None, episodes: int = 200,
                             split: str = "test", temperature: float = 1.0, seed: int = 0, max_tokens: int = 256,
                             concurrency: int = 32, max_batch: int = 32) -> AgentReport:
    """Play `episodes` seeds of the store's `split` (in order, so task types stay balanced)."""
    from trace_common.agents.cache import read_meta
    from trace_common.domains.store import SPLITS, StoreEnv
    from trace_common.policy.base import SamplingParams
    from trace_common.policy.episodes import play_episodes
    from trace_common.policy.transformers_backend import TransformersPolicy

    if split not in SPLITS:
        raise InvalidArgument(field="split", expected=" | ".join(SPLITS), got=split)
    seeds = list(SPLITS[split])[:episodes]
    policy = TransformersPolicy.from_dir(model_dir, max_batch=max_batch)
    started = time.perf_counter()
    try:
        trajectories = await play_episodes(StoreEnv, policy, [(s, 0) for s in seeds],
                                           SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens),
                                           concurrency=concurrency)
    finally:
        await policy.close()
    wall = time.perf_counter() - started
    return summarise(agent or str(model_dir), str(model_dir), trajectories, policy.stats.snapshot(), wall,
                     read_meta(Path(model_dir)), temperature)
