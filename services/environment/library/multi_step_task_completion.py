"""Several requests at once: finish every part of a multi-part request (capability: multi_step_task_completion).

Task. A user of the target's world states three requests (two at the easier level, see kit.py
"Levels") in one numbered message, each
about one order given by its exact id: cancel a pending order (with a reason), return one
named item of a delivered order, or tell an order's status. The kinds are drawn
independently per request, so no fixed sequence of calls fits every instance. The agent
must carry out every part and report all outcomes in its final message, which ends the
conversation (the user has nothing to add).

Reward (algorithmic; kit.py's multi-level formula over the three parts):

    looked_up(p) = p's order details were shown before p's write (before the end for a status)
    correct(p)   = p carried out exactly (cancel with the reason; return of exactly the named
                   item; no write for a status question) and its refund / status told
    credit(p)    = 1 if correct, 0.3 if looked up (the part was addressed), else 0
    reward       = 1 if every part is correct and nothing else was written,
                   else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): handles the first
request, reports it and so ends the conversation: 0.5 * 1/3. Doing nothing earns 0; the
ids are in the message, but each part also needs its write or its status told.

Why the skill transfers: the target's users bundle requests the same way (the store's
compound tasks state two or three at once), with the target's own records, tools and tool
outputs here, and the target's verifier fails a task with any part left undone.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import WRITE_KIND, Case, Instance, ServiceEnv, told

TARGET: dict[str, Any] | None = None
KINDS = ("cancel", "return", "status")


class MultiStepTaskCompletionEnv(ServiceEnv):
    """Three (or two) requests in one message; see the module docstring."""

    name: ClassVar[str] = "multi_step_task_completion"
    version: ClassVar[str] = "2.0.0"
    description: ClassVar[str] = "Carry out every one of several requests stated in one message"
    #: One part would not be a multi-part request: two is the easiest level.
    levels: ClassVar[tuple[int, ...]] = (3, 2)
    capability: ClassVar[str] = "multi_step_task_completion"

    def __init__(self, target: dict[str, Any] | None = None, toolkit: Any = None):
        super().__init__(target if target is not None else TARGET, toolkit)

    def build(self, seed: int, world: Any) -> Instance:
        tk, rng = self.toolkit, world.rng
        self.add_neighbour(world)
        user = tk.add_user(world)
        cases = []
        for _ in range(self.cases):
            kind = rng.choice(KINDS)
            if kind == "cancel":
                order = tk.add_order(world, user.user_id, "pending", self.pick_lines(world, rng.randint(1, 2)))
                reason = rng.choice(tk.cancel_reasons)
                cases.append(Case(kind, order.order_id, f"Cancel order {order.order_id}, reason: {reason}.",
                                  reason=reason))
            elif kind == "return":
                order = tk.add_order(world, user.user_id, "delivered", self.pick_lines(world, rng.randint(1, 3)))
                item = rng.choice(order.items)
                cases.append(Case(kind, order.order_id, f"Return the {item.name} from order {order.order_id}.",
                                  item_id=item.item_id))
            else:
                status = rng.choice(("pending", "processed", "delivered"))
                order = tk.add_order(world, user.user_id, status, self.pick_lines(world, rng.randint(1, 2)))
                cases.append(Case(kind, order.order_id, f"What is the status of order {order.order_id}?"))
        self.add_fillers(world, user.user_id, rng.randint(0, 2))
        self.shuffle_orders(world, user.user_id)
        listed = ", ".join(f"{i + 1}) {c.kind} {c.order_id}" for i, c in enumerate(cases))
        guidance = (f"The user made {self.cases} requests in one message: {listed}. Carry out every one of them, "
                    "looking each order up first, and only then send one final message that reports every "
                    "outcome: that message ends the conversation.")
        return Instance(user, cases, "all_at_once", guidance)

    def credit(self, case: Case) -> tuple[float, str | None]:
        looked = self.looked_up(case.order_id, before=self.decisive_turn(case.order_id))
        correct = self.done_exactly(case) and self.told_outcome(case)
        if correct:
            return 1.0, None
        what = (f"refund {self.refund(case)}" if case.kind in WRITE_KIND
                else f"status {self.order0(case.order_id).status}")
        why = f"not carried out exactly with the {what} told"
        return (0.3, why) if looked else (0.0, f"never addressed ({why})")

    def diagnostics(self) -> list[dict[str, Any]]:
        events = list(self.events)
        if self.done:
            touched = {c.args.get("order_id") for c in self.calls}
            for index, case in enumerate(self.inst.cases):
                oid = case.order_id
                if oid not in touched and not told(self.texts, oid[2:]):
                    events.append({"capability": self.capability, "event": "subrequest_unaddressed",
                                   "turn": self.turn, "detail": {"index": index, "kind": case.kind,
                                                                 "order_id": oid}})
        return events

    def oracle_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        acts = [self.act("get_order_details", order_id=case.order_id)]
        if case.kind in WRITE_KIND:
            return acts + self.write_actions(case), self.write_sentence(case)
        return acts, f"Order {case.order_id} is {self.order0(case.order_id).status}."

    def unskilled_case(self, case: Case) -> tuple[list[dict[str, Any]], str | None]:
        """Overlooks the request (the first one is always handled: see `unskilled`)."""
        return [], None

    def unskilled(self) -> list[dict[str, Any]]:
        """Handles only the first request, then reports (which ends the conversation)."""
        return self.mixed([True] + [False] * (len(self.inst.cases) - 1))


ENVIRONMENT = MultiStepTaskCompletionEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return MultiStepTaskCompletionEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return MultiStepTaskCompletionEnv().script(seed, skilled=False)
