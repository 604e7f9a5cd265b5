"""Settings of the analysis service (`TRACE_ANALYSIS_*`).

Per-job values in the AnalysisSpec (num_runs, thresholds, the LLM endpoint's timeout and
concurrency) win over these; zero in the spec means "use the setting". Which LLM endpoints a job
may call, and with which key, is only a setting: `endpoints` (TRACE_ANALYSIS_ENDPOINTS, see
trace_common/endpoints.py); a spec names one of its profiles.

Which rollout artifacts a job may read is a setting too: its own run's rollouts in this service's
store, plus the store prefixes in `rollout_roots` (TRACE_ANALYSIS_ROLLOUT_ROOTS, see
services/analysis/artifacts_io.py).
"""

import json
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from trace_common.artifacts.keys import parse_root_uri
from trace_common.config import ServiceSettings
from trace_common.endpoints import ENDPOINTS_DESCRIPTION, EndpointMap
from trace_common.errors import InvalidArgument


class AnalysisSettings(ServiceSettings):
    service_name: ClassVar[str] = "analysis"
    model_config = SettingsConfigDict(env_prefix="TRACE_ANALYSIS_", extra="ignore", validate_default=True)

    endpoints: EndpointMap = Field(default_factory=dict, description=ENDPOINTS_DESCRIPTION)
    rollout_roots: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Store prefixes (file:///abs/dir or s3://bucket[/prefix]) whose objects "
        "a job's rollout_uris may name besides its own run's rollouts in this service's store "
        "(runs/<run_id>/rollouts/); s3:// ones are read with this service's S3 settings. A JSON list or a "
        "comma-separated string. Default: none.")
    llm_max_concurrency: int = Field(8, ge=1, le=1024, description="Analyst LLM requests in flight per job "
                                     "(discovery and all labeling runs together).")
    llm_timeout_seconds: float = Field(120.0, gt=0, le=3600, description="Per-request timeout of the analyst "
                                       "LLM when the spec's llm.timeout_seconds is 0.")
    llm_max_retries: int = Field(2, ge=0, le=10, description="Transport retries per request (connection "
                                 "errors, 408/429/5xx), done by the OpenAI SDK with backoff.")
    llm_max_attempts: int = Field(3, ge=1, le=10, description="Replies asked for per request when a reply is "
                                  "not valid JSON or fails its schema (the error is fed back each time).")
    llm_temperature: float = Field(0.6, ge=0, le=2, description="Sampling temperature of the analyst; runs "
                                   "differ by seed and order, and sampling lets their labels differ too.")
    llm_max_tokens: int = Field(2048, ge=64, le=65536, description="Completion token cap per request.")
    llm_response_format: Literal["none", "json_object", "json_schema"] = Field(
        "none", description="OpenAI response_format to request: none (prompt + validation only, works with "
        "any endpoint), json_object, or json_schema (vLLM/OpenAI structured outputs with the request's schema).")
    trajectory_char_budget: int = Field(6000, ge=600, le=1_000_000, description="Characters of one compacted "
                                        "trajectory when the spec's trajectory_char_budget is 0.")
    discovery_char_budget: int = Field(60_000, ge=2000, le=2_000_000, description="Characters of all "
                                       "trajectories shown to discovery together.")
    discovery_max_failed: int = Field(30, ge=1, le=1000, description="Failed trajectories shown to discovery.")
    discovery_max_passed: int = Field(15, ge=0, le=1000, description="Passed trajectories shown to discovery.")
    prompts_dir: Path | None = Field(None, description="Directory with discover.md and label.md; default "
                                     "./prompts/analysis, else the source tree's prompts/analysis.")
    plots: bool = Field(True, description="Render the PNG plots into the report directory.")
    max_rollout_bytes: int = Field(256 << 20, ge=1, description="Most bytes of rollout JSONL one job "
                                   "reads (all its rollout_uris together), checked before anything is read. "
                                   "Parsed trajectories hold about 5 times their bytes (peak 7): one job at the "
                                   "default (256 MiB) fits the chart's 2Gi analysis pod; keep this x 7 x "
                                   "max_concurrent_jobs within the service's memory.")

    @field_validator("rollout_roots", mode="before")
    @classmethod
    def _rollout_roots(cls, v: object) -> list[str]:
        if isinstance(v, str):
            try:
                v = json.loads(v) if v.lstrip().startswith("[") else [p for p in v.split(",") if p.strip()]
            except json.JSONDecodeError as exc:
                raise ValueError(f"rollout_roots: {exc}; write a JSON list such as [\"s3://shared/rollouts\"]") from None
        if not isinstance(v, (list, tuple)):
            raise ValueError("rollout_roots: expected a list of store prefixes such as [\"s3://shared/rollouts\"]")
        out = []
        for item in v:
            try:
                out.append(parse_root_uri(str(item).strip(), field="rollout_roots").uri)
            except InvalidArgument as err:
                raise ValueError(str(err)) from None
        return out
