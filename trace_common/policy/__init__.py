"""Policy backends: chat formatting, tool-call parsing, and the `Policy` interface with its
in-process (transformers) and OpenAI-compatible HTTP implementations.

    from trace_common.policy import TransformersPolicy, OpenAIPolicy, SamplingParams, play_episodes
    policy = TransformersPolicy.from_dir(model_dir)                 # or OpenAIPolicy(url, model)
    trajs = await play_episodes(lambda: make("store"), policy, [(seed, 0)], SamplingParams(seed=1))

The transformers backend is imported lazily (it pulls in torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trace_common.policy.base import (
    AssistantTurn,
    Policy,
    PolicyRequest,
    PolicyStats,
    SamplingParams,
    derive_seed,
)
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, ChatFormat, render_template_text
from trace_common.policy.errors import PolicyUnavailable
from trace_common.policy.toolcalls import (
    INVALID_TOOL_NAME,
    ParsedReply,
    parse_assistant_text,
    render_assistant_text,
    render_tool_call,
)

if TYPE_CHECKING:
    from trace_common.policy.episodes import play_episodes
    from trace_common.policy.http_backend import OpenAIPolicy
    from trace_common.policy.transformers_backend import TransformersPolicy

_LAZY = {"TransformersPolicy": "trace_common.policy.transformers_backend",
         "OpenAIPolicy": "trace_common.policy.http_backend",
         "play_episodes": "trace_common.policy.episodes"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trace_common.policy' has no attribute {name!r}")


__all__ = ["INVALID_TOOL_NAME", "TRACE_CHATML_TEMPLATE", "AssistantTurn", "ChatFormat", "OpenAIPolicy",
           "ParsedReply", "Policy", "PolicyRequest", "PolicyStats", "PolicyUnavailable", "SamplingParams",
           "TransformersPolicy", "derive_seed", "parse_assistant_text", "play_episodes", "render_assistant_text",
           "render_template_text", "render_tool_call"]
