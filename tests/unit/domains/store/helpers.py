"""Helpers for store tests: find seeds with given properties, build hand-written actions."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from trace_common.domains.store import COMPOUND, PROBE_TYPES, SPLITS, StoreEnv, Task, generate_task
from trace_common.env import MessageAction, StepResult, ToolAction

TEST_SEEDS = SPLITS["test"]


def types_of(task_type: str) -> tuple[str, ...]:
    """The env `task_types` that generates `task_type` ("compound" or the probe set)."""
    return (COMPOUND,) if task_type == COMPOUND else PROBE_TYPES


@lru_cache(maxsize=4096)
def task_of(seed: int, task_type: str = COMPOUND) -> Task:
    return generate_task(seed, types_of(task_type))


def find_seed(task_type: str, pred: Callable[[Task], bool] = lambda t: True) -> int:
    """First test-split seed whose task has `task_type` and satisfies `pred` (probe types
    are looked up in the probe env, "compound" in the default env)."""
    for seed in TEST_SEEDS:
        task = task_of(seed, task_type)
        if task.task_type == task_type and pred(task):
            return seed
    raise AssertionError(f"no test seed of type {task_type} matches")


def call(name: str, **arguments) -> ToolAction:
    return ToolAction(name=name, arguments=arguments, call_id=f"t_{name}")


def say(text: str) -> MessageAction:
    return MessageAction(content=text)


def info_sentences(task: Task, indices: list[int] | None = None) -> list[str]:
    parts = []
    for i, sr in enumerate(task.subrequests):
        if indices is not None and i not in indices:
            continue
        for info in sr.required_info:
            parts.append(f"Order {info.anchor} is {info.value}." if info.anchor else f"Refund {info.value}.")
    return parts


def info_message(task: Task, indices: list[int] | None = None) -> MessageAction:
    """A report telling the required information of the chosen sub-requests."""
    return say(" ".join(info_sentences(task, indices)) or "All done.")


def gold_calls(task: Task, indices: list[int] | None = None) -> list[ToolAction]:
    return [call(a["name"], **a["arguments"]) for i, sr in enumerate(task.subrequests)
            if indices is None or i in indices for a in sr.gold]


def play(seed: int, actions: list, task_type: str = COMPOUND) -> tuple[StoreEnv, list[StepResult]]:
    env = StoreEnv(task_types=types_of(task_type))
    env.reset(seed)
    results = []
    for action in actions:
        if env.done:
            break
        results.append(env.step(action))
    return env, results


def capabilities(env: StoreEnv) -> list[str]:
    return [d["capability"] for d in env.diagnostics()]


def events(env: StoreEnv) -> set[tuple[str, str, str | None]]:
    """(capability, event, cause) of every diagnostic (cause: sub-goal events only)."""
    return {(d["capability"], d["event"], d["detail"].get("cause")) for d in env.diagnostics()}


ATTRIBUTION_EVENTS = ("subgoal_failed", "unrequested_change")


def step_capabilities(env: StoreEnv) -> list[str]:
    """Capabilities of the step-time events only (without the sub-goal attribution, which
    describes the episode as if it ended at this read)."""
    return [d["capability"] for d in env.diagnostics() if d["event"] not in ATTRIBUTION_EVENTS]
