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
    ({"dtype": "int8"}, "config.dtype", "'float32' or 'bfloat16'"),
    ({"dtype": "float16"}, "config.dtype", "'float32' or 'bfloat16'"),      # no loss scaling: overflows
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
    # a removed field, whatever its value: named, with what replaced it
    ({"guidance_position": "user"}, "config", "guidance_position: guidance is always shown as an <expert_guidance> "
     "block at the end of the system prompt"),
    ({"guidance_position": "system", "guidance_fraction": 0.25}, "config", "guidance_position: "),
    ({"guidance_position": "user"}, "config", "remove the field"),
    # torch.manual_seed takes no more (the worker would fail after loading the model)
    ({"seed": 1e20}, "config.seed", "less than or equal to 9223372036854775807"),
    ({"seed": 2**63}, "config.seed", "less than or equal to 9223372036854775807"),
    ({"seed": -1}, "config.seed", "greater than or equal to 0"),
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
    ({"seed": 2**63 - 1}, lambda c: c.seed == 2**63 - 1),   # the largest seed torch.manual_seed takes
    ({"seed": 1e6}, lambda c: c.seed == 10**6),
])
def test_valid_config(values, check):
    assert check(parse_config(values))


@pytest.mark.parametrize("values, resume_digest", [
    ({}, "b1d73ef21706d575"),
    ({"seed": 123456789, "max_steps": 3}, "55eba26c1a8c002d"),
    ({"seed": 2**63 - 1}, "af7d9cd45f312064"),
])
def test_checkpoints_of_todays_configs_stay_resumable(values, resume_digest):
    """The digests today's configs record in their checkpoints (checked on resume): changing a field's
    bounds or description leaves them as they are; a change that alters them must keep them in
    `resumable_digests`."""
    assert resume_digest in GRPOConfig(**values).resumable_digests()


@pytest.mark.parametrize("changed, same_resume_digest", [
    ({"max_steps": 99, "save_steps": 7}, True),                                  # how long, how often
    ({"max_steps": 99, "checkpoint_at": [5, 40]}, True),                         # ... and where else to save
    ({"gradient_accumulation_steps": 8, "gradient_checkpointing": True}, True),  # memory layout
    ({"vllm": {"base_url": "http://v:8000/v1", "adapter_dir": "/a"}}, True),     # where rollouts are served
    ({"report_to": ["wandb"]}, True),                                             # where the metrics are logged
    ({"learning_rate": 1e-3}, False),                                             # what is trained
    ({"dtype": "bfloat16"}, False),                                               # ... in another precision
])
def test_resume_digest_ignores_only_neutral_fields(changed, same_resume_digest):
    assert (GRPOConfig(**changed).resume_digest() == GRPOConfig().resume_digest()) is same_resume_digest


def _old_digest(cfg: GRPOConfig, neutral, position: str) -> str:
    """The digest an older TRACE recorded for `cfg`'s values: its dump still held guidance_position, and
    had no initial_batches_uri, report_to or dtype yet."""
    data = {k: v for k, v in cfg.model_dump(mode="json").items()
            if k not in neutral and k not in ("initial_batches_uri", "report_to", "dtype")}
    data["guidance_position"] = position
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# (checkpoint_at came after the legacy version: its model_dump had no such key)
LEGACY = {"max_steps", "save_steps", "checkpoint_at"}
BEFORE_VLLM = GRPOConfig.RESUME_NEUTRAL - {"vllm"}      # the digest then kept "vllm": null


@pytest.mark.parametrize("values, neutral, position, resumes", [
    # before the memory-layout fields became neutral, the recorded digest covered them
    ({"gradient_accumulation_steps": 8}, LEGACY, "user", True),
    ({"learning_rate": 3e-4}, BEFORE_VLLM, "user", True),
    ({"learning_rate": 3e-4}, GRPOConfig.RESUME_NEUTRAL, "user", True),     # just before guidance_position went
    ({"learning_rate": 3e-4}, GRPOConfig.RESUME_NEUTRAL, "system", True),   # unguided: the position never mattered
    # a guided run's old checkpoint saw prose where the block now goes: a new training, not a continuation
    ({"guidance_fraction": 0.25}, GRPOConfig.RESUME_NEUTRAL, "user", False),
    ({"guidance_fraction": 0.25}, GRPOConfig.RESUME_NEUTRAL, "system", False),
    ({"guidance_fraction": 0.25}, LEGACY, "user", False),
])
def test_checkpoints_of_older_versions(values, neutral, position, resumes):
    cfg = GRPOConfig(**values)
    old = _old_digest(cfg, neutral, position)
    assert old != cfg.resume_digest()
    assert (old in cfg.resumable_digests()) is resumes
    assert cfg.resume_digest() in cfg.resumable_digests()


def test_an_old_digest_resumes_only_the_same_values():
    old = _old_digest(GRPOConfig(gradient_accumulation_steps=8), LEGACY, "user")
    assert old not in GRPOConfig(gradient_accumulation_steps=4).resumable_digests()


def test_digest_changes_with_values():
    assert GRPOConfig().digest() == GRPOConfig().digest()
    assert GRPOConfig(learning_rate=1e-3).digest() != GRPOConfig().digest()


def test_the_default_dtype_keeps_the_digest_of_a_config_from_before_the_field():
    """A checkpoint written before `dtype` existed continues under float32, the weights it was trained
    with; bfloat16 is a different training. The literal is what commit 5028f1a (no dtype field) computed."""
    before = "14d621333b2df633"
    assert GRPOConfig(learning_rate=3e-4).resume_digest() == before
    assert GRPOConfig(learning_rate=3e-4, dtype="bfloat16").resume_digest() != before
