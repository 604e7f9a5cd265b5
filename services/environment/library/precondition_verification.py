"""Cancellation gate: verify an order's status before cancelling it (capability: precondition_verification).

Task. A user gives their email and asks to cancel one order by id, with a reason. In half
of the instances the order is pending (cancellable); in the other half it is processed,
delivered or already cancelled, and the right answer is a refusal that names the status.
The agent has the target's find-user-by-email, order-details and cancel-pending-order
tools.

Reward (algorithmic, in [0, 1]):

    verify  = 1 if the order's details were fetched (successfully, canonical id) before the
              first cancel attempt on it -- or before the end when none was attempted
    outcome = pending:     the order is cancelled with the user's reason and the refund
                           amount was told to the user
              not pending: no cancel was attempted and the order's status was told
    reward  = 0.4 * verify + 0.6 * outcome

The 0.4 is the partial credit for the skill's intermediate step: a policy that looks the
order up is rewarded for it even while it still gets the decision wrong, so GRPO groups
carry a gradient towards the lookup. A blind policy cannot pass: always cancelling earns
0.6 on pending orders and 0 otherwise (and is refused by the tool, a logged
`write_precondition_false`), always refusing cannot name a status it never read, and doing
nothing earns 0.

Why the skill transfers: the target's write tools (tau2 retail and the store) only accept
orders in a given status, their policies require checking before acting, and a refused
write there costs the whole task. Here the agent uses the same tool names, arguments, id
formats and output style, so "read the record, check the status, then act or explain"
is practised in exactly the form the target asks for.
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
    told,
)

#: Target parameters; TRACE bakes the real ones in when it registers this module.
TARGET: dict[str, Any] | None = None


class PreconditionVerificationEnv(ServiceEnv):
    """Cancel-or-refuse tasks; see the module docstring."""

    name: ClassVar[str] = "precondition_verification"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "Order cancellation support policy"
    capability: ClassVar[str] = "precondition_verification"
    roles: ClassVar[tuple[str, ...]] = ("find_user", "get_order", "cancel")

    def __init__(self, target: dict[str, Any] | None = None):
        super().__init__(target if target is not None else TARGET)

    def policy_lines(self) -> list[str]:
        return [f"Identify the user with {self.tool('find_user')} using their email.",
                f"Only pending orders can be cancelled. Before cancelling, check the order's status with "
                f"{self.tool('get_order')}.",
                f"If the order is not pending, do not call {self.tool('cancel')}: tell the user the order's status "
                "and that it cannot be cancelled.",
                "The cancel reason is exactly 'no longer needed' or 'ordered by mistake'."]

    def build(self, seed: int, rng: random.Random, world: World) -> Instance:
        products = [world.product(i) for i in rng.sample(range(len(CATALOG)), 4)]
        user = world.user()
        pending = rng.random() < 0.5
        status = "pending" if pending else rng.choice(("processed", "delivered", "cancelled"))
        for _ in range(rng.randint(1, 3)):
            world.order(user, rng.choice(("pending", "processed", "delivered")),
                        world.random_lines(products, rng.randint(1, 2)))
        target = world.order(user, status, world.random_lines(products, rng.randint(1, 3)))
        rng.shuffle(user["orders"])
        reason = rng.choice(CANCEL_REASONS)
        opening = (f"Hi, I'm {user['first'].title()} {user['last'].title()}, my email is {user['email']}. "
                   f"Please cancel order {target['order_id']}. Reason: {reason}.")
        return Instance(world.db, user, opening, {
            "seed": seed, "order_id": target["order_id"], "status": status, "reason": reason,
            "refund": money(order_total(target)), "info": {"pending": pending, "status": status}})

    def on_call(self, call: Call) -> None:
        if call.violation:
            self.event("write_precondition_false", order_id=call.args.get("order_id"), violation=call.violation)

    def score(self) -> tuple[float, dict[str, float], str | None]:
        gold = self.inst.gold
        oid = gold["order_id"]
        verify = self.lookups(oid, before=self.decisive_turn(oid))
        order = self.final_state(oid)
        if gold["status"] == "pending":
            done = order["status"] == "cancelled" and order.get("cancel_reason") == gold["reason"]
            outcome = done and told(self.texts, gold["refund"])
            why = None if outcome else ("order not cancelled with the user's reason" if not done
                                        else f"refund {gold['refund']} not told")
        else:
            attempted = bool(self.writes(oid))
            outcome = not attempted and told(self.texts, gold["status"], anchor=oid[2:])
            why = None if outcome else (f"cancel attempted on a {gold['status']} order" if attempted
                                        else f"status {gold['status']} of {oid} not told")
        reward = 0.4 * verify + 0.6 * outcome
        reasons = [r for r in (None if verify else "status not checked before acting", why) if r]
        return reward, {"verify": float(verify), "outcome": float(outcome)}, "; ".join(reasons) or None

    def oracle(self) -> list[dict[str, Any]]:
        gold, user = self.inst.gold, self.inst.user
        oid = gold["order_id"]
        acts = [self.act("find_user", email=user["email"]), self.act("get_order", order_id=oid)]
        if gold["status"] == "pending":
            return acts + self.confirm(f"cancel order {oid} (reason: {gold['reason']})") + [
                self.act("cancel", order_id=oid, reason=gold["reason"]),
                {"message": f"Order {oid} is cancelled; refund {gold['refund']} to your original payment method."}]
        return acts + [{"message": f"Order {oid} is {gold['status']}, so it cannot be cancelled."}]

    def unskilled(self) -> list[dict[str, Any]]:
        """Cancels without looking: right on pending orders, refused (too late) on the others."""
        gold, user = self.inst.gold, self.inst.user
        oid = gold["order_id"]
        acts = [self.act("find_user", email=user["email"])] + self.confirm(f"cancel order {oid}") + [
            self.act("cancel", order_id=oid, reason=gold["reason"])]
        if gold["status"] == "pending":
            return acts + [{"message": f"Order {oid} is cancelled; refund {gold['refund']}."}]
        return acts + [{"message": f"Sorry, order {oid} could not be cancelled."}]


ENVIRONMENT = PreconditionVerificationEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return PreconditionVerificationEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed` (used to calibrate with a scripted stand-in)."""
    return PreconditionVerificationEnv().script(seed, skilled=False)
