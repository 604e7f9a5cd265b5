"""tau2-bench task files: the task model, the user-scenario text, gold actions, reward basis.

The fields follow tau2's task JSON. `UserScenario.render()` produces the exact text tau2 puts
inside the user simulator's `<scenario>` block (`str(task.user_scenario)` in tau2): a
`Persona:` block when there is one, then `Instructions:` with the structured instructions
tab-indented (Domain / Reason for call / Known info / Unknown info / Task instructions).
"""

from __future__ import annotations

import textwrap
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class RewardType(StrEnum):
    DB = "DB"
    ENV_ASSERTION = "ENV_ASSERTION"
    NL_ASSERTION = "NL_ASSERTION"
    ACTION = "ACTION"
    COMMUNICATE = "COMMUNICATE"


class StructuredUserInstructions(BaseModel):
    model_config = ConfigDict(extra="allow")

    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str

    def render(self) -> str:
        tab = "\t"
        lines = [f"Domain: {self.domain}",
                 f"Reason for call:\n{textwrap.indent(self.reason_for_call, tab)}"]
        if self.known_info is not None:
            lines.append(f"Known info:\n{textwrap.indent(self.known_info, tab)}")
        if self.unknown_info is not None:
            lines.append(f"Unknown info:\n{textwrap.indent(self.unknown_info, tab)}")
        lines.append(f"Task instructions:\n{textwrap.indent(self.task_instructions, tab)}")
        return "\n".join(lines)


class UserScenario(BaseModel):
    model_config = ConfigDict(extra="allow")

    persona: str | None = None
    instructions: StructuredUserInstructions | str

    def render(self) -> str:
        lines = []
        if self.persona is not None:
            lines += ["Persona:", textwrap.indent(self.persona, "\t")]
        text = self.instructions if isinstance(self.instructions, str) else self.instructions.render()
        lines += ["Instructions:", textwrap.indent(text, "\t")]
        return "\n".join(lines)


class Action(BaseModel):
    """A gold tool call. `compare_args` limits which arguments the action check compares."""

    model_config = ConfigDict(extra="allow")

    action_id: str
    requestor: Literal["assistant", "user"] = "assistant"
    name: str
    arguments: dict[str, Any]
    info: str | None = None
    compare_args: list[str] | None = None

    def matches(self, name: str, arguments: dict[str, Any]) -> bool:
        """tau2's action check: same name, and equal values on the compared arguments."""
        if name != self.name:
            return False
        keys = list(arguments) if self.compare_args is None else self.compare_args
        if not keys:
            return True
        return ({k: v for k, v in arguments.items() if k in keys}
                == {k: v for k, v in self.arguments.items() if k in keys})


class EvaluationCriteria(BaseModel):
    model_config = ConfigDict(extra="allow")

    actions: list[Action] | None = None
    env_assertions: list[dict[str, Any]] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[RewardType] = Field(default_factory=lambda: [RewardType.DB, RewardType.COMMUNICATE])


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    description: dict[str, Any] | None = None
    user_scenario: UserScenario
    initial_state: dict[str, Any] | None = None
    evaluation_criteria: EvaluationCriteria | None = None

    @property
    def gold_actions(self) -> list[Action]:
        if self.evaluation_criteria is None or self.evaluation_criteria.actions is None:
            return []
        return self.evaluation_criteria.actions
