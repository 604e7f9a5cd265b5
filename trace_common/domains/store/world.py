"""The store's database: catalogue, users, orders and payment methods, generated from a seed.

The database is plain JSON-able dicts so it can be deep-copied, compared for the verifier
and shipped to a sandbox worker unchanged. Prices are integer cents (no float drift in
refund sums); tool outputs format them with two decimals.

Shape:
    {"users":    {user_id: {"user_id", "first", "last", "email", "address",
                             "payment_methods": [pm_id...], "gift_balances": {pm_id: cents},
                             "orders": [order_id...]}},
     "orders":   {order_id: {"order_id", "user_id", "status", "payment_method_id",
                             "items": [{"item_id", "product_id", "name", "options", "price"}]}},
     "products": {product_id: {"product_id", "name",
                               "variants": {item_id: {"item_id", "options", "price", "available"}}}}}

Id formats (the tools check them): order '#W' + 5 digits, item 5 digits, product 4 digits,
payment method '<credit_card|paypal|gift_card>_' + 5 digits, user '<first>_<last>_' + 4 digits.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

# name -> (option dimensions), each a list of values; values are unique within a product
CATALOG: dict[str, list[list[str]]] = {
    "kettle": [["black", "white", "red", "green"], ["1L", "1.7L"]],
    "desk lamp": [["black", "white", "blue"], ["battery", "USB", "AC"]],
    "backpack": [["black", "blue", "green", "grey"], ["small", "large"]],
    "t-shirt": [["red", "blue", "white", "black"], ["S", "M", "L", "XL"]],
    "water bottle": [["blue", "red", "green", "pink"], ["500ml", "750ml", "1L"]],
    "headphones": [["black", "white", "silver"], ["wired", "wireless"]],
    "sneakers": [["white", "black", "red"], ["size 8", "size 9", "size 10"]],
    "mug": [["white", "blue", "yellow"], ["ceramic", "glass"]],
    "umbrella": [["black", "red", "yellow"], ["compact", "full size"]],
    "wall clock": [["black", "white", "wood"], ["digital", "analog"]],
}

FIRST_NAMES = ["emma", "liam", "olivia", "noah", "ava", "mason", "mia", "lucas", "sofia", "ethan",
               "yara", "omar", "lena", "ivan", "nora", "raj", "chen", "aisha", "diego", "hana"]
LAST_NAMES = ["smith", "lee", "garcia", "khan", "muller", "rossi", "silva", "kim", "novak", "brown",
              "ito", "dubois", "patel", "jones", "costa", "berg", "ali", "moreau", "nagy", "park"]
STREETS = ["Oak Street", "Maple Avenue", "Pine Road", "Cedar Lane", "Elm Street", "Birch Way",
           "Lake Drive", "Hill Road", "River Street", "Park Avenue"]
CITIES = [("Springfield", "10001"), ("Riverton", "20417"), ("Lakeside", "30862"), ("Fairview", "41203"),
          ("Greenville", "52114"), ("Hillcrest", "63320"), ("Brookfield", "74015"), ("Westport", "85551")]
PAYMENT_TYPES = ("credit_card", "paypal", "gift_card")

STATUSES = ("pending", "processed", "delivered", "cancelled")


def money(cents: int) -> str:
    """Cents -> '45.00'."""
    return f"{cents // 100}.{cents % 100:02d}"


def item_label(name: str, options: list[str]) -> str:
    """'kettle (red, 1L)' -- how tools show an item."""
    return f"{name} ({', '.join(options)})"


def spoken_item(name: str, options: list[str]) -> str:
    """'red 1L kettle' -- how the user names an item."""
    return f"{' '.join(options)} {name}"


class IdPool:
    """Unique random numeric ids of fixed width, drawn from one seeded generator."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def digits(self, width: int) -> str:
        while True:
            value = str(self.rng.randrange(10 ** (width - 1), 10 ** width))
            if value not in self.used:
                self.used.add(value)
                return value


def random_address(rng: random.Random) -> str:
    city, zip_code = rng.choice(CITIES)
    return f"{rng.randrange(1, 200)} {rng.choice(STREETS)}, {city}, {zip_code}"


def make_products(rng: random.Random, ids: IdPool) -> dict[str, Any]:
    """Every catalogue product with 4-6 variants (some unavailable) and seeded prices."""
    products: dict[str, Any] = {}
    for name, dims in CATALOG.items():
        combos = [list(c) for c in itertools.product(*dims)]
        rng.shuffle(combos)
        chosen = combos[:rng.randint(4, min(6, len(combos)))]
        base = rng.randrange(1500, 15000, 50)
        variants: dict[str, Any] = {}
        for options in chosen:
            item_id = ids.digits(5)
            variants[item_id] = {"item_id": item_id, "options": options,
                                 "price": base + rng.randrange(-400, 401, 50),
                                 "available": rng.random() < 0.8}
        product_id = ids.digits(4)
        products[product_id] = {"product_id": product_id, "name": name, "variants": variants}
    return products


def make_user(rng: random.Random, ids: IdPool, taken_names: set[tuple[str, str]]) -> dict[str, Any]:
    while True:
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        if (first, last) not in taken_names:
            taken_names.add((first, last))
            break
    user_id = f"{first}_{last}_{ids.digits(4)}"
    kinds = rng.sample(PAYMENT_TYPES, rng.randint(1, 3))
    pms = [f"{kind}_{ids.digits(5)}" for kind in kinds]
    balances = {pm: rng.randrange(1000, 20000, 100) for pm in pms if pm.startswith("gift_card")}
    return {"user_id": user_id, "first": first, "last": last,
            "email": f"{first}.{last}{rng.randrange(10, 99)}@example.com",
            "address": random_address(rng), "payment_methods": pms, "gift_balances": balances,
            "orders": []}


def new_order(db: dict[str, Any], ids: IdPool, user: dict[str, Any], status: str,
              items: list[tuple[str, str]], rng: random.Random) -> dict[str, Any]:
    """Add an order of `user` holding (product_id, item_id) pairs; appended to the user's list."""
    order_id = f"#W{ids.digits(5)}"
    rows = []
    for product_id, item_id in items:
        product = db["products"][product_id]
        variant = product["variants"][item_id]
        rows.append({"item_id": item_id, "product_id": product_id, "name": product["name"],
                     "options": list(variant["options"]), "price": variant["price"]})
    order = {"order_id": order_id, "user_id": user["user_id"], "status": status,
             "payment_method_id": rng.choice(user["payment_methods"]), "items": rows}
    db["orders"][order_id] = order
    user["orders"].append(order_id)
    return order


def random_items(db: dict[str, Any], rng: random.Random, count: int,
                 exclude_products: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """`count` (product_id, item_id) pairs of distinct products."""
    pids = [p for p in db["products"] if p not in exclude_products]
    chosen = rng.sample(pids, count)
    return [(p, rng.choice(list(db["products"][p]["variants"]))) for p in chosen]


def order_total(order: dict[str, Any]) -> int:
    return sum(row["price"] for row in order["items"])


def base_world(rng: random.Random, n_users: int = 3) -> tuple[dict[str, Any], IdPool]:
    """Products and `n_users` users (users[0] is the task's user, with no orders yet); the
    other users get 1-3 random orders so lookups of foreign orders have something to hit."""
    ids = IdPool(rng)
    db: dict[str, Any] = {"users": {}, "orders": {}, "products": make_products(rng, ids)}
    names: set[tuple[str, str]] = set()
    users = [make_user(rng, ids, names) for _ in range(n_users)]
    for user in users:
        db["users"][user["user_id"]] = user
    for user in users[1:]:
        for _ in range(rng.randint(1, 3)):
            new_order(db, ids, user, rng.choice(STATUSES), random_items(db, rng, rng.randint(1, 2)), rng)
    return db, ids
