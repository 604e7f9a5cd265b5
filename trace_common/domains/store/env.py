"""`store`: the built-in tau2-style customer-service environment.

One episode = one procedurally generated task (see `tasks.py`): the agent reads the
written policy (system prompt), talks to a scripted user and uses nine tools on a seeded
database; the verifier (`verifier.py`) compares the final database with the gold one
and checks what the user was told.

Splits (seeds; a task's id is `str(seed)`, its type is `task_types[seed % len(task_types)]`):

| split | seeds                  | tasks   |
|-------|------------------------|---------|
| train | [0, 100_000)           | 100 000 |
| dev   | [500_000, 500_200)     | 200     |
| test  | [1_000_000, 1_000_200) | 200 (50 per task type) |

Any non-negative seed can be played; seeds outside the ranges belong to no split.

Capability-tagged diagnostics (event names):
- structured_data_reasoning / wrong_record: a write whose target (order, items) is not
  the one the request designates, when the request calls for that kind of write;
- multi_step_task_completion / subrequest_unaddressed: once the user has ended the
  conversation, in a multi-part request with at least one part addressed, each part the
  agent never touched (no tool call on its order, no mention of its information);
- precondition_verification / write_precondition_false: a write on an order whose status
  forbids it (the write is refused, the episode's reward is 0);
- tool_call_precision / malformed_argument: a tool call with a badly formatted argument
  (id prefix or width, enum string, type, missing/unknown argument, unknown tool, broken
  JSON).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from importlib import resources
from typing import Any, ClassVar

from trace_common.domains.store.tasks import TASK_TYPES, Task, generate_task
from trace_common.domains.store.tools import TOOL_SCHEMAS, call_tool
from trace_common.domains.store.user import ScriptedUser
from trace_common.domains.store.verifier import Verdict, info_told, verify
from trace_common.env.environment import Diagnostic, Environment, Observation, StepResult
from trace_common.env.messages import Action, Message, MessageAction, ToolAction
from trace_common.errors import FailedPrecondition, InvalidArgument

SPLITS: dict[str, range] = {
    "train": range(0, 100_000),
    "dev": range(500_000, 500_200),
    "test": range(1_000_000, 1_000_200),
}


def load_policy() -> str:
    return resources.files("trace_common.domains.store").joinpath("policy.md").read_text(encoding="utf-8")


def _parse_task_types(task_types: str | Sequence[str] | None) -> tuple[str, ...]:
    if task_types is None or task_types == "":
        return TASK_TYPES
    items = [t.strip() for t in task_types.split(",")] if isinstance(task_types, str) else list(task_types)
    if not items or any(t not in TASK_TYPES for t in items) or len(set(items)) != len(items):
        raise InvalidArgument(field="task_types", expected=f"distinct names from {', '.join(TASK_TYPES)}",
                              got=task_types, fix="Pass e.g. 'precondition_check,argument_format'.")
    return tuple(items)


def _write_key(name: str, args: dict[str, Any]) -> tuple[Any, ...]:
    if name == "cancel_pending_order":
        return (args["order_id"],)
    if name == "return_delivered_order_items":
        return (args["order_id"], tuple(sorted(args["item_ids"])))
    if name == "exchange_delivered_order_items":
        return (args["order_id"], tuple(args["item_ids"]), tuple(args["new_item_ids"]))
    return (args.get("user_id"), args.get("address"))


class StoreEnv(Environment):
    """The store domain. Parameter `task_types` (comma-separated string or list) restricts
    which task types are generated; the default is all four."""

    name: ClassVar[str] = "store"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = ("Built-in tau2-style store customer service: users, orders, products, "
                                  "payment methods; procedural tasks; scripted user; algorithmic verifier.")
    default_max_turns: ClassVar[int] = 12
    inline_steps: ClassVar[bool] = True  # in-memory dicts, ~0.5 ms for a reset, microseconds a step

    def __init__(self, task_types: str | Sequence[str] | None = None):
        self.task_types = _parse_task_types(task_types)
        self._policy = load_policy()
        self._task: Task | None = None

    # -- Environment API -------------------------------------------------------------------
    def splits(self) -> dict[str, Sequence[int]]:
        return dict(SPLITS)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return copy.deepcopy(TOOL_SCHEMAS)

    def reset(self, seed: int) -> Observation:
        seed = self.check_seed(seed)
        task = generate_task(seed, self.task_types)
        self._task = task
        self._db = copy.deepcopy(task.db)
        self._expected_db = self._apply_gold(task)
        self._user = ScriptedUser(task.scenario)
        self._done = False
        self._turn = 0
        self._agent_texts: list[str] = []
        self._violations: list[dict[str, Any]] = []
        self._events: list[Diagnostic] = []
        self._touched_orders: set[str] = set()
        self._address_calls = 0
        return Observation(
            messages=[Message.system(self._policy), Message.user(self._user.opening())],
            task_id=task.task_id, seed=seed, tools=self.tool_schemas(),
            info={"task_type": task.task_type, "capability": task.capability, "mode": task.scenario.mode,
                  "kinds": [sr.kind for sr in task.subrequests]})

    @property
    def task(self) -> Task:
        """The current task (for experts, tests and analysis; never shown to the agent)."""
        if self._task is None:
            raise FailedPrecondition("no task yet: call reset(seed) first")
        return self._task

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def done(self) -> bool:
        return self._task is not None and self._done

    @property
    def db(self) -> dict[str, Any]:
        """The live database (read it, do not change it)."""
        self.task  # noqa: B018 - raises before reset
        return self._db

    def step(self, action: Action) -> StepResult:
        self.task  # noqa: B018 - raises before reset
        if self._done:
            raise FailedPrecondition("the episode is over: call reset(seed) to start another")
        turn = self._turn
        self._turn += 1
        if isinstance(action, MessageAction):
            self._agent_texts.append(action.content)
            reply, done = self._user.reply(action.content)
            self._done = done
            return StepResult(observation=[Message.user(reply)], done=done)
        if not isinstance(action, ToolAction):
            raise InvalidArgument(field="action", expected="a ToolAction or MessageAction",
                                  got=type(action).__name__)
        return StepResult(observation=[self._tool_step(action, turn)], done=False)

    def reward(self) -> float:
        return self._verdict().reward

    def reward_breakdown(self) -> dict[str, float]:
        return self._verdict().breakdown

    def failure_reason(self) -> str | None:
        return self._verdict().failure_reason

    def diagnostics(self) -> list[dict[str, Any]]:
        events = list(self._events)
        task = self.task
        if self._done and len(task.subrequests) >= 2:
            addressed = [self._addressed(i) for i in range(len(task.subrequests))]
            if any(addressed):
                for index, (sr, done) in enumerate(zip(task.subrequests, addressed, strict=True)):
                    if not done:
                        events.append(Diagnostic(capability="multi_step_task_completion",
                                                 event="subrequest_unaddressed", turn=self._turn,
                                                 detail={"index": index, "kind": sr.kind,
                                                         "request": sr.text}))
        return [e.model_dump() for e in events]

    # -- internals ---------------------------------------------------------------------------
    @staticmethod
    def _apply_gold(task: Task) -> dict[str, Any]:
        db = copy.deepcopy(task.db)
        for action in task.gold_actions():
            outcome = call_tool(db, action["name"], action["arguments"])
            if not outcome.ok:
                raise FailedPrecondition(f"store task {task.task_id}: gold action {action} failed: {outcome.text}")
        return db

    def _verdict(self) -> Verdict:
        return verify(self.task, self._db, self._expected_db, self._agent_texts, self._violations)

    def _addressed(self, index: int) -> bool:
        sr = self.task.subrequests[index]
        if sr.kind == "address":
            return self._address_calls > 0
        if sr.order_id in self._touched_orders:
            return True
        return any(info_told(info, self._agent_texts) for info in sr.required_info)

    def _event(self, capability: str, event: str, turn: int, **detail: Any) -> None:
        self._events.append(Diagnostic(capability=capability, event=event, turn=turn, detail=detail))

    def _tool_step(self, action: ToolAction, turn: int) -> Message:
        if action.error is not None:
            self._event("tool_call_precision", "malformed_argument", turn, tool=action.name,
                        argument="arguments", value=action.raw_arguments, expected="a JSON object")
            return self.tool_error(action, action.error)
        for value in action.arguments.values():
            if isinstance(value, str) and value.startswith("#W"):
                self._touched_orders.add(value)
        if action.name == "modify_user_address":
            self._address_calls += 1
        outcome = call_tool(self._db, action.name, action.arguments)
        if outcome.malformed is not None:
            self._event("tool_call_precision", "malformed_argument", turn, **outcome.malformed)
        if outcome.violation is not None:
            self._violations.append(outcome.violation)
            self._event("precondition_verification", "write_precondition_false", turn, **outcome.violation)
        if outcome.write is not None and action.name != "modify_user_address":
            self._check_record(action, turn)
        return Message.tool(action.call_id, outcome.text)

    def _check_record(self, action: ToolAction, turn: int) -> None:
        if action.arguments["order_id"] not in self._db["orders"]:
            return
        gold = [a for a in self.task.gold_actions() if a["name"] == action.name]
        if not gold:
            return
        key = _write_key(action.name, action.arguments)
        if all(_write_key(a["name"], a["arguments"]) != key for a in gold):
            self._event("structured_data_reasoning", "wrong_record", turn, tool=action.name,
                        order_id=action.arguments["order_id"],
                        expected_order_ids=[a["arguments"]["order_id"] for a in gold])
