"""The OpenAI-compatible client against a scripted HTTP server (transport behaviour only)."""

import asyncio

import pytest

from tests.support.fake_openai import FakeOpenAI, completion
from trace_common import errors
from trace_common.llm import ChatClient, LlmConfig

CALL = {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "#W1"}'}}


def _run(script, **cfg):
    srv = FakeOpenAI(script)
    try:
        client = ChatClient(LlmConfig(base_url=srv.base_url, model="m", **cfg))

        async def go():
            try:
                return await client.complete([{"role": "user", "content": "hi"}], seed=7)
            finally:
                await client.close()
        return asyncio.run(go()), srv.requests
    finally:
        srv.close()


@pytest.mark.parametrize(("script", "content", "calls", "n_requests"), [
    ([{"json": completion("hello")}], "hello", [], 1),
    ([{"json": completion("", [CALL])}], "", [CALL], 1),
    ([{"status": 503, "json": {"error": "busy"}}, {"json": completion("after retry")}], "after retry", [], 2),
])
def test_completions(script, content, calls, n_requests):
    result, requests = _run(script, max_retries=2)
    assert result.content == content and result.tool_calls == calls
    assert len(requests) == n_requests and requests[0]["seed"] == 7 and requests[0]["model"] == "m"


@pytest.mark.parametrize(("script", "exc", "fragment", "cfg"), [
    ([{"sleep": 1.5, "json": completion("late")}] * 3, errors.DeadlineExceeded, "did not answer", dict(
        timeout_seconds=0.3, max_retries=1)),
    ([{"status": 500, "json": {"error": "x"}}] * 3, errors.Unavailable, "HTTP 500", dict(max_retries=1)),
    ([{"status": 400, "json": {"error": "bad"}}], errors.InvalidArgument, "HTTP 400", dict(max_retries=0)),
    ([{"raw": b"<html>not json</html>"}], errors.Unavailable, "not an OpenAI", dict(max_retries=0)),
    ([{"json": {"choices": []}}], errors.Unavailable, "no choices", dict(max_retries=0)),
])
def test_failures_become_domain_errors(script, exc, fragment, cfg):
    with pytest.raises(exc, match=fragment):
        _run(script, **cfg)


def test_unreachable_endpoint_is_unavailable():
    client = ChatClient(LlmConfig(base_url="http://127.0.0.1:1/v1", model="m", max_retries=0, timeout_seconds=2))
    with pytest.raises(errors.Unavailable, match="cannot reach"):
        asyncio.run(client.complete([{"role": "user", "content": "x"}]))


@pytest.mark.parametrize(("cfg", "exc"), [
    (dict(base_url="ftp://x", model="m"), errors.InvalidArgument),
    (dict(base_url="http://x/v1", model="m", api_key_env="TRACE_TEST_UNSET_KEY"), errors.FailedPrecondition),
])
def test_bad_config(cfg, exc):
    with pytest.raises(exc):
        ChatClient(LlmConfig(**cfg))
