"""Loading the frozen base a capability adapter is trained on.

`PolicyRef.model` may name:
- a local Hugging Face model directory (config.json + weights + tokenizer);
- an artifact URI of such a directory (`file:///...`, `s3://bucket/prefix`), downloaded into
  a cache directory (verified, atomic per file) and loaded from there;
- a built-in base agent (`micro`, `smollm2`, `smollm2-base`), built or fetched from its cache by
  `trace_common.agents.resolve_base_agent`.
`PolicyRef.adapter_uri`, when set, is a PEFT adapter merged into the base before training
(e.g. a LoRA warm start): the frozen base of GRPO is then the warm-started model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from trace_common.artifacts import S3Settings, open_uri
from trace_common.errors import InvalidArgument, NotFound

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _download_dir(uri: str, cache_dir: Path, s3: S3Settings | None) -> Path:
    store, key = open_uri(uri.rstrip("/"), s3)
    files = store.list(key + "/")
    if not files:
        raise NotFound(f"no objects under {uri}; give the URI of a model or adapter directory")
    dest = cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:16]
    for info in files:
        rel = info.key[len(key) + 1:]
        target = dest / rel
        if target.is_file() and target.stat().st_size == info.size:
            continue
        store.get_file(info.key, target)
    return dest


def resolve_dir(ref: str, *, cache_dir: Path, s3: S3Settings | None = None) -> Path:
    """A local directory for a model/adapter reference (module docstring)."""
    if ref.startswith(("file://", "s3://")):
        if ref.startswith("file://"):
            local = Path(ref[len("file://"):])
            if local.is_dir():
                return local
        return _download_dir(ref, cache_dir, s3)
    path = Path(ref)
    if path.is_dir():
        return path
    from trace_common.agents import BUILT_IN, resolve_base_agent

    if ref in BUILT_IN:
        return Path(resolve_base_agent(ref))
    raise NotFound(f"policy.model {ref!r} is neither a model directory, an artifact URI, nor a built-in base "
                   f"agent ({', '.join(BUILT_IN)}); give a directory written by save_pretrained or "
                   "s3://bucket/path/to/model")


def check_model_ref(ref: str) -> None:
    """Cheap validation at job creation (no loading)."""
    if not ref:
        raise InvalidArgument(field="spec.policy.model", expected="a model directory, URI or built-in agent name")
    if ref.startswith(("file://", "s3://")):
        return
    if "/" in ref or Path(ref).is_dir():
        if not (Path(ref) / "config.json").is_file():
            raise NotFound(f"spec.policy.model {ref!r} has no config.json; give a directory written by "
                           "save_pretrained")
        return
    from trace_common.agents import BUILT_IN

    if ref not in BUILT_IN:
        raise NotFound(f"spec.policy.model {ref!r} is not a built-in base agent ({', '.join(BUILT_IN)}), a model "
                       "directory or an artifact URI")


def load_base(ref: str, *, adapter_ref: str = "", cache_dir: Path, s3: S3Settings | None = None,
              dtype: str = "float32", device: str | torch.device = "cpu") -> tuple[torch.nn.Module, Any, str]:
    """(model, tokenizer, label) with `adapter_ref` merged in if given; the model is in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in _DTYPES:
        raise InvalidArgument(field="dtype", expected=" | ".join(_DTYPES), got=dtype)
    directory = resolve_dir(ref, cache_dir=cache_dir, s3=s3)
    if not (directory / "config.json").is_file():
        raise NotFound(f"{directory} is not a Hugging Face model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=_DTYPES[dtype]).to(device)
    label = ref
    if adapter_ref:
        from peft import PeftModel

        adir = resolve_dir(adapter_ref, cache_dir=cache_dir, s3=s3)
        if not (adir / "adapter_config.json").is_file():
            raise NotFound(f"{adapter_ref} is not a PEFT adapter directory (no adapter_config.json)")
        model = PeftModel.from_pretrained(model, str(adir)).merge_and_unload()
        label = f"{ref}+{adapter_ref}"
    model.eval()
    return model, tokenizer, label
