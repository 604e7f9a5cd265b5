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
parsed tool calls and the finish reason, then `data: [DONE]`.

Errors use OpenAI's shape `{"error": {"message", "type", "code"}}`: malformed JSON or fields,
over-long prompts -> 400 `invalid_request_error`; unknown model -> 404 `model_not_found`;
limits -> 429; generation failure -> 503; anything unexpected -> 500 without internals.
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import time
import uuid
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
MAX_BODY_BYTES = 16 * 1024 * 1024
#: What a client is told of a failure that is no domain error (never the exception itself).
INTERNAL_ERROR = "internal error while generating; see the service log"


class BadRequest(Exception):
    """A request body that is not a valid chat completion request (HTTP 400)."""


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
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or (isinstance(value, float) and not math.isfinite(value)) \
                or (kind is int and int(value) != value):   # NaN and Infinity parse as JSON numbers here
            raise BadRequest(f"'{key}' must be a finite {'integer' if kind is int else 'number'}")
        return kind(value)

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
                       return_routing_trace=bool(body.get("return_routing_trace", False)), api="openai")


def _tool_calls(c: Completion) -> list[dict[str, Any]]:
    return [{"id": tc.id, "type": "function", "function": {"name": tc.function.name,
                                                            "arguments": tc.function.arguments}}
            for tc in c.message.tool_calls or []]


def _route(r: TokenRouteInfo) -> dict[str, Any]:
    return {"token_id": r.token_id, "token_text": r.token_text, "experts": r.experts}


def completion_body(c: Completion, model: str, want_logprobs: bool, tokenizer: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.message.content}
    calls = _tool_calls(c)
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": c.finish_reason, "logprobs": None}
    if want_logprobs:
        choice["logprobs"] = {"content": [
            {"token": tokenizer.decode([tid], skip_special_tokens=False), "logprob": lp, "bytes": None,
             "top_logprobs": []} for tid, lp in zip(c.token_ids, c.logprobs, strict=True)]}
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
    crosses the network in the clear on either port; None = plain HTTP."""

    def __init__(self, domain: Inference, host: str, port: int, token: str | None = None,
                 tls: tuple[Path, Path] | None = None, max_in_flight: int = 256):
        self.domain, self.host, self.port = domain, host, port
        # completions in progress at once, as max_concurrent_rpcs bounds gRPC calls: each holds its body and
        # its row in the batcher's queue, so without a bound a client could queue them until memory runs out
        self.max_in_flight, self._in_flight = max_in_flight, 0
        self._tls = tls
        self._token = BearerToken(token) if token is not None else None
        self.app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._auth])
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

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            try:
                body = json.loads(await request.read())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise BadRequest(f"the request body is not JSON ({exc})") from exc
            req = chat_request_from_body(body)
            if body.get("stream"):
                return await self._stream(request, req)
            completion = await self.domain.generate(req)
            tokenizer = self.domain.registry.get(req.model).tokenizer
            return web.json_response(completion_body(completion, req.model, bool(body.get("logprobs")), tokenizer))
        except BadRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        except TraceError as exc:
            status, kind = _STATUS.get(exc.code, (500, "server_error"))
            return error_response(status, exc.reason, kind, exc.code.lower())
        except web.HTTPException:
            raise
        except Exception:  # noqa: BLE001 - never a stack trace to clients
            log.exception("chat completion failed")
            return error_response(500, INTERNAL_ERROR, "server_error")

    async def _stream(self, request: web.Request, req: ChatRequest) -> web.StreamResponse:
        stream = self.domain.generate_stream(req)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, extra: dict | None = None) -> bytes:
            data = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **(extra or {})}
            return f"data: {json.dumps(data)}\n\n".encode()

        try:   # whatever ends this handler (a disconnect cancelling it included) closes the generation
            first = await anext(stream)  # errors before the first token still become a JSON error response
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            await response.write(chunk({"role": "assistant", "content": ""}))
            event = first
            while True:
                if isinstance(event, StreamDelta):
                    if event.text:
                        await response.write(chunk({"content": event.text}))
                else:
                    calls = _tool_calls(event)
                    delta = {"tool_calls": [dict(c, index=i) for i, c in enumerate(calls)]} if calls else {}
                    usage = {"usage": {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
                                       "total_tokens": event.prompt_tokens + event.completion_tokens}}
                    await response.write(chunk(delta, event.finish_reason, usage))
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
