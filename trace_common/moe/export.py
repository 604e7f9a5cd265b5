"""Export modes for serving engines without per-token routing.

* One adapter per request: run the gates over the prompt and pick the slot that the gates chose
  most often across (layer, prompt token) decisions; ties go to the higher mean gate probability.
  The engine then serves that one adapter (or the plain base when slot 0 wins). In process,
  `model.forced(slot)` reproduces exactly that single-adapter model.
* Merged weights of a single adapter: W' = W + s * B A folded into the base by PEFT's merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from peft import PeftModel
from torch import nn

from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.moe.adapters import load_lora_adapter
from trace_common.moe.composed import _COMPOSED_MARK, ComposedMoEModel
from trace_common.policy.generation import PrefixCache, new_kv_cache


@dataclass(frozen=True)
class RequestChoice:
    """The single slot chosen for one request (sequence of the batch)."""

    slot: int  # 0 = plain base, k = adapter k
    adapter: str | None  # adapter name of the slot, None for the base
    slot_fractions: tuple[float, ...]  # [K+1] share of (layer, prompt token) decisions per slot
    mean_probs: tuple[float, ...]  # [K+1] mean gate probability per slot over layers and prompt tokens


def choose_adapter_per_request(model: ComposedMoEModel, input_ids: torch.Tensor,
                               attention_mask: torch.Tensor | None = None, *,
                               allow_base: bool = True) -> list[RequestChoice]:
    """Pick one slot per sequence by the gates' mean routing over its prompt.

    Semantics:
        run the gates on the prompt (no cache, no grad); for sequence b:
            frac[i] = mean over layers l and unpadded prompt tokens t of [e(l, b, t) == i]
            mean_p[i] = mean over the same (l, t) of p(l, b, t)[i]
            slot = argmax over allowed i of (frac[i], mean_p[i])   # lexicographic
        allowed = 0..K, or 1..K when allow_base is False
    """
    if model.is_forced:
        raise FailedPrecondition("routing is forced; choose_adapter_per_request needs the gates' own decisions")
    if input_ids.dim() != 2:
        raise InvalidArgument(field="input_ids", expected="a [batch, prompt_len] tensor", got=list(input_ids.shape))
    batch, seq = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if tuple(attention_mask.shape) != (batch, seq):
        raise InvalidArgument(field="attention_mask", expected=f"shape {[batch, seq]}", got=list(attention_mask.shape))
    with torch.no_grad(), model.capture_routing() as trace:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    experts = trace.experts()  # [L, B, T]
    probs = trace.probs()  # [L, B, T, K+1]
    slots = model.num_slots
    choices = []
    for b in range(batch):
        keep = attention_mask[b].bool()  # [T]
        if not bool(keep.any()):
            raise InvalidArgument(field="attention_mask", reason=f"sequence {b} has no prompt tokens")
        chosen = experts[:, b][:, keep]  # [L, T_b]
        counts = F.one_hot(chosen.reshape(-1), slots).sum(dim=0)  # [K+1]
        prob_sums = probs[:, b][:, keep].reshape(-1, slots).double().sum(dim=0)  # [K+1]
        choices.append(_choice(model, counts, prob_sums, chosen.numel(), allow_base))
    return choices


def _choice(model: ComposedMoEModel, counts: torch.Tensor, prob_sums: torch.Tensor, decisions: int,
            allow_base: bool) -> RequestChoice:
    """counts, prob_sums [K+1]: decisions per slot and summed gate probabilities over `decisions`
    (layer, prompt token) pairs -> the choice (the lexicographic rule of choose_adapter_per_request)."""
    fractions = counts.double() / decisions                       # [K+1]
    mean_probs = prob_sums.double() / decisions                   # [K+1]
    allowed = range(model.num_slots) if allow_base else range(1, model.num_slots)
    best = max(allowed, key=lambda i: (float(fractions[i]), float(mean_probs[i])))
    return RequestChoice(slot=best, adapter=None if best == 0 else model.adapter_names[best - 1],
                         slot_fractions=tuple(fractions.tolist()), mean_probs=tuple(mean_probs.tolist()))


class PerRequestChooser:
    """`choose_adapter_per_request` for one prompt at a time, reusing earlier prompts' routing.

    An agent's prompt at turn k+1 starts with its prompt at turn k (plus the reply and the tool
    results), and in a causal model a token's routing depends only on the tokens before it. So the
    (layer, token) decisions over a prefix already seen need not be recomputed: the chooser keeps,
    per prompt, the KV states of the unforced composed model and each token's routing statistics,
    and runs only the new tokens. Without it, every turn of a per-request episode re-ran the gates
    over the whole conversation with no cache (half of the smollm2 per-request arm's time).

    Semantics (choose(prompt), prompt of n tokens):
        m, KV, S = the cached prompt sharing the longest prefix with `prompt` (m < n; m = 0: none)
                   S [m, 2(K+1)]: per token, decisions per slot summed over layers, then gate
                   probabilities per slot summed over layers
        run prompt[m:] with KV under the gates' own routing, capture experts [L, n-m], probs [L, n-m, K+1]
        S' = S ++ [one_hot(experts).sum(layers) | probs.sum(layers)]          # [n, 2(K+1)]
        cache (prompt, KV', S'); choice = rule of choose_adapter_per_request with
        fractions = S'[:, :K+1].sum(tokens) / (L n), mean_probs = S'[:, K+1:].sum(tokens) / (L n)

    Decisions are the uncached function's up to float rounding of the cached prefix's KV (the same
    tolerance as the generation prefix cache); the counts are exact sums. The cache is dropped when
    the composition's weights change.
    """

    def __init__(self, model: ComposedMoEModel, *, max_bytes: int = 1 << 30, allow_base: bool = True):
        if model.is_forced:
            raise FailedPrecondition("routing is forced; the per-request choice needs the gates' own decisions")
        self.model = model
        self.allow_base = allow_base
        self.cache = PrefixCache(max_bytes=max_bytes)

    @torch.no_grad()
    def choose(self, prompt: list[int]) -> RequestChoice:
        model, slots = self.model, self.model.num_slots
        if not prompt:
            raise InvalidArgument(field="prompt", expected="at least one token")
        if model.is_forced:
            raise FailedPrecondition("routing is forced; the per-request choice needs the gates' own decisions")
        self.cache.check_weights(model)
        device = next(model.parameters()).device
        m, kv, stats = self.cache.lookup_entry(np.asarray(prompt, dtype=np.int64))
        cache = new_kv_cache(model.base, kv)
        ids = torch.tensor([prompt[m:]], dtype=torch.long, device=device)                # [1, n-m]
        positions = torch.arange(m, len(prompt), device=device)[None]                      # [1, n-m]
        with model.capture_routing() as trace:
            model(input_ids=ids, attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=device),
                  position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        experts = trace.experts()[:, 0]                                                     # [L, n-m]
        probs = trace.probs()[:, 0]                                                         # [L, n-m, K+1]
        new = torch.cat([F.one_hot(experts, slots).sum(0).double(), probs.double().sum(0)], dim=-1)  # [n-m, 2(K+1)]
        full = new if stats is None else torch.cat([stats, new.to(stats.device)])          # [n, 2(K+1)]
        self.cache.put(prompt, [(layer.keys, layer.values) for layer in cache.layers], full)
        totals = full.sum(0)                                                                # [2(K+1)]
        return _choice(model, totals[:slots], totals[slots:], model.num_layers * len(prompt), self.allow_base)


def refuse_merge_into(dtype: str | torch.dtype, *, field: str, expected: str, remedy: str, got: str = "") -> None:
    """InvalidArgument naming `field` unless `dtype` is float32: half-precision weights cannot hold most
    of a LoRA delta (it lies below their precision), so an adapter merged into them is mostly lost. The
    one rule for every place that would merge (the trainer's adapter_uri, merged routing, this module)."""
    name = str(dtype).removeprefix("torch.")
    if name != "float32":
        raise InvalidArgument(field=field, expected=expected, got=got or name,
                              fix=f"{name} weights cannot hold most of a LoRA delta (it lies below their precision), "
                                  f"so a merged adapter would be mostly lost: {remedy}")


def merge_single_adapter(base: nn.Module, adapter_dir: str | Path, *, name: str | None = None) -> nn.Module:
    """Fold one adapter into the base weights (PEFT merge_and_unload) and return the merged model.

    The adapter is validated first (same errors as composition). `base` is modified in place:
    pass a fresh copy when the plain base is still needed.
    """
    if getattr(base, _COMPOSED_MARK, False):
        raise FailedPrecondition("this base carries an MoE composition; call remove() on it (or use a fresh "
                                 "base) before merging an adapter into its weights")
    refuse_merge_into(next(base.parameters()).dtype, field="routing",
                      expected="float32 base weights to merge an adapter into",
                      remedy="route the adapter (routing token) or load the base in float32")
    load_lora_adapter(adapter_dir, base, name=name)
    peft_model = PeftModel.from_pretrained(base, str(adapter_dir))
    return peft_model.merge_and_unload()
