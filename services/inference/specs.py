"""Validated inference requests (pydantic), built from the proto by the servicer."""

from __future__ import annotations

from pydantic import Field, field_validator

from trace_common.limits import Identifier, UriRef
from trace_common.moe.composition_io import Routing
from trace_common.specs import (
    COMPOSITION_NAME_RE,
    SamplingModel,
    Strict,
    check_printable,
    check_uri,
    composition_routing_mode,
)

NAME_RE = COMPOSITION_NAME_RE


class AdapterRefModel(Strict):
    name: Identifier
    uri: UriRef

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        return check_uri(v, "adapter uri")


class CompositionSpecModel(Strict):
    name: Identifier
    base_model: UriRef = Field(min_length=1)
    adapters: list[AdapterRefModel] = Field(default_factory=list, max_length=64)
    gates_uri: UriRef = ""
    routing: Routing = Field("token", description="How the adapters are applied: the proto's CompositionRouting "
                             "value name (UNSPECIFIED = token) or the mode itself (token, per_request, merged).")

    @field_validator("routing", mode="before")
    @classmethod
    def _routing(cls, v: object) -> object:
        if isinstance(v, str) and not v.startswith("COMPOSITION_ROUTING_"):
            return v  # already a mode (in-process callers); the Literal checks it
        return composition_routing_mode(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"composition name {v!r} must be 1-128 characters of letters, digits, '_.:-'")
        return v

    @field_validator("gates_uri")
    @classmethod
    def _gates(cls, v: str) -> str:
        return check_uri(v, "gates_uri", required=False)

    @field_validator("base_model")
    @classmethod
    def _base(cls, v: str) -> str:
        # a built-in agent name or a path / URI (model_refs decides which may be read): no one URI form,
        # so only what none of them may hold is refused here
        return check_printable(v, "base_model")


class ChatMessageModel(Strict):
    role: Identifier
    content: str = ""
    tool_calls: list[dict] = Field(default_factory=list)
    tool_call_id: Identifier = ""
    name: Identifier = ""

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in {"system", "user", "assistant", "tool"}:
            raise ValueError(f"role {v!r} must be one of system, user, assistant, tool")
        return v


class GenerateModel(Strict):
    model: Identifier = Field(min_length=1, description="Composition name (see ListCompositions).")
    messages: list[ChatMessageModel] = Field(min_length=1, max_length=10_000)
    tools: list[dict] = Field(default_factory=list)
    sampling: SamplingModel = SamplingModel()
    return_routing_trace: bool = False
