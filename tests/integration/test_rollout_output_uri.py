"""A rollout request's `output_uri` stays inside the rollout service's store, under the request's
own run, and never over another job's results (an adversarial review wrote trajectories to an
arbitrary directory and over another run's rollouts with one valid request)."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
R = messages("rollout")


def _create(stack, output_uri: str, run_id: str):
    spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model="micro"),
                         tasks=R.TaskSelection(split="train", limit=1), max_turns=2, output_uri=output_uri)
    return stack.stub("rollout").CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id=run_id,
                                                                            request_id=uuid.uuid4().hex))


def _wait(stack, job_id: str):
    for msg in stack.stub("rollout").WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job_id)):
        last = msg.job
    return last


@pytest.mark.parametrize(("where", "code"), [
    ("file:///tmp/trace-outside/rollouts", "PERMISSION_DENIED"),           # outside the store
    ("s3://another-bucket/runs/mine/rollouts/x", "PERMISSION_DENIED"),     # another store
    ("{root}/runs/victim/rollouts/x", "PERMISSION_DENIED"),                # another run's rollouts
    ("{root}/runs/mine/analysis/x", "PERMISSION_DENIED"),                  # this run, not its rollouts
    ("{root}/runs/mine/rollouts", "PERMISSION_DENIED"),                    # the rollouts/ folder itself
    ("{root}/runs/mine/rollouts/a/../../../victim/rollouts/x", "INVALID_ARGUMENT"),  # `..`
])
def test_an_output_uri_outside_its_run_is_refused(embedded_stack, where, code):
    root = embedded_stack.domain("rollout").store.root_uri.rstrip("/")
    with pytest.raises(grpc.RpcError) as err:
        _create(embedded_stack, where.format(root=root), "mine")
    assert err.value.code().name == code and "output_uri" in err.value.details()
    assert not Path("/tmp/trace-outside").exists()


def test_an_output_uri_in_its_run_is_written_once(embedded_stack):
    store = embedded_stack.domain("rollout").store
    prefix = f"runs/mine/rollouts/named-{uuid.uuid4().hex[:8]}"
    job = _create(embedded_stack, store.uri_for(prefix), "mine").job
    assert _wait(embedded_stack, job.job_id).state == t.JOB_STATE_SUCCEEDED
    written = {i.key for i in store.list(prefix + "/")}
    assert f"{prefix}/trajectories.jsonl" in written
    before = store.get_bytes(f"{prefix}/trajectories.jsonl")
    with pytest.raises(grpc.RpcError) as err:                 # a second job may not overwrite it
        _create(embedded_stack, store.uri_for(prefix), "mine")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert store.get_bytes(f"{prefix}/trajectories.jsonl") == before
