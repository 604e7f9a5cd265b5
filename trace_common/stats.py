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


# -- several trials per task (tau2's pass^k convention) ----------------------------------------
def pass_hat_k(successes: Sequence[int], trials: int, k: int) -> float:
    """tau2-bench's pass^k: the chance that k trials of a task, drawn without replacement from
    its `trials`, all succeed, averaged over tasks (k = 1 is the plain pass rate).

    Semantics:
        pass^k = mean_i  C(c_i, k) / C(n, k)        c_i = successes of task i out of n = trials, 1 <= k <= n
    """
    if not 1 <= k <= trials:
        raise ValueError(f"k={k} must be in [1, trials={trials}]")
    if any(not 0 <= c <= trials for c in successes):
        raise ValueError(f"every task's successes must be within [0, trials={trials}]")
    if not successes:
        return 0.0
    return sum(math.comb(c, k) for c in successes) / (len(successes) * math.comb(trials, k))


def paired_trials_comparison(x: Sequence[int], y: Sequence[int], trials: int, *, samples: int = 10_000,
                             seed: int = 0, level: float = 0.95) -> dict[str, float | int | list[float]]:
    """x vs y on the same n tasks, each played `trials` times by both: the difference of mean
    success, a paired bootstrap interval over tasks and a sign-flip permutation p-value. The task,
    not the trial, is the unit: trials of one task are not independent evidence (the same task is
    hard for both), so resampling and flipping are per task.

    Semantics:
        d_i = (x_i - y_i) / trials                           per task i of n (x_i, y_i successes)
        diff = mean(d)
        ci:  repeat `samples`: draw n tasks with replacement; diff* = mean of their d
             -> quantiles (1-level)/2 and (1+level)/2 of diff*          (numpy's linear quantile)
        p:   H0: within each task the two arms are exchangeable, so d_i's sign is +/- at random
             repeat `samples`: s_i ~ uniform{-1, +1}; T* = |mean(s_i d_i)|
             p = (1 + #{T* >= |diff| - 1e-12}) / (1 + samples)       (Monte Carlo, never 0)
        only_x / only_y: tasks where x / y succeeded more often (McNemar's discordant pairs at trials = 1)
    Seeded: the same inputs and seed give the same numbers. trials = 1 gives McNemar's counts, but its
    p comes from the sign-flip test, not the exact binomial (use `paired_comparison` there).
    """
    if len(x) != len(y):
        raise ValueError(f"paired outcomes need the same tasks: {len(x)} vs {len(y)} tasks")
    if trials < 1 or any(not 0 <= v <= trials for v in (*x, *y)):
        raise ValueError(f"successes per task must be within [0, trials={trials}]")
    n = len(x)
    if n == 0:
        return {"n": 0, "trials": trials, "pass_rate_x": 0.0, "pass_rate_y": 0.0, "diff": 0.0, "only_x": 0,
                "only_y": 0, "p_value": 1.0, "ci": [0.0, 0.0], "test": "sign-flip permutation over tasks"}
    d = (np.asarray(x, dtype=float) - np.asarray(y, dtype=float)) / trials            # [n]
    rng = np.random.Generator(np.random.PCG64(seed))
    boot = d[rng.integers(0, n, size=(samples, n))].mean(axis=1)                        # [S]
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    signs = rng.choice(np.array([-1.0, 1.0]), size=(samples, n))                        # [S, n]
    flipped = np.abs((signs * d).mean(axis=1))                                          # [S]
    observed = abs(float(d.mean()))
    p = (1 + int((flipped >= observed - 1e-12).sum())) / (1 + samples)
    return {"n": n, "trials": trials, "pass_rate_x": float(np.mean(x)) / trials,
            "pass_rate_y": float(np.mean(y)) / trials, "diff": float(d.mean()),
            "only_x": int((d > 0).sum()), "only_y": int((d < 0).sum()), "p_value": min(1.0, p),
            "ci": [float(lo), float(hi)], "test": "sign-flip permutation over tasks"}


def paired_min_detectable(n: int, sd: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The mean per-task difference a paired test on n tasks detects with probability `power`
    (two-sided, level alpha), when the per-task differences have standard deviation `sd`.

    Semantics (normal approximation to the paired test):
        mdd = (z_{1-alpha/2} + z_{power}) * sd / sqrt(n)
    With trials, sd^2 = sd_task^2 + (v_x + v_y) / trials: more trials shrink only the trial noise,
    more tasks shrink both.
    """
    from statistics import NormalDist

    if n <= 0:
        raise ValueError(f"n={n} must be >= 1")
    if sd < 0 or not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"need sd >= 0, 0 < alpha < 1 and 0 < power < 1 (got {sd}, {alpha}, {power})")
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd / math.sqrt(n)


def task_mean_interval(successes: Sequence[int], trials: int, *, samples: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean success over tasks played `trials` times each,
    resampling tasks (a Wilson interval over all n x trials episodes would treat the trials of one
    task as independent and come out too narrow).

    Semantics:
        r_i = c_i / trials; repeat `samples`: draw n tasks with replacement, mean of their r
        -> quantiles (1-level)/2 and (1+level)/2 (numpy's linear quantile); (0, 1) when n == 0
    """
    n = len(successes)
    if n == 0:
        return 0.0, 1.0
    r = np.asarray(successes, dtype=float) / trials
    rng = np.random.Generator(np.random.PCG64(seed))
    boot = r[rng.integers(0, n, size=(samples, n))].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
