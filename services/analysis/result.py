"""The analysis result: per-candidate statistics over the N runs, retention decisions,
evidence, and the agreement between analysts. It becomes `report.json` (the result artifact)
and GetAnalysisJob's `results`; `report.py` renders it for people.

Per candidate, besides the run statistics (stats.py):
* `failed_task_ids` -- task ids of failed trajectories labeled LACKING in a majority of the
  runs that drew them (for diagnostics mode: in every run, labels are deterministic);
* `evidence` -- up to 5 distinct one-line quotes from failed trajectories labeled LACKING;
* `kappa` -- Cohen's kappa between the LLM's labels and the diagnostics labels, pooled over
  all runs' (trajectory, capability) pairs, when both exist for that capability: LLM mode on
  trajectories that carry diagnostics naming the same capability. None when it does not apply
  or is undefined (see stats.cohen_kappa); `kappa_note` says which.

Over the run, `unexplained_failures` (unexplained_failures below): how many failed trajectories no
retained capability explains, and how many no candidate at all explains -- the share of failures the
capabilities TRACE trains cannot be expected to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_common.env import Trajectory

from .diagnostics_mode import exercised, has_diagnostics, label_trajectory
from .labeling import LabelRun
from .schemas import Candidate
from .stats import Decision, Label, RunStats, Thresholds, cohen_kappa, decide, run_stats

SCHEMA_VERSION = 1
MAX_EVIDENCE_QUOTES = 5
MODES = {"ANALYST_MODE_LLM": "llm", "ANALYST_MODE_DIAGNOSTICS": "diagnostics"}


@dataclass
class CapabilityOutcome:
    candidate: Candidate
    decision: Decision
    runs: list[RunStats]
    failed_task_ids: list[str]
    evidence: list[str]
    kappa: float | None = None
    kappa_note: str = "not applicable: only one analyst's labels"

    def to_dict(self) -> dict[str, Any]:
        return {**self.candidate.to_dict(), **self.decision.to_dict(),
                "failed_task_ids": self.failed_task_ids, "evidence": self.evidence,
                "kappa": self.kappa, "kappa_note": self.kappa_note,
                "runs": [r.to_dict() for r in self.runs]}


@dataclass
class AnalysisResult:
    job_id: str
    run_id: str
    mode: str                       # "llm" | "diagnostics"
    thresholds: Thresholds
    seed: int
    inputs: dict[str, Any]
    capabilities: list[CapabilityOutcome]
    warnings: list[str] = field(default_factory=list)
    analyst: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)  # file name -> URI, filled when written
    unexplained: dict[str, Any] = field(default_factory=dict)  # unexplained_failures(); {} before it ran

    @property
    def retained(self) -> list[CapabilityOutcome]:
        return [c for c in self.capabilities if c.decision.retained]

    @property
    def rejected(self) -> list[CapabilityOutcome]:
        return [c for c in self.capabilities if not c.decision.retained]

    def to_dict(self) -> dict[str, Any]:
        th = self.thresholds
        return {
            "schema_version": SCHEMA_VERSION, "status": "complete", "job_id": self.job_id,
            "run_id": self.run_id, "mode": self.mode,
            "config": {"min_coverage": th.min_coverage, "min_gap": th.min_gap,
                       "min_passing_runs": th.min_passing_runs, "num_runs": th.num_runs, "seed": self.seed},
            "inputs": self.inputs, "analyst": self.analyst,
            "retained": [c.to_dict() for c in self.retained],
            "rejected": [c.to_dict() for c in self.rejected],
            "warnings": self.warnings, "outputs": self.outputs,
            **({"unexplained_failures": self.unexplained} if self.unexplained else {}),
        }


def _kappas(trajectories: list[Trajectory], runs: list[LabelRun], names: list[str]
            ) -> dict[str, tuple[float | None, str]]:
    if not has_diagnostics(trajectories):
        return {n: (None, "not available: the trajectories carry no diagnostics") for n in names}
    diag_caps = set().union(*(exercised(t) for t in trajectories))
    diag = {i: label_trajectory(t, [n for n in names if n in diag_caps]) for i, t in enumerate(trajectories)}
    out: dict[str, tuple[float | None, str]] = {}
    for n in names:
        if n not in diag_caps:
            out[n] = (None, "not available: the diagnostics do not name this capability")
            continue
        pairs = [(run.labels[i][n].label, diag[i][n].label) for run in runs for i in run.draws]
        k = cohen_kappa(pairs)
        out[n] = (k, f"LLM vs diagnostics over {len(pairs)} labels" if k is not None
                  else "undefined: both analysts gave one and the same label to every pair")
    return out


def build_outcomes(trajectories: list[Trajectory], candidates: list[Candidate], runs: list[LabelRun],
                   thresholds: Thresholds, *, with_kappa: bool) -> list[CapabilityOutcome]:
    """Statistics and decisions for every candidate, retained ones first (by mean gap)."""
    names = [c.name for c in candidates]
    kappas = _kappas(trajectories, runs, names) if with_kappa else {}
    outcomes = []
    for cand in candidates:
        c = cand.name
        per_run = [run_stats(((run.labels[i][c].label, trajectories[i].success) for i in run.draws), thresholds)
                   for run in runs]
        lacking: dict[int, int] = {}
        drawn: dict[int, int] = {}
        evidence: list[str] = []
        for run in runs:
            for i in sorted(set(run.draws)):
                if trajectories[i].success:
                    continue
                drawn[i] = drawn.get(i, 0) + 1
                pl = run.labels[i][c]
                if pl.label is Label.LACKING:
                    lacking[i] = lacking.get(i, 0) + 1
                    quote = f"[{trajectories[i].task_id}] {pl.evidence}"
                    if pl.evidence and quote not in evidence and len(evidence) < MAX_EVIDENCE_QUOTES:
                        evidence.append(quote)
        failed_ids = list(dict.fromkeys(trajectories[i].task_id for i in sorted(lacking)
                                        if lacking[i] * 2 > drawn[i]))
        outcome = CapabilityOutcome(cand, decide(per_run, thresholds), per_run, failed_ids, evidence)
        if c in kappas:
            outcome.kappa, outcome.kappa_note = kappas[c]
        outcomes.append(outcome)
    outcomes.sort(key=lambda o: (not o.decision.retained, -o.decision.passing_runs, -o.decision.gap_mean,
                                 o.candidate.name))
    return outcomes


def unexplained_failures(trajectories: list[Trajectory], runs: list[LabelRun], names: list[str],
                         *, max_ids: int = 20) -> dict[str, Any]:
    """How many failed trajectories none of `names` explains.

    Semantics:
        F       = failed trajectories drawn by at least one run
        D(i)    = the runs that drew i (a bootstrap run counts once, whatever its multiplicity)
        expl(i) = #{r in D(i) : exists c in names, label_r(i, c) = LACKING} * 2 > |D(i)|
        unexplained = #{i in F : not expl(i)}        share = unexplained / |F|   (0 when F is empty)

    A majority of the runs, as `failed_task_ids` uses, so an LLM analyst's independent runs vote;
    with diagnostics labels every run agrees. Returns {failed, unexplained, share, task_ids (the
    first `max_ids`, in trajectory order)}.
    """
    wanted = set(names)
    drawn: dict[int, int] = {}
    explained: dict[int, int] = {}
    for run in runs:
        for i in sorted(set(run.draws)):
            if trajectories[i].success:
                continue
            drawn[i] = drawn.get(i, 0) + 1
            if any(pl.label is Label.LACKING for c, pl in run.labels[i].items() if c in wanted):
                explained[i] = explained.get(i, 0) + 1
    missing = [i for i in sorted(drawn) if explained.get(i, 0) * 2 <= drawn[i]]
    return {"failed": len(drawn), "unexplained": len(missing),
            "share": len(missing) / len(drawn) if drawn else 0.0,
            "task_ids": [trajectories[i].task_id for i in missing[:max_ids]]}


def unexplained_summary(trajectories: list[Trajectory], runs: list[LabelRun],
                        outcomes: list[CapabilityOutcome]) -> dict[str, Any]:
    """unexplained_failures by the retained capabilities and by every candidate."""
    return {"retained": unexplained_failures(trajectories, runs, [o.candidate.name for o in outcomes
                                                                  if o.decision.retained]),
            "candidates": unexplained_failures(trajectories, runs, [o.candidate.name for o in outcomes])}
