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


def run(store, cfg, env, kind, *, stop_after=None, resume=False, **identity):
    """`identity`: make_trainer's model_label, policy_model, policy_adapter, environment, environment_params,
    model_key."""
    rows = []
    box = {}

    def on_event(k, p):
        if k == "iteration":
            rows.append({**p["values"], "replayed": bool(p.get("replayed"))})
    trainer = make_trainer(cfg, warm_model(kind), tiny_tokenizer(), env, store=store, prefix=PREFIX, capability="cap",
                           on_event=on_event, should_stop=lambda: stop_after is not None and len(rows) >= stop_after,
                           **identity)
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


def test_a_checkpoint_whose_manifest_lost_its_digest_is_left_out(tmp_path):
    """The store's listing flags a manifest without a recorded digest (ArtifactInfo.corruption) instead
    of failing: the checkpoint is left out (its load would fail), and the one before it is the latest."""
    store = open_store(tmp_path.as_uri())
    config = GRPOConfig(max_steps=4, save_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=3,
                        seed=1, lora_r=4)
    run(store, config, PickEnv, "pick")
    (tmp_path / PREFIX / "ckpt-4" / "checkpoint.json.sha256").unlink()
    assert [c.iteration for c in ckpt.list_checkpoints(store, PREFIX)] == [2]
    assert all(c.sha256 for c in ckpt.list_checkpoints(store, PREFIX))
    assert ckpt.latest_checkpoint(store, PREFIX).iteration == 2


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


#: The job that wrote the checkpoints of the lineage tests: base model, PolicyRef, environment and its params.
JOB = dict(model_label="base-a", policy_model="base-a", environment=("pick", "1"), environment_params={"good": "ab"})
SMALL = dict(groups_per_batch=2, num_generations=4, max_completion_length=3, seed=1, lora_r=4, learning_rate=5e-3,
             early_stop_uninformative_iterations=0)


def older_trace(monkeypatch):
    """Checkpoints written as a TRACE before job identities were recorded wrote them (trainer_state.json's
    `model` only)."""
    save = ckpt.save_checkpoint
    monkeypatch.setattr(ckpt, "save_checkpoint", lambda *a, identity=None, **kw: save(*a, **kw))


@pytest.mark.parametrize("changed, max_steps, legacy, resumes", [
    ({}, 3, False, True),                                                  # the same job continues
    ({"model_label": "base-b", "policy_model": "base-b"}, 3, False, False),  # another base model
    ({"model_key": "a-rebuilt-agent"}, 3, False, False),   # a built-in agent rebuilt under the same name
    ({"policy_adapter": "file:///s/runs/r/adapters/x/v1"}, 3, False, False),  # ... warm-started: another policy
    ({"environment": ("pick", "2")}, 3, False, False),                     # another environment version
    ({"environment": ("other", "1")}, 3, False, False),                    # another environment
    ({"environment_params": {"good": "b"}}, 3, False, False),              # the same one with other params
    # a finished job of another model: trained anew, not its adapter handed back as new ("nothing left to run")
    ({"model_label": "base-b", "policy_model": "base-b"}, 2, False, False),
    ({}, 3, True, True),                                 # written before identities: the same model label continues
    ({"environment_params": {"good": "b"}}, 3, True, True),   # (it recorded nothing else)
    ({"model_label": "base-b"}, 3, True, False),         # ... another model label does not
])
def test_automatic_resume_continues_only_the_same_job(tmp_path, monkeypatch, changed, max_steps, legacy, resumes):
    """Two jobs sharing a prefix (`tracectl train` without a run id: runs/adhoc/..., or a pipeline re-run with
    another base agent) continue each other's checkpoints only when they train the same thing."""
    store = open_store(tmp_path.as_uri())
    if legacy:
        older_trace(monkeypatch)
    run(store, GRPOConfig(max_steps=2, save_steps=2, **SMALL), PickEnv, "pick", **JOB)
    monkeypatch.undo()
    _, rows, result, trainer = run(store, GRPOConfig(max_steps=max_steps, save_steps=2, **SMALL), PickEnv, "pick",
                                   resume=True, **{**JOB, **changed})
    assert result.iterations == max_steps
    assert [r["replayed"] for r in rows] == ([True] if resumes and max_steps == 2 else [False] * len(rows))
    assert len(rows) == (max_steps - 2 if resumes and max_steps > 2 else 1 if resumes else max_steps)
    found = ckpt.list_checkpoints(store, PREFIX)
    assert [c.iteration for c in trainer.checkpoints] == [c.iteration for c in found] == sorted({2, max_steps})
    if not (legacy and resumes):   # a new training overwrote the other job's ckpt-2: all are this job's now
        assert all(ckpt.read_record(store, c.key).identity == trainer.identity for c in found)


@pytest.mark.parametrize("old_at, new_at, stop_after, expected_rows, lineage", [
    # a new config's job was killed at iteration 2 while the old config's ckpt-4 lies above it: it resumes
    # from its own ckpt-2 (it used to restart from scratch on every retry)
    ([2, 4], [], 2, 4, [2, 6]),
    # the old lineage's checkpoints interleave with the new one's: the job's list holds its own only
    ([1, 3, 5], [2], 4, 2, [2, 4, 6]),
])
def test_the_newest_checkpoint_of_the_jobs_lineage_is_resumed(tmp_path, old_at, new_at, stop_after, expected_rows,
                                                              lineage):
    store = open_store(tmp_path.as_uri())
    run(store, GRPOConfig(max_steps=max(old_at), save_steps=0, checkpoint_at=old_at, **SMALL), PickEnv, "pick",
        **JOB)
    new = dict(SMALL, learning_rate=1e-3)   # another config: another lineage
    _, _, killed, _ = run(store, GRPOConfig(max_steps=6, save_steps=0, checkpoint_at=new_at, **new), PickEnv, "pick",
                          stop_after=stop_after, **JOB)
    assert killed.stop_reason == "stop requested" and killed.iterations == stop_after
    _, rows, result, trainer = run(store, GRPOConfig(max_steps=6, save_steps=0, checkpoint_at=new_at, **new),
                                   PickEnv, "pick", resume=True, **JOB)
    assert result.iterations == 6 and len(rows) == expected_rows
    assert [c.iteration for c in trainer.checkpoints] == lineage
    digest = GRPOConfig(**new).resume_digest()
    assert all(ckpt.read_record(store, c.key).config_digest == digest for c in trainer.checkpoints)


@pytest.mark.parametrize("changed, legacy, refused", [
    ({}, False, False),
    ({"environment": ("pick", "2"), "environment_params": {"good": "b"}}, False, False),  # warned, as another config
    ({"model_label": "base-b", "policy_model": "base-b"}, False, True),
    ({}, True, False),                                     # written before identities: its model label decides
    ({"model_label": "base-b"}, True, True),
])
def test_explicit_resume_refuses_a_checkpoint_of_another_model(tmp_path, monkeypatch, changed, legacy, refused):
    store = open_store(tmp_path.as_uri())
    if legacy:
        older_trace(monkeypatch)
    run(store, GRPOConfig(max_steps=2, save_steps=2, **SMALL), PickEnv, "pick", **JOB)
    monkeypatch.undo()
    key = ckpt.list_checkpoints(store, PREFIX)[-1].key
    job = {**JOB, **changed}
    if not refused:
        _, rows, result, _ = run(store, GRPOConfig(max_steps=3, save_steps=2, **SMALL), PickEnv, "pick", resume=key,
                                 **job)
        assert result.iterations == 3 and len(rows) == 1
        return
    from trace_common.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition) as err:
        run(store, GRPOConfig(max_steps=3, save_steps=2, **SMALL), PickEnv, "pick", resume=key, **job)
    assert "trained on model 'base-a'" in err.value.reason and "this job trains model 'base-b'" in err.value.reason


class Killed(BaseException):
    pass


class DiesAfter:
    """A store whose writes fail after `puts` objects (the job is killed mid-checkpoint)."""

    def __init__(self, store, puts: int):
        self.store, self.puts = store, puts

    def put_bytes(self, key, data):
        if self.puts == 0:
            raise Killed(key)
        self.puts -= 1
        return self.store.put_bytes(key, data)

    def __getattr__(self, name):
        return getattr(self.store, name)


def write(store, digest: str, adapter: bytes):
    return ckpt.save_checkpoint(store, PREFIX, state=ckpt.TrainerState(iteration=2, seed_cursor=4),
                                adapter=adapter, adapter_config=b"{}", optimizer={}, scheduler={},
                                config_digest=digest)


@pytest.mark.parametrize("puts", [0, 1, 3, 4, 5])   # killed before/after each of the files, before the manifest
def test_overwriting_a_stale_checkpoint_never_leaves_a_mixed_one_complete(tmp_path, puts):
    store = open_store(tmp_path.as_uri())
    write(store, "old", b"old lineage")
    with pytest.raises(Killed):
        write(DiesAfter(store, puts), "new", b"new lineage")
    assert ckpt.list_checkpoints(store, PREFIX) == []     # the stale checkpoint's manifest went first
    write(store, "new", b"new lineage")                  # the retry completes it
    loaded = ckpt.load_checkpoint(store, ckpt.latest_checkpoint(store, PREFIX).key)
    assert (loaded.config_digest, loaded.adapter) == ("new", b"new lineage")
