"""Per-capability sub-goal success over store episodes: of the sub-requests that needed a
capability, the share that did not fail on it (the store's attribution gives each failed
sub-request the capabilities its failure belongs to: `attribution.py`).

It says more than a pass rate where the store's reward is all-or-nothing and pass rates are a
few percent: an agent can fulfil most sub-requests of a task it fails. The base agent's build
probe and the run report read it.
"""

from __future__ import annotations

from collections.abc import Sequence

from trace_common.env.trajectory import Trajectory


def episode_subgoals(trajectory: Trajectory) -> list[tuple[int, str, bool]]:
    """The episode's sub-goals in order, as (sub-request index, capability, met).

    Semantics: task regenerated from the episode's seed and task types; for each sub-request i,
        met(i, c) = no "subgoal_failed" diagnostic with detail.index == i and capability c
                    (attribution gives each failed sub-request the capabilities its failure belongs to)
        needs(i) = sub-request i's capabilities, plus multi_step_task_completion when the task needs
                   it (requests stated all at once) and i > 0 (the expert without it does the first only)
        sub-goals = [(i, c, met(i, c)) for i in order, for c in needs(i)]"""
    from trace_common.domains.store import StoreEnv
    from trace_common.domains.store.attribution import SUBGOAL_EVENT
    from trace_common.domains.store.task_model import MULTI

    env = StoreEnv(task_types=trajectory.env.params.get("task_types") or None)
    env.reset(trajectory.seed)
    failed = {(d.detail.get("index"), d.capability) for d in trajectory.diagnostics if d.event == SUBGOAL_EVENT}
    multi = MULTI in env.task.capabilities
    return [(i, c, (i, c) not in failed)
            for i, sr in enumerate(env.task.subrequests)
            for c in [*sr.capabilities, *([MULTI] if multi and i > 0 and MULTI not in sr.capabilities else [])]]


def subgoal_rates(trajectories: Sequence[Trajectory]) -> dict[str, list[int]]:
    """Capability -> [sub-goals met, sub-goals needing it] over the episodes' sub-requests.

    Semantics: for each episode and each of its sub-goals (i, c, met) (`episode_subgoals`),
        total[c] += 1; hit[c] += met"""
    out: dict[str, list[int]] = {}
    for t in trajectories:
        for _, c, met in episode_subgoals(t):
            row = out.setdefault(c, [0, 0])
            row[0] += met
            row[1] += 1
    return dict(sorted(out.items()))
