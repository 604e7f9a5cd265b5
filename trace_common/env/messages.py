"""Chat messages, tool calls and agent actions in OpenAI chat format.

Every environment, policy backend and trajectory file in TRACE speaks one message shape,
the OpenAI chat-completions one, so a trajectory can be replayed against any
OpenAI-compatible server and a chat template can render it unchanged:

    {"role": "assistant", "content": null,
     "tool_calls": [{"id": "call_0", "type": "function",
                     "function": {"name": "get_order_details",
                                  "arguments": "{\\"order_id\\": \\"#W12345\\"}"}}]}
    {"role": "tool", "tool_call_id": "call_0", "content": "order #W12345 ..."}

`arguments` stays the JSON *string* the model produced (a model that writes broken JSON
must be visible as such). An `Action` is what an environment consumes: either a
`ToolAction` (one function call, arguments decoded to a dict) or a `MessageAction` (text
for the user). `actions_from_message` turns one assistant message into its actions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trace_common.errors import InvalidArgument

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(BaseModel):
    """The `function` part of a tool call: a name and the arguments as a JSON string."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="Function (tool) name as the model wrote it.")
    arguments: str = Field(default="{}", description="Arguments as a JSON object string, verbatim.")


class ToolCall(BaseModel):
    """One OpenAI tool call: `{"id", "type": "function", "function": {"name", "arguments"}}`."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(description="Call id; the answering tool message carries it as tool_call_id.")
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def create(cls, call_id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
        """A tool call whose arguments are serialised compactly (sorted keys are NOT imposed:
        the caller's key order is what a model would have produced)."""
        return cls(id=call_id, function=FunctionCall(name=name, arguments=json.dumps(arguments)))

    @property
    def name(self) -> str:
        return self.function.name


def _unset(value: Any) -> bool:
    return value is None


def _no_calls(value: Any) -> bool:
    return not value  # None or []: an OpenAI message without tool calls has no tool_calls key


class Message(BaseModel):
    """One chat message. `content` may be None only for an assistant message with tool calls."""

    model_config = ConfigDict(extra="ignore")

    # Unset optional keys (and an empty tool_calls) are left out of every dump, so pydantic's own
    # serialiser -- and `to_dict`, which is a dump -- writes the OpenAI shape.
    # `Trajectory.to_json_line` relies on it to write a trajectory in one Rust-side pass (5x
    # faster than dict + json.dumps; bench/rollout_overhead).
    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] | None = Field(
        default=None, exclude_if=_no_calls, description="Assistant only: the calls this message makes.")
    tool_call_id: str | None = Field(default=None, exclude_if=_unset,
                                     description="Tool only: the id of the call answered.")
    name: str | None = Field(default=None, exclude_if=_unset, description="Optional author name.")

    @model_validator(mode="after")
    def _role_fields(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise InvalidArgument(field="tool_calls", expected="tool calls only on role 'assistant'",
                                  got=self.role, fix="Move the calls to an assistant message.")
        if self.role == "tool" and not self.tool_call_id:
            raise InvalidArgument(field="tool_call_id", expected="the id of the answered tool call",
                                  fix="Set tool_call_id on every role 'tool' message.")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise InvalidArgument(field="content", expected="a string",
                                  fix="Only an assistant message with tool_calls may have null content.")
        return self

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def system(cls, text: str) -> Message:
        return cls(role="system", content=text)

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role="user", content=text)

    @classmethod
    def assistant(cls, text: str | None = None, tool_calls: list[ToolCall] | None = None) -> Message:
        return cls(role="assistant", content=text, tool_calls=tool_calls or None)

    @classmethod
    def tool(cls, tool_call_id: str, text: str) -> Message:
        return cls(role="tool", content=text, tool_call_id=tool_call_id)

    # -- OpenAI dict form ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """OpenAI dict: always `role` and `content` (content may be null), the other keys
        only when set."""
        return self.model_dump(mode="json")  # the fields' exclude_if leaves unset keys out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        """Parse an OpenAI message dict; unknown keys (refusal, annotations...) are ignored."""
        if not isinstance(data, dict):
            raise InvalidArgument(field="message", expected="an OpenAI chat message object", got=data)
        return cls.model_validate(data)


def messages_to_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


def messages_from_dicts(items: list[dict[str, Any]]) -> list[Message]:
    return [Message.from_dict(d) for d in items]


# -- actions --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolAction:
    """A call of one tool. `error` is set (and `arguments` is {}) when the model's argument
    string was not a JSON object; an environment must answer such an action with an error
    tool observation and change nothing."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = "call_0"
    raw_arguments: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": self.arguments, "call_id": self.call_id}
        if self.raw_arguments is not None:
            out["raw_arguments"] = self.raw_arguments
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class MessageAction:
    """Text sent to the user."""

    content: str

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.content}


Action = ToolAction | MessageAction


def action_from_dict(data: dict[str, Any]) -> Action:
    """Inverse of `to_dict`: `{"name", "arguments"[, "call_id"]}` or `{"message"}`."""
    if not isinstance(data, dict):
        raise InvalidArgument(field="action", expected='{"name", "arguments"} or {"message"}', got=data)
    if "message" in data:
        if not isinstance(data["message"], str):
            raise InvalidArgument(field="action.message", expected="a string", got=data["message"])
        return MessageAction(content=data["message"])
    if "name" not in data:
        raise InvalidArgument(field="action", expected='a "name" (tool call) or a "message" key', got=data,
                              fix='Send {"name": tool, "arguments": {...}} or {"message": text}.')
    args = data.get("arguments", {})
    if isinstance(args, str):
        return tool_action_from_call(ToolCall(id=str(data.get("call_id", "call_0")),
                                              function=FunctionCall(name=data["name"], arguments=args)))
    if not isinstance(args, dict):
        raise InvalidArgument(field="action.arguments", expected="an object", got=args)
    return ToolAction(name=str(data["name"]), arguments=args, call_id=str(data.get("call_id", "call_0")),
                      raw_arguments=data.get("raw_arguments"), error=data.get("error"))


def tool_action_from_call(call: ToolCall) -> ToolAction:
    """Decode a tool call's argument string. Broken JSON or a non-object becomes `error`."""
    raw = call.function.arguments
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        return ToolAction(name=call.name, call_id=call.id, raw_arguments=raw,
                          error=f"arguments are not valid JSON ({exc.msg} at char {exc.pos})")
    if not isinstance(args, dict):
        return ToolAction(name=call.name, call_id=call.id, raw_arguments=raw,
                          error=f"arguments must be a JSON object, got {type(args).__name__}")
    return ToolAction(name=call.name, arguments=args, call_id=call.id, raw_arguments=raw)


def actions_from_message(message: Message) -> list[Action]:
    """The actions one assistant message performs, in order.

    Tool calls win: when a message has tool calls, its text (if any) is *not* delivered to
    the user (the tau2 convention: one tool call or one user message per turn). A message
    with neither becomes an empty `MessageAction`.
    """
    if message.role != "assistant":
        raise InvalidArgument(field="message.role", expected="'assistant'", got=message.role,
                              fix="Only assistant messages carry agent actions.")
    if message.tool_calls:
        return [tool_action_from_call(tc) for tc in message.tool_calls]
    return [MessageAction(content=message.content or "")]
