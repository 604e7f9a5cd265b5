"""TRAINING_KIND_GATES in the trainer service: requests refused before a job exists (field, expected,
fix), and a local gate-training job (worker process) on the toy world of
tests/unit/trainer/gates/test_grpo_toy.py to SUCCEEDED with a loadable composition."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from tests.unit.trainer.gates.test_grpo_toy import toy_world
from trace_common.artifacts import open_store
from trace_common.errors import InvalidArgument, NotFound, PermissionDenied
from trace_common.jobs import JobState
from trace_common.model_refs import UNCONFINED
from trace_common.moe.composition_io import load_composition

TOY = "tests.unit.trainer.gates.test_grpo_toy"
CONFIG = dict(max_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=4, save_steps=1,
              warm_start_steps=20, warm_start_tasks=4, guidance_fraction=0.0, max_resample_rounds=0,
              early_stop_uninformative_iterations=0)


def make_domain(tmp_path: Path) -> Training:
    return Training(TrainerSettings(artifact_root=(tmp_path / "store").as_uri(), work_dir=str(tmp_path / "work"),
                                    env_modules=[TOY], torch_threads=1))


def publish_adapters(domain: Training) -> dict[str, str]:
    """The toy adapters copied into the trainer's store as adapter jobs publish them."""
    _, dirs = toy_world()
    uris = {}
    for name, directory in dirs.items():
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            info = domain.store.put_file(f"runs/r1/adapters/{name}/v1/{f}", directory / f)
        uris[name] = info.uri.rsplit("/", 1)[0] + "/adapter_model.safetensors"
    return uris


def spec(adapters: dict[str, str], **kw) -> TrainingSpecModel:
    base_dir, _ = toy_world()
    data = dict(kind="TRAINING_KIND_GATES", capability="r1-moe", adapter_uris=adapters,
                environments=[{"name": "toy-early"}, {"name": "toy-late"}, {"name": "toy-early"}],
                policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": str(base_dir)}, config=dict(CONFIG))
    data.update(kw)
    return TrainingSpecModel.model_validate(data)


@pytest.mark.parametrize("changes, error, text", [
    ({"adapter_uris": {"early": "file:///elsewhere/adapter_model.safetensors"}}, InvalidArgument,
     "this trainer's artifact store"),
    ({"adapter_uris": {"early": "STORE/runs/r1/adapters/early/v9/adapter_model.safetensors"}}, InvalidArgument,
     "does not exist"),
    ({"adapter_uris": {"base": "STORE/runs/r1/adapters/early/v1/adapter_model.safetensors"}}, InvalidArgument,
     "slot 0 is the base"),
    ({"environments": [{"name": "toy-late"}]}, InvalidArgument, "an environment for every adapter"),
    ({"environments": [{"name": "toy-early"}, {"name": "nosuchenv"}]}, NotFound, "not registered"),
    ({"config": dict(CONFIG, lora_r=4)}, InvalidArgument, "lora_r"),
    ({"config": dict(CONFIG, group_size=4)}, InvalidArgument, "use 'num_generations'"),
    ({"config": dict(CONFIG, max_steps=0, warm_start_steps=0)}, InvalidArgument, "train nothing"),
    ({"config": dict(CONFIG, train_split="holdout")}, InvalidArgument, "config.train_split"),
    ({"capability": "R1 MoE"}, InvalidArgument, "composition name"),
    ({"policy": {"backend": "POLICY_BACKEND_SCRIPTED", "model": "expert"}}, InvalidArgument,
     "POLICY_BACKEND_IN_PROCESS, or POLICY_BACKEND_OPENAI_HTTP whose served name is the base model's location"),
    # an HTTP-served base whose served name the trainer cannot load (a Hugging Face id)
    ({"policy": {"backend": "POLICY_BACKEND_OPENAI_HTTP", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
                 "endpoint": "http://x/v1"}}, PermissionDenied, "is the served model name"),
])
def test_gates_request_refused_before_a_job_exists(tmp_path, changes, error, text):
    domain = make_domain(tmp_path)
    uris = publish_adapters(domain)
    if "adapter_uris" in changes:
        changes = dict(changes, adapter_uris={k: v.replace("STORE", domain.store.root_uri.rstrip("/"))
                                              for k, v in changes["adapter_uris"].items()})

    async def go():
        domain.create_job(spec(uris, **changes), "r1", {}, "")
    with pytest.raises(error) as err:
        asyncio.run(go())
    assert text in err.value.reason, err.value.reason
    assert domain.jobs.list()[0] == []


@pytest.mark.parametrize("backend", ["POLICY_BACKEND_IN_PROCESS", "POLICY_BACKEND_OPENAI_HTTP"])
def test_gates_accept_the_base_in_process_or_served_under_its_location(tmp_path, backend):
    """The cluster's base agent is served by vLLM (POLICY_BACKEND_OPENAI_HTTP): a gate job loads the
    served name's weights itself and plays in-process, as with an in-process base."""
    domain = make_domain(tmp_path)
    base_dir, _ = toy_world()
    config = domain.validate(spec(publish_adapters(domain), policy={"backend": backend, "model": str(base_dir),
                                                                    "endpoint": "http://vllm:8000/v1"}))
    assert config.max_steps == CONFIG["max_steps"]
    assert domain.jobs.list()[0] == []


@pytest.mark.slow
def test_gates_job_succeeds_with_a_loadable_composition(tmp_path):
    domain = make_domain(tmp_path)
    uris = publish_adapters(domain)

    async def go():
        rec = domain.create_job(spec(uris), "r1", {}, "")
        records = [r async for r in domain.jobs.watch(rec.job_id)]
        return rec, records
    rec, records = asyncio.run(asyncio.wait_for(go(), 300))
    final = records[-1]
    assert final.state == JobState.SUCCEEDED, final.error_message
    its = domain.iteration_history(rec.job_id)
    assert [i.iteration for i in its] == [0, 1, 2]
    assert {"reward_mean", "informative_group_fraction", "pass_rate", "rollouts_total", "routing_share_base",
            "routing_share_early", "routing_share_late"} <= set(its[-1].values)
    assert its[-1].values["rollouts_total"] == 4 * 3 + 2 * 2 * 4   # replays: 4 tasks x (K+1) slots; GRPO
    assert [c.iteration for c in domain.list_checkpoints(rec.job_id)] == [1, 2]
    outputs = {o.kind: o.uri for o in final.outputs}
    assert "/runs/r1/moe/r1-moe/composition.json" in outputs["composition"]
    loaded = load_composition(outputs["composition"], cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    assert loaded.expert_names == ["base", "early", "late"] and loaded.gate_parameters > 0
    assert open_store(domain.store.root_uri).exists("runs/r1/moe/r1-moe/gates.safetensors")
