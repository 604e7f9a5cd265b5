"""OpenAI-compatible HTTP backend against a scripted in-test HTTP server (tests.support.fake_openai):
tool calls, text fallback, token data, adapter selection, and typed failures."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.fake_openai import FakeOpenAI, completion
from trace_common.env.messages import Message
from trace_common.errors import ContextExhausted, Unavailable
from trace_common.policy.base import PolicyRequest, SamplingParams
from trace_common.policy.errors import PolicyUnavailable
from trace_common.policy.http_backend import OpenAIPolicy

TOOLS = [{"type": "function", "function": {"name": "get_order_details", "description": "d",
                                           "parameters": {"type": "object", "properties": {}}}}]
MESSAGES = [Message.system("policy"), Message.user("status of #W12345?"),
            Message.assistant("Checking."), Message.user("ok")]


def req(**params) -> PolicyRequest:
    return PolicyRequest(messages=list(MESSAGES), tools=TOOLS, params=SamplingParams(**params))


@pytest.fixture()
def server():
    srv = FakeOpenAI()
    yield srv
    srv.close()


def run_one(server, request, **kwargs):
    async def go():
        policy = OpenAIPolicy(server.base_url, "base", **kwargs)
        try:
            return await policy.complete(request), policy
        finally:
            await policy.close()

    return asyncio.run(go())


SERVER_CALL = {"id": "chatcmpl-tool-9f1", "type": "function",
               "function": {"name": "get_order_details", "arguments": '{"order_id": "#W12345"}'}}
WITH_TOKENS = dict(completion("hello"), prompt_token_ids=[1, 2, 3])
WITH_TOKENS["choices"][0].update(token_ids=[7, 8], logprobs={"content": [
    {"token": "hel", "logprob": -0.5, "bytes": None, "top_logprobs": []},
    {"token": "lo", "logprob": -0.25, "bytes": None, "top_logprobs": []}]})

# (id, scripted reply, expected content, expected calls [(name, args)], parse errors, token data)
OK_CASES = [
    ("native tool call", completion("", [SERVER_CALL]), None, [("get_order_details", '{"order_id": "#W12345"}')],
     0, None),
    ("plain text", completion("Order #W12345 is delivered."), "Order #W12345 is delivered.", [], 0, None),
    ("text tool call without a server parser",
     completion('<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>'),
     None, [("get_order_details", '{"order_id": "#W1"}')], 0, None),
    ("malformed text tool call", completion("<tool_call>{broken</tool_call>"), None,
     [("invalid_tool_call", "{broken")], 1, None),
    ("token ids and logprobs", WITH_TOKENS, "hello", [], 0, ([1, 2, 3], [7, 8], [-0.5, -0.25])),
]


@pytest.mark.parametrize(("reply", "content", "calls", "n_errors", "tokens"), [c[1:] for c in OK_CASES],
                         ids=[c[0] for c in OK_CASES])
def test_replies(server, reply, content, calls, n_errors, tokens):
    server.script.append({"json": reply})
    turn, policy = run_one(server, req(seed=4), request_token_ids=True)
    assert turn.message.content == content
    assert [(c.function.name, c.function.arguments) for c in turn.message.tool_calls or []] == calls
    assert [c.id for c in turn.message.tool_calls or []] == [f"call_1_{k}" for k in range(len(calls))]
    assert len(turn.parse_errors) == n_errors
    got = (turn.prompt_token_ids, turn.completion_token_ids, turn.logprobs)
    assert got == (tokens if tokens else (None, None, None))
    assert policy.stats.requests == 1 and policy.stats.malformed_turns == n_errors


def test_request_carries_tools_sampling_and_adapter_name(server):
    server.script.append({"json": completion("x")})
    run_one(server, req(temperature=0.7, top_p=0.9, top_k=5, max_tokens=33, seed=8), adapter="precision-v2",
            request_token_ids=True)
    (body,) = server.requests
    assert body["model"] == "precision-v2"
    assert body["tools"] == TOOLS
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"], body["seed"]) == (0.7, 0.9, 5, 33, 8)
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert body["messages"][1] == {"role": "user", "content": "status of #W12345?"}


# (id, scripted replies, kwargs, expected kind, expected status)
FAIL_CASES = [
    ("HTTP 500 after retries", [{"status": 500, "json": {"error": "boom"}}] * 2, {"max_retries": 1},
     "http_error", 500),
    ("HTTP 400", [{"status": 400, "json": {"error": "bad"}}], {"max_retries": 0}, "http_error", 400),
    # the words of a context refusal elsewhere than in the server's message (an echoed field) are not one
    ("HTTP 400 echoing", [{"status": 400, "json": {"error": {"message": "invalid tool schema",
                                                             "param": "maximum context length is in my prompt"}}}],
     {"max_retries": 0}, "http_error", 400),
    ("garbage body", [{"raw": b"this is not json"}], {"max_retries": 0}, "bad_response", None),
    ("JSON that is not a completion", [{"json": {"hello": "world"}}], {"max_retries": 0}, "bad_response", None),
    ("empty choices", [{"json": dict(completion("x"), choices=[])}], {"max_retries": 0}, "bad_response", None),
    ("slow server", [{"sleep": 1.5, "json": completion("late")}], {"max_retries": 0, "timeout_s": 0.3},
     "timeout", None),
]


@pytest.mark.parametrize(("script", "kwargs", "kind", "status"), [c[1:] for c in FAIL_CASES],
                         ids=[c[0] for c in FAIL_CASES])
def test_failures_are_typed(server, script, kwargs, kind, status):
    server.script.extend(script)
    with pytest.raises(PolicyUnavailable) as info:
        run_one(server, req(), **kwargs)
    err = info.value
    assert isinstance(err, Unavailable) and err.code == "UNAVAILABLE"
    assert err.kind == kind and err.status == status
    assert server.base_url in err.reason


@pytest.mark.parametrize("message", [
    # vLLM's OpenAI-compatible refusal, and TRACE's own inference service's
    "This model's maximum context length is 4096 tokens. However, you requested 4200 tokens (4100 in the "
    "messages, 100 in the completion). Please reduce the length of the messages or completion.",
    "messages: expected a prompt shorter than the model's context (4096 tokens), got 4100 tokens",
])
def test_a_context_length_refusal_is_context_exhausted_not_a_backend_failure(server, message):
    """The episode ends as context_exhausted (the agent's budget in tokens), not as policy_error."""
    server.script.append({"status": 400, "json": {"error": {"message": message, "type": "BadRequestError"}}})
    with pytest.raises(ContextExhausted, match="HTTP 400"):
        run_one(server, req(), max_retries=0)


def test_retry_recovers_from_one_server_error(server):
    server.script.extend([{"status": 503, "json": {"error": "busy"}}, {"json": completion("ok")}])
    turn, policy = run_one(server, req(), max_retries=2)
    assert turn.message.content == "ok" and len(server.requests) == 2
    assert policy.stats.failed_requests == 0


def test_connection_refused_is_typed():
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "base", max_retries=0, timeout_s=2)
    with pytest.raises(PolicyUnavailable) as info:
        asyncio.run(policy.complete(req()))
    assert info.value.kind == "connection"


def test_episode_records_policy_error_for_a_dead_endpoint(server):
    """The episode loop turns the typed error into a failed episode, not a crash."""
    from trace_common.domains.store import StoreEnv
    from trace_common.env.environment import Termination
    from trace_common.policy.episodes import play_episodes

    server.default = {"status": 500, "json": {"error": "down"}}

    async def go():
        policy = OpenAIPolicy(server.base_url, "base", max_retries=0)
        try:
            return await play_episodes(StoreEnv, policy, [(1_000_000, 0)], SamplingParams(seed=1))
        finally:
            await policy.close()

    (traj,) = asyncio.run(go())
    assert traj.termination == Termination.POLICY_ERROR
    assert "http_error" in traj.error and "HTTP 500" in traj.error
    assert traj.reward == 0.0


def test_concurrent_requests_run_in_parallel(server):
    server.latency = 0.3
    server.default = {"json": completion("ok")}

    async def go():
        policy = OpenAIPolicy(server.base_url, "base", max_retries=0)
        try:
            loop = asyncio.get_running_loop()
            start = loop.time()
            turns = await policy.generate([req(seed=i) for i in range(6)])
            return turns, loop.time() - start
        finally:
            await policy.close()

    turns, elapsed = asyncio.run(go())
    assert [t.message.content for t in turns] == ["ok"] * 6
    assert elapsed < 6 * 0.3 * 0.6  # overlapped, not sequential
    assert json.loads(json.dumps(server.requests[0]))["model"] == "base"
