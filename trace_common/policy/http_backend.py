"""OpenAI-compatible HTTP policy: vLLM (`--enable-auto-tool-choice`), TRACE's inference service,
or any chat-completions endpoint.

    policy = OpenAIPolicy("http://vllm:8000/v1", model="base", adapter="precondition_verification-v3")

The adapter is selected by model name: vLLM serves each LoRA under its own name, so a
request for `adapter` (when set) goes to that adapter, otherwise to `model`. Tools are
sent as `tools=` and calls read back from `message.tool_calls`; a server without a tool
parser returns them as `<tool_call>` text, which is parsed the same way as in-process
output. Call ids are renumbered `call_<turn>_<k>` so trajectories do not depend on the
server's random ids.

Token data: `logprobs=True` is requested by default (one logprob per completion token,
as the server computes them); with `request_token_ids=True` (vLLM >= 0.10) the server's
`prompt_token_ids` and per-choice `token_ids` are read back too. Either is None when
the server does not return it.

Failures -- no connection, a timeout after the SDK's bounded retries (the SDK retries
connection errors, 408, 429 and 5xx with backoff), any other HTTP error, or a body that
is not a chat completion -- raise `PolicyUnavailable` with `kind` and a reason.

The key: `api_key_env` names a variable of this process's environment, read by the one api-key
rule (`trace_common.endpoints.read_api_key`). In a service it is the endpoint profile's (the
operator's, via `PolicyRefModel.credential_env`), never a request's.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from typing import Any

import openai

from trace_common.endpoints import read_api_key
from trace_common.env.messages import FunctionCall, Message, ToolCall
from trace_common.errors import ContextExhausted, InvalidArgument
from trace_common.policy.base import AssistantTurn, Policy, PolicyRequest
from trace_common.policy.errors import PolicyUnavailable
from trace_common.policy.toolcalls import TOOL_CALL_OPEN, call_id, render_assistant_text

#: How OpenAI-compatible servers word a prompt longer than the model's context (vLLM: "This model's
#: maximum context length is 4096 tokens. However, you requested ..."; TRACE's inference service:
#: "expected a prompt shorter than the model's context (4096 tokens)").
CONTEXT_REFUSAL = re.compile(r"maximum context length|context length is|shorter than the model's context",
                             re.IGNORECASE)


def context_refusal(status: int, body: Any) -> bool:
    """An HTTP error that says the prompt does not fit the model: a 400 whose error *message* (the
    server's own words, never another field, which may echo the request) matches CONTEXT_REFUSAL.
    `body`: the parsed JSON body, {"message": ...} or {"error": {"message": ...}}, or its text."""
    if status != 400:
        return False
    if isinstance(body, dict):
        inner = body.get("error")
        body = (inner.get("message") if isinstance(inner, dict) else None) or body.get("message") or ""
    return bool(CONTEXT_REFUSAL.search(str(body)))


def _request_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


class OpenAIPolicy(Policy):
    """Chat completions over HTTP with deadlines, bounded retries and typed failures."""

    def __init__(self, base_url: str, model: str, *, adapter: str | None = None, api_key_env: str = "",
                 timeout_s: float = 60.0, max_retries: int = 2, max_concurrency: int = 64,
                 request_logprobs: bool = True, request_token_ids: bool = False,
                 extra_body: dict[str, Any] | None = None):
        super().__init__()
        if not base_url.startswith(("http://", "https://")):
            raise InvalidArgument(field="base_url", expected="an http(s) URL such as http://127.0.0.1:8000/v1",
                                  got=base_url)
        if timeout_s <= 0:
            raise InvalidArgument(field="timeout_s", expected="seconds > 0", got=timeout_s)
        if max_retries < 0:
            raise InvalidArgument(field="max_retries", expected="an integer >= 0", got=max_retries)
        if max_concurrency < 1:
            raise InvalidArgument(field="max_concurrency", expected="an integer >= 1", got=max_concurrency)
        key = read_api_key(api_key_env)
        self.base_url = base_url
        self.model = model
        self.adapter = adapter
        self.name = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.request_logprobs = request_logprobs
        self.request_token_ids = request_token_ids
        self.extra_body = dict(extra_body or {})
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout_s,
                                          max_retries=max_retries)
        self._limit = asyncio.Semaphore(max_concurrency)

    @property
    def served_name(self) -> str:
        """The model name requests carry: the adapter's when one is set."""
        return self.adapter or self.model

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[AssistantTurn]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def close(self) -> None:
        await self._client.close()

    def _where(self) -> str:
        return f"{self.base_url} (model {self.served_name!r})"

    def _fail(self, kind: str, reason: str, status: int | None = None) -> PolicyUnavailable:
        self.stats.record_failure(kind)
        return PolicyUnavailable(f"{self._where()}: {reason}", kind=kind, status=status)  # type: ignore[arg-type]

    async def _one(self, request: PolicyRequest) -> AssistantTurn:
        p = request.params
        kwargs: dict[str, Any] = {"model": self.served_name, "messages": _request_messages(request.messages),
                                  "temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens}
        if p.seed is not None:
            kwargs["seed"] = p.seed
        if request.tools:
            kwargs["tools"] = request.tools
        if self.request_logprobs:
            kwargs["logprobs"] = True
        extra = dict(self.extra_body)
        if p.top_k > 0:
            extra["top_k"] = p.top_k
        if self.request_token_ids:
            extra["return_token_ids"] = True
        if extra:
            kwargs["extra_body"] = extra
        started = time.perf_counter()
        async with self._limit:
            try:
                resp = await self._client.chat.completions.create(**kwargs)
            except openai.APITimeoutError:
                raise self._fail("timeout", f"no answer within {self.timeout_s}s "
                                            f"(after {self.max_retries} retries)") from None
            except openai.APIConnectionError as err:
                raise self._fail("connection", f"cannot connect: {err}") from None
            except openai.APIStatusError as err:
                body = str(err.body)[:300] if err.body is not None else ""
                if context_refusal(err.status_code, err.body if isinstance(err.body, dict) else err.message):
                    raise ContextExhausted(f"{self._where()}: HTTP 400: {body}") from None
                raise self._fail("http_error", f"HTTP {err.status_code}: {body}", err.status_code) from None
            except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError, TypeError) as err:
                raise self._fail("bad_response", f"the response is not a chat completion: {err}") from None
        turn = self._turn(request, resp, time.perf_counter() - started)
        self.stats.record_batch(turn.seconds)
        self.stats.record_turn(turn)
        return turn

    def _turn(self, request: PolicyRequest, resp: Any, seconds: float) -> AssistantTurn:
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise self._fail("bad_response", "the response has no choices (not an OpenAI chat completion)")
        choice = choices[0]
        msg = getattr(choice, "message", None)
        if msg is None:
            raise self._fail("bad_response", "the first choice has no message")
        content = getattr(msg, "content", None)
        if content is not None and not isinstance(content, str):
            raise self._fail("bad_response", f"message.content is {type(content).__name__}, not a string")
        turn_index = request.turn_index
        calls: list[ToolCall] = []
        try:
            for k, tc in enumerate(getattr(msg, "tool_calls", None) or []):
                fn = tc.function
                args = fn.arguments if isinstance(fn.arguments, str) else json.dumps(fn.arguments)
                calls.append(ToolCall(id=call_id(turn_index, k), function=FunctionCall(name=fn.name, arguments=args)))
        except (AttributeError, TypeError, ValueError) as err:
            raise self._fail("bad_response", f"malformed tool_calls in the response: {err}") from None
        usage = getattr(resp, "usage", None)
        logprobs = None
        lp = getattr(choice, "logprobs", None)
        if lp is not None and getattr(lp, "content", None):
            logprobs = [float(t.logprob) for t in lp.content]
        token_ids = getattr(choice, "token_ids", None)
        prompt_ids = getattr(resp, "prompt_token_ids", None)
        common = {"prompt_token_ids": list(prompt_ids) if isinstance(prompt_ids, list) else None,
                  "completion_token_ids": list(token_ids) if isinstance(token_ids, list) else None,
                  "logprobs": logprobs, "finish_reason": getattr(choice, "finish_reason", None) or "stop",
                  "prompt_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
                  "completion_tokens": int(getattr(usage, "completion_tokens", 0) or 0), "seconds": seconds}
        if (common["completion_token_ids"] is not None and logprobs is not None
                and len(logprobs) != len(common["completion_token_ids"])):
            common["logprobs"] = None  # misaligned: keep the ids, drop what cannot be attributed
        if calls:
            message = Message.assistant(content.strip() if content and content.strip() else None, calls)
            return AssistantTurn(text=render_assistant_text(message), message=message, **common)
        text = content or ""
        if TOOL_CALL_OPEN in text:  # the server has no tool parser: parse the text ourselves
            return AssistantTurn.from_text(text, turn_index, **common)
        return AssistantTurn(text=text, message=Message.assistant(text.strip()), **common)
