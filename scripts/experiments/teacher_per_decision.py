"""Dev analysis for issue #31 item 4: how much of `micro`'s pass-rate gap to its teacher would remain
if it matched each of its teacher's decisions only on average?

The teacher (the store's scripted expert, every skill at 0.5) draws its skills once per *episode*
(`StoreExpert.skill_flags`): in an episode without record selection it picks the decoy for every
by-attributes request, so its failures are concentrated in few episodes and

    pass rate (per episode) = mean over tasks t of  prod_{c needed by t} p_c

An imitator that decides each request afresh, at its teacher's rate but without carrying its
earlier choices forward, is the same expert with the skills drawn per *decision*: here once per
sub-request for record selection, precondition and tool-call precision (one draw serves every
check of that skill within the sub-request), and still once per episode for multi-step completion
(one decision: go on after the first request or not). Its sub-goal rates are the teacher's; its
pass rate is

    pass rate (per decision) = mean over tasks t of  prod_c p_c ** n_c(t)   (n_c: decisions needing c)

which this script measures by playing both on the first `--tasks` dev tasks, `--samples` draws each
(the same draws for the per-episode teacher as the build probe's `teacher` row when `--samples 4`).
A sub-goal rate is not the skill's probability (without record selection the expert still meets
some record sub-goals), and `micro`'s failures include choices this expert never makes, so the
script compares teachers only; no model is played, and the test split is never played.

    python scripts/experiments/teacher_per_decision.py --json docs/teacher-per-decision-<date>.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from record_code import code_state


def per_decision_teacher(data: Any, samples: int, tasks: int) -> dict[str, Any]:
    """Play the first `tasks` dev tasks `samples` times each with the teacher of warm-start `data`
    (its skills, expert seed and task types), some skills drawn per sub-request of a compound task:
    record selection, precondition and tool-call precision (multi-step stays per episode). The
    trajectories' `expert_skills` info still holds the per-episode flags; nothing here reads it."""
    from trace_common.agents.guided_probe import split_seeds, summary
    from trace_common.domains.store import ExpertConfig, StoreEnv, StoreExpert
    from trace_common.domains.store import expert as expert_module
    from trace_common.domains.store.task_model import PRECISION, PRECONDITION, SDR

    original = expert_module._compound_subrequest
    state: dict[str, Any] = {}

    def redrawn(plan: Any, sr: Any, flags: dict[str, bool], listed: list[bool]) -> str:
        rng = state["rng"]
        fresh = {**flags, **{c: rng.random() < skills[c] for c in (SDR, PRECONDITION, PRECISION)}}
        return original(plan, sr, fresh, listed)

    skills = dict(data.skills)
    expert = StoreExpert(ExpertConfig(skills=skills, seed=data.expert_seed))
    env = StoreEnv(task_types=data.task_types)
    trajectories = []
    expert_module._compound_subrequest = redrawn
    try:
        for seed in split_seeds("dev", tasks):
            for k in range(samples):
                state["rng"] = random.Random(f"per-decision:teacher:{seed}:{k}")
                trajectories.append(expert.play(env, seed, k))
    finally:
        expert_module._compound_subrequest = original
    return summary(trajectories, condition="per-decision (teacher)", samples=samples,
                   skills={c: round(p, 4) for c, p in skills.items()})


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=100, help="first dev tasks (the build probe's 100)")
    ap.add_argument("--samples", type=int, default=40, help="skill draws per task")
    ap.add_argument("--json", help="write the record here too")
    args = ap.parse_args(argv)
    from trace_common.agents.guided_probe import teacher_probe
    from trace_common.agents.micro import MicroConfig

    order = ("multi_step_task_completion", "precondition_verification", "structured_data_reasoning",
             "tool_call_precision")
    data = MicroConfig().data
    t0 = time.perf_counter()
    teacher = teacher_probe(data, "dev", args.tasks, args.samples)
    rows = {"teacher, per episode": teacher,
            "teacher, per decision": per_decision_teacher(data, args.samples, args.tasks)}
    for name, row in rows.items():
        rates = " / ".join(f"{row['subgoal_success'][c]['rate']}" for c in order)
        print(f"{name}: passes {row['passed']} of {row['episodes']} ({row['pass_rate']:.3f}); "
              f"multi / precondition / record / tool {rates}", flush=True)
    command = f"python scripts/experiments/teacher_per_decision.py --tasks {args.tasks} --samples {args.samples}"
    record = {**code_state(), "command": command, "split": "dev", "tasks": args.tasks, "samples": args.samples,
              "seconds": round(time.perf_counter() - t0, 1), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
