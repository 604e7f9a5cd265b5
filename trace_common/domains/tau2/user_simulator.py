"""The simulated customer of a tau2 episode.

`LLMUserSimulator` is tau2's user simulator over any OpenAI-compatible chat endpoint (vLLM,
OpenAI, ...): its system prompt is the shared simulation guidelines plus the task's
scenario (`prompts.user_system_prompt`), and it sees the conversation with roles flipped --
the agent's messages arrive as `user` turns, its own earlier replies are `assistant` turns.
Sampling follows tau2's defaults (temperature 0) and passes `seed` when one is configured,
which endpoints that support seeded sampling (OpenAI, vLLM) honour; other endpoints may
ignore it, so determinism is only as good as the endpoint's.

Every request has a timeout and bounded retries (the `openai` client's own); a failure
after the retries raises `Unavailable` naming the endpoint.

`ScriptedUser` replays fixed replies (then ###STOP###): a user with no LLM, for offline
smoke runs and tests of the environment loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field, field_validator

from trace_common.domains.tau2.prompts import STOP
from trace_common.errors import InvalidArgument, Unavailable


class UserSimulator(Protocol):
    """Produces the user's side of one conversation; `reset` starts a new one."""

    def reset(self, system_prompt: str) -> None: ...

    def respond(self, agent_text: str) -> str: ...


class UserLLMConfig(BaseModel):
    """How to reach the user simulator's LLM (an OpenAI-compatible chat completions API)."""

    base_url: str = Field(description="Endpoint root including /v1, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="Model name the endpoint serves, e.g. 'gpt-4.1' or a vLLM model id.")
    api_key: str = Field("EMPTY", description="Bearer key; vLLM accepts any value unless started with --api-key.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="tau2's default is 0.0.")
    seed: int | None = Field(None, ge=0, description="Sampling seed sent with every request (None: not sent).")
    max_tokens: int | None = Field(None, ge=1, description="Cap on one reply's tokens (None: endpoint default).")
    timeout_s: float = Field(120.0, gt=0, le=3600, description="Per-request timeout in seconds.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries on connection errors, 429 and 5xx.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL: give the endpoint root, e.g. http://host:8000/v1")
        return value.rstrip("/")


class LLMUserSimulator:
    """tau2's user simulator through the `openai` client."""

    def __init__(self, config: UserLLMConfig, client: Any | None = None):
        import openai

        self.config = config
        self._client = client or openai.OpenAI(base_url=config.base_url, api_key=config.api_key,
                                               timeout=config.timeout_s, max_retries=config.max_retries)
        self._system: str | None = None
        self._history: list[dict[str, str]] = []

    def reset(self, system_prompt: str) -> None:
        self._system = system_prompt
        self._history = []

    def request_messages(self) -> list[dict[str, str]]:
        """The chat messages the next request sends (system prompt + role-flipped history)."""
        if self._system is None:
            raise InvalidArgument(field="user simulator", expected="reset(system_prompt) before respond()")
        return [{"role": "system", "content": self._system}, *self._history]

    def respond(self, agent_text: str) -> str:
        import openai

        self._history.append({"role": "user", "content": agent_text})
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": self.request_messages(),
                                  "temperature": self.config.temperature}
        if self.config.seed is not None:
            kwargs["seed"] = self.config.seed
        if self.config.max_tokens is not None:
            kwargs["max_tokens"] = self.config.max_tokens
        try:
            completion = self._client.chat.completions.create(**kwargs)
        except openai.APIError as exc:
            raise Unavailable(f"user simulator LLM at {self.config.base_url} failed after "
                              f"{self.config.max_retries} retries: {type(exc).__name__}: {exc}") from exc
        if not completion.choices:
            raise Unavailable(f"user simulator LLM at {self.config.base_url} returned no choices")
        text = completion.choices[0].message.content or ""
        self._history.append({"role": "assistant", "content": text})
        return text


class ScriptedUser:
    """Fixed replies in order; after the last one every reply is ###STOP###."""

    def __init__(self, replies: Sequence[str]):
        self.replies = list(replies)
        self._next = 0
        self.system_prompt: str | None = None
        self.heard: list[str] = []

    def reset(self, system_prompt: str) -> None:
        self.system_prompt = system_prompt
        self._next = 0
        self.heard = []

    def respond(self, agent_text: str) -> str:
        self.heard.append(agent_text)
        if self._next < len(self.replies):
            self._next += 1
            return self.replies[self._next - 1]
        return STOP
