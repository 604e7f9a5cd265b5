"""Soft per-trajectory routing: the ablation of TRACE's hard per-token top-1 (routing mode
`soft_trajectory`).

The reference code's gates are soft and per trajectory: one set of mixture weights per request,
applied to every token of it. Here the weights come from the same trained gates (trained for hard
per-token top-1 routing; this mode only changes how they are applied), per layer, as the mean
gate softmax over the request's prompt tokens:

Semantics (one request, prompt tokens t = 1..n, then generated tokens):
    h_1 = embeddings(prompt)
    for each decoder layer l:
        p_l[t] = softmax(G_l h_l[t])                         # [n, K+1], the gate on the layer's input
        w_l = mean_t p_l[t]                                  # [K+1]; slot 0 = the plain base
        at every LoRA-targeted linear of layer l, for every token of the request:
            y = W x + sum_{e >= 1} w_l[e] * s_e B_e A_e x    # slot 0's weight adds no adapter
        h_{l+1} = layer_l(h_l)                               # the prompt under the weights of layers <= l
    generated tokens reuse w (computed once, over the prompt; a new request -- the next turn of an
    episode -- computes its own)

So layer l's gate reads hidden states the lower layers computed under their own soft weights (one
prefill computes and applies the weights). With one-hot weights (w_l = e_k at every layer) the model
is exactly the base with adapter k (`forced(k)`). Per-linear math: `routed_lora.dense_soft_lora_delta`
with each token's row = its request's weights; weights: `gating.trajectory_mixture`.

Generation (`generate_soft_batch`): a prefix KV cache is never reused across requests, since a
prefix's KV depends on the weights, which depend on the whole prompt. The weights of a batch are a
`soft_mixture.SoftMixture`, which the composed model makes and applies; this module only drives
generation over a `ComposedMoEModel` (imported for its type only), so the dependency runs one way:
soft_routing -> composed -> soft_mixture.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.policy.generation import GenerationOutput, RowParams, new_kv_cache, sample_tokens

if TYPE_CHECKING:
    from trace_common.moe.composed import ComposedMoEModel


def _row_generator(seed: int | None, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "big") >> 1)
    return g


@torch.inference_mode()
def generate_soft_batch(composed: ComposedMoEModel, prompts: Sequence[Sequence[int]], params: Sequence[RowParams],
                        *, stop_ids: Sequence[int], pad_id: int) -> tuple[list[GenerationOutput], torch.Tensor]:
    """Sample one completion per prompt under soft per-trajectory routing (module docstring).

    Returns the outputs and the weights [L, B, K+1] each request was generated with. Sampling is
    `trace_common.policy.generation`'s (per-row seeded generator, the logprob under
    softmax(logits / T) over the whole vocabulary); unlike `generate_batch`, finished rows stay in
    the batch (fed and ignored) so each row keeps its own weights, and no prefix cache is used.
    """
    if len(prompts) != len(params):
        raise InvalidArgument(field="params", expected=f"{len(prompts)} entries (one per prompt)", got=len(params))
    if not prompts:
        return [], torch.zeros((composed.num_layers, 0, composed.num_slots))
    if any(len(p) == 0 for p in prompts):
        raise InvalidArgument(field="prompts", expected="non-empty token lists")
    if composed.is_forced:
        raise FailedPrecondition("routing is forced; soft per-trajectory routing needs the gates")
    device = next(composed.base.parameters()).device
    batch, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long, device=device)  # [B, S]
    attention = torch.zeros((batch, width), dtype=torch.long, device=device)  # [B, S]
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long, device=device)
        attention[row, width - len(prompt):] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [B, S]
    cache = new_kv_cache(composed.base)
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    gens = [_row_generator(p.seed, device) for p in params]
    stop = set(int(i) for i in stop_ids)
    out_ids: list[list[int]] = [[] for _ in range(batch)]
    out_lp: list[list[float]] = [[] for _ in range(batch)]
    finish = ["length"] * batch
    live = [True] * batch
    with composed.soft_trajectory() as mixture:
        out = composed(input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True,
                       logits_to_keep=1)
        logits = out.logits[:, -1, :].float()  # [B, V]
        next_pos = positions[:, -1] + 1  # [B]
        while True:
            uniforms = torch.stack([torch.rand((), generator=g, device=device) for g in gens])  # [B]
            tokens, lps = sample_tokens(logits, temperature, top_k, top_p, uniforms)  # [B], [B]
            for row, (token, lp) in enumerate(zip(tokens.tolist(), lps.tolist(), strict=True)):
                if not live[row]:
                    continue
                out_ids[row].append(token)
                out_lp[row].append(lp)
                if token in stop:
                    finish[row], live[row] = "stop", False
                elif len(out_ids[row]) >= params[row].max_tokens:
                    live[row] = False
            if not any(live):
                break
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=1)
            out = composed(input_ids=tokens.view(batch, 1), attention_mask=attention, position_ids=next_pos.view(batch, 1),
                           cache=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        weights = mixture.weights().expand(composed.num_layers, batch, composed.num_slots).clone()
    outputs = [GenerationOutput(token_ids=out_ids[b], logprobs=out_lp[b], finish_reason=finish[b]) for b in range(batch)]
    return outputs, weights
