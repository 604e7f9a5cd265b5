"""The store's record toolkit (trace_common/env/records.py): its database and tools for other environments.

Everything here is the store's own code: worlds are built with `world.py` (the seeded
catalog with its prices, users with payment methods and gift-card balances, orders), and
`call` is `tools.call_tool`, so a tool message is byte-identical to what the store sends
for the same database and call. Loose order ids and cancel-reason paraphrases are the
store's (`task_model.py`). No task generator is used: a caller builds its own scenario.

The store's world needs no parameters (`params_for` returns {}); its `World.state` holds
the id pool and the names taken so far.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from trace_common.domains.store import tools, world
from trace_common.domains.store.task_model import LOOSE_ID_STYLES, REASON_PARAPHRASES
from trace_common.env.records import (
    CallOutcome,
    ItemView,
    OrderView,
    ProductView,
    RecordToolkit,
    UserView,
    VariantView,
    World,
)

_LOOSE = re.compile(r"^\s*(?:order\s*(?:number|no\.?|id)?\s*)?#?\s*[wW]?\s*(?P<digits>\d{5})\s*$", re.I)


def _describe(info: dict[str, Any] | None) -> str | None:
    if not info:
        return None
    if "required_status" in info:
        return f"{info['tool']} on a {info['status']} order (requires {info['required_status']})"
    return f"{info.get('argument')} {info.get('value')!r}: expected {info.get('expected')}"


class StoreRecords(RecordToolkit):
    """The store's records and tools (see module docstring)."""

    target: ClassVar[str] = "store"
    cancel_reasons: ClassVar[tuple[str, ...]] = tools.CANCEL_REASONS
    reason_paraphrases: ClassVar[dict[str, tuple[str, ...]]] = dict(REASON_PARAPHRASES)
    statuses: ClassVar[tuple[str, ...]] = world.STATUSES
    required_status: ClassVar[dict[str, str]] = dict(tools.REQUIRED_STATUS)

    # -- building a world -------------------------------------------------------------------
    def new_world(self, rng: random.Random) -> World:
        ids = world.IdPool(rng)
        db: dict[str, Any] = {"users": {}, "orders": {}, "products": world.make_products(rng, ids)}
        return World(db=db, rng=rng, state={"ids": ids, "names": set()})

    def add_user(self, w: World) -> UserView:
        user = world.make_user(w.rng, w.state["ids"], w.state["names"])
        w.db["users"][user["user_id"]] = user
        return self.user(w.db, user["user_id"])

    def add_order(self, w: World, user_id: str, status: str, items: Sequence[tuple[str, str]]) -> OrderView:
        order = world.new_order(w.db, w.state["ids"], w.db["users"][user_id], status, list(items), w.rng)
        return self.order(w.db, order["order_id"])

    def copy(self, db: Any) -> Any:
        return copy.deepcopy(db)

    # -- views ------------------------------------------------------------------------------
    def products(self, db: Any) -> list[ProductView]:
        return [ProductView(product_id=p["product_id"], name=p["name"], variants=tuple(
            VariantView(item_id=v["item_id"], options=tuple(v["options"]), price=int(v["price"]),
                        available=bool(v["available"])) for v in p["variants"].values()))
            for p in db["products"].values()]

    def user(self, db: Any, user_id: str) -> UserView:
        u = db["users"][user_id]
        return UserView(user_id=u["user_id"], first_name=u["first"].title(), last_name=u["last"].title(),
                        email=u["email"], payment_methods=tuple(u["payment_methods"]), orders=tuple(u["orders"]))

    def order(self, db: Any, order_id: str) -> OrderView:
        o = db["orders"][order_id]
        items = tuple(ItemView(item_id=r["item_id"], product_id=r["product_id"], name=r["name"],
                               options=tuple(r["options"]), price=int(r["price"])) for r in o["items"])
        return OrderView(order_id=o["order_id"], user_id=o["user_id"], status=o["status"], items=items,
                         payment_method_id=o["payment_method_id"], total=world.order_total(o),
                         cancel_reason=o.get("cancel_reason"), return_items=tuple(o.get("return_items") or ()))

    def set_user_orders(self, db: Any, user_id: str, order_ids: Sequence[str]) -> None:
        user = db["users"][user_id]
        if sorted(order_ids) != sorted(user["orders"]):
            raise ValueError(f"set_user_orders must reorder the user's own orders {user['orders']}")
        user["orders"] = list(order_ids)

    # -- renderings -------------------------------------------------------------------------
    def money(self, cents: int) -> str:
        return world.money(cents)

    def loose_order_ids(self, order_id: str) -> tuple[str, ...]:
        return tuple(style.format(d=order_id[2:]) for style in LOOSE_ID_STYLES)

    def canonical_order_id(self, text: str) -> str | None:
        match = _LOOSE.match(text)
        return f"#W{match['digits']}" if match else None

    def describe_item(self, item: ItemView) -> str:
        return world.spoken_item(item.name, list(item.options))

    def new_address(self, w: World, user_id: str) -> tuple[dict[str, str], str]:
        """A new address for `user_id` (never its current one), drawn from `w.rng` as the store draws
        addresses: (the arguments of modify_user_address besides user_id, how the user says it)."""
        current = w.db["users"][user_id]["address"]
        address = world.random_address(w.rng)
        while address == current:
            address = world.random_address(w.rng)
        return {"address": address}, address

    # -- tools ------------------------------------------------------------------------------
    def call(self, db: Any, name: str, arguments: dict[str, Any]) -> CallOutcome:
        outcome = tools.call_tool(db, name, dict(arguments))
        write = None
        if outcome.ok and name in tools.WRITE_TOOLS:
            write = arguments.get("order_id") or arguments.get("user_id")
        return CallOutcome(text=outcome.text, ok=outcome.ok, write=write, violation=_describe(outcome.violation),
                           malformed=_describe(outcome.malformed))

    def invalid_arguments(self, name: str, error: str) -> CallOutcome:
        # the store's environment answers such a call with Environment.tool_error: "Error: <error>"
        return CallOutcome(text=f"Error: {error}", ok=False, malformed=f"arguments: {error}")


TOOLKIT = StoreRecords

__all__ = ["TOOLKIT", "StoreRecords"]
