"""What one evaluation arm scored, read back from its rollout job's trajectories.

Shared by the evaluation stage (`stage.py`), the GEPA arm (`gepa.py`), the report and the
completion cap: `arm_summary` / `breakdown` turn one rollout job's trajectories into per-task
outcomes (for the paired statistics; successes out of `evaluation.trials` per task where an arm
plays several), tokens played, and pass rates per required capability (compound tasks count once
for every capability they need) or per probe (a probe's one capability).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from trace_common.env import Trajectory, loads_jsonl
from trace_common.stats import wilson_interval
from tracectl.run.jobs import StageFailed
from tracectl.run.results import Rate, Scored, SubgoalRate


def read_trajectories(store, uri: str) -> list[Trajectory]:
    return loads_jsonl(store.get_bytes(store.key_of(uri)), source=uri)


def trajectory_tokens(trajs: Iterable[Trajectory]) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) as the trainer counts them (every assistant turn's full
    prompt, and its completion); None when no turn recorded token ids (an HTTP backend may not)."""
    prompt = completion = 0
    recorded = False
    for tr in trajs:
        for r in tr.turns:
            if r.prompt_token_ids is not None or r.completion_token_ids is not None:
                recorded = True
            prompt += len(r.prompt_token_ids or [])
            completion += len(r.completion_token_ids or [])
    return (prompt, completion) if recorded else (None, None)


def _groups(trajs: Iterable[Trajectory]) -> dict[str, list[bool]]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for tr in trajs:
        if tr.info.get("capability"):              # a probe: its one capability
            keys = [str(tr.info["capability"])]
        elif tr.info.get("capabilities"):          # a compound task: every capability it needs
            keys = [str(c) for c in tr.info["capabilities"]]
        else:
            keys = [str(tr.info.get("task_type") or "all")]
        for k in keys:
            groups[k].append(tr.success)
    return groups


def rates(groups: Mapping[str, list[bool]]) -> dict[str, Rate]:
    out = {}
    for key, xs in sorted(groups.items()):
        lo, hi = wilson_interval(sum(xs), len(xs))
        out[key] = Rate(n=len(xs), pass_rate=sum(xs) / len(xs), ci=[lo, hi])
    return out


def breakdown(store, uri: str) -> dict[str, Rate]:
    """Pass rate per required capability (compound tasks: each capability they need; probes: their
    one capability; otherwise the task type), read from the arm's trajectories."""
    return rates(_groups(read_trajectories(store, uri)))


def subgoal_success(store, uri: str) -> dict[str, SubgoalRate] | None:
    """Per-capability sub-goal success of an arm's compound episodes (`trace_common.domains.store.
    subgoals`), or None when the episodes are not the built-in
    store's, the one target whose verifier attributes each failed sub-request to a capability."""
    trajs = [tr for tr in read_trajectories(store, uri) if not tr.info.get("capability")]  # probes: one skill
    if not trajs or any(tr.env.name != "store" for tr in trajs):
        return None
    from trace_common.domains.store.subgoals import subgoal_rates

    return {c: SubgoalRate(met=met, total=total, rate=met / total if total else None)
            for c, (met, total) in subgoal_rates(trajs).items()}


def task_ids_digest(task_ids: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(task_ids).encode()).hexdigest()[:16]


def arm_summary(store, uri: str, trials: int = 1) -> dict[str, Any]:
    """The fields of `Scored` (tracectl/run/results.py) and `breakdown` that the evaluation keeps of
    one arm's trajectories, to build its record from: `breakdown`, the per-task outcomes
    (a string over the tasks sorted by seed, one digit per task: '0'/'1' at one trial, its
    number of successes out of `trials` otherwise, with the digest of that task order, so two
    arms pair only on the same tasks), and the tokens played. Every task must have been played
    exactly `trials` times (the evaluation plays that many); anything else is an error.
    With trials > 1 (tau2's pass^k convention) the pass rate is the mean over tasks, its interval
    a bootstrap over tasks (trials of one task are not independent), and `pass_hat_k` holds
    pass^1 .. pass^trials (trace_common.stats.pass_hat_k)."""
    if not 1 <= trials <= 9:
        raise ValueError(f"trials={trials} must be in [1, 9] (one digit per task in the outcomes string)")
    trajs = sorted(read_trajectories(store, uri), key=lambda tr: (tr.seed, tr.task_id, tr.sample_index))
    by_task: dict[str, list[bool]] = {}
    for tr in trajs:
        by_task.setdefault(tr.task_id, []).append(tr.success)
    wrong = {t: len(xs) for t, xs in by_task.items() if len(xs) != trials}
    if wrong:
        t, k = next(iter(wrong.items()))
        raise StageFailed(f"{uri}: task {t} was played {k} time(s), {len(wrong)} task(s) in all not {trials}: the "
                          f"evaluation pairs {trials} trial(s) per task")
    ids = list(by_task)
    counts = [sum(xs) for xs in by_task.values()]
    prompt, completion = trajectory_tokens(trajs)
    out = {"breakdown": rates(_groups(trajs)), "outcomes": "".join(str(c) for c in counts),
           "task_ids_sha256": task_ids_digest(ids), "prompt_tokens": prompt, "completion_tokens": completion}
    if trials > 1:
        from trace_common.stats import pass_hat_k, task_mean_interval

        out.update(trials=trials, tasks=len(ids), pass_rate=sum(counts) / (trials * len(ids)) if ids else 0.0,
                   ci=list(task_mean_interval(counts, trials)),
                   pass_hat_k={str(k): pass_hat_k(counts, trials, k) for k in range(1, trials + 1)})
    return out


def outcomes(arm: Scored) -> list[bool]:
    """Per-task pass/fail of a one-trial arm."""
    if arm.trials != 1:
        raise ValueError(f"an arm of {arm.trials} trials per task has success counts: use trial_successes")
    return [c == "1" for c in arm.outcomes]


def trial_successes(arm: Scored) -> list[int]:
    """Per-task successes out of the arm's `trials` (1 for an arm recorded before trials existed)."""
    return [int(c) for c in arm.outcomes]
