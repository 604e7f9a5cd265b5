"""`tau2-retail` as an SDK environment: episodes, termination rules, reward in the trajectory.

The user here is `ScriptedUser` (fixed replies, then ###STOP###), the offline user the
environment ships for runs without an LLM; the agent is a scripted policy.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.env.contract import check_environment_contract
from trace_common.domains.tau2.environment import Tau2Environment, make_tau2_retail
from trace_common.domains.tau2.evaluator import Tau2Termination
from trace_common.domains.tau2.prompts import AGENT_GREETING, agent_system_prompt
from trace_common.domains.tau2.user_simulator import ScriptedUser
from trace_common.env import Message, MessageAction, Termination, ToolAction, ToolCall, make, run_episode
from trace_common.errors import FailedPrecondition, InvalidArgument, Unimplemented


def env_for(retail, replies=("Hello, I need help with an order.",), **kw) -> Tau2Environment:
    return Tau2Environment(retail, ScriptedUser(list(replies)), **kw)


def gold_policy(task, closing: str = "All done."):
    """Calls the task's gold actions one per turn, then says `closing`."""
    pending = list(task.gold_actions)

    def policy(messages: list[Message], tools: list[dict]) -> Message:
        if pending:
            action = pending.pop(0)
            return Message.assistant(tool_calls=[ToolCall.create(f"call_{len(messages)}", action.name,
                                                                 action.arguments)])
        return Message.assistant(closing)
    return policy


def test_environment_contract(data_root):
    replies = json.dumps(["Hi, I want to return something.", "Order #W6390527.", "Thanks."])
    check_environment_contract(lambda: make("tau2-retail", data=str(data_root), user_replies=replies),
                               seeds=[0, 5, 12])


def test_observation_is_tau2s_conversation_start(retail):
    env = env_for(retail)
    obs = env.reset(5)
    assert [m.role for m in obs.messages] == ["system", "assistant", "user"]
    assert obs.messages[0].content == agent_system_prompt(retail.policy)
    assert obs.messages[1].content == AGENT_GREETING
    assert obs.messages[2].content == "Hello, I need help with an order."
    assert (obs.task_id, obs.seed, obs.info["split"]) == ("5", 5, "test")
    assert obs.tools == env.tool_schemas() and len(obs.tools) == 16
    assert env.user.heard == [AGENT_GREETING]
    assert "<scenario>" in env.user.system_prompt


@pytest.mark.parametrize("task_id", ["0", "5", "12", "22", "38", "46", "64", "105"])
def test_gold_episode_scores_one_and_stores_it_in_the_trajectory(task_id, retail):
    env = env_for(retail)
    task = retail.task_by_id(task_id)
    traj = run_episode(env, gold_policy(task), seed=retail.seed_of(task_id))
    assert (traj.reward, traj.success, traj.failure_reason) == (1.0, True, None)
    assert traj.termination is Termination.DONE and env.tau2_termination is Tau2Termination.USER_STOP
    assert traj.reward_breakdown["DB"] == 1.0
    tool_messages = [m for m in traj.messages if m.role == "tool"]
    assert len(tool_messages) == len(task.gold_actions)


def test_wrong_episode_stores_reward_and_failure_reason(retail):
    task = retail.task_by_id("38")
    task_without_cancel = task.model_copy(deep=True)
    task_without_cancel.evaluation_criteria.actions = [a for a in task.gold_actions
                                                       if a.name != "cancel_pending_order"]
    traj = run_episode(env_for(retail), gold_policy(task_without_cancel), seed=retail.seed_of("38"))
    assert traj.reward == 0.0 and not traj.success
    assert traj.failure_reason == "DB: final database differs from the gold one in orders/#W9348897"
    assert traj.reward_breakdown == {"DB": 0.0}  # NL_ASSERTION is reported unevaluated, not scored
    assert json.loads(traj.to_json_line())["failure_reason"] == traj.failure_reason


@pytest.mark.parametrize(("reply", "termination"), [
    ("Great, thanks! ###STOP###", Termination.DONE),
    ("###TRANSFER###", Termination.USER_STOP),
    ("I can't continue. ###OUT-OF-SCOPE###", Termination.USER_STOP),
])
def test_user_stop_tokens_end_the_episode(reply, termination, retail):
    env = env_for(retail, replies=["Hi", reply])
    env.reset(retail.seed_of("12"))  # read-only task: doing nothing keeps the DB equal to gold
    result = env.step(MessageAction("Anything else?"))
    assert result.done and env.done and result.observation[0].content == reply
    assert env.termination is termination and env.tau2_termination is Tau2Termination.USER_STOP
    assert env.reward() == 1.0  # tau2 scores all three stop tokens normally
    with pytest.raises(FailedPrecondition):
        env.step(MessageAction("hello?"))


def test_stop_token_in_the_first_user_message_ends_at_reset(retail):
    env = env_for(retail, replies=["###STOP###"])
    env.reset(0)
    assert env.done and env.termination is Termination.DONE


def _order_lookup(i: int) -> ToolAction:
    return ToolAction(name="get_order_details", arguments={"order_id": "#W2378156"}, call_id=f"c{i}")


@pytest.mark.parametrize(("max_steps", "actions", "expected_steps"), [
    (6, [_order_lookup(i) for i in range(10)], 7),           # 1 user step + 2 per tool call
    (4, [MessageAction("hm")] * 5, 4),                        # limit hit on the agent's message: no reply
])
def test_max_steps_ends_the_episode_with_reward_zero(max_steps, actions, expected_steps, retail):
    env = env_for(retail, replies=["Hi"] * 20, max_steps=max_steps)
    env.reset(12)
    for action in actions:
        if env.done:
            break
        env.step(action)
    assert env.done and env.tau2_termination is Tau2Termination.MAX_STEPS
    assert env.steps == expected_steps
    assert env.termination is Termination.MAX_TURNS
    assert env.reward() == 0.0 and "max_steps" in env.failure_reason()


def test_limit_overrides_a_user_stop_on_the_same_step(retail):
    env = env_for(retail, replies=["Hi", "###STOP###"], max_steps=3)
    env.reset(12)
    env.step(MessageAction("Bye"))  # steps: 1 (first user) + 1 agent + 1 user = 3 = max_steps
    assert env.tau2_termination is Tau2Termination.MAX_STEPS and env.reward() == 0.0


@pytest.mark.parametrize("bad", [
    ToolAction(name="no_such_tool", arguments={}),
    ToolAction(name="cancel_pending_order", arguments={}, raw_arguments="{oops", error="arguments are not valid JSON"),
    ToolAction(name="get_order_details", arguments={"order_id": "#W0"}),
])
def test_too_many_tool_errors_end_the_episode(bad, retail):
    env = env_for(retail, max_errors=3)
    env.reset(12)
    observations = [env.step(bad).observation[0].content for _ in range(3)]
    assert all(o.startswith("Error: ") for o in observations)
    assert env.done and env.tau2_termination is Tau2Termination.TOO_MANY_ERRORS
    assert env.termination is Termination.AGENT_ERROR
    assert env.reward() == 0.0 and "too_many_errors" in env.failure_reason()
    assert env.db == retail.fresh_db()


def test_undecodable_arguments_answer_with_an_error_and_change_nothing(retail):
    env = env_for(retail)
    env.reset(38)
    bad = ToolAction(name="cancel_pending_order", call_id="x", raw_arguments='{"order_id": "#W9348897"',
                     error="arguments are not valid JSON (Expecting ',' delimiter at char 26)")
    result = env.step(bad)
    assert result.observation[0].tool_call_id == "x"
    assert result.observation[0].content == ("Error: Invalid arguments for tool 'cancel_pending_order': "
                                             "arguments are not valid JSON (Expecting ',' delimiter at char 26)")
    assert env.errors == 1 and env.db == retail.fresh_db()


def test_reward_before_the_end_is_zero_not_finished(retail):
    env = env_for(retail)
    env.reset(12)
    info = env.reward_info()
    assert info.reward == 0.0 and info.termination is Tau2Termination.NOT_FINISHED


def test_step_before_reset_is_refused(retail):
    with pytest.raises(FailedPrecondition, match="reset"):
        env_for(retail).step(MessageAction("hi"))


def test_without_a_user_reset_says_how_to_configure_one(data_root, monkeypatch):
    monkeypatch.delenv("TRACE_TAU2_USER_BASE_URL", raising=False)
    env = make("tau2-retail", data=str(data_root))
    assert len(env.tool_schemas()) == 16 and set(env.splits()) == {"train", "test"}
    with pytest.raises(FailedPrecondition, match="user_base_url"):
        env.reset(0)


@pytest.mark.parametrize(("params", "field"), [
    ({"max_steps": "many"}, "max_steps"),
    ({"max_errors": "0"}, "max_errors"),
    ({"user_replies": "not json"}, "user_replies"),
    ({"user_base_url": "localhost:8000", "user_model": "m"}, "user.base_url"),
])
def test_bad_parameters_are_invalid_arguments(params, field, data_root):
    with pytest.raises(InvalidArgument, match=field):
        make_tau2_retail(data=str(data_root), **params)


def test_domains_without_tools_are_refused(data_root):
    from trace_common.domains.tau2.data import load_domain

    with pytest.raises(Unimplemented, match="airline"):
        Tau2Environment(load_domain(data_root, "airline"), ScriptedUser([]))


def test_splits_are_the_split_file_as_seeds(retail):
    splits = env_for(retail).splits()
    assert sorted(splits["train"] + splits["test"]) == list(range(114))
    assert retail.tasks[splits["test"][0]].id in retail.split_ids["test"]
