"""A target's surface: what an environment must keep to look like the target to a policy.

A capability environment trains one skill for a target (docs/design.md "Environment
interface"), so everything the policy sees that is not the scenario itself must be the
target's: its system prompt verbatim, its opening (an assistant greeting when the target has
one), all of its tools with their schemas, and its renderings of ids, amounts, names and
tool outputs. `describe_target(env)` reads these from a target instance through the SDK:

    surface = describe_target(make("store"))
    surface.system_prompt      # the target's system message, exactly as reset() shows it
    surface.greeting           # its assistant-first opening message, or None
    surface.tool_schemas       # ALL of its tools (OpenAI function format)
    surface.toolkit            # 'module:Attribute' of its record toolkit (records.py), or None
    surface.toolkit_params     # the JSON parameters that toolkit is built from

How it is obtained:

- An environment that defines `surface()` returns its own `TargetSurface` (tau2 retail does:
  its reset needs a user simulator, and its toolkit needs the catalog of its data directory).
- Otherwise `describe_target` resets the environment on the first seed of its "train" split
  (else of its first split) and takes the first message (it must be the system message) and,
  when the second message is from the assistant, that one as the greeting. The record
  toolkit is found by convention: a module `record_toolkit` in the package of the
  environment's class exposing `TOOLKIT` (a `RecordToolkit` subclass); its parameters are
  `TOOLKIT.params_for(env)`. Without such a module `toolkit` is None.

`load_toolkit(surface)` builds the toolkit a surface names (trusted, in-process code; a
sandboxed module imports the toolkit module statically instead).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trace_common.env.environment import Environment
from trace_common.env.records import RecordToolkit, split_ref
from trace_common.errors import FailedPrecondition, InvalidArgument

TOOLKIT_MODULE = "record_toolkit"
TOOLKIT_ATTRIBUTE = "TOOLKIT"


class TargetSurface(BaseModel):
    """What a target shows a policy (see module docstring). JSON-able as a whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Registry name of the target, e.g. 'store'.")
    version: str = Field(description="Its version, e.g. '1.0.0'.")
    system_prompt: str = Field(description="The target's system message, verbatim as its reset() shows it.")
    greeting: str | None = Field(None, description="The assistant-first opening message, if the target has one.")
    tool_schemas: list[dict[str, Any]] = Field(description="All of the target's tools, OpenAI function format.")
    toolkit: str | None = Field(None, description="'package.module:Attribute' of the target's record toolkit.")
    toolkit_params: dict[str, Any] = Field(default_factory=dict,
                                           description="JSON keyword parameters of the toolkit's constructor.")

    @field_validator("toolkit")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        if value is not None:
            split_ref(value)
        return value

    def tool_names(self) -> list[str]:
        return [s["function"]["name"] for s in self.tool_schemas]

    def schema(self, tool: str) -> dict[str, Any] | None:
        return next((s for s in self.tool_schemas if s["function"]["name"] == tool), None)


def _first_seed(env: Environment) -> int:
    splits = env.splits()
    for name in ("train", *splits):
        seeds = splits.get(name)
        if seeds is not None and len(seeds) > 0:
            return int(seeds[0])
    raise FailedPrecondition(f"environment {env.name!r} has no seeds in its splits; describe_target needs one "
                             "to read its opening")


def discover_toolkit(env: Environment) -> tuple[str | None, dict[str, Any]]:
    """(reference, parameters) of the toolkit found by convention (see module docstring)."""
    package = type(env).__module__.rpartition(".")[0]
    if not package:
        return None, {}
    module_name = f"{package}.{TOOLKIT_MODULE}"
    if importlib.util.find_spec(module_name) is None:
        return None, {}
    module = importlib.import_module(module_name)
    cls = getattr(module, TOOLKIT_ATTRIBUTE, None)
    if not (isinstance(cls, type) and issubclass(cls, RecordToolkit)):
        return None, {}
    return f"{module_name}:{TOOLKIT_ATTRIBUTE}", cls.params_for(env)


def describe_target(env: Environment) -> TargetSurface:
    """The surface of the target instance `env` (see module docstring)."""
    own = getattr(env, "surface", None)
    if callable(own):
        surface = own()
        if not isinstance(surface, TargetSurface):
            raise InvalidArgument(field=f"{env.name}.surface()", expected="a TargetSurface",
                                  got=type(surface).__name__)
        return surface
    obs = env.reset(_first_seed(env))
    messages = obs.messages
    if not messages or messages[0].role != "system" or not messages[0].content:
        raise FailedPrecondition(f"environment {env.name!r} does not open with a system message; a target's "
                                 "surface starts with its system prompt")
    greeting = messages[1].content if len(messages) > 1 and messages[1].role == "assistant" else None
    toolkit, params = discover_toolkit(env)
    return TargetSurface(name=env.name, version=env.version, system_prompt=messages[0].content, greeting=greeting,
                         tool_schemas=env.tool_schemas(), toolkit=toolkit, toolkit_params=params)


def toolkit_class(ref: str) -> type[RecordToolkit]:
    module_name, attribute = split_ref(ref)
    cls = getattr(importlib.import_module(module_name), attribute, None)
    if not (isinstance(cls, type) and issubclass(cls, RecordToolkit)):
        raise InvalidArgument(field="toolkit", expected="a RecordToolkit subclass", got=ref)
    return cls


def load_toolkit(surface: TargetSurface) -> RecordToolkit:
    """The record toolkit `surface` names, built from its parameters."""
    if surface.toolkit is None:
        raise FailedPrecondition(f"target {surface.name!r} names no record toolkit")
    return toolkit_class(surface.toolkit)(**surface.toolkit_params)


def toolkit_sha256(ref: str) -> str:
    """sha256 of the source file of the toolkit's module (what a sandboxed import runs)."""
    module_name, _ = split_ref(ref)
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        raise FailedPrecondition(f"toolkit module {module_name!r} has no source file")
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()


__all__ = ["TargetSurface", "describe_target", "discover_toolkit", "load_toolkit", "toolkit_class",
           "toolkit_sha256"]
