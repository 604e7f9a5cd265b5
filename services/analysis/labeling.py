"""Labeling runs: every (trajectory, candidate) pair gets NA / PRESENT / LACKING.

`LabelRun` is what both analyst modes produce, one per run, and all the statistics read:
`draws` lists the trajectory indices in the run (a bootstrap resample repeats some and omits
others; an LLM run draws every trajectory once) and `labels` the label of each drawn
trajectory for each candidate.

LLM mode (`llm_label_runs`): N independent runs, each with its own seed, its own shuffled
trajectory order and candidate order, and one fresh conversation per trajectory (no run ever
sees another request's context). A request carries exactly one trajectory, in a data block,
under an unguessable `ref`; its reply must validate against a schema whose `ref` is that
constant and whose capabilities are exactly the candidates. So text planted in a trajectory
can at most change that trajectory's own labels -- and only through a schema-valid reply to
the request about it. All requests of all runs share the analyst's semaphore (bounded
parallelism) and run concurrently. If any request fails, the remaining ones are cancelled
and the error names how many runs had completed: a partial set of runs is never analysed.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_common.env import Trajectory
from trace_common.errors import TraceError

from .analyst import Analyst
from .compaction import compact
from .prompts import PromptTemplate, data_block, new_nonce
from .schemas import Candidate, PairLabel, label_schema, validate_labels

_REF_LEN = 12  # "E03-" + 8 hex


@dataclass
class LabelRun:
    index: int
    seed: int
    draws: list[int]
    labels: dict[int, dict[str, PairLabel]] = field(default_factory=dict)


def run_seed(seed: int, run: int) -> int:
    """A distinct, reproducible seed per run (fits the 31-bit seeds endpoints accept)."""
    return (seed * 1_000_003 + run * 7_919 + 17) % (2**31 - 1)


def _ref(run: int) -> str:
    return f"E{run:02d}-{secrets.token_hex(4)}"[:_REF_LEN].ljust(_REF_LEN, "0")


def plan_runs(n_trajectories: int, num_runs: int, seed: int) -> list[LabelRun]:
    """Each run's seed and shuffled order (every trajectory once)."""
    runs = []
    for r in range(num_runs):
        s = run_seed(seed, r)
        order = list(range(n_trajectories))
        random.Random(s).shuffle(order)
        runs.append(LabelRun(index=r, seed=s, draws=order))
    return runs


async def _label_one(analyst: Analyst, template: PromptTemplate, view: dict[str, Any], run: LabelRun,
                     position: int, candidates: list[Candidate], task_id: str) -> dict[str, PairLabel]:
    rng = random.Random(f"{run.seed}:{position}")
    cands = list(candidates)
    rng.shuffle(cands)
    names = [c.name for c in cands]
    ref = _ref(run.index)
    nonce = new_nonce()
    schema = label_schema(ref, names)
    messages = template.render(
        capabilities=[{"name": c.name, "description": c.description} for c in cands],
        n_capabilities=str(len(cands)), ref=ref, schema=schema, nonce=nonce,
        data=data_block({"ref": ref, **view}, nonce))
    return await analyst.ask_json(messages, lambda data: validate_labels(data, ref, names),
                                  seed=run.seed + position, schema=schema,
                                  what=f"labeling run {run.index + 1}, task {task_id!r}")


async def llm_label_runs(analyst: Analyst, template: PromptTemplate, trajectories: list[Trajectory],
                         candidates: list[Candidate], *, num_runs: int, seed: int, budget: int,
                         on_pair_done: Callable[[int], None] | None = None) -> list[LabelRun]:
    """N complete labeling runs, or an exception (never a partial result)."""
    # The ref is added per request; compact with a same-length placeholder so the budget holds.
    views = []
    for t in trajectories:
        view = compact(t, budget, include_outcome=False, ref="X" * _REF_LEN)
        view.pop("ref")
        views.append(view)
    runs = plan_runs(len(trajectories), num_runs, seed)
    remaining = {r.index: len(r.draws) for r in runs}
    complete = 0

    async def work(run: LabelRun, position: int, index: int) -> None:
        nonlocal complete
        run.labels[index] = await _label_one(analyst, template, views[index], run, position, candidates,
                                             trajectories[index].task_id)
        remaining[run.index] -= 1
        complete += remaining[run.index] == 0
        if on_pair_done is not None:
            on_pair_done(len(candidates))

    try:
        async with asyncio.TaskGroup() as tg:
            for run in runs:
                for position, index in enumerate(run.draws):
                    tg.create_task(work(run, position, index))
    except BaseExceptionGroup as group:
        errors = _leaves(group)
        first = next((e for e in errors if isinstance(e, TraceError)), None)
        if first is None:
            raise
        raise type(first)(f"labeling stopped with {complete} of {num_runs} runs complete (no partial result "
                          f"is reported): {first.reason}") from None
    return runs


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out
