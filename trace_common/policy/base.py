"""The `Policy` contract shared by every backend (in-process transformers, OpenAI-compatible HTTP).

A policy answers a *batch* of conversations at once: the in-process backend batches them
on one model forward pass; the HTTP backend sends them concurrently. Episodes drive a
policy through `Policy.policy_fn`, which adapts the async batched API to the synchronous
`PolicyFn` that `trace_common.env.run_episode` calls from a worker thread, so many episodes
played at the same time end up in the same batches.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trace_common.env.episode import PolicyFn, PolicyTurn
from trace_common.env.messages import Message
from trace_common.errors import InvalidArgument
from trace_common.policy.toolcalls import ParsedReply, parse_assistant_text


class SamplingParams(BaseModel):
    """How to sample one reply. Field names follow the OpenAI / vLLM API.

    `temperature=0` is greedy decoding. For true sampling from the model's distribution
    (what GRPO needs) keep `top_k=0` and `top_p=1.0`: both are applied explicitly, never
    inherited from a model's generation_config.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0.0, le=5.0, description="0 = greedy; 1 = the model's distribution.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass kept; 1.0 disables the truncation.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables the truncation.")
    max_tokens: int = Field(256, ge=1, le=32768, description="Most tokens generated for this reply.")
    seed: int | None = Field(None, ge=0, description="Seed of this request's sampler; None = nondeterministic.")

    @model_validator(mode="after")
    def _greedy_needs_no_truncation(self) -> SamplingParams:
        if self.temperature == 0.0 and (self.top_k or self.top_p < 1.0):
            raise ValueError("temperature=0 is greedy decoding: top_k and top_p have no effect; "
                             "leave them at 0 and 1.0 or set a temperature > 0")
        return self


@dataclass
class PolicyRequest:
    """One conversation to continue: OpenAI messages (ending with a user or tool message),
    the tool schemas shown to the model, and the sampling parameters."""

    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    params: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if not self.messages:
            raise InvalidArgument(field="messages", expected="at least one message",
                                  fix="Pass the conversation so far (system prompt and first user message).")

    @property
    def turn_index(self) -> int:
        """0-based index of the assistant turn to be generated (numbers tool call ids)."""
        return sum(1 for m in self.messages if m.role == "assistant")


@dataclass
class AssistantTurn:
    """One generated reply.

    `text` is the raw model text (the endpoint's content for HTTP backends); `message` the
    parsed assistant message (never None: malformed tool calls are kept as calls that the
    environment answers with an error, see `toolcalls`); `parse_errors` one reason per
    malformed call. Token data is present where the backend provides it: `prompt_token_ids`
    (the rendered prompt), `completion_token_ids` (generated tokens, stop token included)
    and `logprobs` (one per completion token; see the backend for which distribution).
    """

    text: str
    message: Message
    parse_errors: list[str] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    @classmethod
    def from_text(cls, text: str, turn_index: int, **kwargs: Any) -> AssistantTurn:
        parsed: ParsedReply = parse_assistant_text(text, turn_index)
        return cls(text=text, message=parsed.message, parse_errors=parsed.errors, **kwargs)

    def to_policy_turn(self) -> PolicyTurn:
        return PolicyTurn(message=self.message, prompt_token_ids=self.prompt_token_ids,
                          completion_token_ids=self.completion_token_ids, logprobs=self.logprobs)


@dataclass
class PolicyStats:
    """Counters a backend keeps (thread-safe); the rollout service exports them as metrics."""

    requests: int = 0
    batches: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_call_turns: int = 0
    malformed_turns: int = 0
    failed_requests: int = 0
    generate_seconds: float = 0.0
    malformed_reasons: Counter[str] = field(default_factory=Counter)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_turn(self, turn: AssistantTurn) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += turn.prompt_tokens
            self.completion_tokens += turn.completion_tokens
            if turn.message.tool_calls:
                self.tool_call_turns += 1
            if turn.parse_errors:
                self.malformed_turns += 1
                for reason in turn.parse_errors:
                    # "call 0: tool call is not valid JSON (...)" -> "tool call is not valid JSON"
                    self.malformed_reasons[reason.split(": ", 1)[-1].split(" (", 1)[0]] += 1

    def record_batch(self, seconds: float) -> None:
        with self._lock:
            self.batches += 1
            self.generate_seconds += seconds

    def record_failure(self, kind: str) -> None:
        with self._lock:
            self.failed_requests += 1
            self.failure_reasons[kind] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "batches": self.batches, "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens, "tool_call_turns": self.tool_call_turns,
                    "malformed_turns": self.malformed_turns, "failed_requests": self.failed_requests,
                    "generate_seconds": round(self.generate_seconds, 4),
                    "malformed_reasons": dict(self.malformed_reasons),
                    "failure_reasons": dict(self.failure_reasons)}


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from parts (episode seed, sample index, turn...): stable across
    processes and Python versions (no `hash()`)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class Policy(ABC):
    """A batched, asynchronous chat policy.

    Contract every backend keeps:

    1. `generate(requests)` returns one `AssistantTurn` per request, in order. Requests in
       one call (and concurrent calls) may be served in one batch; the result of a request
       depends only on that request (its messages, tools, params and seed), not on which
       other requests share its batch, up to floating-point noise.
    2. Model output never raises: text that is not a well-formed tool call becomes a plain
       message or a tool call the environment answers with an error (counted in
       `stats.malformed_turns`, reasons in `AssistantTurn.parse_errors`).
    3. Backend failures (endpoint unreachable, timeout after bounded retries, HTTP error,
       a response that is not a chat completion) raise `PolicyUnavailable` (a
       `trace_common.errors.Unavailable`) with a reason; the episode loop records the
       episode as `policy_error`. A conversation longer than the model's context raises
       `ContextExhausted` (trace_common.errors): the episode ends as `context_exhausted`, not an error.
    4. With `params.seed` set, a backend that supports seeding returns the same reply for
       the same request every time (the in-process backend does; vLLM does per request).
    5. Token ids and logprobs are filled where the backend has them (in-process: always;
       HTTP: when the server returns them), else None.
    6. `close()` releases the backend (threads, HTTP connections); the policy is unusable after.
    """

    #: Model name recorded in trajectories (`PolicyInfo.model`).
    name: str = "policy"
    #: Adapter (name or URI) recorded in trajectories, if any.
    adapter: str | None = None

    def __init__(self) -> None:
        self.stats = PolicyStats()

    @abstractmethod
    async def generate(self, requests: Sequence[PolicyRequest]) -> list[AssistantTurn]:
        """Answer each request (see the class docstring)."""

    async def complete(self, request: PolicyRequest) -> AssistantTurn:
        """One request (it may still be batched with other concurrent calls)."""
        return (await self.generate([request]))[0]

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

    def policy_fn(self, loop: asyncio.AbstractEventLoop, params: SamplingParams, *, seed: int | None = None,
                  timeout_s: float | None = None,
                  on_turn: Callable[[PolicyRequest, AssistantTurn], None] | None = None) -> PolicyFn:
        """A synchronous `PolicyFn` for `run_episode`, to be called from a worker thread
        while `loop` runs in another thread. Each turn's sampling seed is derived from
        `seed` (e.g. `derive_seed(task_seed, sample_index)`) and the turn index, so a whole
        episode is reproducible; with `seed=None` the params' seed is used unchanged.
        `on_turn(request, turn)` sees every reply (e.g. to record parse errors)."""

        def call(messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
            request = PolicyRequest(messages=messages, tools=tools, params=params)
            if seed is not None:
                request.params = params.model_copy(update={"seed": derive_seed(seed, request.turn_index)})
            future = asyncio.run_coroutine_threadsafe(self.complete(request), loop)
            turn = future.result(timeout=timeout_s)
            if on_turn is not None:
                on_turn(request, turn)
            return turn.to_policy_turn()

        call.__name__ = self.name
        return call
