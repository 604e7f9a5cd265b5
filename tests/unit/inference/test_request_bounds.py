"""Bounds the inference domain checks before it does any work on a request:

  * the character pre-check (`rendered_chars`) counts every string the chat template can render, so a
    megabyte hidden in a tool call's function name or id, a tool_call_id or an author name is refused
    before rendering and tokenizing (before: only content and arguments were counted, and a 14M-char
    function name cost 12 s of CPU before it was refused);
  * a ToolSchema whose JSON nests past the decoder's recursion limit is InvalidArgument naming
    tools[i].json (before: RecursionError, an INTERNAL error).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from services.inference.service import (
    CHARS_PER_PROMPT_TOKEN,
    ChatRequest,
    Inference,
    parse_tool_schemas,
)
from services.inference.settings import InferenceSettings
from services.inference.specs import AdapterRefModel, CompositionSpecModel
from tests.unit.inference.helpers import write_tiny_composition
from trace_common.env.messages import FunctionCall, Message, ToolCall
from trace_common.errors import InvalidArgument
from trace_common.policy.chat import ChatFormat

LIMIT = 8192                                    # max_prompt_tokens
BIG = "x" * (CHARS_PER_PROMPT_TOKEN * LIMIT + 1)  # more than any prompt of LIMIT tokens could hold


def _call(call_id: str = "c1", name: str = "refund_order", arguments: str = "{}") -> ToolCall:
    return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))


def _conversation(*, call: ToolCall | None = None, tool_call_id: str = "c1", name: str | None = None) -> list[Message]:
    call = call or _call()
    return [Message(role="user", content="refund order A17", name=name),
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(role="tool", tool_call_id=tool_call_id, content="ok")]


CASES = {
    "content": [Message(role="user", content=BIG)],
    "tool call arguments": _conversation(call=_call(arguments=BIG)),
    "tool call function name": _conversation(call=_call(name=BIG)),
    "tool call id": _conversation(call=_call(call_id=BIG), tool_call_id="c1"),
    "tool_call_id": _conversation(tool_call_id=BIG),
    "author name": _conversation(name=BIG),
}


@pytest.fixture(scope="module")
def domain_run(world, tmp_path_factory):
    """Run `body(domain)` against an Inference with the tiny composition "c" loaded."""
    root = tmp_path_factory.mktemp("bounds")
    art = write_tiny_composition(world, root / "store")
    spec = CompositionSpecModel(name="c", base_model=str(world.model_dir), gates_uri=art.gates_uri,
                                adapters=[AdapterRefModel(name=n, uri=str(world.adapter_dirs[n]))
                                          for n in ("refunds", "addresses")])

    def run(body):
        async def main():
            domain = Inference(InferenceSettings(artifact_root=(root / "store").as_uri(), max_prompt_tokens=LIMIT,
                                                 model_cache_dir=str(root / "cache")))
            await domain.load(spec)
            try:
                return await body(domain)
            finally:
                await domain.stop()
        return asyncio.run(main())
    return run


@pytest.mark.parametrize("field", list(CASES))
def test_every_renderable_field_counts_before_rendering(domain_run, monkeypatch, field):
    rendered = []
    render = ChatFormat.render
    monkeypatch.setattr(ChatFormat, "render", lambda self, *a, **k: rendered.append(1) or render(self, *a, **k))

    async def body(domain):
        with pytest.raises(InvalidArgument) as err:
            await domain.generate(ChatRequest(model="c", messages=CASES[field], max_tokens=2))
        return err.value

    err = domain_run(body)
    assert err.field == "messages" and f"at most {LIMIT} tokens" in str(err) and "characters" in str(err), str(err)
    assert not rendered, "the request was rendered (and tokenized) before it was refused"


def test_a_conversation_with_tool_calls_under_the_bound_is_served(domain_run):
    async def body(domain):
        return await domain.generate(ChatRequest(model="c", messages=_conversation(name="alice"), max_tokens=2))

    assert domain_run(body).completion_tokens == 2


@pytest.mark.parametrize("text, reason", [
    ("[" * 100_000, "nested too deeply"),
    ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    ("{not json", "not JSON"),
    ("", "not JSON"),
])
def test_undecodable_tool_schema_json_names_the_field(text, reason):
    with pytest.raises(InvalidArgument) as err:
        parse_tool_schemas([{"type": "function", "function": {"name": "ok"}}, {"json": text}])
    assert err.value.field == "tools[1].json" and reason in str(err.value), str(err.value)
    assert "an OpenAI function tool schema as JSON" in str(err.value)


def test_a_tool_schema_as_json_is_decoded():
    schema = {"type": "function", "function": {"name": "refund_order", "parameters": {"type": "object"}}}
    assert parse_tool_schemas([{"json": json.dumps(schema)}]) == [schema]
