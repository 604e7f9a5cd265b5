"""Request bodies at the OpenAI-compatible HTTP front (openai_http.OpenAIServer) on a real aiohttp server on
loopback, around stand-in domains: every malformed or oversized body is a 400/413 in OpenAI's shape naming
what is wrong, never a 500, and never reaches the domain; the body cap is the service's max_message_bytes;
the body is parsed off the event loop and nothing of it is held while the completion is generated; a
composition unloaded while its completion is generated does not turn the finished work into a 404."""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from types import SimpleNamespace

import httpx
import pytest

from services.inference.openai_http import OpenAIServer
from services.inference.service import Completion
from trace_common.env.messages import Message
from trace_common.errors import NotFound

HI = '"messages":[{"role":"user","content":"hi"}]'


def _raw(**fields: str) -> str:
    """A completion body for model 'm' saying "hi", with `fields` written in as raw JSON text."""
    return '{"model":"m",' + HI + "".join(f',"{k}":{v}' for k, v in fields.items()) + "}"


def _completion() -> Completion:
    return Completion(text="ok", message=Message.assistant("ok"), finish_reason="stop", prompt_tokens=3,
                      completion_tokens=2, routing=[], logprobs=[-0.5, -0.25], token_ids=[7, 8],
                      expert_names=["base"])


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)


class Registry:
    """One composition 'm' until `unload`."""

    def __init__(self):
        self.loaded = True

    def get(self, name):
        if not (self.loaded and name == "m"):
            raise NotFound(f"no loaded composition {name!r}")
        return SimpleNamespace(tokenizer=Tokenizer())

    def names(self):
        return ["m"] if self.loaded else []


class Domain:
    """Answers every request at once (`generated` counts them); `on_generate` runs inside generation."""

    def __init__(self, max_message_bytes: int = 1 << 20, on_generate=None):
        self.settings = SimpleNamespace(max_message_bytes=max_message_bytes)
        self.registry = Registry()
        self.generated = 0
        self.on_generate = on_generate

    async def generate(self, req):
        self.generated += 1
        if self.on_generate is not None:
            await self.on_generate(self, req)
        return _completion()


async def _post(server: OpenAIServer, content: bytes | str, timeout: float = 60) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=timeout) as http:
        return await http.post("/chat/completions", content=content, headers={"Content-Type": "application/json"})


def _nested(depth: int) -> str:
    return '{"type":"function","function":{"name":"f","parameters":' + '{"a":' * depth + "1" + "}" * depth + "}}"


# (body, status, needle): the needle is in the error's message; none of them reaches the domain
BAD_BODIES = [
    # a JSON integer past any float as a float field: OverflowError converting it
    (_raw(temperature="1" + "0" * 400), 400, "'temperature' must be a finite number"),
    (_raw(top_p="-1" + "0" * 400), 400, "'top_p' must be a finite number"),
    # more digits than int reads (sys.get_int_max_str_digits): ValueError inside json.loads
    (_raw(top_k="1" + "0" * 5000), 400, "'top_k' is an integer of 5001 digits"),
    (_raw(tools='[{"type":"function","function":{"name":"f","parameters":{"n":-' + "9" * 5000 + "}}}]"), 400, "'tools[0].function.parameters.n' is an integer of 5000 digits"),
    # nested past json's recursion limit: RecursionError
    ("[" * 100_000, 400, "nests JSON values deeper"),
    (_raw(tools=f"[{_nested(100_000)}]"), 400, "nests JSON values deeper"),
    # options that are not booleans are named, not taken for true
    (_raw(stream='"false"'), 400, "'stream' must be true or false"),
    (_raw(logprobs="1"), 400, "'logprobs' must be true or false"),
    (_raw(return_routing_trace='"yes"'), 400, "'return_routing_trace' must be true or false"),
    (b'{"model":"m",' + HI.encode() + b',"user":"\xff"}', 400, "not UTF-8 JSON"),
]
#: with max_message_bytes = 1 MiB
TOO_LARGE = [
    # over max_message_bytes: refused before it is parsed
    (_raw(user=f'"{"x" * (1 << 20)}"'), 413, "max_message_bytes (1048576 bytes)"),
    # under it, but more JSON values than 3 x max_message_bytes could hold parsed (~25 bytes a byte)
    (_raw(x="[" + "{}," * 300_000 + "{}]"), 413, "3 x max_message_bytes (1048576)"),
    ("[" * 100_000, 413, "3 x max_message_bytes (1048576)"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("max_message_bytes, cases", [(16 << 20, BAD_BODIES), (1 << 20, TOO_LARGE)])
async def test_bad_bodies_are_named_client_errors_that_never_reach_the_domain(max_message_bytes, cases):
    domain = Domain(max_message_bytes)
    server = OpenAIServer(domain, "127.0.0.1", 0)
    await server.start()
    try:
        for body, status, needle in cases:
            resp = await _post(server, body)
            shown = body[:60]
            assert resp.status_code == status, (shown, resp.text[:300])
            error = resp.json()["error"]
            assert error["type"] == "invalid_request_error" and needle in error["message"], (shown, error)
        assert domain.generated == 0
        ok = await _post(server, _raw(stream="false", top_k="9" * 4000))
        assert ok.status_code == 200 and domain.generated == 1   # a long but readable integer is a number
    finally:
        await server.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("max_message_bytes, size, status", [(4096, 5000, 413), (4096, 4000, 200),
                                                              (64 << 10, 60 << 10, 200), (64 << 10, 70 << 10, 413)])
async def test_the_body_cap_is_the_services_max_message_bytes(max_message_bytes, size, status):
    server = OpenAIServer(Domain(max_message_bytes), "127.0.0.1", 0)
    await server.start()
    try:
        prefix = _raw(user='"')[:-1]   # ...,"user":"
        resp = await _post(server, prefix + "x" * (size - len(prefix) - 2) + '"}')
        assert resp.status_code == status, resp.text[:200]
        if status == 413:
            assert "TRACE_INFERENCE_MAX_MESSAGE_BYTES" in resp.json()["error"]["message"]
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_the_body_is_parsed_off_the_event_loop(monkeypatch):
    """A slow parse (stood in for by a 1 s sleep in json.loads) leaves the event loop -- the one serving
    gRPC too -- free: no tick of it waits behind the parse."""
    real_loads = json.loads

    def slow_loads(s, *args, **kwargs):
        if len(s) > 50_000:   # the completion's body, not the small JSON the client reads back
            time.sleep(1.0)
        return real_loads(s, *args, **kwargs)

    monkeypatch.setattr(json, "loads", slow_loads)
    server = OpenAIServer(Domain(), "127.0.0.1", 0)
    await server.start()
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick():
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        started = time.perf_counter()
        resp = await _post(server, _raw(user=f'"{"x" * 60_000}"'))
        took = time.perf_counter() - started
        done.set()
        await ticker
        assert resp.status_code == 200 and took >= 1.0   # the slow parse did run
        assert max(gaps) < 0.5, f"the event loop stood still for {max(gaps):.2f}s behind the parse"
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_nothing_of_the_body_is_held_while_the_completion_is_generated():
    """4 MB the request does not use (an unknown field): neither the raw body nor its parsed form may
    still be in memory while the domain generates (traced Python allocations since the request began)."""
    held = []

    async def measure(_domain, _req):
        held.append(tracemalloc.get_traced_memory()[0])

    server = OpenAIServer(Domain(max_message_bytes=16 << 20, on_generate=measure), "127.0.0.1", 0)
    await server.start()
    body = _raw(metadata=f'{{"blob":"{"x" * (4 << 20)}"}}').encode()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                resp = await http.post("/chat/completions", content=body)
            finally:
                tracemalloc.stop()
        assert resp.status_code == 200
        assert held[0] - before < 1 << 20, f"{(held[0] - before) >> 20} MiB held during generation"
    finally:
        await server.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("logprobs", [False, True])
async def test_a_composition_unloaded_during_generation_still_answers(logprobs):
    """The reply needs the composition's tokenizer (for logprobs): it is taken before generating, so an
    unload meanwhile does not turn finished work into a 404."""

    async def unload(domain, _req):
        domain.registry.loaded = False

    server = OpenAIServer(Domain(on_generate=unload), "127.0.0.1", 0)
    await server.start()
    try:
        resp = await _post(server, json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                               "logprobs": logprobs}))
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        assert choice["message"]["content"] == "ok"
        if logprobs:
            assert [(x["token"], x["logprob"]) for x in choice["logprobs"]["content"]] == [("<7>", -0.5),
                                                                                          ("<8>", -0.25)]
        else:
            assert choice["logprobs"] is None
    finally:
        await server.stop()
