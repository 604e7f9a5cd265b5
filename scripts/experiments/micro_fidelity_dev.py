"""Dev measurement for issue #31 item 4: how far is a `micro` build from its teacher, and where?

For each model directory given (and the teacher: the scripted expert with micro's warm-start skills,
4 skill draws per task), on the first 100 dev tasks of the compound store target, unguided, sampled
at T = 1 (seeds 0-3, so 4 episodes per task, like the teacher's 4 draws):
- passes of 400;
- per-capability sub-goal success (`trace_common.domains.store.subgoals.subgoal_rates`);
- the cause of each failed sub-request (`trace_common.domains.store.attribution`: the first matching
  row of its table -- write against status, malformed never corrected, never addressed, status not
  named, wrong record, else unexplained), counted once per failed sub-request.

Sampling matches the teacher's stochastic skill draws, so a gap here is not a greedy-decoding
artefact. The test split is never played. About 2.5 minutes per model on 2 cores; the JSON is
rewritten after each model, with each model's directory and build key and the commit measured.

    python scripts/experiments/micro_fidelity_dev.py --model shipped=trace_common/agents/shipped/micro \
        --model rebuilt_5400=$HOME/.cache/trace/ship/micro-<key> --json /tmp/fidelity.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TASKS = 100
SAMPLES = 4


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
    return {"episodes": len(trajectories), "passed": sum(t.success for t in trajectories),
            "subgoal": {c: [met, tot, round(met / tot, 3)] for c, (met, tot) in subgoal_rates(trajectories).items()},
            "failed_subrequests": sum(causes.values()), "causes": dict(causes.most_common())}


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
