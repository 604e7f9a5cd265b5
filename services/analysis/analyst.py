"""The LLM analyst: JSON-returning chat requests with validation, feedback retries and bounded
parallelism, over the shared OpenAI-compatible client (`trace_common.llm.ChatClient`).

One `Analyst` serves one job. Every request goes through one `asyncio.Semaphore`, so discovery
and all N labeling runs together never have more than `max_concurrency` requests in flight
against the endpoint, whatever the number of runs or trajectories.

A reply that is not one JSON object, or fails the request's schema, is answered in the same
conversation with the validation error and asked again, up to `max_attempts` replies in all;
then the job fails with FAILED_PRECONDITION naming the request and the last problem.
Transport problems are not retried here (the SDK already retried connection errors, 408, 429
and 5xx `max_retries` times): a timeout fails the job with DEADLINE_EXCEEDED, an unreachable
endpoint or a body that is not an OpenAI completion with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from trace_common.errors import DeadlineExceeded, FailedPrecondition, TraceError
from trace_common.llm import ChatClient, LlmConfig

from .metrics import LLM_REQUEST_DURATION, LLM_REQUESTS
from .schemas import ReplyInvalid, parse_json_object

T = TypeVar("T")
ResponseFormat = Literal["none", "json_object", "json_schema"]
#: Longest rejected reply echoed back to the model on a retry.
_ECHO_CHARS = 4000


@dataclass(frozen=True)
class AnalystConfig:
    """The analyst: its endpoint (`llm`, the shared client's config: URL, model, key variable,
    timeout, retries) and how it asks (the rest)."""

    llm: LlmConfig
    #: Requests in flight per job (discovery and all labeling runs together).
    max_concurrency: int = 8
    #: Replies asked for per request when a reply is not valid JSON or fails its schema.
    max_attempts: int = 3
    #: Sampling temperature of every request.
    temperature: float = 0.6
    #: Completion token cap per request.
    max_tokens: int = 2048
    #: OpenAI response_format requested (see AnalysisSettings.llm_response_format).
    response_format: ResponseFormat = "none"


class Analyst:
    def __init__(self, config: AnalystConfig, client: ChatClient | None = None):
        self.config = config
        self.client = client or ChatClient(config.llm)
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self.requests = 0

    async def close(self) -> None:
        await self.client.close()

    def _extra(self, schema: dict[str, Any] | None) -> dict[str, Any]:
        if self.config.response_format == "json_object":
            return {"response_format": {"type": "json_object"}}
        if self.config.response_format == "json_schema" and schema is not None:
            return {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "reply", "schema": schema, "strict": True}}}
        return {}

    async def _one(self, messages: list[dict[str, Any]], seed: int, schema: dict[str, Any] | None,
                   what: str) -> str:
        async with self._sem:
            self.requests += 1
            try:
                result = await self.client.complete(messages, temperature=self.config.temperature,
                                                    max_tokens=self.config.max_tokens, seed=seed,
                                                    **self._extra(schema))
            except DeadlineExceeded as err:
                LLM_REQUESTS.labels("timeout").inc()
                raise DeadlineExceeded(f"{what}: {err.reason}; raise llm.timeout_seconds or check the "
                                       "endpoint's load") from None
            except TraceError as err:
                LLM_REQUESTS.labels("http_error").inc()
                raise type(err)(f"{what}: {err.reason}") from None
        LLM_REQUEST_DURATION.observe(result.seconds)
        return result.content

    async def ask_json(self, messages: list[dict[str, Any]], validate: Callable[[dict[str, Any]], T], *,
                       seed: int, what: str, schema: dict[str, Any] | None = None) -> T:
        """Send `messages`; return `validate(reply_object)`, retrying with the error fed back."""
        conversation = list(messages)
        problem = ""
        for attempt in range(self.config.max_attempts):
            content = await self._one(conversation, seed + attempt, schema, what)
            try:
                value = validate(parse_json_object(content))
            except ReplyInvalid as err:
                LLM_REQUESTS.labels(err.kind).inc()
                problem = str(err)
                conversation = [*conversation,
                                {"role": "assistant", "content": content[:_ECHO_CHARS]},
                                {"role": "user", "content": f"Your reply was rejected: {problem}. Reply again "
                                 "with only the corrected JSON object, following the system message."}]
                continue
            LLM_REQUESTS.labels("ok").inc()
            return value
        raise FailedPrecondition(
            f"{what}: the analyst model's reply was rejected {self.config.max_attempts} "
            f"time{'' if self.config.max_attempts == 1 else 's'}; last problem: "
            f"{problem}. Use a model that follows JSON instructions, set TRACE_ANALYSIS_LLM_RESPONSE_FORMAT="
            "json_object (or json_schema where the endpoint supports it), or raise "
            "TRACE_ANALYSIS_LLM_MAX_ATTEMPTS")
