"""The compound task type: the store's target, one conversation needing 2 to 4 capabilities.

One user, 2 or 3 sub-requests of distinct kinds (cancel, return, exchange, status,
address), each with traits drawn from the seed's generator (`task_model.py` has the trait
table). Together they need between two and four of the four capabilities:

| capability                 | which sub-requests need it                                                   |
|----------------------------|-------------------------------------------------------------------------------|
| structured_data_reasoning  | by_attributes: a cancel / return / exchange designating its order by an item's attributes; a look-alike decoy order (same product, other options, same status) is listed before it |
| precondition_verification  | forbidden_status: a cancel / return / exchange of an order given by id whose status forbids it; the right answer is a refusal naming the status, with no write |
| tool_call_precision        | loose_id (an order given by id, written loosely) or paraphrased_reason (a cancel that is carried out, its reason paraphrased) |
| multi_step_task_completion | the task, when its requests are stated all at once in the opening message (mode all_at_once); a sequential conversation, where the user gives the next request after each agent reply, does not need it |

The mixture (probabilities per draw; a draw whose required set has fewer than two
capabilities is redrawn from the same generator, so the result is still a function of the
seed):

    n sub-requests      2 with P_TWO, else 3; kinds: a sample without replacement of the five
    mode                all_at_once with P_ALL_AT_ONCE, else sequential
    cancel/return/exchange: by_attributes with P_ATTRIBUTES, else forbidden_status with
                        P_FORBIDDEN, else a plain order given by id
    loose_id            P_LOOSE_ID, for every sub-request naming its order by id (not address)
    paraphrased_reason  P_PARAPHRASE, for every cancel (carried out or refused)

Measured on the test split (600 tasks; `tests/unit/domains/store/test_compound.py` checks
these counts exactly): structured_data_reasoning 338 tasks (56 %), multi_step_task_completion
423 (70 %), precondition_verification 349 (58 %), tool_call_precision 358 (60 %); 366 tasks
need 2 capabilities, 200 need 3, 34 need all 4.

Products designated by attributes appear in no other order of the user than their gold,
decoy and (in half the cases) a same-item order whose status forbids the request, so the
designation is unique under the policy's rule ("the order whose item matches every
attribute and whose status allows the request").
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from trace_common.domains.store.task_model import (
    LOOSE_ID_STYLES,
    MULTI,
    REASON_PARAPHRASES,
    SubRequest,
    address_sub,
    cancel_sub,
    exchange_sub,
    refused_sub,
    return_sub,
    status_sub,
    trait_capabilities,
)
from trace_common.domains.store.tools import CANCEL_REASONS, REQUIRED_STATUS
from trace_common.domains.store.world import IdPool, new_order, random_address, random_items, spoken_item

P_TWO = 0.5
P_ALL_AT_ONCE = 0.5
P_ATTRIBUTES = 0.35
P_FORBIDDEN = 0.35
P_LOOSE_ID = 0.3
P_PARAPHRASE = 0.35

KINDS = ("cancel", "return", "exchange", "status", "address")
ORDER_WRITES = ("cancel", "return", "exchange")
_WRITE_TOOL = {"cancel": "cancel_pending_order", "return": "return_delivered_order_items",
               "exchange": "exchange_delivered_order_items"}
#: statuses that forbid each order write (never 'cancelled', so the refusal always names a live order)
FORBIDDING = {"cancel": ("processed", "delivered"), "return": ("pending", "processed"),
              "exchange": ("pending", "processed")}


@dataclass
class Spec:
    """One sub-request's drawn shape, before the database is built."""

    kind: str
    designation: str  # "attributes" | "forbidden" | "id" (address: "id", unused)
    loose_id: bool
    paraphrase: bool

    @property
    def traits(self) -> list[str]:
        out = {"attributes": ["by_attributes"], "forbidden": ["forbidden_status"], "id": []}[self.designation]
        return out + (["loose_id"] if self.loose_id else []) + (["paraphrased_reason"] if self.paraphrase else [])


def draw_specs(rng: random.Random) -> tuple[list[Spec], bool]:
    """Traits and mode, redrawn until the required set has 2-4 capabilities."""
    while True:
        kinds = rng.sample(KINDS, 2 if rng.random() < P_TWO else 3)
        all_at_once = rng.random() < P_ALL_AT_ONCE
        specs = []
        for kind in kinds:
            designation = "id"
            if kind in ORDER_WRITES:
                u = rng.random()
                designation = "attributes" if u < P_ATTRIBUTES else "forbidden" if u < P_ATTRIBUTES + P_FORBIDDEN \
                    else "id"
            loose = kind != "address" and designation != "attributes" and rng.random() < P_LOOSE_ID
            paraphrase = kind == "cancel" and rng.random() < P_PARAPHRASE
            specs.append(Spec(kind, designation, loose, paraphrase))
        required = {c for s in specs for c in trait_capabilities(s.traits)} | ({MULTI} if all_at_once else set())
        if 2 <= len(required) <= 4:
            return specs, all_at_once


def _order_phrase(ref: str) -> str:
    """'order W12345' -- or the loose style's own words ('order number 12345')."""
    return ref if ref.startswith("order") else f"order {ref}"


def _exchangeable(product: dict[str, Any], exclude: tuple[str, ...] = ()) -> list[str]:
    return [v for v, variant in product["variants"].items() if variant["available"] and v not in exclude]


class _Builder:
    def __init__(self, db: dict[str, Any], ids: IdPool, user: dict[str, Any], rng: random.Random):
        self.db, self.ids, self.user, self.rng = db, ids, user, rng
        self.reserved: tuple[str, ...] = ()  # products designated by attributes: in no other order
        self.look_alikes: list[tuple[str, str]] = []  # (decoy order, gold order): decoy listed first

    def items(self, count: int) -> list[tuple[str, str]]:
        return random_items(self.db, self.rng, count, exclude_products=self.reserved)

    def order(self, status: str, items: list[tuple[str, str]]) -> dict[str, Any]:
        return new_order(self.db, self.ids, self.user, status, items, self.rng)

    def reason(self, spec: Spec) -> tuple[str, str, dict[str, Any]]:
        """(canonical reason, how the user says it, facts)."""
        reason = self.rng.choice(CANCEL_REASONS)
        if not spec.paraphrase:
            return reason, f"Reason: {reason}.", {}
        raw = self.rng.choice(REASON_PARAPHRASES[reason])
        return reason, f"{raw}.", {"raw_reason": raw}

    # -- by attributes --------------------------------------------------------------------------
    def pick_products(self, specs: list[Spec]) -> dict[int, str]:
        chosen: dict[int, str] = {}
        for index, spec in enumerate(specs):
            if spec.designation != "attributes":
                continue
            pool = [p for p, prod in self.db["products"].items() if p not in chosen.values()
                    and (spec.kind != "exchange" or _exchangeable(prod))]
            chosen[index] = self.rng.choice(pool)
        self.reserved = tuple(chosen.values())
        return chosen

    def by_attributes(self, spec: Spec, pid: str) -> SubRequest:
        status = REQUIRED_STATUS[_WRITE_TOOL[spec.kind]]
        product = self.db["products"][pid]
        variants = list(product["variants"])
        new_item = None
        if spec.kind == "exchange":
            new_item = self.rng.choice(_exchangeable(product))
            target, decoy = self.rng.sample([v for v in variants if v != new_item], 2)
        else:
            target, decoy = self.rng.sample(variants, 2)

        def with_extra(item: str) -> list[tuple[str, str]]:
            return [(pid, item), *self.items(self.rng.randint(0, 1))]

        gold = self.order(status, with_extra(target))
        decoy_order = self.order(status, with_extra(decoy))
        if self.rng.random() < 0.5:  # the exact item, in an order whose status forbids the request
            self.order(self.rng.choice(FORBIDDING[spec.kind]), with_extra(target))
        self.look_alikes.append((decoy_order["order_id"], gold["order_id"]))
        row = next(r for r in gold["items"] if r["item_id"] == target)
        spoken = spoken_item(product["name"], row["options"])
        facts = {"decoy_order_id": decoy_order["order_id"], "decoy_item_id": decoy, "product_id": pid}
        if spec.kind == "cancel":
            reason, said, extra = self.reason(spec)
            sep = "," if spec.paraphrase else "."
            return cancel_sub(gold, reason, f"Please cancel the order with my {spoken}{sep} {said}", item_id=target,
                              **facts, **extra)
        if spec.kind == "return":
            return return_sub(gold, row, f"I want to return the {spoken} I received.", **facts)
        assert new_item is not None
        new_variant = product["variants"][new_item]
        return exchange_sub(gold, row, new_variant, f"I want to exchange the {spoken} I received for the "
                                                    f"{' '.join(new_variant['options'])} one.", **facts)

    # -- by id -------------------------------------------------------------------------------------
    def ref(self, spec: Spec, order: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if not spec.loose_id:
            return order["order_id"], {}
        raw = self.rng.choice(LOOSE_ID_STYLES).format(d=order["order_id"][2:])
        return raw, {"raw_order_ref": raw}

    def by_id(self, spec: Spec) -> SubRequest:
        rng = self.rng
        if spec.kind == "address":
            address = random_address(rng)
            while address == self.user["address"]:
                address = random_address(rng)
            return address_sub(self.user, address, f"Update my address to {address}.")
        if spec.kind == "status":
            order = self.order(rng.choice(("pending", "processed", "delivered")), self.items(rng.randint(1, 2)))
            ref, facts = self.ref(spec, order)
            return status_sub(order, f"What is the status of {_order_phrase(ref)}?", **facts)
        forbidden = spec.designation == "forbidden"
        status = rng.choice(FORBIDDING[spec.kind]) if forbidden else REQUIRED_STATUS[_WRITE_TOOL[spec.kind]]
        if spec.kind == "cancel":
            order = self.order(status, self.items(rng.randint(1, 2)))
            ref, facts = self.ref(spec, order)
            reason, said, extra = self.reason(spec)
            sep = "," if spec.paraphrase else "."
            text = f"Please cancel {_order_phrase(ref)}{sep} {said}"
            if forbidden:
                return refused_sub("cancel_refused", order, text, reason=reason, **facts, **extra)
            return cancel_sub(order, reason, text, **facts, **extra)
        if spec.kind == "return":
            order = self.order(status, self.items(rng.randint(1, 3)))
            row = rng.choice(order["items"])
            ref, facts = self.ref(spec, order)
            text = f"Return the {row['name']} from {_order_phrase(ref)}."
            if forbidden:
                return refused_sub("return_refused", order, text, item_id=row["item_id"], **facts)
            return return_sub(order, row, text, **facts)
        # exchange: the first item is of a product with another available variant
        pool = [p for p, prod in self.db["products"].items() if p not in self.reserved
                and len(_exchangeable(prod)) >= 1 and len(prod["variants"]) >= 2]
        pid = rng.choice(pool)
        product = self.db["products"][pid]
        new_item = rng.choice(_exchangeable(product))
        old_item = rng.choice([v for v in product["variants"] if v != new_item])
        others = random_items(self.db, rng, rng.randint(0, 1), exclude_products=(*self.reserved, pid))
        order = self.order(status, [(pid, old_item), *others])
        row = order["items"][0]
        new_variant = product["variants"][new_item]
        ref, facts = self.ref(spec, order)
        text = (f"Exchange the {spoken_item(product['name'], row['options'])} from {_order_phrase(ref)} for the "
                f"{' '.join(new_variant['options'])} one.")
        if forbidden:
            return refused_sub("exchange_refused", order, text, item_id=row["item_id"], new_item_id=new_item,
                               product_id=pid, **facts)
        return exchange_sub(order, row, new_variant, text, **facts)


def compound_subrequests(db: dict[str, Any], ids: IdPool, user: dict[str, Any],
                         rng: random.Random) -> tuple[list[SubRequest], bool]:
    """The sub-requests of one compound task (added to `db`) and whether they come all at once."""
    specs, all_at_once = draw_specs(rng)
    builder = _Builder(db, ids, user, rng)
    products = builder.pick_products(specs)
    subs = []
    for index, spec in enumerate(specs):
        sr = builder.by_attributes(spec, products[index]) if index in products else builder.by_id(spec)
        sr.traits = spec.traits
        sr.capabilities = trait_capabilities(sr.traits)
        subs.append(sr)
    for _ in range(rng.randint(0, 2)):  # fillers: any status, never a designated product
        builder.order(rng.choice(("pending", "processed", "delivered", "cancelled")), builder.items(rng.randint(1, 2)))
    orders = user["orders"]
    rng.shuffle(orders)
    for decoy, gold in builder.look_alikes:
        di, gi = orders.index(decoy), orders.index(gold)
        if di > gi:
            orders[gi], orders[di] = orders[di], orders[gi]
    return subs, all_at_once
