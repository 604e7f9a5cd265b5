"""Rollout jobs whose policy is an OpenAI-compatible endpoint: failures become failed episodes
with reasons or a failed job, never a crash; the service stays healthy.

The endpoint here is a scripted HTTP server (tests/support/fake_openai.py): it stands in for
the transport behaviour of a model server (timeouts, garbage, no tool calls). Real-model runs
are in test_vllm_*.py and test_base_agents.py. Each test's server is allowed as an endpoint profile
of the embedded rollout service for the test's duration (tests/support/endpoints.py), as an
operator's TRACE_ROLLOUT_ENDPOINTS would; the last tests check what happens when it is not.
"""

import json

import grpc
import pytest

from tests.support.endpoints import Listener, allowed
from tests.support.fake_openai import FakeOpenAI, completion
from trace_common.artifacts import open_uri
from trace_common.env import loads_jsonl
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
R = messages("rollout")


def _job(stack, base_url, limit=3, timeout_s=None, **policy):
    policy = policy or {"endpoint": base_url}
    spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_OPENAI_HTTP, model="served", **policy),
                         tasks=R.TaskSelection(split="test", limit=limit), max_turns=3)
    stub = stack.stub("rollout")
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec)).job
    final = [m.job for m in stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id), timeout=120)][-1]
    return stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=final.job_id))


def _trajs(resp):
    store, key = open_uri(next(o.uri for o in resp.job.outputs if o.kind == "trajectories"))
    return loads_jsonl(store.get_bytes(key))


CALL = {"id": "c1", "type": "function", "function": {"name": "find_user_id_by_email",
                                                      "arguments": json.dumps({"email": "x@example.com"})}}


@pytest.mark.parametrize(("reply", "check"), [
    # the model answers with text only, never a tool: the episodes fail (with the verifier's reason)
    ({"json": completion("I cannot help with that.")},
     lambda tr: not tr.success and not any(m.role == "tool" for m in tr.messages)),
    # the model calls a tool every turn: tool results come back, the episode fails for want of an answer
    ({"json": completion("", [CALL])}, lambda tr: any(m.role == "tool" for m in tr.messages)),
])
def test_model_behaviours_become_failed_episodes(embedded_stack, reply, check):
    srv = FakeOpenAI(default=reply)
    try:
        with allowed(embedded_stack, srv.base_url, services=("rollout",)):
            resp = _job(embedded_stack, srv.base_url)
    finally:
        srv.close()
    assert resp.job.state == t.JOB_STATE_SUCCEEDED
    trajs = _trajs(resp)
    assert len(trajs) == 3 and all(check(tr) for tr in trajs)
    assert all(tr.policy.model == "served" for tr in trajs)
    assert srv.requests and srv.requests[0]["model"] == "served" and srv.requests[0]["tools"]


@pytest.mark.parametrize("reply", [{"raw": b"<html>garbage</html>"}, {"status": 500, "json": {"error": "down"}}])
def test_unusable_endpoint_fails_the_job_with_reason(embedded_stack, reply):
    srv = FakeOpenAI(default=reply)
    try:
        with allowed(embedded_stack, srv.base_url, services=("rollout",)):
            resp = _job(embedded_stack, srv.base_url, limit=2)
    finally:
        srv.close()
    assert resp.job.state == t.JOB_STATE_FAILED
    assert resp.job.error.code == "UNAVAILABLE" and "policy backend" in resp.job.error.message
    assert not resp.job.outputs


def test_unreachable_endpoint_fails_the_job(embedded_stack):
    with allowed(embedded_stack, "http://127.0.0.1:1/v1", services=("rollout",)):
        resp = _job(embedded_stack, "http://127.0.0.1:1/v1", limit=2)
    assert resp.job.state == t.JOB_STATE_FAILED and resp.job.error.code == "UNAVAILABLE"
    stub = embedded_stack.stub("rollout")
    assert stub.ListRolloutJobs(R.ListRolloutJobsRequest()).jobs  # service still answers


# -- the endpoint is the operator's (trace_common/endpoints.py) ------------------------------------------

def test_a_named_profile_is_played_with_that_profiles_key_only(embedded_stack, monkeypatch):
    monkeypatch.setenv("TRACE_TEST_POLICY_KEY", "sk-policy-profile")
    monkeypatch.setenv("TRACE_ROLLOUT_S3_SECRET_KEY", "service-s3-secret-" + "s" * 8)
    with Listener() as srv, Listener() as other:
        with allowed(embedded_stack, srv.base_url, name="served-policy", api_key_env="TRACE_TEST_POLICY_KEY",
                     services=("rollout",)), allowed(embedded_stack, other.base_url, services=("rollout",)):
            resp = _job(embedded_stack, "", limit=2, endpoint_profile="served-policy")
        assert resp.job.state == t.JOB_STATE_SUCCEEDED, resp.job.error
        assert srv.authorizations() == {"Bearer sk-policy-profile"} and other.connections == 0
        assert b"service-s3-secret-" not in srv.seen()


REFUSED = [
    ({"endpoint": "{url}"}, "spec.policy.endpoint: '{url}' is not an endpoint the operator allows"),
    ({"endpoint_profile": "ghost"}, "spec.policy.endpoint_profile: 'ghost' is not an endpoint profile"),
]


@pytest.mark.parametrize(("policy", "fragment"), REFUSED)
def test_an_endpoint_the_operator_did_not_allow_is_refused_and_never_contacted(embedded_stack, policy, fragment):
    with Listener() as srv:
        policy = {k: v.format(url=srv.base_url) for k, v in policy.items()}
        with pytest.raises(grpc.RpcError) as err:
            _job(embedded_stack, "", **policy)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert fragment.format(url=srv.base_url) in err.value.details()
        assert "TRACE_ROLLOUT_ENDPOINTS" in err.value.details()
        assert srv.connections == 0
