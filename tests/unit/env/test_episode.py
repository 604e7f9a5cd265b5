"""The episode loop: terminations, token records, timings, and the contract checks on
the toy environment."""

from __future__ import annotations

import pytest

from tests.unit.env.contract import check_environment_contract
from tests.unit.env.toy_env import ToyEnv
from trace_common.env import Message, PolicyInfo, PolicyTurn, Termination, ToolCall, run_episode
from trace_common.errors import ContextExhausted, InvalidArgument


def _numbers(messages):
    text = messages[1].content.removeprefix("What is ").removesuffix("?")
    return [int(x) for x in text.split(" + ")]


def solver(messages, tools):
    """Calls add, then reports the tool's answer."""
    if messages[-1].role == "tool":
        return Message.assistant(f"The sum is {messages[-1].content}.")
    a, b = _numbers(messages)
    return PolicyTurn(message=Message.assistant(None, [ToolCall.create("c0", "add", {"a": a, "b": b})]),
                      prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-0.5])


def wrong(messages, tools):
    return Message.assistant("It is 0.")


def chatty_tools(messages, tools):
    return Message.assistant(None, [ToolCall.create("c", "add", {"a": 1})])


def raises(messages, tools):
    raise ConnectionError("backend down")


def wrong_role(messages, tools):
    return Message.user("I am not the assistant")


def outgrows_context(messages, tools):
    """Calls the tool, then the conversation no longer fits the model (the backend says so)."""
    if messages[-1].role == "tool":
        raise ContextExhausted("the prompt has 4100 tokens but the model's context is 4096")
    return solver(messages, tools)


def task_too_long(messages, tools):
    """The task's own first prompt does not fit the model: no agent could have acted on it."""
    raise ContextExhausted("the prompt has 9000 tokens but the model's context is 4096")


@pytest.mark.parametrize("policy, max_turns, termination, reward, n_assistant", [
    (solver, None, Termination.DONE, 1.0, 2),
    (wrong, None, Termination.DONE, 0.0, 1),
    (chatty_tools, 3, Termination.MAX_TURNS, 0.0, 3),
    (raises, None, Termination.POLICY_ERROR, 0.0, 0),
    (wrong_role, None, Termination.AGENT_ERROR, 0.0, 0),
    # the agent's budget in tokens ran out: scored on the state reached, not an error
    (outgrows_context, None, Termination.CONTEXT_EXHAUSTED, 0.0, 1),
    (task_too_long, None, Termination.POLICY_ERROR, 0.0, 0),
])
def test_terminations(policy, max_turns, termination, reward, n_assistant):
    traj = run_episode(ToyEnv(), policy, seed=5, max_turns=max_turns)
    assert traj.termination == termination
    assert traj.reward == reward and traj.success == (reward == 1.0)
    assert traj.assistant_turns() == n_assistant
    assert (traj.error is not None) == (termination in (Termination.POLICY_ERROR, Termination.AGENT_ERROR))
    assert set(traj.timings) == {"policy", "env", "total"}
    assert ("context_exhausted" in traj.info) == (termination == Termination.CONTEXT_EXHAUSTED)


def test_timeout_and_bad_max_turns():
    assert run_episode(ToyEnv(), solver, 1, deadline_s=-1.0).termination == Termination.TIMEOUT
    with pytest.raises(InvalidArgument):
        run_episode(ToyEnv(), solver, 1, max_turns=0)


def test_record_fields():
    traj = run_episode(ToyEnv(), solver, seed=9, policy=PolicyInfo(model="m", adapter="cap-v1", version="1"),
                       env_params={"limit": 100}, sample_index=3)
    assert traj.task_id == "9" and traj.seed == 9 and traj.sample_index == 3
    assert traj.policy.adapter == "cap-v1" and traj.env.params == {"limit": 100}
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert traj.turns[0].message_index == 2 and traj.turns[0].completion_token_ids == [3]
    assert traj.tools == ToyEnv().tool_schemas()
    assert traj.failure_reason is None


def test_diagnostics_and_failure_reason_are_recorded():
    traj = run_episode(ToyEnv(), chatty_tools, seed=2, max_turns=2)
    assert [d.capability for d in traj.diagnostics] == ["tool_call_precision"] * 2
    assert [d.turn for d in traj.diagnostics] == [0, 1]
    assert traj.failure_reason == "sum not told"


def test_policy_sees_a_copy_of_the_conversation():
    seen = []

    def mutating(messages, tools):
        seen.append(len(messages))
        messages.clear()
        return Message.assistant("0")

    traj = run_episode(ToyEnv(), mutating, seed=1)
    assert seen == [2] and len(traj.messages) == 4


def test_toy_env_meets_the_contract():
    check_environment_contract(ToyEnv, seeds=[0, 1, 2, 3])


@pytest.mark.parametrize("policy, max_turns, termination, reward, n_assistant", [
    (solver, 5, Termination.DONE, 1.0, 2),
    (wrong, 5, Termination.DONE, 0.0, 1),
    (raises, 5, Termination.POLICY_ERROR, 0.0, 0),
    (wrong_role, 5, Termination.AGENT_ERROR, 0.0, 0),
    (outgrows_context, 5, Termination.CONTEXT_EXHAUSTED, 0.0, 1),
])
def test_async_loop_matches_sync_loop(policy, max_turns, termination, reward, n_assistant):
    """run_episode_async drives the same state machine: identical messages and outcome."""
    import asyncio

    from trace_common.env import run_episode_async

    async def async_policy(messages, tools):
        await asyncio.sleep(0)
        return policy(messages, tools)

    sync = run_episode(ToyEnv(), policy, seed=3, max_turns=max_turns)
    asyn = asyncio.run(run_episode_async(ToyEnv(), async_policy, seed=3, max_turns=max_turns))
    assert asyn.termination == sync.termination == termination
    assert asyn.reward == sync.reward == reward
    assert [m.to_dict() for m in asyn.messages] == [m.to_dict() for m in sync.messages]
    assert sum(m.role == "assistant" for m in asyn.messages) == n_assistant


def test_async_loop_deadline_bounds_a_hung_policy():
    import asyncio

    from trace_common.env import run_episode_async

    async def hangs(messages, tools):
        await asyncio.sleep(60)

    traj = asyncio.run(run_episode_async(ToyEnv(), hangs, seed=1, deadline_s=0.2))
    assert traj.termination == Termination.TIMEOUT and traj.timings["total"] < 5


class _FlakyUserEnv(ToyEnv):
    """A toy env whose 'user' dependency fails on the first step, and that reports episode facts."""

    def step(self, action):
        from trace_common.errors import Unavailable

        raise Unavailable("user simulator endpoint unreachable")

    def episode_info(self):
        return {"checked": ["db"]}


def test_dependency_failure_ends_episode_with_env_error_and_info_is_merged():
    traj = run_episode(_FlakyUserEnv(), solver, seed=2)
    assert traj.termination == Termination.ENV_ERROR
    assert "user simulator endpoint unreachable" in traj.error
    assert traj.info["checked"] == ["db"]
