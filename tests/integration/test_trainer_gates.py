"""TrainerService TRAINING_KIND_GATES through gRPC on the embedded stack: two capability adapters
(random LoRAs on a tiny real store model, published into the stack's artifact store) composed over
the built-in store environment (two task types as the capability environments, the store's train
split as the target), with slot 0's provenance from a base rollout job on the target's train split
(the pipeline's rollout stage) -- warm start + 2 GRPO iterations on the target to SUCCEEDED, streamed
iterations with routing shares and the budget, and a `composition` output that `load_composition`
loads, a policy generates with, and the rollout service plays routed per token, per request and
softly per trajectory."""

from __future__ import annotations

import asyncio

import pytest
import torch
from google.protobuf.struct_pb2 import Struct
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from tests.unit.trainer.helpers import save_store_model
from trace_common.artifacts import open_store
from trace_common.grpc.client import messages
from trace_common.model_refs import UNCONFINED
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
T = messages("trainer")
CAPS = {"argument_formatting": "argument_format", "precondition_verification": "precondition_check"}  # slot order


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_store_model(tmp_path_factory.mktemp("gates-model"))


def publish_adapters(model_dir, root_uri: str, tmp_path) -> dict[str, str]:
    store = open_store(root_uri)
    uris = {}
    for seed, cap in enumerate(CAPS):
        torch.manual_seed(seed)
        peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                              LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
        peft.save_pretrained(str(tmp_path / cap))
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            info = store.put_file(f"runs/gates/adapters/{cap}/v1/{f}", tmp_path / cap / f)
        uris[cap] = info.uri
    return uris


def base_rollouts(embedded_stack, model_dir) -> str:
    """The base agent on 4 target training tasks (the rollout stage): its `trajectories` URI."""
    R = messages("rollout")
    spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"), samples_per_task=1, concurrency=4,
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=str(model_dir)),
                         tasks=R.TaskSelection(split="train", limit=4),
                         sampling=t.SamplingParams(temperature=1.0, max_tokens=8))
    stub = embedded_stack.stub("rollout")
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id="gates")).job
    list(stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id), timeout=600))
    got = stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=job.job_id)).job
    assert got.state == t.JOB_STATE_SUCCEEDED, got.error.message
    return next(o.uri for o in got.outputs if o.kind == "trajectories")


def test_gates_job_to_succeeded_with_a_composition_a_policy_generates_with(embedded_stack, model_dir, tmp_path):
    root = embedded_stack.root.resolve().as_uri()
    uris = publish_adapters(model_dir, root, tmp_path)
    values = Struct()
    # the tiny random model solves no store task: slot 0 takes all of the base's trajectories
    values.update({"max_steps": 2, "groups_per_batch": 2, "num_generations": 2, "max_completion_length": 8,
                   "max_turns": 2, "save_steps": 1, "warm_start_steps": 5, "warm_start_episodes": 2,
                   "early_stop_uninformative_iterations": 0, "guidance_fraction": 0.0, "max_resample_rounds": 0,
                   "warm_start_labels": "provenance",   # the service path of slot 0's provenance files
                   "base_provenance_uris": [base_rollouts(embedded_stack, model_dir)], "base_provenance": "all"})
    envs = [t.EnvironmentRef(name="store", params={"task_types": tt}) for tt in CAPS.values()]
    envs.append(t.EnvironmentRef(name="store", params={"split": "train"}))  # the target's training tasks
    spec = T.TrainingSpec(kind=T.TRAINING_KIND_GATES, capability="gates-moe", environments=envs, adapter_uris=uris,
                          policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=str(model_dir)),
                          config=t.Config(values=values), executor=T.EXECUTOR_LOCAL)
    stub = embedded_stack.stub("trainer")
    job = stub.CreateTrainingJob(T.CreateTrainingJobRequest(spec=spec, run_id="gates")).job
    updates = list(stub.WatchTrainingJob(T.WatchTrainingJobRequest(job_id=job.job_id), timeout=600))
    final = updates[-1].job
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error.message
    iterations = [u.iteration for u in updates if u.HasField("iteration")]
    assert [i.iteration for i in iterations] == [0, 1, 2]                   # 0 = the warm start
    assert {"reward_mean", "informative_group_fraction", "pass_rate", "rollouts_total",
            "routing_share_base", "prompt_tokens_total", "completion_tokens_total"} <= set(iterations[-1].values)
    assert iterations[0].values["provenance_examples_base"] == 2  # slot 0: warm_start_episodes of the base's
    assert final.metrics["rollouts_total"] == 2 * 2 + 2 * 2 * 2   # provenance played here + GRPO (target only)
    assert final.metrics["warm_start_rollouts"] == 2 * 2
    outputs = {o.kind: o for o in final.outputs}
    assert {"composition", "gates"} <= set(outputs) and len(outputs["composition"].sha256) == 64
    assert "/runs/gates/moe/gates-moe/composition.json" in outputs["composition"].uri
    cks = stub.ListCheckpoints(T.ListCheckpointsRequest(job_id=job.job_id)).checkpoints
    assert [c.iteration for c in cks] == [1, 2]

    from trace_common.env import Message
    from trace_common.moe.composition_io import load_composition
    from trace_common.policy.base import PolicyRequest, SamplingParams
    from trace_common.policy.transformers_backend import TransformersPolicy

    loaded = load_composition(outputs["composition"].uri, cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    assert loaded.expert_names == ["base", *CAPS]
    policy = TransformersPolicy.from_model(loaded.composed.base, loaded.tokenizer, max_wait_s=0.0)

    async def generate():
        try:
            return await policy.generate([PolicyRequest(messages=[Message.system("You are the store agent."),
                                                                  Message.user("Cancel order 12.")],
                                                        tools=[], params=SamplingParams(temperature=0.0,
                                                                                        max_tokens=6))])
        finally:
            await policy.close()
    with loaded.composed.capture_routing() as trace:
        turns = asyncio.run(generate())
    assert turns[0].completion_token_ids and trace.num_calls >= 1

    # The evaluation's TRACE arms: the rollout service plays the composition in-process, routed per
    # token, per request (one slot per request picked by the gates) or softly per trajectory (the
    # ablation: the gates' mean softmax over the prompt mixes the adapters), with the base agent as model.
    R = messages("rollout")
    for routing in ("token", "per_request", "soft_trajectory"):
        rspec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"), samples_per_task=1, concurrency=4,
                              policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=str(model_dir),
                                                 composition_uri=outputs["composition"].uri, routing=routing),
                              tasks=R.TaskSelection(split="test", limit=4),
                              sampling=t.SamplingParams(temperature=0.0, max_tokens=8))
        rstub = embedded_stack.stub("rollout")
        rjob = rstub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=rspec, run_id="gates")).job
        list(rstub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=rjob.job_id), timeout=600))
        got = rstub.GetRolloutJob(R.GetRolloutJobRequest(job_id=rjob.job_id))
        assert got.job.state == t.JOB_STATE_SUCCEEDED, (routing, got.job.error.message)
        assert got.summary.episodes == 4
