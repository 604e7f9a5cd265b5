"""The inference service's domain object: loaded compositions and chat generation (no gRPC here).

Both APIs (gRPC via the servicer, OpenAI-compatible HTTP via `openai_http`, which `app.py` builds
around this object) turn their request into a `ChatRequest` and call `generate` /
`generate_stream`. A request is rendered with the composition's chat template
(`trace_common.policy.chat.ChatFormat`: tools in the system prompt, Hermes `<tool_call>` calls),
checked against `max_prompt_tokens` (first by its characters, every renderable field counted, so
that no field makes the service tokenize megabytes: `rendered_chars`) and the model's context,
decoded in a batch with other concurrent requests (`decoding`), and the reply is parsed with
`trace_common.policy.parse_assistant_text` (the same parser as the rollout service's in-process
backend), so tool calls come back as structured calls.

Errors (mapped to gRPC codes by the server interceptor, to HTTP statuses by `openai_http`):
  * unknown composition                         -> NotFound (NOT_FOUND / 404)
  * malformed request, bad tool schema JSON,
    prompt over max_prompt_tokens or the context -> InvalidArgument (INVALID_ARGUMENT / 400)
  * too many compositions loaded                 -> ResourceExhausted (RESOURCE_EXHAUSTED / 429)
  * a composition naming a model, adapter or gates
    file outside the store and model roots       -> PermissionDenied (PERMISSION_DENIED)
  * generation failure inside the model          -> Unavailable (UNAVAILABLE / 503)
  * the composition unloaded or replaced while the
    request was in flight, past the drain time   -> Unavailable (UNAVAILABLE / 503), "...; retry"
None of them affects other requests or the loaded compositions.

A request holds its composition's engine from the moment it is looked up (before it is tokenized)
to its answer (`CompositionEngine.hold`), so a hot swap or an unload drains it instead of closing
the engine under it (compositions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from trace_common.env.messages import FunctionCall, Message, ToolCall
from trace_common.errors import InvalidArgument, TraceError
from trace_common.model_refs import ModelRoots
from trace_common.policy.toolcalls import parse_assistant_text

from . import metrics as m
from .compositions import CompositionRegistry, Served
from .decoding import RowRequest, RowResult
from .settings import InferenceSettings
from .specs import ChatMessageModel, CompositionSpecModel, GenerateModel

#: Bounds of a request's sampling values (`_prepare`): top_k goes into an int64 tensor (sampling then
#: clamps it to the vocabulary), a seed into torch.Generator.manual_seed, which takes -2^63 .. 2^64 - 1.
MAX_TOP_K = 2**63 - 1
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
#: Characters a request may carry per token of max_prompt_tokens before it is rendered and tokenized: a
#: token is some 4 characters of text, so this refuses only a prompt that could never fit, before the
#: work of tokenizing it (megabytes of text take seconds).
CHARS_PER_PROMPT_TOKEN = 16


@dataclass
class ChatRequest:
    """A chat completion request, whichever API it came from."""

    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 0  # 0 = settings.default_max_tokens
    seed: int | None = None
    return_routing_trace: bool = False
    api: str = "grpc"

    @property
    def turn_index(self) -> int:
        return sum(1 for msg in self.messages if msg.role == "assistant")


@dataclass
class TokenRouteInfo:
    token_id: int
    token_text: str
    experts: list[int]  # one slot per layer


@dataclass
class Completion:
    """One generated reply (the final answer of both APIs)."""

    text: str
    message: Message
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    routing: list[TokenRouteInfo]
    logprobs: list[float]
    token_ids: list[int]
    expert_names: list[str]
    parse_errors: list[str] = field(default_factory=list)
    forced_slot: int | None = None
    mixture: list[list[float]] | None = None  # soft_trajectory: [layers][K+1] weights the request ran with
    seconds: float = 0.0


@dataclass
class StreamDelta:
    text: str
    token_id: int
    route: TokenRouteInfo | None


def message_from_model(msg: ChatMessageModel) -> Message:
    """A validated proto chat message -> `Message` (tool calls in proto form: id, name, arguments_json)."""
    calls = []
    for i, tc in enumerate(msg.tool_calls):
        name = tc.get("name") or (tc.get("function") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(field=f"messages.tool_calls[{i}].name", expected="the called function's name")
        arguments = tc.get("arguments_json", tc.get("arguments", "{}")) or "{}"
        calls.append(ToolCall(id=tc.get("id") or f"call_{i}", function=FunctionCall(name=name, arguments=arguments)))
    try:
        return Message(role=msg.role, content=msg.content if (msg.content or not calls) else None,
                       tool_calls=calls or None, tool_call_id=msg.tool_call_id or None, name=msg.name or None)
    except TraceError:
        raise
    except ValueError as exc:
        raise InvalidArgument(field="messages", reason=str(exc)) from exc


def parse_tool_schemas(tools: list[Any]) -> list[dict[str, Any]]:
    """Tool schemas as dicts; proto `ToolSchema{json}` entries are decoded."""
    out = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and set(tool) <= {"json"}:
            try:
                tool = json.loads(tool.get("json", ""))
            except ValueError as exc:   # JSONDecodeError, or text the decoder cannot take
                raise InvalidArgument(field=f"tools[{i}].json", expected="an OpenAI function tool schema as JSON",
                                      reason=f"not JSON ({getattr(exc, 'msg', exc)})") from exc
            except RecursionError as exc:   # "[[[[..." deeper than the decoder's recursion limit
                raise InvalidArgument(field=f"tools[{i}].json", expected="an OpenAI function tool schema as JSON",
                                      reason="nested too deeply to parse (a tool schema is a few levels deep)",
                                      fix="send the function's schema, not a deeply nested document") from exc
        if not isinstance(tool, dict) or not isinstance(tool.get("function", tool), dict) \
                or not isinstance(tool.get("function", tool).get("name"), str):
            raise InvalidArgument(field=f"tools[{i}]", expected='{"type": "function", "function": {"name": ..., '
                                  '"parameters": {...}}}', got=tool)
        out.append(tool)
    return out


def rendered_chars(messages: list[Message], tools: list[dict[str, Any]]) -> int:
    """Characters of every request string the chat template can render -- content, author name, tool_call_id,
    each tool call's id, type, function name and arguments, the tools' JSON -- so that no field lets text
    past the pre-tokenization bound (`_prepare`). Roles are left out: a closed set of short words."""
    try:
        total = len(json.dumps(tools)) if tools else 0
    except RecursionError as exc:   # a tool object nested past the encoder's recursion limit
        raise InvalidArgument(field="tools", expected="OpenAI function tool schemas",
                              reason="nested too deeply to encode") from exc
    for msg in messages:
        total += len(msg.content or "") + len(msg.name or "") + len(msg.tool_call_id or "")
        for call in msg.tool_calls or []:
            total += len(call.id) + len(call.type) + len(call.function.name) + len(call.function.arguments)
    return total


def chat_request_from_generate(req: GenerateModel) -> ChatRequest:
    s = req.sampling
    return ChatRequest(model=req.model, messages=[message_from_model(x) for x in req.messages],
                       tools=parse_tool_schemas(req.tools), temperature=s.temperature,
                       top_p=s.top_p or 1.0, top_k=s.top_k, max_tokens=s.max_tokens,
                       seed=s.seed or None, return_routing_trace=req.return_routing_trace, api="grpc")


class IncrementalText:
    """Text deltas of a growing token list (holds back incomplete UTF-8 characters).

    Semantics (each push decodes a short window of the list, not all of it, so a stream of n tokens
    costs O(n), not O(n^2) -- a 4,096-token stream re-decoded whole at every token took seconds of
    the event loop):
        ids += [token]                          (a stop token adds nothing)
        prefix = decode(ids[p:r]); full = decode(ids[p:])     p, r: start 0, 0
        full ends in U+FFFD (a character not finished yet) or does not extend prefix -> ""
        else -> full[len(prefix):], and p, r = r, len(ids)
    The window starts one emitted step back, so a token whose text depends on the one before it (a
    leading space, a byte-level merge) decodes as it does in the whole. `reference_deltas` is the
    whole-list version the tests hold this to."""

    def __init__(self, tokenizer: Any, stop_ids: set[int]):
        self.tokenizer, self.stop_ids = tokenizer, stop_ids
        self.ids: list[int] = []
        self._prefix = self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def push(self, token_id: int) -> str:
        if token_id in self.stop_ids:
            return ""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        if full.endswith("\ufffd") or len(full) <= len(prefix) or not full.startswith(prefix):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return full[len(prefix):]


def reference_deltas(tokenizer: Any, stop_ids: set[int], token_ids: list[int]) -> list[str]:
    """IncrementalText's deltas by decoding the whole list at every token (the reference)."""
    ids: list[int] = []
    text, out = "", []
    for token_id in token_ids:
        if token_id in stop_ids:
            out.append("")
            continue
        ids.append(token_id)
        whole = tokenizer.decode(ids, skip_special_tokens=False)
        if whole.endswith("\ufffd") or not whole.startswith(text):
            out.append("")
            continue
        out.append(whole[len(text):])
        text = whole
    return out


class Inference:
    def __init__(self, settings: InferenceSettings):
        self.settings = settings
        self.registry = CompositionRegistry(
            allowed=ModelRoots.of(settings), cache_dir=settings.model_cache_dir, device=settings.device, dtype=settings.dtype,
            s3=settings.s3_settings(), max_batch=settings.max_batch, batch_wait_s=settings.batch_wait_s,
            max_compositions=settings.max_compositions)

    # ---- lifecycle -------------------------------------------------------------------------
    async def stop(self) -> None:
        await self.registry.close()

    # ---- compositions ----------------------------------------------------------------------
    @property
    def compositions(self) -> dict[str, CompositionSpecModel]:
        return {s.spec.name: s.spec for s in self.registry.all()}

    async def load(self, spec: CompositionSpecModel) -> dict[str, Any]:
        """Load `spec` with the routing it names (`spec.routing`; token-level unless it says otherwise)."""
        served = await self.registry.load(spec)
        m.COMPOSITIONS_LOADED.set(len(self.registry.names()))
        return served.info()

    def list(self) -> list[dict[str, Any]]:
        return [s.info() for s in self.registry.all()]

    async def unload(self, name: str) -> None:
        await self.registry.unload(name)
        m.COMPOSITIONS_LOADED.set(len(self.registry.names()))

    # ---- generation ------------------------------------------------------------------------
    def _prepare(self, served: Served, req: ChatRequest) -> RowRequest:
        """The request rendered, tokenized and checked (run in a worker thread: see generate)."""
        if not req.messages:
            raise InvalidArgument(field="messages", expected="at least one message")
        limit = self.settings.max_prompt_tokens
        chars = rendered_chars(req.messages, req.tools)
        if chars > CHARS_PER_PROMPT_TOKEN * limit:
            raise InvalidArgument(field="messages", expected=f"a prompt of at most {limit} tokens",
                                  got=f"{chars} characters, more than {CHARS_PER_PROMPT_TOKEN} per token could hold",
                                  fix="shorten the conversation (or raise TRACE_INFERENCE_MAX_PROMPT_TOKENS)")
        try:
            text = served.chat.render(req.messages, req.tools or None, add_generation_prompt=True)
        except TraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template that cannot render this conversation
            raise InvalidArgument(field="messages", reason=f"the chat template cannot render the conversation "
                                  f"({type(exc).__name__}: {exc})") from exc
        ids = list(served.tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) > limit:
            raise InvalidArgument(field="messages", expected=f"a prompt of at most {limit} tokens",
                                  got=f"{len(ids)} tokens", fix="shorten the conversation (or raise "
                                  "TRACE_INFERENCE_MAX_PROMPT_TOKENS)")
        room = served.engine.max_context - len(ids)
        if room < 1:
            raise InvalidArgument(field="messages", expected=f"a prompt shorter than the model's context "
                                  f"({served.engine.max_context} tokens)", got=f"{len(ids)} tokens",
                                  fix="shorten the conversation")
        max_tokens = req.max_tokens or self.settings.default_max_tokens
        max_tokens = max(1, min(max_tokens, self.settings.max_completion_tokens, room))
        # Rows share one batch: a value torch cannot take (a NaN temperature, a top_k past int64, a seed
        # past what a generator takes) would fail every request batched with it, so each is bounded here.
        if not (math.isfinite(req.temperature) and req.temperature >= 0) or not 0 < req.top_p <= 1 \
                or not 0 <= req.top_k <= MAX_TOP_K:
            raise InvalidArgument(field="sampling", expected=f"a finite temperature >= 0, 0 < top_p <= 1, "
                                  f"0 <= top_k <= {MAX_TOP_K}",
                                  got={"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k})
        if req.seed is not None and not MIN_SEED <= req.seed <= MAX_SEED:
            raise InvalidArgument(field="seed", expected=f"an integer from {MIN_SEED} to {MAX_SEED}", got=req.seed)
        return RowRequest(prompt_ids=ids, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                          max_tokens=max_tokens, seed=req.seed)

    def _completion(self, served: Served, req: ChatRequest, row: RowRequest, out: RowResult,
                    seconds: float) -> Completion:
        stops = set(served.engine.stop_ids)
        body = out.token_ids[:-1] if out.finish_reason == "stop" and out.token_ids and out.token_ids[-1] in stops \
            else out.token_ids
        text = served.tokenizer.decode(body, skip_special_tokens=False)
        parsed = parse_assistant_text(text, req.turn_index)
        finish = out.finish_reason
        if finish == "stop" and parsed.message.tool_calls:
            finish = "tool_calls"
        routing: list[TokenRouteInfo] = []
        if req.return_routing_trace and out.routes is not None:
            routing = [TokenRouteInfo(tid, served.tokenizer.decode([tid], skip_special_tokens=False), list(route))
                       for tid, route in zip(out.token_ids, out.routes, strict=True)]
        return Completion(text=text, message=parsed.message, finish_reason=finish, prompt_tokens=len(row.prompt_ids),
                          completion_tokens=len(out.token_ids), routing=routing, logprobs=list(out.logprobs),
                          token_ids=list(out.token_ids), expert_names=list(served.expert_names),
                          parse_errors=list(parsed.errors), forced_slot=out.forced_slot, mixture=out.mixture,
                          seconds=seconds)

    def _record(self, served: Served, out: RowResult, prompt_tokens: int) -> None:
        m.PROMPT_TOKENS.inc(prompt_tokens)
        m.GENERATED_TOKENS.inc(len(out.token_ids))
        names = served.expert_names if len(out.slot_counts) == len(served.expert_names) else ["merged"]
        for name, count in zip(names, out.slot_counts, strict=False):
            if count:
                m.TOKENS_ROUTED.labels(expert=name).inc(count)

    async def _run(self, served: Served, req: ChatRequest, row: RowRequest) -> Completion:
        started = time.perf_counter()
        first: list[float] = []
        user_callback = row.on_token

        def on_token(token_id: int, route: list[int] | None) -> None:
            if not first:
                first.append(time.perf_counter() - started)
            if user_callback is not None:
                user_callback(token_id, route)

        row.on_token = on_token
        m.REQUESTS_ACTIVE.inc()
        try:
            out = await served.engine.submit(row)
        except asyncio.CancelledError:   # the caller went away (a gRPC cancel, an HTTP client's disconnect)
            row.cancelled.set()          # its row stops at the next decoding step instead of running to the end
            m.REQUESTS_CANCELLED.inc()
            raise
        finally:
            m.REQUESTS_ACTIVE.dec()
        seconds = time.perf_counter() - started
        self._record(served, out, len(row.prompt_ids))
        if out.finish_reason == "cancelled":
            m.REQUESTS_CANCELLED.inc()
        else:
            m.REQUEST_DURATION.labels(api=req.api).observe(seconds)
            if first:
                m.TIME_TO_FIRST_TOKEN.observe(first[0])
        return self._completion(served, req, row, out, seconds)

    async def generate(self, req: ChatRequest) -> Completion:
        served = self.registry.get(req.model)
        with served.engine.hold():   # in flight from the lookup on: a hot swap drains it, never closes under it
            # rendering and tokenizing take milliseconds to seconds: off the event loop, which serves gRPC,
            # HTTP and health for every other client meanwhile
            row = await asyncio.to_thread(self._prepare, served, req)
            return await self._run(served, req, row)

    async def generate_stream(self, req: ChatRequest) -> AsyncIterator[StreamDelta | Completion]:
        """Token deltas as they are generated, then the `Completion`. Closing the iterator early
        (a client cancelling the stream) cancels the generation at its next decoding step."""
        served = self.registry.get(req.model)
        # in flight from the lookup on, as in generate, until the generation ends: not until the client
        # has read the last delta (a stalled reader would hold a swap or unload for the whole drain)
        held = contextlib.ExitStack()
        held.enter_context(served.engine.hold())
        try:
            row = await asyncio.to_thread(self._prepare, served, req)   # off the event loop, as in generate
        except BaseException:
            held.close()
            raise
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, list[int] | None] | None] = asyncio.Queue()
        row.on_token = lambda tid, route: loop.call_soon_threadsafe(queue.put_nowait, (tid, route))
        task = asyncio.ensure_future(self._run(served, req, row))
        task.add_done_callback(lambda _t: held.close())
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        text = IncrementalText(served.tokenizer, set(served.engine.stop_ids))
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                tid, route = item
                info = None
                if req.return_routing_trace and route is not None:
                    info = TokenRouteInfo(tid, served.tokenizer.decode([tid], skip_special_tokens=False), list(route))
                yield StreamDelta(text.push(tid), tid, info)
            yield task.result()
        finally:
            if not task.done():
                row.cancelled.set()
