"""Per-token logprobs of selected target tokens, computing the vocabulary projection only there.

A multi-turn training sequence is mostly prompt (system prompt, tools, tool results); only
the assistant tokens are trained. Running the backbone once and projecting just the target
positions onto the vocabulary keeps the [tokens, vocab] logits small -- TRL gets the same
saving for single-turn completions with `logits_to_keep`, which cannot express the
scattered assistant spans of a multi-turn episode.

Semantics (B sequences of length T, N = number of target tokens):
    mask = None if every row is right-padded else attention_mask
    h = backbone(input_ids, mask)                             # [B, T, H]
    targets: positions t >= 1 with target_mask[b, t]          # [N]
    z = lm_head(h[b, t - 1]) / temperature                    # [N, V] float32
    logp = log_softmax(z)[input_ids[b, t]]                    # [N]
    entropy = -sum softmax(z) * log_softmax(z)                # [N] (no grad)
Dividing by the sampling temperature makes logp the logprob under the distribution the
tokens were sampled from (the generation backend reports the same), as TRL does.

Right padding needs no mask: in a causal model a real position attends only to positions at or
before it, and on a right-padded row those are all real, so the pad tokens after it change
nothing that is selected (positions are 0..T-1 either way). Without a mask, transformers calls
SDPA with `is_causal=True`, which runs the fused kernel; with one it builds a [B, 1, T, T] mask,
and on a CPU that falls back to the math kernel, which keeps every [B, heads, T, T] attention
matrix for the backward pass (bench/row_layout.py measures both). A row padded anywhere else
(left padding, holes) keeps its mask.

Shared prefix: the episodes of a batch usually start with the same system prompt and tool
list -- often most of each sequence. With `prefix_len = P > 0` (every row starts with the
same P tokens and no target lies in them) the prefix runs once, its KV states are expanded
to the B rows (the expansion is differentiable: the prefix's gradient is the sum over rows,
exactly as if every row had run it) and only the suffixes run per row:
    kv = backbone(input_ids[:1, :P])                          # [1, heads, P, d] per layer
    h  = backbone(input_ids[:, P:], past=expand(kv, B), positions P..T-1)   # [B, T-P, H]
Not used under gradient checkpointing (which cannot keep a KV cache).
"""

from __future__ import annotations

from typing import Any

import torch


def _parts(model: Any) -> tuple[Any, Any] | None:
    """(backbone, lm_head) of a causal LM, a PEFT wrapper of one, or None if unknown."""
    inner = model
    get_base = getattr(inner, "get_base_model", None)
    if callable(get_base):
        inner = get_base()
    get_decoder = getattr(inner, "get_decoder", None)
    get_head = getattr(inner, "get_output_embeddings", None)
    if not callable(get_decoder) or not callable(get_head):
        return None
    backbone, head = get_decoder(), get_head()
    if backbone is None or head is None or backbone is inner:
        return None
    if getattr(getattr(inner, "config", None), "final_logit_softcapping", None):
        return None  # the model post-processes logits: use its own forward
    return backbone, head


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor,
                      min_len: int = 16) -> int:
    """Longest P such that every row starts with the same P real tokens and no target is at a
    position <= P (so every target's hidden state lies in the suffix); 0 if below `min_len`."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & (attention_mask == 1).all(0)   # [T]
    p = int(same.long().cumprod(0).sum())
    tpos = target_mask.nonzero()
    if tpos.numel():
        p = min(p, int(tpos[:, 1].min()) - 1)
    return p if p >= min_len else 0


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row of the [B, T] mask is ones then zeros (module docstring: no mask needed)."""
    am = attention_mask.bool()
    return not bool((am[:, 1:] & ~am[:, :-1]).any())


def selected_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      target_mask: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = True,
                      prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp [N], entropy [N] or None) of the target tokens, in row-major order of
    `target_mask` [B, T] (see the module docstring). Position 0 is never a target.
    `prefix_len` > 0 runs that shared prefix once (see `shared_prefix_len`)."""
    sel = target_mask[:, 1:].bool()                                   # [B, T-1]
    parts = _parts(model)
    if parts is not None:
        backbone, head = parts
        inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        checkpointing = bool(getattr(inner, "is_activation_checkpointing", False)) and inner.training
        if prefix_len > 0 and not checkpointing:
            hidden = _suffix_hidden(backbone, inner.config, input_ids, attention_mask, prefix_len)  # [B, T-P, H]
            h = hidden[:, :-1][target_mask[:, prefix_len + 1:].bool()]  # [N, H]
        else:
            mask = None if right_padded(attention_mask) else attention_mask
            hidden = backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state  # [B, T, H]
            h = hidden[:, :-1][sel]                                   # [N, H]
        logits = head(h).float()                                      # [N, V]
    else:
        out = model(input_ids=input_ids, attention_mask=None if right_padded(attention_mask) else attention_mask)
        logits = out.logits[:, :-1][sel].float()                      # [N, V]
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:][sel]                                   # [N]
    logp_all = torch.log_softmax(logits, dim=-1)                      # [N, V]
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)          # [N]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)            # [N]
    return logp, entropy


def _suffix_hidden(backbone: Any, config: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   p: int) -> torch.Tensor:
    """Hidden states of positions p..T-1 with the shared prefix run once (module docstring)."""
    from transformers import DynamicCache

    b, t = input_ids.shape
    cache = DynamicCache(config=config)
    backbone(input_ids=input_ids[:1, :p], attention_mask=attention_mask[:1, :p], cache=cache, use_cache=True)
    for layer in cache.layers:
        layer.keys = layer.keys.expand(b, -1, -1, -1)                 # [B, heads, P, d]
        layer.values = layer.values.expand(b, -1, -1, -1)
    positions = (p + torch.arange(t - p, device=input_ids.device))[None].expand(b, -1)  # [B, T-P]
    out = backbone(input_ids=input_ids[:, p:], attention_mask=attention_mask, position_ids=positions, cache=cache,
                   use_cache=True)
    return out.last_hidden_state                                       # [B, T-P, H]
