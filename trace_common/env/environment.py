"""The Environment contract every TRACE environment fulfils (built-in, tau2 data, generated).

An environment is a seeded, verifiable conversation between an agent and a user with tools:

    env = make("store")                     # trace_common.env.registry
    obs = env.reset(seed)                   # system prompt + first user message
    tools = env.tool_schemas()              # OpenAI function schemas
    while not env.done:
        result = env.step(action)           # ToolAction or MessageAction
    env.reward(); env.diagnostics()

The rollout service, the GRPO trainer and the sandbox worker that hosts generated
environments all drive environments through this class only, so an implementation must
keep every promise in the `Environment` docstring; `tests/unit/env` checks them on any
registered environment.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trace_common.env.messages import Action, Message, ToolAction
from trace_common.errors import InvalidArgument


class Termination(StrEnum):
    """Why an episode ended (the trajectory's `termination`)."""

    DONE = "done"              # the environment ended the episode normally (task finished)
    MAX_TURNS = "max_turns"    # the agent used its turn budget before the environment ended
    USER_STOP = "user_stop"    # the user ended the conversation early (gave up, off-topic...)
    AGENT_ERROR = "agent_error"  # the agent's output could not be turned into an action
    POLICY_ERROR = "policy_error"  # the policy backend failed (unreachable, raised)
    ENV_ERROR = "env_error"    # a dependency of the environment failed (e.g. its LLM user is unreachable)
    TIMEOUT = "timeout"        # the episode's wall-clock deadline passed
    # the conversation outgrew the policy's context window: the agent's budget in tokens ran out,
    # as MAX_TURNS is its budget in turns (scored on the state reached; not an error)
    CONTEXT_EXHAUSTED = "context_exhausted"


class Diagnostic(BaseModel):
    """A capability-tagged event: the agent visibly failed (or lacked) one capability.

    Semantics: emitted by the environment, never by the agent; `turn` is the 0-based index
    of the agent action (step call) during which it happened, or the number of actions so
    far for events found when the episode ends.
    """

    model_config = ConfigDict(extra="forbid")

    capability: str = Field(description="snake_case capability name, e.g. 'precondition_verification'.")
    event: str = Field(description="snake_case event name, e.g. 'write_precondition_false'.")
    turn: int = Field(ge=0, description="0-based agent action index (see class docstring).")
    detail: dict[str, Any] = Field(default_factory=dict, description="Small JSON-able facts.")

    @field_validator("capability", "event")
    @classmethod
    def _snake(cls, value: str) -> str:
        if not value or not all(c.islower() or c.isdigit() or c == "_" for c in value) or value[0] == "_":
            raise ValueError(f"{value!r} is not snake_case: use lowercase letters, digits and '_'")
        return value


class Observation(BaseModel):
    """What `reset` returns: the initial messages (system prompt, first user message)."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message]
    task_id: str
    seed: int
    tools: list[dict[str, Any]] = Field(default_factory=list, description="Same as tool_schemas().")
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="Task metadata for records and analysis (e.g. task_type). Never shown to the policy.")
    guidance: str | None = Field(
        None, max_length=4000,
        description="A hint for this instance's skill (capability environments; docs/design.md 'Guided rollouts'). "
                    "Never part of `messages`: the trainer shows it, as an `<expert_guidance>` block at the end "
                    "of the system prompt (trace_common/env/guidance.py), only in the guided share of a group's "
                    "rollouts and trains those episodes off-policy on the plain prompt.")


class StepResult(BaseModel):
    """What `step` returns: new messages (a tool result, a user reply), done, and info."""

    model_config = ConfigDict(extra="forbid")

    observation: list[Message]
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class Environment(ABC):
    """Base class of all environments. An implementation MUST:

    1. Set class attributes `name` (registry name) and `version` (e.g. "1.0.0"); optionally
       `description` and `default_max_turns`.
    2. `reset(seed)`: build the task instance from `seed` alone -- with
       `random.Random(seed)` or another explicitly seeded generator, never the global RNG,
       `hash()`, time, or dict/set iteration order of unseeded data -- so the same seed
       gives an identical instance and identical observation in every process; return the
       system prompt (the policy) and the first user message. `reset` may be called again
       to start a new episode on the same object.
    3. `tool_schemas()`: the tools in OpenAI function format
       (`{"type": "function", "function": {"name", "description", "parameters"}}`),
       identical for every seed.
    4. `step(action)`: apply one `ToolAction` (answer with exactly one role "tool" message
       whose `tool_call_id` is `action.call_id`) or one `MessageAction` (answer with the
       user's reply, role "user", possibly ending the episode). Agent mistakes -- unknown
       tool, malformed or missing arguments, a `ToolAction` whose `error` is set, a failed
       write -- are answered with an error text in the observation and MUST leave the
       state unchanged; `step` raises only for contract misuse (step before reset, step
       after done: `FailedPrecondition`).
    5. `done`: True once the episode is over (the user ended it or the task is finished).
    6. `reward()`: a float in [0, 1] computed algorithmically from the state and the
       conversation (no LLM judge); success means reward == 1. Callable any time after
       reset; meaningful once done.
    7. `diagnostics()`: capability-tagged events (`Diagnostic.model_dump()` dicts) for
       capabilities the agent visibly failed so far; [] if the environment has none.
    8. `splits()`: named task splits as lists (or ranges) of seeds; splits are disjoint.
    9. `task_id`: a stable string id of the current task (procedural envs: `str(seed)`).

    Optional: `reward_breakdown()` (named components in [0, 1]), `failure_reason()` (one
    line, None on success), `termination` (a `Termination`, defaults to DONE), and
    `inline_steps = True` for an environment whose every call is short CPU work (well under a
    millisecond or so, no I/O): `run_episode_async` then calls it on the event loop instead of
    handing each call to a worker thread (the hand-off costs more than such a call).

    An instance plays one episode at a time (concurrent episodes use separate instances);
    `__init__` takes only keyword parameters with defaults, documented for the registry
    (`make(name, **params)` may pass them as strings, as `EnvironmentRef.params` does).
    """

    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str] = ""
    default_max_turns: ClassVar[int] = 20
    #: True: reset/step/reward never block (no I/O, no LLM calls, short CPU work); async drivers
    #: run them inline on the event loop. False (default): they may block; drivers use a thread.
    inline_steps: ClassVar[bool] = False

    @abstractmethod
    def reset(self, seed: int) -> Observation: ...

    @abstractmethod
    def tool_schemas(self) -> list[dict[str, Any]]: ...

    @abstractmethod
    def step(self, action: Action) -> StepResult: ...

    @property
    @abstractmethod
    def done(self) -> bool: ...

    @abstractmethod
    def reward(self) -> float: ...

    @abstractmethod
    def splits(self) -> dict[str, Sequence[int]]: ...

    @property
    @abstractmethod
    def task_id(self) -> str: ...

    def diagnostics(self) -> list[dict[str, Any]]:
        return []

    def reward_breakdown(self) -> dict[str, float]:
        return {}

    def failure_reason(self) -> str | None:
        return None

    def episode_info(self) -> dict[str, Any]:
        """Optional end-of-episode facts for records and analysis (e.g. which DB records
        differ, which checks failed), merged into `Trajectory.info`. JSON-able, small."""
        return {}

    def episode_finished(self) -> None:
        """Called by the episode driver once the trajectory has been read, however the episode
        ended (done, max turns, timeout, policy error). Environments holding resources per
        episode (a remote episode, a sandbox slot) release them here; the instance stays usable
        (the next `reset` starts a new episode). Default: nothing."""
        return None

    @property
    def termination(self) -> Termination:
        return Termination.DONE

    # -- helpers for implementations --------------------------------------------------------
    @staticmethod
    def check_seed(seed: object) -> int:
        """Validate a seed (a non-negative int; bools refused)."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgument(field="seed", expected="a non-negative integer", got=seed,
                                  fix="Pass a task seed from one of the environment's splits().")
        return seed

    @staticmethod
    def tool_error(action: ToolAction, text: str) -> Message:
        """The error observation for a tool call (`Error: <text>`)."""
        return Message.tool(action.call_id, f"Error: {text}")
