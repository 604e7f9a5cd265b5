"""Load a frozen LoRA adapter in PEFT format and check it against the base it will be composed with.

A capability adapter arrives as a directory holding `adapter_config.json` and
`adapter_model.safetensors` (resolving an artifact URI to such a directory is the caller's job).
The composition does not go through PEFT's module injection: it reads the LoRA factors itself so
that a mismatch (an adapter trained on another base, a module the base does not have, a PEFT
feature that changes the LoRA forward) is reported up front with the adapter's name and the exact
mismatch, instead of surfacing as a shape error deep inside a forward pass.

Supported: plain LoRA (and rsLoRA, rank/alpha patterns) on `nn.Linear` modules inside the decoder
layers. Rejected with a clear error: DoRA, LoRA biases, trained base biases, modules_to_save,
trainable tokens, embedding/conv LoRA, fan_in_fan_out, layer replication, aLoRA, Arrow, QALoRA,
and any module outside the decoder layers (e.g. lm_head) -- per-layer routing needs a layer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft.utils.other import get_pattern_key
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from trace_common.errors import InvalidArgument, NotFound
from trace_common.moe.backbone import DecoderLayout, decoder_layout

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY_PREFIX = "base_model.model."

# adapter_config.json fields that change what a LoRA layer computes at inference; each maps to
# a description for the error message (a truthy value means the feature is in use).
_UNSUPPORTED_FLAGS: dict[str, str] = {
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D-style weights)",
    "lora_bias": "LoRA biases",
    "use_qalora": "QALoRA",
    "alora_invocation_tokens": "activated LoRA (aLoRA)",
    "layer_replication": "layer replication",
    "arrow_config": "Arrow routing",
    "modules_to_save": "modules_to_save (fully trained extra modules)",
    "trainable_token_indices": "trainable tokens",
    "target_parameters": "LoRA on nn.Parameter targets",
}


@dataclass(frozen=True)
class LoraModuleWeights:
    """The LoRA factors of one targeted linear: delta(x) = scaling * B @ A @ x."""

    path: str  # module path inside the base, e.g. "model.layers.0.self_attn.q_proj"
    layer: int  # index of the decoder layer that owns the module
    lora_A: torch.Tensor  # [r, in_features]
    lora_B: torch.Tensor  # [out_features, r]
    scaling: float


@dataclass(frozen=True)
class LoraAdapter:
    """A frozen LoRA adapter, validated against one base model."""

    name: str
    source: str  # the directory it was read from
    modules: dict[str, LoraModuleWeights] = field(default_factory=dict)

    @property
    def target_paths(self) -> list[str]:
        return sorted(self.modules)


def _bad(name: str, what: str, *, expected: str | None = None, got: object = None,
         fix: str | None = None) -> InvalidArgument:
    return InvalidArgument(what, field=f"adapter {name!r}", expected=expected, got=got, fix=fix)


def _read_config(name: str, directory: Path) -> dict:
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise NotFound(f"adapter {name!r}: {config_path} does not exist; a PEFT adapter directory "
                       f"holds {CONFIG_FILE} and {WEIGHTS_FILE} (save it with PeftModel.save_pretrained)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise _bad(name, f"{CONFIG_FILE} is not valid JSON ({exc})",
                   fix="re-save the adapter with PeftModel.save_pretrained") from exc
    if not isinstance(config, dict):
        raise _bad(name, f"{CONFIG_FILE} must hold a JSON object", got=type(config).__name__)
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise _bad(name, "only LoRA adapters can be composed", expected="peft_type 'LORA'", got=peft_type)
    for key, what in _UNSUPPORTED_FLAGS.items():
        if config.get(key):
            raise _bad(name, f"uses {what} ({key}={config[key]!r}), which the MoE composition does not "
                       "implement", fix=f"retrain the adapter as plain LoRA with {key} unset")
    if config.get("bias", "none") != "none":
        raise _bad(name, f"trains base biases (bias={config['bias']!r}); a frozen shared base cannot "
                   "carry per-adapter biases", fix="retrain with bias='none'")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise _bad(name, f"{CONFIG_FILE} field {key} must be a positive number", got=value)
    if config.get("use_rslora") and (config.get("rank_pattern") or config.get("alpha_pattern")):
        raise _bad(name, "combines use_rslora with rank_pattern/alpha_pattern, which PEFT rejects too")
    return config


def _scaling(config: dict, module_path: str) -> tuple[int, float]:
    rank_pattern = config.get("rank_pattern") or {}
    alpha_pattern = config.get("alpha_pattern") or {}
    rank = rank_pattern.get(get_pattern_key(rank_pattern.keys(), module_path), config["r"])
    alpha = alpha_pattern.get(get_pattern_key(alpha_pattern.keys(), module_path), config["lora_alpha"])
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return int(rank), float(scaling)


def _split_key(key: str) -> tuple[str, str] | None:
    """'base_model.model.<path>.lora_A.weight' -> (<path>, 'lora_A'); None for any other tensor."""
    for factor in ("lora_A", "lora_B"):
        suffix = f".{factor}.weight"
        if key.startswith(_KEY_PREFIX) and key.endswith(suffix):
            return key[len(_KEY_PREFIX):-len(suffix)], factor
    return None


def _reject_extra_tensor(name: str, key: str) -> InvalidArgument:
    return _bad(name, f"holds tensor {key!r}, which is not a plain LoRA factor of a linear layer "
                "(expected 'base_model.model.<module>.lora_A.weight' / '.lora_B.weight')",
                fix="compose only plain LoRA adapters on linear layers (no DoRA, embedding LoRA, "
                "biases, saved embeddings or modules_to_save)")


def load_lora_adapter(directory: str | Path, base: nn.Module, *, name: str | None = None,
                      layout: DecoderLayout | None = None) -> LoraAdapter:
    """Read a PEFT LoRA adapter directory and validate every factor against `base`.

    The factors are cast to the dtype and device of the base weights they modify. Raises
    NotFound when the directory or its files are missing, InvalidArgument (naming the adapter
    and the mismatch) when the adapter does not fit this base.
    """
    directory = Path(directory)
    name = name or directory.name
    if not directory.is_dir():
        raise NotFound(f"adapter {name!r}: directory {directory} does not exist")
    config = _read_config(name, directory)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise NotFound(f"adapter {name!r}: {weights_path} does not exist (only safetensors weights are "
                       "read; re-save with safe_serialization=True)")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError) as exc:
        raise _bad(name, f"{WEIGHTS_FILE} cannot be read as safetensors ({exc})") from exc
    layout = layout or decoder_layout(base)
    base_modules = dict(base.named_modules())

    factors: dict[str, dict[str, torch.Tensor]] = {}
    extra: list[str] = []  # reported after the LoRA factors, whose errors are more specific
    for key, tensor in tensors.items():
        split = _split_key(key)
        if split is None:
            extra.append(key)
            continue
        factors.setdefault(split[0], {})[split[1]] = tensor
    if not factors and not extra:
        raise _bad(name, f"{WEIGHTS_FILE} holds no LoRA factors")

    modules: dict[str, LoraModuleWeights] = {}
    for path in sorted(factors):
        pair = factors[path]
        missing = {"lora_A", "lora_B"} - set(pair)
        if missing:
            raise _bad(name, f"module {path} has no {sorted(missing)[0]} factor; the file is incomplete")
        target = base_modules.get(path)
        if target is None:
            raise _bad(name, f"targets module {path}, which the base model ({type(base).__name__}, "
                       f"{layout.num_layers} layers) does not have",
                       fix="compose adapters trained on this same base model")
        if not isinstance(target, nn.Linear):
            raise _bad(name, f"targets {path}, a {type(target).__name__}; only nn.Linear modules can "
                       "be routed")
        layer = layout.layer_index_of(path)
        if layer is None:
            raise _bad(name, f"targets {path}, which lies outside the decoder layers "
                       f"({layout.layers_prefix}.*); per-layer routing needs every LoRA module inside "
                       "a decoder layer", fix="retrain without that module in target_modules")
        lora_A, lora_B = pair["lora_A"], pair["lora_B"]  # [r, in], [out, r]
        if lora_A.dim() != 2 or lora_B.dim() != 2:
            raise _bad(name, f"factors of {path} must be matrices", got=(tuple(lora_A.shape), tuple(lora_B.shape)))
        rank, scaling = _scaling(config, path)
        if lora_A.shape[1] != target.in_features or lora_B.shape[0] != target.out_features:
            raise _bad(
                name, f"does not fit module {path} of this base",
                expected=f"lora_A [r, {target.in_features}] and lora_B [{target.out_features}, r] "
                         f"(base hidden size {layout.hidden_size})",
                got=f"lora_A {list(lora_A.shape)}, lora_B {list(lora_B.shape)}",
                fix="the adapter was trained on a different base model; compose adapters trained on "
                    "this one")
        if lora_A.shape[0] != rank or lora_B.shape[1] != rank:
            raise _bad(name, f"rank of {path} disagrees with {CONFIG_FILE}", expected=f"r={rank}",
                       got=f"lora_A {list(lora_A.shape)}, lora_B {list(lora_B.shape)}")
        weight = target.weight
        modules[path] = LoraModuleWeights(
            path=path, layer=layer,
            lora_A=lora_A.to(device=weight.device, dtype=weight.dtype).contiguous(),
            lora_B=lora_B.to(device=weight.device, dtype=weight.dtype).contiguous(),
            scaling=scaling)
    if extra:
        # a LoRA-like tensor (DoRA magnitude, embedding LoRA, LoRA bias) says more than a saved base weight
        raise _reject_extra_tensor(name, min(extra, key=lambda key: ("lora" not in key, key)))
    return LoraAdapter(name=name, source=str(directory), modules=modules)
