"""Where the decoder layers of a transformers causal LM live, and which layer owns a module.

The MoE composition routes per decoder layer, so it needs two facts about the frozen base:
the ordered decoder layers (to hook each one's input hidden state) and, for every module a
LoRA adapter targets, the index of the decoder layer that contains it. Llama/Qwen3-family
models keep their layers in `model.model.layers`; other families reachable through
`get_decoder()` with a `.layers` ModuleList work the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from trace_common.errors import FailedPrecondition


@dataclass(frozen=True)
class DecoderLayout:
    """The decoder stack of a base model: qualified name of the layer list and the layers."""

    layers_prefix: str  # e.g. "model.layers"
    layers: tuple[nn.Module, ...]
    hidden_size: int

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_index_of(self, module_path: str) -> int | None:
        """Index of the decoder layer containing `module_path`, None when outside the stack."""
        prefix = self.layers_prefix + "."
        if not module_path.startswith(prefix):
            return None
        head = module_path[len(prefix):].split(".", 1)[0]
        if not head.isdigit() or int(head) >= len(self.layers):
            return None
        return int(head)


def decoder_layout(base: nn.Module) -> DecoderLayout:
    """Locate the decoder layers of `base` (a transformers causal LM)."""
    layer_list = None
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    if decoder is not None and isinstance(getattr(decoder, "layers", None), nn.ModuleList):
        layer_list = decoder.layers
    if layer_list is None:
        raise FailedPrecondition(
            f"base model {type(base).__name__} has no decoder layer list (expected get_decoder().layers "
            "as in LlamaForCausalLM / Qwen3ForCausalLM); MoE composition supports decoder-only "
            "transformers causal LMs")
    prefix = next((name for name, mod in base.named_modules() if mod is layer_list), None)
    if prefix is None:  # pragma: no cover - get_decoder() always returns a submodule
        raise FailedPrecondition(f"decoder layers of {type(base).__name__} are not a submodule of it")
    config = getattr(base, "config", None)
    hidden = getattr(config, "hidden_size", None)
    if not isinstance(hidden, int):
        raise FailedPrecondition(
            f"base model {type(base).__name__} has no integer config.hidden_size; the gates need it")
    return DecoderLayout(layers_prefix=prefix, layers=tuple(layer_list), hidden_size=hidden)
