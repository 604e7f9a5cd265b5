"""TRACE's implementation of tau2-bench's retail tools (same names, results, errors, DB effects).

Each method follows the facts of tau2's retail toolkit: the checks it makes and their order
(so the first failing check gives the same "Error: ..." text), what it writes and how money is
rounded. Arguments are not validated against the schema before the call -- tau2 does not
either -- so a malformed argument fails in the same place with the same Python error text.

Quirks of tau2 that are reproduced on purpose, because the gold database hashes depend on
them:

- `modify_pending_order_items` gives every modified line the price and options of the *last*
  new item in the call (tau2 reuses the loop variable), and does not round the price
  difference it records as a payment/refund.
- `modify_pending_order_address` and `modify_pending_order_payment` accept any status that
  contains "pending" (also "pending (item modified)"); cancel and modify-items need exactly
  "pending".
- A check that fails part-way (e.g. an unknown payment method during a cancellation's refund
  loop) can leave earlier balance updates in place, as in tau2. Every check that the policy
  cares about runs before the first write, so ordinary bad calls leave the DB unchanged.

Every write tool takes its order/user through `write=True` first, so on a copy-on-write DB
(`RetailDB.copy_on_write`) the change lands in a private copy of the record.
"""

from __future__ import annotations

import json
from typing import Any

from trace_common.domains.tau2.arithmetic import calculate_expression
from trace_common.domains.tau2.retail_db import (
    GiftCard,
    Order,
    OrderPayment,
    PaymentMethod,
    Product,
    RetailDB,
    User,
    UserAddress,
    Variant,
)
from trace_common.domains.tau2.retail_schemas import RETAIL_TOOL_SPECS
from trace_common.domains.tau2.toolkit import Toolkit

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


class RetailTools(Toolkit):  # the class name appears in Python's TypeError texts, as in tau2
    SPECS = RETAIL_TOOL_SPECS

    def __init__(self, db: RetailDB):
        self.db = db

    # ----------------------------------------------------------------- lookups
    def _order(self, order_id: str, write: bool = False) -> Order:
        """`write=True` before a change: the DB gives a record private to it (copy-on-write)."""
        if order_id not in self.db.orders:
            raise ValueError("Order not found")
        return self.db.writable_order(order_id) if write else self.db.orders[order_id]

    def _user(self, user_id: str, write: bool = False) -> User:
        if user_id not in self.db.users:
            raise ValueError("User not found")
        return self.db.writable_user(user_id) if write else self.db.users[user_id]

    def _product(self, product_id: str) -> Product:
        if product_id not in self.db.products:
            raise ValueError("Product not found")
        return self.db.products[product_id]

    def _variant(self, product_id: str, item_id: str) -> Variant:
        product = self._product(product_id)
        if item_id not in product.variants:
            raise ValueError("Variant not found")
        return product.variants[item_id]

    def _payment_method(self, user_id: str, payment_method_id: str) -> PaymentMethod:
        user = self._user(user_id)
        if payment_method_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        return user.payment_methods[payment_method_id]

    @staticmethod
    def _check_items_in_order(order: Order, item_ids: Any, message: str) -> None:
        """Each id may appear in the call at most as often as it appears in the order."""
        in_order = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > in_order.count(item_id):
                raise ValueError(message.format(item_id=item_id))

    @staticmethod
    def _first_line(order: Order, item_id: str):
        return next((item for item in order.items if item.item_id == item_id), None)

    # ----------------------------------------------------------------- generic
    def calculate(self, expression: str) -> str:
        return calculate_expression(expression)

    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    # ----------------------------------------------------------------- reads
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:  # noqa: A002
        first, last = first_name.lower(), last_name.lower()
        for user_id, user in self.db.users.items():
            if (user.name.first_name.lower() == first and user.name.last_name.lower() == last
                    and user.address.zip == zip):
                return user_id
        raise ValueError("User not found")

    def find_user_id_by_email(self, email: str) -> str:
        wanted = email.lower()
        for user_id, user in self.db.users.items():
            if user.email.lower() == wanted:
                return user_id
        raise ValueError("User not found")

    def get_order_details(self, order_id: str) -> Order:
        return self._order(order_id)

    def get_product_details(self, product_id: str) -> Product:
        return self._product(product_id)

    def get_item_details(self, item_id: str) -> Variant:
        for product in self.db.products.values():
            if item_id in product.variants:
                return product.variants[item_id]
        raise ValueError("Item not found")

    def get_user_details(self, user_id: str) -> User:
        return self._user(user_id)

    def list_all_product_types(self) -> str:
        names = {product.name: product.product_id for product in self.db.products.values()}
        return json.dumps(names, sort_keys=True)

    # ----------------------------------------------------------------- writes
    def cancel_pending_order(self, order_id: str, reason: str) -> Order:
        order = self._order(order_id, write=True)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order.payment_history:
            refunds.append(OrderPayment(transaction_type="refund", amount=payment.amount,
                                        payment_method_id=payment.payment_method_id))
            user = self._user(order.user_id)
            method = self._payment_method(user.user_id, payment.payment_method_id)
            if isinstance(method, GiftCard):  # gift cards are refunded at once
                method.balance = round(method.balance + payment.amount, 2)
        order.status = "cancelled"
        order.cancel_reason = reason
        order.payment_history.extend(refunds)
        return order

    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                       payment_method_id: str) -> Order:
        order = self._order(order_id, write=True)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        self._check_items_in_order(order, item_ids, "Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        diff_price = 0
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            line = self._first_line(order, item_id)
            if line is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._variant(line.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff_price += variant.price - line.price
        diff_price = round(diff_price, 2)
        method = self._payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = diff_price
        return order

    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str,
                                     state: str, country: str, zip: str) -> Order:  # noqa: A002
        order = self._order(order_id, write=True)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        order.address = UserAddress(address1=address1, address2=address2, city=city, state=state,
                                    country=country, zip=zip)
        return order

    def modify_pending_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                   payment_method_id: str) -> Order:
        order = self._order(order_id, write=True)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be modified")
        self._check_items_in_order(order, item_ids, "{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        diff_price = 0
        variant: Variant | None = None
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            if item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            line = self._first_line(order, item_id)
            if line is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._variant(line.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff_price += variant.price - line.price
        method = self._payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the new item")
        order.payment_history.append(OrderPayment(
            transaction_type="payment" if diff_price > 0 else "refund",
            amount=abs(diff_price), payment_method_id=payment_method_id))
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - diff_price, 2)
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            line = self._first_line(order, item_id)
            if line is None:
                raise ValueError(f"Item {item_id} not found")
            line.item_id = new_item_id
            # tau2 quirk: price/options come from the last variant checked above
            line.price = variant.price
            line.options = dict(variant.options)  # tau2 shares the dict; a copy keeps products untouchable
        order.status = "pending (item modified)"
        return order

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Order:
        order = self._order(order_id, write=True)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        method = self._payment_method(order.user_id, payment_method_id)
        history = order.payment_history
        if len(history) != 1 or history[0].transaction_type != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        if history[0].payment_method_id == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = history[0].amount
        if isinstance(method, GiftCard) and method.balance < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        old_method_id = history[0].payment_method_id
        history.extend([
            OrderPayment(transaction_type="payment", amount=amount, payment_method_id=payment_method_id),
            OrderPayment(transaction_type="refund", amount=amount, payment_method_id=old_method_id),
        ])
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - amount, 2)
        old_method = self._payment_method(order.user_id, old_method_id)
        if isinstance(old_method, GiftCard):
            old_method.balance = round(old_method.balance + amount, 2)
        return order

    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str,
                            country: str, zip: str) -> User:  # noqa: A002
        user = self._user(user_id, write=True)
        user.address = UserAddress(address1=address1, address2=address2, city=city, state=state,
                                   country=country, zip=zip)
        return user

    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> Order:
        order = self._order(order_id, write=True)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        user = self._user(order.user_id)
        method = self._payment_method(user.user_id, payment_method_id)
        if not isinstance(method, GiftCard) and payment_method_id != order.payment_history[0].payment_method_id:
            raise ValueError("Payment method should be the original payment method")
        self._check_items_in_order(order, item_ids, "Some item not found")
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        return order
