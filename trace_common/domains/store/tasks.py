"""Procedural store tasks: one seed -> one database, one user scenario, one gold outcome.

Four task types, one per capability the domain exercises (the seed picks the type:
`types[seed % len(types)]`, so every split is balanced):

| task type            | capability                 | what the user asks                                        |
|----------------------|----------------------------|-----------------------------------------------------------|
| record_selection     | structured_data_reasoning  | cancel / return / exchange an item named by its attributes, among look-alike orders |
| multi_request        | multi_step_task_completion | 2-3 sub-requests (cancel, return, status, address), stated all at once (80 %) or one after another |
| precondition_check   | precondition_verification  | cancel an order given by id; in 60 % it is not pending, so the right answer is a refusal naming its status |
| argument_format      | tool_call_precision        | cancel / status / return with the order id written loosely ('W12345', '12345'...) and the cancel reason paraphrased |

Each sub-request records the write actions that fulfil it (`gold`), the database records
those touch, and the information the agent must tell the user (a refund amount, a
status). `facts` holds what a scripted expert needs (including the look-alike "decoy"
record that a policy without the skill picks); it is never shown to the agent.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trace_common.domains.store.tools import CANCEL_REASONS
from trace_common.domains.store.world import (
    IdPool,
    base_world,
    money,
    new_order,
    order_total,
    random_address,
    random_items,
    spoken_item,
)

TASK_TYPES = ("record_selection", "multi_request", "precondition_check", "argument_format")
CAPABILITY_OF = {
    "record_selection": "structured_data_reasoning",
    "multi_request": "multi_step_task_completion",
    "precondition_check": "precondition_verification",
    "argument_format": "tool_call_precision",
}
CAPABILITIES = tuple(CAPABILITY_OF.values())

REASON_PARAPHRASES = {
    "no longer needed": ("I don't need it anymore", "I no longer need it", "I changed my mind about it"),
    "ordered by mistake": ("I ordered it by accident", "I bought it by mistake", "it was an accidental order"),
}
LOOSE_ID_STYLES = ("W{d}", "{d}", "#{d}", "w{d}", "order number {d}")

Kind = Literal["cancel", "cancel_refused", "return", "exchange", "status", "address"]


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
    facts: dict[str, Any] = Field(default_factory=dict, description="Expert-only facts.")


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
    capability: str
    user_id: str
    scenario: UserScenario
    subrequests: list[SubRequest]
    db: dict[str, Any] = Field(description="Initial database.")

    def gold_actions(self) -> list[dict[str, Any]]:
        return [a for sr in self.subrequests for a in sr.gold]


# -- helpers -------------------------------------------------------------------------------------

def _greeting(user: dict[str, Any]) -> str:
    return f"Hi, I'm {user['first'].title()} {user['last'].title()}, my email is {user['email']}."


def _loose_id(order_id: str, rng: random.Random) -> str:
    return rng.choice(LOOSE_ID_STYLES).format(d=order_id[2:])


def _fillers(db: dict[str, Any], ids: IdPool, user: dict[str, Any], rng: random.Random, count: int,
             exclude_products: tuple[str, ...] = (), statuses: tuple[str, ...] = ("pending", "processed",
                                                                                   "delivered", "cancelled")) -> None:
    for _ in range(count):
        new_order(db, ids, user, rng.choice(statuses),
                  random_items(db, rng, rng.randint(1, 2), exclude_products), rng)


def _cancel_sub(order: dict[str, Any], reason: str, text: str, **facts: Any) -> SubRequest:
    return SubRequest(kind="cancel", text=text, order_id=order["order_id"],
                      gold=[{"name": "cancel_pending_order",
                             "arguments": {"order_id": order["order_id"], "reason": reason}}],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=money(order_total(order)))],
                      facts={"reason": reason, **facts})


def _return_sub(order: dict[str, Any], row: dict[str, Any], text: str, **facts: Any) -> SubRequest:
    return SubRequest(kind="return", text=text, order_id=order["order_id"],
                      gold=[{"name": "return_delivered_order_items",
                             "arguments": {"order_id": order["order_id"], "item_ids": [row["item_id"]],
                                           "payment_method_id": order["payment_method_id"]}}],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=money(row["price"]))],
                      facts={"item_id": row["item_id"], **facts})


def _status_sub(order: dict[str, Any], text: str, **facts: Any) -> SubRequest:
    return SubRequest(kind="status", text=text, order_id=order["order_id"],
                      records=[f"orders/{order['order_id']}"],
                      required_info=[RequiredInfo(value=order["status"], anchor=order["order_id"][2:])],
                      facts={"status": order["status"], **facts})


def _order(db: dict[str, Any], ids: IdPool, user: dict[str, Any], rng: random.Random, status: str,
           n_items: int) -> dict[str, Any]:
    return new_order(db, ids, user, status, random_items(db, rng, n_items), rng)


# -- generators ------------------------------------------------------------------------------------

def _record_selection(db: dict[str, Any], ids: IdPool, user: dict[str, Any],
                      rng: random.Random) -> list[SubRequest]:
    action = rng.choice(("cancel", "return", "exchange"))
    status = "pending" if action == "cancel" else "delivered"
    products = db["products"]
    pid = rng.choice(list(products))
    product = products[pid]
    variants = list(product["variants"])
    available = [v for v in variants if product["variants"][v]["available"]]
    if action == "exchange" and not available:
        action = "return"
    if action == "exchange":
        new_item = rng.choice(available)
        rest = [v for v in variants if v != new_item]
        target, decoy = rng.sample(rest, 2)
    else:
        new_item = None
        target, decoy = rng.sample(variants, 2)

    def with_extra(item: str) -> list[tuple[str, str]]:
        extra = random_items(db, rng, rng.randint(0, 1), exclude_products=(pid,))
        return [(pid, item), *extra]

    gold = new_order(db, ids, user, status, with_extra(target), rng)
    decoy_order = new_order(db, ids, user, status, with_extra(decoy), rng)
    if rng.random() < 0.5:  # the exact item, but in an order whose status forbids the request
        wrong_status = rng.choice(("processed", "delivered") if status == "pending" else ("pending", "processed"))
        new_order(db, ids, user, wrong_status, with_extra(target), rng)
    if rng.random() < 0.5:  # right status, other products
        new_order(db, ids, user, status, random_items(db, rng, rng.randint(1, 2), exclude_products=(pid,)), rng)
    _fillers(db, ids, user, rng, rng.randint(0, 1), exclude_products=(pid,))
    # listing order: shuffled, but the look-alike decoy comes before the gold order
    orders = user["orders"]
    rng.shuffle(orders)
    gi, di = orders.index(gold["order_id"]), orders.index(decoy_order["order_id"])
    if di > gi:
        orders[gi], orders[di] = orders[di], orders[gi]

    target_row = next(r for r in gold["items"] if r["item_id"] == target)
    spoken = spoken_item(product["name"], target_row["options"])
    facts = {"decoy_order_id": decoy_order["order_id"], "decoy_item_id": decoy, "product_id": pid,
             "item_id": target}
    if action == "cancel":
        reason = rng.choice(CANCEL_REASONS)
        return [_cancel_sub(gold, reason, f"Please cancel the order with my {spoken}. Reason: {reason}.",
                            **facts)]
    if action == "return":
        return [_return_sub(gold, target_row, f"I want to return the {spoken} I received.", **facts)]
    assert new_item is not None
    new_variant = product["variants"][new_item]
    diff = new_variant["price"] - target_row["price"]
    args = {"order_id": gold["order_id"], "item_ids": [target], "new_item_ids": [new_item],
            "payment_method_id": gold["payment_method_id"]}
    return [SubRequest(kind="exchange", order_id=gold["order_id"],
                       text=f"I want to exchange the {spoken} I received for the "
                            f"{' '.join(new_variant['options'])} one.",
                       gold=[{"name": "exchange_delivered_order_items", "arguments": args}],
                       records=[f"orders/{gold['order_id']}"],
                       required_info=[RequiredInfo(value=money(abs(diff)))],
                       facts={**facts, "new_item_id": new_item})]


def _multi_request(db: dict[str, Any], ids: IdPool, user: dict[str, Any],
                   rng: random.Random) -> list[SubRequest]:
    kinds = rng.sample(("cancel", "return", "status", "address"), 2 if rng.random() < 0.6 else 3)
    subs: list[SubRequest] = []
    for kind in kinds:
        if kind == "cancel":
            order = _order(db, ids, user, rng, "pending", rng.randint(1, 2))
            reason = rng.choice(CANCEL_REASONS)
            subs.append(_cancel_sub(order, reason, f"Cancel order {order['order_id']}, reason: {reason}."))
        elif kind == "return":
            order = _order(db, ids, user, rng, "delivered", rng.randint(1, 3))
            row = rng.choice(order["items"])
            subs.append(_return_sub(order, row, f"Return the {row['name']} from order {order['order_id']}."))
        elif kind == "status":
            order = _order(db, ids, user, rng, rng.choice(("pending", "processed", "delivered")),
                           rng.randint(1, 2))
            subs.append(_status_sub(order, f"What is the status of order {order['order_id']}?"))
        else:
            address = random_address(rng)
            while address == user["address"]:
                address = random_address(rng)
            subs.append(SubRequest(kind="address", text=f"Update my address to {address}.",
                                   gold=[{"name": "modify_user_address",
                                          "arguments": {"user_id": user["user_id"], "address": address}}],
                                   records=[f"users/{user['user_id']}"], facts={"address": address}))
    _fillers(db, ids, user, rng, rng.randint(0, 2))
    rng.shuffle(user["orders"])
    return subs


def _precondition_check(db: dict[str, Any], ids: IdPool, user: dict[str, Any],
                        rng: random.Random) -> list[SubRequest]:
    status = "pending" if rng.random() < 0.4 else rng.choice(("processed", "delivered"))
    order = _order(db, ids, user, rng, status, rng.randint(1, 3))
    _fillers(db, ids, user, rng, rng.randint(1, 3))
    rng.shuffle(user["orders"])
    reason = rng.choice(CANCEL_REASONS)
    text = f"Please cancel order {order['order_id']}. Reason: {reason}."
    if status == "pending":
        return [_cancel_sub(order, reason, text, status=status)]
    return [SubRequest(kind="cancel_refused", text=text, order_id=order["order_id"],
                       records=[f"orders/{order['order_id']}"],
                       required_info=[RequiredInfo(value=status, anchor=order["order_id"][2:])],
                       facts={"status": status, "reason": reason})]


def _argument_format(db: dict[str, Any], ids: IdPool, user: dict[str, Any],
                     rng: random.Random) -> list[SubRequest]:
    kind = rng.choice(("cancel", "cancel", "status", "return"))
    _fillers(db, ids, user, rng, rng.randint(0, 2))
    if kind == "cancel":
        order = _order(db, ids, user, rng, "pending", rng.randint(1, 2))
        reason = rng.choice(CANCEL_REASONS)
        paraphrase = rng.choice(REASON_PARAPHRASES[reason])
        ref = order["order_id"] if rng.random() < 0.3 else _loose_id(order["order_id"], rng)
        sub = _cancel_sub(order, reason, f"Please cancel my order {ref}, {paraphrase}.",
                          raw_order_ref=ref, raw_reason=paraphrase)
    elif kind == "status":
        order = _order(db, ids, user, rng, rng.choice(("pending", "processed", "delivered")), rng.randint(1, 2))
        ref = _loose_id(order["order_id"], rng)
        sub = _status_sub(order, f"What is the status of my order {ref}?", raw_order_ref=ref)
    else:
        order = _order(db, ids, user, rng, "delivered", rng.randint(1, 3))
        row = rng.choice(order["items"])
        ref = _loose_id(order["order_id"], rng)
        sub = _return_sub(order, row, f"I want to return the {row['name']} from my order {ref}.",
                          raw_order_ref=ref)
    rng.shuffle(user["orders"])
    return [sub]


GENERATORS = {
    "record_selection": _record_selection,
    "multi_request": _multi_request,
    "precondition_check": _precondition_check,
    "argument_format": _argument_format,
}


def generate_task(seed: int, task_types: tuple[str, ...] = TASK_TYPES) -> Task:
    """The task of `seed`: identical for the same (seed, task_types) in every process."""
    task_type = task_types[seed % len(task_types)]
    rng = random.Random(seed)
    db, ids = base_world(rng)
    user = next(iter(db["users"].values()))
    subs = GENERATORS[task_type](db, ids, user, rng)
    greeting = _greeting(user)
    if task_type == "multi_request" and rng.random() < 0.2:
        mode: Literal["all_at_once", "sequential"] = "sequential"
        opening = f"{greeting} {subs[0].text}"
        followups = [f"Thanks. Also: {sr.text}" for sr in subs[1:]]
    else:
        mode, followups = "all_at_once", []
        if len(subs) == 1:
            opening = f"{greeting} {subs[0].text}"
        else:
            numbered = " ".join(f"{i + 1}) {sr.text}" for i, sr in enumerate(subs))
            opening = f"{greeting} I have {len(subs)} requests. {numbered}"
    scenario = UserScenario(first=user["first"], last=user["last"], email=user["email"], mode=mode,
                            opening=opening, followups=followups)
    return Task(task_id=str(seed), seed=seed, task_type=task_type, capability=CAPABILITY_OF[task_type],
                user_id=user["user_id"], scenario=scenario, subrequests=subs, db=db)
