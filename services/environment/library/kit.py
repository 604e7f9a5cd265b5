"""Shared machinery of TRACE's capability environments (the environment library).

A capability environment exercises one skill but keeps its target's surface (docs/design.md
"Environment interface"), all of it taken from the target through the SDK
(`trace_common.env.surface`, `trace_common.env.records`):

- the system prompt is the target's, verbatim, plus at most a short capability addendum
  (`ServiceEnv.addendum`, empty for targets whose policy already says everything the
  scoring asks for); the target's greeting opens the conversation when it has one;
- the tools are ALL of the target's tools with their schemas, and every call runs the
  target's own tool code through its record toolkit (`toolkit.call`), so tool messages are
  byte-identical to the target's;
- the world is built in the target's schema by the toolkit (its catalog, users, payment
  methods, orders in the target's id formats); amounts, loose ids, item descriptions and
  addresses are the toolkit's renderings.

Shape. An instance is shaped like the target's conversations (`REQUEST_MIX`, measured on each
target's train split): the number of requests, their kinds (a sample of the target's kinds,
without repeats where the target never repeats one) and the request mode (every request stated
in the opening message, `all_at_once`, or one per user message, `sequential`) are drawn from
the target's own distributions. Some requests are *capability cases* -- drawn by the family's
own generator to need its skill -- and the rest are *plain* requests of the target's kinds
(cancel, return, exchange, status, address change; tau2 retail adds item modification and
order address), built the way the target's plain sub-requests are (an order given by its
exact id, a status that allows the request, the canonical cancel reason). Only the catalog is
the one the target's toolkit draws for the seed's number (tau2's is always db.json's); users,
orders and requests come from the family's own stream (`ServiceEnv.world_for`), so no instance
reuses a target task's draws, and a family plays its own SPLITS, never the target's tasks. The
target's kinds a family cannot carry out are left out: tau2's 2 transfers to a human (of 147
requests), and for a target without a measured mix the kinds it has no tool for.

`ScriptedUser` is the store's deterministic user protocol: the opening message states the
first message's requests; a question asking for the email gets it, a question asking to
confirm gets "Yes, please go ahead." (at most `2 + requests` such answers), any other agent
message gets the next user message ("Thanks. Also: ..."), or ends the episode with
"###STOP###" when none is left -- so in all-at-once mode the agent's first report ends it.

Reward (algorithmic, multi-level; a family defines `credit(case)` in [0, 1] for its capability
cases, where 1 means the case was handled exactly and lower levels reward the skill's
intermediate step; a plain request earns 1 when handled exactly -- its write made with the
right arguments and its outcome told, `plain_credit` -- else 0):

    reward = 1                           if every request has credit 1 and nothing else was written
           = SHARE * mean_r credit(r)    otherwise (SHARE = ServiceEnv.share, 0.5; r over all requests)

which is denser than the target's all-or-nothing verifier: a policy that shows the skill gets
1, one that handles the plain requests but not the cases gets a graded, lower reward. Calibration
(test_library.py checks it for every family and both targets, over 20 dev seeds, at the hardest
level): with the skill in a fraction p of *episodes* (validation's scripted stand-in) the mean is
p + (1 - p) * u, where u is the skill-less script's mean (0.06 to 0.28 across families and
targets, test_library.UNSKILLED_MEAN: it earns the plain requests' credit), so the default band
[0.2, 0.6] holds for p in [0.2, 0.4] for every family and target, and the oracle's 1 in 70 % of
samples is above it; with the skill shown per *case* independently (`mixed`) the band holds for
p in [0.4, 0.5]. Easier levels raise u (up to 0.37), so a weaker base lands in the band.

Levels (`ServiceEnv.levels`, hardest first; the baked parameters' `"cases"` picks one, the
hardest when absent) bound the number of capability cases per instance. The number of
requests, their kinds, the mode and which requests may become cases are drawn first, the same
at every level; an easier level turns the other requests plain, so the conversation keeps the
target's length (never shorter) and its mix. Every instance at every level still needs the
skill (the skill-less script never reaches 1, test_library.py). Library mode calibrates the
levels hardest first and keeps the first that passes (candidates.generate_library).

Guidance (`Observation.guidance`, never in the messages) is the oracle's gold actions for the
instance, rendered by `trace_common.env.guidance.gold_actions_text`: the trainer shows it as an
`<expert_guidance>` block in the system prompt of a fraction of a group's rollouts. It must fit
Observation.guidance (GUIDANCE_MAX), so the oracle's messages are short (ids, amounts, statuses)
and an instance too long for it or for the turn budget is redrawn (GUIDANCE_MAX's comment). `oracle()`
and `unskilled()` are action scripts for the current instance: the oracle reaches reward 1; the
unskilled script is what an agent without the skill does (the gap the store's scripted expert
plants for this capability), and handles the plain requests as the oracle does.

The module is bundled into every registered library environment (`library/__init__.py`):
the bundle binds `TARGET_TOOLKIT` to the target's toolkit class (a static import of the
toolkit module, allowed in the sandbox) and `TARGET` to the baked target parameters
({"surface": TargetSurface JSON, "toolkit_sha256": ..., optionally "cases": the level}); in-process
callers pass `target=` and `toolkit=` instead.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from trace_common.env import Environment, Message, MessageAction, Observation, StepResult, ToolAction
from trace_common.env.guidance import gold_actions_text
from trace_common.env.records import ItemView
from trace_common.errors import FailedPrecondition, InvalidArgument

STOP = "###STOP###"
SPLITS: dict[str, range] = {"train": range(0, 100_000), "dev": range(500_000, 500_500),
                            "test": range(1_000_000, 1_000_500)}
#: Tools the library's scripts call, with the arguments they pass (targets.py checks a target has them;
#: modify_user_address's address arguments are the toolkit's, `new_address`).
SCRIPT_TOOLS: dict[str, tuple[str, ...]] = {
    "find_user_id_by_email": ("email",),
    "get_user_details": ("user_id",),
    "get_order_details": ("order_id",),
    "get_product_details": ("product_id",),
    "cancel_pending_order": ("order_id", "reason"),
    "return_delivered_order_items": ("order_id", "item_ids", "payment_method_id"),
    "exchange_delivered_order_items": ("order_id", "item_ids", "new_item_ids", "payment_method_id"),
    "modify_user_address": ("user_id",),
}
#: Tools of request kinds a target may lack (tau2 retail has them, the store does not): those kinds
#: are drawn only for a target whose schema has the tool with these arguments.
OPTIONAL_TOOLS: dict[str, tuple[str, ...]] = {
    "modify_pending_order_items": ("order_id", "item_ids", "new_item_ids", "payment_method_id"),
    "modify_pending_order_address": ("order_id",),
}
#: Used instead of reading each order when the target has it (the store does, tau2 does not).
LIST_ORDERS = "list_user_orders"

#: Request kind -> the tool that carries it out (status: the lookup that answers it).
KIND_TOOL = {"cancel": "cancel_pending_order", "return": "return_delivered_order_items",
             "exchange": "exchange_delivered_order_items", "modify": "modify_pending_order_items",
             "order_address": "modify_pending_order_address", "address": "modify_user_address",
             "status": "get_order_details"}
#: Kinds that write one order (its status must allow it; where the target's toolkit names no
#: required status for the tool -- tau2's modifications -- it is pending).
ORDER_WRITES = ("cancel", "return", "exchange", "modify", "order_address")
SWAPS = ("exchange", "modify")  # an item for another variant of its product
_PENDING = "pending"
#: Statuses that forbid each order write (never 'cancelled': a refusal names a live order).
FORBIDDING = {"cancel": ("processed", "delivered"), "return": ("pending", "processed"),
              "exchange": ("pending", "processed"), "modify": ("processed", "delivered"),
              "order_address": ("processed", "delivered")}
_VERB = {"cancel": "cancelled", "return": "returned", "exchange": "exchanged", "modify": "modified",
         "order_address": "modified"}

#: The target's request mix, measured on its train split; test_library_shape.py recomputes every
#: number from the target's own generator / task file (and fails when one drifts):
#:   store: compound tasks of train seeds 0-3999 (`generate_task`), the request kind of each
#:     sub-request (`base_kind`), the scenario's mode, and the turns of the perfect scripted
#:     expert (`StoreExpert(ExpertConfig.perfect()).plan`, one turn per assistant message);
#:   tau2-retail: the 74 train tasks of split_tasks.json, one request per gold write (cancel,
#:     return, exchange, modify = modify_pending_order_items, order_address =
#:     modify_pending_order_address, address = modify_user_address) plus one information
#:     request (kind status) when the task has communicate_info; 2 transfers and 2 tasks left
#:     with no request are not counted (70 tasks, 145 requests). Mode: all at once when a
#:     task of 2+ requests tells the user to state them together ("mention ... at the same
#:     time / together", "in one go", "all at once"; tau2's simulator otherwise discloses
#:     one thing at a time). Turns: the gold actions, one confirmation per write (the policy's
#:     explicit "yes"), one report per request (all at once: one report).
#: requests: number of requests -> share; kinds: kind -> share of requests; distinct: a task
#: never repeats a kind; all_at_once: share of tasks of 2+ requests stated at once; turns: mean
#: agent turns (all tasks; all_at_once_turns: tasks of 2+ requests, counting one report for all).
#: max_turns is not measured but chosen: the families' turn budget on the target (the store's oracle
#: needs at most 11 turns, tau2 retail's up to 40 -- record selection reads orders one by one -- and
#: the tau2 target itself allows 100).
REQUEST_MIX: dict[str, dict[str, Any]] = {
    "store": {"requests": {2: 0.424, 3: 0.576}, "distinct": True, "all_at_once": 0.670,
              "kinds": {"cancel": 0.226, "return": 0.210, "exchange": 0.212, "status": 0.189, "address": 0.163},
              "turns": 6.36, "all_at_once_turns": 5.82, "max_turns": 24},
    "tau2-retail": {"requests": {1: 0.386, 2: 0.314, 3: 0.186, 4: 0.086, 5: 0.014, 6: 0.014}, "distinct": False,
                    "all_at_once": 0.140,
                    "kinds": {"return": 0.221, "exchange": 0.172, "status": 0.172, "modify": 0.152, "cancel": 0.124,
                              "order_address": 0.110, "address": 0.048},
                    "turns": 8.686, "all_at_once_turns": 9.14, "max_turns": 48},
}
#: Observation.guidance's limit. An instance whose gold actions are longer, or take more than the turn
#: budget less TURN_MARGIN turns (room for the agent's own questions), is rebuilt from the seed's next
#: stream with the same plan (kinds, mode, cases), at most REDRAWS times (`info["redraws"]`). With the
#: budgets of REQUEST_MIX none was redrawn over 2,000 seeds of any family, level and target (the longest
#: gold text 3,508 characters, record selection on tau2); test_library_shape.py checks both paths.
GUIDANCE_MAX = 4000
TURN_MARGIN = 4
REDRAWS = 8
#: The mix a target without a measured one gets (its kinds restricted to those it has tools for).
DEFAULT_MIX = "store"

REPORT_RULE = ("When you have handled a request, tell the user its outcome: the refund or price difference with two "
               "decimals (e.g. 45.00), or, when the order's status does not allow the request, the order's status "
               "next to its order id.")

#: The target's record toolkit class; a bundle rebinds it with a static import after this section.
TARGET_TOOLKIT: Any = None
#: The baked target parameters; a bundle rebinds them at its end, so a family built with no `target`
#: in a bundle gets them. In-process there are none: pass `target` (make_env does).
TARGET: dict[str, Any] | None = None
_TOOLKITS: dict[int, tuple[Any, Any]] = {}


# -- the scenario -------------------------------------------------------------------------------

class Request:
    """One request of an instance: its kind, the record it is about, what the user says, whether it
    is a capability case, and what handling it exactly means (built with the instance):

        gold     = the write action that carries it out (None: no write -- a status question, a refusal)
        tell     = (value, anchor) pairs the user must be told (anchor: the order id's digits, or None)
        sentence = the oracle's report of its outcome
    """

    def __init__(self, kind: str, order_id: str | None, text: str, capability: bool = False, **facts: Any):
        self.kind, self.order_id, self.text, self.capability, self.facts = kind, order_id, text, capability, facts
        self.gold: dict[str, Any] | None = None
        self.tell: list[tuple[str, str | None]] = []
        self.sentence = ""
        self.record: str | None = order_id  # the record its write changes (an order id, or the user's id)


class Instance:
    """One seeded task: the user, the requests, how they are grouped into user messages, the guidance."""

    def __init__(self, user: Any, requests: list[Request], groups: list[list[int]], info: dict[str, Any] | None = None):
        if sorted(i for g in groups for i in g) != list(range(len(requests))) or not all(groups):
            raise ValueError(f"groups {groups} must split the {len(requests)} requests into non-empty messages")
        self.user, self.requests, self.groups = user, requests, groups
        self.info = dict(info or {})
        self.guidance = ""
        hello = f"Hi, I'm {user.first_name} {user.last_name}, my email is {user.email}."
        texts = [self._stated([requests[i] for i in g]) for g in groups]
        self.opening = f"{hello} {texts[0]}"
        self.followups = [f"Thanks. Also: {t}" for t in texts[1:]]

    @staticmethod
    def _stated(requests: list[Request]) -> str:
        if len(requests) == 1:
            return requests[0].text
        return f"I have {len(requests)} requests. " + " ".join(f"{i + 1}) {r.text}" for i, r in enumerate(requests))

    @property
    def cases(self) -> list[Request]:
        """The capability cases."""
        return [r for r in self.requests if r.capability]

    @property
    def mode(self) -> str:
        """all_at_once: one message states every request (2+); sequential: one request per message;
        mixed: a message states several, others one each (an easier multi-step level)."""
        if len(self.groups) == 1 and len(self.requests) >= 2:
            return "all_at_once"
        return "sequential" if all(len(g) == 1 for g in self.groups) else "mixed"


_CONFIRM_WORDS = ("confirm", "proceed", "shall i", "should i", "go ahead", "do you want")


class ScriptedUser:
    """The store's deterministic user protocol (see module docstring)."""

    def __init__(self, inst: Instance):
        self.email = inst.user.email
        self.queue = list(inst.followups)
        self.reactive_left = 2 + len(inst.requests)

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


class Plan:
    """An instance's shape, drawn before anything a level changes (so every level shares it):
    the requests' kinds, how they are grouped into user messages, and the order in which requests
    that can carry the capability become cases (`ranked`: the first `cases` of them do)."""

    def __init__(self, kinds: list[str], groups: list[list[int]], ranked: list[int]):
        self.kinds, self.groups, self.ranked = kinds, groups, ranked


def weighted(rng: random.Random, table: dict[Any, float]) -> Any:
    """One key of `table` drawn with probability proportional to its value (keys in table order)."""
    total = sum(table.values())
    u, acc = rng.random() * total, 0.0
    for key, weight in table.items():
        acc += weight
        if u < acc:
            return key
    return key


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
    """The capability cases per instance the baked parameters allow (`"cases"`), the hardest level when absent."""
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


def turn_budget(target: dict[str, Any] | None) -> int:
    """The families' turn budget on `target` (REQUEST_MIX's max_turns; DEFAULT_MIX's for others). A bundle
    sets its environment's default_max_turns to it once TARGET is bound."""
    name = ((target or {}).get("surface") or {}).get("name")
    return int(REQUEST_MIX.get(name, REQUEST_MIX[DEFAULT_MIX])["max_turns"])


def _phrase(ref: str) -> str:
    """'order #W12345' -- or the loose style's own words ('order number 12345')."""
    return ref if ref.startswith("order") else f"order {ref}"


# -- the environment base -----------------------------------------------------------------------

class ServiceEnv(Environment):
    """Base of the library environments (see module docstring)."""

    capability: ClassVar[str] = ""
    #: The turn budget (`turn_budget(target)`: each instance sets its own, a bundle its class's).
    default_max_turns: ClassVar[int] = 24
    #: Reward of an instance not handled exactly, as a fraction of its mean request credit.
    share: ClassVar[float] = 0.5
    #: Tools the family's scripts call (checked against the target; OPTIONAL_TOOLS are used where present).
    tools_used: ClassVar[tuple[str, ...]] = tuple(SCRIPT_TOOLS)
    #: Capability cases per instance at most, hardest (the default) first (module docstring).
    levels: ClassVar[tuple[int, ...]] = (3, 2, 1)
    #: Request kinds a capability case can have (the others are always plain).
    case_kinds: ClassVar[tuple[str, ...]] = ORDER_WRITES
    #: Fewest requests an instance has (the target's distribution conditioned on at least this many).
    min_requests: ClassVar[int] = 1

    def __init__(self, target: dict[str, Any] | None = None, toolkit: Any = None):
        self.target = check_target(target if target is not None else TARGET)
        self.cases = level_of(self.target, self.levels)
        self.surface = self.target["surface"]
        self.toolkit = toolkit if toolkit is not None else _default_toolkit(self.target)
        self.tool_names = [s["function"]["name"] for s in self.surface["tool_schemas"]]
        self.confirms = "explicit user confirmation" in self.surface["system_prompt"].lower()
        self.mix = self.request_mix()
        self.default_max_turns = turn_budget(self.target)  # type: ignore[misc]
        self.inst: Instance | None = None

    # -- subclass API ---------------------------------------------------------------------
    def build_case(self, world: Any, user: Any, kind: str, index: int) -> Request:
        """Capability case `index` (counting cases from 0) of kind `kind`, added to `world`."""
        raise NotImplementedError

    def credit(self, case: Request) -> tuple[float, str | None]:
        raise NotImplementedError

    def oracle_case(self, case: Request) -> tuple[list[dict[str, Any]], str | None]:
        raise NotImplementedError

    def unskilled_case(self, case: Request) -> tuple[list[dict[str, Any]], str | None]:
        raise NotImplementedError

    def prepare(self, world: Any, user: Any, plan: Plan, cases: list[int]) -> None:
        """Hook before any request is built (e.g. reserve the products cases designate)."""

    def finish(self, world: Any, user: Any) -> None:
        """Hook after every request is built (default: shuffle the user's order list)."""
        self.shuffle_orders(world, user.user_id)

    def addendum(self) -> str:
        """The capability addendum after the target's system prompt: the reporting rule the
        reward checks, unless the target's prompt already states it (it asks for amounts "with
        two decimals", as the store's policy does)."""
        if "two decimals" in self.surface["system_prompt"]:
            return ""
        return REPORT_RULE

    # -- the target's request mix -----------------------------------------------------------
    def kind_available(self, kind: str) -> bool:
        """The target has the tool a kind needs, with the arguments the scripts pass."""
        tool = KIND_TOOL[kind]
        if tool not in self.tool_names:
            return False
        if kind in ("address", "order_address") and not hasattr(self.toolkit, "new_address"):
            return False
        schema = next(s for s in self.surface["tool_schemas"] if s["function"]["name"] == tool)
        props = set((schema["function"].get("parameters") or {}).get("properties") or {})
        return set(SCRIPT_TOOLS.get(tool, OPTIONAL_TOOLS.get(tool, ()))) <= props

    def request_mix(self) -> dict[str, Any]:
        """The target's measured mix (REQUEST_MIX; DEFAULT_MIX for a target without one), restricted
        to the kinds this target has tools for and to instances of at least `min_requests` requests."""
        mix = REQUEST_MIX.get(self.surface.get("name"), REQUEST_MIX[DEFAULT_MIX])
        kinds = {k: w for k, w in mix["kinds"].items() if self.kind_available(k)}
        requests = {n: w for n, w in mix["requests"].items() if n >= self.min_requests}
        if mix["distinct"]:
            requests = {n: w for n, w in requests.items() if n <= len(kinds)}
        if not requests or not set(kinds) & set(self.case_kinds):
            raise FailedPrecondition(f"target {self.surface.get('name')!r} has tools for the request kinds "
                                     f"{sorted(kinds)}, none of which a {self.capability} case can have "
                                     f"({', '.join(self.case_kinds)}); use GENERATION_MODE_LLM for it")
        return {**mix, "kinds": kinds, "requests": requests}

    def draw_plan(self, rng: random.Random) -> Plan:
        """The number of requests, then their kinds (redrawn from the same generator until at least one
        can be a capability case, so the number keeps the target's distribution), then the mode."""
        mix = self.mix
        n = weighted(rng, mix["requests"])
        while True:
            pool = dict(mix["kinds"])
            kinds = []
            for _ in range(n):
                kind = weighted(rng, pool)
                kinds.append(kind)
                if mix["distinct"] or kind == "address":  # one address change: two would write one record
                    del pool[kind]
            eligible = [i for i, k in enumerate(kinds) if k in self.case_kinds]
            if eligible:
                break
        at_once = n >= 2 and rng.random() < mix["all_at_once"]
        rng.shuffle(eligible)
        return Plan(kinds, [list(range(n))] if at_once else [[i] for i in range(n)], eligible)

    def chosen_cases(self, plan: Plan) -> list[int]:
        """The requests that are capability cases at this level: the first `cases` of the ranked ones."""
        return sorted(plan.ranked[:self.cases])

    # -- building requests ------------------------------------------------------------------
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

    def required(self, kind: str) -> str:
        """The status an order write of `kind` needs (the target's, pending for tau2's modifications)."""
        return self.toolkit.required_status.get(KIND_TOOL[kind], _PENDING)

    def new_view(self, row: Any, variant: Any) -> ItemView:
        """The order line `row` as it would read with `variant` instead (for describing the new item)."""
        return ItemView(item_id=variant.item_id, product_id=row.product_id, name=row.name,
                        options=tuple(variant.options), price=variant.price, option_names=row.option_names)

    def works(self, world: Any, action: dict[str, Any]) -> bool:
        """The target's tool accepts `action` on the world as built so far (a dry run on a copy)."""
        return self.toolkit.call(self.toolkit.copy(world.db), action["name"], dict(action["arguments"])).ok

    def text_for(self, kind: str, ref: str, order: Any = None, facts: dict[str, Any] | None = None,
                 reason_words: str | None = None) -> str:
        """What the user says for a request designating its order as `ref` (the store's phrasings)."""
        facts = facts or {}
        if kind == "cancel":
            return (f"Please cancel {_phrase(ref)}, {reason_words}." if reason_words
                    else f"Please cancel {_phrase(ref)}. Reason: {facts['reason']}.")
        if kind == "return":
            row = next(i for i in order.items if i.item_id == facts["item_id"])
            return f"Return the {row.name} from {_phrase(ref)}."
        if kind in SWAPS:
            verb = "Exchange" if kind == "exchange" else "Change"
            link = "for" if kind == "exchange" else "to"
            return f"{verb} the {facts['spoken']} from {_phrase(ref)} {link} the {facts['new_spoken']}."
        if kind == "status":
            return f"What is the status of {_phrase(ref)}?"
        if kind == "order_address":
            return f"Please ship {_phrase(ref)} to {facts['spoken_address']} instead."
        raise AssertionError(kind)

    def by_id(self, world: Any, user: Any, kind: str, status: str | None = None, exclude: Sequence[str] = (),
              capability: bool = False, reason_words: str | None = None, **extra: Any) -> Request:
        """A request about an order the user gives by its exact id (`restate` writes it otherwise), whose status
        is `status` (by default one that allows the request): the target's plain sub-request. A swap's
        new variant is one the target's tool accepts for this order (a dry run: tau2 refuses a price
        difference larger than a gift card's balance); an order no variant fits stays as noise."""
        tk, rng = self.toolkit, world.rng
        if kind == "address":
            args, spoken = tk.new_address(world, user.user_id)
            req = Request(kind, None, f"Update my address to {spoken}.", capability, user_id=user.user_id,
                          address=args, spoken_address=spoken, **extra)
            return self.finish_request(req)
        if status is None:
            status = rng.choice(("pending", "processed", "delivered")) if kind == "status" else self.required(kind)
        for _ in range(20):
            facts: dict[str, Any] = dict(extra)
            if kind in SWAPS:
                product = rng.choice([p for p in self.catalog if p.product_id not in exclude and len(p.variants) >= 2])
                old = rng.choice(product.variants)
                news = [v for v in product.variants if v.available and v.item_id != old.item_id]
                if not news:
                    continue
                rng.shuffle(news)
                lines = [(product.product_id, old.item_id),
                         *self.pick_lines(world, rng.randint(0, 1), exclude=(*exclude, product.product_id))]
                order = tk.add_order(world, user.user_id, status, lines)
                row = order.items[0]
                facts.update(item_id=row.item_id, product_id=product.product_id, spoken=tk.describe_item(row))
                options = [dict(facts, new_item_id=v.item_id, new_spoken=tk.describe_item(self.new_view(row, v)))
                           for v in news]
            else:
                count = rng.randint(1, 3) if kind == "return" else rng.randint(1, 2)
                order = tk.add_order(world, user.user_id, status, self.pick_lines(world, count, exclude))
                if kind == "cancel":
                    facts["reason"] = facts.get("reason") or rng.choice(tk.cancel_reasons)
                elif kind == "return":
                    facts["item_id"] = rng.choice(order.items).item_id
                elif kind == "order_address":
                    args, spoken = tk.new_address(world, user.user_id)
                    facts.update(address=args, spoken_address=spoken)
                options = [facts]
            allowed = kind not in ORDER_WRITES or status == self.required(kind)
            for option in options:
                text = self.text_for(kind, order.order_id, order, option, reason_words)
                req = Request(kind, order.order_id, text, capability, status=status, allowed=allowed,
                              ref=order.order_id, **option)
                self.finish_request(req, order)
                if req.gold is None or self.works(world, req.gold):
                    return req
        raise FailedPrecondition(f"could not build a workable {kind} request in this target's world")

    def restate(self, world: Any, req: Request, ref: str, reason_words: str | None = None) -> Request:
        """`req` as the user says it with its order written as `ref` (and a cancel reason in their words)."""
        req.facts["ref"] = ref
        req.text = self.text_for(req.kind, ref, self.toolkit.order(world.db, req.order_id), req.facts, reason_words)
        return req

    def finish_request(self, req: Request, order: Any = None) -> Request:
        """Fill in `gold`, `tell`, `sentence` and `record` from the request's facts and its order."""
        if req.kind == "address":
            req.record = req.facts["user_id"]
            req.gold = self.act("modify_user_address", user_id=req.facts["user_id"], **req.facts["address"])
            req.sentence = f"Your address is now {req.facts['spoken_address']}."
            return req
        oid = req.order_id
        if req.kind == "status":
            req.tell = [(order.status, oid[2:])]
            req.sentence = f"Order {oid} is {order.status}."
            return req
        if not req.facts["allowed"]:
            req.tell = [(order.status, oid[2:])]
            req.sentence = self.refusal_sentence(order, req.kind)
            return req
        req.gold = self.write_action(req, order)
        req.tell = [(v, None) for v in self.outcome_values(req, order)]
        req.sentence = self.write_sentence(req, order)
        return req

    # -- writes and what is said about them ---------------------------------------------------
    def act(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return {"name": tool, "arguments": arguments}

    def confirm(self, summary: str) -> list[dict[str, Any]]:
        """An explicit yes/no question before a write, for targets whose policy demands one."""
        return [{"message": f"Please confirm (yes/no): {summary}?"}] if self.confirms else []

    def money(self, cents: int) -> str:
        return self.toolkit.money(cents)

    def _swap(self, req: Request, order: Any, item_id: str | None = None) -> tuple[Any, Any, int]:
        """(old line, new variant, price difference in cents) of a swap request on `order`."""
        row = next(i for i in order.items if i.item_id == (item_id or req.facts["item_id"]))
        product = next(p for p in self.catalog if p.product_id == row.product_id)
        new = next(v for v in product.variants if v.item_id == req.facts["new_item_id"])
        return row, new, new.price - row.price

    def write_action(self, req: Request, order: Any, item_id: str | None = None,
                     reason: str | None = None) -> dict[str, Any]:
        """The write carrying out `req` on `order` (the request's item and reason unless given)."""
        oid, pm = order.order_id, order.payment_method_id
        if req.kind == "cancel":
            return self.act("cancel_pending_order", order_id=oid, reason=reason or req.facts["reason"])
        if req.kind == "return":
            return self.act("return_delivered_order_items", order_id=oid, item_ids=[item_id or req.facts["item_id"]],
                            payment_method_id=pm)
        if req.kind in SWAPS:
            return self.act(KIND_TOOL[req.kind], order_id=oid, item_ids=[item_id or req.facts["item_id"]],
                            new_item_ids=[req.facts["new_item_id"]], payment_method_id=pm)
        if req.kind == "order_address":
            return self.act("modify_pending_order_address", order_id=oid, **req.facts["address"])
        raise AssertionError(req.kind)

    def outcome_values(self, req: Request, order: Any, item_id: str | None = None) -> list[str]:
        """The amounts the user must be told for a write: the refund, or the price difference."""
        if req.kind == "cancel":
            return [self.money(order.total)]
        if req.kind == "return":
            return [self.money(next(i.price for i in order.items if i.item_id == (item_id or req.facts["item_id"])))]
        if req.kind in SWAPS:
            return [self.money(abs(self._swap(req, order, item_id)[2]))]
        return []

    def write_sentence(self, req: Request, order: Any, item_id: str | None = None) -> str:
        oid, pm = order.order_id, order.payment_method_id
        if req.kind == "cancel":
            return f"Order {oid} is cancelled; refund {self.money(order.total)} to {pm}."
        if req.kind == "return":
            row = next(i for i in order.items if i.item_id == (item_id or req.facts["item_id"]))
            return f"Return of the {row.name} from order {oid} is requested; refund {self.money(row.price)} to {pm}."
        if req.kind in SWAPS:
            row, new, diff = self._swap(req, order, item_id)
            direction = "charged to" if diff >= 0 else "refunded to"
            what = (f"Exchange of item {row.item_id} for item {new.item_id} in order {oid} is requested"
                    if req.kind == "exchange" else f"Item {row.item_id} in order {oid} is changed to item {new.item_id}")
            return f"{what}; price difference {self.money(abs(diff))} {direction} {pm}."
        if req.kind == "order_address":
            return f"Order {oid} will now ship to {req.facts['spoken_address']}."
        raise AssertionError(req.kind)

    def summary(self, action: dict[str, Any]) -> str:
        """What a confirmation question says the write will do (the tool call carries the rest)."""
        a = action["arguments"]
        name = action["name"]
        if name == "cancel_pending_order":
            return f"cancel order {a['order_id']} (reason: {a['reason']})"
        if name == "modify_user_address":
            return "update your address"
        if name == "modify_pending_order_address":
            return f"change the shipping address of order {a['order_id']}"
        items = ", ".join(a["item_ids"])
        if name == "exchange_delivered_order_items":
            return f"exchange item {items} of order {a['order_id']} for item {', '.join(a['new_item_ids'])}"
        if "new_item_ids" in a:
            return f"change item {items} of order {a['order_id']} to item {', '.join(a['new_item_ids'])}"
        return f"return item {items} of order {a['order_id']} to {a['payment_method_id']}"

    def write_with_confirm(self, action: dict[str, Any]) -> list[dict[str, Any]]:
        return self.confirm(self.summary(action)) + [action]

    def refusal_sentence(self, order: Any, kind: str) -> str:
        return (f"Order {order.order_id} is {order.status}, so it cannot be {_VERB[kind]}; only "
                f"{self.required(kind)} orders can be.")

    def plain_actions(self, req: Request) -> tuple[list[dict[str, Any]], str]:
        """How the oracle (and the store's expert) handles a request given by its exact id: look the order
        up (a swap also reads the product's variants), then write after confirming -- or, for a status
        the request does not allow, refuse naming it."""
        if req.kind == "address":
            return self.write_with_confirm(req.gold), req.sentence
        acts = [self.act("get_order_details", order_id=req.order_id)]
        if req.gold is None:
            return acts, req.sentence
        if req.kind in SWAPS:
            acts.append(self.act("get_product_details", product_id=req.facts["product_id"]))
        return acts + self.write_with_confirm(req.gold), req.sentence

    # -- reading the episode --------------------------------------------------------------------
    def order0(self, order_id: str) -> Any:
        """The order as the instance began (the pristine world)."""
        return self.toolkit.order(self.world_db, order_id)

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

    def done_exactly(self, req: Request) -> bool:
        """The request's record was written exactly once, by its gold write with the gold arguments
        (none attempted for a request without one -- a status question, a refusal)."""
        writes = [c for c in self.calls if c.write is not None and c.write == req.record]
        if req.gold is None:
            return not writes and not (req.order_id and self.write_attempts(req.order_id))
        return (len(writes) == 1 and writes[0].name == req.gold["name"]
                and writes[0].args == req.gold["arguments"])

    def told_outcome(self, req: Request) -> bool:
        return all(told(self.texts, value, anchor) for value, anchor in req.tell)

    def handled(self, req: Request) -> bool:
        return self.done_exactly(req) and self.told_outcome(req)

    def plain_credit(self, req: Request) -> tuple[float, str | None]:
        if self.handled(req):
            return 1.0, None
        return 0.0, "not carried out exactly with its outcome told"

    def addressed(self, req: Request) -> bool:
        """Some call was about the request's record (a lookup or a write attempt)."""
        if req.kind == "address":
            return any(c.name == "modify_user_address" for c in self.calls)
        return any(c.args.get("order_id") == req.order_id for c in self.calls)

    def event(self, event: str, **detail: Any) -> None:
        self.events.append({"capability": self.capability, "event": event, "turn": self.turn, "detail": detail})

    # -- Environment API ------------------------------------------------------------------
    def splits(self) -> dict[str, Sequence[int]]:
        return dict(SPLITS)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.surface["tool_schemas"])

    def system_prompt(self) -> str:
        extra = self.addendum()
        return self.surface["system_prompt"] + (f"\n\n{extra}" if extra else "")

    def build(self, world: Any, plan: Plan) -> Instance:
        """The instance of `plan` (shared by every level and every redraw): the neighbour, the user, each
        request (a case from the family's generator, or plain), then the family's finishing touches."""
        cases = self.chosen_cases(plan)
        self.add_neighbour(world)
        user = self.toolkit.add_user(world)
        self.prepare(world, user, plan, cases)
        requests = []
        for index, kind in enumerate(plan.kinds):
            if index in cases:
                requests.append(self.build_case(world, user, kind, cases.index(index)))
            else:
                requests.append(self.by_id(world, user, kind, exclude=self.reserved))
        self.add_fillers(world, user.user_id, world.rng.randint(0, 2), exclude=self.reserved)
        self.finish(world, user)
        return Instance(user, requests, self.groups_for(plan, cases),
                        info={"case_indices": cases})

    def groups_for(self, plan: Plan, cases: list[int]) -> list[list[int]]:
        """How the requests are grouped into user messages (default: the plan's mode)."""
        return plan.groups

    def world_for(self, seed: int, attempt: int = 0) -> Any:
        """The world of `seed`: the catalog the target's toolkit draws for that number (tau2's is
        db.json's, the same for all), then the family's own stream -- the generator reseeded in place,
        so the toolkit's id pools follow it -- for users, orders and requests, never those of the
        target's task of that number."""
        world = self.toolkit.new_world(random.Random(seed))
        world.rng.seed(f"{self.name}:{attempt}:{world.rng.random()!r}")
        return world

    def reset(self, seed: int) -> Observation:
        seed = self.check_seed(seed)
        self._seed = seed
        plan = None
        for attempt in range(REDRAWS + 1):  # the next stream when the gold actions would not fit (module docstring)
            world = self.world_for(seed, attempt)
            plan = plan or self.draw_plan(world.rng)  # the first stream's plan: the same at every level
            self.world_db = world.db
            self.catalog = self.toolkit.products(world.db)
            self.reserved: tuple[str, ...] = ()
            self.inst = self.build(world, plan)
            gold = self.oracle()
            self.inst.guidance = gold_actions_text(gold)
            self.inst.info["redraws"] = attempt
            if len(self.inst.guidance) <= GUIDANCE_MAX and len(gold) <= self.default_max_turns - TURN_MARGIN:
                break
        else:
            raise FailedPrecondition(f"seed {self._seed}: no draw of {REDRAWS + 1} fits its gold actions in "
                                     f"{GUIDANCE_MAX} characters of guidance and "
                                     f"{self.default_max_turns - TURN_MARGIN} turns")
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
        return Observation(messages=messages, task_id=str(self._seed), seed=self._seed, tools=self.tool_schemas(),
                           info={"capability": self.capability, "mode": self.inst.mode,
                                 "requests": [r.kind for r in self.inst.requests],
                                 "cases": [r.kind for r in self.inst.cases], **self.inst.info},
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
        requests = self.inst.requests
        credits = [self.credit(r) if r.capability else self.plain_credit(r) for r in requests]
        allowed = {r.record for r in requests if r.gold is not None}
        stray = sorted(self.written() - allowed)
        values = [v for v, _ in credits]
        mean = sum(values) / len(values)
        exact = all(v >= 1.0 for v in values) and not stray
        reward = 1.0 if exact else self.share * mean
        reasons = [f"request {i + 1} ({'case' if r.capability else 'plain'} {r.kind} {r.record}): {why}"
                   for i, (r, (_, why)) in enumerate(zip(requests, credits, strict=True)) if why]
        if stray:
            reasons.insert(0, f"unrequested write on {', '.join(stray)}")
        case_values = [v for r, v in zip(requests, values, strict=True) if r.capability]
        plain_values = [v for r, v in zip(requests, values, strict=True) if not r.capability]
        breakdown = {"requests_exact": sum(v >= 1.0 for v in values) / len(values),
                     "cases_exact": sum(v >= 1.0 for v in case_values) / len(case_values) if case_values else 1.0,
                     "plain_exact": sum(v >= 1.0 for v in plain_values) / len(plain_values) if plain_values else 1.0,
                     "credit": mean, "unrequested_writes": float(len(stray))}
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
        per capability case, in request order): `oracle_case` there, `unskilled_case` elsewhere, the
        plain requests as the oracle handles them; one report per user message. A case handler may
        return (no actions, None) to leave its case out (e.g. a request the agent overlooks)."""
        cases = self.inst.cases
        if len(skills) != len(cases):
            raise InvalidArgument(field="skills", expected=f"{len(cases)} flags, one per capability case",
                                  got=len(skills))
        flag = {id(c): s for c, s in zip(cases, skills, strict=True)}
        self.script_state: dict[str, Any] = {}
        acts = [self.act("find_user_id_by_email", email=self.inst.user.email)]
        if LIST_ORDERS not in self.tool_names:  # no order listing (tau2): read the profile and its order ids,
            acts.append(self.act("get_user_details", user_id=self.inst.user.user_id))  # as tau2's gold often does
            self.script_state["seen"] = {"get_user_details"}
        for group in self.inst.groups:
            report = []
            for position, index in enumerate(group):
                req = self.inst.requests[index]
                self.script_state["position"] = position
                if not req.capability:
                    calls, sentence = self.plain_actions(req)
                else:
                    calls, sentence = (self.oracle_case if flag[id(req)] else self.unskilled_case)(req)
                acts += calls
                if sentence is not None:
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
