"""Small statistics shared by reports: pass rates with confidence intervals, and paired
comparisons of two methods played on the same tasks.

docs/design.md "Evaluation": comparisons are paired (every arm plays the same held-out tasks), so a
difference between two arms is judged on the tasks where they disagree -- exact McNemar on the
discordant pairs, and a paired bootstrap interval of the pass-rate difference -- and the report
states the smallest difference the test size can resolve (`mcnemar_min_detectable`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion (well-behaved at 0 and n).

    Semantics:
        p = s/n; d = 1 + z²/n
        centre = (p + z²/2n) / d ; half = z·sqrt(p(1-p)/n + z²/4n²) / d
        -> (max(0, centre-half), min(1, centre+half)); (0, 1) when n == 0
    At s = 0 the lower bound is exactly 0 and at s = n the upper bound exactly 1 (in floating point
    centre - half lands ~1e-17 above 0, and a plot's error bar below the rate turns negative).
    """
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must be within [0, n={n}]")
    p = successes / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts.

    b = tasks only the first method passed, c = tasks only the second passed (the concordant
    tasks carry no information about which is better). Under H0 (equal pass rates) each
    discordant task goes either way with probability 1/2.

    Semantics:
        n = b + c
        p = 1                                             if n == 0
        p = min(1, 2 · Σ_{i=0}^{min(b,c)} C(n, i) / 2^n)    otherwise   (binomial, doubled tail)
    Exact rational arithmetic, so large n neither underflows nor overflows.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def paired_counts(x: Sequence[bool], y: Sequence[bool]) -> tuple[int, int, int, int]:
    """(both passed, only x, only y, neither) over paired outcomes of the same tasks."""
    if len(x) != len(y):
        raise ValueError(f"paired outcomes need the same tasks: {len(x)} vs {len(y)} outcomes")
    both = sum(1 for a, b in zip(x, y, strict=True) if a and b)
    only_x = sum(1 for a, b in zip(x, y, strict=True) if a and not b)
    only_y = sum(1 for a, b in zip(x, y, strict=True) if b and not a)
    return both, only_x, only_y, len(x) - both - only_x - only_y


def paired_bootstrap_ci(x: Sequence[bool], y: Sequence[bool], *, samples: int = 10_000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of pass_rate(x) - pass_rate(y), resampling whole tasks (pairs).

    Semantics:
        d_i = x_i - y_i ∈ {-1, 0, +1}                       per task i of n
        repeat `samples` times: draw n tasks with replacement; diff* = mean of their d
        -> (quantile_{(1-level)/2}(diff*), quantile_{(1+level)/2}(diff*))   (numpy's linear quantile)
    Drawing n tasks with replacement only matters through how many of each kind (+1, -1, 0) are
    drawn, so each resample is one multinomial draw with the observed kind frequencies (the
    same distribution as index resampling, at O(1) per resample). Seeded: the same inputs and
    seed give the same interval. n == 0 gives (0, 0).
    """
    if not 0 < level < 1:
        raise ValueError(f"level={level} must be in (0, 1), e.g. 0.95")
    if samples < 1:
        raise ValueError(f"samples={samples} must be >= 1")
    _, only_x, only_y, _ = paired_counts(x, y)
    n = len(x)
    if n == 0:
        return 0.0, 0.0
    rng = np.random.Generator(np.random.PCG64(seed))
    draws = rng.multinomial(n, [only_x / n, only_y / n, (n - only_x - only_y) / n], size=samples)  # [S, 3]
    diffs = (draws[:, 0] - draws[:, 1]) / n                                                      # [S]
    lo, hi = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired_comparison(x: Sequence[bool], y: Sequence[bool], *, samples: int = 10_000,
                      seed: int = 0) -> dict[str, float | int | list[float]]:
    """Everything the report shows for "x vs y" on the same n tasks: pass rates, their difference,
    the discordant counts, the exact McNemar p-value and the paired bootstrap 95 % interval."""
    both, only_x, only_y, neither = paired_counts(x, y)
    n = len(x)
    return {"n": n, "pass_rate_x": (both + only_x) / n if n else 0.0, "pass_rate_y": (both + only_y) / n if n else 0.0,
            "diff": (only_x - only_y) / n if n else 0.0, "both": both, "only_x": only_x, "only_y": only_y,
            "neither": neither, "p_value": mcnemar_exact(only_x, only_y),
            "ci": list(paired_bootstrap_ci(x, y, samples=samples, seed=seed))}


def mcnemar_min_detectable(n: int, discordant_fraction: float, alpha: float = 0.05) -> float | None:
    """The smallest pass-rate difference that exact McNemar calls significant (p < alpha) on n
    paired tasks of which a fraction `discordant_fraction` is discordant; None when even all
    discordant pairs going one way would not be (too few discordant pairs).

    Semantics:
        D = round(discordant_fraction · n)                  discordant pairs
        k = min { k ∈ [0, D], k ≡ D (mod 2) : mcnemar_exact((D-k)/2, (D+k)/2) < alpha }
        -> k / n          (the difference |b - c| / n at the boundary); None if no such k
    """
    if n <= 0:
        raise ValueError(f"n={n} must be >= 1")
    if not 0 <= discordant_fraction <= 1:
        raise ValueError(f"discordant_fraction={discordant_fraction} must be in [0, 1]")
    d = round(discordant_fraction * n)
    for k in range(d % 2, d + 1, 2):
        if mcnemar_exact((d - k) // 2, (d + k) // 2) < alpha:
            return k / n
    return None
