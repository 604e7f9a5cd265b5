"""Group-relative advantages against hand-computed values (docs/design.md "GRPO")."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.grpo.advantages import group_advantages
from trace_common.errors import InvalidArgument

EPS = 1e-4
S3 = math.sqrt(1 / 3)  # sample std of (1, 0, 0, 1)
S2 = math.sqrt(0.5)    # sample std of (1, 0)


@pytest.mark.parametrize("rewards, scale, expected, informative", [
    # one group, sample std (n-1) as TRL: A = (r - 0.5) / (std + eps)
    ([[1, 0, 0, 1]], "group", [[0.5 / (S3 + EPS), -0.5 / (S3 + EPS), -0.5 / (S3 + EPS), 0.5 / (S3 + EPS)]], [True]),
    # a constant group: no signal, advantage 0, dropped
    ([[1, 1, 1, 1]], "group", [[0, 0, 0, 0]], [False]),
    ([[0, 0], [0.25, 0.75]], "group", [[0, 0], [-0.25 / (S2 / 2 + EPS), 0.25 / (S2 / 2 + EPS)]], [False, True]),
    # "none": centred only
    ([[1, 0, 0.5]], "none", [[0.5, -0.5, 0.0]], [True]),
    # "batch": one std over the informative groups' rewards only (the constant group is excluded)
    ([[1, 0], [0.5, 0.5]], "batch", [[0.5 / (S2 + EPS), -0.5 / (S2 + EPS)], [0, 0]], [True, False]),
    # partial credit: three reward levels
    ([[0, 0.5, 1]], "group", [[-0.5 / (0.5 + EPS), 0.0, 0.5 / (0.5 + EPS)]], [True]),
])
def test_advantages_match_hand_computed(rewards, scale, expected, informative):
    out = group_advantages(torch.tensor(rewards, dtype=torch.float32), scale, EPS)
    assert torch.allclose(out.advantages, torch.tensor(expected, dtype=torch.float32), atol=1e-5)
    assert out.informative.tolist() == informative
    assert out.informative_fraction == pytest.approx(sum(informative) / len(informative))


@pytest.mark.parametrize("rewards, scale, field", [
    ([1.0, 0.0], "group", "rewards"),          # not grouped
    ([[1.0]], "group", "rewards"),             # group of one
    ([[1.0, 0.0]], "global", "scale_rewards"),
])
def test_bad_input(rewards, scale, field):
    with pytest.raises(InvalidArgument, match=field):
        group_advantages(torch.tensor(rewards), scale)
