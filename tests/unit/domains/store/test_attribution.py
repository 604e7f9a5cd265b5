"""Sub-goal attribution on hand-built compound episodes: each failure cause leaves the
`subgoal_failed` event its row of the attribution table names (and nothing else does)."""

from __future__ import annotations

import pytest

from tests.unit.domains.store.helpers import (
    TEST_SEEDS,
    call,
    gold_calls,
    info_sentences,
    play,
    say,
    task_of,
)

SDR, MULTI, PRE, TCP = ("structured_data_reasoning", "multi_step_task_completion", "precondition_verification",
                        "tool_call_precision")
WRITE = {"cancel": "cancel_pending_order", "return": "return_delivered_order_items",
         "exchange": "exchange_delivered_order_items"}


def _find(pred):
    """(seed, index) of the first all-at-once compound test task with a sub-request `pred` accepts."""
    for seed in TEST_SEEDS:
        task = task_of(seed)
        if task.scenario.mode != "all_at_once":
            continue
        for i, sr in enumerate(task.subrequests):
            if pred(task, sr):
                return seed, i
    raise AssertionError("no matching task")


def _others(task, i):
    return [j for j in range(len(task.subrequests)) if j != i]


def _report(task, indices, extra=""):
    return say(" ".join([*info_sentences(task, indices), extra]).strip() or "Done.")


def _blind_write(task, sr):
    """The write a policy without the precondition check makes on a forbidden sub-request."""
    order = task.db["orders"][sr.order_id]
    f, base = sr.facts, sr.base_kind
    if base == "cancel":
        return call(WRITE[base], order_id=sr.order_id, reason=f["reason"])
    args = {"order_id": sr.order_id, "item_ids": [f["item_id"]], "payment_method_id": order["payment_method_id"]}
    if base == "exchange":
        args["new_item_ids"] = [f["new_item_id"]]
    return call(WRITE[base], **args)


def _decoy_write(task, sr):
    f = sr.facts
    decoy = task.db["orders"][f["decoy_order_id"]]
    if sr.base_kind == "cancel":
        return call(WRITE["cancel"], order_id=decoy["order_id"], reason=f["reason"])
    args = {"order_id": decoy["order_id"], "item_ids": [f["decoy_item_id"]],
            "payment_method_id": decoy["payment_method_id"]}
    if sr.base_kind == "exchange":
        return call(WRITE["exchange"], **args, new_item_ids=[f["new_item_id"]])
    return call(WRITE["return"], **args)


def _wrong_status(task, sr):
    return "processed" if task.db["orders"][sr.order_id]["status"] != "processed" else "pending"


# (name, sub-request predicate, actions(task, i), expected {(index, capability, cause)} given (task, i),
#  extra step-time event expected or None)
CASES = [
    ("write-against-forbidding-status", lambda t, sr: "forbidden_status" in sr.traits,
     lambda t, i: [*gold_calls(t), _blind_write(t, t.subrequests[i]), _report(t, None)],
     lambda t, i: {(i, PRE, "write_against_status")}, (PRE, "write_precondition_false")),
    ("loose-id-never-corrected", lambda t, sr: "loose_id" in sr.traits,
     lambda t, i: [*gold_calls(t, _others(t, i)), call("get_order_details", order_id=t.subrequests[i].facts[
         "raw_order_ref"]), _report(t, _others(t, i), "Sorry, I could not process that order.")],
     lambda t, i: {(i, TCP, "malformed_never_corrected")}, (TCP, "malformed_argument")),
    ("paraphrased-reason-never-corrected",
     lambda t, sr: sr.kind == "cancel" and "paraphrased_reason" in sr.traits,
     lambda t, i: [*gold_calls(t, _others(t, i)), call(WRITE["cancel"], order_id=t.subrequests[i].order_id,
                                                       reason=t.subrequests[i].facts["raw_reason"]),
                   _report(t, _others(t, i))],
     lambda t, i: {(i, TCP, "malformed_never_corrected")}, (TCP, "malformed_argument")),
    ("never-addressed", lambda t, sr: True,
     lambda t, i: [*gold_calls(t, _others(t, i)), _report(t, _others(t, i))],
     lambda t, i: {(i, MULTI, "never_addressed")}, (MULTI, "subrequest_unaddressed")),
    ("refusal-without-the-status", lambda t, sr: "forbidden_status" in sr.traits and "loose_id" not in sr.traits,
     lambda t, i: [*gold_calls(t), call("get_order_details", order_id=t.subrequests[i].order_id),
                   _report(t, _others(t, i), "I cannot do the other one.")],
     lambda t, i: {(i, PRE, "status_not_named")}, None),
    ("refusal-naming-a-wrong-status", lambda t, sr: "forbidden_status" in sr.traits,
     lambda t, i: [*gold_calls(t), call("get_order_details", order_id=t.subrequests[i].order_id),
                   _report(t, _others(t, i), f"Order {t.subrequests[i].order_id} is {_wrong_status(t, t.subrequests[i])}.")],
     lambda t, i: {(i, PRE, "status_not_named")}, None),
    ("decoy-record", lambda t, sr: "by_attributes" in sr.traits,
     lambda t, i: [*gold_calls(t, _others(t, i)), _decoy_write(t, t.subrequests[i]), _report(t, None)],
     lambda t, i: {(i, SDR, "wrong_record")}, (SDR, "wrong_record")),
    ("unexplained-wrong-status-told", lambda t, sr: sr.kind == "status",
     lambda t, i: [*gold_calls(t), call("get_order_details", order_id=t.subrequests[i].order_id),
                   _report(t, _others(t, i), f"Order {t.subrequests[i].order_id} is cancelled.")],
     lambda t, i: {(i, c, "unexplained") for c in t.subrequests[i].capabilities or t.capabilities}, None),
    ("unexplained-loose-status-corrected-but-wrong", lambda t, sr: sr.kind == "status" and "loose_id" in sr.traits,
     lambda t, i: [*gold_calls(t), call("get_order_details", order_id=t.subrequests[i].facts["raw_order_ref"]),
                   call("get_order_details", order_id=t.subrequests[i].order_id),
                   _report(t, _others(t, i), f"Order {t.subrequests[i].order_id} is cancelled.")],
     lambda t, i: {(i, TCP, "unexplained")}, (TCP, "malformed_argument")),
    ("solved-after-a-corrected-loose-id", lambda t, sr: "loose_id" in sr.traits,
     lambda t, i: [call("get_order_details", order_id=t.subrequests[i].facts["raw_order_ref"]), *gold_calls(t),
                   _report(t, None)],
     lambda t, i: set(), (TCP, "malformed_argument")),
    ("solved", lambda t, sr: True, lambda t, i: [*gold_calls(t), _report(t, None)], lambda t, i: set(), None),
]


@pytest.mark.parametrize("name, pred, build, expected, step_event", CASES, ids=[c[0] for c in CASES])
def test_each_failure_cause_leaves_its_event(name, pred, build, expected, step_event):
    seed, i = _find(pred)
    task = task_of(seed)
    env, _ = play(seed, build(task, i))
    assert env.done
    diagnostics = env.diagnostics()
    got = {(d["detail"]["index"], d["capability"], d["detail"]["cause"]) for d in diagnostics
           if d["event"] == "subgoal_failed"}
    assert got == expected(task, i)
    assert (env.reward() == 1.0) == (not got)
    step = {(d["capability"], d["event"]) for d in diagnostics if d["event"] != "subgoal_failed"}
    assert step == ({step_event} if step_event else set())


def test_silent_agent_gets_every_part_attributed():
    """Nothing addressed: no 'never addressed' row; each part falls to its own trait's row."""
    seed, _ = _find(lambda t, sr: "by_attributes" in sr.traits)
    task = task_of(seed)
    env, _ = play(seed, [say("Done.")])
    got = {(d["detail"]["index"], d["capability"], d["detail"]["cause"]) for d in env.diagnostics()}
    expected = set()
    for i, sr in enumerate(task.subrequests):
        if "forbidden_status" in sr.traits:
            expected.add((i, PRE, "status_not_named"))
        elif "by_attributes" in sr.traits:
            expected.add((i, SDR, "wrong_record"))
        else:
            expected |= {(i, c, "unexplained") for c in sr.capabilities or task.capabilities}
    assert got == expected and any(c == SDR for _, c, _ in got)


def test_unrequested_change_is_tagged():
    seed, _ = _find(lambda t, sr: all(s.kind != "address" for s in t.subrequests))
    task = task_of(seed)
    env, _ = play(seed, [*gold_calls(task), call("modify_user_address", user_id=task.user_id,
                                                 address="1 New Road, Town, 00001"), _report(task, None)])
    assert env.reward() == 0.0
    assert [(d["capability"], d["event"], d["detail"]) for d in env.diagnostics()] == [
        (SDR, "unrequested_change", {"records": [f"users/{task.user_id}"]})]


def test_truncated_episode_is_attributed_when_read():
    """Read before the user ended the conversation (max turns): the parts not yet done are
    attributed; the end-of-conversation event subrequest_unaddressed is not emitted."""
    seed, i = _find(lambda t, sr: sr.gold and len(t.subrequests) == 3)
    task = task_of(seed)
    env, _ = play(seed, gold_calls(task, [i]))
    assert not env.done
    events = env.diagnostics()
    assert {d["event"] for d in events} == {"subgoal_failed"}
    assert {(d["detail"]["index"], d["detail"]["cause"]) for d in events if d["capability"] == MULTI} == \
        {(j, "never_addressed") for j in _others(task, i)}


def test_sequential_follow_up_ignored_is_multi_step():
    for seed in TEST_SEEDS:
        task = task_of(seed)
        if task.scenario.mode == "sequential" and len(task.subrequests) == 2:
            break
    env, _ = play(seed, [*gold_calls(task, [0]), _report(task, [0]), say("Goodbye.")])
    assert env.done and env.reward() == 0.0
    got = {(d["capability"], d["event"], d["detail"].get("cause")) for d in env.diagnostics()}
    assert got == {(MULTI, "subrequest_unaddressed", None), (MULTI, "subgoal_failed", "never_addressed")}
