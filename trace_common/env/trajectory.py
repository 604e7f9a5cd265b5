"""The Trajectory record: one played episode, as stored in rollout artifacts (JSONL).

Analysis reads these to find capability gaps, the trainer reads them for warm starts and
GRPO, and reports cite them, so one record carries everything needed to judge an episode
without replaying it: the OpenAI-format conversation, which task and seed, which
environment and policy, the verifier's reward and failure reason, the environment's
capability-tagged diagnostics, the tool schemas shown to the policy, timings, and -- when
the backend provides them -- per-turn completion token ids and logprobs.

A file of trajectories is JSON Lines: one `Trajectory.to_json_line()` per line, UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trace_common.env.environment import Diagnostic, Termination
from trace_common.env.messages import Message
from trace_common.errors import ArtifactCorrupted, InvalidArgument

SCHEMA_VERSION = 1


class EnvInfo(BaseModel):
    """Which environment produced the episode."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters passed to make().")


class PolicyInfo(BaseModel):
    """Which policy played: base model, optional adapter (or composition) and its version."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Base model name or URI, or e.g. 'scripted-expert'.")
    adapter: str | None = Field(default=None, description="Adapter name/URI or composition URI, if any.")
    version: str | None = Field(default=None, description="Adapter version or policy config hash.")


class TurnRecord(BaseModel):
    """Token-level record of one assistant turn, when the backend provides it."""

    model_config = ConfigDict(extra="forbid")

    message_index: int = Field(ge=0, description="Index in `messages` of the assistant message.")
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = Field(default=None, description="One per completion token.")

    @model_validator(mode="after")
    def _aligned(self) -> TurnRecord:
        if (self.logprobs is not None and self.completion_token_ids is not None
                and len(self.logprobs) != len(self.completion_token_ids)):
            raise ValueError(f"logprobs has {len(self.logprobs)} entries but completion_token_ids has "
                             f"{len(self.completion_token_ids)}: record one logprob per completion token")
        return self


class Trajectory(BaseModel):
    """One episode. `success` is `reward == 1.0`; `termination` says why it stopped."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    task_id: str
    seed: int
    env: EnvInfo
    policy: PolicyInfo
    messages: list[Message]
    reward: float = Field(ge=0.0, le=1.0)
    success: bool
    termination: Termination
    reward_breakdown: dict[str, float] = Field(default_factory=dict)
    failure_reason: str | None = None
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list, description="Tool schemas the policy saw.")
    turns: list[TurnRecord] = Field(default_factory=list, description="Per assistant turn, when available.")
    timings: dict[str, float] = Field(
        default_factory=dict, description="Seconds: 'policy', 'env', 'total' (and backend-specific keys).")
    error: str | None = Field(default=None, description="Why a policy_error/agent_error episode stopped.")
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="Task metadata (Observation.info), e.g. the store's task_type and capability. For "
                    "reports only: never show it to an analysis or policy LLM (it names the answer).")
    sample_index: int = Field(default=0, ge=0, description="Which sample of this task (GRPO group member).")

    @model_validator(mode="after")
    def _success_matches_reward(self) -> Trajectory:
        if self.success and self.reward < 1.0:
            raise ValueError(f"success=True but reward={self.reward}: success means reward == 1.0")
        return self

    # -- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")  # messages in OpenAI form (Message leaves unset keys out)

    def to_json_line(self) -> str:
        """Compact UTF-8 JSON, written by pydantic's serialiser in one pass (the rollout service
        writes one per episode; this is ~5x faster than `json.dumps(self.to_dict())`)."""
        return self.model_dump_json()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        return cls.model_validate(data)

    @classmethod
    def from_json_line(cls, line: str) -> Trajectory:
        return cls.model_validate(json.loads(line))

    def assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m.role == "assistant")


def to_json_line_bytes(trajectory: Trajectory) -> bytes:
    """One JSONL line, newline included, as UTF-8 bytes straight from pydantic's serialiser."""
    return Trajectory.__pydantic_serializer__.to_json(trajectory) + b"\n"


def dumps_jsonl(trajectories: Iterable[Trajectory]) -> bytes:
    """Serialise to JSONL bytes (what the artifact store keeps)."""
    return b"".join(map(to_json_line_bytes, trajectories))


def loads_jsonl(data: bytes | str, *, source: str = "<bytes>") -> list[Trajectory]:
    """Parse JSONL; bytes that are not UTF-8 or a bad line raise ArtifactCorrupted with one line
    naming the source (and the byte offset or line number)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ArtifactCorrupted(f"{source}: not UTF-8 text (byte {exc.start}): a trajectory file is JSON Lines") \
            from None
    out: list[Trajectory] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_json_line(line))
        except (json.JSONDecodeError, ValidationError, InvalidArgument) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ArtifactCorrupted(f"{source}:{number}: not a valid trajectory record ({first[:300]})") from exc
    return out


def write_jsonl(trajectories: Iterable[Trajectory], dest: str | Path | IO[str]) -> int:
    """Write JSONL to a path (overwritten) or an open text stream; returns the record count."""
    trajectories = list(trajectories)
    if isinstance(dest, str | Path):
        Path(dest).write_bytes(dumps_jsonl(trajectories))
    else:
        dest.writelines(t.to_json_line() + "\n" for t in trajectories)
    return len(trajectories)


def read_jsonl(src: str | Path | IO[str]) -> list[Trajectory]:
    """Read a JSONL file (path or open text stream)."""
    if isinstance(src, str | Path):
        return loads_jsonl(Path(src).read_text(encoding="utf-8"), source=str(src))
    return loads_jsonl(src.read(), source=getattr(src, "name", "<stream>"))
