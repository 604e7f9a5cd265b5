"""TRACE's tau2 retail tools: schemas, tool-message contents, tau2 error texts, DB effects.

Expected texts are tau2-bench's: they were produced by running tau2-bench's own retail
toolkit (github.com/sierra-research/tau2-bench @ a2c0247) on the same calls and data, and
are the contract here. Every bad call must also leave the database exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jsonschema
import pytest

from trace_common.domains.tau2.retail_db import RetailDB
from trace_common.domains.tau2.retail_tools import RetailTools
from trace_common.domains.tau2.toolkit import ToolKind, render_content

TAU2_TOOL_ORDER = [
    "calculate", "cancel_pending_order", "exchange_delivered_order_items", "find_user_id_by_name_zip",
    "find_user_id_by_email", "get_order_details", "get_product_details", "get_item_details", "get_user_details",
    "list_all_product_types", "modify_pending_order_address", "modify_pending_order_items",
    "modify_pending_order_payment", "modify_user_address", "return_delivered_order_items",
    "transfer_to_human_agents",
]
WRITE_TOOLS = {"cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
               "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
               "return_delivered_order_items"}
#: sha256 of json.dumps(tau2's 16 retail tool schemas in order, sort_keys=True), from tau2-bench's code.
TAU2_SCHEMAS_SHA256 = "eaf16ffafcc143f9e618efd9c7e1a0bfea819ccc2b2cb12251915522d1b4ce2a"

#: What the OpenAI chat-completions API accepts as one function tool.
OPENAI_FUNCTION_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "description", "parameters"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                "description": {"type": "string", "minLength": 1},
                "parameters": {
                    "type": "object",
                    "required": ["type", "properties"],
                    "properties": {
                        "type": {"const": "object"},
                        "properties": {"type": "object", "additionalProperties": {
                            "type": "object", "required": ["type", "description"]}},
                        "required": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                    },
                },
            },
        },
    },
}

SPECS = RetailTools.SPECS


def test_tool_names_and_order_are_tau2s():
    assert list(SPECS) == TAU2_TOOL_ORDER
    assert {n for n, s in SPECS.items() if s.kind is ToolKind.WRITE} == WRITE_TOOLS
    assert {n for n, s in SPECS.items() if s.mutates_state} == WRITE_TOOLS


def test_schemas_are_byte_identical_to_tau2s():
    schemas = [spec.schema for spec in SPECS.values()]
    digest = hashlib.sha256(json.dumps(schemas, sort_keys=True).encode()).hexdigest()
    assert digest == TAU2_SCHEMAS_SHA256


@pytest.mark.parametrize("name", TAU2_TOOL_ORDER)
def test_schema_is_a_valid_openai_function_schema(name: str):
    schema = SPECS[name].schema
    jsonschema.validate(schema, OPENAI_FUNCTION_TOOL)
    params = schema["function"]["parameters"]
    jsonschema.Draft202012Validator.check_schema(params)
    assert schema["function"]["name"] == name
    assert set(params.get("required", [])) == set(params["properties"])


@pytest.mark.parametrize("name", TAU2_TOOL_ORDER)
def test_every_gold_call_of_the_tool_fits_its_schema(name: str, retail):
    """The argument shapes in tau2's own gold actions validate against the schema."""
    params = SPECS[name].schema["function"]["parameters"]
    calls = [a.arguments for t in retail.tasks for a in t.gold_actions if a.name == name]
    for arguments in calls:
        jsonschema.validate(arguments, params)
    bad = {"__not_a_parameter__": 1} if not params["properties"] else {}
    if params.get("required"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, params)


# ------------------------------------------------------------------------------- bad calls
PEND, PEND_GC, DELIV, DELIV_GC, PROC, CANC = "#W5918442", "#W6779827", "#W6304490", "#W5332101", "#W2611340", "#W3220387"
ADDR = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX", "country": "USA", "zip": "78701"}

BAD_CALLS: list[tuple[str, str, dict[str, Any], str]] = [
    # unknown ids
    ("unknown_order", "get_order_details", {"order_id": "#W0000000"}, "Error: Order not found"),
    ("order_id_without_hash", "get_order_details", {"order_id": "W5918442"}, "Error: Order not found"),
    ("cancel_unknown_order", "cancel_pending_order", {"order_id": "#W0000000", "reason": "no longer needed"},
     "Error: Order not found"),
    ("unknown_user", "get_user_details", {"user_id": "nobody_0000"}, "Error: User not found"),
    ("unknown_product", "get_product_details", {"product_id": "0000000000"}, "Error: Product not found"),
    ("unknown_item", "get_item_details", {"item_id": "0000000000"}, "Error: Item not found"),
    ("unknown_email", "find_user_id_by_email", {"email": "nobody@example.com"}, "Error: User not found"),
    ("unknown_tool", "delete_order", {"order_id": PEND}, "Error: Tool 'delete_order' not found."),
    # wrong status for the action
    ("cancel_delivered", "cancel_pending_order", {"order_id": DELIV, "reason": "no longer needed"},
     "Error: Non-pending order cannot be cancelled"),
    ("cancel_processed", "cancel_pending_order", {"order_id": PROC, "reason": "ordered by mistake"},
     "Error: Non-pending order cannot be cancelled"),
    ("return_pending", "return_delivered_order_items",
     {"order_id": PEND, "item_ids": ["1725100896"], "payment_method_id": "credit_card_5051208"},
     "Error: Non-delivered order cannot be returned"),
    ("exchange_pending", "exchange_delivered_order_items",
     {"order_id": PEND, "item_ids": ["1725100896"], "new_item_ids": ["9007697085"],
      "payment_method_id": "credit_card_5051208"}, "Error: Non-delivered order cannot be exchanged"),
    ("modify_items_delivered", "modify_pending_order_items",
     {"order_id": DELIV, "item_ids": ["6956751343"], "new_item_ids": ["3232433601"],
      "payment_method_id": "credit_card_4420174"}, "Error: Non-pending order cannot be modified"),
    ("modify_address_cancelled", "modify_pending_order_address", {"order_id": CANC, **ADDR},
     "Error: Non-pending order cannot be modified"),
    ("modify_payment_processed", "modify_pending_order_payment",
     {"order_id": PROC, "payment_method_id": "gift_card_1725971"}, "Error: Non-pending order cannot be modified"),
    # wrong payment method
    ("return_not_original_payment", "return_delivered_order_items",
     {"order_id": DELIV_GC, "item_ids": ["1176194968"], "payment_method_id": "credit_card_9389219"},
     "Error: Payment method should be the original payment method"),
    ("return_unknown_payment", "return_delivered_order_items",
     {"order_id": DELIV, "item_ids": ["6956751343"], "payment_method_id": "credit_card_0000000"},
     "Error: Payment method not found"),
    ("modify_payment_same_method", "modify_pending_order_payment",
     {"order_id": PEND, "payment_method_id": "credit_card_5051208"},
     "Error: The new payment method should be different from the current one"),
    ("modify_payment_other_users_method", "modify_pending_order_payment",
     {"order_id": PEND, "payment_method_id": "credit_card_4420174"}, "Error: Payment method not found"),
    ("modify_items_gift_card_insufficient", "modify_pending_order_items",
     {"order_id": PEND_GC, "item_ids": ["7896397433"], "new_item_ids": ["2444431651"],
      "payment_method_id": "gift_card_7219486"}, "Error: Insufficient gift card balance to pay for the new item"),
    ("exchange_unknown_payment", "exchange_delivered_order_items",
     {"order_id": DELIV, "item_ids": ["6956751343"], "new_item_ids": ["3232433601"],
      "payment_method_id": "paypal_0000000"}, "Error: Payment method not found"),
    # item-level mistakes
    ("cancel_invalid_reason", "cancel_pending_order", {"order_id": PEND, "reason": "changed my mind"},
     "Error: Invalid reason"),
    ("modify_items_same_item", "modify_pending_order_items",
     {"order_id": PEND, "item_ids": ["1725100896"], "new_item_ids": ["1725100896"],
      "payment_method_id": "credit_card_5051208"},
     "Error: The new item id should be different from the old item id"),
    ("modify_items_unavailable", "modify_pending_order_items",
     {"order_id": PEND, "item_ids": ["1725100896"], "new_item_ids": ["1002370030"],
      "payment_method_id": "credit_card_5051208"}, "Error: New item 1002370030 not found or available"),
    ("modify_items_other_product", "modify_pending_order_items",
     {"order_id": PEND, "item_ids": ["1725100896"], "new_item_ids": ["2444431651"],
      "payment_method_id": "credit_card_5051208"}, "Error: Variant not found"),
    ("modify_items_not_in_order", "modify_pending_order_items",
     {"order_id": PEND, "item_ids": ["9999999999"], "new_item_ids": ["9007697085"],
      "payment_method_id": "credit_card_5051208"}, "Error: 9999999999 not found"),
    ("modify_items_count_mismatch", "modify_pending_order_items",
     {"order_id": PEND, "item_ids": ["1725100896"], "new_item_ids": [], "payment_method_id": "credit_card_5051208"},
     "Error: The number of items to be exchanged should match"),
    ("exchange_not_in_order", "exchange_delivered_order_items",
     {"order_id": DELIV, "item_ids": ["1111111111"], "new_item_ids": ["3232433601"],
      "payment_method_id": "credit_card_4420174"}, "Error: Number of 1111111111 not found."),
    ("exchange_count_mismatch", "exchange_delivered_order_items",
     {"order_id": DELIV, "item_ids": ["6956751343"], "new_item_ids": ["3232433601", "3098764622"],
      "payment_method_id": "credit_card_4420174"}, "Error: The number of items to be exchanged should match."),
    ("exchange_more_copies_than_ordered", "exchange_delivered_order_items",
     {"order_id": DELIV, "item_ids": ["6956751343", "6956751343"], "new_item_ids": ["3232433601", "3098764622"],
      "payment_method_id": "credit_card_4420174"}, "Error: Number of 6956751343 not found."),
    ("return_item_not_in_order", "return_delivered_order_items",
     {"order_id": DELIV, "item_ids": ["1111111111"], "payment_method_id": "credit_card_4420174"},
     "Error: Some item not found"),
    # malformed arguments (tau2 calls the tool without validating them first)
    ("missing_argument", "cancel_pending_order", {"order_id": PEND},
     "Error: RetailTools.cancel_pending_order() missing 1 required positional argument: 'reason'"),
    ("unexpected_argument", "get_order_details", {"order_id": PEND, "verbose": True},
     "Error: RetailTools.get_order_details() got an unexpected keyword argument 'verbose'"),
    ("order_id_as_int", "get_order_details", {"order_id": 5918442}, "Error: Order not found"),
    ("order_id_as_list", "get_order_details", {"order_id": [PEND]}, "Error: unhashable type: 'list'"),
    ("zip_as_int", "find_user_id_by_name_zip", {"first_name": "Sofia", "last_name": "Rossi", "zip": 78784},
     "Error: User not found"),
    ("item_ids_as_string", "return_delivered_order_items",
     {"order_id": DELIV, "item_ids": "6956751343", "payment_method_id": "credit_card_4420174"},
     "Error: Some item not found"),
    ("address_zip_as_int", "modify_pending_order_address", {"order_id": PEND, **ADDR, "zip": 78701},
     "Error: 1 validation error for UserAddress\nzip\n  Input should be a valid string [type=string_type, "
     "input_value=78701, input_type=int]"),
    ("arguments_not_json", "get_order_details", '{"order_id": ',  # type: ignore[list-item]
     "Error: Invalid arguments for tool 'get_order_details': Expecting value: line 1 column 14 (char 13)"),
    # calculate
    ("calc_letters", "calculate", {"expression": "2 + x"}, "Error: Invalid characters in expression"),
    ("calc_syntax", "calculate", {"expression": "2 +"}, "Error: invalid syntax (<string>, line 1)"),
    ("calc_empty", "calculate", {"expression": ""}, "Error: invalid syntax (<string>, line 0)"),
    ("calc_div_zero", "calculate", {"expression": "1/0"}, "Error: division by zero"),
    ("calc_float_div_zero", "calculate", {"expression": "1.5/0"}, "Error: float division by zero"),
    ("calc_call", "calculate", {"expression": "2 (3)"}, "Error: 'int' object is not callable"),
    ("calc_ellipsis", "calculate", {"expression": "..."},
     "Error: float() argument must be a string or a real number, not 'ellipsis'"),
    ("calc_empty_tuple", "calculate", {"expression": "()"},
     "Error: float() argument must be a string or a real number, not 'tuple'"),
    ("calc_float_overflow", "calculate", {"expression": "10.0**400"}, "Error: (34, 'Numerical result out of range')"),
    ("calc_not_a_string", "calculate", {"expression": 42}, "Error: 'int' object is not iterable"),
    ("calc_huge_power", "calculate", {"expression": "9**9**9**9"}, "Error: exponent too large"),  # TRACE guard
]


@pytest.fixture(scope="module")
def shared_db(retail) -> RetailDB:
    """One DB for all bad calls: each test checks it is still equal to the initial DB."""
    return retail.fresh_db()


@pytest.mark.filterwarnings("ignore::SyntaxWarning")
@pytest.mark.parametrize(("case", "tool", "arguments", "expected"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_call_returns_tau2_error_and_leaves_db_unchanged(case, tool, arguments, expected, shared_db,
                                                             initial_db):
    assert shared_db == initial_db, "an earlier bad call changed the DB"
    result = RetailTools(shared_db).call(tool, arguments)
    assert result.error is True
    if case == "address_zip_as_int":  # pydantic appends a version-specific documentation URL
        assert result.content.startswith(expected)
    else:
        assert result.content == expected
    assert shared_db == initial_db


def test_bad_calls_leave_the_db_hash_unchanged(shared_db, initial_db, retail):
    """After every bad call above, the canonical DB hash is still the initial one."""
    for _case, tool, arguments, _expected in BAD_CALLS:
        RetailTools(shared_db).call(tool, arguments)
    assert shared_db.sha256_hex() == retail.fresh_db().sha256_hex()


# ------------------------------------------------------------------------------ good calls
CALC_CASES = [("(1 + 2) * 3 / 4", "2.25"), ("7 // 2", "3.0"), ("-3", "-3.0"), ("0.1 + 0.2", "0.3"),
              ("2 ** -1", "0.5"), ("2 ** 10", "1024.0"), ("1234.5678 * 3", "3703.7"), ("652.61 + 473.43", "1126.04")]


@pytest.mark.parametrize(("expression", "expected"), CALC_CASES)
def test_calculate_matches_tau2(expression, expected, shared_db):
    result = RetailTools(shared_db).call("calculate", {"expression": expression})
    assert (result.content, result.error) == (expected, False)


def _user_pm(db: RetailDB, user_id: str, pm: str):
    return db.users[user_id].payment_methods[pm]


def _changed(before: RetailDB, after: RetailDB) -> set[str]:
    from trace_common.domains.tau2.evaluator import db_diff
    return set(db_diff(before, after))


WRITES: list[tuple[str, list[tuple[str, dict[str, Any]]], set[str]]] = [
    ("cancel_gift_card_order", [("cancel_pending_order", {"order_id": PEND_GC, "reason": "no longer needed"})],
     {f"orders/{PEND_GC}", "users/ethan_lopez_6291"}),
    ("modify_payment_from_gift_card", [("modify_pending_order_payment",
                                        {"order_id": PEND_GC, "payment_method_id": "credit_card_9789590"})],
     {f"orders/{PEND_GC}", "users/ethan_lopez_6291"}),
    ("modify_two_items", [("modify_pending_order_items",
                           {"order_id": PEND, "item_ids": ["1586641416", "6117189161"],
                            "new_item_ids": ["6700049080", "7523669277"], "payment_method_id": "credit_card_5051208"})],
     {f"orders/{PEND}"}),
    ("exchange_with_gift_card", [("exchange_delivered_order_items",
                                  {"order_id": DELIV_GC, "item_ids": ["1176194968"], "new_item_ids": ["9647292434"],
                                   "payment_method_id": "gift_card_3434432"})], {f"orders/{DELIV_GC}"}),
    ("return_to_gift_card", [("return_delivered_order_items",
                              {"order_id": DELIV_GC, "item_ids": ["1176194968"],
                               "payment_method_id": "gift_card_3434432"})], {f"orders/{DELIV_GC}"}),
    ("modify_user_address", [("modify_user_address", {"user_id": "sofia_rossi_8776", **ADDR})],
     {"users/sofia_rossi_8776"}),
]


@pytest.mark.parametrize(("case", "calls", "changed"), WRITES, ids=[w[0] for w in WRITES])
def test_write_changes_exactly_its_records(case, calls, changed, retail, initial_db):
    db = retail.fresh_db()
    tools = RetailTools(db)
    results = [tools.call(name, args) for name, args in calls]
    assert not any(r.error for r in results), [r.content for r in results]
    assert _changed(initial_db, db) == changed
    # the tool message is the record after the write, rendered as tau2 renders models
    name, args = calls[-1]
    record = db.users[args["user_id"]] if name == "modify_user_address" else db.orders[args["order_id"]]
    assert results[-1].content == json.dumps(record.model_dump())


def test_cancel_refunds_gift_card_at_once(retail):
    db = retail.fresh_db()
    before = _user_pm(db, "ethan_lopez_6291", "gift_card_7219486").balance
    RetailTools(db).call("cancel_pending_order", {"order_id": PEND_GC, "reason": "no longer needed"})
    order = db.orders[PEND_GC]
    assert (order.status, order.cancel_reason) == ("cancelled", "no longer needed")
    assert order.payment_history[-1].model_dump() == {"transaction_type": "refund", "amount": 4079.45,
                                                      "payment_method_id": "gift_card_7219486"}
    assert _user_pm(db, "ethan_lopez_6291", "gift_card_7219486").balance == round(before + 4079.45, 2)


def test_modify_items_takes_price_and_options_of_last_new_item(retail):
    """tau2 quirk kept on purpose: every modified line gets the last new variant's price/options."""
    db = retail.fresh_db()
    RetailTools(db).call("modify_pending_order_items", {
        "order_id": PEND, "item_ids": ["1586641416", "6117189161"], "new_item_ids": ["6700049080", "7523669277"],
        "payment_method_id": "credit_card_5051208"})
    lines = {line.item_id: line for line in db.orders[PEND].items}
    last = db.products["3377618313"].variants["7523669277"]
    assert lines["6700049080"].price == last.price == lines["7523669277"].price
    assert lines["6700049080"].options == last.options
    assert db.orders[PEND].status == "pending (item modified)"
    payment = db.orders[PEND].payment_history[-1]
    assert payment.transaction_type == "payment"
    assert payment.amount == pytest.approx((466.75 - 497.39) + (523.66 - 481.5))


def test_second_write_on_the_same_order_is_refused(retail):
    db = retail.fresh_db()
    tools = RetailTools(db)
    first = tools.call("return_delivered_order_items", {"order_id": DELIV, "item_ids": ["6956751343"],
                                                        "payment_method_id": "credit_card_4420174"})
    snapshot = db.model_copy(deep=True)
    second = tools.call("exchange_delivered_order_items", {"order_id": DELIV, "item_ids": ["4983901480"],
                                                           "new_item_ids": ["7747408585"],
                                                           "payment_method_id": "credit_card_4420174"})
    assert not first.error and json.loads(first.content)["status"] == "return requested"
    assert (second.content, second.error) == ("Error: Non-delivered order cannot be exchanged", True)
    assert db == snapshot


@pytest.mark.parametrize(("value", "expected"), [
    ("plain text", "plain text"),
    (3.5, '"3.5"'),
    ({"a": [1, True, None]}, '{"a": ["1", "True", null]}'),
    (["x", 2], '["x", "2"]'),
])
def test_render_content_follows_tau2(value, expected):
    assert render_content(value) == expected
