"""Resume exactness: 2k iterations vs k + stop + resume + k give bitwise-identical adapters (CPU,
deterministic settings, one thread), and a resumed run replays the same seeds and rewards and
reports the same budget (episodes and tokens played, resampled groups included)."""

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
            rows.append({**p["values"], "replayed": bool(p.get("replayed"))})
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


TOTALS = ("rollouts_total", "prompt_tokens_total", "completion_tokens_total")


@pytest.mark.parametrize("env, cfg, stop_after, resampled", [
    pytest.param(lambda: PickEnv(good="ab"), dict(max_resample_rounds=2), 2, True, id="resampled groups"),
    pytest.param(lambda: PickEnv(hint=True), dict(guidance_fraction=0.25), 2, False, id="guided"),
    # every reward 0: the run stops early after 2 iterations; resumed after that, it stays stopped
    pytest.param(lambda: PickEnv(good=""), dict(early_stop_uninformative_iterations=2), 1, False, id="early stop"),
])
def test_budget_is_the_same_for_resumed_and_uninterrupted_runs(tmp_path, env, cfg, stop_after, resampled):
    config = GRPOConfig(max_steps=4, save_steps=0, groups_per_batch=3, num_generations=4, max_completion_length=4,
                        learning_rate=5e-3, seed=3, deterministic=True, lora_r=4,
                        **{"early_stop_uninformative_iterations": 0, **cfg})
    _, rows_a, res_a, _ = run(open_store((tmp_path / "a").as_uri()), config, env, "pick")
    store = open_store((tmp_path / "b").as_uri())
    _, rows_b1, res_b1, _ = run(store, config, env, "pick", stop_after=stop_after)
    assert res_b1.stop_reason == "stop requested" and res_b1.iterations == stop_after
    _, rows_b2, res_b2, _ = run(store, config, env, "pick", resume=True)
    _, rows_c, res_c, _ = run(store, config, env, "pick", resume=True)   # nothing left to run
    assert res_a.iterations == res_b2.iterations == res_c.iterations
    assert res_a.stop_reason == res_b2.stop_reason == res_c.stop_reason
    final = {k: rows_a[-1][k] for k in TOTALS}
    assert final == {k: rows_b2[-1][k] for k in TOTALS} == {k: rows_c[-1][k] for k in TOTALS}
    # every episode played is counted, once: the per-iteration counts add up to the totals
    assert final["rollouts_total"] == sum(r["episodes"] for r in rows_a) == sum(r["episodes"] for r in rows_b1 + rows_b2)
    assert final["completion_tokens_total"] == sum(r["generated_tokens"] for r in rows_a) > 0
    assert final["prompt_tokens_total"] == sum(r["prompt_tokens"] for r in rows_a) > 0
    # the finished job played nothing more and re-reported its last iteration, so its metrics carry the totals
    assert [r["replayed"] for r in rows_c] == [True] and not any(r["replayed"] for r in rows_a + rows_b1 + rows_b2)
    schedule = res_a.iterations * 3 * 4
    if resampled:
        assert sum(r["resample_rounds"] for r in rows_a) > 0 and final["rollouts_total"] > schedule
    else:
        assert final["rollouts_total"] == schedule
