"""The store task's data model, and the sub-request builders the probe and compound generators share.

A `Task` is one customer conversation: the user, what they say (`UserScenario`), their
sub-requests and the initial database. Each `SubRequest` records the write actions that
fulfil it (`gold`), the database records those touch, the information the agent must tell
the user, its *traits* (what makes it hard) and the capabilities those traits need:

| trait               | what it means                                                      | needs                      |
|---------------------|--------------------------------------------------------------------|----------------------------|
| by_attributes       | the order is designated by an item's attributes among look-alike orders | structured_data_reasoning |
| forbidden_status    | the order (given by id) has a status that forbids the request: the right answer is a refusal naming the status | precondition_verification |
| loose_id            | the order id is written loosely ('W12345', '12345', 'order number 12345'...) | tool_call_precision |
| paraphrased_reason  | the cancel reason is paraphrased                                   | tool_call_precision, unless forbidden_status (no call takes the reason then) |

`facts` holds what a scripted expert needs (the look-alike "decoy", the user's raw words);
it is never shown to the agent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trace_common.domains.store.world import money, order_total

SDR = "structured_data_reasoning"
MULTI = "multi_step_task_completion"
PRECONDITION = "precondition_verification"
PRECISION = "tool_call_precision"
#: the four capabilities the domain exercises, in the order of the probe task types
CAPABILITIES = (SDR, MULTI, PRECONDITION, PRECISION)

TRAITS = ("by_attributes", "forbidden_status", "loose_id", "paraphrased_reason")

REASON_PARAPHRASES = {
    "no longer needed": ("I don't need it anymore", "I no longer need it", "I changed my mind about it"),
    "ordered by mistake": ("I ordered it by accident", "I bought it by mistake", "it was an accidental order"),
}
LOOSE_ID_STYLES = ("W{d}", "{d}", "#{d}", "w{d}", "order number {d}")

Kind = Literal["cancel", "cancel_refused", "return", "return_refused", "exchange", "exchange_refused",
               "status", "address"]


def trait_capabilities(traits: list[str]) -> list[str]:
    """The capabilities a sub-request with `traits` needs (sorted; see the module table)."""
    out: set[str] = set()
    if "by_attributes" in traits:
        out.add(SDR)
    if "forbidden_status" in traits:
        out.add(PRECONDITION)
    if "loose_id" in traits or ("paraphrased_reason" in traits and "forbidden_status" not in traits):
        out.add(PRECISION)
    return sorted(out)


class RequiredInfo(BaseModel):
    """`value` must appear in one sentence of an agent message, next to `anchor` when set
    (the 5 digits of an order id)."""

    model_config = ConfigDict(extra="forbid")

    value: str
    anchor: str | None = None


class SubRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Kind
    text: str = Field(description="What the user says for this request.")
    order_id: str | None = None
    gold: list[dict[str, Any]] = Field(default_factory=list, description="Write actions {name, arguments}.")
    records: list[str] = Field(default_factory=list, description="'orders/<id>' or 'users/<id>' touched.")
    required_info: list[RequiredInfo] = Field(default_factory=list)
    traits: list[str] = Field(default_factory=list, description="What makes it hard (module table).")
    capabilities: list[str] = Field(default_factory=list, description="Capabilities its traits need (sorted).")
    facts: dict[str, Any] = Field(default_factory=dict, description="Expert-only facts.")

    @property
    def base_kind(self) -> str:
        """'cancel_refused' -> 'cancel'."""
        return self.kind.removesuffix("_refused")


class UserScenario(BaseModel):
    """What the scripted user knows and says."""

    model_config = ConfigDict(extra="forbid")

    first: str
    last: str
    email: str
    mode: Literal["all_at_once", "sequential"]
    opening: str = Field(description="First user message.")
    followups: list[str] = Field(default_factory=list, description="Sequential mode: one per later request.")


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str
    seed: int
    task_type: str
    capability: str | None = Field(default=None, description="Probe types only: the one capability tested.")
    capabilities: list[str] = Field(description="Capabilities the task needs (sorted). Compound: the union of "
                                                "its sub-requests' plus multi_step_task_completion when two or "
                                                "more requests come at once; probes: their one capability.")
    user_id: str
    scenario: UserScenario
    subrequests: list[SubRequest]
    db: dict[str, Any] = Field(description="Initial database.")

    def gold_actions(self) -> list[dict[str, Any]]:
        return [a for sr in self.subrequests for a in sr.gold]


# -- sub-request builders (shared by the generators) ------------------------------------------------

def cancel_sub(order: dict[str, Any], reason: str, text: str, **facts: Any) -> SubRequest:
    return SubRequest(kind="cancel", text=text, order_id=order["order_id"],
                      gold=[{"name": "cancel_pending_order",
                             "arguments": {"order_id": order["order_id"], "reason": reason}}],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=money(order_total(order)))],
                      facts={"reason": reason, **facts})


def return_sub(order: dict[str, Any], row: dict[str, Any], text: str, **facts: Any) -> SubRequest:
    return SubRequest(kind="return", text=text, order_id=order["order_id"],
                      gold=[{"name": "return_delivered_order_items",
                             "arguments": {"order_id": order["order_id"], "item_ids": [row["item_id"]],
                                           "payment_method_id": order["payment_method_id"]}}],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=money(row["price"]))],
                      facts={"item_id": row["item_id"], **facts})


def exchange_sub(order: dict[str, Any], row: dict[str, Any], new_variant: dict[str, Any], text: str,
                 **facts: Any) -> SubRequest:
    args = {"order_id": order["order_id"], "item_ids": [row["item_id"]], "new_item_ids": [new_variant["item_id"]],
            "payment_method_id": order["payment_method_id"]}
    diff = new_variant["price"] - row["price"]
    return SubRequest(kind="exchange", order_id=order["order_id"], text=text,
                      gold=[{"name": "exchange_delivered_order_items", "arguments": args}],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=money(abs(diff)))],
                      facts={"item_id": row["item_id"], "new_item_id": new_variant["item_id"],
                             "product_id": row["product_id"], **facts})


def status_sub(order: dict[str, Any], text: str, **facts: Any) -> SubRequest:
    return SubRequest(kind="status", text=text, order_id=order["order_id"],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=order["status"], anchor=order["order_id"][2:])],
                      facts={"status": order["status"], **facts})


def refused_sub(kind: Kind, order: dict[str, Any], text: str, **facts: Any) -> SubRequest:
    """A request the order's status forbids: no write; the status must be told next to the id."""
    return SubRequest(kind=kind, text=text, order_id=order["order_id"],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=order["status"], anchor=order["order_id"][2:])],
                      facts={"status": order["status"], **facts})


def address_sub(user: dict[str, Any], address: str, text: str) -> SubRequest:
    return SubRequest(kind="address", text=text,
                      gold=[{"name": "modify_user_address",
                             "arguments": {"user_id": user["user_id"], "address": address}}],
                      records=[f"users/{user['user_id']}"], facts={"address": address})
