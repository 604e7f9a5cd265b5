"""Several requests at once: finish every part of a multi-part request (capability: multi_step_task_completion).

Task. A user of the target's world makes the target's mix of requests (kit.py "Shape": its
kinds and how many), conditioned on at least two -- the target's tasks that need this skill
are those whose requests come in one message -- and states up to three of them (two at the
easier level, kit.py "Levels") in one numbered opening message; any others follow one per
message ("Thanks. Also: ..."), as plain requests. Every request is of the target's kinds
(cancel, return, exchange, status, address change; on tau2 retail also item and shipping
address modifications) about an order given by its exact id, so no fixed sequence of calls
fits every instance. The agent must carry out every part of the message and report all its
outcomes in one reply -- which, when nothing follows, ends the conversation (the user has
nothing to add).

So the mode differs from the target's mix on purpose: every instance states two or more
requests at once (the target does in 67 % of store tasks, and in 14 % of tau2 retail's tasks of
two or more requests); its kinds, number of requests and length follow the target's tasks of two
or more requests (test_library_shape.py).

Reward (algorithmic; kit.py's multi-level formula over all requests; plain follow-ups earn 1
when handled exactly, else 0):

    addressed(p) = a call was made about p's record (a lookup, a write attempt)
    correct(p)   = p carried out exactly (the gold write with the gold arguments; none for a
                   status question) and its refund / price difference / status told
    credit(p)    = 1 if correct, 0.3 if addressed, else 0
    reward       = 1 if every request is correct and nothing else was written,
                   else 0.5 * mean credit

Without the skill (the store expert's planted gap, `solve_unskilled`): handles the first
request of the message and reports it, overlooking the rest of the message (any later
follow-ups it handles). Doing nothing earns 0; the ids are in the message, but each part also
needs its write or its status told.

Why the skill transfers: the target's users bundle requests the same way (the store's
compound tasks state two or three at once), with the target's own records, tools and tool
outputs here, and the target's verifier fails a task with any part left undone.
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.environment.library.kit import KIND_TOOL, Plan, Request, ServiceEnv


class MultiStepTaskCompletionEnv(ServiceEnv):
    """Two or three requests in one message (then any others one by one); see the module docstring."""

    name: ClassVar[str] = "multi_step_task_completion"
    version: ClassVar[str] = "3.0.0"
    description: ClassVar[str] = "Carry out every one of several requests stated in one message"
    #: One part would not be a multi-part request: two is the easiest level.
    levels: ClassVar[tuple[int, ...]] = (3, 2)
    capability: ClassVar[str] = "multi_step_task_completion"
    case_kinds: ClassVar[tuple[str, ...]] = tuple(KIND_TOOL)
    min_requests: ClassVar[int] = 2

    def chosen_cases(self, plan: Plan) -> list[int]:
        """The opening message's requests: the first `cases` of them."""
        return list(range(min(self.cases, len(plan.kinds))))

    def groups_for(self, plan: Plan, cases: list[int]) -> list[list[int]]:
        return [cases] + [[i] for i in range(len(cases), len(plan.kinds))]

    def build_case(self, world: Any, user: Any, kind: str, index: int) -> Request:
        return self.by_id(world, user, kind, capability=True)

    def credit(self, case: Request) -> tuple[float, str | None]:
        if self.handled(case):
            return 1.0, None
        why = "not carried out exactly with its outcome told"
        return (0.3, why) if self.addressed(case) else (0.0, f"never addressed ({why})")

    def diagnostics(self) -> list[dict[str, Any]]:
        events = list(self.events)
        if self.done:
            for index, req in enumerate(self.inst.requests):
                if req.capability and not self.addressed(req):
                    events.append({"capability": self.capability, "event": "subrequest_unaddressed",
                                   "turn": self.turn, "detail": {"index": index, "kind": req.kind,
                                                                 "record": req.record}})
        return events

    def oracle_case(self, case: Request) -> tuple[list[dict[str, Any]], str]:
        return self.plain_actions(case)

    def unskilled_case(self, case: Request) -> tuple[list[dict[str, Any]], str | None]:
        """Handles the first request of the message; overlooks the others."""
        if self.script_state["position"] == 0:
            return self.plain_actions(case)
        return [], None


ENVIRONMENT = MultiStepTaskCompletionEnv


def solve(seed: int) -> list[dict[str, Any]]:
    """Oracle actions reaching reward 1 on `seed`."""
    return MultiStepTaskCompletionEnv().script(seed, skilled=True)


def solve_unskilled(seed: int) -> list[dict[str, Any]]:
    """What an agent without the skill does on `seed`."""
    return MultiStepTaskCompletionEnv().script(seed, skilled=False)
