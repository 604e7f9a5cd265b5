"""tracectl is the operator of the services it embeds: the endpoints a run config names become the
embedded services' profiles (tracectl/run/endpoints.py), so every request the pipeline sends for a
shipped config is allowed by the service it goes to, with the config's key variable, and nothing
else is."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.analysis.specs import AnalysisSpecModel
from services.environment.specs import GenerationSpecModel
from services.rollout.specs import RolloutSpecModel
from trace_common.endpoints import Endpoints
from trace_common.errors import InvalidArgument, PermissionDenied
from trace_common.grpc.client import messages
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.run.config import RunConfig, load_config
from tracectl.run.endpoints import run_endpoints
from tracectl.run.pipeline import Pipeline

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
R, A, E = (messages(s) for s in ("rollout", "analysis", "environment"))


def _requests(cfg: RunConfig):
    """(service, field, endpoint model) of every endpoint the pipeline's requests name for `cfg`."""
    p = Pipeline(cfg, runner=None, store=None, manifest=None)  # type: ignore[arg-type]
    out = []
    if cfg.base_agent.backend == "http":
        spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"), policy=p.base_policy())
        out.append(("rollout", "spec.policy", parse(RolloutSpecModel, spec, "spec").policy))
        gen = E.GenerationSpec(capabilities=[t.Capability(name="x")], target=t.EnvironmentRef(name="store"),
                               mode=E.GENERATION_MODE_LIBRARY, calibration_policy=p.base_policy())
        out.append(("environment", "spec.calibration_policy", parse(GenerationSpecModel, gen, "spec").calibration_policy))
    if cfg.target.user_simulator:
        spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"), policy=p.base_policy(),
                             user_simulator=p.user_simulator())
        out.append(("rollout", "spec.user_simulator", parse(RolloutSpecModel, spec, "spec").user_simulator))
    for service, section, model, build in (
            ("analysis", cfg.analysis.llm, AnalysisSpecModel,
             lambda llm: A.AnalysisSpec(rollout_uris=["file:///r.jsonl"], mode=A.ANALYST_MODE_LLM, llm=llm)),
            ("environment", cfg.environments.llm, GenerationSpecModel,
             lambda llm: E.GenerationSpec(capabilities=[t.Capability(name="x")], target=t.EnvironmentRef(name="store"),
                                          mode=E.GENERATION_MODE_LLM, llm=llm))):
        if section is not None:
            llm = t.LlmEndpoint(base_url=section.base_url, model=section.model)  # what stage_analysis/_environments send
            out.append((service, "spec.llm", parse(model, build(llm), "spec").llm))
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_shipped_config_is_allowed_by_its_embedded_services(path):
    cfg = load_config(path)
    allowed = run_endpoints(cfg)
    requests = _requests(cfg)
    sent = {(service, (getattr(ref, "base_url", "") or getattr(ref, "endpoint", "")).rstrip("/"))
            for service, _, ref in requests}
    profiles = {(service, p["base_url"].rstrip("/")) for service, ps in allowed.items() for p in ps.values()}
    assert sent == profiles  # exactly what the requests need: nothing more is allowed
    for service, field, ref in requests:
        endpoints = Endpoints(allowed.get(service, {}))
        if field == "spec.llm" or field == "spec.user_simulator":
            assert endpoints.llm(ref, field).base_url == ref.base_url.rstrip("/")
        else:
            assert endpoints.policy(ref, field).endpoint_checked


BASE = {"run_id": "r"}
CASES = [
    ({}, {}),
    ({"base_agent": {"name": "served", "backend": "http", "endpoint": "http://vllm:8000/v1"}},
     {"rollout": {"base-agent": {"base_url": "http://vllm:8000/v1", "api_key_env": ""}},
      "environment": {"base-agent": {"base_url": "http://vllm:8000/v1", "api_key_env": ""}}}),
    ({"analysis": {"mode": "llm", "llm": {"base_url": "https://llm.example/v1", "model": "m", "api_key_env": "KEY"}},
      "environments": {"mode": "llm", "llm": {"base_url": "https://llm.example/v1", "model": "m", "api_key_env": "KEY"}}},
     {"analysis": {"analyst": {"base_url": "https://llm.example/v1", "api_key_env": "KEY"}},
      "environment": {"generator": {"base_url": "https://llm.example/v1", "api_key_env": "KEY"}}}),
    ({"base_agent": {"name": "served", "backend": "http", "endpoint": "http://vllm:8000/v1"},
      "target": {"env": "tau2-retail", "user_simulator": {"base_url": "http://vllm:8000/v1/", "model": "m"}}},
     {"rollout": {"user-simulator": {"base_url": "http://vllm:8000/v1/", "api_key_env": ""}},  # one URL, one profile
      "environment": {"base-agent": {"base_url": "http://vllm:8000/v1", "api_key_env": ""}}}),
    ({"evaluation": {"arms": ["base", "gepa"], "gepa": {"base_url": "http://reflector/v1", "model": "m"}}}, {}),
]


@pytest.mark.parametrize(("config", "expected"), CASES)
def test_run_config_sections_become_profiles_of_the_services_that_call_them(config, expected):
    assert run_endpoints(RunConfig.model_validate({**BASE, **config})) == expected


def test_one_url_with_two_keys_for_one_service_is_refused():
    cfg = RunConfig.model_validate({**BASE, "base_agent": {"name": "s", "backend": "http", "endpoint": "http://v/v1"},
                                    "target": {"user_simulator": {"base_url": "http://v/v1", "model": "m",
                                                                  "api_key_env": "USER_KEY"}}})
    with pytest.raises(InvalidArgument, match="base_agent.endpoint.api_key_env: expected 'USER_KEY'"):
        run_endpoints(cfg)


def test_an_endpoint_the_config_does_not_name_stays_refused():
    allowed = run_endpoints(RunConfig.model_validate({**BASE, "analysis": {
        "mode": "llm", "llm": {"base_url": "https://llm.example/v1", "model": "m"}}}))
    from trace_common.specs import LlmEndpointModel

    with pytest.raises(PermissionDenied):
        Endpoints(allowed["analysis"]).llm(LlmEndpointModel(base_url="http://127.0.0.1:9/v1", model="m"), "spec.llm")
