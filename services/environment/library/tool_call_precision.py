"""Loose references: turn what the user says into exact tool arguments (capability: tool_call_precision).

Task. A user of the target's world makes three requests (fewer at an
easier level, kit.py "Levels"), one after the other, about orders
they refer to loosely in three cases of four ('W1234567', '1234567', 'order number
1234567'... -- the target's loose forms of its own ids) and exactly otherwise: cancel an
order with a paraphrased reason ("I ordered it by accident" must become 'ordered by
mistake'), return one named item (item and payment method ids copied from the order's
details), or tell an order's status. Kinds are balanced (1/3 each), so no fixed action fits.

Reward (algorithmic; kit.py's multi-level formula over the three requests):

    lookup(c)  = the order's details were fetched with its canonical id (before the write,
                 or before the end for a status question)
    correct(c) = the request done with exactly the canonical arguments (cancel with the enum
                 reason; return of exactly the named item) and the refund / status told
    credit(c)  = 1 if correct, 0.3 if looked up (the intermediate step: the id was
                 normalised), else 0
    reward     = 1 if every credit is 1 and nothing else was written, else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): copies the user's
words into the call -- the target's own tool code answers with its error (the store rejects
the format, tau2 finds no such order) -- and gives that request up; it succeeds only on a
request written exactly that needs no enum value. The target's errors are logged as
`malformed_argument`.

Why the skill transfers: the target takes ids only in canonical form and the cancel reason
only as one of its enum strings; its users write them loosely in these same ways, and here
the agent meets the target's own tools, schemas, error texts and records.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import WRITE_KIND, Case, Instance, ServiceEnv

TARGET: dict[str, Any] | None = None
P_LOOSE = 0.75


def _phrase(ref: str) -> str:
    """'order W12345' -- or the loose style's own words ('order number 12345')."""
    return ref if ref.startswith("order") else f"order {ref}"


class ToolCallPrecisionEnv(ServiceEnv):
    """Requests with loosely written arguments; see the module docstring."""

    name: ClassVar[str] = "tool_call_precision"
    version: ClassVar[str] = "2.0.0"
    description: ClassVar[str] = "Map loose order ids and paraphrased reasons to the exact tool arguments"
    capability: ClassVar[str] = "tool_call_precision"

    def __init__(self, target: dict[str, Any] | None = None, toolkit: Any = None):
        super().__init__(target if target is not None else TARGET, toolkit)

    def build(self, seed: int, world: Any) -> Instance:
        tk, rng = self.toolkit, world.rng
        self.add_neighbour(world)
        user = tk.add_user(world)
        cases = []
        for index in range(self.cases):
            kind = ("cancel", "return", "status")[rng.randrange(3)]
            status = {"cancel": "pending", "return": "delivered"}.get(kind) or rng.choice(
                ("pending", "processed", "delivered"))
            order = tk.add_order(world, user.user_id, status, self.pick_lines(world, rng.randint(1, 3)))
            oid = order.order_id
            loose = rng.random() < P_LOOSE
            if self.eased_last(index) and kind != "cancel" and not any(
                    c.facts["ref"] != c.order_id or "said" in c.facts for c in cases):
                loose = True  # an easier level keeps a loose id or a paraphrased reason: exact copying never wins
            ref = rng.choice(tk.loose_order_ids(oid)) if loose else oid
            facts: dict[str, Any] = {"ref": ref}
            if kind == "cancel":
                reason = rng.choice(tk.cancel_reasons)
                said = rng.choice(tk.reason_paraphrases[reason])
                text = f"Please cancel my {_phrase(ref)}, {said}."
                facts.update(reason=reason, said=said)
            elif kind == "return":
                item = rng.choice(order.items)
                text = f"I want to return the {item.name} from my {_phrase(ref)}."
                facts.update(item_id=item.item_id)
            else:
                text = f"What is the status of my {_phrase(ref)}?"
            cases.append(Case(kind, oid, text, **facts))
        self.add_fillers(world, user.user_id, rng.randint(0, 2))
        self.shuffle_orders(world, user.user_id)
        hints = []
        for c in cases:
            ref = c.facts["ref"]
            hints.append(f"'{ref}' is the order id '{c.order_id}'" if ref != c.order_id
                         else f"'{c.order_id}' is already exact")
            if "said" in c.facts:
                hints.append(f"'{c.facts['said']}' is the cancel reason '{c.facts['reason']}'")
        guidance = ("Tool arguments must be exact: order ids in canonical form, the cancel reason as one of its "
                    f"enum values, item and payment method ids copied from tool results. Here: {'; '.join(hints)}.")
        return Instance(user, cases, "sequential", guidance, info={"refs": [c.facts["ref"] for c in cases]})

    def credit(self, case: Case) -> tuple[float, str | None]:
        oid = case.order_id
        lookup = self.looked_up(oid, before=self.decisive_turn(oid))
        correct = self.done_exactly(case) and self.told_outcome(case)
        if correct:
            return 1.0, None
        why = f"{case.kind} not carried out exactly with canonical arguments and its outcome told"
        if lookup:
            return 0.3, why
        return 0.0, f"order {oid} never looked up with its canonical id; {why}"

    def oracle_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        acts = [self.act("get_order_details", order_id=case.order_id)]
        if case.kind in WRITE_KIND:
            return acts + self.write_actions(case), self.write_sentence(case)
        return acts, f"Order {case.order_id} is {self.order0(case.order_id).status}."

    def unskilled_case(self, case: Case) -> tuple[list[dict[str, Any]], str]:
        """Copies the user's words into the call; on an error gives the request up."""
        ref = case.facts["ref"]
        sorry = f"Sorry, I could not process your order {ref}."
        acts = [self.act("get_order_details", order_id=ref)]
        if ref != case.order_id:
            return acts, sorry
        if case.kind == "cancel":  # the paraphrase goes into the call: the target rejects the reason
            return acts + self.write_actions(case, reason=case.facts["said"]), sorry
        if case.kind == "return":
            return acts + self.write_actions(case), self.write_sentence(case)
        return acts, f"Order {case.order_id} is {self.order0(case.order_id).status}."


ENVIRONMENT = ToolCallPrecisionEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return ToolCallPrecisionEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return ToolCallPrecisionEnv().script(seed, skilled=False)
