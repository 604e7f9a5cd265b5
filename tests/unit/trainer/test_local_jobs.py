"""Training jobs as local worker processes (the embedded default): streamed iterations, the PEFT
adapter as output, cancel with a checkpoint kept, and kill -9 + resume giving the same adapter
as an uninterrupted run. Each test starts real `python -m services.trainer.worker` processes."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from trace_common.jobs import JobState

pytestmark = pytest.mark.slow


def make_domain(tmp_path) -> Training:
    return Training(TrainerSettings(artifact_root=(tmp_path / "store").as_uri(), work_dir=str(tmp_path / "work"),
                                    env_modules=["tests.unit.trainer.grpo.toy_registry"], torch_threads=1,
                                    cancel_grace_seconds=60))


def spec(model_dir, **config) -> TrainingSpecModel:
    cfg = dict(max_steps=4, groups_per_batch=4, num_generations=8, max_completion_length=4, learning_rate=5e-3,
               lora_r=4, save_steps=2, guidance_fraction=0.0, seed=5, deterministic=True,
               early_stop_uninformative_iterations=0)
    cfg.update(config)
    return TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_ADAPTER", capability="pick_skill", environments=[{"name": "toy-pick"}],
        policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": str(model_dir)}, config=cfg))


def test_job_succeeds_with_iterations_and_adapter(tmp_path, model_dir):
    domain = make_domain(tmp_path)

    async def go():
        rec = domain.create_job(spec(model_dir), "run1", {"team": "a"}, "req-1")
        live = [pair async for pair in domain.watch(rec.job_id)]
        late = [pair async for pair in domain.watch(rec.job_id)]   # a watcher that comes after the end
        return rec, [r for r, _ in live], live, late
    rec, records, live, late = asyncio.run(asyncio.wait_for(go(), 300))
    final = records[-1]
    assert final.state == JobState.SUCCEEDED, final.error_message
    assert sorted({r.completed for r in records if r.state == JobState.RUNNING}) == [0, 1, 2, 3, 4]
    assert [it.iteration for it in domain.iteration_history(rec.job_id)] == [1, 2, 3, 4]
    for pairs in (live, late):   # every completed iteration reaches every watcher exactly once, in order
        assert [it.iteration for _, it in pairs if it is not None] == [1, 2, 3, 4]
    assert late[-1][0].state == JobState.SUCCEEDED
    stages = [r.stage for r in records]   # what each iteration is doing, while it does it
    for it in range(1, 5):
        assert f"iteration {it}: playing 32 episodes" in stages, stages
    assert any(s.startswith("iteration 1: updating on ") for s in stages), stages
    assert {"reward_mean", "pass_rate", "informative_group_fraction", "step_seconds"} <= set(final.metrics)
    kinds = {o.kind: o for o in final.outputs}
    assert {"adapter", "adapter_config", "training_curve"} <= set(kinds)
    assert kinds["adapter"].uri.endswith("runs/run1/adapters/pick_skill/v1/adapter_model.safetensors")
    assert [c.iteration for c in domain.list_checkpoints(rec.job_id)] == [2, 4]


def test_cancel_stops_the_worker_and_keeps_a_checkpoint(tmp_path, model_dir):
    domain = make_domain(tmp_path)

    async def go():
        rec = domain.create_job(spec(model_dir, max_steps=500, save_steps=0), "run2", {}, "")
        async for snap in domain.jobs.watch(rec.job_id):
            if snap.completed >= 1:
                domain.jobs.cancel(rec.job_id)
                break
        return await domain.jobs.wait(rec.job_id, 120)
    final = asyncio.run(go())
    assert final.state == JobState.CANCELLED
    found = domain.list_checkpoints(final.job_id)
    assert found and found[-1].iteration >= 1   # SIGTERM -> checkpoint -> exit


def test_kill_and_resume_gives_the_uninterrupted_adapter(tmp_path, model_dir):
    domain = make_domain(tmp_path)

    seen: dict[str, list] = {}

    async def run_job(run_id, kill_at=None):
        rec = domain.create_job(spec(model_dir, max_steps=4, save_steps=2), run_id, {}, "")
        async for snap in domain.jobs.watch(rec.job_id):
            seen.setdefault(rec.job_id, []).append(snap)
            if kill_at is not None and snap.stage == f"checkpoint {kill_at}":
                proc = domain.local.processes[rec.job_id]
                os.kill(proc.pid, signal.SIGKILL)   # no chance to checkpoint or say goodbye
                kill_at = None
        return domain.jobs.get(rec.job_id)

    async def go():
        straight = await run_job("straight")
        killed = await run_job("killed", kill_at=2)
        resumed = await run_job("killed")
        return straight, killed, resumed
    straight, killed, resumed = asyncio.run(go())
    assert straight.state == JobState.SUCCEEDED
    assert killed.state == JobState.FAILED and "killed by signal 9" in killed.error_message
    assert "out-of-memory killer" in killed.error_message and "gradient_accumulation_steps" in killed.error_message
    assert resumed.state == JobState.SUCCEEDED
    assert [it.iteration for it in domain.iteration_history(resumed.job_id)] == [3, 4]   # resumed after ckpt-2
    resumed_stages = [(r.completed, r.stage) for r in seen[resumed.job_id] if r.stage.startswith("iteration")]
    assert resumed_stages[0] == (2, "iteration 3: playing 32 episodes"), resumed_stages  # progress starts at 2/4
    a = load_file(tmp_path / "store/runs/straight/adapters/pick_skill/v1/adapter_model.safetensors")
    b = load_file(tmp_path / "store/runs/killed/adapters/pick_skill/v1/adapter_model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_worker_failure_reason_reaches_the_job(tmp_path, model_dir):
    broken = tmp_path / "no-weights"
    broken.mkdir()
    (broken / "config.json").write_text((model_dir / "config.json").read_text())  # passes the cheap check
    domain = make_domain(tmp_path)

    async def go():
        rec = domain.create_job(spec(broken), "run3", {}, "")
        return await domain.jobs.wait(rec.job_id, 120)
    final = asyncio.run(go())
    assert final.state == JobState.FAILED
    assert final.error_code == "INTERNAL" and "OSError" in final.error_message


def test_the_base_loads_in_the_configured_dtype_and_the_adapter_stays_float32(tmp_path, model_dir):
    """`dtype: bfloat16` reaches the worker's load (the same seed trains a different adapter than under
    float32: the forward runs in bfloat16), while the LoRA weights it writes stay float32."""
    domain = make_domain(tmp_path)

    async def go(run: str, dtype: str):
        rec = domain.create_job(spec(model_dir, max_steps=2, save_steps=0, dtype=dtype), run, {}, "")
        return await domain.jobs.wait(rec.job_id, 300)
    adapters = {}
    for dtype in ("float32", "bfloat16"):
        final = asyncio.run(go(f"run-{dtype}", dtype))
        assert final.state == JobState.SUCCEEDED, final.error_message
        uri = {o.kind: o for o in final.outputs}["adapter"].uri
        adapters[dtype] = load_file(uri.removeprefix("file://"))
        assert {t.dtype for t in adapters[dtype].values()} == {torch.float32}
    a, b = adapters["float32"], adapters["bfloat16"]
    assert a.keys() == b.keys()
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_capabilities_train_in_parallel(tmp_path, model_dir):
    domain = make_domain(tmp_path)

    def cap_spec(name):
        return spec(model_dir, max_steps=2, save_steps=0).model_copy(update={"capability": name})

    async def go():
        recs = [domain.create_job(cap_spec(c), "par", {}, "") for c in ("skill_a", "skill_b")]
        return [await domain.jobs.wait(r.job_id, 300) for r in recs]
    a, b = asyncio.run(go())
    assert a.state == b.state == JobState.SUCCEEDED
    assert a.start_time < b.end_time and b.start_time < a.end_time      # both ran at the same time
    assert {o.uri.split("/adapters/")[1].split("/")[0] for o in (*a.outputs, *b.outputs)} == {"skill_a", "skill_b"}
