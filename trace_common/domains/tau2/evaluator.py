"""tau2-bench's reward, computed the way tau2 computes it (minus the LLM judge).

Rules (tau2's `evaluate_simulation` with evaluation type ALL, half-duplex):

1. Only episodes that ended by a stop (the user's ###STOP### / ###TRANSFER### /
   ###OUT-OF-SCOPE###, or an agent stop) are scored; max_steps, too_many_errors and every
   other ending score 0 with a note.
2. DB check (replay-based): on one fresh DB, re-execute the agent's *state-mutating* tool
   calls in order (reads are skipped, unknown tool names are no-ops); on another fresh DB,
   execute the task's gold actions (their errors are ignored). DB reward is 1 iff the two
   databases are equal (tau2 compares sha256 hashes of `model_dump()`; equal dumps <=> equal
   hashes, so equality is compared directly and the hashes are only computed on demand). If a
   replayed call answers differently from what the agent saw, tau2 raises; here it is
   recorded in `replay_mismatches` and scoring continues.
3. COMMUNICATE: every `communicate_info` string must occur, case-insensitively, in some
   assistant text with commas removed from the text.
4. ACTION: every gold action must match some agent tool call (same name; equal values on
   `compare_args`, or on all arguments of the call when unset).
5. The reward is the product of the components named in the task's `reward_basis`
   (DB/ENV_ASSERTION -> DB check, ACTION, COMMUNICATE, NL_ASSERTION).

Difference from tau2, on purpose: NL_ASSERTION needs an LLM judge and TRACE rewards are
algorithmic, so a task's non-empty `nl_assertions` are listed in `unevaluated` and do not
enter the product (tau2 multiplies the judge's verdict in). ENV_ASSERTION checks (none in
retail or airline) are likewise reported unevaluated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from trace_common.domains.tau2.retail_db import RetailDB
from trace_common.domains.tau2.retail_tools import RetailTools
from trace_common.domains.tau2.tasks import RewardType, Task
from trace_common.domains.tau2.toolkit import Toolkit


class Tau2Termination(StrEnum):
    """tau2's termination reasons (the ones a text episode can reach) plus `not_finished`."""

    USER_STOP = "user_stop"
    AGENT_STOP = "agent_stop"
    MAX_STEPS = "max_steps"
    TOO_MANY_ERRORS = "too_many_errors"
    AGENT_ERROR = "agent_error"
    USER_ERROR = "user_error"
    NOT_FINISHED = "not_finished"  # TRACE: scored before any ending (e.g. the agent's turn budget ran out)


SCORED_TERMINATIONS = frozenset({Tau2Termination.USER_STOP, Tau2Termination.AGENT_STOP})


@dataclass(frozen=True)
class CallRecord:
    """One agent tool call as the trajectory holds it."""

    name: str
    arguments: dict[str, Any]
    content: str | None = None  # what the agent saw; None when not recorded
    error: bool = False
    executed: bool = True       # False: the arguments never decoded, no tool ran


class ActionCheck(BaseModel):
    action_id: str
    name: str
    matched: bool


class CommunicateCheck(BaseModel):
    info: str
    met: bool


class RewardInfo(BaseModel):
    """Everything the evaluator decided; `failure_reason` is one line, None at reward 1."""

    reward: float = Field(ge=0.0, le=1.0)
    termination: Tau2Termination
    reward_basis: list[str] = Field(default_factory=list)
    breakdown: dict[str, float] = Field(default_factory=dict, description="Per evaluated basis component.")
    db_match: bool | None = None
    db_diff: list[str] = Field(default_factory=list, description="'orders/<id>', 'users/<id>' that differ.")
    action_checks: list[ActionCheck] = Field(default_factory=list)
    communicate_checks: list[CommunicateCheck] = Field(default_factory=list)
    unevaluated: list[str] = Field(default_factory=list, description="Basis components not scored (LLM judge).")
    replay_mismatches: list[str] = Field(default_factory=list)
    gold_errors: list[str] = Field(default_factory=list, description="Gold actions that returned an error.")
    note: str | None = None
    failure_reason: str | None = None


def _loads_or_text(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def db_diff(a: RetailDB, b: RetailDB) -> list[str]:
    """Record keys ('products/<id>', 'users/<id>', 'orders/<id>') whose contents differ."""
    out = []
    for table in ("products", "users", "orders"):
        left, right = getattr(a, table), getattr(b, table)
        for key in sorted(set(left) | set(right)):
            x, y = left.get(key), right.get(key)
            if x is not y and x != y:  # copy-on-write DBs share unchanged records
                out.append(f"{table}/{key}")
    return out


def communicate_met(info: str, agent_texts: Iterable[str]) -> bool:
    needle = info.lower()
    return any(needle in text.lower().replace(",", "") for text in agent_texts if text)


class Tau2Evaluator:
    """Scores finished episodes of one domain. `fresh_db` returns a new initial-state DB."""

    def __init__(self, fresh_db: Callable[[], RetailDB], toolkit: type[Toolkit] = RetailTools):
        self._fresh_db = fresh_db
        self._toolkit = toolkit

    # -- DB replay --------------------------------------------------------------------------
    def replay_agent(self, calls: Sequence[CallRecord]) -> tuple[RetailDB | None, list[str]]:
        """Re-run the agent's mutating calls on a fresh DB; None when nothing was re-run."""
        db: RetailDB | None = None
        tools: Toolkit | None = None
        mismatches = []
        for i, call in enumerate(calls):
            if not call.executed or not self._spec_mutates(call.name):
                continue
            if db is None:
                db = self._fresh_db()
                tools = self._toolkit(db)
            assert tools is not None
            result = tools.call(call.name, call.arguments)
            if call.content is not None and _loads_or_text(result.content) != _loads_or_text(call.content):
                mismatches.append(f"call {i} {call.name}: replay answered {result.content[:120]!r}, "
                                  f"the agent saw {call.content[:120]!r}")
        return db, mismatches

    def replay_gold(self, task: Task) -> tuple[RetailDB | None, list[str]]:
        db: RetailDB | None = None
        tools: Toolkit | None = None
        errors = []
        for action in task.gold_actions:
            if not self._spec_mutates(action.name):
                continue  # reads cannot change the DB; skipping them saves a fresh DB for read-only tasks
            if db is None:
                db = self._fresh_db()
                tools = self._toolkit(db)
            assert tools is not None
            result = tools.call(action.name, action.arguments)
            if result.error:
                errors.append(f"{action.action_id} {action.name}: {result.content}")
        return db, errors

    def _spec_mutates(self, name: str) -> bool:
        spec = self._toolkit.SPECS.get(name)
        return spec is not None and spec.mutates_state  # unknown names are no-ops, as in tau2's replay

    def db_check(self, task: Task, calls: Sequence[CallRecord]) -> tuple[bool, list[str], list[str], list[str]]:
        predicted, mismatches = self.replay_agent(calls)
        gold, gold_errors = self.replay_gold(task)
        if predicted is None and gold is None:
            return True, [], mismatches, gold_errors
        predicted = predicted if predicted is not None else self._fresh_db()
        gold = gold if gold is not None else self._fresh_db()
        if predicted == gold:
            return True, [], mismatches, gold_errors
        return False, db_diff(gold, predicted), mismatches, gold_errors

    # -- the reward -------------------------------------------------------------------------
    def evaluate(self, task: Task, calls: Sequence[CallRecord], agent_texts: Sequence[str],
                 termination: Tau2Termination) -> RewardInfo:
        if termination not in SCORED_TERMINATIONS:
            return RewardInfo(reward=0.0, termination=termination,
                              note=f"Simulation terminated prematurely. Termination reason: {termination.value}",
                              failure_reason=f"terminated early ({termination.value}); tau2 scores such episodes 0")
        criteria = task.evaluation_criteria
        if criteria is None:
            return RewardInfo(reward=1.0, termination=termination, note="No evaluation criteria")
        basis = [RewardType(b) for b in criteria.reward_basis]
        info = RewardInfo(reward=1.0, termination=termination, reward_basis=[b.value for b in basis])
        reasons: list[str] = []

        if criteria.actions is None and criteria.env_assertions is None:
            db_ok, diff = True, []
        else:
            db_ok, diff, info.replay_mismatches, info.gold_errors = self.db_check(task, calls)
        info.db_match, info.db_diff = db_ok, diff
        if RewardType.DB in basis:
            info.breakdown[RewardType.DB.value] = 1.0 if db_ok else 0.0
            if not db_ok:
                shown = ", ".join(diff[:4]) + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else "")
                reasons.append(f"DB: final database differs from the gold one in {shown}")
        if RewardType.ENV_ASSERTION in basis:
            if criteria.env_assertions:
                info.unevaluated.append(RewardType.ENV_ASSERTION.value)
            else:
                info.breakdown[RewardType.ENV_ASSERTION.value] = 1.0

        for action in criteria.actions or []:
            matched = any(action.matches(c.name, c.arguments) for c in calls)
            info.action_checks.append(ActionCheck(action_id=action.action_id, name=action.name, matched=matched))
        if RewardType.ACTION in basis:
            missing = [c.name for c in info.action_checks if not c.matched]
            info.breakdown[RewardType.ACTION.value] = 0.0 if missing else 1.0
            if missing:
                reasons.append(f"ACTION: gold calls not made: {', '.join(missing)}")

        for text in criteria.communicate_info or []:
            info.communicate_checks.append(CommunicateCheck(info=text, met=communicate_met(text, agent_texts)))
        if RewardType.COMMUNICATE in basis:
            unmet = [c.info for c in info.communicate_checks if not c.met]
            info.breakdown[RewardType.COMMUNICATE.value] = 0.0 if unmet else 1.0
            if unmet:
                reasons.append("COMMUNICATE: not told to the user: " + ", ".join(repr(u) for u in unmet))

        if RewardType.NL_ASSERTION in basis:
            if criteria.nl_assertions:
                info.unevaluated.append(RewardType.NL_ASSERTION.value)
            else:
                info.breakdown[RewardType.NL_ASSERTION.value] = 1.0

        reward = 1.0
        for value in info.breakdown.values():
            reward *= value
        info.reward = reward
        if reward < 1.0:
            info.failure_reason = "; ".join(reasons)
        return info


def calls_from_messages(messages: Sequence[Any]) -> tuple[list[CallRecord], list[str]]:
    """Tool calls (with the tool messages answering them) and assistant texts of a conversation.

    Accepts OpenAI message dicts or objects with `to_dict()` (the SDK's `Message`).
    """
    dicts = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in messages]
    answers = {d.get("tool_call_id"): d.get("content") for d in dicts if d.get("role") == "tool"}
    calls: list[CallRecord] = []
    texts: list[str] = []
    for d in dicts:
        if d.get("role") != "assistant":
            continue
        if d.get("content"):
            texts.append(d["content"])
        for tc in d.get("tool_calls") or []:
            fn = tc.get("function", {})
            raw = fn.get("arguments", "{}")
            content = answers.get(tc.get("id"))
            error = isinstance(content, str) and content.startswith("Error: ")
            try:
                args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):
                calls.append(CallRecord(fn.get("name", ""), {}, content, True, executed=False))
                continue
            calls.append(CallRecord(fn.get("name", ""), args, content, error))
    return calls, texts
