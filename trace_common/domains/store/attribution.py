"""Sub-goal attribution: which capability each failed part of a store episode belongs to.

The step-time events (wrong_record, write_precondition_false, malformed_argument,
subrequest_unaddressed) say what the agent visibly did wrong, but an agent can fail a
sub-request without any of them (a refusal that never names the status, a loose id it
never managed to write, a request it skipped). So, from the verifier's per-sub-request
verdict and the episode's call log, every failed sub-request -- one the verifier finds
unfulfilled, or one whose order had a write attempted against a forbidding status (the
verifier fails the whole episode for that) -- gets one `subgoal_failed` event per
capability its failure belongs to; the first matching row decides:

| # | the failed sub-request ...                                                        | capability (cause)                            |
|---|------------------------------------------------------------------------------------|-----------------------------------------------|
| 1 | had a write attempted on its order while the status forbade it                     | precondition_verification (write_against_status) |
| 2 | had a malformed order id naming its order, or (a cancel) a malformed reason, with no later well-formed call correcting it | tool_call_precision (malformed_never_corrected) |
| 3 | was never addressed while another sub-request was                                  | multi_step_task_completion (never_addressed)  |
| 4 | is a forbidden_status request whose refusal never named the status next to the id | precondition_verification (status_not_named)  |
| 5 | is a by_attributes request with a write of its tool on another order (the decoy), or no successful write on the designated order | structured_data_reasoning (wrong_record) |
| 6 | none of the above                                                                  | each capability the sub-request needs, else each one the task needs (unexplained) |

A sub-request is *addressed* when a tool call names its order (its 5 digits in any string
argument, canonical or loose), a call of its write tool is made (kinds are distinct within a
task), its address is modified (address requests), or its status is told next to its id.

Beyond the sub-requests, a changed record that no sub-request covers and no wrong_record
event already names gets `unrequested_change` (structured_data_reasoning: the agent acted on
a record the user did not designate). A policy violation always has its step-time
write_precondition_false event. So every failed episode carries at least one
capability-tagged event, and a passed one gets none from this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trace_common.domains.store.task_model import MULTI, PRECISION, PRECONDITION, SDR, SubRequest, Task
from trace_common.domains.store.verifier import Verdict, changed_records, info_told
from trace_common.env.environment import Diagnostic

SUBGOAL_EVENT = "subgoal_failed"
UNREQUESTED_EVENT = "unrequested_change"
WRITE_TOOL = {"cancel": "cancel_pending_order", "return": "return_delivered_order_items",
              "exchange": "exchange_delivered_order_items", "address": "modify_user_address"}


@dataclass
class CallRecord:
    """One tool call of the episode, as the environment answered it."""

    turn: int
    name: str
    arguments: dict[str, Any]
    ok: bool
    malformed: dict[str, Any] | None = None
    violation: dict[str, Any] | None = None
    strings: list[str] = field(default_factory=list)  # every string among the argument values

    @classmethod
    def make(cls, turn: int, name: str, arguments: dict[str, Any], ok: bool, malformed: dict[str, Any] | None,
             violation: dict[str, Any] | None) -> CallRecord:
        strings: list[str] = []
        for value in arguments.values():
            values = value if isinstance(value, list) else [value]
            strings.extend(v for v in values if isinstance(v, str))
        return cls(turn, name, arguments, ok, malformed, violation, strings)


def _names_digits(text: str, digits: str) -> bool:
    return re.search(rf"(?<!\d){digits}(?!\d)", text) is not None


def addressed(task: Task, sr: SubRequest, calls: list[CallRecord], agent_texts: list[str]) -> bool:
    if sr.kind == "address":
        return any(c.name == WRITE_TOOL["address"] for c in calls)
    assert sr.order_id is not None
    digits = sr.order_id[2:]
    tool = WRITE_TOOL.get(sr.base_kind)
    if any(c.name == tool or any(_names_digits(s, digits) for s in c.strings) for c in calls):
        return True
    return any(info.anchor is not None and info_told(info, agent_texts) for info in sr.required_info)


def _malformed_for(sr: SubRequest, call: CallRecord) -> bool:
    m = call.malformed
    if m is None:
        return False
    if sr.base_kind == "cancel" and call.name == WRITE_TOOL["cancel"] and m.get("argument") == "reason":
        return True
    value = m.get("value")
    return (sr.order_id is not None and m.get("argument") == "order_id" and isinstance(value, str)
            and _names_digits(value, sr.order_id[2:]))


def _uncorrected_malformed(sr: SubRequest, calls: list[CallRecord]) -> CallRecord | None:
    bad = [i for i, c in enumerate(calls) if _malformed_for(sr, c)]
    if not bad:
        return None
    last = calls[bad[-1]]
    assert last.malformed is not None
    later = [c for c in calls[bad[-1] + 1:] if c.malformed is None]
    if last.malformed.get("argument") == "reason":
        fixed = any(c.name == WRITE_TOOL["cancel"] for c in later)
    else:
        fixed = any(sr.order_id in c.strings for c in later)
    return None if fixed else last


def _violated(sr: SubRequest, calls: list[CallRecord]) -> bool:
    return sr.order_id is not None and any(c.violation and c.violation.get("order_id") == sr.order_id
                                           for c in calls)


def failure_cause(task: Task, index: int, calls: list[CallRecord], agent_texts: list[str]) -> tuple[list[str], str]:
    """(capabilities, cause) of failed sub-request `index`: the first matching row of the table."""
    sr = task.subrequests[index]
    if _violated(sr, calls):
        return [PRECONDITION], "write_against_status"
    if _uncorrected_malformed(sr, calls) is not None:
        return [PRECISION], "malformed_never_corrected"
    if not addressed(task, sr, calls, agent_texts) and any(
            addressed(task, other, calls, agent_texts) for j, other in enumerate(task.subrequests) if j != index):
        return [MULTI], "never_addressed"
    if "forbidden_status" in sr.traits and not all(info_told(i, agent_texts) for i in sr.required_info):
        return [PRECONDITION], "status_not_named"
    if "by_attributes" in sr.traits:
        tool = WRITE_TOOL[sr.base_kind]
        writes = [c for c in calls if c.name == tool and c.malformed is None]
        elsewhere = any(c.arguments.get("order_id") != sr.order_id for c in writes)
        on_target = any(c.ok and c.arguments.get("order_id") == sr.order_id for c in writes)
        if elsewhere or not on_target:
            return [SDR], "wrong_record"
    return list(sr.capabilities or task.capabilities), "unexplained"


def subgoal_events(task: Task, verdict: Verdict, calls: list[CallRecord], agent_texts: list[str],
                   final_db: dict[str, Any], expected_db: dict[str, Any], turn: int,
                   flagged_orders: set[str]) -> list[Diagnostic]:
    """The attribution events of the episode as it stands (`turn` = actions so far)."""
    events = []
    for index, (sr, ok) in enumerate(zip(task.subrequests, verdict.subrequest_ok, strict=True)):
        if ok and not _violated(sr, calls):
            continue
        capabilities, cause = failure_cause(task, index, calls, agent_texts)
        for capability in capabilities:
            events.append(Diagnostic(capability=capability, event=SUBGOAL_EVENT, turn=turn,
                                     detail={"index": index, "kind": sr.kind, "cause": cause,
                                             "order_id": sr.order_id}))
    covered = {r for sr in task.subrequests for r in sr.records}
    flagged = {f"orders/{o}" for o in flagged_orders}
    unrequested = sorted(changed_records(final_db, expected_db) - covered - flagged)
    if unrequested:
        events.append(Diagnostic(capability=SDR, event=UNREQUESTED_EVENT, turn=turn,
                                 detail={"records": unrequested}))
    return events
