"""OpenAI-compatible HTTP API next to the gRPC one (aiohttp), so OpenAI clients -- the rollout
service's `OpenAIPolicy`, tau2-style harnesses, the `openai` SDK -- call a composition unchanged.

    POST /v1/chat/completions   model = composition name; messages; tools; temperature, top_p,
                                max_tokens | max_completion_tokens, seed, stream, logprobs;
                                extensions: top_k, return_routing_trace
    GET  /v1/models             the loaded compositions
    GET  /health                {"status": "ok"} (+ "compositions" when the caller may see them)

Auth: when the service has a token (TRACE_INFERENCE_AUTH_TOKEN, the same one gRPC requires), every
path except /health needs `Authorization: Bearer <token>` -- the header OpenAI clients send
with `api_key=<token>` -- checked by the gRPC interceptor's own rule
(`trace_common.grpc.auth.BearerToken`, constant-time). Without it the answer is 401 with
OpenAI's shape `{"error": {"message", "type": "invalid_request_error", "code": "invalid_api_key"}}`
and `WWW-Authenticate: Bearer`; unknown paths answer 401 too, so routes cannot be probed.
/health stays open, like grpc.health.v1, for load balancers and probes that carry no secret; it
lists the loaded composition names only to an authenticated caller (or when auth is off).

Replies follow the chat.completion schema: `choices[0].message` with `content` and structured
`tool_calls` (parsed from the model's Hermes `<tool_call>` text by the shared parser; then
`finish_reason` is "tool_calls"), `usage`, `logprobs.content` when asked. With
`return_routing_trace: true` the response carries `routing_trace`: one `{token_id, token_text,
experts}` per generated token (expert slot per layer) and `experts` (slot names). `stream: true`
sends `chat.completion.chunk` server-sent events: content deltas, then a last chunk with the
parsed tool calls and the finish reason, then `data: [DONE]`. Streamed, `routing_trace` rides on
the chunks: each chunk carries the routes of the tokens generated since the previous chunk (a token
whose text is held back, an unfinished UTF-8 character or the stop token, travels with the next one),
so the chunks' lists joined are the non-streamed trace, and the last chunk adds `experts`. Streamed
`logprobs` come as OpenAI streams them, in `choices[0].logprobs.content`; the engine reports a
generation's logprobs when it ends, so they all travel in the last chunk (joined across chunks, as
OpenAI clients do, they are the non-streamed list).

Request bodies are bounded as gRPC messages are: at most the service's `max_message_bytes`
(TRACE_INFERENCE_MAX_MESSAGE_BYTES; 413 past it, before the rest is read), and parsed only when
what parsing can take -- body, decoded text, strings and `PARSED_BYTES_PER_VALUE` per JSON value --
fits in 3 x max_message_bytes (413 otherwise), so a completion in progress holds about that much
at most, as README's bound says. Parsing and validation run in a worker thread, not on the event
loop that serves gRPC too; the body and its parsed form are dropped once the request is built.

Errors use OpenAI's shape `{"error": {"message", "type", "code"}}`: malformed JSON or fields (a
value nested too deep, an integer too long to read, a number past any float included, each named)
and over-long prompts -> 400 `invalid_request_error`; a body over the bounds above -> 413
`invalid_request_error`; unknown model -> 404 `model_not_found`; limits -> 429; generation failure
-> 503; anything unexpected -> 500 without internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from trace_common.env.messages import Message
from trace_common.errors import TraceError
from trace_common.grpc.auth import BearerToken

from .service import ChatRequest, Completion, Inference, StreamDelta, TokenRouteInfo, parse_tool_schemas

log = logging.getLogger(__name__)

_STATUS = {"INVALID_ARGUMENT": (400, "invalid_request_error"), "NOT_FOUND": (404, "model_not_found"),
           "RESOURCE_EXHAUSTED": (429, "rate_limit_exceeded"), "UNAVAILABLE": (503, "server_error"),
           "FAILED_PRECONDITION": (400, "invalid_request_error")}
#: The body cap of a server built around a domain with no settings (stand-ins in tests); the service's
#: own is its `max_message_bytes`, the same as its gRPC messages'.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: What one JSON value can take once parsed, at most: an empty object is 64 bytes and its slot in the
#: list holding it 8, a short string ~50 and a dict entry ~30 (CPython 3.11, measured with
#: tracemalloc on bodies of nothing else; 86 at worst, nested empty lists).
PARSED_BYTES_PER_VALUE = 96
#: What a completion's body may take while it is parsed, in units of max_message_bytes (README's bound).
PARSE_BUDGET = 3
#: What a client is told of a failure that is no domain error (never the exception itself).
INTERNAL_ERROR = "internal error while generating; see the service log"


class BadRequest(Exception):
    """A request body that is not a valid chat completion request (HTTP 400; 413 for one too large)."""

    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


def error_response(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": code, "param": None}},
                             status=status)


def error_event(exc: Exception) -> bytes:
    """The SSE event that ends a stream whose generation failed after its response began (OpenAI's shape:
    an `error` object; no second response can follow the first)."""
    if isinstance(exc, TraceError):
        _status, kind = _STATUS.get(exc.code, (500, "server_error"))
        message, code = exc.reason, exc.code.lower()
    else:
        log.error("streamed completion failed", exc_info=exc)
        kind, message, code = "server_error", INTERNAL_ERROR, None
    body = {"error": {"message": message, "type": kind, "code": code, "param": None}}
    return f"data: {json.dumps(body)}\n\n".encode()


def _content_text(content: Any, index: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"messages[{index}].content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{index}].content must be a string, a list of text parts or null")


def chat_request_from_body(body: Any) -> ChatRequest:
    """Validate an OpenAI chat completion body (BadRequest / InvalidArgument on any problem)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required: the name of a loaded composition (GET /v1/models)")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise BadRequest("'messages' must be a non-empty list of chat messages")
    messages = []
    for i, raw in enumerate(raw_messages):
        if not isinstance(raw, dict):
            raise BadRequest(f"messages[{i}] must be an object with role and content")
        item = dict(raw, content=_content_text(raw.get("content"), i))
        if item.get("role") == "developer":
            item["role"] = "system"
        try:
            messages.append(Message.from_dict(item))
        except (TraceError, ValueError) as exc:
            raise BadRequest(f"messages[{i}]: {exc}") from exc
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of function tool schemas")
    n = body.get("n", 1)
    if n not in (1, None):
        raise BadRequest("only n=1 is supported")

    def number(key: str, default: float, kind: type = float) -> Any:
        value = body.get(key)
        if value is None:
            return default
        wrong = BadRequest(f"'{key}' must be a finite {'integer' if kind is int else 'number'}")
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or (isinstance(value, float) and not math.isfinite(value)):   # NaN and Infinity parse as JSON numbers
            raise wrong
        try:
            if kind is int and int(value) != value:
                raise wrong
            return kind(value)
        except OverflowError as exc:   # a JSON integer past any float (1 and 400 zeros) as a float field
            raise wrong from exc

    max_tokens = number("max_completion_tokens", 0, int) or number("max_tokens", 0, int)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise BadRequest("'seed' must be a non-negative integer")
    temperature = number("temperature", 1.0)
    top_p = number("top_p", 1.0)
    top_k = number("top_k", 0, int)
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0 or max_tokens < 0:
        raise BadRequest("expected temperature >= 0, 0 < top_p <= 1, top_k >= 0, max_tokens >= 0")
    return ChatRequest(model=model, messages=messages, tools=parse_tool_schemas(tools), temperature=temperature,
                       top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed,
                       return_routing_trace=flag(body, "return_routing_trace"), api="openai")


def flag(body: dict[str, Any], key: str) -> bool:
    """A boolean option of the body (absent or null: false); BadRequest naming it for anything else, so
    a "false" string is not taken for true."""
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false")
    return value


@dataclass(frozen=True)
class ParsedChat:
    """A validated completion request and the HTTP-only options beside it: all a handler keeps of a body."""

    request: ChatRequest
    stream: bool
    logprobs: bool


class _LongInteger:
    """Stands, in a parsed body, for a JSON integer too long for `int` to read (Python refuses more than
    `sys.get_int_max_str_digits()` digits), so the error can name where it was."""

    def __init__(self, digits: int):
        self.digits = digits


def _long_integer(body: Any) -> tuple[str, _LongInteger] | None:
    """(JSON path, marker) of the first `_LongInteger` in `body`, depth first; None when there is none."""
    todo: list[tuple[str, Any]] = [("", body)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, _LongInteger):
            return f"'{path}'" if path else "the request body", value
        if isinstance(value, dict):
            todo.extend((f"{path}.{k}" if path else str(k), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            todo.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def parse_cost(raw: bytes | bytearray) -> int:
    """An upper bound of the bytes `parse_body` holds at its peak for `raw`, the body included: first the
    body and its decoded text (1 byte a character for ASCII, up to 4 otherwise), then the text and the
    parsed strings (no wider than the text, unless a \\u escape widens one to 4 bytes a character) and
    `PARSED_BYTES_PER_VALUE` per JSON value (counted by the separators and brackets that open one, those
    inside strings too: an overestimate). A few counting passes over the bytes, no parse."""
    size = len(raw)
    text = size if raw.isascii() else 4 * size
    strings = text if b"\\u" not in raw else 4 * size
    values = 1 + sum(raw.count(c) for c in (b",", b":", b"[", b"{"))
    return max(size + text, text + strings + PARSED_BYTES_PER_VALUE * values)


_gc_lock = threading.Lock()
_gc_pauses = 0            # parses in progress with the collector paused (under _gc_lock)
_gc_was_enabled = False   # the collector's state when the first of them began


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while JSON is parsed, back as it was when the last parse ends.

    Every list json builds is a tracked container, and each batch of them triggers a collection that
    walks the whole heap -- a loaded service holds hundreds of thousands of objects -- with the GIL held
    throughout: 233,000 empty lists took 0.7 s to parse that way (19 ms without), all of it lost to the
    event loop. A parsed body is a tree, never a cycle, so nothing is left for the collector to find."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)   # what json builds itself (the last of repeated keys wins); see parse_body


def _loads(text: str) -> Any:
    """`text` parsed (BadRequest naming what is wrong: not JSON, nested too deep, an integer too long)."""
    too_long: list[_LongInteger] = []

    def read_int(digits: str) -> int | _LongInteger:
        try:
            return int(digits)
        except ValueError:   # past int's digit limit: from inside json.loads, a 500 otherwise
            too_long.append(_LongInteger(len(digits.lstrip("-"))))
            return too_long[-1]

    try:
        with _collector_paused():
            # the hooks are Python functions on purpose: json's C scanner never lets go of the GIL, so the
            # thread running it would hold up the event loop for the whole parse; a Python call per object
            # and integer gives the interpreter points to hand the GIL over (every sys.getswitchinterval())
            body = json.loads(text, parse_int=read_int, object_pairs_hook=_object)
    except RecursionError as exc:
        raise BadRequest("the request body nests JSON values deeper than this service parses; a chat completion "
                         "request needs a few levels (tool schemas a few more)") from exc
    except ValueError as exc:   # JSONDecodeError included
        raise BadRequest(f"the request body is not JSON ({exc})") from exc
    if too_long:
        path, marker = _long_integer(body) or ("the request body", too_long[0])
        raise BadRequest(f"{path} is an integer of {marker.digits} digits, more than this service reads; "
                         "send a number of a sensible size")
    return body


def parse_body(holder: list[bytearray], max_body_bytes: int) -> ParsedChat:
    """The chat request of the body `holder` holds (BadRequest / InvalidArgument on any problem). Run in a
    worker thread: parsing megabytes takes the event loop's time otherwise.

    The body is taken out of `holder` and dropped as soon as it is decoded, and the parsed dict dies with
    this call, so neither outlives what the request needs (the caller keeps only `holder`, then empty)."""
    raw = holder.pop()
    cost = parse_cost(raw)
    if cost > PARSE_BUDGET * max_body_bytes:
        raise BadRequest(f"the request body ({len(raw)} bytes) could take {cost} bytes of memory once parsed, "
                         f"more than {PARSE_BUDGET} x max_message_bytes ({max_body_bytes}) a completion may hold; "
                         "send fewer JSON values (or have the operator raise TRACE_INFERENCE_MAX_MESSAGE_BYTES)",
                         413, "request_too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the request body is not UTF-8 JSON ({exc})") from exc
    del raw
    body = _loads(text)
    del text
    try:
        return ParsedChat(chat_request_from_body(body), stream=flag(body, "stream"), logprobs=flag(body, "logprobs"))
    except RecursionError as exc:   # a body just under json's own depth limit, walked again by validation
        raise BadRequest("the request body nests JSON values deeper than this service validates") from exc


def _tool_calls(c: Completion) -> list[dict[str, Any]]:
    return [{"id": tc.id, "type": "function", "function": {"name": tc.function.name,
                                                            "arguments": tc.function.arguments}}
            for tc in c.message.tool_calls or []]


def _route(r: TokenRouteInfo) -> dict[str, Any]:
    return {"token_id": r.token_id, "token_text": r.token_text, "experts": r.experts}


def _logprobs(c: Completion, tokenizer: Any) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content`: one entry per generated token."""
    return [{"token": tokenizer.decode([tid], skip_special_tokens=False), "logprob": lp, "bytes": None,
             "top_logprobs": []} for tid, lp in zip(c.token_ids, c.logprobs, strict=True)]


def completion_body(c: Completion, model: str, want_logprobs: bool, tokenizer: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.message.content}
    calls = _tool_calls(c)
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": c.finish_reason, "logprobs": None}
    if want_logprobs:
        choice["logprobs"] = {"content": _logprobs(c, tokenizer)}
    body = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens}}
    if c.routing:
        body["routing_trace"] = [_route(r) for r in c.routing]
        body["experts"] = c.expert_names
    return body


#: Paths answered without a token (probes); everything else needs one when auth is on.
OPEN_PATHS = frozenset({"/health"})


def unauthorized(reason: str) -> web.Response:
    resp = error_response(401, reason, "invalid_request_error", "invalid_api_key")
    resp.headers["WWW-Authenticate"] = 'Bearer realm="trace-inference"'
    return resp


class OpenAIServer:
    """The aiohttp server around the domain (built by app.py, started by the service's on_start hook).

    `token`: the bearer token every request but /health must carry; None = no auth (the
    embedded default on loopback; the service logs that it runs without auth). `tls`: (certificate
    chain, private key) PEM files -- the service's own TLS settings, so with TLS on the token never
    crosses the network in the clear on either port; None = plain HTTP. `max_body_bytes`: the largest
    request body; None = the domain's `settings.max_message_bytes`, what its gRPC API accepts."""

    def __init__(self, domain: Inference, host: str, port: int, token: str | None = None,
                 tls: tuple[Path, Path] | None = None, max_in_flight: int = 256, max_body_bytes: int | None = None):
        self.domain, self.host, self.port = domain, host, port
        if max_body_bytes is None:
            max_body_bytes = getattr(getattr(domain, "settings", None), "max_message_bytes", MAX_BODY_BYTES)
        self.max_body_bytes = max_body_bytes
        # completions in progress at once, as max_concurrent_rpcs bounds gRPC calls: each holds its body and
        # its row in the batcher's queue, so without a bound a client could queue them until memory runs out
        self.max_in_flight, self._in_flight = max_in_flight, 0
        self._tls = tls
        self._token = BearerToken(token) if token is not None else None
        self.app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._auth])
        self.app.add_routes([web.post("/v1/chat/completions", self.chat_completions),
                             web.get("/v1/models", self.models), web.get("/health", self.health)])
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}/v1"

    @property
    def auth(self) -> bool:
        return self._token is not None

    def _refusal(self, request: web.Request) -> str | None:
        """Why `request` may not proceed (None: it may); always None without a token."""
        if self._token is None:
            return None
        why = self._token.refusal(request.headers.get("Authorization"))
        if why is None:
            return None
        return ("missing 'Authorization: Bearer <token>' header; pass the inference service's auth token "
                "as the API key" if request.headers.get("Authorization") is None else
                "invalid API key; use the token the inference service was started with (TRACE_INFERENCE_AUTH_TOKEN)")

    @web.middleware
    async def _auth(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            why = self._refusal(request)
            if why is not None:
                return unauthorized(why)
        return await handler(request)

    async def start(self) -> None:
        # a client that disconnects cancels its handler, and so its generation (Inference._run)
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        context = None
        if self._tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(self._tls[0]), str(self._tls[1]))
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=context)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # noqa: SLF001 - the bound port when port=0
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("inference OpenAI-compatible API on %s (%s, %s)", self.url,
                 "bearer token required" if self.auth else "no auth", "TLS" if self._tls else "plain HTTP")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def health(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {"status": "ok"}
        if self._refusal(request) is None:  # composition names only for a caller that may use them
            body["compositions"] = self.domain.registry.names()
        return web.json_response(body)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "trace"} for name in self.domain.registry.names()]})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        if self._in_flight >= self.max_in_flight:
            return error_response(429, f"{self._in_flight} completions are in progress, the most this service takes "
                                  "at once (TRACE_INFERENCE_MAX_CONCURRENT_RPCS); retry later", "rate_limit_exceeded",
                                  "resource_exhausted")
        self._in_flight += 1
        try:
            return await self._chat_completions(request)
        finally:
            self._in_flight -= 1

    async def _read_body(self, request: web.Request) -> bytearray:
        """The body, refused (413) past `max_body_bytes` before the rest is read. Read here, not with
        `request.read()`, which keeps a copy on the request for as long as the handler runs."""
        too_large = BadRequest(f"the request body is larger than max_message_bytes ({self.max_body_bytes} bytes), "
                               "the most this service takes (TRACE_INFERENCE_MAX_MESSAGE_BYTES); send less",
                               413, "request_too_large")
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise too_large
        body = bytearray()
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > self.max_body_bytes:   # chunked, or a Content-Length that lied
                raise too_large
        return body

    async def _parse(self, request: web.Request) -> ParsedChat:
        holder = [await self._read_body(request)]   # parse_body empties it: nothing here keeps the body
        return await asyncio.to_thread(parse_body, holder, self.max_body_bytes)

    def _tokenizer(self, parsed: ParsedChat) -> Any:
        """The composition's tokenizer when logprobs need one to name their tokens, taken before generating:
        looked up afterwards, a composition unloaded meanwhile would turn the finished work into a 404."""
        return self.domain.registry.get(parsed.request.model).tokenizer if parsed.logprobs else None

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            parsed = await self._parse(request)
            tokenizer = self._tokenizer(parsed)
            if parsed.stream:
                return await self._stream(request, parsed.request, tokenizer)
            completion = await self.domain.generate(parsed.request)
            return web.json_response(completion_body(completion, parsed.request.model, parsed.logprobs, tokenizer))
        except BadRequest as exc:
            return error_response(exc.status, str(exc), "invalid_request_error", exc.code)
        except TraceError as exc:
            status, kind = _STATUS.get(exc.code, (500, "server_error"))
            return error_response(status, exc.reason, kind, exc.code.lower())
        except web.HTTPException:
            raise
        except Exception:  # noqa: BLE001 - never a stack trace to clients
            log.exception("chat completion failed")
            return error_response(500, INTERNAL_ERROR, "server_error")

    async def _stream(self, request: web.Request, req: ChatRequest, tokenizer: Any) -> web.StreamResponse:
        """Server-sent chunks (module docstring): content deltas carrying the routes of their tokens, then
        the last chunk with tool calls, finish reason, usage, the routes left, `experts` and the logprobs."""
        stream = self.domain.generate_stream(req)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        routes: list[dict[str, Any]] = []   # of tokens generated since the last chunk

        def chunk(delta: dict[str, Any], finish: str | None = None, extra: dict | None = None,
                  logprobs: dict | None = None) -> bytes:
            data = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                    **(extra or {})}
            if routes:
                data["routing_trace"] = routes.copy()
                routes.clear()
            return f"data: {json.dumps(data)}\n\n".encode()

        try:   # whatever ends this handler (a disconnect cancelling it included) closes the generation
            first = await anext(stream)  # errors before the first token still become a JSON error response
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            await response.write(chunk({"role": "assistant", "content": ""}))
            event = first
            while True:
                if isinstance(event, StreamDelta):
                    if event.route is not None:
                        routes.append(_route(event.route))
                    if event.text:
                        await response.write(chunk({"content": event.text}))
                else:
                    await response.write(self._last_chunk(event, chunk, tokenizer))
                    break
                try:
                    event = await anext(stream)
                except Exception as exc:  # noqa: BLE001 - the 200 is sent: an error event ends the stream
                    await response.write(error_event(exc))
                    return response
            await response.write(b"data: [DONE]\n\n")
        finally:
            await stream.aclose()
        return response

    @staticmethod
    def _last_chunk(c: Completion, chunk, tokenizer: Any) -> bytes:
        calls = _tool_calls(c)
        delta = {"tool_calls": [dict(call, index=i) for i, call in enumerate(calls)]} if calls else {}
        extra: dict[str, Any] = {"usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                                           "total_tokens": c.prompt_tokens + c.completion_tokens}}
        if c.routing:
            extra["experts"] = c.expert_names
        logprobs = {"content": _logprobs(c, tokenizer)} if tokenizer is not None else None
        return chunk(delta, c.finish_reason, extra, logprobs)
