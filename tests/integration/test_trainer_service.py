"""TrainerService through gRPC on the embedded stack: a short GRPO job on the built-in store
environment (precondition_check only) with a tiny real model runs as a worker process to
SUCCEEDED, streams one IterationMetrics per iteration, lists its checkpoints and publishes a
PEFT adapter that PEFT loads unchanged; bad requests get the right status and a fix."""

from __future__ import annotations

import time

import grpc
import httpx
import pytest
import torch

from tests.unit.trainer.helpers import save_store_model
from trace_common.artifacts import open_uri
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
T = messages("trainer")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_store_model(tmp_path_factory.mktemp("store-model"))


def spec(model_dir, env="store", **config) -> object:
    from google.protobuf.struct_pb2 import Struct

    values = Struct()
    values.update({"max_steps": 2, "groups_per_batch": 2, "num_generations": 2, "max_completion_length": 8,
                   "max_turns": 2, "save_steps": 1, "lora_r": 4, "early_stop_uninformative_iterations": 0,
                   "guidance_fraction": 0.0, **config})
    return T.TrainingSpec(kind=T.TRAINING_KIND_ADAPTER, capability="precondition_verification",
                          environments=[t.EnvironmentRef(name=env, params={"task_types": "precondition_check"})],
                          policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=str(model_dir)),
                          config=t.Config(values=values), executor=T.EXECUTOR_LOCAL)


def test_training_job_to_succeeded_with_streamed_iterations(embedded_stack, model_dir, tmp_path):
    stub = embedded_stack.stub("trainer")
    job = stub.CreateTrainingJob(T.CreateTrainingJobRequest(spec=spec(model_dir), run_id="trn")).job
    updates = list(stub.WatchTrainingJob(T.WatchTrainingJobRequest(job_id=job.job_id), timeout=600))
    final = updates[-1].job
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error.message
    iterations = [u.iteration for u in updates if u.HasField("iteration")]
    assert [i.iteration for i in iterations] == [1, 2]                       # one message per iteration
    for it in iterations:
        assert {"reward_mean", "reward_std", "pass_rate", "informative_group_fraction", "step_seconds",
                "tokens_per_second", "policy_version"} <= set(it.values)
        if "loss" in it.values:  # an update happened (some group was informative)
            assert {"entropy", "clip_fraction", "grad_norm"} <= set(it.values)
    assert final.metrics["iteration"] == 2.0 and "informative_group_fraction" in final.metrics
    got = stub.GetTrainingJob(T.GetTrainingJobRequest(job_id=job.job_id))
    assert [r.iteration for r in got.recent_iterations] == [1, 2]
    cks = stub.ListCheckpoints(T.ListCheckpointsRequest(job_id=job.job_id)).checkpoints
    assert [c.iteration for c in cks] == [1, 2] and all(len(c.artifact.sha256) == 64 for c in cks)
    outputs = {o.kind: o for o in final.outputs}
    adapter = outputs["adapter"]
    assert "/runs/trn/adapters/precondition_verification/v1/adapter_model.safetensors" in adapter.uri
    # the adapter loads in PEFT unchanged, from bytes verified against the recorded sha256
    dest = tmp_path / "adapter"
    for kind in ("adapter", "adapter_config"):
        store, key = open_uri(outputs[kind].uri)
        store.get_file(key, dest / key.rsplit("/", 1)[-1])
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(dest))
    with torch.no_grad():
        assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size
    # the per-iteration values are exported for Prometheus, labelled by capability
    text = httpx.get(embedded_stack.metrics_urls["trainer"], timeout=5).text
    samples = {ln.split(" ")[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("trace_")}
    cap = '{capability="precondition_verification"}'
    assert samples[f"trace_trainer_iterations_total{cap}"] >= 2
    for name in ("reward_mean", "pass_rate", "informative_group_fraction"):
        assert f"trace_trainer_{name}{cap}" in samples
    assert samples[f"trace_trainer_step_duration_seconds_count{cap}"] >= 2


@pytest.mark.parametrize("changes, code, text", [
    (dict(env="no-such-env"), grpc.StatusCode.NOT_FOUND, "not registered"),
    (dict(num_generations=1), grpc.StatusCode.INVALID_ARGUMENT, "config.num_generations"),
    (dict(kl_coef=0.1), grpc.StatusCode.INVALID_ARGUMENT, "use 'beta'"),
])
def test_bad_requests(embedded_stack, model_dir, changes, code, text):
    env = changes.pop("env", "store")
    with pytest.raises(grpc.RpcError) as err:
        embedded_stack.stub("trainer").CreateTrainingJob(
            T.CreateTrainingJobRequest(spec=spec(model_dir, env=env, **changes), run_id="bad"))
    assert err.value.code() == code and text in err.value.details()


def test_a_rerun_reattaches_to_its_live_job(embedded_stack, model_dir, capsys):
    """`tracectl run` re-run while its training job still runs (a deployed trainer outlives the CLI):
    the same spec follows the live job; another spec for the same checkpoints is refused."""
    from tracectl.run.jobs import JobRunner, spec_digest

    runner = JobRunner(conn=embedded_stack)
    same = spec(model_dir, max_steps=3)
    labels = {"capability": "precondition_verification"}
    live = runner.start("trainer", same, "reattach", labels={**labels, "spec_sha": spec_digest(same)})
    with pytest.raises(grpc.RpcError) as err:          # another config, same run + capability: refused
        runner.run("trainer", spec(model_dir, max_steps=4), "reattach", "other", labels=labels, attach=True)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and live.job_id in err.value.details()
    done = runner.run("trainer", same, "reattach", "again", labels=labels, attach=True)
    assert done.job.job_id == live.job_id and done.job.state == t.JOB_STATE_SUCCEEDED
    assert f"re-attaching to live trainer job {live.job_id}" in capsys.readouterr().err
    # once it has ended, the same request trains anew (resuming from the job's checkpoints)
    again = runner.run("trainer", same, "reattach", "after", labels=labels, attach=True)
    assert again.job.job_id != live.job_id and again.job.state == t.JOB_STATE_SUCCEEDED


def test_following_a_job_outlives_the_watch_deadline(embedded_stack, model_dir, monkeypatch, capsys):
    """A job that runs longer than one Watch stream may last (the channel's deadline, here 3 s) is
    followed to its end over real gRPC: each stream ends at DEADLINE_EXCEEDED and is opened again.
    (grpc ends a call whose deadline comes from the service config about 1 s early, grpc/grpc#34547,
    so a 1 s deadline would end every stream before its first message.)"""
    from trace_common.grpc import client
    from tracectl.run.jobs import JobRunner

    real = client.default_timeout
    monkeypatch.setattr(client, "default_timeout", lambda m: 3.0 if m.startswith("Watch") else real(m))
    channel = client.open_channel(client.Endpoint(embedded_stack.targets["trainer"]))  # reads the 3 s
    opened = []

    class ShortWatches:  # what JobRunner needs of a connection: stubs on that channel, Watch calls counted
        def stub(self, service):
            inner = client.stub(service, channel)

            class Counting:
                def __getattr__(self, name):
                    method = getattr(inner, name)
                    if not name.startswith("Watch"):
                        return method
                    return lambda *a, **kw: opened.append(time.monotonic()) or method(*a, **kw)
            return Counting()

    try:
        runner = JobRunner(conn=ShortWatches())
        job = runner.start("trainer", spec(model_dir, max_steps=8), "short-watch")
        done = runner.wait("trainer", job.job_id, "train")
    finally:
        channel.close()
    assert done.job.state == t.JOB_STATE_SUCCEEDED and done.job.progress.completed == 8
    assert len(opened) >= 2, "the job ended within one Watch stream: make it longer than the deadline"
    assert min(b - a for a, b in zip(opened, opened[1:], strict=False)) > 1.0  # each stream lasted to its deadline
    assert "train: succeeded" in capsys.readouterr().err
