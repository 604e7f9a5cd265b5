"""The chart renders the services' outbound endpoint profiles (values `endpoints` and `llm`) as
TRACE_<SVC>_ENDPOINTS for the three calling services and the trainer (vLLM rollouts, no key), each key as an env var taken from its Secret
by name, and the services' real settings models read what it renders (trace_common/endpoints.py).
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from services.analysis.settings import AnalysisSettings
from services.environment.settings import EnvironmentSettings
from services.rollout.settings import RolloutSettings
from services.trainer.settings import TrainerSettings
from tests.chart.helm import FULLNAME, VALUES_DIR, render, template

SETTINGS = {"analysis": AnalysisSettings, "environment": EnvironmentSettings, "rollout": RolloutSettings,
            "trainer": TrainerSettings}
VLLM = f"http://{FULLNAME}-vllm:8000/v1"
OPENAI = ["--set", "endpoints.profiles.openai.baseUrl=https://api.openai.com/v1",
          "--set", "endpoints.profiles.openai.apiKeySecret.name=openai-key",
          "--set", "endpoints.profiles.openai.apiKeySecret.key=token",
          "--set", "endpoints.profiles.openai.models={gpt-4.1*}",
          "--set", "endpoints.profiles.openai.services={analysis}"]


def _env(docs, service: str) -> dict[str, dict]:
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULLNAME}-{service}")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in c["env"]}


def _docs(*args: str):
    proc = template(*args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _profiles(env: dict[str, dict], service: str) -> dict:
    return json.loads(env[f"TRACE_{service.upper()}_ENDPOINTS"]["value"])


# (helm arguments, service, expected profiles, expected key variables -> (secret, key))
CASES = [
    ([], "rollout", {"vllm": {"base_url": VLLM}}, {}),
    ([], "analysis", {"vllm": {"base_url": VLLM}}, {}),
    ([], "environment", {"vllm": {"base_url": VLLM}}, {}),
    (["--set", "endpoints.vllm=false"], "rollout", {}, {}),
    (OPENAI, "analysis", {"vllm": {"base_url": VLLM}, "openai": {
        "base_url": "https://api.openai.com/v1", "api_key_env": "TRACE_ENDPOINT_KEY_OPENAI", "models": ["gpt-4.1*"]}},
     {"TRACE_ENDPOINT_KEY_OPENAI": ("openai-key", "token")}),
    (OPENAI, "rollout", {"vllm": {"base_url": VLLM}}, {}),  # services: [analysis] only
    (["-f", str(VALUES_DIR / "gpu-off.yaml")], "environment", {"llm": {
        "base_url": "https://llm.example.com/v1", "api_key_env": "TRACE_ENDPOINT_KEY_LLM", "models": ["qwen3-8b"]}},
     {"TRACE_ENDPOINT_KEY_LLM": ("llm-api-key", "api-key")}),
    (["-f", str(VALUES_DIR / "gpu-off.yaml")], "rollout", {}, {}),  # llm is the agents' (analysis, environment)
    # the trainer (vLLM rollouts): the in-chart server and profiles that name it, never a key
    ([], "trainer", {"vllm": {"base_url": VLLM}}, {}),
    (OPENAI, "trainer", {"vllm": {"base_url": VLLM}}, {}),
    (["--set", "endpoints.profiles.pool.baseUrl=http://vllm-pool:8000/v1", "--set",
      "endpoints.profiles.pool.services={trainer}"], "trainer",
     {"vllm": {"base_url": VLLM}, "pool": {"base_url": "http://vllm-pool:8000/v1"}}, {}),
]


@pytest.mark.parametrize(("args", "service", "profiles", "keys"), CASES)
def test_profiles_and_their_keys_are_rendered(args, service, profiles, keys, monkeypatch):
    env = _env(_docs(*args), service)
    assert _profiles(env, service) == profiles
    rendered_keys = {n: e for n, e in env.items() if n.startswith("TRACE_ENDPOINT_KEY_")}
    assert {n: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for n, e in rendered_keys.items()} == keys
    assert all("value" not in e for e in rendered_keys.values())  # by Secret reference, never a value
    for k in list(os.environ):
        if k.startswith("TRACE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv(f"TRACE_{service.upper()}_ENDPOINTS", env[f"TRACE_{service.upper()}_ENDPOINTS"]["value"])
    read = SETTINGS[service]().endpoints  # the service's own settings model accepts the render
    assert {n: p.base_url for n, p in read.items()} == {n: p["base_url"].rstrip("/") for n, p in profiles.items()}


@pytest.mark.parametrize("service", ["inference"])
def test_services_that_call_no_endpoint_get_none(service):
    assert not any("ENDPOINT" in n and n != f"TRACE_{service.upper()}_S3_ENDPOINT"
                   for n in _env(render("defaults").docs, service))


@pytest.mark.parametrize(("args", "fragment"), [
    (["--set", "endpoints.profiles.Bad_Name.baseUrl=http://x/v1"], "endpoints.profiles"),
    (["--set", "endpoints.profiles.x.baseUrl=x.example.com"], "endpoints.profiles.x.baseUrl"),
    (["--set", "endpoints.profiles.x.baseUrl=http://x/v1,endpoints.profiles.x.services={inference}"],
     "endpoints.profiles.x.services"),
    (["--set", "endpoints.profiles.x.baseUrl=http://x/v1,endpoints.profiles.x.services={trainer},"
      "endpoints.profiles.x.apiKeySecret.name=s,endpoints.profiles.x.apiKeySecret.key=k"], "the trainer sends no key"),
    (["--set", "endpoints.profiles.x.baseUrl=http://x/v1,endpoints.profiles.x.services={trainer},"
      "endpoints.profiles.x.models={qwen*}"], "only its own adapter versions"),
    (["--set", "endpoints.profiles.x.baseUrl=http://x/v1,endpoints.profiles.x.apiKey=sk-1"], "apiKey"),
    (["--set", "endpoints.profiles.vllm.baseUrl=http://x/v1"], "taken by the in-chart vLLM profile"),
    (["--set", "llm.baseUrl=http://x/v1,endpoints.profiles.llm.baseUrl=http://y/v1"], "taken by the chart's own"),
])
def test_bad_profiles_are_refused_by_helm(args, fragment):
    proc = template(*args)
    assert proc.returncode != 0, "helm accepted " + " ".join(args)
    assert fragment in proc.stderr, proc.stderr


MODEL_ROOTS = ["s3://models/base", "/models"]


@pytest.mark.parametrize("service", ["rollout", "environment", "trainer", "inference"])
def test_model_roots_are_rendered_for_the_services_that_load_models(service, monkeypatch):
    """`modelRoots` (empty by default: nothing rendered) becomes TRACE_<SVC>_MODEL_ROOTS, which the
    service's own settings model reads back as the same roots (trace_common/model_refs.py)."""
    from services.inference.settings import InferenceSettings

    var = f"TRACE_{service.upper()}_MODEL_ROOTS"
    assert var not in _env(render("defaults").docs, service)
    env = _env(_docs("--set", "modelRoots={" + ",".join(MODEL_ROOTS) + "}"), service)
    for k in list(os.environ):
        if k.startswith("TRACE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv(var, env[var]["value"])
    monkeypatch.setenv(f"TRACE_{service.upper()}_S3_ENDPOINT", "minio:9000")
    settings = {**SETTINGS, "inference": InferenceSettings}[service]()
    assert settings.model_roots == ["s3://models/base", "file:///models"]


def test_model_roots_are_not_rendered_for_analysis():
    env = _env(_docs("--set", "modelRoots={s3://models/base}"), "analysis")
    assert "TRACE_ANALYSIS_MODEL_ROOTS" not in env


@pytest.mark.parametrize("bad", ["models/relative", "http://example.com/m"])
def test_a_model_root_that_is_not_absolute_is_refused_by_the_schema(bad):
    proc = template("--set", "modelRoots={" + bad + "}")
    assert proc.returncode != 0 and "modelRoots" in proc.stderr
