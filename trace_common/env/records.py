"""The record-toolkit contract: a target's own database schema and tool code, usable by other environments.

A capability environment (docs/design.md "Environment interface") plays its own small scenario
but must look exactly like its target: the same records, id formats, amounts, item names
and tool outputs. Rather than re-implementing them, it asks the target's *record toolkit*
(named by the target's `TargetSurface.toolkit`, see surface.py) to

- build a world in the target's own schema: the target's catalog (products with variants),
  users with payment methods, orders with a status (`new_world`, `add_user`, `add_order`);
- read normalised views of it (`user`, `order`, `products`): what a scenario and a scorer
  need, independent of how the target stores it (dicts, pydantic models);
- render what users and agents say the way the target does: amounts (`money`, from integer
  cents), loose and canonical order ids (`loose_order_ids`, `canonical_order_id`), how a user
  names an item (`describe_item`), the cancel reasons and their paraphrases;
- run the target's OWN tool code over such a world (`call`): the outcome's text is exactly the
  tool message the target would send for the same database and call, plus what the call
  meant (`ok`, the record it wrote, a precondition `violation`, a `malformed` argument).

Contract (what an implementation MUST do):

1. Be a subclass of `RecordToolkit` whose constructor takes only the JSON-able keyword
   parameters the target publishes in `TargetSurface.toolkit_params` (`params_for(env)` makes
   them from a target instance). The constructor must not read files, the network or the
   clock: a capability environment builds the toolkit inside a locked-down sandbox worker,
   so everything the toolkit needs (e.g. a catalog read from the target's data directory)
   travels in the parameters.
2. Be deterministic: every world-building method draws only from `world.rng` (a
   `random.Random` seeded by the caller) and never iterates an unordered collection, so the
   same seed builds the same world in every process.
3. `call` never raises for anything an agent could send: unknown tools, missing or extra
   arguments and wrong types are answered with the target's own error text. A call that does
   not succeed leaves the database unchanged. `copy(db)` returns a database no later call on
   the original can affect (and vice versa).
4. Views are read-only snapshots (frozen dataclasses). Amounts in views are integer cents;
   `money(cents)` renders them as the target writes amounts.

The store implements it in `trace_common/domains/store/record_toolkit.py`, tau2 retail in
`trace_common/domains/tau2/record_toolkit.py`.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class VariantView:
    """One variant (item) of a catalog product."""

    item_id: str
    options: tuple[str, ...]   # option values in the target's order, e.g. ('red', '1L')
    price: int                 # cents
    available: bool


@dataclass(frozen=True)
class ProductView:
    product_id: str
    name: str
    variants: tuple[VariantView, ...]


@dataclass(frozen=True)
class ItemView:
    """One line of an order."""

    item_id: str
    product_id: str
    name: str
    options: tuple[str, ...]
    price: int  # cents
    option_names: tuple[str, ...] = ()  # the options' dimension names where the target has them ('color')


@dataclass(frozen=True)
class OrderView:
    order_id: str
    user_id: str
    status: str
    items: tuple[ItemView, ...]
    payment_method_id: str     # the method the order was paid with
    total: int                 # cents: the sum of the items' prices
    cancel_reason: str | None = None
    return_items: tuple[str, ...] = ()


@dataclass(frozen=True)
class UserView:
    user_id: str
    first_name: str
    last_name: str
    email: str
    payment_methods: tuple[str, ...]
    orders: tuple[str, ...]    # order ids, in the order the target lists them


@dataclass(frozen=True)
class CallOutcome:
    """One tool call run by the target's own code.

    Semantics:
        text      = the tool message the target sends for this call, byte for byte
        ok        = the call succeeded (the target did not answer with an error)
        write     = the id of the record the call changed ('#W12345', a user id), None if none
        violation = why a write was refused because a record's state forbids it
                    (e.g. "cancel_pending_order on a delivered order"), else None
        malformed = which argument broke the target's format rules (an id not in canonical
                    form, a value outside an enum, a missing / unknown argument, an unknown
                    tool, arguments that are not a JSON object), else None
    """

    text: str
    ok: bool
    write: str | None = None
    violation: str | None = None
    malformed: str | None = None


@dataclass
class World:
    """A database being built: the toolkit's own database object plus the seeded generator."""

    db: Any
    rng: random.Random
    state: dict[str, Any] = field(default_factory=dict)  # the toolkit's bookkeeping (id pools...)


class RecordToolkit(ABC):
    """A target's database schema and tool code for other environments (see module docstring)."""

    #: Registry name of the target this toolkit belongs to (e.g. "store").
    target: ClassVar[str]
    #: The cancel reasons the target's cancel tool accepts, and how users say each one.
    cancel_reasons: ClassVar[tuple[str, ...]]
    reason_paraphrases: ClassVar[dict[str, tuple[str, ...]]]
    #: Order statuses the target knows, and the status each order write requires.
    statuses: ClassVar[tuple[str, ...]]
    required_status: ClassVar[dict[str, str]]

    @classmethod
    def params_for(cls, env: Any) -> dict[str, Any]:
        """The constructor parameters for the target instance `env` (default: none)."""
        return {}

    # -- building a world -------------------------------------------------------------------
    @abstractmethod
    def new_world(self, rng: random.Random) -> World:
        """A database holding the target's catalog and no users or orders."""

    @abstractmethod
    def add_user(self, world: World) -> UserView:
        """A new user with 1-3 payment methods and no orders (names distinct within the world)."""

    @abstractmethod
    def add_order(self, world: World, user_id: str, status: str,
                  items: Sequence[tuple[str, str]]) -> OrderView:
        """A new order of `user_id` holding the (product_id, item_id) lines, paid with one of the
        user's payment methods, appended to the user's order list."""

    @abstractmethod
    def copy(self, db: Any) -> Any:
        """An independent database equal to `db`."""

    # -- views ------------------------------------------------------------------------------
    @abstractmethod
    def products(self, db: Any) -> list[ProductView]:
        """The catalog, in the target's order."""

    @abstractmethod
    def user(self, db: Any, user_id: str) -> UserView: ...

    @abstractmethod
    def order(self, db: Any, order_id: str) -> OrderView: ...

    @abstractmethod
    def set_user_orders(self, db: Any, user_id: str, order_ids: Sequence[str]) -> None:
        """Reorder a user's order list (the same ids): the order the target lists them in."""

    # -- renderings -------------------------------------------------------------------------
    @abstractmethod
    def money(self, cents: int) -> str:
        """An amount as the target writes it (e.g. '45.00')."""

    @abstractmethod
    def loose_order_ids(self, order_id: str) -> tuple[str, ...]:
        """Ways a user writes `order_id` loosely, none of them the canonical form."""

    @abstractmethod
    def canonical_order_id(self, text: str) -> str | None:
        """The canonical order id a user's loose reference means, None if it is not one."""

    @abstractmethod
    def describe_item(self, item: ItemView) -> str:
        """How a user names an item by its attributes (e.g. 'red 1L kettle')."""

    # -- tools ------------------------------------------------------------------------------
    @abstractmethod
    def call(self, db: Any, name: str, arguments: dict[str, Any]) -> CallOutcome:
        """Run the target's own tool `name` on `db` (changed only by a successful write)."""

    @abstractmethod
    def invalid_arguments(self, name: str, error: str) -> CallOutcome:
        """The target's answer to a call of `name` whose arguments were not a JSON object
        (`ToolAction.error` holds `error`)."""


_REF = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)$")


def split_ref(ref: str) -> tuple[str, str]:
    """'package.module:Attribute' -> ('package.module', 'Attribute'); ValueError otherwise."""
    match = _REF.match(ref or "")
    if match is None:
        raise ValueError(f"toolkit reference {ref!r} is not of the form 'package.module:Attribute'")
    return match["module"], match["attr"]


__all__ = ["CallOutcome", "ItemView", "OrderView", "ProductView", "RecordToolkit", "UserView", "VariantView",
           "World", "split_ref"]
