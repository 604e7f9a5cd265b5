"""The store's tools: OpenAI schemas, argument checks, effects and compact text outputs.

`call_tool(db, name, arguments)` is the single entry point. It never raises for agent
mistakes: it returns a `ToolOutcome` whose text starts with "Error:" and leaves `db`
untouched unless the call fully succeeds. The outcome also says *why* a call failed in a
form the environment turns into capability-tagged diagnostics:

- `malformed`: an argument broke its format (id prefix/width, enum string, type, missing
  or unknown argument, unknown tool) -> tool_call_precision;
- `violation`: a write on an order whose status forbids it -> precondition_verification.

Outputs are deliberately terse and templated (a few-million-parameter model is trained
on them): one line per order, ids verbatim, money with two decimals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trace_common.domains.store.world import item_label, money, order_total

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
WRITE_TOOLS = ("cancel_pending_order", "return_delivered_order_items", "exchange_delivered_order_items",
               "modify_user_address")
#: status an order must have for each order write
REQUIRED_STATUS = {"cancel_pending_order": "pending", "return_delivered_order_items": "delivered",
                   "exchange_delivered_order_items": "delivered"}

# argument kind -> (regex, human description)
FORMATS: dict[str, tuple[re.Pattern[str], str]] = {
    "order_id": (re.compile(r"^#W\d{5}$"), "'#W' followed by 5 digits, e.g. '#W12345'"),
    "user_id": (re.compile(r"^[a-z]+_[a-z]+_\d{4}$"), "a user id such as 'emma_lee_1234'"),
    "email": (re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]+$"), "an email address"),
    "product_id": (re.compile(r"^\d{4}$"), "4 digits, e.g. '1234'"),
    "item_id": (re.compile(r"^\d{5}$"), "5 digits, e.g. '12345'"),
    "payment_method_id": (re.compile(r"^(credit_card|paypal|gift_card)_\d{5}$"),
                          "an id such as 'credit_card_12345'"),
}

_S = {"type": "string"}
_LIST = {"type": "array", "items": {"type": "string"}}


def _schema(name: str, description: str, props: dict[str, tuple[dict[str, Any], str]]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {k: {**spec, "description": doc} for k, (spec, doc) in props.items()},
                       "required": list(props), "additionalProperties": False}}}


TOOL_SCHEMAS: list[dict[str, Any]] = [
    _schema("find_user_id_by_email", "Find a user's id from their email.",
            {"email": (_S, "The user's email.")}),
    _schema("get_user_details", "Get a user's profile, payment methods and order ids.",
            {"user_id": (_S, "User id, e.g. 'emma_lee_1234'.")}),
    _schema("list_user_orders", "List a user's orders with status, payment method and items.",
            {"user_id": (_S, "User id.")}),
    _schema("get_order_details", "Get one order's status, payment method and items.",
            {"order_id": (_S, "Order id: '#W' and 5 digits, e.g. '#W12345'.")}),
    _schema("get_product_details", "Get a product's variants with options, price and availability.",
            {"product_id": (_S, "Product id: 4 digits.")}),
    _schema("cancel_pending_order", "Cancel a pending order; refunds its total to its payment method.",
            {"order_id": (_S, "Order id, e.g. '#W12345'."),
             "reason": ({"type": "string", "enum": list(CANCEL_REASONS)},
                        "Exactly 'no longer needed' or 'ordered by mistake'.")}),
    _schema("return_delivered_order_items", "Return items of a delivered order; refund to the payment method.",
            {"order_id": (_S, "Order id."), "item_ids": (_LIST, "Item ids (5 digits) to return."),
             "payment_method_id": (_S, "The order's payment method id.")}),
    _schema("exchange_delivered_order_items",
            "Exchange items of a delivered order for other variants of the same products.",
            {"order_id": (_S, "Order id."), "item_ids": (_LIST, "Item ids to exchange."),
             "new_item_ids": (_LIST, "New item ids, same order as item_ids."),
             "payment_method_id": (_S, "The order's payment method id.")}),
    _schema("modify_user_address", "Set a user's default address.",
            {"user_id": (_S, "User id."),
             "address": (_S, "Full address exactly as given, e.g. '12 Oak Street, Springfield, 10001'.")}),
]
TOOL_NAMES = tuple(s["function"]["name"] for s in TOOL_SCHEMAS)

# tool -> argument -> kind checked (format kinds above, "reason", "items", "text")
ARG_KINDS: dict[str, dict[str, str]] = {
    "find_user_id_by_email": {"email": "email"},
    "get_user_details": {"user_id": "user_id"},
    "list_user_orders": {"user_id": "user_id"},
    "get_order_details": {"order_id": "order_id"},
    "get_product_details": {"product_id": "product_id"},
    "cancel_pending_order": {"order_id": "order_id", "reason": "reason"},
    "return_delivered_order_items": {"order_id": "order_id", "item_ids": "items",
                                     "payment_method_id": "payment_method_id"},
    "exchange_delivered_order_items": {"order_id": "order_id", "item_ids": "items", "new_item_ids": "items",
                                       "payment_method_id": "payment_method_id"},
    "modify_user_address": {"user_id": "user_id", "address": "text"},
}


@dataclass
class ToolOutcome:
    """Result of one call. Exactly one of ok / error text; `malformed` and `violation` say
    why an error happened when it is a capability failure."""

    text: str
    ok: bool = True
    malformed: dict[str, Any] | None = None
    violation: dict[str, Any] | None = None
    write: dict[str, Any] | None = field(default=None)  # the write's target, set for write attempts


def _err(text: str, **kw: Any) -> ToolOutcome:
    return ToolOutcome(text=f"Error: {text}", ok=False, **kw)


def _malformed(tool: str, argument: str, value: Any, expected: str) -> ToolOutcome:
    shown = repr(value) if not isinstance(value, str) else f"'{value}'"
    return _err(f"{argument} {shown} is invalid: expected {expected}",
                malformed={"tool": tool, "argument": argument, "value": value, "expected": expected})


def check_arguments(name: str, args: dict[str, Any]) -> ToolOutcome | None:
    """Format checks; None when every argument is well-formed."""
    kinds = ARG_KINDS[name]
    for arg in args:
        if arg not in kinds:
            return _malformed(name, arg, args[arg], f"only the arguments {', '.join(kinds)}")
    for arg, kind in kinds.items():
        if arg not in args:
            return _malformed(name, arg, None, f"a value (missing required argument '{arg}')")
        value = args[arg]
        if kind == "items":
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                return _malformed(name, arg, value, "a non-empty list of item id strings")
            pattern, doc = FORMATS["item_id"]
            for v in value:
                if not pattern.match(v):
                    return _malformed(name, arg, v, f"item ids of {doc}")
            if len(set(value)) != len(value):
                return _malformed(name, arg, value, "no repeated item id")
            continue
        if not isinstance(value, str):
            return _malformed(name, arg, value, "a string")
        if kind == "reason":
            if value not in CANCEL_REASONS:
                return _malformed(name, arg, value, "exactly 'no longer needed' or 'ordered by mistake'")
        elif kind == "text":
            if not value.strip():
                return _malformed(name, arg, value, "a non-empty string")
        else:
            pattern, doc = FORMATS[kind]
            if not pattern.match(value):
                return _malformed(name, arg, value, doc)
    return None


# -- text formatting ---------------------------------------------------------------------------

def fmt_item(row: dict[str, Any]) -> str:
    return f"{row['item_id']} {item_label(row['name'], row['options'])} {money(row['price'])} " \
           f"[product {row['product_id']}]"


def fmt_order_line(order: dict[str, Any]) -> str:
    items = "; ".join(fmt_item(r) for r in order["items"])
    return f"{order['order_id']} {order['status']}, paid {order['payment_method_id']}: {items}"


# -- tools ----------------------------------------------------------------------------------------

def _find_user_id_by_email(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    for user in db["users"].values():
        if user["email"] == a["email"].strip().lower():
            return ToolOutcome(f"user_id: {user['user_id']}")
    return _err(f"no user with email {a['email']}")


def _user(db: dict[str, Any], user_id: str) -> dict[str, Any] | None:
    return db["users"].get(user_id)


def _get_user_details(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    user = _user(db, a["user_id"])
    if user is None:
        return _err(f"user {a['user_id']} not found")
    pms = ", ".join(f"{pm} (balance {money(user['gift_balances'][pm])})" if pm in user["gift_balances"] else pm
                    for pm in user["payment_methods"])
    return ToolOutcome(f"user {user['user_id']}: {user['first'].title()} {user['last'].title()}, "
                       f"email {user['email']}, address {user['address']}; payment methods: {pms}; "
                       f"orders: {', '.join(user['orders']) or 'none'}")


def _list_user_orders(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    user = _user(db, a["user_id"])
    if user is None:
        return _err(f"user {a['user_id']} not found")
    if not user["orders"]:
        return ToolOutcome("no orders")
    return ToolOutcome("\n".join(fmt_order_line(db["orders"][o]) for o in user["orders"]))


def _get_order_details(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    order = db["orders"].get(a["order_id"])
    if order is None:
        return _err(f"order {a['order_id']} not found")
    return ToolOutcome(f"order {fmt_order_line(order)} (user {order['user_id']})")


def _get_product_details(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    product = db["products"].get(a["product_id"])
    if product is None:
        return _err(f"product {a['product_id']} not found")
    rows = "; ".join(f"{v['item_id']} ({', '.join(v['options'])}) {money(v['price'])} "
                     f"{'available' if v['available'] else 'unavailable'}"
                     for v in product["variants"].values())
    return ToolOutcome(f"product {product['product_id']} {product['name']}: {rows}")


def _order_for_write(db: dict[str, Any], tool: str, a: dict[str, Any]) -> tuple[dict[str, Any] | None,
                                                                                  ToolOutcome | None]:
    order = db["orders"].get(a["order_id"])
    if order is None:
        return None, _err(f"order {a['order_id']} not found")
    need = REQUIRED_STATUS[tool]
    if order["status"] != need:
        action = {"cancel_pending_order": "cancelled", "return_delivered_order_items": "returned",
                  "exchange_delivered_order_items": "exchanged"}[tool]
        return order, _err(f"order {order['order_id']} is {order['status']}; only {need} orders can be {action}",
                           violation={"tool": tool, "order_id": order["order_id"], "status": order["status"],
                                      "required_status": need})
    return order, None


def _cancel_pending_order(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    order, error = _order_for_write(db, "cancel_pending_order", a)
    if error:
        return error
    assert order is not None
    refund = order_total(order)
    order.update(status="cancelled", cancel_reason=a["reason"], refund=refund)
    return ToolOutcome(f"order {order['order_id']} cancelled; refund {money(refund)} to "
                       f"{order['payment_method_id']}")


def _check_items_and_payment(order: dict[str, Any], a: dict[str, Any]) -> ToolOutcome | None:
    in_order = [r["item_id"] for r in order["items"]]
    for item_id in a["item_ids"]:
        if item_id not in in_order:
            return _err(f"item {item_id} is not in order {order['order_id']}")
    if a["payment_method_id"] != order["payment_method_id"]:
        return _err(f"refunds and charges go to the order's payment method {order['payment_method_id']}")
    return None


def _return_delivered_order_items(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    order, error = _order_for_write(db, "return_delivered_order_items", a)
    if error:
        return error
    assert order is not None
    error = _check_items_and_payment(order, a)
    if error:
        return error
    refund = sum(r["price"] for r in order["items"] if r["item_id"] in a["item_ids"])
    order.update(status="return requested", return_items=sorted(a["item_ids"]), refund=refund)
    return ToolOutcome(f"return requested for order {order['order_id']} items {', '.join(a['item_ids'])}; "
                       f"refund {money(refund)} to {order['payment_method_id']}")


def _exchange_delivered_order_items(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    order, error = _order_for_write(db, "exchange_delivered_order_items", a)
    if error:
        return error
    assert order is not None
    error = _check_items_and_payment(order, a)
    if error:
        return error
    if len(a["new_item_ids"]) != len(a["item_ids"]):
        return _err("new_item_ids must have one new item per item in item_ids")
    rows = {r["item_id"]: r for r in order["items"]}
    diff = 0
    for old, new in zip(a["item_ids"], a["new_item_ids"], strict=True):
        product = db["products"][rows[old]["product_id"]]
        variant = product["variants"].get(new)
        if variant is None:
            return _err(f"item {new} is not a variant of {product['name']} (product {product['product_id']})")
        if new == old:
            return _err(f"item {new} is the same item; pick a different variant")
        if not variant["available"]:
            return _err(f"item {new} is unavailable")
        diff += variant["price"] - rows[old]["price"]
    order.update(status="exchange requested", exchange_items=list(a["item_ids"]),
                 exchange_new_items=list(a["new_item_ids"]), price_difference=diff)
    direction = "charged to" if diff >= 0 else "refunded to"
    return ToolOutcome(f"exchange requested for order {order['order_id']}; price difference {money(abs(diff))} "
                       f"{direction} {order['payment_method_id']}")


def _modify_user_address(db: dict[str, Any], a: dict[str, Any]) -> ToolOutcome:
    user = _user(db, a["user_id"])
    if user is None:
        return _err(f"user {a['user_id']} not found")
    user["address"] = a["address"].strip()
    return ToolOutcome(f"address of {user['user_id']} set to {user['address']}")


_IMPLS = {
    "find_user_id_by_email": _find_user_id_by_email,
    "get_user_details": _get_user_details,
    "list_user_orders": _list_user_orders,
    "get_order_details": _get_order_details,
    "get_product_details": _get_product_details,
    "cancel_pending_order": _cancel_pending_order,
    "return_delivered_order_items": _return_delivered_order_items,
    "exchange_delivered_order_items": _exchange_delivered_order_items,
    "modify_user_address": _modify_user_address,
}


def call_tool(db: dict[str, Any], name: str, arguments: dict[str, Any]) -> ToolOutcome:
    """Run one tool on `db` (mutated only on a successful write)."""
    if name not in _IMPLS:
        return _err(f"unknown tool '{name}'; tools: {', '.join(TOOL_NAMES)}",
                    malformed={"tool": name, "argument": "name", "value": name, "expected": "a known tool"})
    bad = check_arguments(name, arguments)
    if bad is not None:
        return bad
    outcome = _IMPLS[name](db, arguments)
    if name in WRITE_TOOLS:
        outcome.write = {"tool": name, **arguments}
    return outcome
