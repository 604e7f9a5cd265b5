"""Loading the frozen base a capability adapter is trained on.

`PolicyRef.model` may name:
- a local Hugging Face model directory (config.json + weights + tokenizer);
- an artifact URI of such a directory (`file:///...`, `s3://bucket/prefix`), downloaded into
  a cache directory (verified, published whole) and loaded from there;
- a built-in base agent (`micro`, `smollm2`, `smollm2-base`), built or fetched from its cache by
  `trace_common.agents.resolve_base_agent`.
All three go through `trace_common.model_refs.materialize`, as in every other service, confined to
`allowed` (the service's store and model roots; anything else is PermissionDenied).
`PolicyRef.adapter_uri`, when set, is a PEFT adapter merged into the base before training
(e.g. a LoRA warm start): the frozen base of GRPO is then the warm-started model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from services.trainer.grpo.checkpoint import model_label
from trace_common.artifacts import S3Settings
from trace_common.errors import InvalidArgument, NotFound
from trace_common.hf_load import load_causal_lm
from trace_common.model_refs import ModelRoots, materialize
from trace_common.moe.export import refuse_merge_into

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}   # GRPOConfig.dtype: no float16 (no loss scaling)


def check_adapter_merge(dtype: str, adapter_ref: str) -> None:
    """An adapter_uri is merged into the base (load_base): refused unless the base loads in float32."""
    if adapter_ref:
        refuse_merge_into(dtype, field="spec.config.dtype", expected="float32 when spec.policy.adapter_uri is "
                          "merged into the base", remedy="set dtype float32, or train without adapter_uri")


def load_base(ref: str, *, adapter_ref: str = "", cache_dir: Path, s3: S3Settings | None = None,
              dtype: str = "float32", device: str | torch.device = "cpu",
              allowed: ModelRoots) -> tuple[torch.nn.Module, Any, str]:
    """(model, tokenizer, label) with `adapter_ref` merged in if given; the model is in eval mode."""
    from transformers import AutoTokenizer

    if dtype not in _DTYPES:
        raise InvalidArgument(field="dtype", expected=" | ".join(_DTYPES), got=dtype)
    check_adapter_merge(dtype, adapter_ref)
    directory = materialize(ref, allowed=allowed, cache_dir=cache_dir, s3=s3, field="policy.model")
    if not (directory / "config.json").is_file():
        raise NotFound(f"{directory} is not a Hugging Face model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = load_causal_lm(directory, dtype=_DTYPES[dtype], device=device)
    label = ref
    if adapter_ref:
        from peft import PeftModel

        adir = materialize(adapter_ref, allowed=allowed, cache_dir=cache_dir, s3=s3, field="policy.adapter_uri")
        if not (adir / "adapter_config.json").is_file():
            raise NotFound(f"{adapter_ref} is not a PEFT adapter directory (no adapter_config.json)")
        model = PeftModel.from_pretrained(model, str(adir)).merge_and_unload()
        label = model_label(ref, adapter_ref)
    model.eval()
    return model, tokenizer, label
