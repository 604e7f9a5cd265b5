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

import torch
import torch.nn.functional as F
from peft import PeftModel
from torch import nn

from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.moe.adapters import load_lora_adapter
from trace_common.moe.composed import _COMPOSED_MARK, ComposedMoEModel


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
    allowed = range(slots) if allow_base else range(1, slots)
    choices = []
    for b in range(batch):
        keep = attention_mask[b].bool()  # [T]
        if not bool(keep.any()):
            raise InvalidArgument(field="attention_mask", reason=f"sequence {b} has no prompt tokens")
        chosen = experts[:, b][:, keep]  # [L, T_b]
        fractions = F.one_hot(chosen.reshape(-1), slots).float().mean(dim=0)  # [K+1]
        mean_probs = probs[:, b][:, keep].reshape(-1, slots).mean(dim=0)  # [K+1]
        best = max(allowed, key=lambda i: (float(fractions[i]), float(mean_probs[i])))
        choices.append(RequestChoice(
            slot=best, adapter=None if best == 0 else model.adapter_names[best - 1],
            slot_fractions=tuple(fractions.tolist()), mean_probs=tuple(mean_probs.tolist())))
    return choices


def merge_single_adapter(base: nn.Module, adapter_dir: str | Path, *, name: str | None = None) -> nn.Module:
    """Fold one adapter into the base weights (PEFT merge_and_unload) and return the merged model.

    The adapter is validated first (same errors as composition). `base` is modified in place:
    pass a fresh copy when the plain base is still needed.
    """
    if getattr(base, _COMPOSED_MARK, False):
        raise FailedPrecondition("this base carries an MoE composition; call remove() on it (or use a fresh "
                                 "base) before merging an adapter into its weights")
    load_lora_adapter(adapter_dir, base, name=name)
    peft_model = PeftModel.from_pretrained(base, str(adapter_dir))
    return peft_model.merge_and_unload()
