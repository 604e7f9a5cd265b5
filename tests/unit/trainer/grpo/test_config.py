"""GRPOConfig: TRL names, validators whose messages say how to fix the input."""

from __future__ import annotations

import hashlib
import json

import pytest

from services.trainer.grpo.config import GRPOConfig, parse_config
from trace_common.errors import InvalidArgument


@pytest.mark.parametrize("values, field, fix", [
    ({"group_size": 8}, "config", "use 'num_generations'"),
    ({"lr": 1e-4}, "config", "use 'learning_rate'"),
    ({"num_generation": 4}, "config", "did you mean num_generations"),
    ({"num_generations": 1}, "config.num_generations", "greater than or equal to 2"),
    ({"epsilon": 0.3, "epsilon_high": 0.2}, "config", "e.g. epsilon=0.2, epsilon_high=0.28"),
    ({"scale_rewards": "global"}, "config.scale_rewards", "'group', 'batch' or 'none'"),
    ({"temperature": 0.0}, "config.temperature", "greater than 0"),
    ({"top_k": 1}, "config", "use top_k=0"),
    ({"guidance_fraction": 0.95, "num_generations": 4}, "config", "lower it below"),
    # asks for guidance but rounds to no guided episode: an error, not a silent no-op
    ({"guidance_fraction": 0.05, "num_generations": 8}, "config", "raise it to at least 0.063 or set it to 0"),
    ({"guidance_fraction": 0.08, "num_generations": 6}, "config", "raise it to at least 0.084 or set it to 0"),
    ({"rollout_backend": "vllm"}, "config", "needs a vllm block"),
    ({"lora_target_modules": "all"}, "config.lora_target_modules", "'all-linear'"),
    ({"warmup_steps": 10, "max_steps": 10}, "config", "must be below max_steps"),
    ({"vllm": {"base_url": "vllm:8000", "adapter_dir": "/x"}, "rollout_backend": "vllm"}, "config.vllm.base_url",
     "http(s) URL"),
])
def test_invalid_config_says_how_to_fix(values, field, fix):
    with pytest.raises(InvalidArgument) as err:
        parse_config(values)
    assert err.value.reason.startswith(field)
    assert fix in err.value.reason


@pytest.mark.parametrize("values, check", [
    ({}, lambda c: (c.num_generations, c.epsilon, c.epsilon_high, c.beta, c.scale_rewards) == (8, 0.2, 0.28, 0.0,
                                                                                               "group")),
    # Struct numbers arrive as floats
    ({"num_generations": 4.0, "max_steps": 3.0}, lambda c: c.num_generations == 4 and c.max_steps == 3),
    ({"guidance_fraction": 0.25, "num_generations": 8}, lambda c: c.guided_per_group == 2),
    ({"guidance_fraction": 0.5, "num_generations": 6}, lambda c: c.guided_per_group == 3),
    ({"guidance_fraction": 0.084, "num_generations": 6}, lambda c: c.guided_per_group == 1),  # the least above
    ({}, lambda c: c.guidance_fraction == 0.0 and c.guided_per_group == 0),  # guidance is asked for, never implied
    ({"lora_target_modules": ["q_proj", "v_proj"]}, lambda c: c.lora_target_modules == ["q_proj", "v_proj"]),
])
def test_valid_config(values, check):
    assert check(parse_config(values))


@pytest.mark.parametrize("changed, same_resume_digest", [
    ({"max_steps": 99, "save_steps": 7}, True),                                  # how long, how often
    ({"max_steps": 99, "checkpoint_at": [5, 40]}, True),                         # ... and where else to save
    ({"gradient_accumulation_steps": 8, "gradient_checkpointing": True}, True),  # memory layout
    ({"vllm": {"base_url": "http://v:8000/v1", "adapter_dir": "/a"}}, True),     # where rollouts are served
    ({"learning_rate": 1e-3}, False),                                             # what is trained
])
def test_resume_digest_ignores_only_neutral_fields(changed, same_resume_digest):
    assert (GRPOConfig(**changed).resume_digest() == GRPOConfig().resume_digest()) is same_resume_digest


def test_checkpoints_of_older_versions_still_resume():
    """Before the memory-layout fields became neutral, the recorded digest covered them."""
    cfg = GRPOConfig(gradient_accumulation_steps=8)
    # (checkpoint_at came after that version: its model_dump had no such key)
    data = {k: v for k, v in cfg.model_dump(mode="json").items()
            if k not in {"max_steps", "save_steps", "checkpoint_at"}}
    legacy = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    assert legacy != cfg.resume_digest() and legacy in cfg.resumable_digests()
    assert legacy not in GRPOConfig(gradient_accumulation_steps=4).resumable_digests()


def test_checkpoints_from_before_vllm_was_neutral_still_resume():
    cfg = GRPOConfig(learning_rate=3e-4)
    data = {k: v for k, v in cfg.model_dump(mode="json").items()
            if k not in GRPOConfig.RESUME_NEUTRAL - {"vllm"}}      # the digest then kept "vllm": null
    previous = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    assert previous != cfg.resume_digest() and previous in cfg.resumable_digests()


def test_digest_changes_with_values():
    assert GRPOConfig().digest() == GRPOConfig().digest()
    assert GRPOConfig(learning_rate=1e-3).digest() != GRPOConfig().digest()
