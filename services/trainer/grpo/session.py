"""Assembling a GRPO run in one call: base model + tokenizer + environment -> a ready `GRPOTrainer`.

    trainer = make_trainer(config, base_model, tokenizer, lambda: make("store", task_types="precondition_check"),
                           store=store, prefix="runs/r1/adapters/precondition_verification",
                           capability="precondition_verification")
    result = trainer.train()          # checkpoints + final PEFT adapter under prefix/v<N>/

The rollout engine is chosen by `config.rollout_backend`: `in_process` generates with the
trained model itself through `trace_common.policy.TransformersPolicy` (no copy; optimizer
steps are visible at once), `vllm` with a vLLM server that hot-loads every adapter version
(`vllm_rollouts.VLLMRollouts`). Either way the prompt renderer used to re-render guided
turns is the in-process chat format, so training tokens match what the model is fed.
"""

from __future__ import annotations

from typing import Any

import torch

from trace_common.artifacts import ArtifactStore
from trace_common.policy.transformers_backend import TransformersPolicy

from .batch import PromptRenderer
from .config import GRPOConfig
from .distributed import Dist
from .lora import attach_lora
from .rollouts import EnvFactory, PolicyRollouts, RolloutEngine
from .trainer import EventFn, GRPOTrainer


def prompt_renderer(policy: TransformersPolicy) -> PromptRenderer:
    """Render + tokenize a conversation exactly as the in-process policy does for a request."""
    def render(messages, tools):
        return policy.encode(policy.chat.render(messages, tools, add_generation_prompt=True))
    return render


def make_trainer(config: GRPOConfig, base_model: torch.nn.Module, tokenizer: Any, env_factory: EnvFactory, *,
                 store: ArtifactStore | None = None, prefix: str = "", capability: str = "",
                 on_event: EventFn | None = None, should_stop=None, dist: Dist | None = None,
                 model_label: str = "", engine: RolloutEngine | None = None,
                 guidance_text: str | None = None, lineage: str = "", policy_model: str = "",
                 policy_adapter: str = "", environment: tuple[str, str] | None = None,
                 environment_params: dict[str, Any] | None = None, model_key: str = "") -> GRPOTrainer:
    """Attach a fresh LoRA adapter to `base_model` (frozen) and build the trainer (module docstring).
    `lineage` (a digest of the job's checkpoint prefix) names the vLLM adapter versions of this job's
    checkpoints apart from other runs' (vllm_rollouts.py). `policy_model`, `policy_adapter` and
    `environment` ((name, version)) are what `config.initial_batches_uri`'s episodes must have been
    played by and on (initial_batches.py); with `environment_params`, `model_label` and `model_key` (a
    built-in base agent's cache key) they are the job's identity its checkpoints record (a job resumes
    only its own: `GRPOTrainer.resume`)."""
    if config.gradient_checkpointing:
        base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = attach_lora(base_model, config)
    policy = TransformersPolicy.from_model(model, tokenizer, name=model_label or "base",
                                           max_batch=config.generation_batch_size, max_wait_s=0.0)
    if engine is None:
        if config.rollout_backend == "vllm":
            from .vllm_rollouts import VLLMRollouts

            assert config.vllm is not None
            engine = VLLMRollouts(config.vllm, model, capability=capability or "adapter", tokenizer=tokenizer,
                                  base_model_name=model_label, lineage=lineage, dist=dist)
        else:
            engine = PolicyRollouts(policy)
    return GRPOTrainer(config, model, env_factory, engine, render=prompt_renderer(policy), pad_id=policy.pad_id,
                       store=store, prefix=prefix, capability=capability, guidance_text=guidance_text, dist=dist,
                       on_event=on_event, should_stop=should_stop, model_label=model_label,
                       policy_model=policy_model, policy_adapter=policy_adapter, environment=environment,
                       environment_params=environment_params, model_key=model_key)
