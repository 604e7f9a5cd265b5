"""The analyst's config is built on the shared LLM client config (one declaration of URL, model,
key variable, timeout and retries), its endpoint comes from the service's endpoint profiles, and
a spec that names a credential or URL the operator did not allow is refused at job creation."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from services.analysis.analyst import AnalystConfig
from services.analysis.job import analyst_config
from services.analysis.service import Analyses
from services.analysis.settings import AnalysisSettings
from services.analysis.specs import AnalysisSpecModel
from trace_common.endpoints import Endpoints
from trace_common.errors import PermissionDenied
from trace_common.llm import LlmConfig

URL = "http://analyst.example:8000/v1"


def test_analyst_config_declares_no_field_of_the_llm_config():
    analyst = {f.name for f in dataclasses.fields(AnalystConfig)}
    llm = {f.name for f in dataclasses.fields(LlmConfig)}
    assert not analyst & llm, analyst & llm
    assert AnalystConfig.__dataclass_fields__["llm"].type in (LlmConfig, "LlmConfig")


def _spec(**llm) -> AnalysisSpecModel:
    return AnalysisSpecModel(rollout_uris=["file:///tmp/r.jsonl"], mode="ANALYST_MODE_LLM",
                             llm={"model": "standin", **llm})


@pytest.mark.parametrize(("llm", "timeout"), [({"profile": "analyst"}, 120.0),
                                              ({"base_url": URL, "timeout_seconds": 5.0}, 5.0)])
def test_the_analyst_endpoint_is_the_profiles(llm, timeout):
    settings = AnalysisSettings(llm_max_retries=1, endpoints={"analyst": {"base_url": URL, "api_key_env": "K"}})
    spec = _spec(**llm)
    cfg = analyst_config(spec, settings, Endpoints(settings.endpoints).llm(spec.llm, "spec.llm"))
    assert cfg.llm == LlmConfig(base_url=URL, model="standin", api_key_env="K", timeout_seconds=timeout, max_retries=1)
    assert cfg.max_concurrency == settings.llm_max_concurrency and cfg.temperature == settings.llm_temperature


@pytest.mark.parametrize(("mode", "llm", "fragment"), [
    ("ANALYST_MODE_LLM", {"base_url": "http://127.0.0.1:9/v1"}, "spec.llm.base_url"),
    ("ANALYST_MODE_LLM", {"profile": "analyst", "api_key_env": "TRACE_ANALYSIS_S3_SECRET_KEY"}, "spec.llm.api_key_env"),
    ("ANALYST_MODE_DIAGNOSTICS", {"base_url": URL, "api_key_env": "TRACE_ANALYSIS_AUTH_TOKEN"}, "spec.llm.api_key_env"),
])
def test_refused_at_creation_in_either_mode(tmp_path, mode, llm, fragment):
    domain = Analyses(AnalysisSettings(artifact_root=tmp_path.as_uri(), endpoints={"analyst": {"base_url": URL}}))
    spec = AnalysisSpecModel(rollout_uris=["file:///tmp/r.jsonl"], mode=mode, llm={"model": "standin", **llm})
    try:
        with pytest.raises(PermissionDenied, match=fragment):
            domain.create_job(spec, "r1", {}, "")
        assert not domain.jobs.list()[0]  # no job was created
    finally:
        asyncio.run(domain.jobs.shutdown())
