import pytest

from trace_common.stats import (
    mcnemar_exact,
    mcnemar_min_detectable,
    paired_bootstrap_ci,
    paired_comparison,
    wilson_interval,
)


@pytest.mark.parametrize(("s", "n", "lo", "hi"), [
    (0, 0, 0.0, 1.0),
    (0, 10, 0.0, 0.2775),
    (10, 10, 0.7225, 1.0),
    (5, 10, 0.2366, 0.7634),
    (79, 200, 0.3295, 0.4643),
])
def test_wilson_matches_reference_values(s, n, lo, hi):
    got = wilson_interval(s, n)
    assert got == pytest.approx((lo, hi), abs=5e-4)


@pytest.mark.parametrize("n", [1, 3, 8, 24, 500, 600])
def test_wilson_bounds_are_exact_at_none_and_all(n):
    # never a hair beyond the rate: a report's error bar (rate - lower) must not be negative
    assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    lo, hi = wilson_interval(0, n)
    assert 0.0 - lo <= 0.0 and hi > 0.0


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


# -- paired comparisons (hand-computed) ------------------------------------------------------------
@pytest.mark.parametrize(("b", "c", "p"), [
    (0, 0, 1.0),                      # no discordant pair: no evidence either way
    (0, 5, 2 / 32),                   # all discordant one way, n=5: 2 * (1/2)^5
    (6, 0, 2 / 64),                   # ... n=6 (symmetric in b, c)
    (1, 9, 2 * (1 + 10) / 1024),      # 2 * P(X <= 1), X ~ Bin(10, 1/2)
    (3, 7, 2 * (1 + 10 + 45 + 120) / 1024),
    (5, 5, 1.0),                      # the doubled tail exceeds 1: capped
    (0, 1, 1.0),                      # a single discordant pair: 2 * 1/2
])
def test_mcnemar_exact_matches_hand_computed_binomial_tails(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(c, b) == pytest.approx(p, rel=1e-12)


def test_mcnemar_exact_stays_finite_for_large_counts():
    # 2^2000 overflows a float: the exact rational tail must not
    assert 0.0 <= mcnemar_exact(900, 1100) < 1e-5 and mcnemar_exact(1000, 1000) == 1.0


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def _pairs(both: int, only_x: int, only_y: int, neither: int) -> tuple[list[bool], list[bool]]:
    x = [True] * both + [True] * only_x + [False] * only_y + [False] * neither
    y = [True] * both + [False] * only_x + [True] * only_y + [False] * neither
    return x, y


@pytest.mark.parametrize(("cells", "ci", "tol"), [
    ((30, 0, 0, 70), (0.0, 0.0), 0.0),          # no discordant pairs: every resample's difference is 0
    ((0, 40, 0, 0), (1.0, 1.0), 0.0),           # all discordant one way: every resample's difference is 1
    # normal approximation: diff 0.05, se = sqrt(((b+c)/n - diff^2) / n) = 0.01568 -> 0.05 -+ 0.0307
    ((200, 60, 30, 310), (0.0193, 0.0807), 0.004),
])
def test_paired_bootstrap_interval(cells, ci, tol):
    x, y = _pairs(*cells)
    lo, hi = paired_bootstrap_ci(x, y, samples=20_000, seed=3)
    assert lo == pytest.approx(ci[0], abs=tol) and hi == pytest.approx(ci[1], abs=tol)
    assert lo <= (cells[1] - cells[2]) / len(x) <= hi
    assert paired_bootstrap_ci(x, y, samples=20_000, seed=3) == (lo, hi)   # seeded: reproducible


def test_paired_bootstrap_one_way_with_concordant_pairs_is_not_degenerate():
    x, y = _pairs(0, 0, 25, 5)
    lo, hi = paired_bootstrap_ci(x, y, samples=5000, seed=0)
    assert -1.0 <= lo < -25 / 30 < hi <= -0.6


@pytest.mark.parametrize(("cells", "expected"), [
    ((200, 60, 30, 310), {"n": 600, "diff": 0.05, "only_x": 60, "only_y": 30, "both": 200, "neither": 310}),
    ((10, 0, 0, 0), {"n": 10, "diff": 0.0, "p_value": 1.0, "ci": [0.0, 0.0], "pass_rate_x": 1.0}),
    ((0, 0, 6, 0), {"n": 6, "diff": -1.0, "p_value": 2 / 64, "pass_rate_y": 1.0, "ci": [-1.0, -1.0]}),
])
def test_paired_comparison_record(cells, expected):
    out = paired_comparison(*_pairs(*cells), samples=2000, seed=0)
    for k, v in expected.items():
        assert out[k] == pytest.approx(v), k


def test_paired_comparison_refuses_unpaired_outcomes():
    with pytest.raises(ValueError, match="same tasks"):
        paired_comparison([True, False], [True])


@pytest.mark.parametrize(("n", "q", "mdd"), [
    (10, 0.6, 0.6),      # D=6: only 0-vs-6 (p=2/64) is significant; 1-vs-5 gives p=14/64
    (10, 0.5, None),     # D=5: even 0-vs-5 gives p=2/32 > 0.05
    (20, 0.5, 0.4),      # D=10: 1-vs-9 gives p=22/1024 < 0.05; 2-vs-8 gives 112/1024 > 0.05 -> k=8
    (100, 0.0, None),    # no discordant pairs: nothing is detectable
])
def test_min_detectable_difference_hand_computed(n, q, mdd):
    assert mcnemar_min_detectable(n, q) == (pytest.approx(mdd) if mdd is not None else None)


def test_min_detectable_difference_shrinks_with_the_test_size():
    at = {n: mcnemar_min_detectable(n, 0.2) for n in (100, 300, 600)}
    assert at[100] > at[300] > at[600] and at[600] < 0.08   # 600 tasks resolve the paper's ~8 points


@pytest.mark.parametrize(("counts", "trials", "k", "expected"), [
    ([4, 4], 4, 4, 1.0),                       # every trial of every task passed
    ([2, 0], 4, 1, 0.25),                      # pass^1 is the plain pass rate: 2 of 8
    ([2, 0], 4, 2, (1 / 6) / 2),               # C(2,2)/C(4,2) = 1/6 for the first task, 0 for the second
    ([3], 4, 3, 0.25),                         # C(3,3)/C(4,3)
    ([], 3, 1, 0.0),
])
def test_pass_hat_k_is_taus_estimator(counts, trials, k, expected):
    from trace_common.stats import pass_hat_k

    assert pass_hat_k(counts, trials, k) == pytest.approx(expected)


@pytest.mark.parametrize(("counts", "trials", "k"), [([1], 2, 3), ([1], 2, 0), ([3], 2, 1)])
def test_pass_hat_k_refuses_impossible_inputs(counts, trials, k):
    from trace_common.stats import pass_hat_k

    with pytest.raises(ValueError):
        pass_hat_k(counts, trials, k)


@pytest.mark.parametrize(("x", "y", "diff", "only", "p_low", "p_high"), [
    ([2] * 30, [2] * 30, 0.0, (0, 0), 1.0, 1.0),                     # identical arms: no evidence
    ([4] * 20 + [0] * 20, [0] * 20 + [4] * 20, 0.0, (20, 20), 0.9, 1.0),   # opposite on different tasks
    ([3] * 30, [1] * 30, 0.5, (30, 0), 0.0, 0.001),                  # better on every task
    ([1, 0] * 10, [0, 0] * 10, 0.125, (10, 0), 0.0, 0.01),           # better on half the tasks, tied elsewhere
    ([1] + [0] * 39, [0] * 40, 0.00625, (1, 0), 0.5, 1.0),           # one task: not significant
])
def test_paired_trials_comparison(x, y, diff, only, p_low, p_high):
    from trace_common.stats import paired_trials_comparison

    out = paired_trials_comparison(x, y, 4, samples=2000, seed=0)
    assert out["diff"] == pytest.approx(diff) and (out["only_x"], out["only_y"]) == only
    assert p_low <= out["p_value"] <= p_high
    assert out["ci"][0] <= out["diff"] + 1e-12 and out["diff"] - 1e-12 <= out["ci"][1]
    assert out == paired_trials_comparison(x, y, 4, samples=2000, seed=0)   # seeded


def test_paired_trials_comparison_refuses_unpaired_or_impossible_counts():
    from trace_common.stats import paired_trials_comparison

    with pytest.raises(ValueError, match="same tasks"):
        paired_trials_comparison([1, 2], [1], 2)
    with pytest.raises(ValueError, match="within"):
        paired_trials_comparison([3], [1], 2)


@pytest.mark.parametrize(("n", "sd", "mdd"), [
    (40, 0.5, 0.2215),     # (1.95996 + 0.84162) * 0.5 / sqrt(40)
    (160, 0.5, 0.1108),    # four times the tasks: half the difference
    (40, 0.0, 0.0),
])
def test_paired_min_detectable(n, sd, mdd):
    from trace_common.stats import paired_min_detectable

    assert paired_min_detectable(n, sd) == pytest.approx(mdd, abs=5e-4)


def test_task_mean_interval_resamples_tasks():
    from trace_common.stats import task_mean_interval

    lo, hi = task_mean_interval([4] * 20 + [0] * 20, 4, samples=4000)
    assert lo < 0.5 < hi and hi - lo > 0.25          # 40 tasks, half all-pass: wide; not 160 independent trials
    assert task_mean_interval([2] * 10, 4) == (0.5, 0.5)
