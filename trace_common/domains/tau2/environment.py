"""A tau2-bench domain as a TRACE `Environment` (registered as `tau2-retail`).

One episode = one tau2 task, picked by seed (the task's index in tasks.json). The episode
follows tau2's half-duplex orchestration:

    reset(seed): fresh DB; agent system prompt = tau2 instructions + policy; the assistant
        greeting "Hi! How can I help you today?" goes to the user simulator, whose reply is
        the first user message. Observation = [system, assistant greeting, user].
    step(ToolAction): run the retail tool on this episode's DB -> one tool message
        ("Error: ..." on failure; tool errors are counted).
    step(MessageAction): the text goes to the user simulator -> one user message. A reply
        containing ###STOP###, ###TRANSFER### or ###OUT-OF-SCOPE### ends the episode.
    Steps are counted as tau2 counts them (each agent message, user message and tool
    answer is one step); the episode ends at `max_steps` (tau2 default 200) or when the
    tool errors reach `max_errors` (default 10). Limits are checked only when no tool answer
    is pending, as in tau2.
    reward(): `Tau2Evaluator` -- replay-based DB check, communicate/action checks, product
        over the task's reward basis; 0 unless the user (or agent) stopped the episode.

`surface()` describes the target for capability environments without a reset (no user
simulator needed): system prompt, greeting, tools, and the record toolkit
(`record_toolkit.py`) with this domain's catalog.

Mapping onto the SDK's `Termination`: ###STOP### -> done; ###TRANSFER### and
###OUT-OF-SCOPE### -> user_stop (tau2 scores all three normally); max_steps -> max_turns;
too_many_errors -> agent_error. The tau2 reason is kept in `tau2_termination` and in the
failure reason.

Parameters (strings, as the registry passes them; unset ones fall back to environment
variables so services can be configured by the chart): `data` ($TRACE_TAU2_DATA),
`user_base_url` ($TRACE_TAU2_USER_BASE_URL), `user_model` ($TRACE_TAU2_USER_MODEL),
`user_api_key` ($TRACE_TAU2_USER_API_KEY), `user_seed`, `user_temperature`, `user_timeout`,
`user_max_tokens` (cap on one user reply; unset, the endpoint's default applies -- for vLLM the
rest of the context window, which a weak model that never stops fills), `max_steps`,
`max_errors`, and `user_replies` (a JSON list: a scripted user instead of an LLM).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, Field, ValidationError

from trace_common.domains.tau2.data import Tau2Domain, load_domain_cached
from trace_common.domains.tau2.evaluator import CallRecord, RewardInfo, Tau2Evaluator, Tau2Termination
from trace_common.domains.tau2.prompts import (
    AGENT_GREETING,
    STOP,
    agent_system_prompt,
    user_stop_token,
    user_system_prompt,
)
from trace_common.domains.tau2.record_toolkit import RetailRecords
from trace_common.domains.tau2.retail_db import RetailDB
from trace_common.domains.tau2.retail_tools import RetailTools
from trace_common.domains.tau2.tasks import Task
from trace_common.domains.tau2.user_simulator import (
    LLMUserSimulator,
    ScriptedUser,
    UserLLMConfig,
    UserSimulator,
)
from trace_common.env import (
    Action,
    Environment,
    Message,
    MessageAction,
    Observation,
    StepResult,
    Termination,
    ToolAction,
)
from trace_common.env.surface import TargetSurface
from trace_common.errors import FailedPrecondition, InvalidArgument, Unimplemented

DEFAULT_MAX_STEPS = 200
DEFAULT_MAX_ERRORS = 10


class Tau2Environment(Environment):
    """tau2 retail tasks with TRACE's retail tools and a simulated user (see module docstring)."""

    name: ClassVar[str] = "tau2-retail"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "tau2-bench retail: 114 customer-service tasks, 16 tools, simulated user"
    default_max_turns: ClassVar[int] = DEFAULT_MAX_STEPS // 2

    def __init__(self, domain: Tau2Domain, user: UserSimulator | None = None, *,
                 max_steps: int = DEFAULT_MAX_STEPS, max_errors: int = DEFAULT_MAX_ERRORS):
        if not domain.has_tools:
            raise Unimplemented(f"tau2 domain {domain.name!r} has no TRACE tool implementation (retail only)")
        if max_steps < 1 or max_errors < 1:
            raise InvalidArgument(field="max_steps/max_errors", expected="integers >= 1",
                                  got=(max_steps, max_errors))
        self.domain = domain
        self.user = user
        self.max_steps = max_steps
        self.max_errors = max_errors
        self.evaluator = Tau2Evaluator(domain.fresh_db)
        self._policy_prompt = agent_system_prompt(domain.policy)
        self._schemas = [spec.schema for spec in RetailTools.SPECS.values()]
        self._task: Task | None = None
        self._seed: int | None = None
        # This episode's DB. It shares unchanged records with the domain's pristine DB
        # (copy-on-write): read it freely, change it only through the tools.
        self.db: RetailDB | None = None
        self._tools: RetailTools | None = None
        self.calls: list[CallRecord] = []
        self.agent_texts: list[str] = []
        self.steps = 0
        self.errors = 0
        self._done = False
        self.tau2_termination: Tau2Termination | None = None
        self.stop_token: str | None = None
        self._reward: RewardInfo | None = None

    # -- contract ---------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        seed = self.check_seed(seed)
        task = self.domain.task_for_seed(seed)
        if task.initial_state:
            raise Unimplemented(f"tau2 task {task.id} has an initial_state; TRACE does not replay initial "
                                "states yet (no retail or airline task has one)")
        if self.user is None:
            raise FailedPrecondition(
                "tau2 environments need a user simulator: pass user_base_url and user_model (or set "
                "$TRACE_TAU2_USER_BASE_URL / $TRACE_TAU2_USER_MODEL), or user_replies for a scripted user")
        self._task, self._seed = task, seed
        self.db = self.domain.fresh_db()
        self._tools = RetailTools(self.db)
        self.calls, self.agent_texts = [], [AGENT_GREETING]
        self.steps = self.errors = 0
        self._done, self.tau2_termination, self.stop_token, self._reward = False, None, None, None
        self.user.reset(user_system_prompt(self.domain.user_guidelines(), task))
        first = self._user_turn(AGENT_GREETING)
        self._check_limits()
        return Observation(
            messages=[Message.system(self._policy_prompt), Message.assistant(AGENT_GREETING), Message.user(first)],
            task_id=task.id, seed=seed, tools=self.tool_schemas(),
            info={"domain": self.domain.name, "split": self.domain.split_of(task.id),
                  "reward_basis": [b.value for b in task.evaluation_criteria.reward_basis]
                  if task.evaluation_criteria else []})

    def tool_schemas(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(self._schemas))  # callers may mutate their copy

    def surface(self) -> TargetSurface:
        """What a capability environment keeps of this target (trace_common/env/surface.py): the
        system prompt and greeting every reset shows, the 16 tools, and the record toolkit with
        this domain's catalog and people. Needs no user simulator (nothing is reset)."""
        return TargetSurface(name=self.name, version=self.version, system_prompt=self._policy_prompt,
                             greeting=AGENT_GREETING, tool_schemas=self.tool_schemas(),
                             toolkit="trace_common.domains.tau2.record_toolkit:TOOLKIT",
                             toolkit_params=RetailRecords.params_for(self))

    def step(self, action: Action) -> StepResult:
        if self._task is None:
            raise FailedPrecondition("step() before reset(): call reset(seed) first")
        if self._done:
            raise FailedPrecondition("step() after the episode ended: call reset(seed) for a new episode")
        if isinstance(action, ToolAction):
            return self._tool_step(action)
        if isinstance(action, MessageAction):
            return self._message_step(action)
        raise InvalidArgument(field="action", expected="a ToolAction or MessageAction", got=type(action).__name__)

    @property
    def done(self) -> bool:
        return self._done

    @property
    def task_id(self) -> str:
        if self._task is None:
            raise FailedPrecondition("no task yet: call reset(seed) first")
        return self._task.id

    def splits(self) -> dict[str, Sequence[int]]:
        return self.domain.seed_splits()

    def reward(self) -> float:
        return self.reward_info().reward

    def reward_breakdown(self) -> dict[str, float]:
        return dict(self.reward_info().breakdown)

    def failure_reason(self) -> str | None:
        return self.reward_info().failure_reason

    @property
    def termination(self) -> Termination:
        if self.tau2_termination is Tau2Termination.USER_STOP:
            return Termination.DONE if self.stop_token == STOP else Termination.USER_STOP
        if self.tau2_termination is Tau2Termination.MAX_STEPS:
            return Termination.MAX_TURNS
        if self.tau2_termination is Tau2Termination.TOO_MANY_ERRORS:
            return Termination.AGENT_ERROR
        return Termination.DONE

    # -- tau2 specifics ---------------------------------------------------------------------
    def reward_info(self) -> RewardInfo:
        """The evaluator's full verdict (cached once the episode is over)."""
        if self._task is None:
            raise FailedPrecondition("reward() before reset(): call reset(seed) first")
        if self._reward is not None:
            return self._reward
        termination = self.tau2_termination if self._done and self.tau2_termination else Tau2Termination.NOT_FINISHED
        info = self.evaluator.evaluate(self._task, self.calls, self.agent_texts, termination)
        if self._done:
            self._reward = info
        return info

    def _tool_step(self, action: ToolAction) -> StepResult:
        assert self._tools is not None
        if action.error is not None:
            content, error = f"Error: Invalid arguments for tool '{action.name}': {action.error}", True
            self.calls.append(CallRecord(action.name, {}, content, True, executed=False))
        else:
            result = self._tools.call(action.name, action.arguments)
            content, error = result.content, result.error
            self.calls.append(CallRecord(action.name, dict(action.arguments), content, error))
        self.errors += int(error)
        self.steps += 2  # the agent's tool-call message and the tool answer
        self._check_limits()
        return StepResult(observation=[Message.tool(action.call_id, content)], done=self._done,
                          info={"error": error})

    def _message_step(self, action: MessageAction) -> StepResult:
        self.agent_texts.append(action.content)
        self.steps += 1
        self._check_limits()
        if self._done:
            return StepResult(observation=[], done=True, info={"termination": self.tau2_termination.value})
        reply = self._user_turn(action.content)
        self._check_limits()  # as in tau2, a limit reached on this step overrides a user stop
        return StepResult(observation=[Message.user(reply)], done=self._done,
                          info={"stop_token": self.stop_token} if self.stop_token else {})

    def _user_turn(self, agent_text: str) -> str:
        assert self.user is not None
        reply = self.user.respond(agent_text)
        self.steps += 1
        token = user_stop_token(reply)
        if token is not None:
            self._done, self.tau2_termination, self.stop_token = True, Tau2Termination.USER_STOP, token
        return reply

    def _check_limits(self) -> None:
        if self.steps >= self.max_steps:
            self._done, self.tau2_termination = True, Tau2Termination.MAX_STEPS
        if self.errors >= self.max_errors:
            self._done, self.tau2_termination = True, Tau2Termination.TOO_MANY_ERRORS


class Tau2EnvConfig(BaseModel):
    """Parameters of `make("tau2-retail", ...)` after parsing (see module docstring)."""

    data: str | None = Field(None, description="tau2 data root or domain dir; default $TRACE_TAU2_DATA.")
    domain: str = Field("retail", description="Domain under the data root.")
    max_steps: int = Field(DEFAULT_MAX_STEPS, ge=1, le=10_000, description="tau2 step limit (all messages).")
    max_errors: int = Field(DEFAULT_MAX_ERRORS, ge=1, le=10_000, description="Tool errors that end an episode.")
    user: UserLLMConfig | None = Field(None, description="User simulator LLM; None with user_replies unset "
                                       "makes reset() fail with instructions.")
    user_replies: list[str] | None = Field(None, description="Scripted user replies instead of an LLM.")


def _env_or(value: str, var: str) -> str:
    return value or os.environ.get(var, "")


def make_tau2_retail(data: str = "", user_base_url: str = "", user_model: str = "", user_api_key: str = "",
                     user_seed: str = "", user_temperature: str = "", max_steps: str = "", max_errors: str = "",
                     user_replies: str = "", user_timeout: str = "", user_max_tokens: str = "") -> Tau2Environment:
    """Registry factory: string parameters -> a `Tau2Environment` over the retail domain."""
    raw: dict[str, Any] = {"data": _env_or(data, "TRACE_TAU2_DATA") or None}
    if max_steps:
        raw["max_steps"] = max_steps
    if max_errors:
        raw["max_errors"] = max_errors
    base_url = _env_or(user_base_url, "TRACE_TAU2_USER_BASE_URL")
    if base_url:
        user: dict[str, Any] = {"base_url": base_url, "model": _env_or(user_model, "TRACE_TAU2_USER_MODEL")}
        if key := _env_or(user_api_key, "TRACE_TAU2_USER_API_KEY"):
            user["api_key"] = key
        if user_seed:
            user["seed"] = user_seed
        if user_temperature:
            user["temperature"] = user_temperature
        if user_timeout:
            user["timeout_s"] = user_timeout
        if user_max_tokens:
            user["max_tokens"] = user_max_tokens
        raw["user"] = user
    if user_replies:
        try:
            raw["user_replies"] = json.loads(user_replies)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(field="user_replies", expected="a JSON list of strings", got=user_replies,
                                  fix='Pass e.g. \'["I want to cancel order #W1", "###STOP###"]\'.') from exc
    try:
        config = Tau2EnvConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidArgument(field=".".join(str(p) for p in first["loc"]) or "params", expected=first["msg"],
                              got=first.get("input"), fix="Correct the tau2-retail parameter.") from exc
    return environment_from_config(config)


def environment_from_config(config: Tau2EnvConfig) -> Tau2Environment:
    domain = load_domain_cached(config.data, config.domain)
    user: UserSimulator | None = None
    if config.user_replies is not None:
        user = ScriptedUser(config.user_replies)
    elif config.user is not None:
        if not config.user.model:
            raise InvalidArgument(field="user_model", expected="the model name the user endpoint serves",
                                  fix="Pass user_model or set $TRACE_TAU2_USER_MODEL.")
        user = LLMUserSimulator(config.user)
    return Tau2Environment(domain, user, max_steps=config.max_steps, max_errors=config.max_errors)
