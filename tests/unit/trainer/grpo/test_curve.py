"""The training-curve PNG: written for full, partial and empty histories; the guided-rollout
signals (informative-group fraction, guided vs unguided reward) drawn per iteration."""

from __future__ import annotations

import math

import pytest

from services.trainer.grpo.curve import training_curve_figure, training_curve_png

FULL = [{"iteration": i, "reward_mean": 0.1 * i, "reward_std": 0.1, "pass_rate": 0.05 * i,
         "informative_group_fraction": 0.5, "guided_reward_mean": 0.2 * i, "unguided_reward_mean": 0.05 * i,
         "guided_episodes": 6.0, "guided_share": 0.25, "loss": 0.01, "kl": 0.001, "entropy": 2.0}
        for i in range(1, 6)]
#: an unguided run: no guided reward is ever reported
UNGUIDED = [{k: v for k, v in h.items() if k != "guided_reward_mean"} | {"guided_share": 0.0} for h in FULL]
#: an iteration without guided episodes (no instance had a hint): a gap, not a zero
GAP = [h if h["iteration"] != 3 else {k: v for k, v in h.items() if k != "guided_reward_mean"} for h in FULL]


@pytest.mark.parametrize("history", [FULL, UNGUIDED, GAP, [{"iteration": 1, "reward_mean": 0.0}], []])
def test_png(history, recwarn):
    data = training_curve_png(history, title="cap")
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert not [w for w in recwarn if "legend" in str(w.message)]


def _lines(history):
    fig = training_curve_figure(history)
    return {line.get_label(): list(line.get_ydata()) for ax in fig.axes for line in ax.get_lines()}


@pytest.mark.parametrize("history, label, expected", [
    (FULL, "informative-group fraction", [0.5] * 5),
    (FULL, "guided reward", [0.2 * i for i in range(1, 6)]),
    (FULL, "unguided reward", [0.05 * i for i in range(1, 6)]),
    (FULL, "guided share of episodes", [0.25] * 5),
    (GAP, "guided reward", [0.2, 0.4, math.nan, 0.8, 1.0]),
    (UNGUIDED, "guided reward", None),            # never reported: not drawn
    (UNGUIDED, "unguided reward", [0.05 * i for i in range(1, 6)]),
])
def test_guided_signals_are_plotted_per_iteration(history, label, expected):
    lines = _lines(history)
    if expected is None:
        assert label not in lines
        return
    assert lines[label] == pytest.approx(expected, nan_ok=True)
