"""Dev measurement for issue #31 item 4: how far is a `micro` build from its teacher, and where?

For each model directory given (and the teacher: the scripted expert with micro's warm-start skills,
4 skill draws per task), on the first 100 dev tasks of the compound store target, unguided, sampled
at T = 1 (seeds 0-3, so 4 episodes per task, like the teacher's 4 draws):
- passes of 400;
- per-capability sub-goal success (`trace_common.domains.store.subgoals.subgoal_rates`);
- the cause of each failed sub-request (`trace_common.domains.store.attribution`: the first matching
  row of its table -- write against status, malformed never corrected, never addressed, status not
  named, wrong record, else unexplained), counted once per failed sub-request;
- the episodes' shape (`_episode_shape`): how many meet every sub-goal, how many would pass if sub-goals
  succeeded independently at the agent's own per-skill rates, why episodes meeting every sub-goal still
  fail, and, over consecutive sub-goals needing the same skill in one episode, how often the later one
  is met after a met one and after a failed one (the teacher's multi-step completion is drawn per
  episode, so its answer there is all or nothing; its other skills also depend on the record).

Sampling matches the teacher's stochastic skill draws, so a gap here is not a greedy-decoding
artefact. The test split is never played. The record's run took 2,190 s for the teacher and the
three builds on 2 cores shared with other work (alone: about 2.5 minutes per 1 M-parameter model, 5 for
the 3.4 M one); the JSON is rewritten after each model, with each model's directory and build key and
the commit measured.

    python scripts/experiments/micro_fidelity_dev.py --model shipped=trace_common/agents/shipped/micro \
        --model rebuilt_5400=$HOME/.cache/trace/ship/micro-<key> --json /tmp/fidelity.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TASKS = 100
SAMPLES = 4


def _why_all_met_failed(t: Any) -> str:
    """Why an episode whose every sub-goal is met fails: an unrequested change (attribution's event); else a
    sub-request failed on a capability it does not need (a plain request never addressed, say), by its
    attributed cause ("outside_needs:<cause>");
    else a policy violation (breakdown["policy"] < 1); else the termination."""
    from trace_common.domains.store.attribution import SUBGOAL_EVENT, UNREQUESTED_EVENT

    if any(d.event == UNREQUESTED_EVENT for d in t.diagnostics):
        return "unrequested_change"
    failed = [d for d in t.diagnostics if d.event == SUBGOAL_EVENT]
    if failed:
        return f"outside_needs:{failed[0].detail.get('cause')}"
    return "policy_violation" if t.reward_breakdown.get("policy", 1.0) < 1.0 else str(t.termination)


def _episode_shape(trajectories: Sequence[Any], rates: dict[str, float]) -> dict[str, Any]:
    """Where sub-goal rates near the teacher's still lose whole episodes.

    Semantics, over the episodes' sub-goals (i, c, met) (`subgoals.episode_subgoals`):
        all_met          = #episodes with every sub-goal met
        independent      = sum over episodes of prod over its sub-goals of rates[c]: the passes if each
                           sub-goal succeeded independently at the agent's own rate for its capability
        all_met_failed   = episodes with every sub-goal met that still fail, by why (`_why_all_met_failed`)
        continuation[c]  = over consecutive sub-goals of capability c in one episode:
                           [met after a met one, after a met one, met after a failed one, after a failed one]
    The teacher's multi-step skill is drawn per episode, so its multi-step continuation is all or nothing."""
    import math

    from trace_common.domains.store.subgoals import episode_subgoals

    all_met, independent = 0, 0.0
    why: collections.Counter[str] = collections.Counter()
    continuation: dict[str, list[int]] = {}
    for t in trajectories:
        goals = episode_subgoals(t)
        independent += math.prod(rates[c] for _, c, _ in goals)
        if all(met for *_, met in goals):
            all_met += 1
            if not t.success:
                why[_why_all_met_failed(t)] += 1
        by_capability: dict[str, list[bool]] = collections.defaultdict(list)
        for _, c, met in goals:
            by_capability[c].append(met)
        for c, seq in by_capability.items():
            row = continuation.setdefault(c, [0, 0, 0, 0])
            for before, after in itertools.pairwise(seq):
                row[0 if before else 2] += after
                row[1 if before else 3] += 1
    return {"all_subgoals_met": all_met, "independent_prediction": round(independent, 1),
            "all_met_failed": dict(why.most_common()), "continuation": dict(sorted(continuation.items()))}


def _measure(trajectories: Sequence[Any]) -> dict[str, Any]:
    from trace_common.domains.store.attribution import SUBGOAL_EVENT
    from trace_common.domains.store.subgoals import subgoal_rates

    causes: collections.Counter[str] = collections.Counter()
    for t in trajectories:
        first: dict[Any, str] = {}
        for d in t.diagnostics:
            if d.event == SUBGOAL_EVENT:
                first.setdefault(d.detail.get("index"), d.detail.get("cause"))
        causes.update(first.values())
    rates = subgoal_rates(trajectories)
    return {"episodes": len(trajectories), "passed": sum(t.success for t in trajectories),
            "subgoal": {c: [met, tot, round(met / tot, 3)] for c, (met, tot) in rates.items()},
            "failed_subrequests": sum(causes.values()), "causes": dict(causes.most_common()),
            "episode_shape": _episode_shape(trajectories, {c: met / tot for c, (met, tot) in rates.items()})}


def teacher() -> dict[str, Any]:
    from trace_common.agents.guided_probe import teacher_trajectories
    from trace_common.agents.micro import MicroConfig

    return _measure(teacher_trajectories(MicroConfig().data, "dev", TASKS, SAMPLES))


async def agent(model_dir: Path) -> dict[str, Any]:
    from trace_common.agents.guided_probe import split_seeds
    from trace_common.domains.store import StoreEnv
    from trace_common.policy.base import SamplingParams
    from trace_common.policy.episodes import play_episodes
    from trace_common.policy.transformers_backend import TransformersPolicy

    policy = TransformersPolicy.from_dir(model_dir, max_batch=32)
    trajectories = []
    try:
        for seed in range(SAMPLES):
            trajectories += await play_episodes(StoreEnv, policy, [(s, 0) for s in split_seeds("dev", TASKS)],
                                                SamplingParams(temperature=1.0, seed=seed, max_tokens=256))
    finally:
        await policy.close()
    return _measure(trajectories)


def _build_key(model_dir: Path) -> str | None:
    """The build's cache key: the shipped artifact's build record, or a cache entry's meta."""
    from trace_common.agents import read_meta, shipped

    record = shipped.read_record(model_dir)
    if record is not None:
        return record.get("key")
    meta = read_meta(model_dir)
    return None if meta is None else meta.get("hash")


def _shown(model_dir: Path) -> str:
    """The directory as a record may name it: repository-relative, else its name (a record is committed,
    and no tracked file names a path of the machine it was made on)."""
    resolved = model_dir.resolve()
    return resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else resolved.name


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=DIR",
                        help="a micro build directory to measure (repeatable; NAME a new identifier)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"split": "dev", "tasks": TASKS, "samples_per_task": SAMPLES, "temperature": 1.0,
                              "commit": _commit(), "models": {}}
    models: dict[str, Path] = {}
    for item in args.model:
        name, sep, path = item.partition("=")
        if not sep or not name.isidentifier() or not Path(path, "config.json").is_file():
            parser.error(f"--model {item!r}: expected NAME=DIR, NAME an identifier and DIR a model directory "
                         "holding config.json")
        if name in models or name in result or name == "teacher" or name == "seconds":
            parser.error(f"--model {item!r}: the name {name!r} is taken; give each model its own name")
        models[name] = Path(path)
        result["models"][name] = {"dir": _shown(Path(path)), "key": _build_key(Path(path))}
    started = time.perf_counter()

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - started, 1)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")

    result["teacher"] = teacher()
    print("teacher", json.dumps(result["teacher"]), flush=True)
    save()
    for name, path in models.items():
        result[name] = asyncio.run(agent(path))
        print(name, json.dumps(result[name]), flush=True)
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
