"""Teacher forcing for the gate warm start: each layer's input under routing forced to the label.

A gate at layer l reads the hidden state entering l, which depends on the routing of the layers
below. The warm start therefore runs the frozen model with routing *forced* to the label (every
token of a capability-c sequence through adapter c at every layer: the routing the gates are being
taught), records each layer's input hidden states, and fits the gates to them (`warm_start.py`'s
Semantics). Those inputs do not depend on the gates, so the trainer may compute them once and keep
them. The backbone needs no gradient, so this is one no-grad forward per batch.
"""

from __future__ import annotations

import torch

from trace_common.errors import FailedPrecondition
from trace_common.moe.backbone import decoder_layout
from trace_common.moe.composed import ComposedMoEModel


def layer_inputs_under_forcing(model: ComposedMoEModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               slots: torch.Tensor) -> list[torch.Tensor]:
    """Hidden states entering each decoder layer [B, T, H] (one per layer), with sequence b's
    tokens forced to slot slots[b] at every layer; no gradient."""
    layout = decoder_layout(model.base)
    batch, seq = input_ids.shape
    table = slots.view(1, batch, 1).expand(model.num_layers, batch, seq).cpu()  # [L, B, T]
    captured: list[torch.Tensor | None] = [None] * model.num_layers

    def grab(layer: int):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            captured[layer] = hidden.detach()
        return hook

    handles = [layer.register_forward_pre_hook(grab(i), with_kwargs=True) for i, layer in enumerate(layout.layers)]
    try:
        with torch.no_grad(), model.forced(table):
            model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    if any(h is None for h in captured):
        raise FailedPrecondition("a decoder layer did not run during the forward; cannot read its input")
    return captured  # type: ignore[return-value]
