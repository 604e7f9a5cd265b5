"""The verifier on hand-written correct and incorrect action sequences, every task type:
all-or-nothing reward (probes too), the fractions kept in the breakdown, and the events each
failure leaves (step-time events and sub-goal attribution)."""

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

SDR, MULTI, PRE, TCP = ("structured_data_reasoning", "multi_step_task_completion", "precondition_verification",
                        "tool_call_precision")


def _status(task):
    return task.db["orders"][task.subrequests[0].order_id]["status"]


def _orders_of(task, status, exclude=()):
    return [o for o in task.db["users"][task.user_id]["orders"]
            if task.db["orders"][o]["status"] == status and o not in exclude]


def _at_once(task, n=None):
    return task.scenario.mode == "all_at_once" and (n is None or len(task.subrequests) == n)


# (name, task_type, seed predicate, actions(task) -> list, reward, breakdown["subrequests"], capabilities)
CASES = [
    # -- probes: rewards are binary now; the fractions stay in the breakdown
    ("select-correct", "record_selection", lambda t: True,
     lambda t: [*gold_calls(t), info_message(t)], 1.0, 1.0, []),
    ("select-exchange-correct", "record_selection", lambda t: t.subrequests[0].kind == "exchange",
     lambda t: [*gold_calls(t), info_message(t)], 1.0, 1.0, []),
    ("select-decoy-return", "record_selection", lambda t: t.subrequests[0].kind == "return",
     lambda t: [call("return_delivered_order_items", order_id=t.subrequests[0].facts["decoy_order_id"],
                     item_ids=[t.subrequests[0].facts["decoy_item_id"]],
                     payment_method_id=t.db["orders"][t.subrequests[0].facts["decoy_order_id"]]["payment_method_id"]),
                info_message(t)],
     0.0, 0.0, [SDR]),
    ("select-decoy-cancel", "record_selection", lambda t: t.subrequests[0].kind == "cancel",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].facts["decoy_order_id"],
                     reason=t.subrequests[0].facts["reason"]), info_message(t)],
     0.0, 0.0, [SDR]),
    ("select-right-write-no-report", "record_selection", lambda t: True,
     lambda t: [*gold_calls(t), say("Done.")], 0.0, 0.0, [SDR]),
    ("multi-all", "multi_request", lambda t: len(t.subrequests) == 3 and t.scenario.mode == "all_at_once",
     lambda t: [*gold_calls(t), info_message(t)], 1.0, 1.0, []),
    ("multi-first-only", "multi_request",
     lambda t: len(t.subrequests) == 2 and t.scenario.mode == "all_at_once" and t.subrequests[0].gold
     and t.subrequests[1].kind != "status",
     lambda t: [*gold_calls(t, [0]), info_message(t, [0])], 0.0, 0.5, [MULTI]),
    ("multi-info-missing", "multi_request",
     lambda t: t.scenario.mode == "all_at_once" and any(sr.required_info for sr in t.subrequests),
     lambda t: [*gold_calls(t), say("All done.")], 0.0, None, [MULTI]),
    ("pre-false-refuse", "precondition_check", lambda t: _status(t) != "pending",
     lambda t: [call("get_order_details", order_id=t.subrequests[0].order_id), info_message(t)], 1.0, 1.0, []),
    ("pre-false-blind-write", "precondition_check", lambda t: _status(t) != "pending",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].order_id, reason="no longer needed"),
                info_message(t)], 0.0, 1.0, [PRE]),
    ("pre-true-cancel", "precondition_check", lambda t: _status(t) == "pending",
     lambda t: [call("get_order_details", order_id=t.subrequests[0].order_id), *gold_calls(t),
                info_message(t)], 1.0, 1.0, []),
    ("pre-true-refused-wrongly", "precondition_check", lambda t: _status(t) == "pending",
     lambda t: [say(f"Order {t.subrequests[0].order_id} is delivered, so I cannot cancel it.")], 0.0, 0.0, [PRE]),
    ("pre-true-wrong-reason", "precondition_check", lambda t: _status(t) == "pending",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].order_id,
                     reason=({"no longer needed", "ordered by mistake"} - {t.subrequests[0].facts["reason"]}).pop()),
                info_message(t)], 0.0, 0.0, [PRE]),
    ("format-canonical", "argument_format", lambda t: True,
     lambda t: [*gold_calls(t), info_message(t)], 1.0, 1.0, []),
    ("format-loose-id-gives-up", "argument_format",
     lambda t: t.subrequests[0].facts["raw_order_ref"] != t.subrequests[0].order_id,
     lambda t: [call("get_order_details", order_id=t.subrequests[0].facts["raw_order_ref"]),
                say("Sorry, I could not process it.")], 0.0, 0.0, [TCP]),
    ("format-paraphrased-reason", "argument_format", lambda t: t.subrequests[0].kind == "cancel",
     lambda t: [call("cancel_pending_order", order_id=t.subrequests[0].order_id,
                     reason=t.subrequests[0].facts["raw_reason"]), say("Sorry.")], 0.0, 0.0, [TCP]),
    ("format-recovers-after-error", "argument_format",
     lambda t: t.subrequests[0].facts["raw_order_ref"] != t.subrequests[0].order_id,
     lambda t: [call("get_order_details", order_id=t.subrequests[0].facts["raw_order_ref"]), *gold_calls(t),
                info_message(t)], 1.0, 1.0, [TCP]),
    ("unrequested-extra-cancel", "precondition_check",
     lambda t: _status(t) == "pending" and _orders_of(t, "pending", (t.subrequests[0].order_id,)),
     lambda t: [*gold_calls(t), call("cancel_pending_order",
                                     order_id=_orders_of(t, "pending", (t.subrequests[0].order_id,))[0],
                                     reason="no longer needed"), info_message(t)], 0.0, 1.0, [SDR]),
    # -- compound: one missed part fails the whole conversation
    ("compound-all", "compound", lambda t: _at_once(t, 3),
     lambda t: [*gold_calls(t), info_message(t)], 1.0, 1.0, []),
    ("compound-two-of-three", "compound", lambda t: _at_once(t, 3) and t.subrequests[2].gold,
     lambda t: [*gold_calls(t, [0, 1]), info_message(t, [0, 1])], 0.0, 2 / 3, [MULTI]),
    ("compound-info-of-one-missing", "compound",
     lambda t: _at_once(t, 2) and t.subrequests[0].gold and t.subrequests[0].required_info,
     lambda t: [*gold_calls(t), info_message(t, [1])], 0.0, 0.5, None),
    ("compound-extra-address-change", "compound",
     lambda t: _at_once(t) and all(sr.kind != "address" for sr in t.subrequests),
     lambda t: [*gold_calls(t), call("modify_user_address", user_id=t.user_id, address="1 New Road, Town, 00001"),
                info_message(t)], 0.0, 1.0, [SDR]),
]


@pytest.mark.parametrize("name, task_type, pred, build, reward, fulfilled, caps", CASES, ids=[c[0] for c in CASES])
def test_hand_written_sequences(name, task_type, pred, build, reward, fulfilled, caps):
    seed = find_seed(task_type, pred)
    env, _ = play(seed, [], task_type)
    actions = build(env.task)
    env, _ = play(seed, actions, task_type)
    assert env.done, "the final message must end the episode"
    assert env.reward() == reward
    breakdown = env.reward_breakdown()
    assert set(breakdown) == {"subrequests", "db", "info", "policy", "credit"}
    assert all(0.0 <= v <= 1.0 for v in breakdown.values())
    if fulfilled is not None:
        assert breakdown["subrequests"] == pytest.approx(fulfilled)
    # credit: the fulfilled share, zeroed by a violation or an unrequested change; 1 exactly when reward is
    zeroed = breakdown["policy"] == 0.0 or "unrequested change" in (env.failure_reason() or "")
    assert breakdown["credit"] == pytest.approx(0.0 if zeroed else breakdown["subrequests"])
    assert (breakdown["credit"] == 1.0) == (reward == 1.0)
    got = sorted(set(capabilities(env)))
    if caps is None:  # the failed part's own capabilities (sub-goal attribution's last row)
        assert got == sorted(set(env.task.subrequests[0].capabilities or env.task.capabilities))
    else:
        assert got == caps
    assert (env.failure_reason() is None) == (env.reward() == 1.0)
    assert (reward == 0.0) <= bool(got), "a failed episode without any capability-tagged event"


def test_info_must_sit_next_to_its_order_id():
    seed = find_seed("precondition_check", lambda t: _status(t) != "pending")
    env, _ = play(seed, [], "precondition_check")
    task = env.task
    status = _status(task)
    other = "pending" if status != "pending" else "delivered"
    env, _ = play(seed, [say(f"Order {task.subrequests[0].order_id} is {other}. Another thing is {status}.")],
                  "precondition_check")
    assert env.reward() == 0.0
    env, _ = play(seed, [say(f"Order {task.subrequests[0].order_id} is {status}, it cannot be cancelled.")],
                  "precondition_check")
    assert env.reward() == 1.0


def test_amounts_match_whole_numbers_only():
    seed = find_seed("precondition_check", lambda t: _status(t) == "pending")
    env, _ = play(seed, [], "precondition_check")
    value = env.task.subrequests[0].required_info[0].value
    env, _ = play(seed, [*gold_calls(env.task), say(f"Refund of 1{value} issued.")], "precondition_check")
    assert env.reward() == 0.0
    env, _ = play(seed, [*gold_calls(env.task), say(f"Refund of ${value} issued.")], "precondition_check")
    assert env.reward() == 1.0
