"""A client cannot make a service call a URL, or send a credential, its operator did not allow
(docs/design.md "Trust boundaries"; trace_common/endpoints.py). Over gRPC on the embedded stack, every
request field that once chose an outbound URL or key -- the analyst's and generator's `llm`, the
calibration and rollout policies' `endpoint`, the user simulator, URL-like environment parameters --
is refused with PERMISSION_DENIED naming the field, and two real loopback listeners (one allowed
as a profile, one not) see no connection at all. The service's own secrets are in the environment
during the test, as a deployed service's are.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.support.endpoints import Listener, allowed
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.embedded import CALLERS, EMBEDDED_ENDPOINTS, BackgroundStack
from tracectl.run.config import load_config
from tracectl.run.endpoints import run_endpoints

pytestmark = pytest.mark.integration
R, A, E = (messages(s) for s in ("rollout", "analysis", "environment"))
SECRET = "service-secret-" + "z" * 16
STORE = t.EnvironmentRef(name="store")
CAP = [t.Capability(name="precondition_verification")]


def _analysis(llm: dict):
    return "analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
        rollout_uris=["file:///tmp/trace-none.jsonl"], mode=A.ANALYST_MODE_LLM, llm=t.LlmEndpoint(model="m", **llm)))


def _generation(**kw):
    return "environment", "CreateGenerationJob", E.CreateGenerationJobRequest(spec=E.GenerationSpec(
        capabilities=CAP, **{"target": STORE, "mode": E.GENERATION_MODE_LIBRARY, **kw}))


def _rollout(**kw):
    spec = {"environment": STORE, "policy": t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model="expert"),
            "tasks": R.TaskSelection(split="test", limit=1), **kw}
    return "rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(**spec))


HTTP = t.POLICY_BACKEND_OPENAI_HTTP
# (request builder of (allowed url, other url), field the refusal names)
CASES = [
    (lambda ok, bad: _analysis({"base_url": ok, "api_key_env": "TRACE_ANALYSIS_S3_SECRET_KEY"}), "spec.llm.api_key_env"),
    (lambda ok, bad: _analysis({"base_url": ok, "api_key_env": "TRACE_ANALYSIS_AUTH_TOKEN"}), "spec.llm.api_key_env"),
    (lambda ok, bad: _analysis({"base_url": bad}), "spec.llm.base_url"),
    (lambda ok, bad: _analysis({"profile": "not-configured"}), "spec.llm.profile"),
    (lambda ok, bad: _generation(mode=E.GENERATION_MODE_LLM, llm=t.LlmEndpoint(
        base_url=ok, model="m", api_key_env="TRACE_ENVIRONMENT_S3_SECRET_KEY")), "spec.llm.api_key_env"),
    (lambda ok, bad: _generation(mode=E.GENERATION_MODE_LLM, llm=t.LlmEndpoint(base_url=bad, model="m")),
     "spec.llm.base_url"),
    (lambda ok, bad: _generation(calibration_policy=t.PolicyRef(backend=HTTP, model="m", endpoint=bad)),
     "spec.calibration_policy.endpoint"),
    (lambda ok, bad: _generation(target=t.EnvironmentRef(name="store", params={"user_base_url": bad})),
     "spec.target.params"),
    (lambda ok, bad: _rollout(user_simulator=t.LlmEndpoint(base_url=ok, model="m",
                                                           api_key_env="TRACE_ROLLOUT_S3_SECRET_KEY")),
     "spec.user_simulator.api_key_env"),
    (lambda ok, bad: _rollout(user_simulator=t.LlmEndpoint(base_url=bad, model="m")), "spec.user_simulator.base_url"),
    (lambda ok, bad: _rollout(environment=t.EnvironmentRef(name="store", params={"user_base_url": bad,
                                                                                 "user_api_key": "k"})),
     "spec.environment.params"),
    (lambda ok, bad: _rollout(policy=t.PolicyRef(backend=HTTP, model="m", endpoint=bad)), "spec.policy.endpoint"),
    (lambda ok, bad: _rollout(policy=t.PolicyRef(backend=HTTP, model="m", endpoint_profile="not-configured")),
     "spec.policy.endpoint_profile"),
]


@pytest.fixture
def listeners(embedded_stack, monkeypatch):
    for service in ("ANALYSIS", "ENVIRONMENT", "ROLLOUT"):  # what a deployed service's environment holds
        monkeypatch.setenv(f"TRACE_{service}_S3_SECRET_KEY", SECRET)
        monkeypatch.setenv(f"TRACE_{service}_AUTH_TOKEN", SECRET)
    with Listener() as ok, Listener() as bad, allowed(embedded_stack, ok.base_url):
        yield ok, bad


@pytest.mark.parametrize(("build", "field"), CASES, ids=[c[1] + f"-{i}" for i, c in enumerate(CASES)])
def test_refused_with_permission_denied_and_nothing_leaves_the_machine(embedded_stack, listeners, build, field):
    ok, bad = listeners
    service, method, request = build(ok.base_url, bad.base_url)
    with pytest.raises(grpc.RpcError) as err:
        getattr(embedded_stack.stub(service), method)(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    details = err.value.details()
    assert details.startswith(field) or f"{field}:" in details, details
    assert SECRET not in details
    assert ok.connections == 0 and bad.connections == 0


def test_tracectl_makes_the_run_configs_endpoints_its_embedded_services_profiles(tmp_path, monkeypatch):
    """`tracectl run` passes run_endpoints(cfg) as EMBEDDED_ENDPOINTS; they join the services' own
    TRACE_<SERVICE>_ENDPOINTS profiles (the stack's environment is the operator's too)."""
    monkeypatch.setenv("TRACE_ANALYSIS_ENDPOINTS", '{"gateway": {"base_url": "https://gateway.example/v1"}}')
    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "tau2-retail-vllm.yaml")
    with BackgroundStack(tmp_path, overrides={EMBEDDED_ENDPOINTS: run_endpoints(cfg)}) as stack:
        got = {s: {n: p.base_url for n, p in stack.domain(s).endpoints.profiles.items()} for s in CALLERS}
    url = "http://trace-vllm:8000/v1"
    # one URL for a service is one profile: the generator shares the environment service's "base-agent"
    assert got == {"rollout": {"user-simulator": url}, "environment": {"base-agent": url},
                   "analysis": {"gateway": "https://gateway.example/v1", "analyst": url}}
