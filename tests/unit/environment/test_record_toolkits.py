"""The SDK's target surface and the two record toolkits (store, tau2 retail), against the targets themselves.

A toolkit's tool output must be the target environment's own answer for the same database
and call, byte for byte; its worlds must be seeded; its views and renderings must agree with
the records; `describe_target` must report what a reset of the target shows."""

from __future__ import annotations

import copy
import json
import random

import pytest

from trace_common.domains.store import tools as store_tools
from trace_common.domains.tau2.retail_db import RetailDB
from trace_common.domains.tau2.retail_tools import RetailTools
from trace_common.env import ToolAction
from trace_common.env.records import RecordToolkit
from trace_common.env.surface import TargetSurface, describe_target, load_toolkit, toolkit_sha256

from .helpers import TARGET_NAMES, target, target_env


def _toolkit(name: str) -> RecordToolkit:
    return load_toolkit(target(name).surface)


def _db_copy(name: str, db):
    return copy.deepcopy(db) if name == "store" else RetailDB.copy_on_write(db)


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_describe_target_reports_what_the_target_shows(name):
    env = target_env(name)
    obs = env.reset(env.splits()["train"][0] if name == "store" else 0)
    surface = describe_target(env)
    assert surface.system_prompt == obs.messages[0].content
    assert surface.greeting == (obs.messages[1].content if obs.messages[1].role == "assistant" else None)
    assert surface.tool_schemas == env.tool_schemas() and len(surface.tool_schemas) == {"store": 9,
                                                                                         "tau2-retail": 16}[name]
    assert surface.toolkit == f"trace_common.domains.{name.split('-')[0]}.record_toolkit:TOOLKIT"
    assert target(name).summary()["toolkit_sha256"] == toolkit_sha256(surface.toolkit)
    # JSON-able as a whole, and the toolkit builds from the JSON round trip (what a bundle bakes)
    again = TargetSurface.model_validate(json.loads(json.dumps(surface.model_dump(mode="json"))))
    assert again == surface


# Calls made on the target's own episode database: (tool, arguments from the db); `None` marks
# the broken-JSON action. They cover reads, loose ids, unknown tools, missing / extra arguments,
# refused and successful writes.
def _calls(name: str, db) -> list[tuple[str, dict]]:
    tk = _toolkit(name)
    if name == "store":
        user_id = next(iter(db["users"]))
        orders = list(db["orders"].values())
        pending = next(o["order_id"] for o in orders if o["status"] == "pending")
        other = next(o["order_id"] for o in orders if o["status"] != "pending")
        delivered = next((o for o in orders if o["status"] == "delivered"), None)
        product = next(iter(db["products"]))
    else:
        user_id = next(iter(db.users))
        pending = next(o.order_id for o in db.orders.values() if o.status == "pending")
        other = next(o.order_id for o in db.orders.values() if o.status == "delivered")
        delivered = None
        product = next(iter(db.products))
    calls = [("find_user_id_by_email", {"email": "nobody@example.com"}),
             ("get_user_details", {"user_id": user_id}), ("get_order_details", {"order_id": pending}),
             ("get_order_details", {"order_id": tk.loose_order_ids(pending)[0]}),
             ("get_product_details", {"product_id": product}), ("no_such_tool", {}),
             ("get_order_details", {}), ("get_order_details", {"order_id": pending, "extra": 1}),
             ("cancel_pending_order", {"order_id": other, "reason": "no longer needed"}),
             ("cancel_pending_order", {"order_id": pending, "reason": "I changed my mind"}),
             ("cancel_pending_order", {"order_id": pending, "reason": "ordered by mistake"}),
             ("get_order_details", {"order_id": pending}), ("get_order_details", None)]
    if delivered is not None:
        calls.append(("return_delivered_order_items", {"order_id": delivered["order_id"],
                                                        "item_ids": [delivered["items"][0]["item_id"]],
                                                        "payment_method_id": delivered["payment_method_id"]}))
    return calls


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_toolkit_calls_answer_exactly_as_the_target_environment(name):
    env, tk = target_env(name), _toolkit(name)
    checked = 0
    for seed in (0, 7, 31):
        env.reset(seed)
        db = _db_copy(name, env.db)  # the toolkit works on a copy of the target's own episode database
        for tool, args in _calls(name, env.db):
            if args is None:
                action = ToolAction(name=tool, call_id="c", raw_arguments="{oops", error="arguments are not valid JSON")
                expected = env.step(action).observation[0].content
                got = tk.invalid_arguments(tool, action.error)
            else:
                expected = env.step(ToolAction(name=tool, arguments=args, call_id="c")).observation[0].content
                got = tk.call(db, tool, args)
            assert got.text == expected, (seed, tool, args)
            checked += 1
        # the successful cancel (and return) changed both databases alike
        if name == "store":
            assert db["orders"] == env.db["orders"]
        else:
            assert db.orders == env.db.orders
    assert checked >= 3 * 13


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_toolkit_outcomes_say_what_a_call_meant(name):
    tk = _toolkit(name)
    world = tk.new_world(random.Random(5))
    user = tk.add_user(world)
    catalog = tk.products(world.db)
    delivered = tk.add_order(world, user.user_id, "delivered", [(catalog[0].product_id, catalog[0].variants[0].item_id)])
    pending = tk.add_order(world, user.user_id, "pending", [(catalog[1].product_id, catalog[1].variants[0].item_id)])
    db = tk.copy(world.db)
    refused = tk.call(db, "cancel_pending_order", {"order_id": delivered.order_id, "reason": "no longer needed"})
    assert not refused.ok and refused.violation and refused.write is None and not refused.malformed
    loose = tk.call(db, "get_order_details", {"order_id": tk.loose_order_ids(pending.order_id)[0]})
    assert not loose.ok and loose.malformed and "order_id" in loose.malformed
    paraphrase = tk.call(db, "cancel_pending_order", {"order_id": pending.order_id, "reason": "by accident"})
    assert not paraphrase.ok and "reason" in paraphrase.malformed
    assert tk.call(db, "nope", {}).malformed and tk.call(db, "get_order_details", {}).malformed
    done = tk.call(db, "cancel_pending_order", {"order_id": pending.order_id, "reason": "ordered by mistake"})
    assert done.ok and done.write == pending.order_id and not done.violation and not done.malformed
    read = tk.call(db, "get_order_details", {"order_id": pending.order_id})
    assert read.ok and read.write is None
    # the copy changed, the world it was copied from did not
    assert tk.order(db, pending.order_id).status == "cancelled"
    assert tk.order(db, pending.order_id).cancel_reason == "ordered by mistake"
    assert tk.order(world.db, pending.order_id).status == "pending"


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_worlds_are_seeded_and_follow_the_targets_formats(name):
    tk = _toolkit(name)

    def build(seed: int):
        world = tk.new_world(random.Random(seed))
        users = [tk.add_user(world) for _ in range(3)]
        catalog = tk.products(world.db)
        orders = [tk.add_order(world, u.user_id, status, [(p.product_id, p.variants[-1].item_id) for p in catalog[:2]])
                  for u in users for status in tk.statuses]
        return users, orders, world

    a, b, c = build(11), build(11), build(12)
    assert a[:2] == b[:2] and a[:2] != c[:2]
    users, orders, world = a
    width = {"store": 5, "tau2-retail": 7}[name]
    for order in orders:
        assert order.order_id.startswith("#W") and len(order.order_id) == 2 + width
        assert order.total == sum(i.price for i in order.items)
        assert order.payment_method_id in tk.user(world.db, order.user_id).payment_methods
        for loose in tk.loose_order_ids(order.order_id):
            assert loose != order.order_id and tk.canonical_order_id(loose) == order.order_id
        assert tk.canonical_order_id(order.order_id) == order.order_id
    assert len({(u.first_name, u.last_name) for u in users}) == 3
    assert all(tk.user(world.db, u.user_id).orders == tuple(o.order_id for o in orders if o.user_id == u.user_id)
               for u in users)
    # the target's own tool shows the price the view holds, as the target writes amounts
    first = orders[0]
    text = tk.call(world.db, "get_order_details", {"order_id": first.order_id}).text
    shown = tk.money(first.items[0].price) if name == "store" else str(float(tk.money(first.items[0].price)))
    assert shown in text


@pytest.mark.parametrize(("name", "cents", "text"), [("store", 4500, "45.00"), ("store", 5, "0.05"),
                                                     ("tau2-retail", 5088, "50.88"), ("tau2-retail", 4780, "47.80")])
def test_money_renders_two_decimals(name, cents, text):
    assert _toolkit(name).money(cents) == text


def test_the_tau2_toolkit_holds_the_domains_catalog():
    env = target_env("tau2-retail")
    tk = _toolkit("tau2-retail")
    catalog = tk.products(tk.new_world(random.Random(0)).db)
    assert [p.product_id for p in catalog] == list(env.domain.pristine_db.products)
    tool = RetailTools(env.domain.fresh_db())
    for product in catalog[:5]:
        assert json.loads(tool.call("get_product_details", {"product_id": product.product_id}).content)["name"] \
            == product.name


def test_store_toolkit_calls_the_stores_tool_code():
    tk = _toolkit("store")
    world = tk.new_world(random.Random(2))
    user = tk.add_user(world)
    catalog = tk.products(world.db)
    order = tk.add_order(world, user.user_id, "pending", [(catalog[3].product_id, catalog[3].variants[1].item_id)])
    for args in ({"user_id": user.user_id}, {"user_id": "nobody_nowhere_0000"}):
        assert tk.call(world.db, "list_user_orders", args).text == \
            store_tools.call_tool(copy.deepcopy(world.db), "list_user_orders", args).text
    assert tk.describe_item(order.items[0]) == " ".join(order.items[0].options) + " " + order.items[0].name
