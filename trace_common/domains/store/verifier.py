"""Algorithmic verifier of the store domain.

The expected final database is the initial one with the task's gold write actions
applied (by the same tool code the agent uses). A sub-request is fulfilled when every
database record it touches equals its expected value and every piece of required
information was told to the user (the value, next to its anchor when it has one, inside
one sentence of an agent message).

Scoring is all-or-nothing, as tau2 scores: one unfulfilled sub-request, one policy
violation or one unrequested change makes the episode a failure (reward 0), for every
task type (compound and probes alike). The fractions stay in `breakdown` for analysis.

Semantics:
    changed   = {records r : final[r] != expected[r]}
    ok[s]     = (records(s) ∩ changed == ∅) and all(info told for info in required(s))
    violation = a write was attempted while its precondition (the order's status) was false
    extra     = changed ⊄ ∪ records(s)                       (an unrequested change)
    reward    = 1.0  if all(ok) and not violation and not extra
              = 0.0  otherwise
    success   = reward == 1
    breakdown = {subrequests: mean_s ok[s], db: [changed == ∅], info: told / required,
                 policy: [not violation],
                 credit: mean_s ok[s] if not violation and not extra else 0}

`credit` is the reward's partial credit: the share of sub-requests fulfilled, zeroed by what zeroes
the reward whatever was fulfilled (a policy violation, an unrequested change), so credit == 1 exactly
when reward == 1. It is the dense score to rank policies by where few episodes pass: `subrequests`
alone ranks an agent that writes against an order's status, or changes what nobody asked for, above one
that refuses (measured on dev, 2026-12-06: at learning rate 2e-3 the multi-step adapter meets the most
sub-requests of any slot and passes the fewest tasks; README, "Where TRACE loses, on dev").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trace_common.domains.store.task_model import RequiredInfo, Task

# split sentences on . ! ? ; and newlines, but never inside a number such as 45.00
_SENTENCE_SPLIT = re.compile(r"(?<!\d)[.!?;\n]|[.!?;\n](?!\d)")


def sentences(text: str) -> list[str]:
    return [s.strip().lower() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def _contains(sentence: str, value: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(value.lower())}(?![\w])", sentence) is not None


def info_told(info: RequiredInfo, agent_texts: list[str]) -> bool:
    for text in agent_texts:
        for sentence in sentences(text):
            if _contains(sentence, info.value) and (info.anchor is None or info.anchor in sentence):
                return True
    return False


def changed_records(final_db: dict[str, Any], expected_db: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for table in ("users", "orders", "products"):
        final, expected = final_db[table], expected_db[table]
        for key in set(final) | set(expected):
            if final.get(key) != expected.get(key):
                out.add(f"{table}/{key}")
    return out


@dataclass
class Verdict:
    reward: float
    subrequest_ok: list[bool]
    breakdown: dict[str, float] = field(default_factory=dict)
    failure_reason: str | None = None


def verify(task: Task, final_db: dict[str, Any], expected_db: dict[str, Any], agent_texts: list[str],
           violations: list[dict[str, Any]]) -> Verdict:
    changed = changed_records(final_db, expected_db)
    covered = {r for sr in task.subrequests for r in sr.records}
    reasons: list[str] = []
    ok: list[bool] = []
    infos_total = infos_told = 0
    for index, sr in enumerate(task.subrequests):
        bad_records = sorted(set(sr.records) & changed)
        missing = [i for i in sr.required_info if not info_told(i, agent_texts)]
        infos_total += len(sr.required_info)
        infos_told += len(sr.required_info) - len(missing)
        ok.append(not bad_records and not missing)
        if bad_records:
            reasons.append(f"sub-request {index + 1} ({sr.kind}): {', '.join(bad_records)} not as expected")
        elif missing:
            reasons.append(f"sub-request {index + 1} ({sr.kind}): did not tell the user "
                           + ", ".join(repr(i.value) for i in missing))
    unexpected = sorted(changed - covered)
    if violations:
        v = violations[0]
        reasons.insert(0, f"policy violation: {v['tool']} on {v['order_id']} whose status is {v['status']} "
                          f"(requires {v['required_status']})")
    if unexpected:
        reasons.insert(0 if not violations else 1, f"unrequested change to {', '.join(unexpected)}")
    fulfilled = sum(ok) / len(ok) if ok else 1.0
    reward = 1.0 if all(ok) and not violations and not unexpected else 0.0
    breakdown = {"subrequests": fulfilled, "db": 0.0 if changed else 1.0,
                 "info": infos_told / infos_total if infos_total else 1.0,
                 "policy": 0.0 if violations else 1.0,
                 "credit": 0.0 if violations or unexpected else fulfilled}
    return Verdict(reward=reward, subrequest_ok=ok, breakdown=breakdown,
                   failure_reason=None if reward >= 1.0 else "; ".join(reasons) or "unknown")
