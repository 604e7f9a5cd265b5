"""Calibration with the real base policy through gRPC on the embedded stack: a generation job whose
`calibration_policy` is an IN_PROCESS model directory (a saved tiny random Qwen3) plays it on a
library environment in the service; the validation report names the policy; refs that cannot load
fail clearly (at creation, or the job with FAILED_PRECONDITION) and leave the service healthy.

The tiny model is random, so calibration measures mean 0 at both of the family's levels and the
environment is REJECTED with the numbers in its reasons -- the band check working on a real model's
rewards. A random model never stops before max_tokens, so at the service defaults (16 groups x 8
samples, 256 tokens, two levels) one job takes ~3 minutes on 2 shared cores: that case is marked slow, and `small_stack` (an embedded
stack with calibration sized for tests: 4 x 4 episodes, 16 tokens) runs the same test in seconds.
"""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.endpoints import allowed
from tests.unit.trainer.helpers import save_store_model
from trace_common.artifacts import open_uri
from trace_common.grpc.client import Endpoint, messages, open_channel
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.embedded import BackgroundStack

pytestmark = pytest.mark.integration
E = messages("environment")
CAP = "precondition_verification"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_store_model(tmp_path_factory.mktemp("calibration-grpc") / "tiny")


@pytest.fixture(scope="module")
def small_stack(tmp_path_factory):
    stack = BackgroundStack(tmp_path_factory.mktemp("calibration-stack"), overrides={
        "validation_groups": 4, "validation_group_size": 4, "calibration_max_tokens": 16})
    yield stack
    stack.close()


def _spec(policy: t.PolicyRef | None) -> E.GenerationSpec:
    spec = E.GenerationSpec(capabilities=[t.Capability(name=CAP)], target=t.EnvironmentRef(name="store"),
                            mode=E.GENERATION_MODE_LIBRARY)
    if policy is not None:
        spec.calibration_policy.CopyFrom(policy)
    return spec


def _run(stack, spec, run_id="caltest"):
    stub = stack.stub("environment")
    job = stub.CreateGenerationJob(E.CreateGenerationJobRequest(spec=spec, run_id=run_id)).job
    watched = [m.job for m in stub.WatchGenerationJob(E.WatchGenerationJobRequest(job_id=job.job_id), timeout=300)]
    return stub.GetGenerationJob(E.GetGenerationJobRequest(job_id=job.job_id)), watched


def _report(record) -> dict:
    store, key = open_uri(record.validation_report.uri)
    return json.loads(store.get_bytes(key))


def _assert_healthy(stack) -> None:
    with open_channel(Endpoint(stack.targets["environment"])) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="")).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert stack.stub("environment").ListGenerationJobs(E.ListGenerationJobsRequest()).jobs


@pytest.mark.parametrize("stack_name", ["small_stack", pytest.param("embedded_stack", marks=pytest.mark.slow)])
def test_in_process_calibration_policy_plays_the_candidate(request, stack_name, model_dir):
    resp, watched = _run(request.getfixturevalue(stack_name), _spec(t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS,
                                                           model=str(model_dir))))
    assert resp.job.state == t.JOB_STATE_SUCCEEDED, resp.job.error
    assert any(j.progress.stage == "loading calibration policy" for j in watched)
    [record] = resp.environments
    assert record.status == E.VALIDATION_STATUS_REJECTED
    assert record.calibration_reward_mean == pytest.approx(0.0, abs=0.2)
    [reason] = record.rejection_reasons
    assert reason.startswith(f"calibration: base policy {model_dir} mean reward "
                             f"{record.calibration_reward_mean:.2f} outside the band [0.20, 0.60]"), reason
    report = _report(record)
    assert report["calibration_policy_info"]["backend"] == "POLICY_BACKEND_IN_PROCESS"
    assert report["calibration_policy_info"]["model"] == str(model_dir)
    assert report["calibration_policy_info"]["scripted_stand_in"] is False
    check = next(c for c in report["checks"] if c["name"] == "calibration")
    rewards = check["details"]["rewards"]   # the groups played: a hopeless level stops early (calibration_stop.py)
    assert 0 < len(rewards) <= report["config"]["groups"] and {len(g) for g in rewards} == {report["config"]["group_size"]}
    assert all(c["passed"] for c in report["checks"] if c["name"] != "calibration")
    # too hard at every level (write gates: 3, then 2 cases per instance), each level calibrated
    assert [(a["level"], a["status"]) for a in report["attempts"]] == [(3, "REJECTED"), (2, "REJECTED")]
    # the budget counts each attempt's played episodes only; progress counts calibration episodes as
    # they finish and marks a stopped level's unplayed ones done when it stops, so it never goes back
    episodes = report["config"]["groups"] * report["config"]["group_size"]
    played = [a["calibration_episodes"] for a in report["attempts"]]
    assert all(0 < n <= episodes for n in played) and played[-1] == len(rewards) * report["config"]["group_size"]
    counts = [j.progress.completed for j in watched if j.progress.total]
    assert counts == sorted(counts) and counts[-1] == 2 * episodes, counts
    assert len({c for c in counts if 0 < c < 2 * episodes}) >= min(played), counts
    assert watched[-1].progress.stage == "done" and resp.job.progress.completed == 2 * episodes
    assert any(j.progress.stage == "calibration episodes, 0/1 environments done" for j in watched)


def test_the_jobs_calibration_sampling_replaces_the_settings(small_stack, model_dir):
    """spec.calibration_sampling (what tracectl sends: the training temperature and the run's one
    completion cap) reaches the calibration policy over the service's settings (16 tokens here)."""
    spec = _spec(t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=str(model_dir)))
    spec.calibration_sampling.CopyFrom(t.SamplingParams(temperature=0.9, max_tokens=6))
    resp, _ = _run(small_stack, spec, run_id="caltest-sampling")
    assert resp.job.state == t.JOB_STATE_SUCCEEDED, resp.job.error
    info = _report(resp.environments[0])["calibration_policy_info"]
    assert (info["temperature"], info["max_tokens"], info["top_p"], info["top_k"]) == (0.9, 6, 1.0, 0)
    # a rejected candidate leaves no calibration batches: only an accepted level's episodes train an adapter
    assert _report(resp.environments[0])["calibration_batches"] == {}


def test_no_calibration_policy_is_a_named_scripted_fallback(embedded_stack):
    resp, watched = _run(embedded_stack, _spec(None), run_id="caltest-fallback")
    assert resp.job.state == t.JOB_STATE_SUCCEEDED, resp.job.error
    assert any("calibration by scripted stand-in skill-mixture@0.3" in j.progress.message for j in watched)
    info = _report(resp.environments[0])["calibration_policy_info"]
    assert info["scripted_stand_in"] is True and info["backend"] == "POLICY_BACKEND_SCRIPTED"
    assert info["note"].startswith("fallback: the job named no calibration_policy")


@pytest.mark.parametrize(("policy", "code", "fragment"), [
    # neither a built-in agent nor under the store or a model root (trace_common/model_refs.py)
    (t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model="no-such-agent"), "PERMISSION_DENIED",
     "spec.calibration_policy.model: 'no-such-agent' is not a model location"),
    (t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model="/nonexistent/trace-model"), "PERMISSION_DENIED",
     "allowed: a built-in base agent (micro"),
    (t.PolicyRef(backend=t.POLICY_BACKEND_OPENAI_HTTP, model="served"), "INVALID_ARGUMENT",
     "spec.calibration_policy.endpoint"),
])
def test_unloadable_refs_fail_at_creation(embedded_stack, policy, code, fragment):
    with pytest.raises(grpc.RpcError) as err:
        embedded_stack.stub("environment").CreateGenerationJob(E.CreateGenerationJobRequest(spec=_spec(policy)))
    assert err.value.code().name == code and fragment in err.value.details()
    _assert_healthy(embedded_stack)


@pytest.mark.parametrize(("make_policy", "code", "fragment"), [
    # config.json is there (creation passes) but the model cannot load: the job fails before judging
    (lambda bad: t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=str(bad)), "FAILED_PRECONDITION",
     "spec.calibration_policy.model: cannot load the calibration policy"),
    # an endpoint nobody serves: every turn fails; the candidate is not blamed, the job fails
    (lambda bad: t.PolicyRef(backend=t.POLICY_BACKEND_OPENAI_HTTP, model="served", endpoint="http://127.0.0.1:1/v1"),
     "UNAVAILABLE", "the calibration policy 'served' failed"),
])
def test_a_policy_that_cannot_play_fails_the_job_and_the_service_stays_healthy(embedded_stack, tmp_path, make_policy,
                                                                                code, fragment):
    bad = tmp_path / "broken-model"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    # the operator allows the unserved URL (else it is PERMISSION_DENIED at creation: test_endpoint_profiles.py)
    with allowed(embedded_stack, "http://127.0.0.1:1/v1", services=("environment",)):
        resp, _ = _run(embedded_stack, _spec(make_policy(bad)), run_id="caltest-bad")
    assert resp.job.state == t.JOB_STATE_FAILED
    assert resp.job.error.code == code and fragment in resp.job.error.message, resp.job.error
    assert not resp.environments  # nothing was judged, nothing registered
    _assert_healthy(embedded_stack)
