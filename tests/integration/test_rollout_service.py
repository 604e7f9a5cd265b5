"""Rollout jobs through gRPC: trajectories stored, verified and read back; cancel; bad input."""

import time

import grpc
import pytest

from trace_common.artifacts import open_uri
from trace_common.env import loads_jsonl
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
R = messages("rollout")


def _spec(model="expert", env="store", samples=2, limit=20, **kw):
    return R.RolloutSpec(environment=t.EnvironmentRef(name=env),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model=model),
                         tasks=R.TaskSelection(split="test", limit=limit), samples_per_task=samples, **kw)


def _run(stub, spec, run_id="rt"):
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id=run_id)).job
    states = [m.job.state for m in stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id), timeout=120)]
    return stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=job.job_id)), states


@pytest.mark.parametrize(("model", "expected_pass"), [("expert:perfect", 1.0), ("expert", None)])
def test_rollout_job_stores_verified_trajectories(embedded_stack, model, expected_pass):
    resp, states = _run(embedded_stack.stub("rollout"), _spec(model))
    assert states[-1] == t.JOB_STATE_SUCCEEDED and t.JOB_STATE_RUNNING in states
    uri = next(o.uri for o in resp.job.outputs if o.kind == "trajectories")
    assert uri.startswith(embedded_stack.root.resolve().as_uri()) and "/runs/rt/rollouts/" in uri
    store, key = open_uri(uri)
    trajs = loads_jsonl(store.get_bytes(key))  # sha256-verified read
    assert len(trajs) == 40 == resp.summary.episodes
    assert sorted((int(tr.task_id), tr.sample_index) for tr in trajs) == [(tr_seed, k) for tr_seed in
                                                                          range(1_000_000, 1_000_020) for k in (0, 1)]
    successes = sum(tr.success for tr in trajs)
    assert resp.summary.successes == successes
    assert resp.summary.pass_rate == pytest.approx(successes / 40)
    assert resp.summary.pass_rate_ci_low <= resp.summary.pass_rate <= resp.summary.pass_rate_ci_high
    assert all(tr.policy.model == f"scripted:{model}" for tr in trajs)
    if expected_pass is not None:
        assert resp.summary.pass_rate == expected_pass
    else:
        assert 0 < resp.summary.pass_rate < 1 and any(tr.diagnostics for tr in trajs)


def test_same_spec_same_trajectories(embedded_stack):
    a, _ = _run(embedded_stack.stub("rollout"), _spec(limit=8, seed=5))
    b, _ = _run(embedded_stack.stub("rollout"), _spec(limit=8, seed=5))

    def load(resp):
        store, key = open_uri(resp.job.outputs[0].uri)
        return [(tr.task_id, tr.reward, [m.to_dict() for m in tr.messages]) for tr in loads_jsonl(store.get_bytes(key))]
    assert load(a) == load(b)


def test_cancel_publishes_nothing(embedded_stack):
    stub = embedded_stack.stub("rollout")
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(
        spec=_spec("expert:perfect@50ms", limit=200, concurrency=2), run_id="cancelled")).job
    deadline = time.time() + 30
    while stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=job.job_id)).job.progress.completed < 2:
        assert time.time() < deadline
        time.sleep(0.05)
    stub.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=job.job_id))
    final = [m.job for m in stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id))][-1]
    assert final.state == t.JOB_STATE_CANCELLED and not final.outputs
    assert not list((embedded_stack.root / "runs" / "cancelled").rglob("*.jsonl"))


@pytest.mark.parametrize(("spec", "code", "fragment"), [
    (_spec(env="nosuch"), "NOT_FOUND", "not registered"),
    (R.RolloutSpec(environment=t.EnvironmentRef(name="store"), policy=t.PolicyRef(
        backend=t.POLICY_BACKEND_SCRIPTED, model="expert"), tasks=R.TaskSelection(split="nosplit")),
     "NOT_FOUND", "no split"),
    (R.RolloutSpec(environment=t.EnvironmentRef(name="store"), policy=t.PolicyRef(
        backend=t.POLICY_BACKEND_SCRIPTED, model="expert"), tasks=R.TaskSelection(task_ids=["abc"])),
     "INVALID_ARGUMENT", "task_ids"),
    (R.RolloutSpec(environment=t.EnvironmentRef(name="store", params={"colour": "red"}), policy=t.PolicyRef(
        backend=t.POLICY_BACKEND_SCRIPTED, model="expert")), "INVALID_ARGUMENT", "environment.params"),
    (_spec(model="genius"), "INVALID_ARGUMENT", "spec.policy.model"),
    (R.RolloutSpec(environment=t.EnvironmentRef(name="store"), policy=t.PolicyRef(
        backend=t.POLICY_BACKEND_SCRIPTED, model="expert@x")), "INVALID_ARGUMENT", "scripted policy"),
])
def test_bad_rollout_requests(embedded_stack, spec, code, fragment):
    stub = embedded_stack.stub("rollout")
    with pytest.raises(grpc.RpcError) as info:
        stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec))
    assert info.value.code().name == code and fragment in info.value.details()


def test_list_rollout_environments(embedded_stack):
    envs = {e.name: e for e in embedded_stack.stub("rollout").ListRolloutEnvironments(
        R.ListRolloutEnvironmentsRequest()).environments}
    assert envs["store"].split_sizes["test"] == 600 and len(envs["store"].tools) >= 5
