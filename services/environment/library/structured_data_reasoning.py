"""Record selection: find the one record that matches every attribute (capability: structured_data_reasoning).

Task. A user describes an item by product and options ("the t-shirt with color red and
size L") and wants it returned (delivered orders) or its order cancelled (pending orders).
Their account holds three orders with that product in a status that allows the request --
the gold one with exactly those options and two look-alikes with other options -- listed
so that a look-alike comes first 14 times in 15, sometimes an order with the exact item in
a status that forbids the request, and unrelated orders. The agent must find the user,
list their orders, read the orders' details and act on the one that matches every
attribute *and* the status.

Reward (algorithmic, in [0, 1]):

    inspect = 1 if the gold order's details were fetched before the first write
    outcome = the requested write was made on the gold order (the exact item for a return,
              the user's reason for a cancel), no other order was written, and the refund
              amount was told
    reward  = 0.3 * inspect + 0.7 * outcome

Reading the candidate records is the intermediate step and earns 0.3 even when the final
choice is wrong. Picking the first order that merely holds the product (ignoring the
options) is right only when the gold order happens to be listed before both look-alikes
(1 time in 15); taking the last look-alike is right 7 times in 15; a blind policy cannot know
any order id.

Why the skill transfers: on the target, users describe items by name and options and
own several similar orders; the agent must cross-reference user details, order details
and item options from the same tools (same names, arguments and output format as here)
before writing, and a write on the wrong record fails the task.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from services.environment.library.kit import (
    CANCEL_REASONS,
    CATALOG,
    Call,
    Instance,
    ServiceEnv,
    World,
    money,
    order_total,
    spoken,
    told,
)

TARGET: dict[str, Any] | None = None


class StructuredDataReasoningEnv(ServiceEnv):
    """Attribute-matching record selection; see the module docstring."""

    name: ClassVar[str] = "structured_data_reasoning"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "Order support policy"
    capability: ClassVar[str] = "structured_data_reasoning"
    roles: ClassVar[tuple[str, ...]] = ("find_user", "get_user", "get_order", "cancel", "return_items")

    def __init__(self, target: dict[str, Any] | None = None):
        super().__init__(target if target is not None else TARGET)

    def policy_lines(self) -> list[str]:
        return [f"Identify the user with {self.tool('find_user')} using their email; {self.tool('get_user')} "
                "lists their orders.",
                "When the user describes an item by its attributes, read their orders and pick the order whose "
                "item matches every attribute and whose status allows the request.",
                "Only pending orders can be cancelled; only items of delivered orders can be returned, with the "
                "refund to the order's own payment method.",
                "The cancel reason is exactly 'no longer needed' or 'ordered by mistake'."]

    def build(self, seed: int, rng: random.Random, world: World) -> Instance:
        indices = rng.sample(range(len(CATALOG)), 4)
        products = [world.product(i) for i in indices]
        user = world.user()
        action = rng.choice(("cancel", "return"))
        allowed = "pending" if action == "cancel" else "delivered"
        product = products[0]
        variants = sorted(product["variants"])
        gold_item, *decoys = rng.sample(variants, 3)
        others = products[1:]

        def lines(item_id: str) -> list[tuple[dict[str, Any], str]]:
            return [(product, item_id), *world.random_lines(others, rng.randint(0, 1))]

        gold = world.order(user, allowed, lines(gold_item))
        lookalikes = [gold["order_id"]] + [world.order(user, allowed, lines(item))["order_id"] for item in decoys]
        if rng.random() < 0.5:  # the exact item, in an order whose status forbids the request
            world.order(user, "processed", lines(gold_item))
        for _ in range(rng.randint(0, 2)):
            world.order(user, rng.choice(("pending", "processed", "delivered")),
                        world.random_lines(others, rng.randint(1, 2)))
        rng.shuffle(user["orders"])
        listed = user["orders"]
        positions = sorted(listed.index(o) for o in lookalikes)
        if listed[positions[0]] == gold["order_id"] and rng.random() < 0.8:
            # usually a look-alike is listed first, so "the first order with that product" is wrong
            other = positions[rng.randint(1, 2)]
            listed[positions[0]], listed[other] = listed[other], listed[positions[0]]
        row = next(r for r in gold["items"] if r["item_id"] == gold_item)
        said = spoken(product["name"], row["options"])
        hello = f"Hi, I'm {user['first'].title()} {user['last'].title()}, my email is {user['email']}."
        facts: dict[str, Any] = {"seed": seed, "action": action, "order_id": gold["order_id"], "item_id": gold_item,
                                 "product": product["name"], "payment": gold["payment_method_id"],
                                 "info": {"action": action}}
        if action == "cancel":
            reason = rng.choice(CANCEL_REASONS)
            facts.update(reason=reason, refund=money(order_total(gold)))
            text = f"Please cancel the order with my {said}. Reason: {reason}."
        else:
            facts.update(refund=money(row["price"]))
            text = f"I want to return the {said} I received."
        return Instance(world.db, user, f"{hello} {text}", facts)

    def on_call(self, call: Call) -> None:
        if call.role in ("cancel", "return_items") and call.ok and call.args.get("order_id") != self.inst.gold["order_id"]:
            self.event("wrong_record", tool=call.name, order_id=call.args.get("order_id"),
                       expected_order_id=self.inst.gold["order_id"])

    def score(self) -> tuple[float, dict[str, float], str | None]:
        gold = self.inst.gold
        oid = gold["order_id"]
        first_write = self.first_write_turn()
        inspect = self.lookups(oid, before=self.turn if first_write is None else first_write)
        order = self.final_state(oid)
        wrong = sorted({c.args.get("order_id") for c in self.writes() if c.ok and c.args.get("order_id") != oid})
        if gold["action"] == "cancel":
            done = order["status"] == "cancelled" and order.get("cancel_reason") == gold["reason"]
        else:
            done = order["status"] == "return requested" and order.get("return_items") == [gold["item_id"]]
        outcome = done and not wrong and told(self.texts, gold["refund"])
        reasons = []
        if not inspect:
            reasons.append(f"order {oid} (the matching record) never inspected before acting")
        if wrong:
            reasons.append(f"wrote the wrong record(s) {', '.join(wrong)}")
        if not done:
            reasons.append(f"{gold['action']} not done on {oid}")
        elif not outcome and not wrong:
            reasons.append(f"refund {gold['refund']} not told")
        return 0.3 * inspect + 0.7 * outcome, {"inspect": float(inspect), "outcome": float(outcome)}, \
            "; ".join(reasons) or None

    def _write(self, order_id: str, item_id: str) -> list[dict[str, Any]]:
        gold = self.inst.gold
        order = self.inst.db["orders"][order_id]
        if gold["action"] == "cancel":
            return self.confirm(f"cancel order {order_id} (reason: {gold['reason']})") + [
                self.act("cancel", order_id=order_id, reason=gold["reason"]),
                {"message": f"Order {order_id} is cancelled; refund {money(order_total(order))} to "
                            f"{order['payment_method_id']}."}]
        row = next(r for r in order["items"] if r["item_id"] == item_id)
        return self.confirm(f"return the {row['name']} (item {item_id}) from order {order_id}") + [
            self.act("return_items", order_id=order_id, item_ids=[item_id],
                     payment_method_id=order["payment_method_id"]),
            {"message": f"The return of item {item_id} from order {order_id} is requested; refund "
                        f"{money(row['price'])} to {order['payment_method_id']}."}]

    def _browse(self, matches) -> list[dict[str, Any]]:
        """Look up the user, list orders, read them in listed order until `matches(order)`."""
        user = self.inst.user
        acts = [self.act("find_user", email=user["email"]), self.act("get_user", user_id=user["user_id"])]
        for order_id in user["orders"]:
            acts.append(self.act("get_order", order_id=order_id))
            order = self.inst.db["orders"][order_id]
            item = matches(order)
            if item is not None:
                return acts + self._write(order_id, item)
        return acts + [{"message": "Sorry, I could not find that item in your orders."}]

    def oracle(self) -> list[dict[str, Any]]:
        gold = self.inst.gold
        return self._browse(lambda o: gold["item_id"] if o["order_id"] == gold["order_id"] else None)

    def unskilled(self) -> list[dict[str, Any]]:
        """Takes the first listed order holding the product in an allowed status, ignoring the options."""
        gold = self.inst.gold
        allowed = "pending" if gold["action"] == "cancel" else "delivered"

        def first_product_match(order: dict[str, Any]) -> str | None:
            if order["status"] != allowed:
                return None
            return next((r["item_id"] for r in order["items"] if r["name"] == gold["product"]), None)
        return self._browse(first_product_match)


ENVIRONMENT = StructuredDataReasoningEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return StructuredDataReasoningEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return StructuredDataReasoningEnv().script(seed, skilled=False)
