"""Write gates: check an order's status before writing to it (capability: precondition_verification).

Task. A user of the target's world asks, one request after the other (the store's
sequential protocol), for three writes (fewer at an easier level, kit.py "Levels") on orders they give by id: cancel an order (with a
reason; two cases in three) or return one named item of an order. Each order's status
allows the request half of the time (cancel: pending; return: delivered; at the two-case level
the second case is forbidden whenever the first is allowed); otherwise it is
one the target forbids (cancel: processed or delivered; return: pending or processed) and
the right answer is a refusal that tells the user the status. The agent has all of the
target's tools, and the target's own tool code refuses a forbidden write.

Reward (algorithmic; kit.py's multi-level formula over the three cases):

    checked(c)  = the order's details were shown (get_order_details, or the order listing)
                  before the first write attempt on it, or before the end if none
    correct(c)  = allowed:   the write was made with the user's arguments and the refund
                             amount was told
                  forbidden: no write was attempted and the status was told next to the id
    credit(c)   = 0    if a write on the order was refused for its status (a violation)
                = 1    if checked and correct
                = 0.4  if checked (the intermediate step: the status was read)
                = 0.25 if correct without checking (a blind write that happened to be allowed)
                = 0    otherwise
    reward      = 1 if every credit is 1 and nothing else was written, else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): cancels blind and
returns after a lookup whatever the status says -- right only where the status allows it,
refused by the tool elsewhere. Doing nothing earns 0; writing blind cannot pass a
forbidden case, refusing blind cannot name a status it never read.

Why the skill transfers: the conversation is the target's own -- its system prompt, all of
its tools with their schemas, its records, ids and amounts, its tool outputs and refusals
(produced by the target's tool code) -- and the target's policy requires exactly this check
before every write; there a forbidden write costs the whole task.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import WRITE_KIND, Case, Instance, ServiceEnv, told

#: Target parameters; TRACE bakes the real ones in when it bundles this module.
TARGET: dict[str, Any] | None = None
#: statuses that forbid each write (never 'cancelled': the refusal names a live order)
FORBIDDING = {"cancel": ("processed", "delivered"), "return": ("pending", "processed")}


class PreconditionVerificationEnv(ServiceEnv):
    """Three write requests, each allowed or forbidden by the order's status; see the module docstring."""

    name: ClassVar[str] = "precondition_verification"
    version: ClassVar[str] = "2.0.0"
    description: ClassVar[str] = "Check an order's status before cancelling or returning; refuse when it forbids"
    capability: ClassVar[str] = "precondition_verification"
    #: Two cases, at least one forbidden (see `build`); one case would be either a blind write's or an
    #: always-refuse policy's to win, no decision left.
    levels: ClassVar[tuple[int, ...]] = (3, 2)

    def __init__(self, target: dict[str, Any] | None = None, toolkit: Any = None):
        super().__init__(target if target is not None else TARGET, toolkit)

    def build(self, seed: int, world: Any) -> Instance:
        tk, rng = self.toolkit, world.rng
        self.add_neighbour(world)
        user = tk.add_user(world)
        cases = []
        for index in range(self.cases):
            kind = "cancel" if rng.random() < 2 / 3 else "return"
            allowed = rng.random() < 0.5
            if self.eased_last(index) and all(c.facts["allowed"] for c in cases):
                allowed = False  # an easier level keeps a forbidden case, so a blind write never succeeds
            status = tk.required_status[WRITE_KIND[kind]] if allowed else rng.choice(FORBIDDING[kind])
            order = tk.add_order(world, user.user_id, status, self.pick_lines(world, rng.randint(1, 3)))
            if kind == "cancel":
                reason = rng.choice(tk.cancel_reasons)
                cases.append(Case(kind, order.order_id, f"Please cancel order {order.order_id}. Reason: {reason}.",
                                  reason=reason, allowed=allowed, status=status))
            else:
                item = rng.choice(order.items)
                cases.append(Case(kind, order.order_id, f"Return the {item.name} from order {order.order_id}.",
                                  item_id=item.item_id, allowed=allowed, status=status))
        self.add_fillers(world, user.user_id, rng.randint(1, 2))
        self.shuffle_orders(world, user.user_id)
        hints = [f"order {c.order_id} is {c.facts['status']}, so the {c.kind} "
                 f"{'can be done' if c.facts['allowed'] else 'must be refused, naming the status'}" for c in cases]
        guidance = ("Before each write, read the order's status with get_order_details and write only when the "
                    "status allows it (cancel: pending orders; return: delivered orders); otherwise do not call the "
                    f"tool and tell the user the order's status. Here: {'; '.join(hints)}.")
        return Instance(user, cases, "sequential", guidance,
                        info={"allowed": [c.facts["allowed"] for c in cases]})

    def credit(self, case: Case) -> tuple[float, str | None]:
        oid = case.order_id
        checked = self.looked_up(oid, before=self.decisive_turn(oid))
        attempts = self.write_attempts(oid)
        if any(c.violation for c in attempts):
            return 0.0, f"write attempted on a {case.facts['status']} order (refused: the status forbids it)"
        if case.facts["allowed"]:
            correct = self.done_exactly(case) and told(self.texts, self.refund(case))
            missing = f"{case.kind} not done exactly with the refund {self.refund(case)} told"
        else:
            correct = not attempts and told(self.texts, case.facts["status"], anchor=oid[2:])
            missing = f"status {case.facts['status']} of {oid} not told"
        if checked and correct:
            return 1.0, None
        if checked:
            return 0.4, missing
        if correct:
            return 0.25, "the status was not checked before acting"
        return 0.0, f"status not checked; {missing}"

    def oracle_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        acts = [self.act("get_order_details", order_id=case.order_id)]
        if case.facts["allowed"]:
            return acts + self.write_actions(case), self.write_sentence(case)
        return acts, self.refusal_sentence(case.order_id, case.kind)

    def unskilled_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        """Cancels without looking; returns after a lookup whatever the status is."""
        acts = [] if case.kind == "cancel" else [self.act("get_order_details", order_id=case.order_id)]
        acts += self.write_actions(case)
        if case.facts["allowed"]:
            return acts, self.write_sentence(case)
        return acts, self.refusal_sentence(case.order_id, case.kind)  # what the tool's refusal said


ENVIRONMENT = PreconditionVerificationEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return PreconditionVerificationEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed` (the calibration stand-in's unskilled samples)."""
    return PreconditionVerificationEnv().script(seed, skilled=False)
