"""Settings of the rollout service (`TRACE_ROLLOUT_*`). The endpoints an OPENAI_HTTP policy or an LLM
user simulator may call, and their keys, are only a setting: `endpoints` (TRACE_ROLLOUT_ENDPOINTS,
trace_common/endpoints.py)."""

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trace_common.config import ServiceSettings
from trace_common.endpoints import ENDPOINTS_DESCRIPTION, EndpointMap


class RolloutSettings(ServiceSettings):
    service_name: ClassVar[str] = "rollout"
    model_config = SettingsConfigDict(env_prefix="TRACE_ROLLOUT_", extra="ignore", validate_default=True)

    default_concurrency: int = Field(8, ge=1, le=1024, description="Episodes played at once when a job says 0.")
    endpoints: EndpointMap = Field(default_factory=dict, description=ENDPOINTS_DESCRIPTION)
