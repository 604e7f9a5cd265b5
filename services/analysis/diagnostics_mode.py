"""Diagnostics mode: labels derived deterministically from environment diagnostics.

Diagnostics mode reads the environment's capability tags instead of asking an LLM: it is an
*oracle analyst* that stands in for the LLM analyst on a machine where no capable LLM runs
(the embedded demo). Its labels are only as good as the environment's tagging, and it can
name only capabilities the environment tags; the LLM mode (`labeling.py`) is the analysis
the method describes.

An environment tags the capability failures it can see (`Trajectory.diagnostics`, events
`{capability, event, turn, detail}`; the `Diagnostic` contract says each one is a visible
failure). The built-in store also attributes every failed sub-goal to the capability it
belongs to (event `subgoal_failed`, see `trace_common.domains.store.attribution`), so each
of its failed trajectories carries at least one failure event. Analysis needs a third fact:
whether a trajectory *exercised* a capability at all.

Label rule, for trajectory t and capability c:

    exercised(t, c) = c == t.info["capability"]                    (a single-capability task's target)
                      or c in t.info["capabilities"]                (the capabilities the task needs)
                      or t has a diagnostic of c with event "capability_exercised"
                      or t has a failure event of c
    failure(t, c)   = t has a diagnostic of c whose event is not "capability_exercised"
                      (step-time events such as write_precondition_false, and the sub-goal
                      attribution's subgoal_failed / unrequested_change, alike)

| failure(t, c) | exercised(t, c) | label   | e.g.                                                        |
|---------------|-----------------|---------|-------------------------------------------------------------|
| yes           | (implied)       | LACKING | a failed task whose only event for c is subgoal_failed      |
| no            | yes             | PRESENT | the task needed c and nothing of c failed                   |
| no            | no              | NA      | the task did not need c and nothing of c was seen           |

So a failed trajectory whose verifier failure belongs to a capability's sub-goal is LACKING
for it, the other capabilities its task needed are PRESENT, and a trajectory whose task did
not need a capability says nothing about it (NA) unless the environment saw it fail there
anyway (e.g. a malformed tool call during any task). A failure event counts in passed
trajectories too (an agent that recovered from a malformed call).

Candidates are the capabilities named anywhere in the trajectories' diagnostics or metadata.
The N runs are stratified bootstrap resamples: failed and passed trajectories are each drawn
with replacement to their own count, so every run keeps |F| and |P| and only the mix varies
(a plain resample could draw a run with no failures, where coverage means nothing).
"""

from __future__ import annotations

import json
import random
from collections import Counter

from trace_common.env import Trajectory

from .labeling import LabelRun, run_seed
from .schemas import MAX_EVIDENCE, Candidate, PairLabel
from .stats import Label

EXERCISED_EVENT = "capability_exercised"
#: the store's sub-goal attribution event (any event other than EXERCISED_EVENT is a failure)
SUBGOAL_EVENT = "subgoal_failed"


def _info_capabilities(traj: Trajectory) -> set[str]:
    out: set[str] = set()
    cap = traj.info.get("capability")
    if isinstance(cap, str) and cap:
        out.add(cap)
    caps = traj.info.get("capabilities")
    if isinstance(caps, list | tuple):
        out.update(c for c in caps if isinstance(c, str) and c)
    return out


def exercised(traj: Trajectory) -> set[str]:
    return _info_capabilities(traj) | {d.capability for d in traj.diagnostics}


def has_diagnostics(trajectories: list[Trajectory]) -> bool:
    """Whether diagnostics labels can be derived at all (for the mode and for kappa)."""
    return any(exercised(t) for t in trajectories)


def is_failure_event(event: str) -> bool:
    """Every diagnostic is a failure event except the explicit exercised marker."""
    return event != EXERCISED_EVENT


def label_trajectory(traj: Trajectory, capabilities: list[str]) -> dict[str, PairLabel]:
    failures: dict[str, list] = {}
    for d in traj.diagnostics:
        if is_failure_event(d.event):
            failures.setdefault(d.capability, []).append(d)
    ex = exercised(traj)
    out: dict[str, PairLabel] = {}
    for c in capabilities:
        if c in failures:
            d = failures[c][0]
            detail = json.dumps(d.detail, ensure_ascii=False, separators=(",", ":"), default=str)
            more = f" (+{len(failures[c]) - 1} more)" if len(failures[c]) > 1 else ""
            evidence = f"{d.event} at turn {d.turn}{more}: {detail}"
            if len(evidence) > MAX_EVIDENCE:
                evidence = evidence[:MAX_EVIDENCE - 3] + "..."
            out[c] = PairLabel(Label.LACKING, evidence)
        elif c in ex:
            out[c] = PairLabel(Label.PRESENT, f"task exercises {c}; no {c} failure event recorded")
        else:
            out[c] = PairLabel(Label.NA, "")
    return out


def candidates(trajectories: list[Trajectory], max_candidates: int) -> list[Candidate]:
    """Capabilities named by the environment; when there are more than `max_candidates`, the
    ones with the most failure events in failed trajectories are kept."""
    events: dict[str, Counter[str]] = {}
    weight: Counter[str] = Counter()
    for t in trajectories:
        for c in exercised(t):
            events.setdefault(c, Counter())
        for d in t.diagnostics:
            if is_failure_event(d.event):
                events.setdefault(d.capability, Counter())[d.event] += 1
                weight[d.capability] += not t.success
    names = sorted(events, key=lambda c: (-weight[c], c))[:max_candidates]
    out = []
    for c in sorted(names):
        seen = ", ".join(f"{e} ({n})" for e, n in events[c].most_common(4)) or "none"
        out.append(Candidate(c, f"Capability tagged by the environment's diagnostics; failure events seen: "
                                f"{seen}."))
    return out


def bootstrap_runs(trajectories: list[Trajectory], capabilities: list[str], *, num_runs: int,
                   seed: int) -> list[LabelRun]:
    """N stratified bootstrap resamples, each labeled by the diagnostics rule.

    Semantics:
        F, P = indices of failed / passed trajectories
        run r: rng = Random(run_seed(seed, r))
               draws = [rng.choice(F) for _ in F] + [rng.choice(P) for _ in P]
    """
    labels = {i: label_trajectory(t, capabilities) for i, t in enumerate(trajectories)}
    failed = [i for i, t in enumerate(trajectories) if not t.success]
    passed = [i for i, t in enumerate(trajectories) if t.success]
    runs = []
    for r in range(num_runs):
        s = run_seed(seed, r)
        rng = random.Random(s)
        draws = [rng.choice(failed) for _ in failed] + [rng.choice(passed) for _ in passed]
        runs.append(LabelRun(index=r, seed=s, draws=draws, labels={i: labels[i] for i in set(draws)}))
    return runs
