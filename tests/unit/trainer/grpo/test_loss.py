"""The clipped surrogate, KL and importance weights against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.grpo.loss import grpo_token_loss, guided_importance_weights

EPS_LOW, EPS_HIGH = 0.2, 0.28


@pytest.mark.parametrize("ratio, adv, per_token_loss, clipped", [
    (1.0, 2.0, -2.0, 0),       # on-policy: -A
    (1.5, 1.0, -1.28, 1),      # above 1 + eps_high with A > 0: clipped at 1.28
    (0.5, -1.0, 0.8, 1),       # below 1 - eps with A < 0: clipped at 0.8
    (0.5, 1.0, -0.5, 0),       # below the range but A > 0: the unclipped (smaller) term
    (1.5, -1.0, 1.5, 0),       # above the range but A < 0: unclipped (pessimistic)
    (1.2, 1.0, -1.2, 0),       # inside [0.8, 1.28]
    (1.0, 0.0, 0.0, 0),
])
def test_clipped_surrogate(ratio, adv, per_token_loss, clipped):
    old = torch.tensor([-1.0])
    logp = (old + math.log(ratio)).requires_grad_(True)
    terms = grpo_token_loss(logp, old, torch.tensor([adv]), torch.tensor([1.0]), epsilon=EPS_LOW,
                            epsilon_high=EPS_HIGH)
    assert float(terms.loss.detach()) == pytest.approx(per_token_loss, abs=1e-6)
    assert terms.clipped_tokens == clipped


@pytest.mark.parametrize("weights, advs, expected", [
    # token-mean (dapo): weights 1/N
    ([0.25] * 4, [1.0, 1.0, -1.0, -1.0], 0.0),
    ([0.25] * 4, [1.0, 1.0, 1.0, -1.0], -0.5),
    # grpo-style weights: episode of 1 token (w = 1/2) and episode of 3 tokens (w = 1/6 each)
    ([0.5, 1 / 6, 1 / 6, 1 / 6], [2.0, -1.0, -1.0, -1.0], -1.0 + 0.5),
    # tokens outside the loss have weight 0
    ([1.0, 0.0, 0.0, 0.0], [3.0, 100.0, 100.0, 100.0], -3.0),
])
def test_normalisation_and_gradient(weights, advs, expected):
    logp = torch.full((4,), -0.7, requires_grad=True)
    terms = grpo_token_loss(logp, logp.detach(), torch.tensor(advs), torch.tensor(weights), epsilon=EPS_LOW,
                            epsilon_high=EPS_HIGH)
    assert float(terms.loss.detach()) == pytest.approx(expected, abs=1e-6)
    terms.loss.backward()
    # ratio = 1 at old = logp: the gradient is the policy gradient -w * A
    assert torch.allclose(logp.grad, -torch.tensor(weights) * torch.tensor(advs), atol=1e-6)


@pytest.mark.parametrize("delta, beta", [(0.0, 0.1), (0.5, 0.1), (-0.3, 0.04), (1.0, 0.0)])
def test_k3_kl(delta, beta):
    logp = torch.tensor([-1.0], requires_grad=True)
    ref = logp.detach() + delta
    terms = grpo_token_loss(logp, logp.detach(), torch.tensor([0.0]), torch.tensor([1.0]), epsilon=EPS_LOW,
                            epsilon_high=EPS_HIGH, beta=beta, ref_logp=ref)
    kl = math.exp(delta) - delta - 1
    assert terms.kl_sum == pytest.approx(kl, abs=1e-6)
    assert float(terms.loss.detach()) == pytest.approx(beta * kl, abs=1e-6)


@pytest.mark.parametrize("old, behaviour, cap, expected", [
    (-1.0, -0.5, 1.0, math.exp(-0.5)),   # the hint made the token likelier: weight < 1
    (-0.1, -2.0, 1.0, 1.0),              # unguided is likelier: truncated at the cap
    (-0.1, -2.0, 2.0, 2.0),
    (-3.0, 0.0, 1.0, math.exp(-3.0)),    # a forced / certain token under guidance
])
def test_importance_weights(old, behaviour, cap, expected):
    w = guided_importance_weights(torch.tensor([old]), torch.tensor([behaviour]), cap)
    assert float(w) == pytest.approx(expected, rel=1e-6)


def test_importance_weight_scales_the_gradient():
    logp = torch.tensor([-1.0], requires_grad=True)
    terms = grpo_token_loss(logp, logp.detach(), torch.tensor([2.0]), torch.tensor([1.0]), epsilon=EPS_LOW,
                            epsilon_high=EPS_HIGH, is_weights=torch.tensor([0.25]))
    terms.loss.backward()
    assert float(logp.grad) == pytest.approx(-0.5)
