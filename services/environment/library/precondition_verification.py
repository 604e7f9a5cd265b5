"""Write gates: check an order's status before writing to it (capability: precondition_verification).

Task. A user of the target's world makes the target's mix of requests (kit.py "Shape": its
kinds, how many, one at a time or all at once). Up to three of them (fewer at an easier level,
kit.py "Levels") are write gates: an order write (cancel with a reason, return or exchange an
item; on tau2 retail also modify an item or the shipping address) on an order given by its id,
whose status allows the request half of the time (cancel and modifications: pending; return and
exchange: delivered) and otherwise is one the target forbids (cancel and modifications: processed
or delivered; return and exchange: pending or processed) -- at least one gate per instance is
forbidden. The right answer to a forbidden gate is a refusal that tells the user the status; the
target's own tool code refuses a forbidden write. The other requests are plain.

Reward (algorithmic; kit.py's multi-level formula over all requests; plain requests earn 1
when handled exactly, else 0):

    checked(c)  = the order's details were shown (get_order_details, or the order listing)
                  before the first write attempt on it, or before the end if none
    correct(c)  = allowed:   the write was made with the user's arguments and its refund /
                             price difference was told
                  forbidden: no write was attempted and the status was told next to the id
    credit(c)   = 0    if a write on the order was refused for its status (a violation)
                = 1    if checked and correct
                = 0.4  if checked (the intermediate step: the status was read)
                = 0.25 if correct without checking (a blind write that happened to be allowed)
                = 0    otherwise
    reward      = 1 if every credit is 1 and nothing else was written, else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): cancels blind and
writes the other gates after a lookup whatever the status says -- right only where the status
allows it, refused by the tool elsewhere; plain requests are handled as the oracle does. Doing
nothing earns 0; writing blind cannot pass a forbidden gate, refusing blind cannot name a
status it never read, and refusing everything fails the plain writes.

Why the skill transfers: the conversation is the target's own -- its system prompt, all of
its tools with their schemas, its records, ids and amounts, its tool outputs and refusals
(produced by the target's tool code), its mix of requests -- and the target's policy requires
exactly this check before every write; there a forbidden write costs the whole task.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import (
    FORBIDDING,
    ORDER_WRITES,
    SWAPS,
    Instance,
    Plan,
    Request,
    ServiceEnv,
)


class PreconditionVerificationEnv(ServiceEnv):
    """Write requests allowed or forbidden by the order's status among plain ones; see the module docstring."""

    name: ClassVar[str] = "precondition_verification"
    version: ClassVar[str] = "3.0.0"
    description: ClassVar[str] = "Check an order's status before cancelling, returning or changing it; refuse when it forbids"
    capability: ClassVar[str] = "precondition_verification"
    levels: ClassVar[tuple[int, ...]] = (3, 2)
    case_kinds: ClassVar[tuple[str, ...]] = ORDER_WRITES

    def prepare(self, world: Any, user: Any, plan: Plan, cases: list[int]) -> None:
        self.n_cases, self.built = len(cases), []

    def build_case(self, world: Any, user: Any, kind: str, index: int) -> Request:
        rng = world.rng
        allowed = rng.random() < 0.5
        if index == self.n_cases - 1 and all(c.facts["allowed"] for c in self.built):
            allowed = False  # every instance keeps a forbidden gate, so a blind write never wins
        status = self.required(kind) if allowed else rng.choice(FORBIDDING[kind])
        case = self.by_id(world, user, kind, status=status, exclude=self.reserved, capability=True)
        self.built.append(case)
        return case

    def build(self, world: Any, plan: Plan) -> Instance:
        inst = super().build(world, plan)
        inst.info["allowed"] = [c.facts["allowed"] for c in inst.cases]
        return inst

    def credit(self, case: Request) -> tuple[float, str | None]:
        oid = case.order_id
        checked = self.looked_up(oid, before=self.decisive_turn(oid))
        if any(c.violation for c in self.write_attempts(oid)):
            return 0.0, f"write attempted on a {case.facts['status']} order (refused: the status forbids it)"
        correct = self.handled(case)
        missing = (f"{case.kind} not done exactly with its outcome told" if case.facts["allowed"]
                   else f"status {case.facts['status']} of {oid} not told, or a write attempted")
        if checked and correct:
            return 1.0, None
        if checked:
            return 0.4, missing
        if correct:
            return 0.25, "the status was not checked before acting"
        return 0.0, f"status not checked; {missing}"

    def oracle_case(self, case: Request) -> tuple[list[dict[str, Any]], str]:
        return self.plain_actions(case)

    def unskilled_case(self, case: Request) -> tuple[list[dict[str, Any]], str]:
        """Cancels without looking; writes the other gates after a lookup whatever the status is."""
        order = self.order0(case.order_id)
        action = case.gold or self.write_action(case, order)
        acts = [] if case.kind == "cancel" else [self.act("get_order_details", order_id=case.order_id)]
        if case.kind in SWAPS:
            acts.append(self.act("get_product_details", product_id=case.facts["product_id"]))
        return acts + self.write_with_confirm(action), case.sentence  # a refusal: what the tool's error said


ENVIRONMENT = PreconditionVerificationEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return PreconditionVerificationEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed` (the calibration stand-in's unskilled samples)."""
    return PreconditionVerificationEnv().script(seed, skilled=False)
