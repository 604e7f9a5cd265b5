"""tau2's reward rules: replay-based DB comparison, communicate and action checks, reward
basis, premature terminations; the failure reason names what went wrong."""

from __future__ import annotations

import json

import pytest

from tests.unit.tau2.test_gold_replay import _task_ids
from trace_common.domains.tau2.evaluator import (
    CallRecord,
    Tau2Evaluator,
    Tau2Termination,
    calls_from_messages,
)
from trace_common.domains.tau2.tasks import Task


@pytest.fixture(scope="module")
def evaluator(retail) -> Tau2Evaluator:
    return Tau2Evaluator(retail.fresh_db)


def gold_calls(task: Task) -> list[CallRecord]:
    return [CallRecord(a.name, dict(a.arguments)) for a in task.gold_actions]


def gold_texts(task: Task) -> list[str]:
    infos = (task.evaluation_criteria.communicate_info or []) if task.evaluation_criteria else []
    return ["Hi! How can I help you today?", *[f"Here you go: {info}." for info in infos]]


def with_basis(task: Task, basis: list[str]) -> Task:
    criteria = task.evaluation_criteria.model_copy(update={"reward_basis": basis})
    return task.model_copy(update={"evaluation_criteria": criteria})


@pytest.mark.parametrize("task_id", _task_ids())
def test_gold_actions_score_one(task_id, retail, evaluator):
    task = retail.task_by_id(task_id)
    info = evaluator.evaluate(task, gold_calls(task), gold_texts(task), Tau2Termination.USER_STOP)
    assert info.reward == 1.0, info.failure_reason
    assert info.failure_reason is None and info.db_match is True
    assert set(info.breakdown) <= {"DB", "NL_ASSERTION"} and info.breakdown["DB"] == 1.0


def _drop(calls, name):
    return [c for c in calls if c.name != name]


def _replace_args(calls, name, **update):
    return [CallRecord(c.name, {**c.arguments, **update}) if c.name == name else c for c in calls]


# (case, task id, calls transform, expected substring of the failure reason, expected db diff)
WRONG = [
    ("cancel_missing", "38", lambda c: _drop(c, "cancel_pending_order"), "DB: final database differs",
     ["orders/#W9348897"]),
    ("cancel_other_reason", "38", lambda c: _replace_args(c, "cancel_pending_order", reason="ordered by mistake"),
     "orders/#W9348897", ["orders/#W9348897"]),
    ("exchange_missing", "0", lambda c: _drop(c, "exchange_delivered_order_items"), "orders/#W2378156",
     ["orders/#W2378156"]),
    ("extra_address_change", "0",
     lambda c: [*c, CallRecord("modify_user_address", {"user_id": "yusuf_rossi_9620", "address1": "1 A St",
                                                         "address2": "", "city": "X", "state": "PA",
                                                         "country": "USA", "zip": "19122"})],
     "users/yusuf_rossi_9620", ["users/yusuf_rossi_9620"]),
    ("return_to_wrong_method_instead", "5",
     lambda c: _replace_args(c, "return_delivered_order_items", item_ids=["0000000000"]),
     "DB: final database differs", None),
]


@pytest.mark.parametrize(("case", "task_id", "transform", "reason", "diff"), WRONG, ids=[w[0] for w in WRONG])
def test_wrong_action_sequence_scores_below_one_with_reason(case, task_id, transform, reason, diff, retail, evaluator):
    task = retail.task_by_id(task_id)
    info = evaluator.evaluate(task, transform(gold_calls(task)), gold_texts(task), Tau2Termination.USER_STOP)
    assert info.reward < 1.0 and info.db_match is False
    assert reason in info.failure_reason
    if diff is not None:
        assert info.db_diff == diff


def test_failed_extra_call_does_not_change_the_verdict(retail, evaluator):
    """A rejected write changes nothing, so the DB still matches (tau2 replays it as well)."""
    task = retail.task_by_id("38")
    calls = [*gold_calls(task), CallRecord("cancel_pending_order", {"order_id": "#W9348897",
                                                                    "reason": "no longer needed"})]
    assert evaluator.evaluate(task, calls, [], Tau2Termination.USER_STOP).reward == 1.0


def test_gold_write_errors_are_recorded_not_fatal(retail, evaluator):
    task = retail.task_by_id("105")  # tau2's gold exchange fails for lack of gift-card balance
    info = evaluator.evaluate(task, [], [], Tau2Termination.USER_STOP)
    assert info.reward == 1.0
    assert info.gold_errors == ["106_0 exchange_delivered_order_items: Error: Insufficient gift card balance to "
                                "pay for the price difference"]


@pytest.mark.parametrize("termination", [Tau2Termination.MAX_STEPS, Tau2Termination.TOO_MANY_ERRORS,
                                         Tau2Termination.NOT_FINISHED, Tau2Termination.AGENT_ERROR])
def test_premature_termination_scores_zero(termination, retail, evaluator):
    task = retail.task_by_id("0")
    info = evaluator.evaluate(task, gold_calls(task), [], termination)
    assert info.reward == 0.0
    assert info.note == f"Simulation terminated prematurely. Termination reason: {termination.value}"
    assert termination.value in info.failure_reason


@pytest.mark.parametrize(("texts", "met"), [
    (["The refund is $1,126.04 and $1,497.65 remains."], True),       # commas are removed before matching
    (["REFUND 1126.04", "rest: 1497.65"], True),                       # any message, any case
    (["The refund is 1126.04."], False),                               # second item never said
    ([], False),
])
def test_communicate_check(texts, met, retail, evaluator):
    task = retail.task_by_id("46").model_copy(deep=True)
    task.evaluation_criteria.communicate_info = ["1126.04", "1497.65"]
    task = with_basis(task, ["DB", "COMMUNICATE"])
    info = evaluator.evaluate(task, gold_calls(task), texts, Tau2Termination.USER_STOP)
    assert info.breakdown["COMMUNICATE"] == (1.0 if met else 0.0)
    assert info.reward == (1.0 if met else 0.0)
    if not met:
        assert "COMMUNICATE: not told to the user" in info.failure_reason


def test_communicate_is_not_scored_outside_the_basis(retail, evaluator):
    task = retail.task_by_id("2")  # retail basis: DB, NL_ASSERTION; communicate_info ["10"]
    assert task.evaluation_criteria.communicate_info == ["10"]
    info = evaluator.evaluate(task, gold_calls(task), [], Tau2Termination.USER_STOP)
    assert info.reward == 1.0 and info.communicate_checks[0].met is False


def test_action_basis_requires_every_gold_call(retail, evaluator):
    task = with_basis(retail.task_by_id("0"), ["ACTION"])
    full = evaluator.evaluate(task, gold_calls(task), [], Tau2Termination.USER_STOP)
    partial = evaluator.evaluate(task, _drop(gold_calls(task), "get_product_details"), [],
                                 Tau2Termination.USER_STOP)
    assert full.reward == 1.0
    assert partial.reward == 0.0
    assert partial.failure_reason == "ACTION: gold calls not made: get_product_details, get_product_details"


def test_action_compare_args_limits_the_comparison(retail, evaluator):
    task = with_basis(retail.task_by_id("38").model_copy(deep=True), ["ACTION"])
    cancel = next(a for a in task.evaluation_criteria.actions if a.name == "cancel_pending_order")
    calls = _replace_args(gold_calls(task), "cancel_pending_order", reason="ordered by mistake")
    assert evaluator.evaluate(task, calls, [], Tau2Termination.USER_STOP).reward == 0.0
    cancel.compare_args = ["order_id"]
    assert evaluator.evaluate(task, calls, [], Tau2Termination.USER_STOP).reward == 1.0


def test_nl_assertions_are_reported_unevaluated(retail, evaluator):
    task = retail.task_by_id("46")
    assert task.evaluation_criteria.nl_assertions
    info = evaluator.evaluate(task, gold_calls(task), [], Tau2Termination.USER_STOP)
    assert info.unevaluated == ["NL_ASSERTION"] and "NL_ASSERTION" not in info.breakdown
    assert info.reward == 1.0


def test_replay_mismatch_is_recorded(retail, evaluator):
    task = retail.task_by_id("38")
    calls = [CallRecord(c.name, c.arguments, "Transfer successful") if c.name == "cancel_pending_order" else c
             for c in gold_calls(task)]
    info = evaluator.evaluate(task, calls, [], Tau2Termination.USER_STOP)
    assert info.reward == 1.0
    assert len(info.replay_mismatches) == 1 and "cancel_pending_order" in info.replay_mismatches[0]


def test_unknown_tools_and_undecodable_calls_are_skipped(retail, evaluator):
    task = retail.task_by_id("38")
    calls = [CallRecord("delete_everything", {}), CallRecord("cancel_pending_order", {}, None, True, executed=False),
             *gold_calls(task)]
    assert evaluator.evaluate(task, calls, [], Tau2Termination.USER_STOP).reward == 1.0


def test_calls_from_openai_messages(retail, evaluator):
    task = retail.task_by_id("38")
    messages = [{"role": "system", "content": "policy"}, {"role": "assistant", "content": "Hi!"}]
    for i, action in enumerate(task.gold_actions):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": action.name, "arguments": json.dumps(action.arguments)}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "bad", "type": "function", "function": {"name": "cancel_pending_order", "arguments": "{oops"}}]})
    messages.append({"role": "tool", "tool_call_id": "bad", "content": "Error: Invalid arguments"})
    calls, texts = calls_from_messages(messages)
    assert [c.name for c in calls] == [a.name for a in task.gold_actions] + ["cancel_pending_order"]
    assert calls[-1].executed is False and calls[-1].error is True
    assert texts == ["Hi!"]
    info = evaluator.evaluate(task, calls, texts, Tau2Termination.USER_STOP)
    assert info.reward == 1.0
    assert info.replay_mismatches  # the recorded "ok" differs from the replayed order JSON
