"""A tiny real Environment used to test the SDK itself (registry, episode loop, records).

The user asks for the sum of two seeded numbers; the agent may call `add(a, b)` and must
tell the user the result. Reward 1 when the sum was told, else 0.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from trace_common.env import Environment, Message, MessageAction, Observation, StepResult, ToolAction
from trace_common.errors import FailedPrecondition

ADD_SCHEMA = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


class SeededEnv(Environment):
    """What every toy environment of the tests shares: the seed of the current episode (task id)
    and whether it is over. Subclasses call `self._begin(seed)` first in `reset`."""

    def __init__(self) -> None:
        self._seed: int | None = None
        self._done = False

    def _begin(self, seed: int) -> int:
        self._seed, self._done = self.check_seed(seed), False
        return self._seed

    @property
    def task_id(self) -> str:
        if self._seed is None:
            raise FailedPrecondition("reset first")
        return str(self._seed)

    @property
    def done(self) -> bool:
        return self._done


class ToyEnv(SeededEnv):
    name: ClassVar[str] = "toy"
    version: ClassVar[str] = "1.0.0"
    default_max_turns: ClassVar[int] = 4

    def __init__(self, limit: int = 100):
        super().__init__()
        self.limit = limit

    def splits(self) -> dict[str, Sequence[int]]:
        return {"train": range(0, 50), "test": range(50, 60)}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [ADD_SCHEMA]

    def reset(self, seed: int) -> Observation:
        self._begin(seed)
        rng = random.Random(seed)
        self.a, self.b = rng.randrange(self.limit), rng.randrange(self.limit)
        self._told: list[str] = []
        self._events: list[dict[str, Any]] = []
        self._turn = 0
        return Observation(messages=[Message.system("Add numbers."),
                                     Message.user(f"What is {self.a} + {self.b}?")],
                           task_id=str(seed), seed=seed, tools=self.tool_schemas())

    def step(self, action: Any) -> StepResult:
        if self._done:
            raise FailedPrecondition("episode over")
        turn, self._turn = self._turn, self._turn + 1
        if isinstance(action, MessageAction):
            self._told.append(action.content)
            self._done = True
            return StepResult(observation=[Message.user("ok ###STOP###")], done=True)
        assert isinstance(action, ToolAction)
        if action.error or action.name != "add" or set(action.arguments) != {"a", "b"}:
            self._events.append({"capability": "tool_call_precision", "event": "malformed_argument",
                                 "turn": turn, "detail": {"tool": action.name}})
            return StepResult(observation=[self.tool_error(action, "call add(a, b) with two integers")])
        return StepResult(observation=[Message.tool(action.call_id,
                                                    str(action.arguments["a"] + action.arguments["b"]))])

    def reward(self) -> float:
        return 1.0 if any(str(self.a + self.b) in t for t in self._told) else 0.0

    def diagnostics(self) -> list[dict[str, Any]]:
        return list(self._events)

    def failure_reason(self) -> str | None:
        return None if self.reward() == 1.0 else "sum not told"
