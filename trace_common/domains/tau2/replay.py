"""Replay every task's gold actions on a fresh database (`tracectl tau2 replay-gold`).

For each task of a tau2 domain with tools, the gold actions (`evaluation_criteria.actions`)
are executed in order on a new DB; the result records what the agent would have seen and
where the DB ended:

    {task_id: {"outputs": [tool message content per action],
               "final_db_sha256": sha256(json.dumps(final_db, sort_keys=True,
                                         separators=(",", ":"), ensure_ascii=False))}}

`final_db` is the DB as plain JSON data in the shape of db.json (see
`RetailDB.plain_json`). Gold actions that fail (tau2's own gold lists contain a few
deliberate failing lookups) record their "Error: ..." content, exactly as tau2 would.

The command line (`tracectl tau2 replay-gold`, with its progress display) is
tracectl/commands/tau2.py; `write_replay_gold` is what it runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_common.domains.tau2.data import Tau2Domain, load_domain
from trace_common.domains.tau2.retail_db import CanonicalHasher, RetailDB
from trace_common.domains.tau2.retail_tools import RetailTools
from trace_common.domains.tau2.tasks import Action
from trace_common.domains.tau2.toolkit import ToolResult
from trace_common.errors import FailedPrecondition


@dataclass
class GoldReplay:
    """One task's replay: the tool results in order and the DB afterwards."""

    task_id: str
    results: list[ToolResult]
    db: RetailDB
    hasher: CanonicalHasher | None = None

    def final_db_sha256(self) -> str:
        return self.hasher.sha256_hex(self.db) if self.hasher is not None else self.db.sha256_hex()

    def record(self) -> dict[str, Any]:
        return {"outputs": [r.content for r in self.results], "final_db_sha256": self.final_db_sha256()}


def replay_actions(db: RetailDB, actions: list[Action]) -> list[ToolResult]:
    """Execute gold actions (assistant-side) on `db` in order; errors are results, not exceptions."""
    tools = RetailTools(db)
    out = []
    for action in actions:
        if action.requestor != "assistant":
            raise FailedPrecondition(f"gold action {action.action_id} is a user tool call; the retail domain "
                                     "has no user tools")
        out.append(tools.call(action.name, action.arguments))
    return out


def replay_task(domain: Tau2Domain, task_id: str) -> GoldReplay:
    task = domain.task_by_id(task_id)
    db = domain.fresh_db()
    return GoldReplay(task_id=task.id, results=replay_actions(db, task.gold_actions), db=db, hasher=domain.hasher)


def replay_gold(domain: Tau2Domain, progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """`{task_id: {"outputs", "final_db_sha256"}}` for every task, in tasks.json order."""
    out: dict[str, dict[str, Any]] = {}
    for task in domain.tasks:
        out[task.id] = replay_task(domain, task.id).record()
        if progress is not None:
            progress(task.id)
    return out


def write_replay_gold(data: str | Path | None, out: str | Path, domain: str | None = None,
                      on_start: Callable[[str, int], None] | None = None,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Load the domain, replay all tasks, write `out` atomically; return a summary (tasks,
    actions, tool errors, seconds). `on_start(domain_name, n_tasks)` is called once the domain is
    loaded and `progress(task_id)` after each task (the command line draws its progress with them).
    """
    start = time.perf_counter()
    loaded = load_domain(data, domain)
    if not loaded.has_tools:
        raise FailedPrecondition(f"tau2 domain {loaded.name!r} has no TRACE tool implementation; "
                                 "replay-gold supports: retail")
    if on_start is not None:
        on_start(loaded.name, len(loaded.tasks))
    result = replay_gold(loaded, progress=progress)
    dest = Path(out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(dest)
    n_actions = sum(len(v["outputs"]) for v in result.values())
    n_errors = sum(o.startswith("Error: ") for v in result.values() for o in v["outputs"])
    return {"domain": loaded.name, "tasks": len(result), "actions": n_actions, "tool_errors": n_errors,
            "seconds": round(time.perf_counter() - start, 3), "out": str(dest)}
