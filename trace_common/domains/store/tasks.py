"""Store task types and `generate_task`: one seed -> one database, one user scenario, one gold outcome.

The target task type is `compound` (see `compound.py`): one conversation whose 2-3
sub-requests together need 2 to 4 of the domain's four capabilities, as tau2 tasks do. The
four single-capability *probe* types below stay for the per-capability breakdown; their
generators are the original ones (a probe set picks the type `types[seed % len(types)]`,
so every split is balanced):

| probe type           | capability                 | what the user asks                                        |
|----------------------|----------------------------|-----------------------------------------------------------|
| record_selection     | structured_data_reasoning  | cancel / return / exchange an item named by its attributes, among look-alike orders |
| multi_request        | multi_step_task_completion | 2-3 sub-requests (cancel, return, status, address), stated all at once (80 %) or one after another |
| precondition_check   | precondition_verification  | cancel an order given by id; in 60 % it is not pending, so the right answer is a refusal naming its status |
| argument_format      | tool_call_precision        | cancel / status / return with the order id written loosely ('W12345', '12345'...) and the cancel reason paraphrased |

A probe task's `capabilities` is its one capability; its sub-requests' traits (see
`task_model.py`) are filled in after generation, from what the generator built.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal

from trace_common.domains.store.compound import compound_subrequests
from trace_common.domains.store.task_model import (
    CAPABILITIES,
    LOOSE_ID_STYLES,
    MULTI,
    PRECISION,
    PRECONDITION,
    REASON_PARAPHRASES,
    SDR,
    RequiredInfo,
    SubRequest,
    Task,
    UserScenario,
    cancel_sub,
    return_sub,
    status_sub,
    trait_capabilities,
)
from trace_common.domains.store.tools import CANCEL_REASONS
from trace_common.domains.store.world import (
    IdPool,
    base_world,
    money,
    new_order,
    random_address,
    random_items,
    spoken_item,
)

COMPOUND = "compound"
PROBE_TYPES = ("record_selection", "multi_request", "precondition_check", "argument_format")
#: every task type; an environment plays either ("compound",) or a subset of PROBE_TYPES
TASK_TYPES = (COMPOUND, *PROBE_TYPES)
DEFAULT_TASK_TYPES = (COMPOUND,)
#: probe type -> the capability it tests (compound tasks have no single capability)
CAPABILITY_OF = {
    "record_selection": SDR,
    "multi_request": MULTI,
    "precondition_check": PRECONDITION,
    "argument_format": PRECISION,
}

__all__ = ["CAPABILITIES", "CAPABILITY_OF", "COMPOUND", "DEFAULT_TASK_TYPES", "PROBE_TYPES", "REASON_PARAPHRASES",
           "TASK_TYPES", "RequiredInfo", "SubRequest", "Task", "UserScenario", "generate_task"]


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
        return [cancel_sub(gold, reason, f"Please cancel the order with my {spoken}. Reason: {reason}.",
                            **facts)]
    if action == "return":
        return [return_sub(gold, target_row, f"I want to return the {spoken} I received.", **facts)]
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
            subs.append(cancel_sub(order, reason, f"Cancel order {order['order_id']}, reason: {reason}."))
        elif kind == "return":
            order = _order(db, ids, user, rng, "delivered", rng.randint(1, 3))
            row = rng.choice(order["items"])
            subs.append(return_sub(order, row, f"Return the {row['name']} from order {order['order_id']}."))
        elif kind == "status":
            order = _order(db, ids, user, rng, rng.choice(("pending", "processed", "delivered")),
                           rng.randint(1, 2))
            subs.append(status_sub(order, f"What is the status of order {order['order_id']}?"))
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
        return [cancel_sub(order, reason, text, status=status)]
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
        sub = cancel_sub(order, reason, f"Please cancel my order {ref}, {paraphrase}.",
                          raw_order_ref=ref, raw_reason=paraphrase)
    elif kind == "status":
        order = _order(db, ids, user, rng, rng.choice(("pending", "processed", "delivered")), rng.randint(1, 2))
        ref = _loose_id(order["order_id"], rng)
        sub = status_sub(order, f"What is the status of my order {ref}?", raw_order_ref=ref)
    else:
        order = _order(db, ids, user, rng, "delivered", rng.randint(1, 3))
        row = rng.choice(order["items"])
        ref = _loose_id(order["order_id"], rng)
        sub = return_sub(order, row, f"I want to return the {row['name']} from my order {ref}.",
                          raw_order_ref=ref)
    rng.shuffle(user["orders"])
    return [sub]


GENERATORS: dict[str, Callable[[dict[str, Any], IdPool, dict[str, Any], random.Random], list[SubRequest]]] = {
    "record_selection": _record_selection,
    "multi_request": _multi_request,
    "precondition_check": _precondition_check,
    "argument_format": _argument_format,
}


def _probe_traits(task_type: str, sr: SubRequest) -> list[str]:
    """The traits a probe generator built into `sr` (it does not record them itself)."""
    if task_type == "record_selection":
        return ["by_attributes"]
    if task_type == "precondition_check":
        return ["forbidden_status"] if sr.kind == "cancel_refused" else []
    if task_type == "argument_format":
        traits = ["loose_id"] if sr.facts["raw_order_ref"] != sr.order_id else []
        return traits + (["paraphrased_reason"] if "raw_reason" in sr.facts else [])
    return []


def _numbered_opening(greeting: str, subs: list[SubRequest]) -> str:
    if len(subs) == 1:
        return f"{greeting} {subs[0].text}"
    numbered = " ".join(f"{i + 1}) {sr.text}" for i, sr in enumerate(subs))
    return f"{greeting} I have {len(subs)} requests. {numbered}"


def generate_task(seed: int, task_types: tuple[str, ...] = DEFAULT_TASK_TYPES) -> Task:
    """The task of `seed`: identical for the same (seed, task_types) in every process.
    `task_types` is ("compound",) or a subset of PROBE_TYPES (StoreEnv checks it)."""
    task_type = task_types[seed % len(task_types)]
    rng = random.Random(seed)
    db, ids = base_world(rng)
    user = next(iter(db["users"].values()))
    greeting = _greeting(user)
    mode: Literal["all_at_once", "sequential"]
    if task_type == COMPOUND:
        subs, all_at_once = compound_subrequests(db, ids, user, rng)
        mode = "all_at_once" if all_at_once else "sequential"
        capabilities = {c for sr in subs for c in sr.capabilities} | ({MULTI} if all_at_once else set())
        capability = None
    else:
        subs = GENERATORS[task_type](db, ids, user, rng)
        mode = "sequential" if task_type == "multi_request" and rng.random() < 0.2 else "all_at_once"
        for sr in subs:
            sr.traits = _probe_traits(task_type, sr)
            sr.capabilities = trait_capabilities(sr.traits)
        capability = CAPABILITY_OF[task_type]
        capabilities = {capability}
    if mode == "sequential":
        opening = f"{greeting} {subs[0].text}"
        followups = [f"Thanks. Also: {sr.text}" for sr in subs[1:]]
    else:
        opening, followups = _numbered_opening(greeting, subs), []
    scenario = UserScenario(first=user["first"], last=user["last"], email=user["email"], mode=mode,
                            opening=opening, followups=followups)
    return Task(task_id=str(seed), seed=seed, task_type=task_type, capability=capability,
                capabilities=sorted(capabilities), user_id=user["user_id"], scenario=scenario,
                subrequests=subs, db=db)
