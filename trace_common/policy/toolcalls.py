"""Hermes/Qwen-style tool calls in model text: parse them into OpenAI messages, render them back.

A model that has no native function-calling API writes its calls inside its reply:

    <tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W12345"}}</tool_call>

`parse_assistant_text` turns such a reply into an assistant `Message` with OpenAI
`tool_calls` (ids are deterministic: `call_<turn>_<k>`), or a plain text message when the
reply has no `<tool_call>` tag. It never raises on model output. A malformed call (broken
JSON, a missing or non-string name, arguments that are not an object, an unclosed tag)
still becomes a tool call, built so that the environment answers it with an error
observation the agent can read and learn from:

- the arguments string is kept verbatim when it is not a JSON object, so
  `trace_common.env.messages.tool_action_from_call` sets `ToolAction.error`
  ("arguments are not valid JSON ...") and the environment answers `Error: ...`;
- a call whose name cannot be read is named `invalid_tool_call`, which no environment
  defines, so the answer is the environment's "unknown tool" error.

Each problem is also reported in `ParsedReply.errors` (one reason per malformed call) so
backends can count malformed turns without re-parsing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from trace_common.env.messages import FunctionCall, Message, ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
#: Name given to a call whose function name could not be read (no environment defines it).
INVALID_TOOL_NAME = "invalid_tool_call"

_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]{1,128})"')


@dataclass
class ParsedReply:
    """A model reply parsed into an assistant message.

    `message` is always a valid assistant `Message`; `errors` holds one human-readable
    reason per malformed tool call (empty when every call parsed); `n_calls` counts the
    `<tool_call>` blocks found (well-formed or not).
    """

    message: Message
    errors: list[str] = field(default_factory=list)
    n_calls: int = 0

    @property
    def malformed(self) -> bool:
        return bool(self.errors)


def call_id(turn: int, index: int) -> str:
    """Deterministic id of the `index`-th call in assistant turn `turn` (0-based)."""
    return f"call_{turn}_{index}"


def _split_blocks(text: str) -> tuple[list[tuple[str, bool]], str]:
    """Split `text` into tool-call bodies (body, closed?) and the text outside the tags."""
    blocks: list[tuple[str, bool]] = []
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        # A second opening tag before the closing one means this call was never closed.
        next_open = text.find(TOOL_CALL_OPEN, body_start)
        if end < 0 or (0 <= next_open < end):
            stop = next_open if next_open >= 0 else len(text)
            blocks.append((text[body_start:stop], False))
            pos = stop
            continue
        blocks.append((text[body_start:end], True))
        pos = end + len(TOOL_CALL_CLOSE)
    return blocks, "".join(outside).replace(TOOL_CALL_CLOSE, "")


def _arguments_string(value: Any) -> tuple[str, str | None]:
    """(arguments JSON string, error or None) for the model's `arguments` value."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False), None
    if isinstance(value, str):
        # Some models double-encode: accept a string that decodes to an object.
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return value, "arguments is a string that is not JSON"
        if isinstance(decoded, dict):
            return json.dumps(decoded, ensure_ascii=False), None
        return value, f"arguments decodes to {type(decoded).__name__}, not an object"
    return json.dumps(value), f"arguments is {type(value).__name__}, not an object"


def _parse_block(body: str, closed: bool, cid: str) -> tuple[ToolCall, str | None]:
    """One `<tool_call>` body -> (tool call, error reason or None)."""
    stripped = body.strip()
    unclosed = "" if closed else " (unclosed <tool_call>)"
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError as exc:
        match = _NAME_RE.search(stripped)
        name = match.group(1) if match else INVALID_TOOL_NAME
        # Verbatim body as arguments: decoding fails again in the env -> an error observation.
        raw = stripped if stripped else "<empty>"
        return (ToolCall(id=cid, function=FunctionCall(name=name, arguments=raw)),
                f"tool call is not valid JSON ({exc.msg} at char {exc.pos}){unclosed}")
    if not isinstance(obj, dict):
        return (ToolCall(id=cid, function=FunctionCall(name=INVALID_TOOL_NAME, arguments=stripped)),
                f"tool call is a JSON {type(obj).__name__}, expected an object with name and arguments"
                f"{unclosed}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        args, _ = _arguments_string(obj.get("arguments", {}))
        return (ToolCall(id=cid, function=FunctionCall(name=INVALID_TOOL_NAME, arguments=args)),
                f"tool call has no string 'name' (keys: {', '.join(sorted(map(str, obj))) or 'none'}){unclosed}")
    raw_args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    args, error = _arguments_string(raw_args)
    if error is None and not closed:
        error = "unclosed <tool_call>"
        # The JSON itself is complete: keep the call usable, but count the format slip.
    return ToolCall(id=cid, function=FunctionCall(name=name.strip(), arguments=args)), error


def parse_assistant_text(text: str, turn: int = 0) -> ParsedReply:
    """Parse a model reply. `turn` is the 0-based index of this assistant turn in the
    conversation; it makes call ids unique and deterministic."""
    blocks, outside = _split_blocks(text)
    content = outside.strip()
    if not blocks:
        return ParsedReply(message=Message.assistant(content))
    calls: list[ToolCall] = []
    errors: list[str] = []
    for index, (body, closed) in enumerate(blocks):
        call, error = _parse_block(body, closed, call_id(turn, index))
        calls.append(call)
        if error is not None:
            errors.append(f"call {index}: {error}")
    return ParsedReply(message=Message.assistant(content or None, calls), errors=errors, n_calls=len(blocks))


def render_tool_call(call: ToolCall | dict[str, Any]) -> str:
    """The text form of one call, `<tool_call>{"name": ..., "arguments": ...}</tool_call>`,
    with the arguments string inserted verbatim (what the TRACE chat template renders)."""
    if isinstance(call, dict):
        call = ToolCall.model_validate(call)
    return (f'{TOOL_CALL_OPEN}{{"name": {json.dumps(call.function.name, ensure_ascii=False)}, '
            f'"arguments": {call.function.arguments}}}{TOOL_CALL_CLOSE}')


def render_assistant_text(message: Message) -> str:
    """An assistant message as model text: its content, then one line per tool call."""
    parts = [message.content] if message.content else []
    parts += [render_tool_call(tc) for tc in message.tool_calls or []]
    return "\n".join(parts)
