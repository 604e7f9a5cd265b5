"""Tool-call parsing of model text: well-formed, malformed and plain replies (a table), and the
promise that a malformed call reaches the environment as an error observation."""

from __future__ import annotations

import json

import pytest

from trace_common.env.messages import ToolAction, actions_from_message
from trace_common.policy.toolcalls import (
    INVALID_TOOL_NAME,
    parse_assistant_text,
    render_assistant_text,
    render_tool_call,
)

GOOD = '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W12345"}}</tool_call>'

# (id, text, expected content, expected [(name, arguments-string)], expected number of errors, error fragment)
CASES = [
    ("plain text", "Your order is delivered.", "Your order is delivered.", [], 0, None),
    ("plain text is stripped", "  hello \n", "hello", [], 0, None),
    ("empty reply", "", "", [], 0, None),
    ("one call", GOOD, None, [("get_order_details", '{"order_id": "#W12345"}')], 0, None),
    ("whitespace inside tags", '<tool_call>\n {"name": "a", "arguments": {}} \n</tool_call>', None,
     [("a", "{}")], 0, None),
    ("text before the call is kept", "Let me check.\n" + GOOD, "Let me check.",
     [("get_order_details", '{"order_id": "#W12345"}')], 0, None),
    ("two calls", GOOD + "\n" + '<tool_call>{"name": "b", "arguments": {"x": [1, 2]}}</tool_call>', None,
     [("get_order_details", '{"order_id": "#W12345"}'), ("b", '{"x": [1, 2]}')], 0, None),
    ("double-encoded arguments are accepted", '<tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>',
     None, [("a", '{"k": 1}')], 0, None),
    ("'parameters' alias", '<tool_call>{"name": "a", "parameters": {"k": 1}}</tool_call>', None,
     [("a", '{"k": 1}')], 0, None),
    ("missing arguments means none", '<tool_call>{"name": "a"}</tool_call>', None, [("a", "{}")], 0, None),
    ("non-ascii kept verbatim", '<tool_call>{"name": "a", "arguments": {"city": "Zürich"}}</tool_call>', None,
     [("a", '{"city": "Zürich"}')], 0, None),
    # -- malformed ---------------------------------------------------------------------------
    ("broken JSON keeps its name and raw text", '<tool_call>{"name": "a", "arguments": {"k": }}</tool_call>', None,
     [("a", '{"name": "a", "arguments": {"k": }}')], 1, "not valid JSON"),
    ("broken JSON without a name", "<tool_call>{oops</tool_call>", None,
     [(INVALID_TOOL_NAME, "{oops")], 1, "not valid JSON"),
    ("empty call", "<tool_call></tool_call>", None, [(INVALID_TOOL_NAME, "<empty>")], 1, "not valid JSON"),
    ("JSON array instead of object", "<tool_call>[1, 2]</tool_call>", None,
     [(INVALID_TOOL_NAME, "[1, 2]")], 1, "JSON list"),
    ("no name", '<tool_call>{"arguments": {"k": 1}}</tool_call>', None,
     [(INVALID_TOOL_NAME, '{"k": 1}')], 1, "no string 'name'"),
    ("name is not a string", '<tool_call>{"name": 3, "arguments": {}}</tool_call>', None,
     [(INVALID_TOOL_NAME, "{}")], 1, "no string 'name'"),
    ("arguments is a list", '<tool_call>{"name": "a", "arguments": [1]}</tool_call>', None,
     [("a", "[1]")], 1, "not an object"),
    ("arguments is a non-JSON string", '<tool_call>{"name": "a", "arguments": "k=1"}</tool_call>', None,
     [("a", "k=1")], 1, "not JSON"),
    ("unclosed but complete JSON", '<tool_call>{"name": "a", "arguments": {"k": 1}}', None,
     [("a", '{"k": 1}')], 1, "unclosed"),
    ("truncated mid-JSON", '<tool_call>{"name": "a", "arguments": {"k": "#W1', None,
     [("a", '{"name": "a", "arguments": {"k": "#W1')], 1, "not valid JSON"),
    ("second call opens before the first closes", '<tool_call>{"name": "a"' + GOOD, None,
     [("a", '{"name": "a"'), ("get_order_details", '{"order_id": "#W12345"}')], 1, "not valid JSON"),
    ("stray closing tag is dropped from text", "done</tool_call>", "done", [], 0, None),
]


@pytest.mark.parametrize(("text", "content", "calls", "n_errors", "fragment"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_table(text, content, calls, n_errors, fragment):
    parsed = parse_assistant_text(text, turn=3)
    msg = parsed.message
    assert msg.role == "assistant"
    assert msg.content == content
    got = [(tc.function.name, tc.function.arguments) for tc in msg.tool_calls or []]
    assert got == calls
    assert [tc.id for tc in msg.tool_calls or []] == [f"call_3_{k}" for k in range(len(calls))]
    assert len(parsed.errors) == n_errors
    assert parsed.n_calls == len(calls)
    if fragment:
        assert fragment in parsed.errors[0]


OBSERVATION_CASES = [
    ("broken JSON", '<tool_call>{"name": "get_order_details", "arguments": {"order_id": }}</tool_call>',
     "arguments are not valid JSON"),
    ("arguments not an object", '<tool_call>{"name": "get_order_details", "arguments": ["#W12345"]}</tool_call>',
     "arguments must be a JSON object"),
    ("no name", '<tool_call>{"arguments": {"order_id": "#W12345"}}</tool_call>', INVALID_TOOL_NAME),
    ("not JSON at all", "<tool_call>get_order_details #W12345</tool_call>", "arguments are not valid JSON"),
]


@pytest.mark.parametrize(("text", "fragment"), [c[1:] for c in OBSERVATION_CASES],
                         ids=[c[0] for c in OBSERVATION_CASES])
def test_malformed_calls_become_error_observations(text, fragment):
    """A malformed call reaches the environment as an action it answers with an `Error:`
    observation naming the problem, and the store counts it as a tool_call_precision event."""
    from trace_common.domains.store import StoreEnv

    parsed = parse_assistant_text(text)
    assert parsed.malformed
    env = StoreEnv()
    env.reset(1_000_000)
    (action,) = actions_from_message(parsed.message)
    assert isinstance(action, ToolAction)
    (obs,) = env.step(action).observation
    assert obs.role == "tool" and obs.content.startswith("Error:")
    assert fragment in obs.content
    events = [(d["capability"], d["event"]) for d in env.diagnostics()]
    assert ("tool_call_precision", "malformed_argument") in events
    assert not env.done


@pytest.mark.parametrize("case", [c for c in CASES if c[4] == 0 and c[3]], ids=lambda c: c[0])
def test_render_parse_round_trip(case):
    """Rendering a parsed, well-formed reply and parsing it again gives the same message."""
    first = parse_assistant_text(case[1], turn=1).message
    again = parse_assistant_text(render_assistant_text(first), turn=1).message
    assert again == first


def test_render_tool_call_inserts_arguments_verbatim():
    call = {"id": "c", "type": "function", "function": {"name": "a", "arguments": '{"k": "#W1"}'}}
    text = render_tool_call(call)
    assert text == '<tool_call>{"name": "a", "arguments": {"k": "#W1"}}</tool_call>'
    assert json.loads(text[len("<tool_call>"):-len("</tool_call>")]) == {"name": "a", "arguments": {"k": "#W1"}}
