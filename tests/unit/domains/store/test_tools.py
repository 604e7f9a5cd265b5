"""Tool errors: each returns an error observation, leaves the database unchanged and is
tagged with the capability it reveals (or none)."""

from __future__ import annotations

import copy

import pytest

from tests.unit.domains.store.helpers import TEST_SEEDS, call, step_capabilities
from trace_common.domains.store import StoreEnv, generate_task
from trace_common.domains.store.tools import TOOL_NAMES, TOOL_SCHEMAS
from trace_common.env import ToolAction


def _world_seed() -> int:
    """A seed whose task asks for no write (so no write is "the wrong record") and whose
    database has pending and delivered orders and an unavailable variant."""
    for seed in TEST_SEEDS:
        task = generate_task(seed)
        if task.gold_actions():
            continue
        db = task.db
        statuses = {o["status"] for o in db["orders"].values()}
        unavailable = any(not v["available"] for p in db["products"].values() for v in p["variants"].values())
        if {"pending", "delivered"} <= statuses and unavailable:
            return seed
    raise AssertionError("no suitable seed")


SEED = _world_seed()


def _order(db, status):
    return next(o for o in db["orders"].values() if o["status"] == status)


def _unavailable_swap(db):
    """(delivered order, its item, an unavailable variant of that item's product) or None."""
    for order in db["orders"].values():
        if order["status"] != "delivered":
            continue
        for row in order["items"]:
            for v in db["products"][row["product_id"]]["variants"].values():
                if not v["available"]:
                    return order, row["item_id"], v["item_id"]
    return None


def _other_product_item(db, row):
    return next(v for p in db["products"].values() if p["product_id"] != row["product_id"]
                for v in p["variants"])


# (name, build(db) -> ToolAction, error text, capabilities tagged)
CASES = [
    ("unknown-order", lambda db: call("get_order_details", order_id="#W00001"), "not found", []),
    ("unknown-user", lambda db: call("list_user_orders", user_id="nobody_here_0000"), "not found", []),
    ("unknown-email", lambda db: call("find_user_id_by_email", email="x@example.com"), "no user", []),
    ("unknown-product", lambda db: call("get_product_details", product_id="0001"), "not found", []),
    ("order-id-without-prefix", lambda db: call("get_order_details", order_id=_order(db, "pending")["order_id"][2:]),
     "expected '#W' followed by 5 digits", ["tool_call_precision"]),
    ("order-id-lowercase", lambda db: call("get_order_details",
                                           order_id=_order(db, "pending")["order_id"].lower()),
     "expected '#W'", ["tool_call_precision"]),
    ("product-id-width", lambda db: call("get_product_details", product_id="12345"), "4 digits",
     ["tool_call_precision"]),
    ("cancel-delivered", lambda db: call("cancel_pending_order", order_id=_order(db, "delivered")["order_id"],
                                         reason="no longer needed"),
     "only pending orders can be cancelled", ["precondition_verification"]),
    ("return-pending", lambda db: call("return_delivered_order_items", order_id=_order(db, "pending")["order_id"],
                                       item_ids=[_order(db, "pending")["items"][0]["item_id"]],
                                       payment_method_id=_order(db, "pending")["payment_method_id"]),
     "only delivered orders can be returned", ["precondition_verification"]),
    ("cancel-reason-paraphrase", lambda db: call("cancel_pending_order", order_id=_order(db, "pending")["order_id"],
                                                 reason="I don't need it"),
     "exactly 'no longer needed' or 'ordered by mistake'", ["tool_call_precision"]),
    ("cancel-missing-reason", lambda db: call("cancel_pending_order", order_id=_order(db, "pending")["order_id"]),
     "missing required argument 'reason'", ["tool_call_precision"]),
    ("cancel-unknown-argument", lambda db: call("cancel_pending_order", order_id=_order(db, "pending")["order_id"],
                                                reason="no longer needed", force=True),
     "only the arguments", ["tool_call_precision"]),
    ("item-ids-not-a-list", lambda db: call("return_delivered_order_items",
                                            order_id=_order(db, "delivered")["order_id"],
                                            item_ids=_order(db, "delivered")["items"][0]["item_id"],
                                            payment_method_id=_order(db, "delivered")["payment_method_id"]),
     "a non-empty list of item id strings", ["tool_call_precision"]),
    ("item-ids-integers", lambda db: call("return_delivered_order_items",
                                          order_id=_order(db, "delivered")["order_id"],
                                          item_ids=[int(_order(db, "delivered")["items"][0]["item_id"])],
                                          payment_method_id=_order(db, "delivered")["payment_method_id"]),
     "a non-empty list of item id strings", ["tool_call_precision"]),
    ("order-id-integer", lambda db: call("get_order_details", order_id=12345), "a string", ["tool_call_precision"]),
    ("item-not-in-order", lambda db: call("return_delivered_order_items",
                                          order_id=_order(db, "delivered")["order_id"], item_ids=["99999"],
                                          payment_method_id=_order(db, "delivered")["payment_method_id"]),
     "is not in order", []),
    ("wrong-payment-method", lambda db: call("return_delivered_order_items",
                                             order_id=_order(db, "delivered")["order_id"],
                                             item_ids=[_order(db, "delivered")["items"][0]["item_id"]],
                                             payment_method_id="gift_card_00000"),
     "order's payment method", []),
    ("exchange-unavailable", lambda db: call("exchange_delivered_order_items", order_id=_unavailable_swap(db)[0]["order_id"],
                                             item_ids=[_unavailable_swap(db)[1]], new_item_ids=[_unavailable_swap(db)[2]],
                                             payment_method_id=_unavailable_swap(db)[0]["payment_method_id"]),
     "unavailable", []),
    ("exchange-other-product", lambda db: call(
        "exchange_delivered_order_items", order_id=_order(db, "delivered")["order_id"],
        item_ids=[_order(db, "delivered")["items"][0]["item_id"]],
        new_item_ids=[_other_product_item(db, _order(db, "delivered")["items"][0])],
        payment_method_id=_order(db, "delivered")["payment_method_id"]),
     "is not a variant of", []),
    ("exchange-same-item", lambda db: call(
        "exchange_delivered_order_items", order_id=_order(db, "delivered")["order_id"],
        item_ids=[_order(db, "delivered")["items"][0]["item_id"]],
        new_item_ids=[_order(db, "delivered")["items"][0]["item_id"]],
        payment_method_id=_order(db, "delivered")["payment_method_id"]),
     "same item", []),
    ("empty-address", lambda db: call("modify_user_address", user_id=next(iter(db["users"])), address="  "),
     "a non-empty string", ["tool_call_precision"]),
    ("unknown-tool", lambda db: call("refund_everything", order_id="#W12345"), "unknown tool",
     ["tool_call_precision"]),
    ("broken-json", lambda db: ToolAction(name="get_order_details", call_id="x", raw_arguments='{"order_id": ',
                                          error="arguments are not valid JSON"),
     "not valid JSON", ["tool_call_precision"]),
]


@pytest.mark.parametrize("name, build, text, caps", CASES, ids=[c[0] for c in CASES])
def test_tool_errors_leave_db_unchanged(name, build, text, caps):
    env = StoreEnv()
    env.reset(SEED)
    action = build(env.db)
    before = copy.deepcopy(env.db)
    result = env.step(action)
    (message,) = result.observation
    assert message.role == "tool" and message.tool_call_id == action.call_id
    assert message.content.startswith("Error:") and text in message.content
    assert env.db == before
    assert step_capabilities(env) == caps
    assert not env.done


@pytest.mark.parametrize("name, args, expect", [
    ("cancel_pending_order", lambda db: {"order_id": _order(db, "pending")["order_id"], "reason": "ordered by mistake"},
     lambda db, o: db["orders"][o["order_id"]]["status"] == "cancelled"),
    ("return_delivered_order_items", lambda db: {"order_id": _order(db, "delivered")["order_id"],
                                                  "item_ids": [_order(db, "delivered")["items"][0]["item_id"]],
                                                  "payment_method_id": _order(db, "delivered")["payment_method_id"]},
     lambda db, o: db["orders"][o["order_id"]]["status"] == "return requested"),
    ("modify_user_address", lambda db: {"user_id": next(iter(db["users"])), "address": "1 New Road, Town, 00001"},
     lambda db, o: db["users"][o["user_id"]]["address"] == "1 New Road, Town, 00001"),
])
def test_successful_writes_change_the_db(name, args, expect):
    env = StoreEnv()
    env.reset(SEED)
    arguments = args(env.db)
    result = env.step(call(name, **arguments))
    assert not result.observation[0].content.startswith("Error:")
    assert expect(env.db, arguments)


def test_schemas_cover_every_tool_and_forbid_extra_arguments():
    assert [s["function"]["name"] for s in TOOL_SCHEMAS] == list(TOOL_NAMES)
    assert len(TOOL_NAMES) == 9
    for schema in TOOL_SCHEMAS:
        params = schema["function"]["parameters"]
        assert params["additionalProperties"] is False
        assert set(params["required"]) == set(params["properties"])
