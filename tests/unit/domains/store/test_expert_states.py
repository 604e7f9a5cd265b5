"""`StoreExpert.next_message`: the expert's next message in any state. On its own states it is the
positional plan; after another policy's harmless mistake the skilled expert still solves the task;
it never goes back to a read a write made moot, and takes up a sub-request left undone; a question's
answer (the email, "yes") does not move it on to the next request."""

from __future__ import annotations

import pytest

from trace_common.domains.store import CAPABILITIES, ExpertConfig, StoreEnv, StoreExpert
from trace_common.env.episode import run_episode
from trace_common.env.messages import Message, ToolCall

HALF = ExpertConfig(skills=dict.fromkeys(CAPABILITIES, 0.5))
NONE = ExpertConfig(skills=dict.fromkeys(CAPABILITIES, 0.0))


def _call(name: str, **arguments) -> Message:
    return Message.assistant(None, [ToolCall.create("call_x", name, arguments)])


def _dumps(messages):
    return [m.model_dump() for m in messages]


def _by_state(expert, task, skills, mistake=None, turn=-1):
    """The expert labelling every state, but making `mistake` on assistant turn `turn`."""
    def policy(history, tools):
        n = sum(1 for m in history if m.role == "assistant")
        return mistake(task, history) if n == turn else expert.next_message(task, skills, history)
    return policy


@pytest.mark.parametrize("task_types", ["compound", "probes"])
@pytest.mark.parametrize("config", [ExpertConfig.perfect(), HALF, NONE], ids=["perfect", "half", "none"])
def test_on_its_own_states_it_is_the_plan(task_types, config):
    env, expert = StoreEnv(task_types=task_types), StoreExpert(config)
    for seed in range(120):
        skills = expert.skill_flags(seed, seed % 3)
        env.reset(seed)
        positional = run_episode(env, expert.policy_for(env, skills), seed)
        by_state = run_episode(env, _by_state(expert, env.task, skills), seed)
        assert _dumps(by_state.messages) == _dumps(positional.messages), seed
        assert by_state.success == positional.success


def _bad_id(task, history):
    return _call("get_order_details", order_id="#W0000000")


def _other_order(task, history):
    orders = [o for o, row in task.db["orders"].items() if row.get("user_id") == task.user_id]
    return _call("get_order_details", order_id=sorted(orders)[-1]) if orders else _bad_id(task, history)


READS = ("find_user_id_by_email", "list_user_orders", "get_order_details", "get_product_details")


def _repeat_read(task, history):
    """The last read again (a repeated write is no harmless mistake: the policy forbids it)."""
    reads = [m for m in history if m.role == "assistant" and m.tool_calls and m.tool_calls[0].name in READS]
    return reads[-1] if reads else _bad_id(task, history)


def _unparsable(task, history):
    return Message.assistant(None, [ToolCall(id="call_x", function={"name": "get_order_details",
                                                                      "arguments": "{order_id: W1"})])


def _ask_to_proceed(task, history):
    return Message.assistant("Should I proceed with that?")  # the user answers "yes" and does not move on


def _ask_email(task, history):
    return Message.assistant("Could you confirm your email?")


@pytest.mark.parametrize("mistake", [_bad_id, _other_order, _repeat_read, _unparsable, _ask_to_proceed, _ask_email],
                         ids=["unknown-id", "another-order", "repeat-last-read", "unparsable-arguments",
                              "asks-to-proceed", "asks-for-the-email"])
@pytest.mark.parametrize("turn", [1, 2, 3])
def test_the_skilled_expert_recovers_from_a_harmless_mistake(mistake, turn):
    env, expert = StoreEnv(), StoreExpert(ExpertConfig.perfect())
    failed = []
    for seed in range(80):
        env.reset(seed)
        traj = run_episode(env, _by_state(expert, env.task, expert.skill_flags(seed), mistake, turn), seed)
        if not traj.success:
            failed.append((seed, traj.failure_reason))
    assert failed == []


def _perfect_plans(seeds):
    """(seed, expert, task, skills, planned messages, their sub-request tags) of the skilled expert."""
    env, expert = StoreEnv(), StoreExpert(ExpertConfig.perfect())
    for seed in seeds:
        env.reset(seed)
        skills = expert.skill_flags(seed)
        plan = expert._plan(env.task, skills)
        yield seed, expert, env.task, skills, plan.messages, plan.groups


def test_a_read_made_moot_by_the_write_is_not_redone():
    checked = 0
    for seed, expert, task, skills, messages, groups in _perfect_plans(range(200)):
        names = [m.tool_calls[0].name if m.tool_calls else None for m in messages]
        # a lookup followed, in the same sub-request, by the cancel it checks
        pairs = [i for i in range(len(messages) - 1) if names[i] == "get_order_details"
                 and names[i + 1] == "cancel_pending_order" and groups[i] == groups[i + 1]]
        if not pairs:
            continue
        i = pairs[0]
        history = [Message.system("s"), Message.user("u")]
        followups = iter(task.scenario.followups)
        for m in messages[:i]:  # the plan so far, each reply answered by the user's next request
            history += [m] if m.tool_calls else [m, Message.user(next(followups))]
        history.append(messages[i + 1])
        label = expert.next_message(task, skills, history)
        assert label.model_dump() == messages[i + 2].model_dump(), seed  # what follows the write
        checked += 1
    assert checked >= 5


def test_a_sub_request_left_undone_is_taken_up_before_the_reply():
    checked = 0
    for seed, expert, task, skills, messages, groups in _perfect_plans(range(300)):
        if task.scenario.mode == "sequential" or len(task.subrequests) < 2:
            continue
        first = [i for i, g in enumerate(groups) if g == 0 and messages[i].tool_calls]
        if any(messages[i].tool_calls[0].name == "list_user_orders" for i in first):
            continue  # a shared lookup: the later request's calls would include it
        # the opening lookup, then every call of the other sub-requests, sub-request 0 skipped
        history = [Message.system("s"), Message.user("u")] + [m for m, g in zip(messages, groups, strict=True)
                                                               if m.tool_calls and g != 0]
        assert expert.next_message(task, skills, history).model_dump() == messages[first[0]].model_dump(), seed
        checked += 1
    assert checked >= 5
