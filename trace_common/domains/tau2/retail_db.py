"""The tau2-bench retail database as pydantic models.

Why models and not plain dicts: the retail tools return orders, users, products and items,
and tau2 renders those into the tool message as `json.dumps(model.model_dump())`. The
content an agent sees therefore depends on the *field order of the models* (not on the key
order in db.json), on ints being coerced to floats where the field is a float, and on the
optional order fields (`cancel_reason`, `exchange_*`, `return_*`) appearing as `null` until a
tool sets them. The field names, order and types below are the facts of tau2's retail data
model; keeping them identical makes every tool message byte-identical to tau2's.

Two serialisations are offered:

- `tau2_dump()` -- what tau2 hashes (`model_dump()`, optional fields included as None);
  used for the evaluator's gold-vs-predicted comparison, exactly like tau2's `get_db_hash`.
- `plain_json()` -- the DB as plain JSON data in the shape of db.json (optional order
  fields that were never set are left out), so a read-only episode's DB equals db.json as
  data. `sha256_hex()` hashes that canonically; it is what `replay-gold` writes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr

from trace_common.errors import InvalidArgument


class Variant(BaseModel):
    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    name: str
    product_id: str
    variants: dict[str, Variant]


class UserName(BaseModel):
    first_name: str
    last_name: str


class UserAddress(BaseModel):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class CreditCard(BaseModel):
    source: Literal["credit_card"]
    id: str
    brand: str
    last_four: str


class Paypal(BaseModel):
    source: Literal["paypal"]
    id: str


class GiftCard(BaseModel):
    source: Literal["gift_card"]
    id: str
    balance: float


PaymentMethod = CreditCard | GiftCard | Paypal


class User(BaseModel):
    user_id: str
    name: UserName
    address: UserAddress
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderFulfillment(BaseModel):
    tracking_id: list[str]
    item_ids: list[str]


class OrderItem(BaseModel):
    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class OrderPayment(BaseModel):
    transaction_type: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


OrderStatus = Literal[
    "processed",
    "pending",
    "pending (item modified)",
    "delivered",
    "cancelled",
    "exchange requested",
    "return requested",
]

#: Order fields that are absent from db.json until a write tool sets them.
OPTIONAL_ORDER_FIELDS = (
    "cancel_reason", "exchange_items", "exchange_new_items", "exchange_payment_method_id",
    "exchange_price_difference", "return_items", "return_payment_method_id",
)


class Order(BaseModel):
    order_id: str
    user_id: str
    address: UserAddress
    items: list[OrderItem]
    status: OrderStatus
    fulfillments: list[OrderFulfillment]
    payment_history: list[OrderPayment]
    cancel_reason: Literal["no longer needed", "ordered by mistake"] | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(BaseModel):
    """products / users / orders, each keyed by id (the top level of db.json).

    Copy-on-write: `copy_on_write(base)` makes a new DB whose tables are new dicts holding
    the *base's* record objects (~0.2 ms instead of ~30 ms for a validated copy). Tools
    must get a record through `writable_order` / `writable_user` before changing it; that
    swaps in a private deep copy first, so the base is never mutated. Products are never
    written by any retail tool and stay shared. Equality compares the tables only.
    """

    model_config = ConfigDict(extra="forbid")

    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]

    _shared: bool = PrivateAttr(default=False)
    _owned: set[str] = PrivateAttr(default_factory=set)

    @classmethod
    def copy_on_write(cls, base: RetailDB) -> RetailDB:
        db = cls.model_construct(products=dict(base.products), users=dict(base.users), orders=dict(base.orders))
        db._shared = True
        db._owned = set()
        return db

    def writable_order(self, order_id: str) -> Order:
        """The order, made private to this DB (and its owner's user record, whose gift-card
        balances order writes may change)."""
        order = self.orders[order_id]
        if self._shared:
            key = f"orders/{order_id}"
            if key not in self._owned:
                order = self.orders[order_id] = order.model_copy(deep=True)
                self._owned.add(key)
            if order.user_id in self.users:
                self.writable_user(order.user_id)
        return order

    def writable_user(self, user_id: str) -> User:
        user = self.users[user_id]
        if self._shared:
            key = f"users/{user_id}"
            if key not in self._owned:
                user = self.users[user_id] = user.model_copy(deep=True)
                self._owned.add(key)
        return user

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RetailDB):
            return NotImplemented
        return self.products == other.products and self.users == other.users and self.orders == other.orders

    __hash__ = None  # type: ignore[assignment]  # mutable

    @classmethod
    def from_data(cls, data: Any, *, source: str = "db.json") -> RetailDB:
        """Validate parsed db.json data; a malformed file names the first bad field."""
        try:
            return cls.model_validate(data)
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            first = str(exc).splitlines()
            raise InvalidArgument(
                field=source, expected="tau2 retail db.json (products, users, orders)",
                reason="; ".join(first[:3]),
                fix="point --data at an unmodified tau2-bench retail data directory") from exc

    def tau2_dump(self) -> dict[str, Any]:
        """tau2's hashed form: every model field, unset optionals as None."""
        return self.model_dump()

    def plain_json(self) -> dict[str, Any]:
        """The DB as db.json-shaped JSON data (never-set optional order fields omitted)."""
        data = self.model_dump()
        for order in data["orders"].values():
            for key in OPTIONAL_ORDER_FIELDS:
                if order[key] is None:
                    del order[key]
        return data

    def sha256_hex(self) -> str:
        """sha256 of `plain_json()` in canonical JSON (sorted keys, compact, UTF-8)."""
        return canonical_sha256(self.plain_json())

    def tau2_hash(self) -> str:
        """The hash tau2 compares: sha256 of json.dumps(model_dump(), sort_keys=True, default=str)."""
        text = json.dumps(self.tau2_dump(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


TABLES = ("orders", "products", "users")  # sorted, as canonical JSON orders the top-level keys


def _canonical_record(record: BaseModel, table: str) -> str:
    data = record.model_dump()
    if table == "orders":
        for key in OPTIONAL_ORDER_FIELDS:
            if data[key] is None:
                del data[key]
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class CanonicalHasher:
    """`RetailDB.sha256_hex()` for many DBs derived from one baseline, ~3x faster.

    Canonical JSON of the DB is the concatenation of each record's canonical JSON (keys
    sorted at every level), so the text of records equal to the baseline's is computed once
    and reused; only records that differ are serialised again. The digest is identical to
    `sha256_hex()` (tests check it).
    """

    def __init__(self, baseline: RetailDB):
        self.baseline = baseline  # must never be mutated (the domain's pristine DB)
        self._texts = {t: {k: _canonical_record(r, t) for k, r in getattr(self.baseline, t).items()}
                       for t in TABLES}
        self._keys = {t: sorted(getattr(self.baseline, t)) for t in TABLES}

    def sha256_hex(self, db: RetailDB) -> str:
        digest = hashlib.sha256(b"{")
        for ti, table in enumerate(TABLES):
            records, base, texts = getattr(db, table), getattr(self.baseline, table), self._texts[table]
            keys = self._keys[table] if records.keys() == base.keys() else sorted(records)
            parts = []
            for key in keys:
                record = records[key]
                same = key in base and (base[key] is record or base[key] == record)
                text = texts[key] if same else _canonical_record(record, table)
                parts.append(json.dumps(key, ensure_ascii=False) + ":" + text)
            digest.update((("," if ti else "") + json.dumps(table) + ":{" + ",".join(parts) + "}").encode("utf-8"))
        digest.update(b"}")
        return digest.hexdigest()


def canonical_sha256(data: Any) -> str:
    """sha256 of json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
