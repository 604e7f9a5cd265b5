"""Trajectory compaction: one stored episode -> a small JSON view that fits a character budget.

The analyst LLM sees trajectories only through this view. Three concerns shape it:

* **Budget.** The view's JSON encoding (exactly what is pasted into the prompt) never exceeds
  `budget` characters. Compaction degrades step by step until it fits: shorter per-message
  caps (tool outputs first), then the middle of a long conversation replaced by a summary
  (message counts, tool-call one-liners or counts), keeping the first and last turns verbatim.
* **Ids survive.** Task id, tool-call ids, tool names and call arguments are kept as long as
  anything is; the summary of an omitted stretch lists the identifiers (order ids, user ids...)
  found in it, because labels hinge on which record the agent touched.
* **Untrusted text.** Nothing from the trajectory is interpreted here; the view is plain data
  and `encode_view` JSON-encodes it with ASCII escapes, so quotes, newlines, markers or control
  characters inside a trajectory cannot break out of the prompt's data block (see prompts.py).

Labeling views omit the outcome (reward, success, failure reason) and environment
diagnostics: the labeler must judge behaviour, not read the verdict, or Delta would be
inflated by construction, and diagnostics are the other analyst's evidence (their agreement
is reported as Cohen's kappa). Discovery views include the outcome: discovery contrasts
failures with successes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from trace_common.env import Message, Trajectory
from trace_common.errors import InvalidArgument

#: Smallest per-trajectory budget accepted (a view with ids and one turn each side fits).
MIN_BUDGET = 600

_ID_RE = re.compile(r"#[A-Za-z]*\d+|\b[A-Za-z][A-Za-z_]*[_-]?\d[A-Za-z0-9_-]*\b")
_MAX_IDS = 40


@dataclass(frozen=True)
class _Level:
    text: int          # cap on user/assistant text
    tool: int          # cap on tool output text
    args: int          # cap on a call's arguments string
    system: int        # cap on the system prompt (0 drops it)
    head: int | None   # messages kept verbatim at the start (None = all)
    tail: int          # ... and at the end
    calls_in_summary: bool  # summary lists each omitted call as a one-liner (else counts only)
    ids: int = _MAX_IDS     # identifiers listed in a summary


#: Tried in order; the first whose encoding fits the budget wins.
LEVELS = (
    _Level(800, 400, 400, 1200, None, 0, True),
    _Level(400, 200, 240, 600, None, 0, True),
    _Level(240, 120, 160, 400, 8, 8, True),
    _Level(160, 80, 120, 240, 4, 4, False, 30),
    _Level(100, 60, 100, 120, 2, 3, False, 20),
    _Level(60, 30, 80, 0, 1, 2, False, 12),
    _Level(40, 0, 60, 0, 0, 1, False, 6),
)


def truncate(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with a marker saying how much was dropped."""
    if len(text) <= limit:
        return text
    if limit <= 0:
        return f"[{len(text)} chars omitted]"
    return f"{text[:limit]}...[+{len(text) - limit} chars]"


def one_line(text: str) -> str:
    return " ".join(text.split())


def encode_view(view: dict[str, Any]) -> str:
    """The exact text pasted into a prompt: compact JSON, ASCII only (non-ASCII, quotes and
    control characters escaped), so the data cannot contain a raw newline or marker."""
    return json.dumps(view, ensure_ascii=True, separators=(",", ":"))


def _message_entry(index: int, msg: Message, lv: _Level) -> dict[str, Any]:
    entry: dict[str, Any] = {"i": index, "role": msg.role}
    if msg.role == "tool":
        entry["call_id"] = msg.tool_call_id
        entry["output"] = truncate(msg.content or "", lv.tool)
        return entry
    if msg.content:
        entry["text"] = truncate(msg.content, lv.text)
    if msg.tool_calls:
        entry["calls"] = [{"id": tc.id, "name": tc.function.name,
                           "args": truncate(tc.function.arguments, lv.args)} for tc in msg.tool_calls]
    return entry


def _summary(start: int, msgs: list[Message], lv: _Level) -> dict[str, Any]:
    """What an omitted stretch of messages did, with the ids it mentioned."""
    roles = Counter(m.role for m in msgs)
    names: Counter[str] = Counter()
    calls: list[str] = []
    call_ids: set[str] = set()
    ids: list[str] = []
    seen: set[str] = set()

    def collect(text: str | None) -> None:
        for token in _ID_RE.findall(text or ""):
            if token not in seen and token not in call_ids:
                seen.add(token)
                ids.append(token)

    for m in msgs:
        for tc in m.tool_calls or ():
            names[tc.function.name] += 1
            call_ids.add(tc.id)
            calls.append(f"{tc.function.name}({truncate(one_line(tc.function.arguments), 80)})")
        collect(m.content)
        for tc in m.tool_calls or ():
            collect(tc.function.arguments)
    out: dict[str, Any] = {
        "omitted_messages": [start, start + len(msgs) - 1],
        "counts": {r: roles[r] for r in ("user", "assistant", "tool") if roles[r]},
        "tool_calls": dict(names.most_common(12)),
        "ids": ids[:lv.ids],
    }
    if lv.calls_in_summary:
        out["calls"] = calls[:30]
    return out


def _view(traj: Trajectory, lv: _Level, include_outcome: bool, ref: str | None) -> dict[str, Any]:
    view: dict[str, Any] = {}
    if ref is not None:
        view["ref"] = ref
    view["task_id"] = traj.task_id
    if include_outcome:
        view["outcome"] = "passed" if traj.success else "failed"
        view["reward"] = round(traj.reward, 4)
        if traj.failure_reason:
            view["failure_reason"] = truncate(traj.failure_reason, 200)
    indexed = list(enumerate(traj.messages))
    system = [(i, m) for i, m in indexed if m.role == "system"]
    rest = [(i, m) for i, m in indexed if m.role != "system"]
    if system and lv.system:
        view["system"] = truncate("\n".join(m.content or "" for _, m in system), lv.system)
    elif system:
        view["system"] = f"[system prompt omitted, {sum(len(m.content or '') for _, m in system)} chars]"
    turns: list[dict[str, Any]] = []
    if lv.head is None or len(rest) <= lv.head + lv.tail + 1:
        turns = [_message_entry(i, m, lv) for i, m in rest]
    else:
        head, middle = rest[:lv.head], rest[lv.head:len(rest) - lv.tail]
        tail = rest[len(rest) - lv.tail:] if lv.tail else []
        turns = [_message_entry(i, m, lv) for i, m in head]
        turns.append({"summary": _summary(middle[0][0], [m for _, m in middle], lv)})
        turns += [_message_entry(i, m, lv) for i, m in tail]
    view["messages"] = turns
    return view


def compact(traj: Trajectory, budget: int, *, include_outcome: bool, ref: str | None = None) -> dict[str, Any]:
    """The largest view (by the LEVELS ladder) whose `encode_view` length is <= budget.

    Semantics:
        for level in LEVELS (least to most aggressive):
            view = render(traj, level)
            if len(encode_view(view)) <= budget: return view
        raise InvalidArgument (budget too small for even the smallest view)
    """
    if budget < MIN_BUDGET:
        raise InvalidArgument(field="trajectory_char_budget", expected=f">= {MIN_BUDGET} characters",
                              got=budget, fix="raise the budget (0 means the service default)")
    last = 0
    for lv in LEVELS:
        view = _view(traj, lv, include_outcome, ref)
        last = len(encode_view(view))
        if last <= budget:
            return view
    # Even the smallest level is too big (e.g. megabyte-long ids or a huge failure reason):
    # keep the summary only.
    lv = LEVELS[-1]
    view = _view(traj, _Level(20, 0, 40, 0, 0, 0, False, 3), include_outcome, ref)
    if len(encode_view(view)) <= budget:
        return view
    raise InvalidArgument(field="trajectory_char_budget", expected=f"room for the smallest view of task "
                          f"{traj.task_id!r} ({last} characters at level {LEVELS.index(lv)})", got=budget,
                          fix="raise trajectory_char_budget")
