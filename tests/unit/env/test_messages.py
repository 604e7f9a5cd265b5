"""OpenAI message shapes, their dict round trip, and turning assistant messages into actions."""

from __future__ import annotations

import pytest

from trace_common.env import (
    Message,
    MessageAction,
    ToolAction,
    ToolCall,
    action_from_dict,
    actions_from_message,
    messages_from_dicts,
    messages_to_dicts,
)
from trace_common.errors import InvalidArgument

CALL = {"id": "call_7", "type": "function",
        "function": {"name": "get_order_details", "arguments": '{"order_id": "#W12345"}'}}


@pytest.mark.parametrize("data", [
    {"role": "system", "content": "policy"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "order #W12345 pending", "tool_call_id": "call_7"},
    {"role": "user", "content": "hi", "name": "bob"},
])
def test_dict_round_trip(data):
    assert Message.from_dict(data).to_dict() == data
    assert messages_to_dicts(messages_from_dicts([data])) == [data]


def test_openai_extra_keys_are_ignored():
    msg = Message.from_dict({"role": "assistant", "content": "x", "refusal": None, "annotations": []})
    assert msg.to_dict() == {"role": "assistant", "content": "x"}


@pytest.mark.parametrize("data, field", [
    ({"role": "user", "content": "x", "tool_calls": [CALL]}, "tool_calls"),
    ({"role": "tool", "content": "x"}, "tool_call_id"),
    ({"role": "user", "content": None}, "content"),
    ({"role": "assistant", "content": None}, "content"),
])
def test_invalid_messages(data, field):
    with pytest.raises(InvalidArgument) as info:
        Message.from_dict(data)
    assert info.value.field == field


@pytest.mark.parametrize("message, expected", [
    (Message.assistant(None, [ToolCall.model_validate(CALL)]),
     [ToolAction(name="get_order_details", arguments={"order_id": "#W12345"}, call_id="call_7",
                 raw_arguments='{"order_id": "#W12345"}')]),
    (Message.assistant("text is dropped", [ToolCall.create("c1", "a", {"x": 1}),
                                           ToolCall.create("c2", "b", {})]),
     [ToolAction(name="a", arguments={"x": 1}, call_id="c1", raw_arguments='{"x": 1}'),
      ToolAction(name="b", arguments={}, call_id="c2", raw_arguments="{}")]),
    (Message.assistant("Your order is cancelled."), [MessageAction(content="Your order is cancelled.")]),
    (Message.assistant(""), [MessageAction(content="")]),
])
def test_actions_from_message(message, expected):
    assert actions_from_message(message) == expected


@pytest.mark.parametrize("raw, error_start", [
    ('{"order_id": ', "arguments are not valid JSON"),
    ('["#W12345"]', "arguments must be a JSON object, got list"),
    ('"x"', "arguments must be a JSON object, got str"),
])
def test_broken_arguments_become_action_errors(raw, error_start):
    call = ToolCall.model_validate({"id": "c", "function": {"name": "get_order_details", "arguments": raw}})
    (action,) = actions_from_message(Message.assistant(None, [call]))
    assert isinstance(action, ToolAction)
    assert action.error is not None and action.error.startswith(error_start)
    assert action.arguments == {} and action.raw_arguments == raw


def test_only_assistant_messages_carry_actions():
    with pytest.raises(InvalidArgument):
        actions_from_message(Message.user("hi"))


@pytest.mark.parametrize("data, expected", [
    ({"message": "hello"}, MessageAction(content="hello")),
    ({"name": "add", "arguments": {"a": 1}}, ToolAction(name="add", arguments={"a": 1})),
    ({"name": "add", "arguments": '{"a": 1}', "call_id": "k"},
     ToolAction(name="add", arguments={"a": 1}, call_id="k", raw_arguments='{"a": 1}')),
])
def test_action_from_dict(data, expected):
    action = action_from_dict(data)
    assert action == expected
    assert action_from_dict(action.to_dict()) == action


@pytest.mark.parametrize("data", [{"nothing": 1}, {"message": 3}, {"name": "a", "arguments": [1]}, "text"])
def test_action_from_dict_rejects(data):
    with pytest.raises(InvalidArgument):
        action_from_dict(data)
