"""Resume exactness: 2k iterations vs k + stop + resume + k give bitwise-identical adapters (CPU,
deterministic settings, one thread), and a resumed run replays the same seeds and rewards."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load

from services.trainer.grpo import checkpoint as ckpt
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.lora import adapter_state_bytes
from services.trainer.grpo.session import make_trainer
from tests.unit.trainer.grpo.helpers import PickEnv, ToolEnv, tiny_tokenizer, warm_model
from trace_common.artifacts import open_store

PREFIX = "runs/r/adapters/cap"


def run(store, cfg, env, kind, *, stop_after=None, resume=False):
    rows = []
    box = {}

    def on_event(k, p):
        if k == "iteration":
            rows.append(p["values"])
    trainer = make_trainer(cfg, warm_model(kind), tiny_tokenizer(), env, store=store, prefix=PREFIX, capability="cap",
                           on_event=on_event, should_stop=lambda: stop_after is not None and len(rows) >= stop_after)
    box["result"] = trainer.train(resume=resume, write_adapter=False)
    return load(adapter_state_bytes(trainer.model)), rows, box["result"], trainer


@pytest.mark.parametrize("kind, env, cfg", [
    ("pick", PickEnv, dict(max_completion_length=4, lr_scheduler_type="linear", warmup_steps=1)),
    pytest.param("tool", ToolEnv, dict(max_completion_length=32, max_turns=2, guidance_fraction=0.25,
                                       num_generations=4, beta=0.02), marks=pytest.mark.slow),
])
def test_k_kill_k_equals_2k(tmp_path, kind, env, cfg):
    k = 3
    config = GRPOConfig(max_steps=2 * k, save_steps=k, groups_per_batch=3, learning_rate=5e-3, seed=11,
                        deterministic=True, lora_r=4, early_stop_uninformative_iterations=0,
                        **{"num_generations": 6, **cfg})
    straight, rows_a, res_a, _ = run(open_store((tmp_path / "a").as_uri()), config, env, kind)
    store = open_store((tmp_path / "b").as_uri())
    _, rows_b1, res_b1, _ = run(store, config, env, kind, stop_after=k)
    assert res_b1.iterations == k and res_b1.stop_reason == "stop requested"
    assert [c.iteration for c in ckpt.list_checkpoints(store, PREFIX)] == [k]
    resumed, rows_b2, res_b2, trainer = run(store, config, env, kind, resume=True)
    assert res_b2.iterations == 2 * k and trainer.state.seed_cursor == 2 * k * 3
    assert res_a.policy_version == res_b2.policy_version > 0
    assert set(straight) == set(resumed)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert [r["reward_mean"] for r in rows_a] == [r["reward_mean"] for r in rows_b1 + rows_b2]


def test_incomplete_checkpoint_is_skipped_and_corruption_detected(tmp_path):
    store = open_store(tmp_path.as_uri())
    config = GRPOConfig(max_steps=4, save_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=3,
                        seed=1, lora_r=4)
    run(store, config, PickEnv, "pick")
    assert [c.iteration for c in ckpt.list_checkpoints(store, PREFIX)] == [2, 4]
    (tmp_path / PREFIX / "ckpt-4" / "checkpoint.json").unlink()     # died while writing ckpt-4
    (tmp_path / PREFIX / "ckpt-4" / "checkpoint.json.sha256").unlink(missing_ok=True)
    assert ckpt.latest_checkpoint(store, PREFIX).iteration == 2
    victim = tmp_path / PREFIX / "ckpt-2" / "optimizer.pt"
    victim.write_bytes(victim.read_bytes()[:-8] + b"garbage!")
    from trace_common.errors import ArtifactCorrupted

    with pytest.raises(ArtifactCorrupted):
        ckpt.load_checkpoint(store, ckpt.latest_checkpoint(store, PREFIX).key)


@pytest.mark.parametrize("changed, resumes", [
    ({}, True),                       # same config: a re-run continues after the last checkpoint
    ({"learning_rate": 1e-3}, False),  # another config: a new training starts fresh
    # memory layout only (e.g. re-run with more micro-batches after an OOM kill): continues
    ({"gradient_accumulation_steps": 4, "gradient_checkpointing": True}, True),
])
def test_automatic_resume_only_continues_the_same_config(tmp_path, changed, resumes):
    store = open_store(tmp_path.as_uri())
    base = dict(max_steps=2, save_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=3, seed=1,
                lora_r=4, learning_rate=5e-3)
    run(store, GRPOConfig(**base), PickEnv, "pick")
    _, rows, result, trainer = run(store, GRPOConfig(**{**base, "max_steps": 3, **changed}), PickEnv, "pick",
                                   resume=True)
    assert result.iterations == 3
    assert len(rows) == (1 if resumes else 3)
