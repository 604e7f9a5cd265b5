"""The agent loop: play one episode of an environment with a policy, return a Trajectory.

A policy is a function from the conversation so far (OpenAI messages) and the tool
schemas to the next assistant message -- a scripted expert, an in-process model, or an
HTTP client. It may return a bare `Message` or a `PolicyTurn` carrying token ids and
logprobs for training. The loop is the same for tests, the rollout service and the
warm-start data generator, so all of them produce identical trajectory shapes.

Semantics (one episode):
    obs = env.reset(seed); messages = obs.messages
    while not env.done and turns < max_turns:
        reply = policy(messages, tools)          # may raise -> termination policy_error
                                                 #   (ContextExhausted -> context_exhausted, no error)
        messages += [reply]; turns += 1
        for action in actions_from_message(reply):
            messages += env.step(action).observation
            if env.done: break
    reward = env.reward(); success = reward == 1
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from trace_common.env.environment import Diagnostic, Environment, Termination
from trace_common.env.messages import Message, actions_from_message
from trace_common.env.trajectory import EnvInfo, PolicyInfo, Trajectory, TurnRecord
from trace_common.errors import ContextExhausted, DeadlineExceeded, InvalidArgument, Unavailable


@dataclass
class PolicyTurn:
    """A policy's reply with optional token-level data (ids of the prompt and completion,
    one logprob per completion token)."""

    message: Message
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None


PolicyFn = Callable[[list[Message], list[dict[str, Any]]], "Message | PolicyTurn"]


class _EpisodeDriver:
    """The episode loop as a resumable state machine, shared by `run_episode` (sync policies)
    and `run_episode_async` (async policies such as batched model backends): both ask it for
    the next conversation to answer (`next_request`) and hand the reply back (`answer`)."""

    def __init__(self, env: Environment, policy_fn: object, seed: int, max_turns: int | None, *,
                 policy: PolicyInfo | None, env_params: dict[str, Any] | None, deadline_s: float | None,
                 sample_index: int):
        if max_turns is None:
            max_turns = env.default_max_turns
        if max_turns < 1:
            raise InvalidArgument(field="max_turns", expected="an integer >= 1", got=max_turns)
        self.env, self.seed, self.max_turns, self.deadline_s = env, seed, max_turns, deadline_s
        self.policy_info = policy or PolicyInfo(model=getattr(policy_fn, "__name__", type(policy_fn).__name__))
        self.env_params, self.sample_index = env_params, sample_index
        self.start = time.perf_counter()
        self.t_policy = self.t_env = 0.0
        t0 = time.perf_counter()
        self.obs = env.reset(seed)
        self.tools = env.tool_schemas()
        self.t_env += time.perf_counter() - t0
        self.messages: list[Message] = list(self.obs.messages)
        self.turns: list[TurnRecord] = []
        self.n_turns = 0
        self.error: str | None = None
        self.context_note: str | None = None
        self.termination: Termination | None = None
        self._asked = 0.0

    def next_request(self) -> list[Message] | None:
        """The conversation the policy must answer next, or None when the episode is over."""
        env = self.env
        if self.termination is None:
            if env.done:
                self.termination = env.termination
            elif self.n_turns >= self.max_turns:
                self.termination = Termination.MAX_TURNS
            elif self.deadline_s is not None and time.perf_counter() - self.start > self.deadline_s:
                self.termination = Termination.TIMEOUT
        if self.termination is not None:
            return None
        self._asked = time.perf_counter()
        return list(self.messages)

    def fail(self, exc: BaseException) -> None:
        """The policy raised: the episode ends with `policy_error`, the reason kept -- unless the
        conversation outgrew the model's context (`ContextExhausted`) after the agent's first turn:
        then it ends as `context_exhausted`, no error, scored on the state reached (like
        `max_turns`). A first prompt that does not fit is a policy_error (a model or task set up
        wrong, which no agent could have acted on)."""
        self.t_policy += time.perf_counter() - self._asked
        # on the first turn it is not the agent's doing: the task itself does not fit the model
        if isinstance(exc, ContextExhausted) and self.n_turns > 0:
            self.termination, self.context_note = Termination.CONTEXT_EXHAUSTED, str(exc)
            return
        self.termination, self.error = Termination.POLICY_ERROR, f"{type(exc).__name__}: {exc}"

    def answer(self, reply: Message | PolicyTurn) -> None:
        self.t_policy += time.perf_counter() - self._asked
        turn = reply if isinstance(reply, PolicyTurn) else PolicyTurn(message=reply)
        if not isinstance(turn.message, Message) or turn.message.role != "assistant":
            self.termination = Termination.AGENT_ERROR
            self.error = f"policy returned {type(turn.message).__name__} " \
                         f"{getattr(turn.message, 'role', '')!s}, expected an assistant Message"
            return
        self.messages.append(turn.message)
        self.n_turns += 1
        if turn.completion_token_ids is not None or turn.logprobs is not None:
            self.turns.append(TurnRecord(message_index=len(self.messages) - 1,
                                         prompt_token_ids=turn.prompt_token_ids,
                                         completion_token_ids=turn.completion_token_ids, logprobs=turn.logprobs))
        t0 = time.perf_counter()
        try:
            for action in actions_from_message(turn.message):
                if self.env.done:
                    break
                self.messages.extend(self.env.step(action).observation)
        except (Unavailable, DeadlineExceeded) as exc:  # infrastructure, not a bug: end the episode, say why
            self.termination, self.error = Termination.ENV_ERROR, f"{type(exc).__name__}: {exc}"
        self.t_env += time.perf_counter() - t0

    def trajectory(self) -> Trajectory:
        env = self.env
        t0 = time.perf_counter()
        reward = float(env.reward())
        diagnostics = [Diagnostic.model_validate(d) for d in env.diagnostics()]
        breakdown = env.reward_breakdown()
        failure = env.failure_reason()
        self.t_env += time.perf_counter() - t0
        info = {**self.obs.info, **env.episode_info()}
        if self.context_note:
            info["context_exhausted"] = self.context_note
        finished = getattr(env, "episode_finished", None)  # duck-typed environments may lack the hook
        if callable(finished):
            finished()
        return Trajectory(
            task_id=env.task_id, seed=self.seed,
            env=EnvInfo(name=env.name, version=env.version, params=dict(self.env_params or {})),
            policy=self.policy_info,
            messages=self.messages, reward=reward, success=reward >= 1.0, termination=self.termination,
            reward_breakdown=breakdown, failure_reason=None if reward >= 1.0 else failure,
            diagnostics=diagnostics, tools=self.tools, turns=self.turns,
            timings={"policy": self.t_policy, "env": self.t_env, "total": time.perf_counter() - self.start},
            error=self.error, info=info, sample_index=self.sample_index)


def run_episode(env: Environment, policy_fn: PolicyFn, seed: int, max_turns: int | None = None, *,
                policy: PolicyInfo | None = None, env_params: dict[str, Any] | None = None,
                deadline_s: float | None = None, sample_index: int = 0) -> Trajectory:
    """Play `env` from `seed` until it is done or the agent used `max_turns` assistant turns
    (default: the environment's `default_max_turns`), and return the trajectory.

    The policy is called with a fresh copy of the message list each turn. Exceptions from
    the policy end the episode with termination `policy_error` (the message is kept in
    `error`), except `ContextExhausted` after the first turn (the conversation outgrew the model's
    context), which ends it with `context_exhausted` and no error (its message in
    `info["context_exhausted"]`); a reply that is not an assistant message ends it with `agent_error`;
    `deadline_s` (wall-clock seconds for the whole episode) ends it with `timeout`.
    Exceptions from the environment are bugs and propagate, except Unavailable/DeadlineExceeded
    (a dependency such as an LLM user simulator failed), which end it with `env_error`.
    """
    d = _EpisodeDriver(env, policy_fn, seed, max_turns, policy=policy, env_params=env_params,
                       deadline_s=deadline_s, sample_index=sample_index)
    while (request := d.next_request()) is not None:
        try:
            reply = policy_fn(request, d.tools)
        except Exception as exc:  # noqa: BLE001 - any backend failure ends the episode, recorded
            d.fail(exc)
            break
        d.answer(reply)
    return d.trajectory()


AsyncPolicyFn = Callable[[list[Message], list[dict[str, Any]]], Awaitable["Message | PolicyTurn"]]


async def run_episode_async(env: Environment, policy_fn: AsyncPolicyFn, seed: int, max_turns: int | None = None,
                            *, policy: PolicyInfo | None = None, env_params: dict[str, Any] | None = None,
                            deadline_s: float | None = None, sample_index: int = 0) -> Trajectory:
    """`run_episode` for an async policy (same semantics); episodes run concurrently on one loop.

    The deadline also bounds each policy call (`asyncio.wait_for`), so a hung backend cannot
    hold an episode past it. Cancellation of the caller propagates (no trajectory is made).
    """
    # Environment calls run in a worker thread: an environment may block (a tau2 user simulator
    # calls an LLM inside step), and the loop is shared with the service's gRPC server. An
    # environment that declares `inline_steps` is called on the loop: its calls are shorter than
    # the thread hand-off (bench/rollout_overhead: three hand-offs per turn were the loop's
    # largest cost after the environment itself).
    env_call = _inline if getattr(env, "inline_steps", False) else asyncio.to_thread
    d = await env_call(_EpisodeDriver, env, policy_fn, seed, max_turns, policy=policy,
                       env_params=env_params, deadline_s=deadline_s, sample_index=sample_index)
    while (request := d.next_request()) is not None:
        try:
            call = policy_fn(request, d.tools)
            if deadline_s is not None:
                left = max(0.0, deadline_s - (time.perf_counter() - d.start))
                reply = await asyncio.wait_for(call, left)
            else:
                reply = await call
        except TimeoutError:
            d.t_policy += time.perf_counter() - d._asked
            d.termination = Termination.TIMEOUT
            break
        except Exception as exc:  # noqa: BLE001 - any backend failure ends the episode, recorded
            d.fail(exc)
            break
        await env_call(d.answer, reply)
    return await env_call(d.trajectory)


async def _inline(fn, /, *args, **kwargs):
    """`asyncio.to_thread`'s signature, run on the calling loop (environments with inline_steps)."""
    return fn(*args, **kwargs)
