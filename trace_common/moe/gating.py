"""The per-layer gate math: hard top-1 routing, the straight-through factor, load balancing, and the
per-request mixture weights of the soft per-trajectory ablation.

One gate per decoder layer, G_l = Linear(hidden, K+1, bias), reads the hidden state entering
layer l. Slot 0 is the plain base (no adapter); slot k >= 1 is adapter k. These functions are
pure tensor math so tests can check them against hand-computed values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trace_common.errors import InvalidArgument


def gate_param_count(num_layers: int, hidden_size: int, num_adapters: int) -> int:
    """Parameters of all gates: L * (H * (K+1) + (K+1)) -- a weight and a bias per layer.

    Semantics:
        slots = K + 1                       # K adapters plus the base slot 0
        per_layer = H * slots + slots       # Linear(H, slots) weight + bias
        return L * per_layer
    """
    slots = num_adapters + 1
    return num_layers * (hidden_size * slots + slots)


def route_top1(logits: torch.Tensor) -> torch.Tensor:
    """Hard top-1 slot per token.

    Semantics:
        for each token n:
            p[n] = softmax(logits[n])       # [K+1]
            e[n] = argmax_i p[n, i]         # ties -> lowest slot index
        softmax is strictly increasing per row, so argmax over logits gives the same e.
    """
    # logits: [N, K+1] -> [N] int64
    return logits.argmax(dim=-1)


def straight_through_factor(logits: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """A per-token factor whose value is exactly 1 and whose gradient is d p_e / p_e.

    Semantics:
        for each token n with chosen slot e = expert_ids[n]:
            g[n] = p[n, e] / stop_grad(p[n, e])       # == 1 in the forward pass
        d g[n] / d logits[n, j] = onehot(e)[j] - p[n, j]
        (computed as exp(log p_e - stop_grad(log p_e)) so the value is exactly 1.0)
    """
    # logits: [N, K+1], expert_ids: [N] -> [N]
    log_p = F.log_softmax(logits.float(), dim=-1).gather(-1, expert_ids.unsqueeze(-1)).squeeze(-1)  # [N]
    return torch.exp(log_p - log_p.detach())


def load_balancing_loss(probs: torch.Tensor, expert_ids: torch.Tensor,
                        token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Switch-Transformer auxiliary loss of one layer: (K+1) * sum_i f_i * P_i.

    Semantics:
        S = K + 1; tokens n range over the masked-in tokens only, N = their count
        f[i] = (1/N) * #{n : expert_ids[n] == i}    # fraction routed to slot i (no gradient)
        P[i] = (1/N) * sum_n probs[n, i]            # mean gate probability of slot i
        loss = S * sum_i f[i] * P[i]                # 1.0 when routing is perfectly uniform
    """
    # probs: [N, S], expert_ids: [N], token_mask: [N] bool or None -> scalar
    num_slots = probs.shape[-1]
    if token_mask is not None:
        probs = probs[token_mask]
        expert_ids = expert_ids[token_mask]
    count = probs.shape[0]
    if count == 0:
        return probs.sum() * 0.0
    fraction = torch.bincount(expert_ids, minlength=num_slots).to(probs.dtype) / count  # [S]
    mean_prob = probs.mean(dim=0)  # [S]
    return num_slots * (fraction * mean_prob).sum()


def trajectory_mixture(probs: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's mixture weights per sequence for soft per-trajectory routing: the mean gate
    softmax over the sequence's (prompt) tokens.

    Semantics:
        for each sequence b, over its masked-in tokens t only (padding excluded), n_b = their count:
            w[b, i] = (1 / n_b) * sum_t probs[b, t, i]     # sum_i w[b, i] == 1; slot 0 = the base
        a sequence with no token is an error (its weights would be undefined)
    """
    # probs: [B, T, K+1], token_mask: [B, T] bool or None -> [B, K+1]
    if token_mask is None:
        return probs.mean(dim=1)
    keep = token_mask.to(probs.dtype).unsqueeze(-1)  # [B, T, 1]
    counts = keep.sum(dim=1)  # [B, 1]
    if bool((counts == 0).any()):
        raise InvalidArgument(field="attention_mask", reason="a sequence has no token to compute its mixture over")
    return (probs * keep).sum(dim=1) / counts
