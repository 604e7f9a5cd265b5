"""Trainer service: GRPO LoRA adapters per capability and MoE gate training, as jobs."""
