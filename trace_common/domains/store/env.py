"""`store`: the built-in tau2-style customer-service environment.

One episode = one procedurally generated task (`tasks.py`, `compound.py`): the agent reads
the written policy (system prompt), talks to a scripted user and uses nine tools on a
seeded database; the verifier (`verifier.py`) compares the final database with the gold one
and checks what the user was told, all-or-nothing as tau2 does.

Task types (parameter `task_types`): the default, and the target of the embedded pipeline,
is `compound` -- one conversation whose sub-requests together need 2 to 4 capabilities.
The four single-capability *probe* types (`record_selection`, `multi_request`,
`precondition_check`, `argument_format`) give the per-capability breakdown: pass any
distinct subset of them, or `probes` for all four; a probe set picks a seed's type as
`task_types[seed % len(task_types)]`. Compound and probe types are not mixed in one env.

Splits (seeds; a task's id is `str(seed)`). The same seed ranges serve the compound target
and the probe env. They were fixed before any training run, and the generated tasks of
every dev and test seed (and of train seeds 0-499) are pinned by hash in
`tests/unit/domains/store/test_splits.py`: do not change the splits or the generators after
seeing results.

| split | seeds                  | tasks   | probe env (`probes`)   |
|-------|------------------------|---------|------------------------|
| train | [0, 100_000)           | 100 000 | 25 000 per probe type  |
| dev   | [500_000, 500_300)     | 300     | 75 per probe type      |
| test  | [1_000_000, 1_000_600) | 600     | 150 per probe type     |

Any non-negative seed can be played; seeds outside the ranges belong to no split.

Capability-tagged diagnostics (event names). Step-time events:
- structured_data_reasoning / wrong_record: a write whose target (order, items) is not
  the one the request designates, when the request calls for that kind of write;
- multi_step_task_completion / subrequest_unaddressed: once the user has ended the
  conversation, in a multi-part request with at least one part addressed, each part the
  agent never addressed (see `attribution.addressed`);
- precondition_verification / write_precondition_false: a write on an order whose status
  forbids it (the write is refused, the episode's reward is 0);
- tool_call_precision / malformed_argument: a tool call with a badly formatted argument
  (id prefix or width, enum string, type, missing/unknown argument, unknown tool, broken
  JSON).
Sub-goal attribution (`attribution.py`, its table says which capability each failure
belongs to): `subgoal_failed` for every failed sub-request and `unrequested_change` for a
changed record no sub-request covers. These are computed whenever `diagnostics()` is read,
from the episode as it stands (the episode driver reads it once, after the last step, done
or truncated), so every failed episode carries at least one capability-tagged event.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from importlib import resources
from typing import Any, ClassVar

from trace_common.domains.store.attribution import CallRecord, addressed, subgoal_events
from trace_common.domains.store.tasks import COMPOUND, DEFAULT_TASK_TYPES, PROBE_TYPES, Task, generate_task
from trace_common.domains.store.tools import TOOL_SCHEMAS, call_tool
from trace_common.domains.store.user import ScriptedUser
from trace_common.domains.store.verifier import Verdict, verify
from trace_common.env.environment import Diagnostic, Environment, Observation, StepResult
from trace_common.env.messages import Action, Message, MessageAction, ToolAction
from trace_common.errors import FailedPrecondition, InvalidArgument

SPLITS: dict[str, range] = {
    "train": range(0, 100_000),
    "dev": range(500_000, 500_300),
    "test": range(1_000_000, 1_000_600),
}


def load_policy() -> str:
    return resources.files("trace_common.domains.store").joinpath("policy.md").read_text(encoding="utf-8")


PROBES_ALIAS = "probes"


def parse_task_types(task_types: str | Sequence[str] | None) -> tuple[str, ...]:
    """None / "" -> ("compound",); "compound"; "probes" -> the four probe types; or a
    distinct subset of the probe types (comma-separated string or a list)."""
    if task_types is None or task_types == "":
        return DEFAULT_TASK_TYPES
    items = [t.strip() for t in task_types.split(",")] if isinstance(task_types, str) else list(task_types)
    if items == [COMPOUND]:
        return DEFAULT_TASK_TYPES
    if items == [PROBES_ALIAS]:
        return PROBE_TYPES
    if not items or any(t not in PROBE_TYPES for t in items) or len(set(items)) != len(items):
        raise InvalidArgument(field="task_types",
                              expected=f"'{COMPOUND}', '{PROBES_ALIAS}' or distinct names from {', '.join(PROBE_TYPES)}",
                              got=task_types, fix="Pass e.g. 'compound' (the target), 'probes' or "
                                                  "'precondition_check,argument_format' (compound and probe types "
                                                  "do not mix).")
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
    """The store domain. Parameter `task_types` (comma-separated string or list): 'compound'
    (the default), 'probes' (all four probe types) or a distinct subset of the probe types."""

    name: ClassVar[str] = "store"
    version: ClassVar[str] = "2.0.0"  # 2: the compound target (1.0.0 generated single-capability tasks only)
    description: ClassVar[str] = ("Built-in tau2-style store customer service: users, orders, products, "
                                  "payment methods; procedural tasks; scripted user; algorithmic verifier.")
    # the all-skills expert needs at most 11 turns on a compound task (find the user, one listing,
    # at most 7 calls for 3 requests, 3 reports when sequential); 16 leaves room for an agent
    # that looks things up again before it is cut off
    default_max_turns: ClassVar[int] = 16
    inline_steps: ClassVar[bool] = True  # in-memory dicts: a reset is a few ms of CPU, a step far less

    def __init__(self, task_types: str | Sequence[str] | None = None):
        self.task_types = parse_task_types(task_types)
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
        self._calls: list[CallRecord] = []
        self._wrong_records: set[str] = set()
        info: dict[str, Any] = {"task_type": task.task_type, "capabilities": list(task.capabilities),
                                "mode": task.scenario.mode, "kinds": [sr.kind for sr in task.subrequests]}
        if task.capability is not None:  # probes only: a compound task has no single capability
            info["capability"] = task.capability
        return Observation(
            messages=[Message.system(self._policy), Message.user(self._user.opening())],
            task_id=task.task_id, seed=seed, tools=self.tool_schemas(), info=info)

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
            done = [addressed(task, sr, self._calls, self._agent_texts) for sr in task.subrequests]
            if any(done):
                for index, (sr, was_addressed) in enumerate(zip(task.subrequests, done, strict=True)):
                    if not was_addressed:
                        events.append(Diagnostic(capability="multi_step_task_completion",
                                                 event="subrequest_unaddressed", turn=self._turn,
                                                 detail={"index": index, "kind": sr.kind,
                                                         "request": sr.text}))
        events += subgoal_events(task, self._verdict(), self._calls, self._agent_texts, self._db,
                                 self._expected_db, self._turn, self._wrong_records)
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

    def _event(self, capability: str, event: str, turn: int, **detail: Any) -> None:
        self._events.append(Diagnostic(capability=capability, event=event, turn=turn, detail=detail))

    def _tool_step(self, action: ToolAction, turn: int) -> Message:
        if action.error is not None:
            malformed = {"tool": action.name, "argument": "arguments", "value": action.raw_arguments,
                         "expected": "a JSON object"}
            self._event("tool_call_precision", "malformed_argument", turn, **malformed)
            self._calls.append(CallRecord.make(turn, action.name, {}, False, malformed, None))
            return self.tool_error(action, action.error)
        outcome = call_tool(self._db, action.name, action.arguments)
        self._calls.append(CallRecord.make(turn, action.name, action.arguments, outcome.ok, outcome.malformed,
                                           outcome.violation))
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
            self._wrong_records.add(action.arguments["order_id"])
            self._event("structured_data_reasoning", "wrong_record", turn, tool=action.name,
                        order_id=action.arguments["order_id"],
                        expected_order_ids=[a["arguments"]["order_id"] for a in gold])
