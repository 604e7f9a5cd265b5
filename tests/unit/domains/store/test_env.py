"""StoreEnv against the SDK contract, misuse errors, and the scripted user."""

from __future__ import annotations

import pytest

from tests.unit.env.contract import check_environment_contract
from trace_common.domains.store import PROBE_TYPES, StoreEnv, generate_task
from trace_common.domains.store.user import STOP_TOKEN, ScriptedUser
from trace_common.env import MessageAction, make
from trace_common.errors import FailedPrecondition, InvalidArgument


@pytest.mark.parametrize("task_types", [None, "probes", "argument_format"])
def test_store_meets_the_environment_contract(task_types):
    check_environment_contract(lambda: StoreEnv(task_types=task_types),
                               seeds=[1_000_000, 1_000_001, 1_000_002, 1_000_003, 5])


@pytest.mark.parametrize("call", [
    lambda e: e.step(MessageAction(content="hi")),
    lambda e: e.reward(),
    lambda e: e.task_id,
])
def test_use_before_reset_fails(call):
    with pytest.raises(FailedPrecondition, match="reset"):
        call(StoreEnv())


@pytest.mark.parametrize("seed", [-1, "3", 2.0, True])
def test_bad_seeds(seed):
    with pytest.raises(InvalidArgument, match="seed"):
        StoreEnv().reset(seed)


@pytest.mark.parametrize("task_types", ["nope", "precondition_check,precondition_check", ["x"],
                                        "compound,record_selection", "probes,argument_format", ["compound", "probes"],
                                        "compound,compound", []])
def test_bad_task_types(task_types):
    with pytest.raises(InvalidArgument, match="task_types"):
        make("store", task_types=task_types)


def _scenario(seed_pred, task_types=("compound",)):
    for seed in range(1000):
        task = generate_task(seed, task_types)
        if seed_pred(task):
            return task.scenario
    raise AssertionError("no scenario")


SEQUENTIAL = _scenario(lambda t: t.scenario.mode == "sequential" and len(t.subrequests) == 3)
AT_ONCE = _scenario(lambda t: t.scenario.mode == "all_at_once" and len(t.subrequests) == 1, PROBE_TYPES)


@pytest.mark.parametrize("scenario, agent_texts, expected", [
    (AT_ONCE, ["Done."], [(f"Thank you, that's all. {STOP_TOKEN}", True)]),
    (SEQUENTIAL, ["ok", "ok", "ok"], [(SEQUENTIAL.followups[0], False), (SEQUENTIAL.followups[1], False),
                                      (f"Thank you, that's all. {STOP_TOKEN}", True)]),
    (AT_ONCE, ["What is your email?", "Shall I proceed?", "Could you confirm?", "Done."],
     [(f"My email is {AT_ONCE.email}.", False), ("Yes, please go ahead.", False),
      (f"Thank you, that's all. {STOP_TOKEN}", True)]),
    (SEQUENTIAL, ["Email please?", "ok"], [(f"My email is {SEQUENTIAL.email}.", False),
                                            (SEQUENTIAL.followups[0], False)]),
])
def test_scripted_user(scenario, agent_texts, expected):
    user = ScriptedUser(scenario)
    replies = []
    for text in agent_texts:
        reply = user.reply(text)
        replies.append(reply)
        if reply[1]:
            break
    assert replies == expected
    assert user.opening() == scenario.opening


@pytest.mark.parametrize("task_types", [("compound",), PROBE_TYPES])
def test_sequential_opening_holds_only_the_first_request(task_types):
    task = next(t for t in (generate_task(s, task_types) for s in range(1000)) if t.scenario.mode == "sequential")
    assert task.subrequests[0].text in task.scenario.opening
    assert all(sr.text not in task.scenario.opening for sr in task.subrequests[1:])
    assert [f.removeprefix("Thanks. Also: ") for f in task.scenario.followups] == [
        sr.text for sr in task.subrequests[1:]]
