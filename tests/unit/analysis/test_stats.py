"""Contrastive statistics against tables computed by hand (docs/design.md "Analysis statistics")."""

import pytest

from services.analysis.stats import Label, RunStats, Thresholds, cohen_kappa, decide, run_stats

L, P, NA = Label.LACKING, Label.PRESENT, Label.NA
TH = Thresholds()


def pairs(failed, passed):
    return [(lb, False) for lb in failed] + [(lb, True) for lb in passed]


# failed labels, passed labels -> |F|, |P|, n_lf, n_pf, n_lp, n_pp, Cov, ER-, ER+, Delta, passes
CASES = {
    "mixed": ([L, L, P, NA], [L, P, P, P, NA, NA], 4, 6, 2, 1, 1, 3, 0.5, 2 / 3, 0.25, 2 / 3 - 0.25, True),
    "no passed trajectories": ([L, P, NA], [], 3, 0, 1, 1, 0, 0, 1 / 3, 0.5, 0.0, 0.5, True),
    "all NA": ([NA, NA], [NA], 2, 1, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, False),
    "ER- denominator 0": ([NA, NA], [L, P], 2, 2, 0, 0, 1, 1, 0.0, 0.0, 0.5, -0.5, False),
    "no failed trajectories": ([], [P, L], 0, 2, 0, 0, 1, 1, 0.0, 0.0, 0.5, -0.5, False),
    "lacking everywhere": ([L, L], [L], 2, 1, 2, 0, 1, 0, 1.0, 1.0, 1.0, 0.0, False),
    # Cov exactly rho and Delta exactly delta (1.0 - 0.8 is 0.19999999999999996 in floats): passes.
    "on both thresholds": ([L] + [NA] * 9, [L] * 4 + [P], 10, 5, 1, 0, 4, 1, 0.1, 1.0, 0.8, 0.2, True),
    "coverage just below": ([L] + [NA] * 10, [P], 11, 1, 1, 0, 0, 1, 1 / 11, 1.0, 0.0, 1.0, False),
    "gap just below": ([L, P], [L] * 31 + [P] * 69, 2, 100, 1, 1, 31, 69, 0.5, 0.5, 0.31, 0.19, False),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_run_stats_hand_table(case):
    failed, passed, n_f, n_p, n_lf, n_pf, n_lp, n_pp, cov, er_m, er_p, gap, ok = case
    s = run_stats(pairs(failed, passed), TH)
    assert (s.n_f, s.n_p, s.n_lf, s.n_pf, s.n_lp, s.n_pp) == (n_f, n_p, n_lf, n_pf, n_lp, n_pp)
    assert s.coverage == pytest.approx(cov)
    assert s.er_minus == pytest.approx(er_m)
    assert s.er_plus == pytest.approx(er_p)
    assert s.gap == pytest.approx(gap)
    assert s.passed is ok


def test_gap_threshold_is_configurable():
    # Delta = 1/2 - 1/34 ~ 0.47: passes at the default delta = 0.2, not at delta = 0.5.
    assert run_stats(pairs([L, P], [L] + [P] * 33), TH).passed
    s = run_stats(pairs([L, P], [L] + [P] * 33), Thresholds(min_gap=0.5))
    assert s.gap == pytest.approx(0.5 - 1 / 34) and not s.passed


def _run(cov: float, gap: float, th: Thresholds = TH) -> RunStats:
    return RunStats(n_f=10, n_p=10, n_lf=0, n_pf=0, n_lp=0, n_pp=0, coverage=cov, er_minus=gap, er_plus=0.0,
                    gap=gap, passed=cov >= th.min_coverage and gap >= th.min_gap)


@pytest.mark.parametrize(("runs", "passing", "retained", "reason"), [
    ([_run(0.5, 0.5)] * 10, 10, True, ""),
    ([_run(0.5, 0.5)] * 8 + [_run(0.05, 0.5)] * 2, 8, True, ""),             # exactly K of N
    ([_run(0.5, 0.5)] * 7 + [_run(0.5, 0.1)] * 3, 7, False, "consistency"),  # means pass, K not reached
    ([_run(0.05, 0.9)] * 10, 0, False, "coverage"),
    ([_run(0.5, 0.0)] * 10, 0, False, "gap"),
    ([_run(0.05, 0.0)] * 10, 0, False, "coverage"),                        # coverage is named first
])
def test_decide_k_of_n(runs, passing, retained, reason):
    d = decide(runs, TH)
    assert (d.passing_runs, d.retained, d.rejection_reason) == (passing, retained, reason)


def test_decide_mean_and_population_std():
    runs = [_run(0.2, 0.4), _run(0.4, 0.8)] * 5
    d = decide(runs, TH)
    assert d.coverage_mean == pytest.approx(0.3) and d.coverage_std == pytest.approx(0.1)
    assert d.gap_mean == pytest.approx(0.6) and d.gap_std == pytest.approx(0.2)


def test_decide_refuses_partial_runs():
    with pytest.raises(ValueError, match="every run must finish"):
        decide([_run(0.5, 0.5)] * 9, TH)


@pytest.mark.parametrize(("a", "b", "kappa"), [
    ([L, L, P, P, NA, NA], [L, P, P, P, NA, L], 0.5),   # p_o = 2/3, p_e = 1/3
    ([L, P, NA], [L, P, NA], 1.0),
    ([L, P], [P, L], -1.0),                             # p_o = 0, p_e = 1/2
    ([L, L, L], [L, L, L], None),                       # p_e = 1: undefined
    ([], [], None),
])
def test_cohen_kappa(a, b, kappa):
    got = cohen_kappa(zip(a, b, strict=True))
    assert got == (pytest.approx(kappa) if kappa is not None else None)
