"""The training-curve PNG: written for full, partial and empty histories."""

from __future__ import annotations

import pytest

from services.trainer.grpo.curve import training_curve_png

FULL = [{"iteration": i, "reward_mean": 0.1 * i, "reward_std": 0.1, "pass_rate": 0.05 * i,
         "informative_group_fraction": 0.5, "loss": 0.01, "kl": 0.001, "entropy": 2.0} for i in range(1, 6)]


@pytest.mark.parametrize("history", [FULL, [{"iteration": 1, "reward_mean": 0.0}], []])
def test_png(history, recwarn):
    data = training_curve_png(history, title="cap")
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert not [w for w in recwarn if "legend" in str(w.message)]
