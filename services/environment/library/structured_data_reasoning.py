"""Record selection: find the one order whose item matches every attribute (capability: structured_data_reasoning).

Task. A user of the target's world asks, one request after the other, about three items (fewer at an
easier level, kit.py "Levels") they
describe by product and options (the target's own way of naming an item, e.g. "the red 1L
kettle"): cancel the order holding it (pending) or return it (delivered). For each item the
account holds the gold order, a look-alike order in the same status with the same product
in other options -- always listed before the gold one -- in half the cases an order with
the exact item in a status that forbids the request, and unrelated orders. The agent must
read the candidates and act on the order that matches every attribute and whose status
allows the request.

Reward (algorithmic; kit.py's multi-level formula over the three requests):

    inspected(c) = the gold order's details were shown (the order listing, or
                   get_order_details on it) before the first write on one of c's candidates
    correct(c)   = the write was made on the gold order with the user's item / reason, no
                   other candidate of c was written, and the refund amount was told
    credit(c)    = 1 if correct, 0.3 if inspected (the intermediate step: the right record
                   was read), else 0
    reward       = 1 if every credit is 1 and nothing else was written, else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): takes the first
listed order holding the named product in an allowed status, ignoring the options -- the
look-alike, every time. A blind policy cannot know which order ids exist.

Why the skill transfers: the target's users designate items by attributes among similar
orders in exactly this way, with the target's own records, listings and tool outputs (the
target's tool code produces them), and a write on the wrong record fails the target's task.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import LIST_ORDERS, WRITE_KIND, Call, Case, Instance, ServiceEnv, told

TARGET: dict[str, Any] | None = None
FORBIDDING = {"cancel": ("processed", "delivered"), "return": ("pending", "processed")}


class StructuredDataReasoningEnv(ServiceEnv):
    """Attribute-matching record selection; see the module docstring."""

    name: ClassVar[str] = "structured_data_reasoning"
    version: ClassVar[str] = "2.0.0"
    description: ClassVar[str] = "Act on the order whose item matches every attribute, among look-alike orders"
    capability: ClassVar[str] = "structured_data_reasoning"

    def __init__(self, target: dict[str, Any] | None = None, toolkit: Any = None):
        super().__init__(target if target is not None else TARGET, toolkit)

    def build(self, seed: int, world: Any) -> Instance:
        tk, rng = self.toolkit, world.rng
        self.add_neighbour(world)
        user = tk.add_user(world)
        products = rng.sample([p for p in self.catalog if len(p.variants) >= 2], self.cases)
        reserved = [p.product_id for p in products]
        cases, pairs = [], []
        for product in products:
            kind = rng.choice(("cancel", "return"))
            status = tk.required_status[WRITE_KIND[kind]]
            gold_item, decoy_item = (v.item_id for v in rng.sample(list(product.variants), 2))

            def lines(item_id: str, pid: str = product.product_id) -> list[tuple[str, str]]:
                return [(pid, item_id), *self.pick_lines(world, rng.randint(0, 1), exclude=reserved)]

            gold = tk.add_order(world, user.user_id, status, lines(gold_item))
            decoy = tk.add_order(world, user.user_id, status, lines(decoy_item))
            candidates = [gold.order_id, decoy.order_id]
            if rng.random() < 0.5:  # the exact item, in an order whose status forbids the request
                candidates.append(tk.add_order(world, user.user_id, rng.choice(FORBIDDING[kind]),
                                               lines(gold_item)).order_id)
            pairs.append((decoy.order_id, gold.order_id))
            item = next(i for i in gold.items if i.item_id == gold_item)
            spoken = tk.describe_item(item)
            decoy_row = next(i for i in decoy.items if i.item_id == decoy_item)
            facts = {"item_id": gold_item, "product_id": product.product_id, "decoy_order_id": decoy.order_id,
                     "decoy_item_id": decoy_item, "candidates": candidates, "spoken": spoken,
                     "decoy_spoken": tk.describe_item(decoy_row)}
            if kind == "cancel":
                reason = rng.choice(tk.cancel_reasons)
                cases.append(Case(kind, gold.order_id, f"Please cancel the order with my {spoken}. Reason: {reason}.",
                                  reason=reason, **facts))
            else:
                cases.append(Case(kind, gold.order_id, f"I want to return the {spoken} I received.", **facts))
        self.add_fillers(world, user.user_id, rng.randint(0, 2), exclude=reserved)
        self.shuffle_orders(world, user.user_id, before=pairs)
        hints = [f"the {c.facts['spoken']} is in order {c.order_id}, while order {c.facts['decoy_order_id']} "
                 f"holds the {c.facts['decoy_spoken']}" for c in cases]
        guidance = ("Read the user's orders and act on the order whose item matches every attribute the user names "
                    "(product and each option) and whose status allows the request; a look-alike order with the "
                    f"same product in other options is listed first. Here: {'; '.join(hints)}.")
        return Instance(user, cases, "sequential", guidance)

    def on_call(self, call: Call) -> None:
        if not call.write:
            return
        for case in self.inst.cases:
            if call.write in case.facts["candidates"] and call.write != case.order_id:
                self.event("wrong_record", tool=call.name, order_id=call.write, expected_order_id=case.order_id)

    def credit(self, case: Case) -> tuple[float, str | None]:
        candidates = case.facts["candidates"]
        turns = [t for oid in candidates if (t := self.first_write_turn(oid)) is not None]
        inspected = self.looked_up(case.order_id, before=min(turns) if turns else self.turn)
        wrong = sorted({c.write for c in self.calls if c.write in candidates and c.write != case.order_id})
        correct = self.done_exactly(case) and not wrong and told(self.texts, self.refund(case))
        if correct:
            return 1.0, None
        why = (f"wrote the look-alike record(s) {', '.join(wrong)}" if wrong
               else f"{case.kind} not done exactly on {case.order_id} with the refund {self.refund(case)} told")
        if inspected:
            return 0.3, why
        return 0.0, f"the matching order {case.order_id} was never inspected; {why}"

    def _browse(self, case: Case, pick, seen: set[str]) -> tuple[list[dict[str, Any]], str | None, str | None]:
        """Read the user's orders in listed order until `pick(order)` names (order_id, item_id)."""
        user_id = self.inst.user.user_id
        acts: list[dict[str, Any]] = []
        listing = LIST_ORDERS in self.tool_names
        if listing and LIST_ORDERS not in seen:
            acts.append(self.act(LIST_ORDERS, user_id=user_id))
            seen.add(LIST_ORDERS)
        elif not listing and "get_user_details" not in seen:
            acts.append(self.act("get_user_details", user_id=user_id))
            seen.add("get_user_details")
        for oid in self.toolkit.user(self.world_db, user_id).orders:
            if not listing and oid not in seen:
                acts.append(self.act("get_order_details", order_id=oid))
                seen.add(oid)
            item = pick(self.order0(oid))
            if item is not None:
                return acts, oid, item
        return acts, None, None

    def _handle(self, case: Case, pick) -> tuple[list[dict[str, Any]], str]:
        acts, oid, item = self._browse(case, pick, self._seen)
        if oid is None:
            return acts, "Sorry, I could not find that item in your orders."
        return acts + self.write_actions(case, oid, item), self.write_sentence(case, oid, item)

    def oracle_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        return self._handle(case, lambda o: case.facts["item_id"] if o.order_id == case.order_id else None)

    def unskilled_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        """Takes the first listed order holding the product in an allowed status, ignoring the options."""
        need = self.toolkit.required_status[WRITE_KIND[case.kind]]

        def first_product_match(order: Any) -> str | None:
            if order.status != need:
                return None
            return next((i.item_id for i in order.items if i.product_id == case.facts["product_id"]), None)
        return self._handle(case, first_product_match)

    def mixed(self, skills: Any) -> list[dict[str, Any]]:
        self._seen: set[str] = set()  # what the script has read so far (read each listing once)
        return super().mixed(skills)


ENVIRONMENT = StructuredDataReasoningEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return StructuredDataReasoningEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return StructuredDataReasoningEnv().script(seed, skilled=False)
