"""Settings of the inference service (`TRACE_INFERENCE_*`)."""

from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trace_common.config import ServiceSettings


class InferenceSettings(ServiceSettings):
    service_name: ClassVar[str] = "inference"
    model_config = SettingsConfigDict(env_prefix="TRACE_INFERENCE_", extra="ignore", validate_default=True)

    http_host: str = Field("127.0.0.1", description="Address of the OpenAI-compatible HTTP API; 0.0.0.0 in a pod.")
    http_port: int = Field(0, ge=0, le=65535, description="OpenAI-compatible HTTP API port (0 = free port).")
    max_prompt_tokens: int = Field(8192, ge=16, le=1 << 20, description="Longer prompts are rejected.")
    default_max_tokens: int = Field(256, ge=1, le=1 << 20,
                                    description="Completion tokens when a request leaves max_tokens at 0.")
    max_completion_tokens: int = Field(4096, ge=1, le=1 << 20,
                                       description="Upper bound on a request's max_tokens (larger ones are clamped).")
    max_batch: int = Field(16, ge=1, le=1024, description="Concurrent requests generated together in one batch.")
    batch_wait_s: float = Field(0.005, ge=0, le=1.0,
                                description="How long the first request of a batch waits for company.")
    device: str = Field("cpu", description="Torch device of loaded compositions, e.g. cpu or cuda:0.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights dtype.")
    model_cache_dir: str = Field("", description="Where base/adapter/gate artifacts are downloaded; empty = "
                                                 "<tmp>/trace-compositions.")
    max_compositions: int = Field(4, ge=1, le=64, description="Compositions loaded at once; loading one more "
                                                              "fails with RESOURCE_EXHAUSTED (unload one first).")
