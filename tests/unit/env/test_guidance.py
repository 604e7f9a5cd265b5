"""The `<expert_guidance>` block (trace_common/env/guidance.py): its text, where it goes, and that
it is absent until a caller adds it."""

from __future__ import annotations

import pytest

from trace_common.env import Message
from trace_common.env.guidance import (
    CLOSE,
    HEADER,
    OPEN,
    action_line,
    gold_actions_text,
    guidance_block,
    has_guidance_block,
    with_guidance_block,
)

LINES = [
    ({"name": "get_order_details", "arguments": {"order_id": "#W1"}}, 'get_order_details {"order_id": "#W1"}'),
    ({"name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "ordered by mistake"}},
     'cancel_pending_order {"order_id": "#W1", "reason": "ordered by mistake"}'),
    ({"name": "list_user_orders"}, "list_user_orders {}"),
    ({"message": "Refunded  45.00\nfor #W1."}, "tell the user: Refunded 45.00 for #W1."),
]


@pytest.mark.parametrize(("action", "line"), LINES)
def test_action_line(action, line):
    assert action_line(action) == line


def test_an_action_with_neither_name_nor_message_is_refused():
    with pytest.raises(ValueError, match="'name'"):
        action_line({"arguments": {}})


def test_gold_actions_text_numbers_every_action():
    text = gold_actions_text([a for a, _ in LINES])
    assert text.splitlines() == [HEADER, *(f"{i}. {line}" for i, (_, line) in enumerate(LINES, 1))]
    assert gold_actions_text([]) == ""


CASES = {
    "system prompt present": ([Message.system("POLICY"), Message.user("hi")], 0, "POLICY\n\n"),
    "no system prompt": ([Message.user("hi")], 0, ""),
    "empty system prompt": ([Message.system(""), Message.user("hi")], 0, ""),   # no leading blank line
}


@pytest.mark.parametrize(("messages", "where", "prefix"), CASES.values(), ids=list(CASES))
def test_block_goes_at_the_end_of_the_system_prompt(messages, where, prefix):
    out = with_guidance_block(messages, "1. do it")
    assert out[where].role == "system"
    assert out[where].content == f"{prefix}{OPEN}\n1. do it\n{CLOSE}"
    assert out[-1] == messages[-1]                  # the user message is untouched
    assert has_guidance_block(out) and not has_guidance_block(messages)


def test_empty_guidance_changes_nothing():
    messages = [Message.system("POLICY"), Message.user("hi")]
    assert with_guidance_block(messages, "  ") == messages
    assert guidance_block("") == ""
