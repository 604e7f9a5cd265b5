"""Settings of the rollout service (`TRACE_ROLLOUT_*`). The endpoints an OPENAI_HTTP policy or an LLM
user simulator may call, and their keys, are only a setting: `endpoints` (TRACE_ROLLOUT_ENDPOINTS,
trace_common/endpoints.py). The data directories a request may name (the tau2 `data` parameter) are
also only a setting: `data_roots` (TRACE_ROLLOUT_DATA_ROOTS, trace_common/data_roots.py). How many
episodes one job may ask for (tasks x samples_per_task) is capped by `max_episodes_per_job`
(TRACE_ROLLOUT_MAX_EPISODES_PER_JOB): a job keeps every episode's trajectory until it publishes them."""

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from trace_common.config import ServiceSettings
from trace_common.data_roots import ROOTS_DESCRIPTION, default_roots, parse_roots
from trace_common.endpoints import ENDPOINTS_DESCRIPTION, EndpointMap


class RolloutSettings(ServiceSettings):
    service_name: ClassVar[str] = "rollout"
    model_config = SettingsConfigDict(env_prefix="TRACE_ROLLOUT_", extra="ignore", validate_default=True)

    default_concurrency: int = Field(8, ge=1, le=1024, description="Episodes played at once when a job says 0.")
    max_episodes_per_job: int = Field(
        100_000, ge=1, le=10_000_000,
        description="Most episodes (tasks x samples_per_task) one rollout job may ask for; a CreateRolloutJob "
                    "past it is INVALID_ARGUMENT naming the fields and this setting. A job holds every episode's "
                    "trajectory (about 8 KiB serialised for the built-in store domain, more for tau2) until it "
                    "publishes them, so this bounds one job's memory.")
    endpoints: EndpointMap = Field(default_factory=dict, description=ENDPOINTS_DESCRIPTION)
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=default_roots, description=ROOTS_DESCRIPTION)

    @field_validator("data_roots", mode="before")
    @classmethod
    def _data_roots(cls, v: object) -> list[Path]:
        return parse_roots(v)
