"""Settings of the inference service (`TRACE_INFERENCE_*`)."""

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trace_common.config import ServiceSettings


class InferenceSettings(ServiceSettings):
    service_name: ClassVar[str] = "inference"
    model_config = SettingsConfigDict(env_prefix="TRACE_INFERENCE_", extra="ignore", validate_default=True)

    http_port: int = Field(0, ge=0, le=65535, description="OpenAI-compatible HTTP API port (0 = free port).")
    max_prompt_tokens: int = Field(8192, ge=16, le=1 << 20, description="Longer prompts are rejected.")
