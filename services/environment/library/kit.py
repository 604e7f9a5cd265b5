"""Shared machinery of TRACE's reference capability environments (the environment library).

A reference environment is a small, seeded customer-service world that exercises one
capability with the *target's* tools: the same tool names and argument shapes, the same
id formats, the same tool-output style and the same system-prompt format, so what a policy
learns there is what it needs on the target. This module holds what the four families
share:

- `World`: seeded users, products (variants with options and prices) and orders, with ids
  in the target's formats (store: '#W12345', 5-digit items; tau2 retail: '#W1234567',
  10-digit items...). Prices are integer cents whose last digit is never 0, so a price has
  one spelling ('45.17' in text and in JSON).
- `ToolBox`: the target-shaped tools (find user by email, user details, order details,
  cancel a pending order, return delivered items) over that world, in the target's output
  style (`store`: terse text lines; `tau2`: JSON records and tau2's error texts). Each
  call is logged with whether it was malformed (an id not in canonical form, a reason
  outside the enum, a missing or unknown argument) and whether it violated a precondition.
- `ScriptedUser`: the store's deterministic user protocol: a question asking to confirm
  gets "yes", a question asking for the email gets it, anything else is the agent's final
  report and ends the episode ("###STOP###").
- `ServiceEnv`: the `Environment` around them. Subclasses (one per capability) implement
  `build` (the seeded instance), `score` (the algorithmic reward), `oracle` and
  `unskilled` (action scripts) and `policy_lines`.

The module is *bundled* into every registered library environment (see
`library/__init__.py`), so a registered `env.py` is self-contained: it imports only the
standard library and `trace_common.env`, and the target parameters are baked in as the
module constant `TARGET`.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from trace_common.env import Environment, Message, MessageAction, Observation, StepResult, ToolAction
from trace_common.errors import FailedPrecondition, InvalidArgument

STOP = "###STOP###"
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
REASON_PARAPHRASES = {
    "no longer needed": ("I don't need it anymore", "I no longer need it", "I changed my mind about it"),
    "ordered by mistake": ("I ordered it by accident", "I bought it by mistake", "it was an accidental order"),
}
#: Tool roles the library uses -> the arguments the kit implements for each.
ROLE_ARGS: dict[str, tuple[str, ...]] = {
    "find_user": ("email",),
    "get_user": ("user_id",),
    "get_order": ("order_id",),
    "cancel": ("order_id", "reason"),
    "return_items": ("order_id", "item_ids", "payment_method_id"),
}
WRITE_ROLES = ("cancel", "return_items")

CATALOG: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    ("t-shirt", (("color", ("red", "blue", "white", "black")), ("size", ("S", "M", "L", "XL")))),
    ("kettle", (("color", ("black", "white", "red", "green")), ("capacity", ("1L", "1.7L")))),
    ("backpack", (("color", ("black", "blue", "green", "grey")), ("size", ("small", "large")))),
    ("desk lamp", (("color", ("black", "white", "blue")), ("power", ("battery", "USB", "AC")))),
    ("water bottle", (("color", ("blue", "red", "green", "pink")), ("capacity", ("500ml", "750ml", "1L")))),
    ("headphones", (("color", ("black", "white", "silver")), ("type", ("wired", "wireless")))),
    ("sneakers", (("color", ("white", "black", "red")), ("size", ("8", "9", "10")))),
    ("mug", (("color", ("white", "blue", "yellow")), ("material", ("ceramic", "glass")))),
)
FIRST_NAMES = ("emma", "liam", "olivia", "noah", "ava", "mason", "mia", "lucas", "sofia", "ethan", "yara", "omar",
               "lena", "ivan", "nora", "raj", "chen", "aisha", "diego", "hana")
LAST_NAMES = ("smith", "lee", "garcia", "khan", "muller", "rossi", "silva", "kim", "novak", "brown", "ito",
              "dubois", "patel", "jones", "costa", "berg", "ali", "moreau", "nagy", "park")
PAYMENT_KINDS = ("credit_card", "paypal", "gift_card")
SPLITS: dict[str, range] = {"train": range(0, 100_000), "dev": range(500_000, 500_500),
                            "test": range(1_000_000, 1_000_500)}


def money(cents: int) -> str:
    """Cents -> '45.17'."""
    return f"{cents // 100}.{cents % 100:02d}"


def spoken(name: str, options: dict[str, str]) -> str:
    """How a user names an item: 't-shirt with color red and size L'."""
    parts = [f"{dim} {value}" for dim, value in options.items()]
    return f"{name} with {' and '.join(parts)}"


# -- the world ----------------------------------------------------------------------------------

class World:
    """Seeded records in the target's id formats. `db` = {users, orders, products} (JSON-able)."""

    def __init__(self, rng: random.Random, formats: dict[str, int]):
        self.rng = rng
        self.fmt = formats
        self.used: set[str] = set()
        self.db: dict[str, dict[str, Any]] = {"users": {}, "orders": {}, "products": {}}

    def digits(self, n: int) -> str:
        while True:
            value = str(self.rng.randint(1, 9)) + "".join(str(self.rng.randint(0, 9)) for _ in range(n - 1))
            if value not in self.used:
                self.used.add(value)
                return value

    def price(self, base: int) -> int:
        cents = base + self.rng.randint(-400, 400)
        return cents - (cents % 10) + self.rng.randint(1, 9)  # last digit never 0

    def product(self, index: int) -> dict[str, Any]:
        name, dims = CATALOG[index]
        pid = self.digits(self.fmt["product_digits"])
        base = self.rng.randint(1500, 15000)
        variants: dict[str, Any] = {}
        for values in itertools.product(*[vals for _, vals in dims]):
            item_id = self.digits(self.fmt["item_digits"])
            variants[item_id] = {"item_id": item_id, "options": {d: v for (d, _), v in zip(dims, values, strict=True)},
                                 "price": self.price(base), "available": self.rng.random() < 0.8}
        product = {"product_id": pid, "name": name, "variants": variants}
        self.db["products"][pid] = product
        return product

    def user(self) -> dict[str, Any]:
        first, last = self.rng.choice(FIRST_NAMES), self.rng.choice(LAST_NAMES)
        user_id = f"{first}_{last}_{self.digits(self.fmt['user_digits'])}"
        kinds = self.rng.sample(PAYMENT_KINDS, self.rng.randint(1, 2))
        user = {"user_id": user_id, "first": first, "last": last,
                "email": f"{first}.{last}{self.rng.randint(100, 999)}@example.com",
                "payment_methods": [f"{k}_{self.digits(self.fmt['payment_digits'])}" for k in kinds], "orders": []}
        self.db["users"][user_id] = user
        return user

    def order(self, user: dict[str, Any], status: str, lines: Sequence[tuple[dict[str, Any], str]]) -> dict[str, Any]:
        order_id = "#W" + self.digits(self.fmt["order_digits"])
        items = []
        for product, item_id in lines:
            variant = product["variants"][item_id]
            items.append({"item_id": item_id, "product_id": product["product_id"], "name": product["name"],
                          "options": dict(variant["options"]), "price": variant["price"]})
        order = {"order_id": order_id, "user_id": user["user_id"], "status": status,
                 "payment_method_id": self.rng.choice(user["payment_methods"]), "items": items}
        self.db["orders"][order_id] = order
        user["orders"].append(order_id)
        return order

    def random_lines(self, products: Sequence[dict[str, Any]], count: int) -> list[tuple[dict[str, Any], str]]:
        chosen = self.rng.sample(list(products), min(count, len(products)))
        return [(p, self.rng.choice(sorted(p["variants"]))) for p in chosen]


def order_total(order: dict[str, Any]) -> int:
    return sum(row["price"] for row in order["items"])


# -- tools --------------------------------------------------------------------------------------

class Outcome:
    """One tool call's result: text shown to the agent, ok, and why it failed (if it did)."""

    def __init__(self, text: str, ok: bool = True, malformed: str | None = None, violation: str | None = None,
                 write: str | None = None):
        self.text, self.ok, self.malformed, self.violation, self.write = text, ok, malformed, violation, write


class ToolBox:
    """The target-shaped tools over a world's `db` (see module docstring)."""

    def __init__(self, db: dict[str, Any], style: str, formats: dict[str, int]):
        self.db, self.style = db, style
        def digits(key: str) -> str:
            return r"\d{" + str(int(formats[key])) + "}"
        self.patterns = {
            "order_id": re.compile(r"^#W" + digits("order_digits") + "$"),
            "item_id": re.compile("^" + digits("item_digits") + "$"),
            "user_id": re.compile(r"^[a-z]+_[a-z]+_" + digits("user_digits") + "$"),
            "payment_method_id": re.compile(r"^(credit_card|paypal|gift_card)_" + digits("payment_digits") + "$"),
            "email": re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]+$"),
        }
        self.examples = {"order_id": "#W" + "1234567890"[: formats["order_digits"]],
                         "item_id": "1234567890"[: formats["item_digits"]]}

    # rendering
    def _json(self, value: Any) -> str:
        return json.dumps(value)

    def render_order(self, order: dict[str, Any]) -> str:
        if self.style == "tau2":
            out = {"order_id": order["order_id"], "user_id": order["user_id"],
                   "items": [{"name": r["name"], "product_id": r["product_id"], "item_id": r["item_id"],
                              "price": r["price"] / 100, "options": r["options"]} for r in order["items"]],
                   "status": order["status"],
                   "payment_history": [{"transaction_type": "payment", "amount": order_total(order) / 100,
                                        "payment_method_id": order["payment_method_id"]}]}
            for key in ("cancel_reason", "return_items"):
                if key in order:
                    out[key] = order[key]
            if "refund" in order:
                out["payment_history"].append({"transaction_type": "refund", "amount": order["refund"] / 100,
                                               "payment_method_id": order["payment_method_id"]})
            return self._json(out)
        items = "; ".join(f"{r['item_id']} {r['name']} ({', '.join(r['options'].values())}) {money(r['price'])}"
                          for r in order["items"])
        return f"order {order['order_id']} {order['status']}, paid {order['payment_method_id']}: {items} " \
               f"(user {order['user_id']})"

    def render_user(self, user: dict[str, Any]) -> str:
        if self.style == "tau2":
            return self._json({"user_id": user["user_id"],
                               "name": {"first_name": user["first"].title(), "last_name": user["last"].title()},
                               "email": user["email"],
                               "payment_methods": {pm: {"source": pm.rsplit("_", 1)[0], "id": pm}
                                                   for pm in user["payment_methods"]},
                               "orders": list(user["orders"])})
        return f"user {user['user_id']}: {user['first'].title()} {user['last'].title()}, email {user['email']}; " \
               f"payment methods: {', '.join(user['payment_methods'])}; orders: {', '.join(user['orders']) or 'none'}"

    # checks
    def _err(self, store_text: str, tau2_text: str, **kw: Any) -> Outcome:
        return Outcome(f"Error: {tau2_text if self.style == 'tau2' else store_text}", ok=False, **kw)

    def check_args(self, role: str, name: str, args: dict[str, Any]) -> Outcome | None:
        expected = ROLE_ARGS[role]
        for arg in args:
            if arg not in expected:
                return self._err(f"{arg} is not an argument of {name}; expected only {', '.join(expected)}",
                                 f"RetailTools.{name}() got an unexpected keyword argument '{arg}'",
                                 malformed=f"unknown argument {arg}")
        missing = [a for a in expected if a not in args]
        if missing:
            return self._err(f"missing required argument '{missing[0]}'",
                             f"RetailTools.{name}() missing {len(missing)} required positional argument"
                             f"{'s' if len(missing) > 1 else ''}: {', '.join(repr(a) for a in missing)}",
                             malformed=f"missing argument {missing[0]}")
        for arg in expected:
            value = args[arg]
            if arg == "item_ids":
                if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                    return self._err(f"{arg} must be a non-empty list of item id strings",
                                     "Some item not found", malformed=f"{arg} not a list of strings")
                bad = [v for v in value if not self.patterns["item_id"].match(v)]
                if bad:
                    return self._err(f"item id '{bad[0]}' is invalid: expected {self.examples['item_id']}-style digits",
                                     "Some item not found", malformed=f"item id {bad[0]!r}")
                continue
            if not isinstance(value, str):
                return self._err(f"{arg} must be a string", f"{arg} must be a string", malformed=f"{arg} type")
            if arg == "reason" and value not in CANCEL_REASONS:
                return self._err("reason must be exactly 'no longer needed' or 'ordered by mistake'", "Invalid reason",
                                 malformed=f"reason {value!r}")
            pattern = self.patterns.get(arg)
            if pattern is not None and not pattern.match(value if arg != "email" else value.strip().lower()):
                not_found = {"order_id": "Order not found", "user_id": "User not found",
                             "payment_method_id": "Payment method not found", "email": "User not found"}[arg]
                hint = f"e.g. '{self.examples['order_id']}'" if arg == "order_id" else "as shown by the tools"
                return self._err(f"{arg} '{value}' is invalid: expected the canonical form, {hint}", not_found,
                                 malformed=f"{arg} {value!r}")
        return None

    # tools
    def call(self, role: str, name: str, args: dict[str, Any]) -> Outcome:
        bad = self.check_args(role, name, args)
        if bad is not None:
            if role == "cancel" and self.style == "tau2" and bad.malformed and bad.malformed.startswith("reason"):
                # tau2 checks the order's status before the reason
                order = self.db["orders"].get(args.get("order_id"))
                if order is not None and order["status"] != "pending":
                    return self._status_error(role, order)
            return bad
        return getattr(self, f"_{role}")(args)

    def _status_error(self, role: str, order: dict[str, Any]) -> Outcome:
        need = "pending" if role == "cancel" else "delivered"
        verb = "cancelled" if role == "cancel" else "returned"
        tau2 = "Non-pending order cannot be cancelled" if role == "cancel" else "Non-delivered order cannot be returned"
        return self._err(f"order {order['order_id']} is {order['status']}; only {need} orders can be {verb}", tau2,
                         violation=f"{role} on a {order['status']} order", write=order["order_id"])

    def _find_user(self, a: dict[str, Any]) -> Outcome:
        email = a["email"].strip().lower()
        for user_id in sorted(self.db["users"]):
            if self.db["users"][user_id]["email"] == email:
                return Outcome(user_id if self.style == "tau2" else f"user_id: {user_id}")
        return self._err(f"no user with email {a['email']}", "User not found")

    def _get_user(self, a: dict[str, Any]) -> Outcome:
        user = self.db["users"].get(a["user_id"])
        if user is None:
            return self._err(f"user {a['user_id']} not found", "User not found")
        return Outcome(self.render_user(user))

    def _get_order(self, a: dict[str, Any]) -> Outcome:
        order = self.db["orders"].get(a["order_id"])
        if order is None:
            return self._err(f"order {a['order_id']} not found", "Order not found")
        return Outcome(self.render_order(order))

    def _cancel(self, a: dict[str, Any]) -> Outcome:
        order = self.db["orders"].get(a["order_id"])
        if order is None:
            return self._err(f"order {a['order_id']} not found", "Order not found")
        if order["status"] != "pending":
            return self._status_error("cancel", order)
        order.update(status="cancelled", cancel_reason=a["reason"], refund=order_total(order))
        if self.style == "tau2":
            return Outcome(self.render_order(order), write=order["order_id"])
        return Outcome(f"order {order['order_id']} cancelled; refund {money(order['refund'])} to "
                       f"{order['payment_method_id']}", write=order["order_id"])

    def _return_items(self, a: dict[str, Any]) -> Outcome:
        order = self.db["orders"].get(a["order_id"])
        if order is None:
            return self._err(f"order {a['order_id']} not found", "Order not found")
        if order["status"] != "delivered":
            return self._status_error("return_items", order)
        in_order = [r["item_id"] for r in order["items"]]
        for item_id in a["item_ids"]:
            if a["item_ids"].count(item_id) > in_order.count(item_id):
                return self._err(f"item {item_id} is not in order {order['order_id']}", "Some item not found")
        if a["payment_method_id"] != order["payment_method_id"]:
            return self._err(f"refunds go to the order's payment method {order['payment_method_id']}",
                             "Payment method should be the original payment method")
        refund = sum(r["price"] for r in order["items"] if r["item_id"] in a["item_ids"])
        order.update(status="return requested", return_items=sorted(a["item_ids"]), refund=refund)
        if self.style == "tau2":
            return Outcome(self.render_order(order), write=order["order_id"])
        return Outcome(f"return requested for order {order['order_id']} items {', '.join(a['item_ids'])}; refund "
                       f"{money(refund)} to {order['payment_method_id']}", write=order["order_id"])


# -- the user -----------------------------------------------------------------------------------

_CONFIRM_WORDS = ("confirm", "proceed", "shall i", "should i", "go ahead", "do you want")


class ScriptedUser:
    """Deterministic user (see module docstring); `max_reactive` bounds the yes/email answers."""

    def __init__(self, opening: str, email: str, max_reactive: int = 4):
        self.opening, self.email, self.reactive_left = opening, email, max_reactive

    def reply(self, agent_text: str) -> tuple[str, bool]:
        text = agent_text.lower()
        if "?" in text and self.reactive_left > 0:
            if "email" in text:
                self.reactive_left -= 1
                return f"My email is {self.email}.", False
            if any(word in text for word in _CONFIRM_WORDS):
                self.reactive_left -= 1
                return "Yes, please go ahead.", False
        return f"Thank you, that's all. {STOP}", True


# -- reward helpers -----------------------------------------------------------------------------

_SENTENCE_SPLIT = re.compile(r"(?<!\d)[.!?;\n]|[.!?;\n](?!\d)")


def sentences(text: str) -> list[str]:
    return [s.strip().lower() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def told(texts: Sequence[str], value: str, anchor: str | None = None) -> bool:
    """`value` appears as a word in one sentence of an agent message, next to `anchor` if given."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(value.lower())}(?![\w])")
    return any(pattern.search(s) and (anchor is None or anchor.lower() in s) for t in texts for s in sentences(t))


class Call:
    """One logged tool call."""

    def __init__(self, turn: int, role: str | None, name: str, args: dict[str, Any], outcome: Outcome):
        self.turn, self.role, self.name, self.args = turn, role, name, args
        self.ok, self.malformed, self.violation = outcome.ok, outcome.malformed, outcome.violation
        self.write = outcome.write


# -- the environment base -----------------------------------------------------------------------

class Instance:
    """One seeded task: the world's db, the user, the opening message and the gold facts."""

    def __init__(self, db: dict[str, Any], user: dict[str, Any], opening: str, gold: dict[str, Any]):
        self.db, self.user, self.opening, self.gold = db, user, opening, gold


def check_target(target: Any, roles: Sequence[str]) -> dict[str, Any]:
    """The baked target parameters, checked for the roles an environment uses."""
    if not isinstance(target, dict) or "tools" not in target or "formats" not in target:
        raise InvalidArgument(field="target", expected="the target parameters TRACE bakes into TARGET",
                              got=type(target).__name__,
                              fix="Build the module with services.environment.library.bundle(...).")
    missing = [r for r in roles if r not in target["tools"]]
    if missing:
        raise InvalidArgument(field="target.tools", expected=f"tools for the roles {list(roles)}", got=missing)
    return target


class ServiceEnv(Environment):
    """Base of the library environments (see module docstring)."""

    capability: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ()
    default_max_turns: ClassVar[int] = 14

    def __init__(self, target: dict[str, Any]):
        self.target = check_target(target, self.roles)
        self.style = self.target.get("style", "store")
        self.names = {self.tool(role): role for role in self.roles}
        self.inst: Instance | None = None

    # -- subclass API ---------------------------------------------------------------------
    def build(self, seed: int, rng: random.Random, world: World) -> Instance:
        raise NotImplementedError

    def score(self) -> tuple[float, dict[str, float], str | None]:
        raise NotImplementedError

    def oracle(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def unskilled(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def policy_lines(self) -> list[str]:
        raise NotImplementedError

    # -- helpers for subclasses -------------------------------------------------------------
    def tool(self, role: str) -> str:
        return self.target["tools"][role]["function"]["name"]

    def act(self, role: str, **arguments: Any) -> dict[str, Any]:
        return {"name": self.tool(role), "arguments": arguments}

    def confirm(self, summary: str) -> list[dict[str, Any]]:
        """tau2's policy asks for an explicit yes before each write; the store's does not."""
        if self.style == "tau2":
            return [{"message": f"I will {summary}. Do you confirm (yes/no)?"}]
        return []

    def lookups(self, order_id: str, before: int | None = None) -> bool:
        return any(c.role == "get_order" and c.ok and c.args.get("order_id") == order_id
                   and (before is None or c.turn < before) for c in self.calls)

    def writes(self, order_id: str | None = None) -> list[Call]:
        """Write attempts (successful or refused by a precondition), optionally on one order."""
        return [c for c in self.calls if c.role in WRITE_ROLES and (c.ok or c.violation)
                and (order_id is None or c.args.get("order_id") == order_id)]

    def first_write_turn(self, order_id: str | None = None) -> int | None:
        turns = [c.turn for c in self.writes(order_id)]
        return min(turns) if turns else None

    def decisive_turn(self, order_id: str | None = None) -> int:
        """The turn by which a lookup must have happened: the first write on the order, else the end."""
        turn = self.first_write_turn(order_id)
        return self.turn if turn is None else turn

    def event(self, event: str, **detail: Any) -> None:
        self.events.append({"capability": self.capability, "event": event, "turn": self.turn, "detail": detail})

    def final_state(self, order_id: str) -> dict[str, Any]:
        return self.db["orders"][order_id]

    # -- Environment API ------------------------------------------------------------------
    def splits(self) -> dict[str, Sequence[int]]:
        return dict(SPLITS)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.target["tools"][role]) for role in self.roles]

    def system_prompt(self) -> str:
        common = ["Each turn, either make one tool call or send one message to the user, never both.",
                  "Use only facts from the user or from tool results. Never invent ids."]
        if self.style == "tau2":
            common.append("Before any write, describe it and ask the user to confirm (yes/no).")
        end = ("When you are done, send one message that reports the outcome: refund amounts with two decimals "
               "(e.g. 45.17), order statuses next to their order ids.")
        policy = "\n".join([f"# {self.description}", "", *[f"- {line}" for line in
                                                           common + self.policy_lines() + [end]]])
        return self.target["system_template"].replace("{policy}", policy)

    def reset(self, seed: int) -> Observation:
        seed = self.check_seed(seed)
        rng = random.Random(seed)
        world = World(rng, self.target["formats"])
        inst = self.build(seed, rng, world)
        self.inst = inst
        self.db = copy.deepcopy(inst.db)
        self.toolbox = ToolBox(self.db, self.style, self.target["formats"])
        self.user = ScriptedUser(inst.opening, inst.user["email"])
        self.calls: list[Call] = []
        self.texts: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.turn = 0
        self._done = False
        messages = [Message.system(self.system_prompt())]
        if self.target.get("greeting"):
            messages.append(Message.assistant(self.target["greeting"]))
        messages.append(Message.user(inst.opening))
        return Observation(messages=messages, task_id=str(seed), seed=seed, tools=self.tool_schemas(),
                           info={"capability": self.capability, **inst.gold.get("info", {})})

    @property
    def task_id(self) -> str:
        if self.inst is None:
            raise FailedPrecondition("no task yet: call reset(seed) first")
        return str(self.inst.gold["seed"])

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
            outcome = Outcome(f"Error: {action.error}", ok=False, malformed="arguments not a JSON object")
        elif action.name not in self.names:
            outcome = Outcome(f"Error: Tool '{action.name}' not found." if self.style == "tau2"
                              else f"Error: unknown tool {action.name}", ok=False, malformed="unknown tool")
        else:
            outcome = self.toolbox.call(self.names[action.name], action.name, dict(action.arguments))
        call = Call(turn, self.names.get(action.name), action.name, dict(action.arguments), outcome)
        self.calls.append(call)
        self.on_call(call)
        return StepResult(observation=[Message.tool(action.call_id, outcome.text)], done=False)

    def on_call(self, call: Call) -> None:
        """Hook for diagnostics (default: none)."""

    def reward(self) -> float:
        return self.score()[0]

    def reward_breakdown(self) -> dict[str, float]:
        return self.score()[1]

    def failure_reason(self) -> str | None:
        return self.score()[2]

    def diagnostics(self) -> list[dict[str, Any]]:
        return list(self.events)

    # -- scripts --------------------------------------------------------------------------
    def script(self, seed: int, skilled: bool) -> list[dict[str, Any]]:
        self.reset(seed)
        return self.oracle() if skilled else self.unskilled()
