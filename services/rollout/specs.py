"""Validated rollout job spec (pydantic), built from the proto by the servicer."""

from __future__ import annotations

from pydantic import Field, field_validator

from trace_common.limits import Identifier, Prompt, TaskIds, UriRef
from trace_common.specs import (
    EnvironmentRefModel,
    LlmEndpointModel,
    PolicyRefModel,
    SamplingModel,
    Strict,
    check_uri,
)


class TaskSelectionModel(Strict):
    split: Identifier = Field("", description="Named split ('train', 'test'); ignored when task_ids is set.")
    task_ids: TaskIds = Field(default_factory=list, description="At most trace_common.limits.TASK_IDS ids.")
    limit: int = Field(0, ge=0, le=1_000_000)


class RolloutSpecModel(Strict):
    environment: EnvironmentRefModel
    policy: PolicyRefModel
    tasks: TaskSelectionModel = TaskSelectionModel()
    samples_per_task: int = Field(0, ge=0, le=1024, description="0 means 1.")
    sampling: SamplingModel = SamplingModel()
    concurrency: int = Field(0, ge=0, le=1024)
    max_turns: int = Field(0, ge=0, le=1000)
    seed: int = 0
    user_simulator: LlmEndpointModel | None = None
    output_uri: UriRef = ""
    system_prompt: Prompt = Field("", description="Replaces the environment's system prompt (at most "
                                  "trace_common.limits.PROMPT_CHARS characters).")

    @field_validator("output_uri")
    @classmethod
    def _out(cls, v: str) -> str:
        return check_uri(v, "spec.output_uri", required=False)
