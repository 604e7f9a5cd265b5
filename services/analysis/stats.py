"""Contrastive capability statistics (docs/design.md, "Analysis statistics").

Everything here is pure arithmetic on labels, so the same code serves both analyst modes
(LLM labels and diagnostics-derived labels) and the tests can check it against tables
computed by hand.

Per labeling run and capability c, over the failed (F) and passed (P) trajectories of that
run (a bootstrap resample counts a trajectory once per draw):

Semantics:
    n_lf = #{t in F : label(t, c) = LACKING}     n_pf = #{t in F : label(t, c) = PRESENT}
    n_lp = #{t in P : label(t, c) = LACKING}     n_pp = #{t in P : label(t, c) = PRESENT}
    (NA labels count in neither numerator nor denominator of the error rates)
    Cov  = n_lf / |F|                       (0 when |F| = 0)
    ER-  = n_lf / (n_lf + n_pf)             (0 when n_lf + n_pf = 0)
    ER+  = n_lp / (n_lp + n_pp)             (0 when n_lp + n_pp = 0)
    Delta = ER- - ER+
    pass(run, c) = Cov >= rho and Delta >= delta      (compared with 1e-9 slack for rounding)
    retained(c)  = #{runs r : pass(r, c)} >= K

A rejected capability gets one reason: "coverage" when its mean Cov is below rho, else "gap"
when its mean Delta is below delta, else "consistency" (it passes on average but in fewer
than K runs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum

#: Comparison slack: 1.0 - 0.8 is 0.19999999999999996 in floating point, and a run whose gap is
#: exactly delta on paper must pass.
EPS = 1e-9


class Label(StrEnum):
    """What an analyst says about one (trajectory, capability) pair."""

    NA = "NA"            # the trajectory gives no occasion to use the capability
    PRESENT = "PRESENT"  # the capability was needed and the agent showed it
    LACKING = "LACKING"  # the capability was needed and the agent did not show it


@dataclass(frozen=True)
class Thresholds:
    """rho, delta, K and N of the retention rule (defaults: docs/design.md, "Analysis statistics")."""

    min_coverage: float = 0.10   # rho
    min_gap: float = 0.20        # delta
    min_passing_runs: int = 8    # K
    num_runs: int = 10           # N


@dataclass(frozen=True)
class RunStats:
    """One capability in one labeling run."""

    n_f: int        # |F| in this run
    n_p: int        # |P| in this run
    n_lf: int
    n_pf: int
    n_lp: int
    n_pp: int
    coverage: float
    er_minus: float
    er_plus: float
    gap: float
    passed: bool

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def run_stats(labels: Iterable[tuple[Label, bool]], thresholds: Thresholds) -> RunStats:
    """Statistics of one capability in one run from (label, success) pairs, one per trajectory
    draw (a trajectory drawn twice by a bootstrap resample appears twice)."""
    n_f = n_p = n_lf = n_pf = n_lp = n_pp = 0
    for label, success in labels:
        label = Label(label)
        if success:
            n_p += 1
            n_lp += label is Label.LACKING
            n_pp += label is Label.PRESENT
        else:
            n_f += 1
            n_lf += label is Label.LACKING
            n_pf += label is Label.PRESENT
    cov = _ratio(n_lf, n_f)
    er_minus = _ratio(n_lf, n_lf + n_pf)
    er_plus = _ratio(n_lp, n_lp + n_pp)
    gap = er_minus - er_plus
    passed = cov >= thresholds.min_coverage - EPS and gap >= thresholds.min_gap - EPS
    return RunStats(n_f=n_f, n_p=n_p, n_lf=n_lf, n_pf=n_pf, n_lp=n_lp, n_pp=n_pp, coverage=cov,
                    er_minus=er_minus, er_plus=er_plus, gap=gap, passed=passed)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (the N runs are the whole population)."""
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


@dataclass(frozen=True)
class Decision:
    """One capability over all runs."""

    passing_runs: int
    retained: bool
    rejection_reason: str   # "" when retained; else "coverage" | "gap" | "consistency"
    coverage_mean: float
    coverage_std: float
    gap_mean: float
    gap_std: float
    er_minus_mean: float
    er_plus_mean: float
    lacking_rate_failed: float   # mean over runs of n_lf / |F|  (= coverage_mean)
    lacking_rate_passed: float   # mean over runs of n_lp / |P|

    def to_dict(self) -> dict:
        return asdict(self)


def decide(runs: Sequence[RunStats], thresholds: Thresholds) -> Decision:
    """Apply the K-of-N retention rule to one capability's per-run statistics."""
    if len(runs) != thresholds.num_runs:
        # A partial set of runs must never be reported as a complete decision.
        raise ValueError(f"decide() got {len(runs)} runs but N = {thresholds.num_runs}: every run must "
                         "finish before a capability is decided")
    passing = sum(r.passed for r in runs)
    cov_mean, cov_std = _mean_std([r.coverage for r in runs])
    gap_mean, gap_std = _mean_std([r.gap for r in runs])
    er_m, _ = _mean_std([r.er_minus for r in runs])
    er_p, _ = _mean_std([r.er_plus for r in runs])
    lp, _ = _mean_std([_ratio(r.n_lp, r.n_p) for r in runs])
    retained = passing >= thresholds.min_passing_runs
    if retained:
        reason = ""
    elif cov_mean < thresholds.min_coverage:
        reason = "coverage"
    elif gap_mean < thresholds.min_gap:
        reason = "gap"
    else:
        reason = "consistency"
    return Decision(passing_runs=passing, retained=retained, rejection_reason=reason,
                    coverage_mean=cov_mean, coverage_std=cov_std, gap_mean=gap_mean, gap_std=gap_std,
                    er_minus_mean=er_m, er_plus_mean=er_p, lacking_rate_failed=cov_mean,
                    lacking_rate_passed=lp)


def cohen_kappa(pairs: Iterable[tuple[Label, Label]]) -> float | None:
    """Cohen's kappa of two raters over the three labels; None when undefined.

    Semantics:
        p_o = fraction of pairs where both raters agree
        p_e = sum over labels l of  P(rater1 = l) * P(rater2 = l)
        kappa = (p_o - p_e) / (1 - p_e)
    Undefined (None) with no pairs, or when p_e = 1 (both raters used one and the same label
    for everything: agreement cannot be told apart from chance).
    """
    items = [(Label(a), Label(b)) for a, b in pairs]
    n = len(items)
    if n == 0:
        return None
    p_o = sum(a is b for a, b in items) / n
    p_e = 0.0
    for label in Label:
        p_e += (sum(a is label for a, _ in items) / n) * (sum(b is label for _, b in items) / n)
    if math.isclose(p_e, 1.0):
        return None
    return (p_o - p_e) / (1.0 - p_e)
