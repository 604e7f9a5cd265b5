"""How a tau2 tool call becomes a tool message: dispatch, content rendering, errors.

tau2-bench's facts, reproduced here:

- A tool is called with the call's arguments as keyword arguments, *without* validating them
  against the schema first. Whatever the tool raises (a domain `ValueError`, or the
  `TypeError` Python raises for a missing or unexpected keyword) becomes the tool message
  `"Error: <exception text>"` and counts as a tool error. An unknown tool name gives
  `"Error: Tool '<name>' not found."`.
- A successful result is rendered as: a string unchanged; a pydantic model as
  `json.dumps(model.model_dump())` (default separators, ASCII escapes); numbers and bools as
  `str(x)` inside JSON; lists/dicts recursively.
- Tools have a kind (read / write / generic / think); only state-mutating tools (the write
  tools) are re-executed when the evaluator replays a trajectory.

Because Python's TypeError text names the bound method (`RetailTools.cancel_pending_order()
missing 1 required positional argument: 'reason'`), toolkits keep tau2's class and method
names so these messages match too.

TRACE addition (not in tau2): tool-call arguments may arrive as a JSON *string* (the raw
OpenAI `function.arguments`); it is parsed here, and text that is not a JSON object yields
`"Error: Invalid arguments for tool '<name>': <why>"` instead of crashing the episode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel


class ToolKind(StrEnum):
    READ = "read"
    WRITE = "write"
    THINK = "think"
    GENERIC = "generic"


@dataclass(frozen=True)
class ToolResult:
    """One tool message: the content the agent sees and whether the call failed."""

    content: str
    error: bool


@dataclass(frozen=True)
class ToolSpec:
    """A tool's public face: OpenAI function schema, kind, and whether replay re-runs it."""

    name: str
    kind: ToolKind
    schema: dict[str, Any]

    @property
    def mutates_state(self) -> bool:
        return self.kind is ToolKind.WRITE


def render_content(result: Any) -> str:
    """Tool return value -> tool message content, exactly as tau2 renders it."""
    if isinstance(result, str):
        return result
    return json.dumps(_plain(result), default=str)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    raise TypeError(f"unsupported tool result type {type(value).__name__}")


def parse_arguments(name: str, arguments: Any) -> dict[str, Any] | ToolResult:
    """Accept a dict or a JSON object string; anything else becomes an error ToolResult."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return ToolResult(f"Error: Invalid arguments for tool '{name}': {exc}", True)
        if isinstance(parsed, dict):
            return parsed
        return ToolResult(f"Error: Invalid arguments for tool '{name}': expected a JSON object, "
                          f"got {type(parsed).__name__}", True)
    return ToolResult(f"Error: Invalid arguments for tool '{name}': expected a JSON object, "
                      f"got {type(arguments).__name__}", True)


class Toolkit:
    """Base of tau2-compatible toolkits: subclasses register methods with `tool(kind)`."""

    #: name -> (kind, schema); filled by subclasses (see retail_tools.RetailTools).
    SPECS: Mapping[str, ToolSpec] = {}

    def specs(self) -> list[ToolSpec]:
        return list(self.SPECS.values())

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas, in tau2's tool order."""
        return [spec.schema for spec in self.SPECS.values()]

    def has_tool(self, name: str) -> bool:
        return name in self.SPECS

    def mutates_state(self, name: str) -> bool:
        spec = self.SPECS.get(name)
        return True if spec is None else spec.mutates_state

    def call(self, name: str, arguments: Any) -> ToolResult:
        """Run one tool call; never raises for anything the caller sent."""
        if name not in self.SPECS:
            return ToolResult(f"Error: Tool '{name}' not found.", True)
        parsed = parse_arguments(name, arguments)
        if isinstance(parsed, ToolResult):
            return parsed
        method: Callable[..., Any] = getattr(self, name)
        try:
            result = method(**parsed)
        except Exception as exc:  # noqa: BLE001 -- tau2 turns every tool exception into "Error: ..."
            return ToolResult(f"Error: {exc}", True)
        return ToolResult(render_content(result), False)
