"""Settings of the analysis service (`TRACE_ANALYSIS_*`)."""

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trace_common.config import ServiceSettings


class AnalysisSettings(ServiceSettings):
    service_name: ClassVar[str] = "analysis"
    model_config = SettingsConfigDict(env_prefix="TRACE_ANALYSIS_", extra="ignore", validate_default=True)

    llm_max_concurrency: int = Field(8, ge=1, le=1024, description="Analyst LLM requests in flight per job.")
