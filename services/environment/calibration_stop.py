"""When a calibration stops before all its groups: the sequential rule (issue 31, item 2).

A level is judged over K groups of n episodes each (calibration.py):

    passed = lo <= F <= hi  and  I / K >= min_informative

with F the mean reward over all K*n episodes (the mean of the K group means, all groups being
the same size) and I the number of informative groups. Calibration plays the groups in waves
and, after each wave, asks this rule whether the k groups played so far already settle the
verdict; the K - k unplayed groups are then never played (and never counted).

Semantics (k played groups with means g_1..g_k, S = sum g_i, I_k of them informative):
    exact:
        upper = (S + (K - k)) / K          # every unplayed group averages 1
        lower = S / K                      # every unplayed group averages 0
        stop "too hard"        if upper < lo
        stop "too easy"        if lower > hi
        stop "too uniform"     if (I_k + (K - k)) / K < min_informative   # every unplayed group informative
    predictive (the default) = exact, and once k >= min_groups:
        m, s  = mean, sample std of g_1..g_k
        half  = t(0.95, k - 1) * s * sqrt(1/k + 1/(K - k))   # one-sided 95 % prediction bound of the
                                                              # mean of the K - k unplayed group means
        F_hi  = min(upper, (k*m + (K - k)*(m + half)) / K);   stop "too hard" if F_hi < lo
        F_lo  = max(lower, (k*m + (K - k)*(m - half)) / K);   stop "too easy" if F_lo > hi
    none: never stops.

`exact` never rejects a level that all K groups would accept. `predictive` assumes the group
means are i.i.d. and roughly normal (each seed is drawn independently from the split), and
rejects a level whose full calibration would have landed in the band with probability at most
about 5 % under that assumption; it is what abandons a clearly hopeless level after its first
groups (e.g. 4 groups of 8 episodes with mean 0.05 and group std 0.05 give F_hi = 0.09 < 0.2),
where the exact bound alone waits until the band is out of arithmetic reach.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

StopRule = Literal["none", "exact", "predictive"]

#: One-sided 95 % quantiles of Student's t, by degrees of freedom 1..30 (beyond: the df-30 value,
#: which is above every later one, so the bound stays conservative).
T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
       1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t95(df: int) -> float:
    return T95[min(max(df, 1), len(T95)) - 1]


@dataclass(frozen=True)
class StopDecision:
    verdict: Literal["too hard", "too easy", "too uniform"]
    bound: float          # the bound that left the band (F_hi, F_lo, or the reachable informative fraction)
    rule: str             # "exact" or "predictive": which bound decided

    def reason(self, played: int, total: int, band: tuple[float, float], min_informative: float) -> str:
        if self.verdict == "too uniform":
            return (f"stopped after {played} of {total} groups: at most {self.bound:.0%} of the groups could be "
                    f"informative (need {min_informative:.0%}; {self.rule} bound)")
        side = f"below {band[0]:.2f}" if self.verdict == "too hard" else f"above {band[1]:.2f}"
        what = "upper" if self.verdict == "too hard" else "lower"
        return (f"stopped after {played} of {total} groups: the {self.rule} {what} bound of the final mean reward, "
                f"{self.bound:.3f}, is {side}")


def decide(group_means: Sequence[float], informative: int, total: int, band: tuple[float, float],
           min_informative: float, *, rule: StopRule = "predictive", min_groups: int = 4) -> StopDecision | None:
    """The rule's decision after `len(group_means)` of `total` groups (module docstring); None: play on."""
    k = len(group_means)
    left = total - k
    if rule == "none" or k == 0 or left <= 0:
        return None
    lo, hi = band
    s_sum = math.fsum(group_means)
    upper, lower = (s_sum + left) / total, s_sum / total
    reachable = (informative + left) / total
    if reachable < min_informative - 1e-12:
        return StopDecision("too uniform", reachable, "exact")
    if upper < lo:
        return StopDecision("too hard", upper, "exact")
    if lower > hi:
        return StopDecision("too easy", lower, "exact")
    if rule != "predictive" or k < max(2, min_groups):
        return None
    m, s = statistics.fmean(group_means), statistics.stdev(group_means)
    half = t95(k - 1) * s * math.sqrt(1.0 / k + 1.0 / left)
    f_hi = min(upper, (k * m + left * (m + half)) / total)
    f_lo = max(lower, (k * m + left * (m - half)) / total)
    if f_hi < lo:
        return StopDecision("too hard", f_hi, "predictive")
    if f_lo > hi:
        return StopDecision("too easy", f_lo, "predictive")
    return None
