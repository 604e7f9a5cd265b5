"""GRPO for multi-turn tool use, as a library: one LoRA adapter per capability on a frozen base.

    from services.trainer.grpo import GRPOConfig, make_trainer
    trainer = make_trainer(GRPOConfig(max_steps=50), base_model, tokenizer, env_factory,
                           store=store, prefix="runs/r1/adapters/<cap>", capability="<cap>")
    result = trainer.train()        # resumes from the latest checkpoint under the prefix

Modules: `config` (hyper-parameters, TRL names), `advantages` (group-relative advantages),
`loss` (clipped surrogate, KL, importance weights), `logprobs` (assistant-token logprobs),
`batch` (episodes -> training tensors), `rollouts` (lockstep group play), `guidance` (which
guidance a guided episode shows, as an `<expert_guidance>` block in the system prompt; the check
that a config asking for guidance gets some),
`initial_batches` (the environment's calibration episodes as the first batches),
`vllm_rollouts` (vLLM with runtime LoRA updating), `lora`, `checkpoint`, `seeds`,
`distributed`, `trainer` (the loop), `session` (assembly), `models` (base loading),
`curve` (training-curve PNG), `evaluation` (held-out pass rate).
"""

from .advantages import GroupAdvantages, group_advantages
from .config import GRPOConfig, VLLMRolloutConfig, parse_config
from .loss import LossTerms, grpo_token_loss, guided_importance_weights
from .rollouts import EpisodeSpec, PolicyRollouts, RolloutEngine, play_groups
from .session import make_trainer, prompt_renderer
from .trainer import GRPOTrainer, TrainResult

__all__ = [
    "EpisodeSpec", "GRPOConfig", "GRPOTrainer", "GroupAdvantages", "LossTerms", "PolicyRollouts", "RolloutEngine",
    "TrainResult", "VLLMRolloutConfig", "group_advantages", "grpo_token_loss", "guided_importance_weights",
    "make_trainer", "parse_config", "play_groups", "prompt_renderer",
]
