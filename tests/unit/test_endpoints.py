"""The operator's endpoint profiles (trace_common/endpoints.py): what a request may name, what is
refused with which code, the one api-key rule, and the policy factory failing closed. The HTTP
cases use a real loopback listener that counts every connection (tests/support/endpoints.py).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from services.analysis.settings import AnalysisSettings
from services.environment.settings import EnvironmentSettings
from services.rollout.settings import RolloutSettings
from tests.support.endpoints import Listener
from trace_common.endpoints import Endpoints, read_api_key, refuse_outbound_params
from trace_common.env import Message
from trace_common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from trace_common.llm import LlmConfig
from trace_common.model_refs import UNCONFINED
from trace_common.policy.base import PolicyRequest, SamplingParams
from trace_common.policy.factory import open_policy
from trace_common.policy.http_backend import OpenAIPolicy
from trace_common.specs import LlmEndpointModel, PolicyRefModel

A, B = "http://analyst.example:8000/v1", "http://open.example:9000/v1"
KEY_ENV = "TRACE_TEST_PROFILE_KEY"
HTTP = "POLICY_BACKEND_OPENAI_HTTP"
SETTING = "TRACE_ANALYSIS_ENDPOINTS"


@pytest.fixture
def endpoints() -> Endpoints:
    return Endpoints({"analyst": {"base_url": A, "api_key_env": KEY_ENV, "models": ["standin*"]},
                      "open": {"base_url": B}}, SETTING)


# -- the settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [AnalysisSettings, EnvironmentSettings, RolloutSettings])
def test_every_calling_service_reads_its_endpoints_setting(monkeypatch, cls):
    prefix = cls.model_config["env_prefix"]
    monkeypatch.setenv(f"{prefix}ENDPOINTS", json.dumps({"vllm": {"base_url": "http://vllm:8000/v1/",
                                                                  "models": ["Qwen/*"]}}))
    (name, p), = cls().endpoints.items()
    assert (name, p.base_url, p.api_key_env, p.models) == ("vllm", "http://vllm:8000/v1", "", ("Qwen/*",))


@pytest.mark.parametrize(("value", "fragment"), [
    ({"a": {"base_url": "ftp://x/v1"}}, "must be an http(s) URL"),
    ({"Bad Name": {"base_url": A}}, "endpoint profile name 'Bad Name'"),
    ({"a": {"base_url": A}, "b": {"base_url": A + "/"}}, "share base_url"),
    ({"a": {"base_url": A, "api_key_env": "TRACE_ANALYSIS_AUTH_TOKEN"}}, "the service's own secrets"),
    ({"a": {"base_url": A, "api_key_env": "TRACE_ROLLOUT_S3_SECRET_KEY"}}, "the service's own secrets"),
    ({"a": {"base_url": A, "api_key_env": "TRACE_AUTH_TOKEN"}}, "the service's own secrets"),
    ({"a": {"base_url": A, "api_key_env": "not-a-name"}}, "must be an environment variable name"),
    ({"a": {"base_url": A, "api_key": "sk-literal"}}, "Extra inputs are not permitted"),  # never the key itself
])
def test_bad_profiles_are_refused_at_startup(monkeypatch, value, fragment):
    monkeypatch.setenv(SETTING, json.dumps(value))
    with pytest.raises(ValidationError, match="endpoints") as err:
        AnalysisSettings()
    assert fragment in str(err.value)


# -- LlmEndpoint -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("request_fields", "profile", "base_url"), [
    ({"profile": "analyst", "model": "standin"}, "analyst", A),
    ({"base_url": A + "/", "model": "standin-2"}, "analyst", A),        # trailing '/' ignored
    ({"profile": "analyst", "base_url": A, "model": "standin"}, "analyst", A),
    ({"base_url": B, "model": "anything"}, "open", B),                  # no models listed: any
])
def test_a_request_naming_a_profile_gets_that_profiles_url_and_key(endpoints, request_fields, profile, base_url):
    r = endpoints.llm(LlmEndpointModel(**request_fields), "spec.llm")
    assert (r.profile, r.base_url, r.model) == (profile, base_url, request_fields["model"])
    assert r.api_key_env == (KEY_ENV if profile == "analyst" else "")


# (request, error, fragment, whether the message lists the configured profiles and the setting)
LLM_REFUSALS = [
    ({"base_url": A, "model": "standin", "api_key_env": "TRACE_ANALYSIS_AUTH_TOKEN"}, PermissionDenied,
     "spec.llm.api_key_env: a request cannot name a credential", True),
    ({"profile": "analyst", "model": "standin", "api_key_env": KEY_ENV}, PermissionDenied, "spec.llm.api_key_env", True),
    ({"base_url": "http://127.0.0.1:9/v1", "model": "m"}, PermissionDenied,
     "spec.llm.base_url: 'http://127.0.0.1:9/v1' is not an endpoint the operator allows", True),
    ({"profile": "ghost", "model": "m"}, PermissionDenied, "spec.llm.profile: 'ghost' is not an endpoint profile",
     True),
    ({"profile": "analyst", "base_url": B, "model": "standin"}, PermissionDenied,
     f"spec.llm.base_url: '{B}' is not the base_url of profile 'analyst'", False),
    ({"profile": "analyst", "model": "gpt-4.1"}, PermissionDenied,
     "spec.llm.model: model 'gpt-4.1' is not allowed on profile 'analyst' (allowed: standin*)", False),
    ({"profile": "Bad!", "model": "m"}, InvalidArgument, "spec.llm.profile: expected an endpoint profile name", True),
    ({"model": "m"}, InvalidArgument, "spec.llm.profile: expected the endpoint profile to call", True),
]


@pytest.mark.parametrize(("request_fields", "error", "fragment", "lists"), LLM_REFUSALS)
def test_refusals_name_the_field_and_say_what_to_do(endpoints, request_fields, error, fragment, lists):
    with pytest.raises(error) as err:
        endpoints.llm(LlmEndpointModel(**request_fields), "spec.llm")
    msg = str(err.value)
    assert fragment in msg, msg
    assert err.value.code == ("PERMISSION_DENIED" if error is PermissionDenied else "INVALID_ARGUMENT")
    assert (f"analyst ({A})" in msg and f"open ({B})" in msg and SETTING in msg) is lists, msg


def test_with_no_profiles_every_endpoint_is_refused():
    with pytest.raises(PermissionDenied, match=r"none are configured \(TRACE_ROLLOUT_ENDPOINTS is empty\)"):
        Endpoints(setting="TRACE_ROLLOUT_ENDPOINTS").llm(LlmEndpointModel(base_url=A, model="m"), "spec.user_simulator")


# -- PolicyRef -----------------------------------------------------------------------------------------

def _ref(**kw) -> PolicyRefModel:
    return PolicyRefModel(**{"backend": HTTP, "model": "standin", **kw})


@pytest.mark.parametrize(("kw", "profile"), [
    ({"endpoint_profile": "analyst"}, "analyst"),
    ({"endpoint": A + "/"}, "analyst"),
    ({"endpoint": B, "model": "base", "adapter_name": "cap-v3"}, "open"),
])
def test_a_policy_ref_is_checked_and_carries_the_profiles_key_variable(endpoints, kw, profile):
    ref = _ref(**kw)
    assert not ref.endpoint_checked
    checked = endpoints.policy(ref, "spec.policy")
    assert checked.endpoint_checked and checked.endpoint_profile == profile
    assert checked.endpoint == (A if profile == "analyst" else B)
    assert checked.credential_env == (KEY_ENV if profile == "analyst" else "")
    assert "credential_env" not in checked.model_dump()  # never serialised, never part of a request


@pytest.mark.parametrize(("kw", "error", "fragment"), [
    ({"endpoint": "http://127.0.0.1:9/v1"}, PermissionDenied, "spec.policy.endpoint: 'http://127.0.0.1:9/v1' is not"),
    ({"endpoint_profile": "ghost"}, PermissionDenied, "spec.policy.endpoint_profile: 'ghost'"),
    ({"endpoint_profile": "analyst", "adapter_name": "evil-v1"}, PermissionDenied,
     "spec.policy.adapter_name: model 'evil-v1' is not allowed"),
    ({}, InvalidArgument, "spec.policy.endpoint_profile: expected the endpoint profile to call"),
])
def test_policy_refusals(endpoints, kw, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        endpoints.policy(_ref(**kw), "spec.policy")


@pytest.mark.parametrize("backend", ["POLICY_BACKEND_IN_PROCESS", "POLICY_BACKEND_SCRIPTED"])
def test_backends_that_call_nothing_outbound_are_unchanged(endpoints, backend):
    ref = PolicyRefModel(backend=backend, model="micro", endpoint="http://anything:1/v1")
    assert endpoints.policy(ref, "spec.policy") is ref


# -- environment parameters -----------------------------------------------------------------------

@pytest.mark.parametrize(("params", "refused"), [
    ({"user_base_url": "http://evil/v1"}, "user_base_url"),
    ({"user_api_key": "sk-1", "user_model": "m"}, "user_api_key"),
    ({"callback_url": "x"}, "callback_url"),
    ({"x_api_key_env": "TRACE_ROLLOUT_AUTH_TOKEN"}, "x_api_key_env"),
    ({"hook_token": "t"}, "hook_token"),
    ({"user_model": "gpt-expensive"}, "user_model"),   # the model on the operator's endpoint (no allow-list)
    ({"user_max_tokens": "64", "data": "/d", "max_steps": "9", "user_timeout": "5"}, None),
])
def test_environment_params_that_choose_a_url_or_key_are_refused(params, refused):
    if refused is None:
        refuse_outbound_params(params, "spec.environment.params")
        return
    with pytest.raises(PermissionDenied) as err:
        refuse_outbound_params(params, "spec.environment.params")
    assert str(err.value).startswith((f"spec.environment.params: parameter(s) {refused}",
                                      f"spec.environment.params: parameter {refused}"))
    assert "spec.user_simulator.profile" in str(err.value)


# -- the one api-key rule -----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [(None, FailedPrecondition), ("   ", FailedPrecondition),
                                                 ("sk-profile", "sk-profile")])
def test_one_api_key_rule_for_the_chat_client_and_the_http_policy(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, value)
    makers = [lambda: read_api_key(KEY_ENV), lambda: LlmConfig(base_url=A, model="m", api_key_env=KEY_ENV).api_key(),
              lambda: OpenAIPolicy(A, "m", api_key_env=KEY_ENV)._client.api_key]
    for make in makers:
        if expected is FailedPrecondition:
            with pytest.raises(FailedPrecondition, match=f"api_key_env='{KEY_ENV}' names an unset"):
                make()
        else:
            assert make() == expected
    assert read_api_key("") == "EMPTY" == LlmConfig(base_url=A, model="m").api_key()


# -- the factory fails closed ------------------------------------------------------------------------

def _one_turn(ref: PolicyRefModel) -> None:
    async def go():
        policy = await open_policy(ref, allowed=UNCONFINED)
        try:
            await policy.complete(PolicyRequest(messages=[Message.user("hi")], params=SamplingParams(max_tokens=8)))
        finally:
            await policy.close()
    asyncio.run(go())


def test_an_unchecked_http_ref_opens_nothing(monkeypatch):
    with Listener() as srv:
        with pytest.raises(PermissionDenied, match="policy.endpoint: the endpoint was not checked"):
            _one_turn(_ref(endpoint=srv.base_url))
        assert srv.connections == 0


def test_a_checked_ref_reaches_its_profiles_url_with_its_profiles_key_only(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-profile-key")
    monkeypatch.setenv("TRACE_ROLLOUT_AUTH_TOKEN", "service-token-" + "x" * 12)
    with Listener() as srv, Listener() as other:
        ep = Endpoints({"served": {"base_url": srv.base_url, "api_key_env": KEY_ENV},
                        "other": {"base_url": other.base_url}})
        _one_turn(ep.policy(_ref(endpoint_profile="served"), "spec.policy"))
        assert srv.authorizations() == {"Bearer sk-profile-key"}
        assert other.connections == 0
        assert b"service-token-" not in srv.seen()
