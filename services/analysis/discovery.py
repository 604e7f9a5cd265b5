"""Discovery: one LLM request that proposes candidate capabilities from failed and passed
trajectories (prompts/analysis/discover.md).

Discovery runs once per job. It sees a seeded sample of failed and passed trajectories (their
outcome included: discovery contrasts the two), each compacted so that the whole sample fits
`total_budget` characters. Which trajectories are shown is recorded in the result, so a
report can be traced back to what the analyst read.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from trace_common.env import Trajectory
from trace_common.errors import ContextExhausted

from .analyst import Analyst
from .compaction import MIN_BUDGET, compact
from .prompts import PromptTemplate, data_block, new_nonce
from .schemas import Candidate, discovery_schema, validate_discovery


@dataclass
class Discovery:
    candidates: list[Candidate]
    shown_task_ids: list[str]
    warnings: list[str] = field(default_factory=list)


def select(failed: list[int], passed: list[int], max_failed: int, max_passed: int, total_budget: int,
           per_budget: int, rng: random.Random) -> tuple[list[int], list[int], int]:
    """Which failed/passed indices to show and the per-trajectory budget.

    Semantics:
        room   = total_budget // MIN_BUDGET              (views that can fit at all)
        nf     = min(|failed|, max_failed, room)          failures first: they are what we explain
        np     = min(|passed|, max_passed, room - nf)
        budget = min(per_budget, total_budget // (nf + np))
    """
    room = max(1, total_budget // MIN_BUDGET)
    nf = min(len(failed), max_failed, room)
    np_ = min(len(passed), max_passed, max(0, room - nf))
    shown_f = sorted(rng.sample(failed, nf))
    shown_p = sorted(rng.sample(passed, np_))
    budget = max(MIN_BUDGET, min(per_budget, total_budget // max(1, nf + np_)))
    return shown_f, shown_p, budget


async def discover(analyst: Analyst, template: PromptTemplate, trajectories: list[Trajectory], *,
                   max_candidates: int, per_budget: int, total_budget: int, max_failed: int, max_passed: int,
                   seed: int) -> Discovery:
    rng = random.Random(f"discovery:{seed}")
    failed = [i for i, t in enumerate(trajectories) if not t.success]
    passed = [i for i, t in enumerate(trajectories) if t.success]
    shown_f, shown_p, budget = select(failed, passed, max_failed, max_passed, total_budget, per_budget, rng)
    order = shown_f + shown_p
    rng.shuffle(order)  # do not let position give the outcome away more than the data does
    nonce = new_nonce()
    blocks = [data_block(compact(trajectories[i], budget, include_outcome=True), nonce) for i in order]
    task_ids = sorted({trajectories[i].task_id for i in shown_f})
    schema = discovery_schema(max_candidates)
    messages = template.render(max_candidates=str(max_candidates), n_failed=str(len(shown_f)),
                               n_passed=str(len(shown_p)), task_ids=task_ids, schema=schema, nonce=nonce,
                               data="\n\n".join(blocks))
    warnings: list[str] = []

    def validate(data: dict[str, Any]) -> list[Candidate]:
        cands, warn = validate_discovery(data, max_candidates, set(task_ids))
        warnings[:] = warn
        return cands

    try:
        candidates = await analyst.ask_json(messages, validate, seed=seed, schema=schema,
                                            what=f"discovery over {len(shown_f)} failed and {len(shown_p)} passed "
                                                 "trajectories")
    except ContextExhausted as err:   # the analyst's context is shorter than what discovery shows it
        raise ContextExhausted(f"{err}. Discovery shows {len(order)} trajectories of up to {budget} characters each: "
                               "lower TRACE_ANALYSIS_DISCOVERY_CHAR_BUDGET or TRACE_ANALYSIS_TRAJECTORY_CHAR_BUDGET, "
                               "or use an analyst model with a longer context") from None
    return Discovery(candidates=candidates, shown_task_ids=[trajectories[i].task_id for i in order],
                     warnings=warnings)
