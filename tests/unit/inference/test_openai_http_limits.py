"""The OpenAI-compatible HTTP front's bound on completions in progress (openai_http.OpenAIServer): past
`max_in_flight` a request is refused at once with 429, and a slot frees when a completion ends, however
it ends. A real aiohttp server on loopback; the domain is a stand-in whose generation waits to be let go."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from services.inference.openai_http import OpenAIServer
from trace_common.errors import NotFound

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
