"""Loose references: turn what the user says into exact tool arguments (capability: tool_call_precision).

Task. A user of the target's world makes the target's mix of requests (kit.py "Shape": its
kinds, how many, one at a time or all at once). Up to three of them (fewer at an easier level,
kit.py "Levels") are loose references: a request about an order -- cancel, return, exchange or
a status question; on tau2 retail also modify an item or the shipping address -- that refers to
the order loosely in three cases of four ('W1234567', '1234567', 'order number 1234567'... --
the target's loose forms of its own ids), and a cancel whose reason is always paraphrased ("I
ordered it by accident" must become 'ordered by mistake'); every instance keeps at least one
loose id or paraphrase. Item, new item and payment method ids are copied from the target's
tool results. The other requests (an address change, orders given by their exact id) are plain.

Reward (algorithmic; kit.py's multi-level formula over all requests; plain requests earn 1
when handled exactly, else 0):

    lookup(c)  = the order's details were fetched with its canonical id (before the write,
                 or before the end for a status question)
    correct(c) = the request done with exactly the canonical arguments (cancel with the enum
                 reason; the named item) and its refund / price difference / status told
    credit(c)  = 1 if correct, 0.3 if looked up (the intermediate step: the id was
                 normalised), else 0
    reward     = 1 if every credit is 1 and nothing else was written, else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): copies the user's
words into the call -- the target's own tool code answers with its error (the store rejects
the format, tau2 finds no such order) -- and gives that request up; it succeeds only on a
reference written exactly that needs no enum value. The target's errors are logged as
`malformed_argument`.

Why the skill transfers: the target takes ids only in canonical form and the cancel reason
only as one of its enum strings; its users write them loosely in these same ways, among the
target's other requests, and here the agent meets the target's own tools, schemas, error
texts and records.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import Plan, Request, ServiceEnv

P_LOOSE = 0.75


class ToolCallPrecisionEnv(ServiceEnv):
    """Requests with loosely written arguments among plain ones; see the module docstring."""

    name: ClassVar[str] = "tool_call_precision"
    version: ClassVar[str] = "3.0.0"
    description: ClassVar[str] = "Map loose order ids and paraphrased reasons to the exact tool arguments"
    capability: ClassVar[str] = "tool_call_precision"
    case_kinds: ClassVar[tuple[str, ...]] = ("cancel", "return", "exchange", "modify", "status", "order_address")

    def prepare(self, world: Any, user: Any, plan: Plan, cases: list[int]) -> None:
        self.n_cases, self.built = len(cases), []

    def build_case(self, world: Any, user: Any, kind: str, index: int) -> Request:
        tk, rng = self.toolkit, world.rng
        loose = rng.random() < P_LOOSE
        if index == self.n_cases - 1 and kind != "cancel" and not any(
                c.facts["ref"] != c.order_id or "said" in c.facts for c in self.built):
            loose = True  # every instance keeps a loose id or a paraphrased reason: exact copying never wins
        extra: dict[str, Any] = {}
        if kind == "cancel":
            extra["reason"] = rng.choice(tk.cancel_reasons)
            extra["said"] = rng.choice(tk.reason_paraphrases[extra["reason"]])
        case = self.by_id(world, user, kind, exclude=self.reserved, capability=True, **extra)
        ref = rng.choice(tk.loose_order_ids(case.order_id)) if loose else case.order_id
        self.restate(world, case, ref, extra.get("said"))
        self.built.append(case)
        return case

    def credit(self, case: Request) -> tuple[float, str | None]:
        oid = case.order_id
        lookup = self.looked_up(oid, before=self.decisive_turn(oid))
        if self.handled(case):
            return 1.0, None
        why = f"{case.kind} not carried out exactly with canonical arguments and its outcome told"
        if lookup:
            return 0.3, why
        return 0.0, f"order {oid} never looked up with its canonical id; {why}"

    def oracle_case(self, case: Request) -> tuple[list[dict[str, Any]], str]:
        return self.plain_actions(case)

    def unskilled_case(self, case: Request) -> tuple[list[dict[str, Any]], str]:
        """Copies the user's words into the call; on an error gives the request up."""
        ref = case.facts["ref"]
        sorry = f"Sorry, I could not process your order {ref}."
        acts = [self.act("get_order_details", order_id=ref)]
        if ref != case.order_id:
            return acts, sorry
        if case.kind == "cancel":  # the paraphrase goes into the call: the target rejects the reason
            order = self.order0(case.order_id)
            return acts + self.write_with_confirm(self.write_action(case, order, reason=case.facts["said"])), sorry
        return self.plain_actions(case)


ENVIRONMENT = ToolCallPrecisionEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return ToolCallPrecisionEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return ToolCallPrecisionEnv().script(seed, skilled=False)
