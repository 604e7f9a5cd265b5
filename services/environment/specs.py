"""Validated generation job spec (pydantic), built from the proto by the servicer."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from trace_common.limits import EvidenceList, FreeText, Identifier, TaskIds
from trace_common.specs import EnvironmentRefModel, LlmEndpointModel, PolicyRefModel, SamplingModel, Strict

CAPABILITY_RE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


class CapabilityModel(Strict):
    name: Identifier
    description: FreeText = ""
    evidence: EvidenceList = Field(default_factory=list)
    failed_task_ids: TaskIds = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _snake(cls, v: str) -> str:
        if not CAPABILITY_RE.match(v) or len(v) > 64:
            raise ValueError(f"capability name {v!r} must be snake_case (e.g. precondition_verification), "
                             "at most 64 characters")
        return v


class GenerationSpecModel(Strict):
    capabilities: list[CapabilityModel] = Field(min_length=1, max_length=32)
    target: EnvironmentRefModel
    mode: Literal["GENERATION_MODE_LIBRARY", "GENERATION_MODE_LLM"]
    llm: LlmEndpointModel | None = None
    max_retries: int = Field(0, ge=0, le=20)
    calibration_policy: PolicyRefModel | None = None
    calibration_reward_min: float = Field(0.0, ge=0.0, le=1.0)
    calibration_reward_max: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = 0
    calibration_min_informative: float | None = Field(None, ge=0.0, le=1.0)
    #: How the calibration policy samples (non-zero fields override the service's settings): the run's
    #: training temperature and its one completion cap, so calibration plays the adapter's first iteration.
    calibration_sampling: SamplingModel | None = None

    @property
    def band(self) -> tuple[float, float]:
        """The calibration band, 0 meaning the defaults 0.2 and 0.6."""
        return self.calibration_reward_min or 0.2, self.calibration_reward_max or 0.6

    @model_validator(mode="after")
    def _check(self) -> GenerationSpecModel:
        if self.mode == "GENERATION_MODE_LLM" and self.llm is None:
            raise ValueError("mode GENERATION_MODE_LLM needs llm (profile, model); or use GENERATION_MODE_LIBRARY")
        lo, hi = self.calibration_reward_min or 0.2, self.calibration_reward_max or 0.6
        if lo >= hi:
            raise ValueError(f"calibration band [{lo}, {hi}] is empty; set calibration_reward_min < "
                             "calibration_reward_max")
        names = [c.name for c in self.capabilities]
        if len(set(names)) != len(names):
            raise ValueError(f"capabilities repeat a name ({names}); give each capability once")
        return self
