"""Loose references: turn what the user says into exact tool arguments (capability: tool_call_precision).

Task. A user refers to their order loosely ('W12345', '12345', 'order number 12345', '#W 12345'
... in the target's id width) and asks for one of: cancel it (the reason may be paraphrased:
"I ordered it by accident" must become 'ordered by mistake'), return one named item (the
item id and the order's payment method must be copied exactly from the order details), or
its status. Kinds are balanced (1/3 each), so no fixed action fits all instances.

Reward (algorithmic, in [0, 1]):

    lookup    = 1 if the order's details were fetched with the canonical id (before the
                write, or before the end for a status question)
    outcome   = the request done with exactly the canonical arguments (cancel: order
                cancelled with the enum reason; return: exactly the named item returned to
                the order's payment method) and the refund / status told to the user
    malformed = number of calls with a malformed argument (loose id, paraphrased reason,
                missing or unknown argument)
    reward    = max(0, 0.3 * lookup + 0.7 * outcome - 0.1 * malformed)

Normalising the id for the first lookup is the skill's intermediate step and earns 0.3 on
its own; copying the user's words verbatim gets an error (the store rejects the format,
tau2 answers 'Order not found') and, for an agent without the skill, ends the attempt.

Why the skill transfers: both targets take ids only in canonical form ('#W' + digits),
the cancel reason only as one of two enum strings, and item/payment ids only as shown by
their tools. Users on the target phrase them loosely in the same ways, and the
environment uses the target's own tool names, argument shapes and error texts.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from services.environment.library.kit import (
    CANCEL_REASONS,
    CATALOG,
    REASON_PARAPHRASES,
    Call,
    Instance,
    ServiceEnv,
    World,
    money,
    order_total,
    told,
)

TARGET: dict[str, Any] | None = None
LOOSE_STYLES = ("W{d}", "{d}", "#{d}", "w{d}", "order number {d}", "#W {d}")


class ToolCallPrecisionEnv(ServiceEnv):
    """Requests with loosely written arguments; see the module docstring."""

    name: ClassVar[str] = "tool_call_precision"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "Order requests support policy"
    capability: ClassVar[str] = "tool_call_precision"
    roles: ClassVar[tuple[str, ...]] = ("find_user", "get_order", "cancel", "return_items")

    def __init__(self, target: dict[str, Any] | None = None):
        super().__init__(target if target is not None else TARGET)

    def policy_lines(self) -> list[str]:
        digits = self.target["formats"]["order_digits"]
        return [f"Identify the user with {self.tool('find_user')} using their email.",
                f"Write ids exactly: an order id is '#W' followed by {digits} digits, whatever way the user writes "
                "it; copy item ids and payment method ids from tool results.",
                "The cancel reason is exactly 'no longer needed' or 'ordered by mistake'.",
                "Only pending orders can be cancelled; only items of delivered orders can be returned, with the "
                "refund to the order's own payment method."]

    def build(self, seed: int, rng: random.Random, world: World) -> Instance:
        products = [world.product(i) for i in rng.sample(range(len(CATALOG)), 4)]
        user = world.user()
        kind = ("cancel", "return", "status")[rng.randrange(3)]
        for _ in range(rng.randint(0, 2)):
            world.order(user, rng.choice(("pending", "processed", "delivered")),
                        world.random_lines(products, rng.randint(1, 2)))
        status = {"cancel": "pending", "return": "delivered"}.get(kind) or rng.choice(("pending", "processed",
                                                                                      "delivered"))
        order = world.order(user, status, world.random_lines(products, rng.randint(1, 3)))
        rng.shuffle(user["orders"])
        oid = order["order_id"]
        ref = rng.choice(LOOSE_STYLES).format(d=oid[2:])
        gold: dict[str, Any] = {"seed": seed, "kind": kind, "order_id": oid, "ref": ref, "status": status,
                                "info": {"kind": kind, "ref": ref}}
        hello = f"Hi, I'm {user['first'].title()} {user['last'].title()}, my email is {user['email']}."
        if kind == "cancel":
            reason = rng.choice(CANCEL_REASONS)
            said = rng.choice(REASON_PARAPHRASES[reason])
            gold.update(reason=reason, refund=money(order_total(order)))
            text = f"Please cancel my order {ref}, {said}."
        elif kind == "return":
            row = rng.choice(order["items"])
            gold.update(item_id=row["item_id"], item_name=row["name"], payment=order["payment_method_id"],
                        refund=money(row["price"]))
            text = f"I want to return the {row['name']} from my order {ref}."
        else:
            text = f"What is the status of my order {ref}?"
        return Instance(world.db, user, f"{hello} {text}", gold)

    def on_call(self, call: Call) -> None:
        if call.malformed:
            self.event("malformed_argument", tool=call.name, problem=call.malformed)

    def score(self) -> tuple[float, dict[str, float], str | None]:
        gold = self.inst.gold
        oid, kind = gold["order_id"], gold["kind"]
        lookup = self.lookups(oid, before=self.decisive_turn(oid))
        order = self.final_state(oid)
        if kind == "cancel":
            done = order["status"] == "cancelled" and order.get("cancel_reason") == gold["reason"]
            outcome, info = done and told(self.texts, gold["refund"]), gold["refund"]
        elif kind == "return":
            done = order["status"] == "return requested" and order.get("return_items") == [gold["item_id"]]
            outcome, info = done and told(self.texts, gold["refund"]), gold["refund"]
        else:
            done = not self.writes()
            outcome, info = done and told(self.texts, gold["status"], anchor=oid[2:]), gold["status"]
        malformed = sum(1 for c in self.calls if c.malformed)
        reward = max(0.0, 0.3 * lookup + 0.7 * outcome - 0.1 * malformed)
        reasons = []
        if not lookup:
            reasons.append(f"order {oid} never looked up with its canonical id")
        if not done:
            reasons.append(f"{kind} request not carried out exactly")
        elif not outcome:
            reasons.append(f"{info} not told to the user")
        if malformed:
            reasons.append(f"{malformed} malformed call(s)")
        return reward, {"lookup": float(lookup), "outcome": float(outcome), "malformed_calls": float(malformed)}, \
            "; ".join(reasons) or None

    def oracle(self) -> list[dict[str, Any]]:
        gold, user = self.inst.gold, self.inst.user
        oid = gold["order_id"]
        acts = [self.act("find_user", email=user["email"]), self.act("get_order", order_id=oid)]
        if gold["kind"] == "cancel":
            return acts + self.confirm(f"cancel order {oid} (reason: {gold['reason']})") + [
                self.act("cancel", order_id=oid, reason=gold["reason"]),
                {"message": f"Order {oid} is cancelled; refund {gold['refund']} to your original payment method."}]
        if gold["kind"] == "return":
            return acts + self.confirm(f"return the {gold['item_name']} from order {oid}") + [
                self.act("return_items", order_id=oid, item_ids=[gold["item_id"]], payment_method_id=gold["payment"]),
                {"message": f"The return of the {gold['item_name']} from order {oid} is requested; refund "
                            f"{gold['refund']} to {gold['payment']}."}]
        return acts + [{"message": f"Order {oid} is {gold['status']}."}]

    def unskilled(self) -> list[dict[str, Any]]:
        """Copies the user's words into the call, gets an error and gives up."""
        gold, user = self.inst.gold, self.inst.user
        acts = [self.act("find_user", email=user["email"])]
        ref = gold["ref"]
        if gold["kind"] == "cancel":
            said = self.inst.opening.rsplit(", ", 1)[-1].rstrip(".")
            acts.append(self.act("cancel", order_id=ref, reason=said))
        else:
            acts.append(self.act("get_order", order_id=ref))
        return acts + [{"message": f"Sorry, I could not process your request for order {ref}."}]


ENVIRONMENT = ToolCallPrecisionEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return ToolCallPrecisionEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return ToolCallPrecisionEnv().script(seed, skilled=False)
