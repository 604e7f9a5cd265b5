"""Validated training job spec (pydantic), built from the proto by the servicer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trace_common.limits import Identifier, UriRef
from trace_common.specs import EnvironmentRefModel, PolicyRefModel, Strict, check_uri


class TrainingSpecModel(Strict):
    kind: Literal["TRAINING_KIND_ADAPTER", "TRAINING_KIND_GATES"]
    capability: str = Field(min_length=1, max_length=64)
    environments: list[EnvironmentRefModel] = Field(min_length=1, max_length=64)
    policy: PolicyRefModel
    adapter_uris: dict[Identifier, UriRef] = Field(default_factory=dict, max_length=64,
                                                  description="Capability -> adapter URI (at most 64).")
    config: dict[str, Any] = Field(default_factory=dict, description="GRPO hyper-parameters (TRL names).")
    executor: Literal["EXECUTOR_LOCAL", "EXECUTOR_KUBERNETES"] = "EXECUTOR_LOCAL"
    resume_from_uri: UriRef = ""

    @field_validator("config", mode="before")
    @classmethod
    def _config(cls, v: Any) -> Any:
        # Config{values: Struct} arrives as {"values": {...}}.
        if isinstance(v, dict) and set(v) <= {"values"}:
            return v.get("values", {})
        return v

    @field_validator("resume_from_uri")
    @classmethod
    def _resume(cls, v: str) -> str:
        return check_uri(v, "resume_from_uri", required=False)

    @model_validator(mode="after")
    def _gates(self) -> TrainingSpecModel:
        if self.kind == "TRAINING_KIND_GATES" and not self.adapter_uris:
            raise ValueError("TRAINING_KIND_GATES needs adapter_uris (capability -> adapter URI) of the frozen "
                             "adapters to compose")
        for name, uri in self.adapter_uris.items():
            check_uri(uri, f"adapter_uris[{name!r}]")
        return self

    @field_validator("adapter_uris")
    @classmethod
    def _sorted(cls, v: dict[str, str]) -> dict[str, str]:
        # A proto map has no order: slots (and the in-order matching of environments to adapters
        # not named after an environment) follow the capability names, sorted.
        return dict(sorted(v.items()))
