"""tau2 retail's record toolkit (trace_common/env/records.py): its schema and tools for other environments.

Worlds are `RetailDB`s built from the retail data model (`retail_db.py`) around the real
catalog of the domain's db.json: its products, their variants, options and prices. Users
and orders are new, in tau2's formats (user 'first_last_1234', email
'first.last1234@example.com', payment methods 'credit_card_' / 'paypal_' / 'gift_card_' + 7
digits, orders '#W' + 7 digits, a fulfillment with a 12-digit tracking id once an order is
processed, a payment (and for a cancelled order its refund) in the payment history), their
names and addresses drawn from the people of db.json. `call` is `RetailTools.call` -- the
code the `tau2-retail` environment runs -- so a tool message is byte-identical to tau2's for
the same database and call (JSON of the record, or tau2's "Error: ..." text).

tau2's tools do not check formats, so this toolkit says which argument was `malformed` by
its own table of tau2's id formats ('#W' + 7 digits, 10-digit item and product ids,
'<kind>_' + 7 digits payment ids, the two cancel reasons), by the tool's required arguments,
and by Python's TypeError for an unknown argument, as the target reports it.

Parameters (`params_for(env)` makes them from a `Tau2Environment`; no file is read later, so
the toolkit can be built inside a sandbox): `products` (db.json's product table),
`first_names`, `last_names`, `addresses` (db.json's users' names and address records) and
`card_brands`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from trace_common.domains.tau2.retail_db import (
    CreditCard,
    GiftCard,
    Order,
    OrderFulfillment,
    OrderItem,
    OrderPayment,
    Paypal,
    Product,
    RetailDB,
    User,
    UserAddress,
    UserName,
)
from trace_common.domains.tau2.retail_schemas import RETAIL_TOOL_SPECS
from trace_common.domains.tau2.retail_tools import CANCEL_REASONS, RetailTools
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

#: argument -> (pattern, what it must look like), tau2's id formats
FORMATS: dict[str, tuple[re.Pattern[str], str]] = {
    "order_id": (re.compile(r"^#W\d{7}$"), "'#W' followed by 7 digits"),
    "user_id": (re.compile(r"^[a-z]+_[a-z]+_\d{4}$"), "a user id such as 'sara_doe_4960'"),
    "product_id": (re.compile(r"^\d{10}$"), "10 digits"),
    "item_id": (re.compile(r"^\d{10}$"), "10 digits"),
    "payment_method_id": (re.compile(r"^(credit_card|paypal|gift_card)_\d{7}$"), "'<kind>_' followed by 7 digits"),
}
_LIST_FORMATS = {"item_ids": "item_id", "new_item_ids": "item_id"}
_VIOLATIONS = {
    "Error: Non-pending order cannot be cancelled": "cancel_pending_order on an order that is not pending",
    "Error: Non-delivered order cannot be returned": "return_delivered_order_items on an order that is not delivered",
    "Error: Non-delivered order cannot be exchanged":
        "exchange_delivered_order_items on an order that is not delivered",
    "Error: Non-pending order cannot be modified": "a modification of an order that is not pending",
}
LOOSE_ID_STYLES = ("W{d}", "{d}", "#{d}", "w{d}", "order number {d}")
_LOOSE = re.compile(r"^\s*(?:order\s*(?:number|no\.?|id)?\s*)?#?\s*[wW]?\s*(?P<digits>\d{7})\s*$", re.I)
REASON_PARAPHRASES: dict[str, tuple[str, ...]] = {
    "no longer needed": ("I don't need it anymore", "I no longer need it", "I changed my mind about it"),
    "ordered by mistake": ("I ordered it by accident", "I bought it by mistake", "it was an accidental order"),
}
_PAYMENT_KINDS = ("credit_card", "paypal", "gift_card")


def _cents(amount: float) -> int:
    return round(amount * 100)


class RetailRecords(RecordToolkit):
    """tau2 retail's records and tools (see module docstring)."""

    target: ClassVar[str] = "tau2-retail"
    cancel_reasons: ClassVar[tuple[str, ...]] = CANCEL_REASONS
    reason_paraphrases: ClassVar[dict[str, tuple[str, ...]]] = REASON_PARAPHRASES
    statuses: ClassVar[tuple[str, ...]] = ("pending", "processed", "delivered", "cancelled")
    required_status: ClassVar[dict[str, str]] = {"cancel_pending_order": "pending",
                                                 "return_delivered_order_items": "delivered",
                                                 "exchange_delivered_order_items": "delivered"}

    def __init__(self, products: dict[str, Any], first_names: list[str], last_names: list[str],
                 addresses: list[dict[str, str]], card_brands: list[str]):
        if not products or not first_names or not last_names or not addresses or not card_brands:
            raise ValueError("RetailRecords needs a non-empty catalog, names, addresses and card brands "
                             "(RetailRecords.params_for(env) makes them from a tau2-retail environment)")
        # validated once; no retail tool writes a product, so every world shares these records
        self._products = {pid: Product.model_validate(p) for pid, p in products.items()}
        self.first_names, self.last_names = list(first_names), list(last_names)
        self.addresses = [dict(a) for a in addresses]
        self.card_brands = list(card_brands)

    @classmethod
    def params_for(cls, env: Any) -> dict[str, Any]:
        data = env.domain.pristine_db.plain_json()
        users = list(data["users"].values())
        return {"products": data["products"],
                "first_names": sorted({u["name"]["first_name"] for u in users}),
                "last_names": sorted({u["name"]["last_name"] for u in users}),
                "addresses": [u["address"] for u in users[:40]],
                "card_brands": sorted({m["brand"] for u in users for m in u["payment_methods"].values()
                                       if m["source"] == "credit_card"})}

    # -- building a world -------------------------------------------------------------------
    @staticmethod
    def _digits(w: World, width: int) -> str:
        used: set[str] = w.state["used"]
        while True:
            value = str(w.rng.randrange(10 ** (width - 1), 10 ** width))
            if value not in used:
                used.add(value)
                return value

    def new_world(self, rng: random.Random) -> World:
        db = RetailDB.model_construct(products=dict(self._products), users={}, orders={})
        return World(db=db, rng=rng, state={"used": set(), "names": set()})

    def add_user(self, w: World) -> UserView:
        rng = w.rng
        while True:
            first, last = rng.choice(self.first_names), rng.choice(self.last_names)
            if (first, last) not in w.state["names"]:
                w.state["names"].add((first, last))
                break
        user_id = f"{first.lower()}_{last.lower()}_{self._digits(w, 4)}"
        methods: dict[str, Any] = {}
        for kind in rng.sample(_PAYMENT_KINDS, rng.randint(1, 3)):
            pm_id = f"{kind}_{self._digits(w, 7)}"
            if kind == "credit_card":
                methods[pm_id] = CreditCard(source="credit_card", id=pm_id, brand=rng.choice(self.card_brands),
                                            last_four=f"{rng.randrange(10_000):04d}")
            elif kind == "paypal":
                methods[pm_id] = Paypal(source="paypal", id=pm_id)
            else:
                methods[pm_id] = GiftCard(source="gift_card", id=pm_id, balance=float(rng.randrange(10, 200)))
        w.db.users[user_id] = User(
            user_id=user_id, name=UserName(first_name=first, last_name=last),
            address=UserAddress(**rng.choice(self.addresses)),
            email=f"{first.lower()}.{last.lower()}{self._digits(w, 4)}@example.com",
            payment_methods=methods, orders=[])
        return self.user(w.db, user_id)

    def add_order(self, w: World, user_id: str, status: str, items: Sequence[tuple[str, str]]) -> OrderView:
        if status not in self.statuses:
            raise ValueError(f"status {status!r} is not one of {self.statuses}")
        user = w.db.users[user_id]
        order_id = f"#W{self._digits(w, 7)}"
        lines = []
        for product_id, item_id in items:
            product = w.db.products[product_id]
            variant = product.variants[item_id]
            lines.append(OrderItem(name=product.name, product_id=product_id, item_id=item_id, price=variant.price,
                                   options=dict(variant.options)))
        pm_id = w.rng.choice(list(user.payment_methods))
        amount = round(sum(line.price for line in lines), 2)
        history = [OrderPayment(transaction_type="payment", amount=amount, payment_method_id=pm_id)]
        if status == "cancelled":
            history.append(OrderPayment(transaction_type="refund", amount=amount, payment_method_id=pm_id))
        fulfillments = [] if status == "pending" else [
            OrderFulfillment(tracking_id=[self._digits(w, 12)], item_ids=[line.item_id for line in lines])]
        w.db.orders[order_id] = Order(order_id=order_id, user_id=user_id, address=user.address.model_copy(),
                                      items=lines, status=status, fulfillments=fulfillments,
                                      payment_history=history)
        user.orders.append(order_id)
        return self.order(w.db, order_id)

    def copy(self, db: Any) -> Any:
        return RetailDB.copy_on_write(db)

    # -- views ------------------------------------------------------------------------------
    def products(self, db: Any) -> list[ProductView]:
        return [ProductView(product_id=p.product_id, name=p.name, variants=tuple(
            VariantView(item_id=v.item_id, options=tuple(v.options.values()), price=_cents(v.price),
                        available=v.available) for v in p.variants.values()))
            for p in db.products.values()]

    def user(self, db: Any, user_id: str) -> UserView:
        u = db.users[user_id]
        return UserView(user_id=u.user_id, first_name=u.name.first_name, last_name=u.name.last_name, email=u.email,
                        payment_methods=tuple(u.payment_methods), orders=tuple(u.orders))

    def order(self, db: Any, order_id: str) -> OrderView:
        o = db.orders[order_id]
        items = tuple(ItemView(item_id=i.item_id, product_id=i.product_id, name=i.name,
                               options=tuple(i.options.values()), price=_cents(i.price),
                               option_names=tuple(i.options)) for i in o.items)
        return OrderView(order_id=o.order_id, user_id=o.user_id, status=o.status, items=items,
                         payment_method_id=o.payment_history[0].payment_method_id,
                         total=sum(i.price for i in items), cancel_reason=o.cancel_reason,
                         return_items=tuple(o.return_items or ()))

    def set_user_orders(self, db: Any, user_id: str, order_ids: Sequence[str]) -> None:
        user = db.users[user_id]
        if sorted(order_ids) != sorted(user.orders):
            raise ValueError(f"set_user_orders must reorder the user's own orders {user.orders}")
        user.orders = list(order_ids)

    # -- renderings -------------------------------------------------------------------------
    def money(self, cents: int) -> str:
        return f"{cents // 100}.{cents % 100:02d}"

    def loose_order_ids(self, order_id: str) -> tuple[str, ...]:
        return tuple(style.format(d=order_id[2:]) for style in LOOSE_ID_STYLES)

    def canonical_order_id(self, text: str) -> str | None:
        match = _LOOSE.match(text)
        return f"#W{match['digits']}" if match else None

    def describe_item(self, item: ItemView) -> str:
        """'t-shirt with color blue, size M and material cotton'."""
        parts = [f"{name} {value}" for name, value in zip(item.option_names, item.options, strict=False)]
        listed = ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else "".join(parts)
        return f"{item.name.lower()} with {listed}" if listed else item.name.lower()

    def new_address(self, w: World, user_id: str) -> tuple[dict[str, str], str]:
        """A new address for `user_id` (never its current one), one of db.json's people's addresses
        drawn from `w.rng`: (the arguments of modify_user_address / modify_pending_order_address
        besides the id, in the schema's order; how the user says it, '12 Oak St, Suite 4, Austin, TX
        78701, USA')."""
        current = w.db.users[user_id].address.model_dump()
        pool = [a for a in self.addresses if a != current]
        chosen = dict(w.rng.choice(pool))
        args = {key: chosen[key] for key in ("address1", "address2", "city", "state", "country", "zip")}
        street = ", ".join(part for part in (args["address1"], args["address2"]) if part)
        return args, f"{street}, {args['city']}, {args['state']} {args['zip']}, {args['country']}"

    # -- tools ------------------------------------------------------------------------------
    def call(self, db: Any, name: str, arguments: dict[str, Any]) -> CallOutcome:
        result = RetailTools(db).call(name, dict(arguments))
        spec = RETAIL_TOOL_SPECS.get(name)
        malformed = _malformed(name, arguments, result.content if result.error else None)
        write = None
        if not result.error and spec is not None and spec.mutates_state:
            write = arguments.get("order_id") or arguments.get("user_id")
        return CallOutcome(text=result.content, ok=not result.error, write=write,
                           violation=_VIOLATIONS.get(result.content) if result.error else None, malformed=malformed)

    def invalid_arguments(self, name: str, error: str) -> CallOutcome:
        # what Tau2Environment answers when a call's arguments are not a JSON object
        return CallOutcome(text=f"Error: Invalid arguments for tool '{name}': {error}", ok=False,
                           malformed=f"arguments: {error}")


def _malformed(name: str, arguments: dict[str, Any], error: str | None) -> str | None:
    spec = RETAIL_TOOL_SPECS.get(name)
    if spec is None:
        return f"unknown tool {name!r}"
    params = spec.schema["function"]["parameters"]
    for arg in params.get("required", []):
        if arg not in arguments:
            return f"missing argument {arg!r}"
    for arg, value in arguments.items():
        if arg not in params.get("properties", {}):
            return f"unknown argument {arg!r}"
        kind = _LIST_FORMATS.get(arg, arg)
        if arg == "reason" and value not in CANCEL_REASONS:
            return f"reason {value!r}: expected 'no longer needed' or 'ordered by mistake'"
        if kind in FORMATS:
            pattern, doc = FORMATS[kind]
            values = value if arg in _LIST_FORMATS and isinstance(value, list) else [value]
            for v in values:
                if not isinstance(v, str) or not pattern.match(v):
                    return f"{arg} {v!r}: expected {doc}"
    if error is not None and error.startswith("Error: Invalid arguments"):
        return "arguments not a JSON object"
    return None


TOOLKIT = RetailRecords

__all__ = ["FORMATS", "TOOLKIT", "RetailRecords"]
