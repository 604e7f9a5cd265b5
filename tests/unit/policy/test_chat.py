"""Chat formatting: the TRACE template, the Hermes fallback, assistant spans, and the round trip
render -> generate-like slice -> parse -> the same message."""

from __future__ import annotations

import json

import pytest

from tests.unit.policy.helpers import store_trajectories, tiny_tokenizer
from trace_common.env.messages import Message, ToolCall
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, ChatFormat, render_template_text
from trace_common.policy.toolcalls import parse_assistant_text

TOOLS = [{"type": "function", "function": {
    "name": "cancel_pending_order", "description": "Cancel a pending order.",
    "parameters": {"type": "object", "properties": {
        "order_id": {"type": "string"}, "reason": {"type": "string", "enum": ["no longer needed", "mistake"]},
        "item_ids": {"type": "array", "items": {"type": "string"}}, "note": {"type": "string"}},
        "required": ["order_id", "reason", "item_ids"]}}}]

CONVERSATION = [
    Message.system("Be helpful."),
    Message.user("Cancel #W12345 please."),
    Message.assistant(None, [ToolCall.create("call_0", "cancel_pending_order",
                                             {"order_id": "#W12345", "reason": "mistake", "item_ids": ["1"]})]),
    Message.tool("call_0", "cancelled"),
    Message.assistant("Done: order #W12345 is cancelled."),
]

PLAIN_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                "{% endif %}")
NO_TOOL_ROLE = ("{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}"
                "{{ raise_exception('roles must be system/user/assistant') }}{% endif %}"
                "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture()
def tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = TRACE_CHATML_TEMPLATE
    return tok


def test_trace_template_renders_compact_tools_and_calls(tokenizer):
    text = ChatFormat(tokenizer).render(CONVERSATION, TOOLS, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe helpful.\n<tools>\n"
        'cancel_pending_order(order_id: string, reason: "no longer needed"|"mistake", item_ids: [string], '
        "note?: string): Cancel a pending order.\n</tools><|im_end|>\n"
        "<|im_start|>user\nCancel #W12345 please.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "cancel_pending_order", "arguments": {"order_id": "#W12345", '
        '"reason": "mistake", "item_ids": ["1"]}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\ncancelled<|im_end|>\n"
        "<|im_start|>assistant\nDone: order #W12345 is cancelled.<|im_end|>\n"
        "<|im_start|>assistant\n")


@pytest.mark.parametrize(("messages", "tools", "starts"), [
    (CONVERSATION[1:2], TOOLS, "<|im_start|>system\n<tools>\ncancel_pending_order("),
    (CONVERSATION[1:2], None, "<|im_start|>user\n"),
    (CONVERSATION[:2], None, "<|im_start|>system\nBe helpful.<|im_end|>\n"),
], ids=["tools without system", "no tools no system", "system without tools"])
def test_trace_template_system_block(tokenizer, messages, tools, starts):
    assert ChatFormat(tokenizer).render(messages, tools).startswith(starts)


def test_standalone_renderer_matches_the_tokenizer(tokenizer):
    for traj in store_trajectories()[:4]:
        assert (render_template_text(TRACE_CHATML_TEMPLATE, traj.messages, traj.tools)
                == ChatFormat(tokenizer).render(traj.messages, traj.tools, add_generation_prompt=False))


def test_round_trip_through_assistant_spans(tokenizer):
    """Each assistant reply, cut out of the rendered conversation as a model would have
    generated it, parses back to the same message (call ids aside)."""
    chat = ChatFormat(tokenizer)
    checked = 0
    for traj in store_trajectories()[:6]:
        text, spans = chat.assistant_spans(traj.messages, traj.tools)
        replies = [m for m in traj.messages if m.role == "assistant"]
        assert len(spans) == len(replies)
        for (start, end), original in zip(spans, replies, strict=True):
            generated = text[start:end]
            assert generated.endswith("<|im_end|>")
            parsed = parse_assistant_text(generated[: -len("<|im_end|>")])
            assert not parsed.errors
            assert parsed.message.content == original.content
            assert ([(c.function.name, json.loads(c.function.arguments)) for c in parsed.message.tool_calls or []]
                    == [(c.function.name, json.loads(c.function.arguments)) for c in original.tool_calls or []])
            checked += 1
    assert checked > 20


def test_hermes_mode_for_templates_without_tools(tokenizer):
    tokenizer.chat_template = PLAIN_CHATML
    chat = ChatFormat(tokenizer)
    assert chat.mode == "hermes"
    text = chat.render(CONVERSATION, TOOLS, add_generation_prompt=False)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe helpful.\n\n")
    assert json.dumps(TOOLS[0]) in system  # full JSON schema, one per line, in <tools>
    assert '<tool_call>{"name": "cancel_pending_order", "arguments": {"order_id": "#W12345"' in text
    assert "<|im_start|>tool\ncancelled<|im_end|>" in text
    _, spans = chat.assistant_spans(CONVERSATION, TOOLS)
    assert len(spans) == 2


def test_hermes_mode_falls_back_to_user_role_for_tool_results(tokenizer):
    tokenizer.chat_template = NO_TOOL_ROLE
    chat = ChatFormat(tokenizer)
    text = chat.render(CONVERSATION, TOOLS)
    assert "<|im_start|>user\n<tool_response>\ncancelled\n</tool_response><|im_end|>" in text
    assert "<|im_start|>tool" not in text


def test_tokenizer_without_template_gets_trace_template(tokenizer):
    tokenizer.chat_template = None
    chat = ChatFormat(tokenizer)
    assert chat.mode == "template" and chat.template == TRACE_CHATML_TEMPLATE


def test_tool_calls_are_single_tokens(tokenizer):
    ids = tokenizer("<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert pieces[0] == "<tool_call>" and pieces[-2] == "</tool_call>" and pieces[-1] == "<|im_end|>"
    assert tokenizer.decode(ids) == "<tool_call>{}</tool_call><|im_end|>"
