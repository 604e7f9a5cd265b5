"""The GRPO objective on assistant tokens: clipped surrogate (clip-higher), optional KL, explicit
importance weights for off-policy (guided) tokens.

Semantics (per token t of a sequence with advantage A; tensors [N] over the selected tokens):
    ratio_t     = exp(logp_t - old_logp_t)                    # pi_theta / pi_old
    surrogate_t = min(ratio_t * A, clamp(ratio_t, 1 - eps, 1 + eps_high) * A)
    kl_t        = exp(ref_t - logp_t) - (ref_t - logp_t) - 1   # k3 estimator, >= 0 (beta > 0 only)
    loss        = sum_t weight_t * (-is_t * surrogate_t + beta * kl_t)
`weight_t` carries the normalisation: 1 / (tokens in the whole batch) for `dapo`
(token-mean, the default), 1 / (tokens of its episode * episodes in the batch) for `grpo`;
tokens outside the loss have weight 0. `is_t` is 1 for on-policy tokens and the truncated
importance weight min(C, pi_old(y_t | unguided) / q(y_t | guided)) for guided tokens
(`guided_importance_weights`), a constant (no gradient flows through it).

With one pass per batch (`num_iterations` = 1) old_logp is logp detached, so ratio = 1 and
the gradient is A * grad(logp) -- the policy gradient -- and no token is clipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossTerms:
    loss: torch.Tensor        # scalar, differentiable
    clipped_tokens: float     # weighted count of tokens whose clip is active
    kl_sum: float             # weighted sum of kl_t (0 when beta = 0 and no ref given)
    ratio_sum: float          # weighted sum of ratio_t
    weight_sum: float         # sum of weights (for turning the sums above into means)


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                    weights: torch.Tensor, *, epsilon: float, epsilon_high: float, beta: float = 0.0,
                    ref_logp: torch.Tensor | None = None, is_weights: torch.Tensor | None = None) -> LossTerms:
    """The loss over N selected tokens (see the module docstring).

    logp [N] (with grad), old_logp [N], advantages [N] (the token's episode advantage),
    weights [N] (normalisation, 0 = not in the loss), ref_logp [N] or None, is_weights [N] or None.
    """
    ratio = torch.exp(logp - old_logp)                                   # [N]
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)  # [N]
    surrogate = torch.minimum(ratio * advantages, clipped_ratio * advantages)  # [N]
    if is_weights is not None:
        surrogate = surrogate * is_weights
    per_token = -surrogate                                               # [N]
    kl = None
    if ref_logp is not None:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0                               # [N]
        if beta:
            per_token = per_token + beta * kl
    loss = (per_token * weights).sum()
    with torch.no_grad():
        r = ratio.detach()
        active = ((r < 1.0 - epsilon) & (advantages < 0)) | ((r > 1.0 + epsilon_high) & (advantages > 0))
        w = weights.detach()
        clipped = float((active.float() * w).sum())
        kl_sum = float((kl.detach() * w).sum()) if kl is not None else 0.0
        ratio_sum = float((r * w).sum())
        weight_sum = float(w.sum())
    return LossTerms(loss=loss, clipped_tokens=clipped, kl_sum=kl_sum, ratio_sum=ratio_sum, weight_sum=weight_sum)


def guided_importance_weights(old_logp_unguided: torch.Tensor, behaviour_logp: torch.Tensor, cap: float
                              ) -> torch.Tensor:
    """Truncated per-token importance weights of tokens sampled in a guided context.

    Semantics: w_t = min(cap, exp(old_logp_unguided_t - behaviour_logp_t)); [N] -> [N], no grad.
    `behaviour_logp` is the sampler's logprob of the token given the guided prompt.
    """
    with torch.no_grad():
        return torch.clamp(torch.exp(old_logp_unguided - behaviour_logp), max=cap)
