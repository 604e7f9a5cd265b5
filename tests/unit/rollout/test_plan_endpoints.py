"""runner.plan decides every outbound endpoint of a rollout from the service's endpoint profiles:
the HTTP policy's and the tau2 user simulator's URL and key come from a profile, the key reaches
the environment factory but never a trajectory, and requests that would choose a URL or key
themselves are refused before a job exists.
"""

from __future__ import annotations

import pytest

from services.rollout import runner
from services.rollout.specs import RolloutSpecModel
from tests.support.tau2_data import require_tau2_data
from trace_common.endpoints import Endpoints
from trace_common.errors import InvalidArgument, PermissionDenied

USER_URL, POLICY_URL = "http://user-sim.example:8000/v1", "http://vllm.example:8000/v1"
KEY_ENV = "TRACE_TEST_USER_SIM_KEY"
ENDPOINTS = Endpoints({"user-sim": {"base_url": USER_URL, "api_key_env": KEY_ENV},
                       "vllm": {"base_url": POLICY_URL, "models": ["Qwen/*"]}}, "TRACE_ROLLOUT_ENDPOINTS")
SCRIPTED = {"backend": "POLICY_BACKEND_SCRIPTED", "model": "expert"}


def _spec(**kw) -> RolloutSpecModel:
    return RolloutSpecModel.model_validate({"environment": {"name": "store"}, "policy": SCRIPTED,
                                            "tasks": {"split": "test", "limit": 2}, **kw})


def _data_roots() -> list:
    """The operator's data roots of these plans: the tau2 test data (a named data directory must lie under one)."""
    return [require_tau2_data()]


def _tau2(**kw) -> RolloutSpecModel:
    retail = (require_tau2_data() / "retail").resolve()
    return _spec(environment={"name": "tau2-retail", "uri": retail.as_uri()},  # plan loads no model
                 policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, **kw)


def test_the_user_simulator_comes_from_its_profile_and_its_key_is_never_recorded(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-user-sim")
    p = runner.plan(_tau2(user_simulator={"profile": "user-sim", "model": "qwen", "timeout_seconds": 5}), ENDPOINTS,
                    _data_roots())
    assert p.params["user_base_url"] == USER_URL and p.params["user_model"] == "qwen"
    assert p.params["user_api_key"] == "sk-user-sim"           # to the factory ...
    assert "user_api_key" not in p.recorded_params             # ... never into a trajectory
    assert p.recorded_params["user_base_url"] == USER_URL and p.recorded_params["user_timeout"] == "5.0"


def test_an_unset_profile_key_fails_the_plan(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(Exception, match=f"api_key_env={KEY_ENV!r} names an unset environment variable"):
        runner.plan(_tau2(user_simulator={"profile": "user-sim", "model": "qwen"}), ENDPOINTS, _data_roots())


def test_the_http_policy_is_checked_by_plan():
    p = runner.plan(_spec(policy={"backend": "POLICY_BACKEND_OPENAI_HTTP", "model": "Qwen/Qwen3-8B",
                                  "endpoint": POLICY_URL}), ENDPOINTS)
    assert p.spec.policy.endpoint_checked and p.spec.policy.endpoint_profile == "vllm"


REFUSED = [
    ({"environment": {"name": "store", "params": {"user_base_url": "http://evil/v1"}}}, PermissionDenied,
     "spec.environment.params: parameter(s) user_base_url"),
    ({"environment": {"name": "store", "params": {"user_api_key": "sk-mine"}}}, PermissionDenied,
     "spec.environment.params: parameter(s) user_api_key"),
    ({"user_simulator": {"base_url": "http://evil:1/v1", "model": "m"}}, PermissionDenied,
     "spec.user_simulator.base_url: 'http://evil:1/v1' is not an endpoint the operator allows"),
    ({"user_simulator": {"profile": "user-sim", "model": "m", "api_key_env": "TRACE_ROLLOUT_S3_SECRET_KEY"}},
     PermissionDenied, "spec.user_simulator.api_key_env: a request cannot name a credential"),
    ({"policy": {"backend": "POLICY_BACKEND_OPENAI_HTTP", "model": "m", "endpoint": "http://evil:1/v1"}},
     PermissionDenied, "spec.policy.endpoint: 'http://evil:1/v1' is not an endpoint the operator allows"),
    ({"policy": {"backend": "POLICY_BACKEND_OPENAI_HTTP", "model": "gpt-4.1", "endpoint_profile": "vllm"}},
     PermissionDenied, "spec.policy.model: model 'gpt-4.1' is not allowed on profile 'vllm'"),
    ({"policy": {"backend": "POLICY_BACKEND_OPENAI_HTTP", "model": "m"}}, InvalidArgument,
     "spec.policy.endpoint_profile: expected the endpoint profile to call"),
]


@pytest.mark.parametrize(("kw", "error", "fragment"), REFUSED)
def test_requests_choosing_a_url_or_key_are_refused(kw, error, fragment):
    with pytest.raises(error) as err:
        runner.plan(_spec(**kw), ENDPOINTS)
    assert fragment in str(err.value), str(err.value)


def test_without_profiles_no_http_policy_is_allowed():
    with pytest.raises(PermissionDenied, match="TRACE_ROLLOUT_ENDPOINTS is empty"):
        runner.plan(_spec(policy={"backend": "POLICY_BACKEND_OPENAI_HTTP", "model": "m", "endpoint": POLICY_URL}))
