"""Helpers for store tests: find seeds with given properties, build hand-written actions."""

from __future__ import annotations

from collections.abc import Callable

from trace_common.domains.store import SPLITS, StoreEnv, Task, generate_task
from trace_common.env import MessageAction, StepResult, ToolAction

TEST_SEEDS = SPLITS["test"]


def find_seed(task_type: str, pred: Callable[[Task], bool] = lambda t: True) -> int:
    """First test-split seed whose task has `task_type` and satisfies `pred`."""
    for seed in TEST_SEEDS:
        task = generate_task(seed)
        if task.task_type == task_type and pred(task):
            return seed
    raise AssertionError(f"no test seed of type {task_type} matches")


def call(name: str, **arguments) -> ToolAction:
    return ToolAction(name=name, arguments=arguments, call_id=f"t_{name}")


def say(text: str) -> MessageAction:
    return MessageAction(content=text)


def info_message(task: Task, indices: list[int] | None = None) -> MessageAction:
    """A report telling the required information of the chosen sub-requests."""
    parts = []
    for i, sr in enumerate(task.subrequests):
        if indices is not None and i not in indices:
            continue
        for info in sr.required_info:
            parts.append(f"Order {info.anchor} is {info.value}." if info.anchor else f"Refund {info.value}.")
    return say(" ".join(parts) or "All done.")


def gold_calls(task: Task, indices: list[int] | None = None) -> list[ToolAction]:
    return [call(a["name"], **a["arguments"]) for i, sr in enumerate(task.subrequests)
            if indices is None or i in indices for a in sr.gold]


def play(seed: int, actions: list) -> tuple[StoreEnv, list[StepResult]]:
    env = StoreEnv()
    env.reset(seed)
    results = []
    for action in actions:
        if env.done:
            break
        results.append(env.step(action))
    return env, results


def capabilities(env: StoreEnv) -> list[str]:
    return [d["capability"] for d in env.diagnostics()]
