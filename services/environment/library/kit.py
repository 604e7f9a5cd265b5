"""Shared machinery of TRACE's capability environments (the environment library).

A capability environment exercises one skill in its own small scenario but keeps its
target's surface (DESIGN.md "Environment interface"), all of it taken from the target
through the SDK (`trace_common.env.surface`, `trace_common.env.records`):

- the system prompt is the target's, verbatim, plus at most a short capability addendum
  (`ServiceEnv.addendum`, empty for targets whose policy already says everything the
  scoring asks for); the target's greeting opens the conversation when it has one;
- the tools are ALL of the target's tools with their schemas, and every call runs the
  target's own tool code through its record toolkit (`toolkit.call`), so tool messages are
  byte-identical to the target's;
- the world is built in the target's schema by the toolkit (its catalog, users, payment
  methods, orders in the target's id formats); amounts, loose ids and item descriptions are
  the toolkit's renderings.

The scenario is the family's own (never the target's task generator): one user with one
or more *cases* of the skill (`Case`), stated one after another (the store's sequential
protocol: the user gives the next request after each agent message) or all at once.
`ScriptedUser` is the store's deterministic user protocol: a question asking for the email
gets it, a question asking to confirm gets "Yes, please go ahead." (at most `2 + cases`
such answers), any other message gets the next request, or ends the episode with
"###STOP###" when none is left.

Reward (algorithmic, multi-level; each family defines `credit(case)` in [0, 1], where 1
means the case was handled exactly and lower levels reward the skill's intermediate step):

    reward = 1                           if every case has credit 1 and nothing else was written
           = SHARE * mean_c credit(c)    otherwise (SHARE = ServiceEnv.share, 0.5)

so a policy that shows the skill in some episodes gets 1 there and a graded, lower reward
elsewhere, which is what GRPO needs (groups with different rewards). Calibration, as
tests/unit/environment/test_library.py checks it for every family and both targets: with the
skill in a fraction p of *episodes* (validation's scripted stand-in) the mean is
p + (1 - p) * u, where u (at most 0.17 at the hardest level; 0.25 for two parts of one message) is the
skill-less script's mean, so the default band
[0.2, 0.6] holds for p in [0.2, 0.5] and no family can hold it above p = 0.6 (the oracle's 1
alone gives p); with the skill shown per *case* independently (`mixed`) the formula is
convex in p and the band holds for p in [0.4, 0.6].

Levels. A family can be built with fewer cases per instance (`ServiceEnv.levels`, hardest
first; the baked parameters' `"cases"` picks one, the hardest when absent). Every instance at an
easier level still needs the skill -- the skill-less script never reaches 1 there (test_library.py):
record selection always lists the look-alike first, several requests keep at least two parts,
write gates keep at least two cases with one forbidden, loose references keep a loose id or a
paraphrased reason -- but fewer cases make the all-or-nothing 1 likelier, so a base agent too
weak for the full instance can still meet the calibration band. The hardest level is the family's
original instance, its draws unchanged: there, about 1 instance in 216 of write gates (three
allowed returns) and of loose references (three exact ids, no cancel) needs no skill. Library mode calibrates the
levels hardest first and keeps the first that passes (candidates.generate_library); the level an
environment was accepted at is in its validation report.

Each family also supplies per-instance *guidance* (`Observation.guidance`, never in the
messages): a concrete hint for this instance's skill, which the trainer shows in a fraction
of a group's rollouts. `oracle()` and `unskilled()` are action scripts for the current
instance: the oracle reaches reward 1; the unskilled script is what an agent without the
skill does (the gap the store's scripted expert plants for this capability).

The module is bundled into every registered library environment (`library/__init__.py`):
the bundle binds `TARGET_TOOLKIT` to the target's toolkit class (a static import of the
toolkit module, allowed in the sandbox) and `TARGET` to the baked target parameters
({"surface": TargetSurface JSON, "toolkit_sha256": ..., optionally "cases": the level}); in-process callers pass
`target=` and `toolkit=` instead.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from trace_common.env import Environment, Message, MessageAction, Observation, StepResult, ToolAction
from trace_common.errors import FailedPrecondition, InvalidArgument

STOP = "###STOP###"
SPLITS: dict[str, range] = {"train": range(0, 100_000), "dev": range(500_000, 500_500),
                            "test": range(1_000_000, 1_000_500)}
#: Tools the library's scripts call, with the arguments they pass (targets.py checks a target has them).
SCRIPT_TOOLS: dict[str, tuple[str, ...]] = {
    "find_user_id_by_email": ("email",),
    "get_user_details": ("user_id",),
    "get_order_details": ("order_id",),
    "cancel_pending_order": ("order_id", "reason"),
    "return_delivered_order_items": ("order_id", "item_ids", "payment_method_id"),
}
#: Used instead of reading each order when the target has it (the store does, tau2 does not).
LIST_ORDERS = "list_user_orders"
WRITE_KIND = {"cancel": "cancel_pending_order", "return": "return_delivered_order_items"}

REPORT_RULE = ("When you have handled a request, tell the user its outcome: the refund amount with two decimals "
               "(e.g. 45.00), or, when the order's status does not allow the request, the order's status next to "
               "its order id.")

#: The target's record toolkit class; a bundle rebinds it with a static import after this section.
TARGET_TOOLKIT: Any = None
_TOOLKITS: dict[int, tuple[Any, Any]] = {}


# -- the scenario -------------------------------------------------------------------------------

class Case:
    """One request of the skill: its kind, the order it is about, what the user says, and facts."""

    def __init__(self, kind: str, order_id: str, text: str, **facts: Any):
        self.kind, self.order_id, self.text, self.facts = kind, order_id, text, facts


class Instance:
    """One seeded task: the user, the cases, how they are stated, the guidance."""

    def __init__(self, user: Any, cases: list[Case], mode: str, guidance: str, info: dict[str, Any] | None = None):
        if mode not in ("sequential", "all_at_once"):
            raise ValueError(f"mode {mode!r}: use 'sequential' or 'all_at_once'")
        self.user, self.cases, self.mode, self.guidance = user, cases, mode, guidance
        self.info = dict(info or {})
        hello = f"Hi, I'm {user.first_name} {user.last_name}, my email is {user.email}."
        if mode == "sequential" or len(cases) == 1:
            self.opening = f"{hello} {cases[0].text}"
            self.followups = [f"Thanks. Also: {c.text}" for c in cases[1:]] if mode == "sequential" else []
        else:
            numbered = " ".join(f"{i + 1}) {c.text}" for i, c in enumerate(cases))
            self.opening = f"{hello} I have {len(cases)} requests. {numbered}"
            self.followups = []


_CONFIRM_WORDS = ("confirm", "proceed", "shall i", "should i", "go ahead", "do you want")


class ScriptedUser:
    """The store's deterministic user protocol (see module docstring)."""

    def __init__(self, inst: Instance):
        self.email = inst.user.email
        self.queue = list(inst.followups)
        self.reactive_left = 2 + len(inst.cases)

    def reply(self, agent_text: str) -> tuple[str, bool]:
        text = agent_text.lower()
        if "?" in text and self.reactive_left > 0:
            if "email" in text:
                self.reactive_left -= 1
                return f"My email is {self.email}.", False
            if any(word in text for word in _CONFIRM_WORDS):
                self.reactive_left -= 1
                return "Yes, please go ahead.", False
        if self.queue:
            return self.queue.pop(0), False
        return f"Thank you, that's all. {STOP}", True


# -- reward helpers -------------------------------------------------------------------------------

# split sentences on . ! ? ; and newlines, but never inside a number such as 45.00 (the store's rule)
_SENTENCE_SPLIT = re.compile(r"(?<!\d)[.!?;\n]|[.!?;\n](?!\d)")


def sentences(text: str) -> list[str]:
    return [s.strip().lower() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def told(texts: Sequence[str], value: str, anchor: str | None = None) -> bool:
    """`value` appears as a word in one sentence of an agent message, next to `anchor` if given."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(value.lower())}(?![\w])")
    return any(pattern.search(s) and (anchor is None or anchor.lower() in s) for t in texts for s in sentences(t))


class Call:
    """One logged tool call and what the target's toolkit said it meant."""

    def __init__(self, turn: int, name: str, args: dict[str, Any], outcome: Any):
        self.turn, self.name, self.args = turn, name, args
        self.ok, self.write, self.violation, self.malformed = (outcome.ok, outcome.write, outcome.violation,
                                                              outcome.malformed)


def check_target(target: Any) -> dict[str, Any]:
    """The baked target parameters, checked for what every library environment reads."""
    surface = target.get("surface") if isinstance(target, dict) else None
    if not isinstance(surface, dict) or not {"system_prompt", "tool_schemas", "toolkit"} <= set(surface):
        raise InvalidArgument(field="target", expected="the target parameters TRACE bakes into TARGET "
                              "({'surface': ..., 'toolkit_sha256': ...})", got=type(target).__name__,
                              fix="Build the module with services.environment.library.bundle(...), or pass "
                                  "TargetInfo.library_params() in-process.")
    return target


def level_of(target: dict[str, Any], levels: Sequence[int]) -> int:
    """The cases per instance the baked parameters ask for (`"cases"`), the hardest level when absent."""
    cases = target.get("cases", levels[0])
    if isinstance(cases, bool) or cases not in levels:
        raise InvalidArgument(field="target.cases", expected=f"one of this family's levels {list(levels)}",
                              got=cases, fix="Leave it out for the hardest level, or bundle with a listed level.")
    return int(cases)


def _default_toolkit(target: dict[str, Any]) -> Any:
    cached = _TOOLKITS.get(id(target))
    if cached is not None and cached[0] is target:
        return cached[1]
    if TARGET_TOOLKIT is None:
        raise InvalidArgument(field="toolkit", expected="the target's record toolkit",
                              fix="In-process, pass toolkit= (services.environment.library.make_env does); a "
                                  "bundle imports it as TARGET_TOOLKIT.")
    toolkit = TARGET_TOOLKIT(**target["surface"].get("toolkit_params", {}))
    _TOOLKITS[id(target)] = (target, toolkit)
    return toolkit


# -- the environment base -----------------------------------------------------------------------

class ServiceEnv(Environment):
    """Base of the library environments (see module docstring)."""

    capability: ClassVar[str] = ""
    default_max_turns: ClassVar[int] = 24
    #: Reward of an instance not handled exactly, as a fraction of its mean case credit.
    share: ClassVar[float] = 0.5
    #: Tools the family's scripts call beyond SCRIPT_TOOLS' lookups (checked against the target).
    tools_used: ClassVar[tuple[str, ...]] = tuple(SCRIPT_TOOLS)
    #: Cases per instance the family can be built with, hardest (the default) first (module docstring).
    levels: ClassVar[tuple[int, ...]] = (3, 2, 1)

    def __init__(self, target: dict[str, Any], toolkit: Any = None):
        self.target = check_target(target)
        self.cases = level_of(self.target, self.levels)
        self.surface = self.target["surface"]
        self.toolkit = toolkit if toolkit is not None else _default_toolkit(self.target)
        self.tool_names = [s["function"]["name"] for s in self.surface["tool_schemas"]]
        self.confirms = "explicit user confirmation" in self.surface["system_prompt"].lower()
        self.inst: Instance | None = None

    # -- subclass API ---------------------------------------------------------------------
    def build(self, seed: int, world: Any) -> Instance:
        raise NotImplementedError

    def credit(self, case: Case) -> tuple[float, str | None]:
        raise NotImplementedError

    def oracle_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        raise NotImplementedError

    def unskilled_case(self, case: Case) -> tuple[list[dict[str, Any]], str | None]:
        raise NotImplementedError

    def addendum(self) -> str:
        """The capability addendum after the target's system prompt: the reporting rule the
        reward checks, unless the target's prompt already states it (it asks for amounts "with
        two decimals", as the store's policy does)."""
        if "two decimals" in self.surface["system_prompt"]:
            return ""
        return REPORT_RULE

    # -- helpers for subclasses -------------------------------------------------------------
    def eased_last(self, index: int) -> bool:
        """Case `index` is the last one of an instance below the hardest level: where a family keeps
        the skill needed (module docstring, "Levels") without changing the hardest level's draws."""
        return self.cases < self.levels[0] and index == self.cases - 1

    def pick_lines(self, world: Any, count: int, exclude: Sequence[str] = ()) -> list[tuple[str, str]]:
        """`count` (product_id, item_id) lines of distinct catalog products not in `exclude`."""
        pool = [p for p in self.catalog if p.product_id not in exclude]
        return [(p.product_id, world.rng.choice(p.variants).item_id) for p in world.rng.sample(pool, count)]

    def add_fillers(self, world: Any, user_id: str, count: int, exclude: Sequence[str] = ()) -> None:
        """`count` orders of any status holding products not in `exclude` (noise in the user's list)."""
        for _ in range(count):
            status = world.rng.choice(self.toolkit.statuses)
            self.toolkit.add_order(world, user_id, status, self.pick_lines(world, world.rng.randint(1, 2), exclude))

    def add_neighbour(self, world: Any) -> None:
        """Another user with 1-2 orders, so a lookup of a foreign record has something to find."""
        other = self.toolkit.add_user(world)
        self.add_fillers(world, other.user_id, world.rng.randint(1, 2))

    def shuffle_orders(self, world: Any, user_id: str, before: Sequence[tuple[str, str]] = ()) -> list[str]:
        """Shuffle the user's order list; then each (a, b) pair of `before` lists a before b."""
        orders = list(self.toolkit.user(world.db, user_id).orders)
        world.rng.shuffle(orders)
        for a, b in before:
            ia, ib = orders.index(a), orders.index(b)
            if ia > ib:
                orders[ia], orders[ib] = orders[ib], orders[ia]
        self.toolkit.set_user_orders(world.db, user_id, orders)
        return orders

    def act(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return {"name": tool, "arguments": arguments}

    def confirm(self, summary: str) -> list[dict[str, Any]]:
        """An explicit yes/no question before a write, for targets whose policy demands one."""
        return [{"message": f"I will {summary}. Do you confirm (yes/no)?"}] if self.confirms else []

    def money(self, cents: int) -> str:
        return self.toolkit.money(cents)

    def order0(self, order_id: str) -> Any:
        """The order as the instance began (the pristine world)."""
        return self.toolkit.order(self.world_db, order_id)

    def order_now(self, order_id: str) -> Any:
        return self.toolkit.order(self.db, order_id)

    def looked_up(self, order_id: str, before: int | None = None) -> bool:
        """The order's details (status, items) were shown to the agent before turn `before`:
        get_order_details on it, or the user's order listing (list_user_orders)."""
        owner = self.order0(order_id).user_id
        return any(c.ok and (c.turn < before if before is not None else True) and (
            (c.name == "get_order_details" and c.args.get("order_id") == order_id)
            or (c.name == LIST_ORDERS and c.args.get("user_id") == owner)) for c in self.calls)

    def write_attempts(self, order_id: str) -> list[Call]:
        """Writes that changed the order or were refused because its status forbids them."""
        return [c for c in self.calls if c.write == order_id
                or (c.violation and c.args.get("order_id") == order_id)]

    def first_write_turn(self, order_id: str) -> int | None:
        turns = [c.turn for c in self.write_attempts(order_id)]
        return min(turns) if turns else None

    def decisive_turn(self, order_id: str) -> int:
        """The turn by which a lookup must have happened: the first write attempt, else the end."""
        turn = self.first_write_turn(order_id)
        return self.turn if turn is None else turn

    def written(self) -> set[str]:
        return {c.write for c in self.calls if c.write}

    def done_exactly(self, case: Case) -> bool:
        """A cancel / return case's write made with the right arguments (final state)."""
        order = self.order_now(case.order_id)
        if case.kind == "cancel":
            return order.status == "cancelled" and order.cancel_reason == case.facts["reason"]
        if case.kind == "return":
            return order.status == "return requested" and list(order.return_items) == [case.facts["item_id"]]
        return not self.write_attempts(case.order_id)

    def refund(self, case: Case) -> str:
        order = self.order0(case.order_id)
        if case.kind == "cancel":
            return self.money(order.total)
        return self.money(next(i.price for i in order.items if i.item_id == case.facts["item_id"]))

    def told_outcome(self, case: Case) -> bool:
        """What the user must be told for a case: the refund of a write, else the order's status."""
        if case.kind in WRITE_KIND:
            return told(self.texts, self.refund(case))
        return told(self.texts, self.order0(case.order_id).status, anchor=case.order_id[2:])

    def event(self, event: str, **detail: Any) -> None:
        self.events.append({"capability": self.capability, "event": event, "turn": self.turn, "detail": detail})

    def write_sentence(self, case: Case, order_id: str | None = None, item_id: str | None = None) -> str:
        oid = order_id or case.order_id
        order = self.order0(oid)
        if case.kind == "cancel":
            return f"Order {oid} is cancelled; refund {self.money(order.total)} to {order.payment_method_id}."
        item = next(i for i in order.items if i.item_id == (item_id or case.facts["item_id"]))
        return (f"Return of the {item.name} from order {oid} is requested; refund {self.money(item.price)} to "
                f"{order.payment_method_id}.")

    def write_actions(self, case: Case, order_id: str | None = None, item_id: str | None = None,
                      reason: str | None = None) -> list[dict[str, Any]]:
        oid = order_id or case.order_id
        if case.kind == "cancel":
            why = reason or case.facts["reason"]
            return self.confirm(f"cancel order {oid} (reason: {why})") + [
                self.act("cancel_pending_order", order_id=oid, reason=why)]
        order = self.order0(oid)
        item = item_id or case.facts["item_id"]
        return self.confirm(f"return item {item} of order {oid}, refunded to {order.payment_method_id}") + [
            self.act("return_delivered_order_items", order_id=oid, item_ids=[item],
                     payment_method_id=order.payment_method_id)]

    def refusal_sentence(self, order_id: str, kind: str) -> str:
        status = self.order0(order_id).status
        need = self.toolkit.required_status[WRITE_KIND[kind]]
        verb = {"cancel": "cancelled", "return": "returned"}[kind]
        return f"Order {order_id} is {status}, so it cannot be {verb}; only {need} orders can be."

    # -- Environment API ------------------------------------------------------------------
    def splits(self) -> dict[str, Sequence[int]]:
        return dict(SPLITS)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.surface["tool_schemas"])

    def system_prompt(self) -> str:
        extra = self.addendum()
        return self.surface["system_prompt"] + (f"\n\n{extra}" if extra else "")

    def reset(self, seed: int) -> Observation:
        seed = self.check_seed(seed)
        self._seed = seed
        world = self.toolkit.new_world(random.Random(seed))
        self.world_db = world.db
        self.catalog = self.toolkit.products(world.db)
        self.inst = self.build(seed, world)
        self.db = self.toolkit.copy(world.db)
        self.user = ScriptedUser(self.inst)
        self.calls: list[Call] = []
        self.texts: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.turn = 0
        self._done = False
        messages = [Message.system(self.system_prompt())]
        if self.surface.get("greeting"):
            messages.append(Message.assistant(self.surface["greeting"]))
        messages.append(Message.user(self.inst.opening))
        return Observation(messages=messages, task_id=str(seed), seed=seed, tools=self.tool_schemas(),
                           info={"capability": self.capability, "mode": self.inst.mode,
                                 "cases": [c.kind for c in self.inst.cases], **self.inst.info},
                           guidance=self.inst.guidance)

    @property
    def task_id(self) -> str:
        if self.inst is None:
            raise FailedPrecondition("no task yet: call reset(seed) first")
        return str(self._seed)

    @property
    def done(self) -> bool:
        return self.inst is not None and self._done

    def step(self, action: Any) -> StepResult:
        if self.inst is None:
            raise FailedPrecondition("step() before reset(): call reset(seed) first")
        if self._done:
            raise FailedPrecondition("the episode is over: call reset(seed) to start another")
        turn = self.turn
        self.turn += 1
        if isinstance(action, MessageAction):
            self.texts.append(action.content)
            reply, done = self.user.reply(action.content)
            self._done = done
            return StepResult(observation=[Message.user(reply)], done=done)
        if not isinstance(action, ToolAction):
            raise InvalidArgument(field="action", expected="a ToolAction or MessageAction", got=type(action).__name__)
        if action.error is not None:
            outcome = self.toolkit.invalid_arguments(action.name, action.error)
        else:
            outcome = self.toolkit.call(self.db, action.name, dict(action.arguments))
        call = Call(turn, action.name, dict(action.arguments), outcome)
        self.calls.append(call)
        if call.malformed:
            self.event("malformed_argument", tool=call.name, problem=call.malformed)
        if call.violation:
            self.event("write_precondition_false", tool=call.name, order_id=call.args.get("order_id"),
                       violation=call.violation)
        self.on_call(call)
        return StepResult(observation=[Message.tool(action.call_id, outcome.text)], done=False)

    def on_call(self, call: Call) -> None:
        """Hook for family diagnostics (default: none)."""

    def score(self) -> tuple[float, dict[str, float], str | None]:
        credits = [self.credit(case) for case in self.inst.cases]
        allowed = {c.order_id for c in self.inst.cases if c.kind in WRITE_KIND}
        stray = sorted(self.written() - allowed)
        values = [v for v, _ in credits]
        mean = sum(values) / len(values)
        exact = all(v >= 1.0 for v in values) and not stray
        reward = 1.0 if exact else self.share * mean
        reasons = [f"case {i + 1} ({case.kind} {case.order_id}): {why}"
                   for i, (case, (_, why)) in enumerate(zip(self.inst.cases, credits, strict=True)) if why]
        if stray:
            reasons.insert(0, f"unrequested write on {', '.join(stray)}")
        breakdown = {"cases_exact": sum(v >= 1.0 for v in values) / len(values), "credit": mean,
                     "unrequested_writes": float(len(stray))}
        return reward, breakdown, "; ".join(reasons) or None

    def reward(self) -> float:
        return self.score()[0]

    def reward_breakdown(self) -> dict[str, float]:
        return self.score()[1]

    def failure_reason(self) -> str | None:
        return self.score()[2]

    def diagnostics(self) -> list[dict[str, Any]]:
        return list(self.events)

    # -- scripts --------------------------------------------------------------------------
    def mixed(self, skills: Sequence[bool]) -> list[dict[str, Any]]:
        """Actions of an agent that shows the skill on the cases where `skills` is True (one flag
        per case): `oracle_case` there, `unskilled_case` elsewhere. A case handler may return
        (no actions, None) to leave its case out (e.g. a request the agent overlooks)."""
        if len(skills) != len(self.inst.cases):
            raise InvalidArgument(field="skills", expected=f"{len(self.inst.cases)} flags, one per case",
                                  got=len(skills))
        acts = [self.act("find_user_id_by_email", email=self.inst.user.email)]
        report = []
        for case, skilled in zip(self.inst.cases, skills, strict=True):
            calls, sentence = (self.oracle_case if skilled else self.unskilled_case)(case)
            acts += calls
            if sentence is None:
                continue
            if self.inst.mode == "sequential":
                acts.append({"message": sentence})
            else:
                report.append(sentence)
        if report:
            acts.append({"message": " ".join(report)})
        return acts

    def oracle(self) -> list[dict[str, Any]]:
        return self.mixed([True] * len(self.inst.cases))

    def unskilled(self) -> list[dict[str, Any]]:
        return self.mixed([False] * len(self.inst.cases))

    def script(self, seed: int, skilled: bool) -> list[dict[str, Any]]:
        self.reset(seed)
        return self.oracle() if skilled else self.unskilled()
