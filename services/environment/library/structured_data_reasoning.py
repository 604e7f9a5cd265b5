"""Record selection: find the one order whose item matches every attribute (capability: structured_data_reasoning).

Task. A user of the target's world makes the target's mix of requests (kit.py "Shape": its
kinds, how many, one at a time or all at once). Up to three of them (fewer at an easier level,
kit.py "Levels") designate an item by product and options (the target's own way of naming an
item, e.g. "the red 1L kettle") instead of an order id: cancel the order holding it (pending),
return it or exchange it for another variant (delivered); on tau2 retail also change it in a
pending order. For each such item the account holds the gold order, a look-alike order in the
same status with the same product in other options -- always listed before the gold one -- in
half the cases an order with the exact item in a status that forbids the request, and
unrelated orders; the designated products appear in no other order of the user. The agent must
read the candidates and act on the order that matches every attribute and whose status allows
the request. The other requests are plain (orders given by their exact id).

Reward (algorithmic; kit.py's multi-level formula over all requests; plain requests earn 1
when handled exactly, else 0):

    inspected(c) = the gold order's details were shown (the order listing, or
                   get_order_details on it) before the first write on one of c's candidates
    correct(c)   = the write was made on the gold order with the user's item / reason / new
                   item, no other candidate of c was written, and its refund / price
                   difference was told
    credit(c)    = 1 if correct, 0.3 if inspected (the intermediate step: the right record
                   was read), else 0
    reward       = 1 if every credit is 1 and nothing else was written, else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): takes the first
listed order holding the named product in an allowed status, ignoring the options -- the
look-alike, every time. A blind policy cannot know which order ids exist.

Why the skill transfers: the target's users designate items by attributes among similar
orders in exactly this way, among the target's other requests, with the target's own records,
listings and tool outputs (the target's tool code produces them), and a write on the wrong
record fails the target's task.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import FORBIDDING, LIST_ORDERS, SWAPS, Call, Plan, Request, ServiceEnv

#: A swap no new variant of which the target accepts for the gold order (tau2 refuses a price
#: difference above a gift card's balance) is asked as the write that needs no new item.
FALLBACK = {"exchange": "return", "modify": "cancel"}


class StructuredDataReasoningEnv(ServiceEnv):
    """Attribute-matching record selection among plain requests; see the module docstring."""

    name: ClassVar[str] = "structured_data_reasoning"
    version: ClassVar[str] = "3.0.0"
    description: ClassVar[str] = "Act on the order whose item matches every attribute, among look-alike orders"
    capability: ClassVar[str] = "structured_data_reasoning"
    case_kinds: ClassVar[tuple[str, ...]] = ("cancel", "return", "exchange", "modify")

    @staticmethod
    def _fits(product: Any, kind: str) -> bool:
        if kind in SWAPS:  # gold, look-alike and an available new variant, all distinct
            return len(product.variants) >= 3 and any(v.available for v in product.variants)
        return len(product.variants) >= 2

    def prepare(self, world: Any, user: Any, plan: Plan, cases: list[int]) -> None:
        picked: list[Any] = []
        for index in cases:
            kind = plan.kinds[index]
            picked.append(world.rng.choice([p for p in self.catalog if p not in picked and self._fits(p, kind)]))
        self.picked = picked
        self.reserved = tuple(p.product_id for p in picked)
        self.pairs: list[tuple[str, str]] = []

    def build_case(self, world: Any, user: Any, kind: str, index: int) -> Request:
        tk, rng = self.toolkit, world.rng
        product = self.picked[index]
        variants = list(product.variants)
        gold_v = rng.choice([v for v in variants if kind not in SWAPS or any(
            w.available and w is not v for w in variants)])

        def lines(item_id: str) -> list[tuple[str, str]]:
            return [(product.product_id, item_id), *self.pick_lines(world, rng.randint(0, 1), exclude=self.reserved)]

        status = self.required(kind)
        gold = tk.add_order(world, user.user_id, status, lines(gold_v.item_id))
        row = next(i for i in gold.items if i.item_id == gold_v.item_id)
        facts: dict[str, Any] = {"item_id": gold_v.item_id, "product_id": product.product_id,
                                 "spoken": tk.describe_item(row)}
        if kind in SWAPS:
            news = [v for v in variants if v.available and v is not gold_v]
            rng.shuffle(news)
            new = None
            for variant in news:  # the first new variant the target's tool accepts for the gold order
                probe = Request(kind, gold.order_id, "", True, allowed=True, **facts, new_item_id=variant.item_id)
                if self.works(world, self.write_action(probe, gold)):
                    new = variant
                    break
            if new is None:
                kind = FALLBACK[kind]
                status = self.required(kind)
            else:
                facts.update(new_item_id=new.item_id, new_spoken=tk.describe_item(self.new_view(row, new)))
        taken = {gold_v.item_id, facts.get("new_item_id")}
        decoy_v = rng.choice([v for v in variants if v.item_id not in taken])
        decoy = tk.add_order(world, user.user_id, self.required(kind), lines(decoy_v.item_id))
        candidates = [gold.order_id, decoy.order_id]
        if rng.random() < 0.5:  # the exact item, in an order whose status forbids the request
            candidates.append(tk.add_order(world, user.user_id, rng.choice(FORBIDDING[kind]),
                                           lines(gold_v.item_id)).order_id)
        self.pairs.append((decoy.order_id, gold.order_id))
        decoy_row = next(i for i in decoy.items if i.item_id == decoy_v.item_id)
        facts.update(decoy_order_id=decoy.order_id, decoy_item_id=decoy_v.item_id, candidates=candidates,
                     decoy_spoken=tk.describe_item(decoy_row))
        spoken = facts["spoken"]
        if kind == "cancel":
            facts["reason"] = rng.choice(tk.cancel_reasons)
            text = f"Please cancel the order with my {spoken}. Reason: {facts['reason']}."
        elif kind == "return":
            text = f"I want to return the {spoken} I received."
        elif kind == "exchange":
            text = f"I want to exchange the {spoken} I received for the {facts['new_spoken']}."
        else:
            text = f"I want to change the {spoken} in my pending order to the {facts['new_spoken']}."
        case = Request(kind, gold.order_id, text, True, status=status, allowed=True, **facts)
        return self.finish_request(case, self.toolkit.order(world.db, gold.order_id))

    def finish(self, world: Any, user: Any) -> None:
        self.shuffle_orders(world, user.user_id, before=self.pairs)

    def on_call(self, call: Call) -> None:
        if not call.write:
            return
        for case in self.inst.cases:
            if call.write in case.facts["candidates"] and call.write != case.order_id:
                self.event("wrong_record", tool=call.name, order_id=call.write, expected_order_id=case.order_id)

    def credit(self, case: Request) -> tuple[float, str | None]:
        candidates = case.facts["candidates"]
        turns = [t for oid in candidates if (t := self.first_write_turn(oid)) is not None]
        inspected = self.looked_up(case.order_id, before=min(turns) if turns else self.turn)
        wrong = sorted({c.write for c in self.calls if c.write in candidates and c.write != case.order_id})
        if self.handled(case) and not wrong:
            return 1.0, None
        why = (f"wrote the look-alike record(s) {', '.join(wrong)}" if wrong
               else f"{case.kind} not done exactly on {case.order_id} with its outcome told")
        if inspected:
            return 0.3, why
        return 0.0, f"the matching order {case.order_id} was never inspected; {why}"

    def _browse(self, pick) -> tuple[list[dict[str, Any]], str | None, str | None]:
        """Read the user's orders in listed order until `pick(order)` names (order_id, item_id)."""
        seen = self.script_state.setdefault("seen", set())
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

    def _handle(self, case: Request, pick) -> tuple[list[dict[str, Any]], str]:
        acts, oid, item = self._browse(pick)
        if oid is None:
            return acts, "Sorry, I could not find that item in your orders."
        order = self.order0(oid)
        if case.kind in SWAPS:
            acts.append(self.act("get_product_details", product_id=case.facts["product_id"]))
        return (acts + self.write_with_confirm(self.write_action(case, order, item)),
                self.write_sentence(case, order, item))

    def oracle_case(self, case: Request) -> tuple[list[dict[str, Any]], str]:
        return self._handle(case, lambda o: case.facts["item_id"] if o.order_id == case.order_id else None)

    def unskilled_case(self, case: Request) -> tuple[list[dict[str, Any]], str]:
        """Takes the first listed order holding the product in an allowed status, ignoring the options."""
        need = self.required(case.kind)

        def first_product_match(order: Any) -> str | None:
            if order.status != need:
                return None
            return next((i.item_id for i in order.items if i.product_id == case.facts["product_id"]), None)
        return self._handle(case, first_product_match)


ENVIRONMENT = StructuredDataReasoningEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return StructuredDataReasoningEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return StructuredDataReasoningEnv().script(seed, skilled=False)
