"""LoRA on a frozen base with peft: setup, the trainable state, PEFT-format export.

The base model's parameters are frozen (`requires_grad=False`) and never written: the
optimiser only holds LoRA tensors, generation runs the adapter unmerged (merging in place
and unmerging would leave float rounding in the base weights), and the KL reference is the
same model with the adapter disabled (`disable_adapter()`), so no second copy of the base
exists. `lora_target_modules="all-linear"` adapts every linear projection of the
transformer blocks (attention q/k/v/o and MLP gate/up/down); the LM head is left alone.

Semantics of the adapted linear: y = W x + (alpha / r) * B A x, A [r, in] random
(seeded), B [out, r] zero -> the initial adapter is the identity edit (policy == base).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from trace_common.errors import ArtifactCorrupted, FailedPrecondition

from .config import GRPOConfig


def lora_config(config: GRPOConfig) -> LoraConfig:
    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.lora_target_modules, bias="none", task_type="CAUSAL_LM")


def attach_lora(base: torch.nn.Module, config: GRPOConfig) -> PeftModel:
    """Freeze `base` and wrap it with a fresh, seeded LoRA adapter named 'default'."""
    for p in base.parameters():
        p.requires_grad_(False)
    state = torch.random.get_rng_state()
    torch.manual_seed(config.seed)
    try:
        model = get_peft_model(base, lora_config(config))
    finally:
        torch.random.set_rng_state(state)
    bad = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    if bad:
        raise FailedPrecondition(f"non-LoRA parameters are trainable after attaching the adapter: {bad[:3]}")
    if not any(p.requires_grad for p in model.parameters()):
        raise FailedPrecondition("lora_target_modules matched no module of this model; list its linear layers' "
                                 "names (e.g. ['q_proj', 'v_proj']) or use 'all-linear'")
    return model


def load_lora(base: torch.nn.Module, adapter_dir: str | Path, *, trainable: bool = True) -> PeftModel:
    """Wrap `base` with a saved PEFT adapter (e.g. to continue training from a final adapter)."""
    for p in base.parameters():
        p.requires_grad_(False)
    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def adapter_state_bytes(model: PeftModel) -> bytes:
    """The adapter weights as safetensors bytes (PEFT's key names, what `save_pretrained` writes)."""
    state = {k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(model).items()}
    return st_save(state)


def adapter_config_bytes(model: PeftModel) -> bytes:
    cfg = model.peft_config["default"].to_dict()
    for k, v in list(cfg.items()):
        if isinstance(v, set):
            cfg[k] = sorted(v)
    return (json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n").encode()


def load_adapter_state(model: PeftModel, data: bytes) -> None:
    """Restore adapter weights written by `adapter_state_bytes` (exact: no dtype change)."""
    try:
        state = st_load(data)
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types
        raise ArtifactCorrupted(f"adapter weights are not a valid safetensors file: {exc}") from exc
    result = set_peft_model_state_dict(model, state)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise FailedPrecondition(f"checkpoint adapter does not fit this model (unexpected keys {unexpected[:3]}); "
                                 "resume with the same base model and LoRA settings")


def save_pretrained_to(model: PeftModel, directory: str | Path) -> list[Path]:
    """`save_pretrained` into `directory` (PEFT format: adapter_config.json +
    adapter_model.safetensors); returns the files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    files = sorted(p for p in directory.iterdir() if p.is_file())
    names = {p.name for p in files}
    if not {"adapter_config.json", "adapter_model.safetensors"} <= names:
        raise FailedPrecondition(f"peft save_pretrained wrote {sorted(names)}, not a PEFT adapter")
    return files


def torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def torch_load_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)
