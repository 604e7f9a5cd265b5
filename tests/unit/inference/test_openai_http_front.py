"""The OpenAI-compatible HTTP front (openai_http.OpenAIServer) around a stand-in domain, on a real aiohttp
server on loopback: past `max_in_flight` a completion is refused at once with 429 and a slot frees when a
completion ends, however it ends; a stream whose generation fails after its 200 ends with an error event."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from services.inference.openai_http import OpenAIServer
from services.inference.service import StreamDelta
from trace_common.errors import NotFound, Unavailable

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class WaitingDomain:
    """Generation that waits for `release`, then fails as an unknown model would (404): enough to hold a slot."""

    def __init__(self):
        self.release = asyncio.Event()
        self.started = 0

    async def generate(self, req):
        self.started += 1
        await self.release.wait()
        raise NotFound("no loaded composition 'm'")


@pytest.mark.asyncio
@pytest.mark.parametrize("limit", [1, 3])
async def test_completions_past_the_limit_get_429_and_slots_free_when_they_end(limit):
    domain = WaitingDomain()
    server = OpenAIServer(domain, "127.0.0.1", 0, max_in_flight=limit)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            held = [asyncio.create_task(http.post("/chat/completions", json=BODY)) for _ in range(limit)]
            while domain.started < limit:
                await asyncio.sleep(0.01)
            refused = await http.post("/chat/completions", json=BODY)
            assert refused.status_code == 429
            error = refused.json()["error"]
            assert error["type"] == "rate_limit_exceeded" and "TRACE_INFERENCE_MAX_CONCURRENT_RPCS" in error["message"]
            assert domain.started == limit                     # the refused one never reached the domain
            domain.release.set()
            assert [r.status_code for r in await asyncio.gather(*held)] == [404] * limit
            assert (await http.post("/chat/completions", json=BODY)).status_code == 404   # slots freed
    finally:
        await server.stop()


class FailingStream:
    """A stream that sends one delta, then fails as a broken batch would."""

    def __init__(self, error: Exception):
        self.error = error

    async def generate_stream(self, req):
        yield StreamDelta("Hel", 1, None)
        raise self.error


@pytest.mark.asyncio
@pytest.mark.parametrize("error, kind, needle", [
    (Unavailable("the batch failed: CUDA error"), "server_error", "the batch failed"),
    (RuntimeError("a bug"), "server_error", "internal error while generating"),   # never the bug's text
])
async def test_a_stream_that_fails_midway_ends_with_an_error_event(error, kind, needle):
    server = OpenAIServer(FailingStream(error), "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            resp = await http.post("/chat/completions", json={**BODY, "stream": True})
        assert resp.status_code == 200
        events = [json.loads(line.removeprefix("data: ")) for line in resp.text.splitlines() if line.startswith("data: ")]
        assert [e["choices"][0]["delta"] for e in events[:2]] == [{"role": "assistant", "content": ""},
                                                                  {"content": "Hel"}]
        (last,) = events[2:]                                   # the error, and no [DONE] after it
        assert last["error"]["type"] == kind and needle in last["error"]["message"] and "a bug" not in resp.text
    finally:
        await server.stop()
