"""The trainer's config check (ValidateTrainingConfig's domain, services/trainer/configs.py), guided
rollouts refused at job creation when the environment has no hints, and replayed iteration
events counted once in the Prometheus series."""

from __future__ import annotations

import asyncio

import pytest

from services.trainer import metrics as m
from services.trainer.configs import validate_training_config
from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.jobs import JobContext

ADAPTER, GATES = "TRAINING_KIND_ADAPTER", "TRAINING_KIND_GATES"


@pytest.mark.parametrize("kind, values, path, fragments", [
    (ADAPTER, {"num_generatoins": 4}, "training.grpo",
     ["training.grpo.num_generatoins: unknown field; did you mean 'num_generations'?", "GRPOConfig"]),
    (ADAPTER, {"lerning_rate": 1e-4}, "training.grpo", ["training.grpo.lerning_rate: unknown field; did you mean "
                                                        "'learning_rate'?"]),
    (ADAPTER, {"group_size": 8}, "training.grpo", ["training.grpo.group_size: unknown field; use 'num_generations'"]),
    (ADAPTER, {"qqqq": 1}, "training.grpo", ["training.grpo.qqqq: unknown field ("]),          # nothing close
    (ADAPTER, {"max_steps": "many"}, "training.grpo", ["training.grpo.max_steps: Input should be a valid integer"]),
    (ADAPTER, {"max_steps": 2.5}, "", ["config.max_steps: Input should be a valid integer"]),   # default path
    (ADAPTER, {"scale_rewards": "grup"}, "training.grpo", ["training.grpo.scale_rewards: Input should be 'group', "
                                                           "'batch' or 'none'; did you mean 'group'?"]),
    (ADAPTER, {"learning_rate": -1}, "training.grpo", ["training.grpo.learning_rate: Input should be greater"]),
    (ADAPTER, {"epsilon": 0.3, "epsilon_high": 0.1}, "training.grpo", ["training.grpo: epsilon_high=0.1 < epsilon"]),
    (ADAPTER, {"rollout_backend": "vllm", "vllm": {"base_ur": "http://v:8000/v1", "adapter_dir": "/a"}},
     "training.grpo", ["training.grpo.vllm.base_ur: unknown field; did you mean 'base_url'?"]),
    (ADAPTER, {"warm_start_steps": 5}, "training.grpo", ["training.grpo.warm_start_steps: unknown field"]),  # gates only
    (GATES, {"warm_start_step": 5}, "gates.config", ["gates.config.warm_start_step: unknown field; did you mean "
                                                      "'warm_start_steps'?", "GateGRPOConfig"]),
    (GATES, {"target_fraction": 0.5}, "gates.config", ["gates.config.target_fraction: GRPO on the gates plays",
                                                        "remove the field"]),                  # the model's own words
    (GATES, {"heldout_fraction": 1.0}, "gates.config", ["gates.config.heldout_fraction: Input should be less than 1"]),
    # a removed field: named under the caller's path, with what replaced it (both job kinds)
    (ADAPTER, {"guidance_position": "user"}, "training.grpo",
     ["training.grpo.guidance_position: guidance is always shown as an <expert_guidance> block", "remove the field"]),
    (GATES, {"guidance_position": "system"}, "gates.config",
     ["gates.config.guidance_position: guidance is always shown", "remove the field"]),
    ("TRAINING_KIND_UNSPECIFIED", {}, "", ["kind: expected TRAINING_KIND_ADAPTER or TRAINING_KIND_GATES"]),
])
def test_bad_configs_name_the_callers_field(kind, values, path, fragments):
    with pytest.raises(InvalidArgument) as err:
        validate_training_config(kind, values, path)
    for fragment in fragments:
        assert fragment in err.value.reason, err.value.reason


@pytest.mark.parametrize("kind, values, expected", [
    (ADAPTER, {}, {"max_steps": 100, "guidance_fraction": 0.0}),                   # every default filled in
    (ADAPTER, {"max_steps": 3.0, "num_generations": 4.0}, {"max_steps": 3, "num_generations": 4}),  # Struct floats
    (GATES, {"warm_start_steps": 20.0}, {"warm_start_steps": 20, "max_steps": 20}),
])
def test_good_configs_come_back_normalized(kind, values, expected):
    config = validate_training_config(kind, values, "training.grpo").model_dump()
    assert {k: config[k] for k in expected} == expected
    assert all(type(config[k]) is type(v) for k, v in expected.items())


def spec(**config) -> TrainingSpecModel:
    return TrainingSpecModel.model_validate(dict(
        kind=ADAPTER, capability="precondition_verification",
        environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
        policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config={"max_steps": 2, **config}))


@pytest.mark.parametrize("config, refused", [
    ({"guidance_fraction": 0.25, "num_generations": 4}, True),      # the store target supplies no hints
    ({"guidance_fraction": 0.5, "num_generations": 8}, True),
    ({"guidance_fraction": 0.0, "num_generations": 4}, False),      # no guided episodes asked for
    ({"guidance_fraction": 0.25, "num_generations": 4, "guidance_text": "Check the order first."}, False),  # override
])
def test_guidance_from_an_environment_without_hints_is_refused_at_creation(tmp_path, config, refused):
    domain = Training(TrainerSettings(artifact_root=tmp_path.as_uri()))

    async def go():
        return domain.create_job(spec(**config), "run1", {}, "")

    if refused:
        with pytest.raises(FailedPrecondition, match="supplies no guidance"):
            asyncio.run(go())
        assert domain.jobs.list()[0] == []          # before any job (and any model load)
    else:
        assert domain.validate(spec(**config)).guidance_fraction == config["guidance_fraction"]


def _sample(name: str, capability: str) -> float:
    return m.M.registry.get_sample_value(name, {"capability": capability}) or 0.0


@pytest.mark.parametrize("replayed, counted", [(False, 1), (True, 0)])
def test_a_replayed_iteration_is_counted_once(tmp_path, replayed, counted):
    domain = Training(TrainerSettings(artifact_root=tmp_path.as_uri()))
    cap = f"replay_{str(replayed).lower()}"
    event = {"event": "iteration", "iteration": 3, "values": {"reward_mean": 0.5, "trained_tokens": 100.0,
                                                              "step_seconds": 2.0}}
    if replayed:
        event["replayed"] = True

    async def go():
        release = asyncio.Event()

        async def body(ctx):
            await release.wait()
            return {}

        rec = domain.jobs.submit("training", body, run_id="r")
        before = [_sample(n, cap) for n in ("trace_trainer_iterations_total", "trace_trainer_tokens_total",
                                            "trace_trainer_step_duration_seconds_count")]
        domain._on_event(JobContext(domain.jobs, rec.job_id), cap, event)
        after = [_sample(n, cap) for n in ("trace_trainer_iterations_total", "trace_trainer_tokens_total",
                                           "trace_trainer_step_duration_seconds_count")]
        job = domain.jobs.get(rec.job_id)
        release.set()
        return before, after, job

    before, after, job = asyncio.run(go())
    assert [a - b for a, b in zip(after, before, strict=True)] == [counted, 100.0 * counted, counted]
    # the job itself takes the iteration either way (a resumed job's totals arrive this way)
    assert job.completed == 3 and job.metrics["reward_mean"] == 0.5
    assert _sample("trace_trainer_reward_mean", cap) == 0.5
