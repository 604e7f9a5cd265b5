"""Group-relative advantages (docs/design.md "GRPO") and the informative-group rule.

Semantics (rewards r of shape [n_groups, G], one row per environment instance):
    mean_g = mean(r[g, :])
    informative[g] = max(r[g]) - min(r[g]) > tol        # constant groups carry no signal
    scale_rewards = "group": s_g = std(r[g, :])           (sample std, n-1 denominator, as TRL)
                    "batch": s_g = std(r[informative rows, :].flatten()) for every g
                    "none":  s_g = 1 - eps (so the division is by exactly 1)
    A[g, i] = (r[g, i] - mean_g) / (s_g + eps)
Constant groups get A = 0 and are dropped by the caller; "batch" statistics use only the
informative groups that are trained on (dropped groups must not change the scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_common.errors import InvalidArgument


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor  # [n_groups, G]
    informative: torch.Tensor  # [n_groups] bool
    group_mean: torch.Tensor  # [n_groups]
    group_std: torch.Tensor  # [n_groups]

    @property
    def informative_fraction(self) -> float:
        n = self.informative.numel()
        return float(self.informative.float().mean()) if n else 0.0


def group_advantages(rewards: torch.Tensor, scale_rewards: str = "group", eps: float = 1e-4,
                     tol: float = 1e-9) -> GroupAdvantages:
    """Advantages of a [n_groups, G] reward matrix (see the module docstring)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise InvalidArgument(field="rewards", expected="a [n_groups, G] tensor with G >= 2",
                              got=tuple(rewards.shape), fix="group episodes by environment instance")
    if scale_rewards not in ("group", "batch", "none"):
        raise InvalidArgument(field="scale_rewards", expected="'group', 'batch' or 'none'", got=scale_rewards)
    r = rewards.double()                                        # [n, G]
    mean = r.mean(dim=1)                                        # [n]
    std = r.std(dim=1)                                          # [n] sample std (TRL)
    informative = (r.max(dim=1).values - r.min(dim=1).values) > tol  # [n]
    if scale_rewards == "group":
        scale = std
    elif scale_rewards == "batch":
        kept = r[informative]
        s = kept.std() if kept.numel() > 1 else torch.tensor(0.0, dtype=r.dtype)
        scale = s.expand_as(mean)
    else:
        scale = torch.full_like(mean, 1.0 - eps)
    adv = (r - mean[:, None]) / (scale[:, None] + eps)          # [n, G]
    adv = torch.where(informative[:, None], adv, torch.zeros_like(adv))
    return GroupAdvantages(advantages=adv.float(), informative=informative, group_mean=mean.float(),
                           group_std=std.float())
