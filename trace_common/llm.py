"""OpenAI-compatible chat client (vLLM, TRACE's inference service, or any provider).

A thin layer over the official `openai` SDK -- which already implements timeouts, bounded
retries with backoff on connection errors / 408 / 429 / 5xx, and the wire format -- adding
what the services need: one result type, errors translated into TRACE's domain exceptions
(so a job fails with a reason and the right status code), and the API key read from a variable
of this process's environment by the one api-key rule (`trace_common.endpoints.read_api_key`).
In a service that variable is the operator's, from an endpoint profile
(`Endpoints.llm(...)` -> `ResolvedEndpoint.api_key_env`); a request never names it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import openai

from trace_common.endpoints import ResolvedEndpoint, read_api_key
from trace_common.errors import ContextExhausted, DeadlineExceeded, InvalidArgument, Unavailable


def context_refusal(body: str) -> bool:
    """Whether an HTTP 400 body is the server saying the prompt is longer than the model's context
    (the wording of vLLM and of TRACE's inference service: trace_common/policy/http_backend.py)."""
    from trace_common.policy.http_backend import CONTEXT_REFUSAL

    return bool(CONTEXT_REFUSAL.search(body))

@dataclass(frozen=True)
class LlmConfig:
    """Where and how to call an OpenAI-compatible endpoint (one declaration: the analyst's and
    the generator's configs are built on it)."""

    #: OpenAI-compatible base URL, e.g. http://vllm:8000/v1.
    base_url: str
    #: Served model name sent with every request.
    model: str
    #: Variable of this process's environment holding the key ("" = none); in a service, the
    #: endpoint profile's (operator's) variable, never a request's.
    api_key_env: str = ""
    #: Per-request timeout in seconds.
    timeout_seconds: float = 60.0
    #: Transport retries per request (connection errors, 408/429/5xx), done by the SDK.
    max_retries: int = 2

    @classmethod
    def of(cls, endpoint: ResolvedEndpoint, *, timeout_seconds: float, max_retries: int = 2) -> LlmConfig:
        """The client config of an endpoint the service's profiles resolved."""
        return cls(base_url=endpoint.base_url, model=endpoint.model, api_key_env=endpoint.api_key_env,
                   timeout_seconds=timeout_seconds, max_retries=max_retries)

    def api_key(self) -> str:
        return read_api_key(self.api_key_env)


@dataclass
class ChatResult:
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    #: (token, logprob) pairs when the endpoint returned them.
    logprobs: list[tuple[str, float]] | None = None


class ChatClient:
    """Async chat completions with deadlines and bounded retries."""

    def __init__(self, config: LlmConfig):
        if not config.base_url.startswith(("http://", "https://")):
            raise InvalidArgument(field="base_url", expected="an http(s) URL such as http://127.0.0.1:8000/v1",
                                  got=config.base_url)
        self.config = config
        self._client = openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key(),
                                          timeout=config.timeout_seconds, max_retries=config.max_retries)

    async def complete(self, messages: list[dict[str, Any]], *, tools: list[dict] | None = None,
                       temperature: float = 0.0, max_tokens: int | None = None, seed: int | None = None,
                       logprobs: bool = False, model: str | None = None, **extra: Any) -> ChatResult:
        kwargs: dict[str, Any] = dict(model=model or self.config.model, messages=messages, temperature=temperature)
        if tools:
            kwargs["tools"] = tools
        if max_tokens:
            kwargs["max_tokens"] = max_tokens
        if seed is not None:
            kwargs["seed"] = seed
        if logprobs:
            kwargs["logprobs"] = True
        kwargs.update(extra)
        where = f"{self.config.base_url} (model {kwargs['model']!r})"
        started = time.perf_counter()
        try:
            resp = await self._client.chat.completions.create(**kwargs)
        except openai.APITimeoutError:
            raise DeadlineExceeded(f"LLM endpoint {where} did not answer within {self.config.timeout_seconds}s "
                                   f"after {self.config.max_retries} retries") from None
        except openai.APIConnectionError as err:
            raise Unavailable(f"cannot reach LLM endpoint {where}: {err}") from None
        except openai.APIStatusError as err:
            body = str(err.body)[:300] if err.body is not None else ""
            if err.status_code == 400 and context_refusal(body):
                raise ContextExhausted(f"LLM endpoint {where}: the prompt does not fit the model's context: "
                                       f"{body}") from None
            if err.status_code in (400, 404, 422):
                raise InvalidArgument(f"LLM endpoint {where} rejected the request (HTTP {err.status_code}): "
                                      f"{body}") from None
            raise Unavailable(f"LLM endpoint {where} failed (HTTP {err.status_code}): {body}") from None
        except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as err:
            raise Unavailable(f"LLM endpoint {where} returned a response that is not an OpenAI chat "
                              f"completion: {err}") from None
        choices = getattr(resp, "choices", None)
        if not choices:
            raise Unavailable(f"LLM endpoint {where} returned no choices (not an OpenAI chat completion)")
        choice = choices[0]
        msg = choice.message
        calls = []
        for tc in msg.tool_calls or []:
            calls.append({"id": tc.id, "type": "function",
                          "function": {"name": tc.function.name, "arguments": tc.function.arguments}})
        lps = None
        if getattr(choice, "logprobs", None) is not None and choice.logprobs.content:
            lps = [(t.token, t.logprob) for t in choice.logprobs.content]
        usage = getattr(resp, "usage", None)
        return ChatResult(content=msg.content or "", tool_calls=calls, finish_reason=choice.finish_reason or "",
                          prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                          completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
                          seconds=time.perf_counter() - started, logprobs=lps)

    async def close(self) -> None:
        await self._client.close()
