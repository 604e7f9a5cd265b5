"""Settings of the environment service (`TRACE_ENVIRONMENT_*`)."""

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trace_common.config import ServiceSettings


class EnvironmentSettings(ServiceSettings):
    service_name: ClassVar[str] = "environment"
    model_config = SettingsConfigDict(env_prefix="TRACE_ENVIRONMENT_", extra="ignore", validate_default=True)

    max_open_episodes: int = Field(256, ge=1, le=100_000, description="Episodes open at once (sandboxes).")
