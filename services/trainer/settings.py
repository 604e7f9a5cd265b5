"""Settings of the trainer service (`TRACE_TRAINER_*`)."""

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trace_common.config import ServiceSettings


class TrainerSettings(ServiceSettings):
    service_name: ClassVar[str] = "trainer"
    model_config = SettingsConfigDict(env_prefix="TRACE_TRAINER_", extra="ignore", validate_default=True)

    kubernetes_namespace: str = Field("", description="Namespace for training Jobs (EXECUTOR_KUBERNETES); "
                                      "empty means the pod's own namespace.")
    job_image: str = Field("", description="Image of training Jobs on the GPU pool (the trainer image).")
