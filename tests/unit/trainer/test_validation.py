"""Bad training requests are refused before a job exists, with the reason and how to fix it."""

from __future__ import annotations

import asyncio

import pytest

from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied


def spec(**kw) -> TrainingSpecModel:
    base = dict(kind="TRAINING_KIND_ADAPTER", capability="precondition_verification",
                environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
                policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config={"max_steps": 2})
    base.update(kw)
    return TrainingSpecModel.model_validate(base)


@pytest.mark.parametrize("changes, error, text", [
    ({"environments": [{"name": "nosuchenv"}]}, NotFound, "environment 'nosuchenv' is not registered"),
    ({"environments": [{"name": "store", "params": {"colour": "red"}}]}, InvalidArgument, "only these parameters"),
    ({"environments": [{"name": "store", "params": {"task_types": "haircut"}}]}, InvalidArgument, "task_types"),
    ({"environments": [{"name": "store"}, {"name": "store"}]}, InvalidArgument, "exactly one environment"),
    ({"capability": "Precondition Verification"}, InvalidArgument, "snake_case capability name"),
    ({"config": {"group_size": 8}}, InvalidArgument, "use 'num_generations'"),
    ({"config": {"epsilon": 0.3, "epsilon_high": 0.1}}, InvalidArgument, "epsilon_high=0.28"),
    ({"config": {"learning_rate": -1}}, InvalidArgument, "config.learning_rate"),
    ({"config": {"seed": 1e20}}, InvalidArgument, "config.seed"),   # not after the worker loaded the model
    ({"config": {"train_split": "holdout"}}, InvalidArgument, "one of ['dev', 'test', 'train']"),
    ({"policy": {"backend": "POLICY_BACKEND_SCRIPTED", "model": "expert"}}, InvalidArgument,
     "POLICY_BACKEND_IN_PROCESS"),
    # outside the store and the model roots: refused before anything is looked at (trace_common/model_refs.py)
    ({"policy": {"backend": "POLICY_BACKEND_IN_PROCESS", "model": "/no/such/model"}}, PermissionDenied,
     "spec.policy.model: '/no/such/model' is not a model location"),
    ({"policy": {"backend": "POLICY_BACKEND_IN_PROCESS", "model": "gpt-9"}}, PermissionDenied,
     "a built-in base agent (micro"),
    ({"policy": {"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro", "adapter_uri": "file:///etc"}},
     PermissionDenied, "spec.policy.adapter_uri"),
    ({"kind": "TRAINING_KIND_GATES", "adapter_uris": {"a": "file:///x"}}, InvalidArgument, "this trainer's artifact store"),
    ({"executor": "EXECUTOR_KUBERNETES"}, FailedPrecondition, "TRACE_TRAINER_JOB_IMAGE"),
    ({"resume_from_uri": "file:///elsewhere/ckpt-3"}, InvalidArgument, "a checkpoint in this trainer's artifact"),
])
def test_refused_with_reason(tmp_path, changes, error, text):
    domain = Training(TrainerSettings(artifact_root=tmp_path.as_uri()))

    async def go():
        domain.create_job(spec(**changes), "run1", {}, "")
    with pytest.raises(error) as err:
        asyncio.run(go())
    assert text in err.value.reason
    assert domain.jobs.list()[0] == []  # no job was created


def test_an_adapter_merged_into_bfloat16_weights_is_refused(tmp_path):
    """bfloat16 cannot hold most of a LoRA delta: merging spec.policy.adapter_uri into such weights would
    lose it, so the request is refused naming the field (float32 takes the same adapter)."""
    domain = Training(TrainerSettings(artifact_root=tmp_path.as_uri()))
    policy = {"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro",
              "adapter_uri": f"{tmp_path.as_uri()}/runs/r0/adapters/x/v1"}

    async def go(dtype: str):
        domain.create_job(spec(policy=policy, config={"max_steps": 2, "dtype": dtype}), "run1", {}, "")
    with pytest.raises(InvalidArgument) as err:
        asyncio.run(go("bfloat16"))
    assert err.value.reason.startswith("spec.config.dtype") and "set dtype float32" in err.value.reason
    assert domain.jobs.list()[0] == []
    with pytest.raises(NotFound) as err:   # float32 passes the dtype rule and reaches the adapter's own check
        domain.validate(spec(policy=policy, config={"max_steps": 2, "dtype": "float32"}))
    assert "has no adapter_config.json" in err.value.reason


def test_an_adapter_to_merge_is_refused_with_vllm_rollouts(tmp_path):
    """The trainer would train on base + that adapter while the vLLM server samples from the base and the
    new LoRA only: another policy; refused naming spec.policy.adapter_uri before a job exists."""
    domain = Training(TrainerSettings(artifact_root=tmp_path.as_uri()))
    policy = {"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro",
              "adapter_uri": f"{tmp_path.as_uri()}/runs/r0/adapters/x/v1"}
    config = {"max_steps": 2, "rollout_backend": "vllm",
              "vllm": {"base_url": "http://127.0.0.1:1/v1", "adapter_dir": "a"}}
    with pytest.raises(InvalidArgument) as err:
        domain.validate(spec(policy=policy, config=config))
    assert err.value.reason.startswith("spec.policy.adapter_uri") and "roll out in-process" in err.value.reason
    assert domain.jobs.list()[0] == []


def test_config_struct_values_arrive_as_floats(tmp_path):
    domain = Training(TrainerSettings(artifact_root=tmp_path.as_uri()))
    cfg = domain.validate(spec(config={"values": {"num_generations": 4.0, "max_steps": 2.0}}))
    assert (cfg.num_generations, cfg.max_steps) == (4, 2)


def test_a_built_in_agents_key_is_part_of_a_jobs_identity():
    """A rebuilt `micro` keeps its name: its checkpoints tell the agents apart by their cache key."""
    from services.trainer.worker import built_in_key
    from trace_common.agents.resolve import base_agent_key

    assert built_in_key("micro") == base_agent_key("micro") and len(built_in_key("micro")) == 16
    assert built_in_key("file:///models/m") == built_in_key("smollm2-base") == ""
