"""Several requests at once: finish every part of a multi-part request (capability: multi_step_task_completion).

Task. A user states three requests in one numbered message, each about one order given
by id: cancel a pending order (with a reason), return one named item of a delivered order,
or tell an order's status. The kinds are drawn independently per request and the parts are
shuffled, so no fixed sequence of calls fits all instances. The agent must carry out every
part, then report all outcomes in its final message (which ends the conversation).

Reward (algorithmic, in [0, 1]):

    for each part p:
        lookup_p  = 1 if p's order details were fetched (canonical id) before p's write,
                    or before the end for a status question
        done_p    = p carried out exactly (cancel with the reason; return of exactly the
                    named item to the order's payment method; no write for a status
                    question) and its refund / status told to the user
    reward = 0 if any order not named in the request was written, else
             mean_p (0.3 * lookup_p + 0.7 * done_p)

Every completed part is partial credit, and so is each part's lookup: an agent that stops
after the first request earns about 1/3, one that looked every order up but finished
only some earns more. Doing nothing earns 0; a blind policy cannot know the ids.

Why the skill transfers: target users (tau2 retail, the store) often bundle requests --
cancel one order, return an item from another, ask about a third -- and the target's
verifier fails the task when any part is left undone. The parts here use the target's tool
names, arguments, id formats and outputs, and the final report must cover every part, as
the targets' policies demand.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from services.environment.library.kit import (
    CANCEL_REASONS,
    CATALOG,
    Instance,
    ServiceEnv,
    World,
    money,
    order_total,
    told,
)

TARGET: dict[str, Any] | None = None
KINDS = ("cancel", "return", "status")
N_PARTS = 3


class MultiStepTaskCompletionEnv(ServiceEnv):
    """Three-part requests; see the module docstring."""

    name: ClassVar[str] = "multi_step_task_completion"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "Multi-request support policy"
    capability: ClassVar[str] = "multi_step_task_completion"
    roles: ClassVar[tuple[str, ...]] = ("find_user", "get_order", "cancel", "return_items")

    def __init__(self, target: dict[str, Any] | None = None):
        super().__init__(target if target is not None else TARGET)

    def policy_lines(self) -> list[str]:
        return [f"Identify the user with {self.tool('find_user')} using their email.",
                f"Check each order with {self.tool('get_order')} before acting on it. Only pending orders can be "
                "cancelled; only items of delivered orders can be returned, with the refund to the order's own "
                "payment method. The cancel reason is exactly 'no longer needed' or 'ordered by mistake'.",
                "Complete every request of the user before your final message; your final message ends the "
                "conversation and must report each outcome."]

    def build(self, seed: int, rng: random.Random, world: World) -> Instance:
        products = [world.product(i) for i in rng.sample(range(len(CATALOG)), 5)]
        user = world.user()
        parts: list[dict[str, Any]] = []
        for _ in range(N_PARTS):
            kind = rng.choice(KINDS)
            if kind == "cancel":
                order = world.order(user, "pending", world.random_lines(products, rng.randint(1, 2)))
                reason = rng.choice(CANCEL_REASONS)
                parts.append({"kind": kind, "order_id": order["order_id"], "reason": reason,
                              "refund": money(order_total(order)),
                              "text": f"Cancel order {order['order_id']}, reason: {reason}."})
            elif kind == "return":
                order = world.order(user, "delivered", world.random_lines(products, rng.randint(1, 3)))
                row = rng.choice(order["items"])
                parts.append({"kind": kind, "order_id": order["order_id"], "item_id": row["item_id"],
                              "item_name": row["name"], "payment": order["payment_method_id"],
                              "refund": money(row["price"]),
                              "text": f"Return the {row['name']} from order {order['order_id']}."})
            else:
                status = rng.choice(("pending", "processed", "delivered"))
                order = world.order(user, status, world.random_lines(products, rng.randint(1, 2)))
                parts.append({"kind": kind, "order_id": order["order_id"], "status": status,
                              "text": f"What is the status of order {order['order_id']}?"})
        for _ in range(rng.randint(0, 2)):
            world.order(user, rng.choice(("pending", "processed", "delivered")),
                        world.random_lines(products, rng.randint(1, 2)))
        rng.shuffle(user["orders"])
        numbered = " ".join(f"{i + 1}) {p['text']}" for i, p in enumerate(parts))
        opening = (f"Hi, I'm {user['first'].title()} {user['last'].title()}, my email is {user['email']}. "
                   f"I have {N_PARTS} requests. {numbered}")
        return Instance(world.db, user, opening, {"seed": seed, "parts": parts,
                                                  "info": {"kinds": [p["kind"] for p in parts]}})

    def _part(self, part: dict[str, Any]) -> tuple[bool, bool, str | None]:
        oid = part["order_id"]
        lookup = self.lookups(oid, before=self.decisive_turn(oid))
        order = self.final_state(oid)
        if part["kind"] == "cancel":
            done = order["status"] == "cancelled" and order.get("cancel_reason") == part["reason"]
            info = part["refund"]
            ok = done and told(self.texts, info)
        elif part["kind"] == "return":
            done = order["status"] == "return requested" and order.get("return_items") == [part["item_id"]]
            info = part["refund"]
            ok = done and told(self.texts, info)
        else:
            done = not self.writes(oid)
            info = part["status"]
            ok = done and told(self.texts, info, anchor=oid[2:])
        why = None if ok else (f"{part['kind']} of {oid} not done" if not done else f"{info} not told for {oid}")
        return lookup, ok, why

    def score(self) -> tuple[float, dict[str, float], str | None]:
        parts = self.inst.gold["parts"]
        named = {p["order_id"] for p in parts}
        stray = sorted({c.args.get("order_id") for c in self.writes() if c.ok and c.args.get("order_id") not in named})
        results = [self._part(p) for p in parts]
        reasons = [why for _, _, why in results if why]
        if stray:
            reasons.insert(0, f"unrequested write on {', '.join(stray)}")
            reward = 0.0
        else:
            reward = sum(0.3 * lookup + 0.7 * ok for lookup, ok, _ in results) / len(results)
        breakdown = {"parts_done": sum(ok for _, ok, _ in results) / len(results),
                     "parts_looked_up": sum(lookup for lookup, _, _ in results) / len(results)}
        return reward, breakdown, "; ".join(reasons) or None

    def diagnostics(self) -> list[dict[str, Any]]:
        events = list(self.events)
        if self.done:
            touched = {c.args.get("order_id") for c in self.calls}
            for index, part in enumerate(self.inst.gold["parts"]):
                oid = part["order_id"]
                if oid not in touched and not any(oid in t for t in self.texts):
                    events.append({"capability": self.capability, "event": "subrequest_unaddressed",
                                   "turn": self.turn, "detail": {"index": index, "kind": part["kind"],
                                                                 "order_id": oid}})
        return events

    def _do(self, part: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        oid = part["order_id"]
        acts = [self.act("get_order", order_id=oid)]
        if part["kind"] == "cancel":
            acts += self.confirm(f"cancel order {oid} (reason: {part['reason']})")
            acts.append(self.act("cancel", order_id=oid, reason=part["reason"]))
            return acts, f"Order {oid} is cancelled; refund {part['refund']}."
        if part["kind"] == "return":
            acts += self.confirm(f"return the {part['item_name']} from order {oid}")
            acts.append(self.act("return_items", order_id=oid, item_ids=[part["item_id"]],
                                 payment_method_id=part["payment"]))
            return acts, f"The return of the {part['item_name']} from order {oid} is requested; refund {part['refund']}."
        return acts, f"Order {oid} is {part['status']}."

    def _script(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        acts = [self.act("find_user", email=self.inst.user["email"])]
        report = []
        for part in parts:
            calls, sentence = self._do(part)
            acts += calls
            report.append(sentence)
        return acts + [{"message": " ".join(report)}]

    def oracle(self) -> list[dict[str, Any]]:
        return self._script(self.inst.gold["parts"])

    def unskilled(self) -> list[dict[str, Any]]:
        """Handles only the first request, then reports."""
        return self._script(self.inst.gold["parts"][:1])


ENVIRONMENT = MultiStepTaskCompletionEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return MultiStepTaskCompletionEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return MultiStepTaskCompletionEnv().script(seed, skilled=False)
