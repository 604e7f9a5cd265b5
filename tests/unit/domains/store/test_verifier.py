"""The verifier on hand-written correct and incorrect action sequences, every task type."""

from __future__ import annotations

import pytest

from tests.unit.domains.store.helpers import (
    call,
    capabilities,
    find_seed,
    gold_calls,
    info_message,
    play,
    say,
)


def _status(task):
    return task.db["orders"][task.subrequests[0].order_id]["status"]


def _orders_of(task, status, exclude=()):
    return [o for o in task.db["users"][task.user_id]["orders"]
            if task.db["orders"][o]["status"] == status and o not in exclude]


# (name, task_type, seed predicate, actions(task) -> list, expected reward, expected capabilities)
CASES = [
    ("select-correct", "record_selection", lambda t: True,
     lambda t: [*gold_calls(t), info_message(t)], 1.0, []),
    ("select-exchange-correct", "record_selection", lambda t: t.subrequests[0].kind == "exchange",
     lambda t: [*gold_calls(t), info_message(t)], 1.0, []),
    ("select-decoy-return", "record_selection", lambda t: t.subrequests[0].kind == "return",
     lambda t: [call("return_delivered_order_items", order_id=t.subrequests[0].facts["decoy_order_id"],
                     item_ids=[t.subrequests[0].facts["decoy_item_id"]],
                     payment_method_id=t.db["orders"][t.subrequests[0].facts["decoy_order_id"]]["payment_method_id"]),
                info_message(t)],
     0.0, ["structured_data_reasoning"]),
    ("select-decoy-cancel", "record_selection", lambda t: t.subrequests[0].kind == "cancel",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].facts["decoy_order_id"],
                     reason=t.subrequests[0].facts["reason"]), info_message(t)],
     0.0, ["structured_data_reasoning"]),
    ("select-right-write-no-report", "record_selection", lambda t: True,
     lambda t: [*gold_calls(t), say("Done.")], 0.0, []),
    ("multi-all", "multi_request", lambda t: len(t.subrequests) == 3 and t.scenario.mode == "all_at_once",
     lambda t: [*gold_calls(t), info_message(t)], 1.0, []),
    ("multi-first-only", "multi_request",
     lambda t: len(t.subrequests) == 2 and t.scenario.mode == "all_at_once" and t.subrequests[0].gold
     and t.subrequests[1].kind != "status",
     lambda t: [*gold_calls(t, [0]), info_message(t, [0])], 0.5, ["multi_step_task_completion"]),
    ("multi-info-missing", "multi_request", lambda t: any(sr.required_info for sr in t.subrequests),
     lambda t: [*gold_calls(t), say("All done.")], None, []),
    ("pre-false-refuse", "precondition_check", lambda t: _status(t) != "pending",
     lambda t: [call("get_order_details", order_id=t.subrequests[0].order_id), info_message(t)], 1.0, []),
    ("pre-false-blind-write", "precondition_check", lambda t: _status(t) != "pending",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].order_id, reason="no longer needed"),
                info_message(t)], 0.0, ["precondition_verification"]),
    ("pre-true-cancel", "precondition_check", lambda t: _status(t) == "pending",
     lambda t: [call("get_order_details", order_id=t.subrequests[0].order_id), *gold_calls(t),
                info_message(t)], 1.0, []),
    ("pre-true-refused-wrongly", "precondition_check", lambda t: _status(t) == "pending",
     lambda t: [say(f"Order {t.subrequests[0].order_id} is delivered, so I cannot cancel it.")], 0.0, []),
    ("pre-true-wrong-reason", "precondition_check", lambda t: _status(t) == "pending",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].order_id,
                     reason=({"no longer needed", "ordered by mistake"} - {t.subrequests[0].facts["reason"]}).pop()),
                info_message(t)], 0.0, []),
    ("format-canonical", "argument_format", lambda t: True,
     lambda t: [*gold_calls(t), info_message(t)], 1.0, []),
    ("format-loose-id-gives-up", "argument_format",
     lambda t: t.subrequests[0].facts["raw_order_ref"] != t.subrequests[0].order_id,
     lambda t: [call("get_order_details", order_id=t.subrequests[0].facts["raw_order_ref"]),
                say("Sorry, I could not process it.")], 0.0, ["tool_call_precision"]),
    ("format-paraphrased-reason", "argument_format", lambda t: t.subrequests[0].kind == "cancel",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].order_id,
                     reason=t.subrequests[0].facts["raw_reason"]), say("Sorry.")], 0.0, ["tool_call_precision"]),
    ("format-recovers-after-error", "argument_format",
     lambda t: t.subrequests[0].facts["raw_order_ref"] != t.subrequests[0].order_id,
     lambda t: [call("get_order_details", order_id=t.subrequests[0].facts["raw_order_ref"]), *gold_calls(t),
                info_message(t)], 1.0, ["tool_call_precision"]),
    ("unrequested-extra-cancel", "precondition_check",
     lambda t: _status(t) == "pending" and _orders_of(t, "pending", (t.subrequests[0].order_id,)),
     lambda t: [*gold_calls(t), call("cancel_pending_order",
                                     order_id=_orders_of(t, "pending", (t.subrequests[0].order_id,))[0],
                                     reason="no longer needed"), info_message(t)], 0.0,
     ["structured_data_reasoning"]),
]


@pytest.mark.parametrize("name, task_type, pred, build, reward, caps", CASES, ids=[c[0] for c in CASES])
def test_hand_written_sequences(name, task_type, pred, build, reward, caps):
    seed = find_seed(task_type, pred)
    env, _ = play(seed, [])
    actions = build(env.task)
    env, _ = play(seed, actions)
    assert env.done, "the final message must end the episode"
    if reward is None:
        assert env.reward() < 1.0
    else:
        assert env.reward() == pytest.approx(reward)
    assert sorted(set(capabilities(env))) == caps
    assert (env.failure_reason() is None) == (env.reward() == 1.0)
    breakdown = env.reward_breakdown()
    assert set(breakdown) == {"subrequests", "db", "info", "policy"}
    assert all(0.0 <= v <= 1.0 for v in breakdown.values())


def test_info_must_sit_next_to_its_order_id():
    seed = find_seed("precondition_check", lambda t: _status(t) != "pending")
    env, _ = play(seed, [])
    task = env.task
    status = _status(task)
    other = "pending" if status != "pending" else "delivered"
    env, _ = play(seed, [say(f"Order {task.subrequests[0].order_id} is {other}. Another thing is {status}.")])
    assert env.reward() == 0.0
    env, _ = play(seed, [say(f"Order {task.subrequests[0].order_id} is {status}, it cannot be cancelled.")])
    assert env.reward() == 1.0


def test_amounts_match_whole_numbers_only():
    seed = find_seed("precondition_check", lambda t: _status(t) == "pending")
    env, _ = play(seed, [])
    value = env.task.subrequests[0].required_info[0].value
    env, _ = play(seed, [*gold_calls(env.task), say(f"Refund of 1{value} issued.")])
    assert env.reward() == 0.0
    env, _ = play(seed, [*gold_calls(env.task), say(f"Refund of ${value} issued.")])
    assert env.reward() == 1.0
