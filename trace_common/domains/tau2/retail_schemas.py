"""OpenAI function schemas of tau2-bench's 16 retail tools, byte-identical to what tau2 sends.

tau2 derives each schema from the tool function: the description is the docstring's first
line, a blank line, then the rest of its summary (hence the odd "\\n\\n" inside some
sentences), and `parameters` is a pydantic model's JSON schema (`title` per property, the
model titled "parameters", every argument required). The texts below are those facts,
written out as data so the agent sees exactly tau2's prompt; `build_schema` produces the
pydantic-shaped JSON around them. Tool order is tau2's registration order.
"""

from __future__ import annotations

from typing import Any, Literal

from trace_common.domains.tau2.toolkit import ToolKind, ToolSpec

ParamType = Literal["string", "array"]

_ORDER_ID = ("The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning "
             "of the order id.")
_USER_ID = "The user id, such as 'sara_doe_496'."
_PAY_ONE_LINE = ("The payment method id to pay or receive refund for the item price difference, such as "
                 "'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or "
                 "order details.")
_ADDRESS = [
    ("address1", "string", "The first line of the address, such as '123 Main St'."),
    ("address2", "string", "The second line of the address, such as 'Apt 1' or ''."),
    ("city", "string", "The city, such as 'San Francisco'."),
    ("state", "string", "The state, such as 'CA'."),
    ("country", "string", "The country, such as 'USA'."),
    ("zip", "string", "The zip code, such as '12345'."),
]
_CONFIRM = ("The agent needs to explain the modification detail and ask for explicit user confirmation "
            "(yes/no) to proceed.")

#: name -> (kind, description, [(param, type, description)])
_TOOLS: dict[str, tuple[ToolKind, str, list[tuple[str, ParamType, str]]]] = {
    "calculate": (
        ToolKind.GENERIC,
        "Calculate the result of a mathematical expression.",
        [("expression", "string",
          "The mathematical expression to calculate, such as '2 + 2'. The expression can contain numbers, "
          "operators (+, -, *, /), parentheses, and spaces.")],
    ),
    "cancel_pending_order": (
        ToolKind.WRITE,
        "Cancel a pending order. If the order is already processed or delivered,\n\n"
        "it cannot be cancelled. The agent needs to explain the cancellation detail\n"
        "and ask for explicit user confirmation (yes/no) to proceed. If the user confirms,\n"
        "the order status will be changed to 'cancelled' and the payment will be refunded.\n"
        "The refund will be added to the user's gift card balance immediately if the payment\n"
        "was made using a gift card, otherwise the refund would take 5-7 business days to process.\n"
        "The function returns the order details after the cancellation.",
        [("order_id", "string", _ORDER_ID),
         ("reason", "string",
          "The reason for cancellation, which should be either 'no longer needed' or 'ordered by mistake'.")],
    ),
    "exchange_delivered_order_items": (
        ToolKind.WRITE,
        "Exchange items in a delivered order to new items of the same product type.\n\n"
        "For a delivered order, return or exchange can be only done once by the agent.\n"
        "The agent needs to explain the exchange detail and ask for explicit user confirmation (yes/no) "
        "to proceed.",
        [("order_id", "string", _ORDER_ID),
         ("item_ids", "array",
          "The item ids to be exchanged, each such as '1008292230'. There could be duplicate items in the list."),
         ("new_item_ids", "array",
          "The item ids to be exchanged for, each such as '1008292230'.\n"
          "There could be duplicate items in the list. Each new item id should match the item id\n"
          "in the same position and be of the same product."),
         ("payment_method_id", "string",
          "The payment method id to pay or receive refund for the item price difference,\n"
          "such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up\n"
          "from the user or order details.")],
    ),
    "find_user_id_by_name_zip": (
        ToolKind.READ,
        "Find user id by first name, last name, and zip code. If the user is not found, the function\n\n"
        "will return an error message. By default, find user id by email, and only call this function\n"
        "if the user is not found by email or cannot remember email.",
        [("first_name", "string", "The first name of the customer, such as 'John'."),
         ("last_name", "string", "The last name of the customer, such as 'Doe'."),
         ("zip", "string", "The zip code of the customer, such as '12345'.")],
    ),
    "find_user_id_by_email": (
        ToolKind.READ,
        "Find user id by email. If the user is not found, the function will return an error message.",
        [("email", "string", "The email of the user, such as 'something@example.com'.")],
    ),
    "get_order_details": (
        ToolKind.READ,
        "Get the status and details of an order.",
        [("order_id", "string", _ORDER_ID)],
    ),
    "get_product_details": (
        ToolKind.READ,
        "Get the inventory details of a product.",
        [("product_id", "string",
          "The product id, such as '6086499569'. Be careful the product id is different from the item id.")],
    ),
    "get_item_details": (
        ToolKind.READ,
        "Get the inventory details of an item.",
        [("item_id", "string",
          "The item id, such as '6086499569'. Be careful the item id is different from the product id.")],
    ),
    "get_user_details": (
        ToolKind.READ,
        "Get the details of a user, including their orders.",
        [("user_id", "string", _USER_ID)],
    ),
    "list_all_product_types": (
        ToolKind.READ,
        "List the name and product id of all product types.\n\n"
        "Each product type has a variety of different items with unique item ids and options.\n"
        "There are only 50 product types in the store.",
        [],
    ),
    "modify_pending_order_address": (
        ToolKind.WRITE,
        "Modify the shipping address of a pending order. " + _CONFIRM,
        [("order_id", "string", _ORDER_ID), *_ADDRESS],
    ),
    "modify_pending_order_items": (
        ToolKind.WRITE,
        "Modify items in a pending order to new items of the same product type. For a pending order, "
        "this function can only be called once. The agent needs to explain the exchange detail and ask "
        "for explicit user confirmation (yes/no) to proceed.",
        [("order_id", "string", _ORDER_ID),
         ("item_ids", "array",
          "The item ids to be modified, each such as '1008292230'. There could be duplicate items in the list."),
         ("new_item_ids", "array",
          "The item ids to be modified for, each such as '1008292230'. There could be duplicate items in "
          "the list. Each new item id should match the item id in the same position and be of the same "
          "product."),
         ("payment_method_id", "string", _PAY_ONE_LINE)],
    ),
    "modify_pending_order_payment": (
        ToolKind.WRITE,
        "Modify the payment method of a pending order. " + _CONFIRM,
        [("order_id", "string", _ORDER_ID), ("payment_method_id", "string", _PAY_ONE_LINE)],
    ),
    "modify_user_address": (
        ToolKind.WRITE,
        "Modify the default address of a user. " + _CONFIRM,
        [("user_id", "string", _USER_ID), *_ADDRESS],
    ),
    "return_delivered_order_items": (
        ToolKind.WRITE,
        "Return some items of a delivered order.\n\n"
        "The order status will be changed to 'return requested'.\n"
        "The agent needs to explain the return detail and ask for explicit user confirmation (yes/no) "
        "to proceed.\n"
        "The user will receive follow-up email for how and where to return the item.",
        [("order_id", "string", _ORDER_ID),
         ("item_ids", "array",
          "The item ids to be returned, each such as '1008292230'. There could be duplicate items in the list."),
         ("payment_method_id", "string",
          "The payment method id to pay or receive refund for the item price difference, such as "
          "'gift_card_0000000' or 'credit_card_0000000'.\nThese can be looked up from the user or order "
          "details.")],
    ),
    "transfer_to_human_agents": (
        ToolKind.GENERIC,
        "Transfer the user to a human agent, with a summary of the user's issue.\n\n"
        "Only transfer if\n"
        " -  the user explicitly asks for a human agent\n"
        " -  given the policy and the available tools, you cannot solve the user's issue.",
        [("summary", "string", "A summary of the user's issue.")],
    ),
}


def build_schema(name: str, description: str, params: list[tuple[str, ParamType, str]]) -> dict[str, Any]:
    """The OpenAI `{"type": "function", "function": {...}}` dict in pydantic's JSON-schema shape."""
    properties: dict[str, Any] = {}
    for pname, ptype, pdesc in params:
        prop: dict[str, Any] = {"description": pdesc}
        if ptype == "array":
            prop["items"] = {"type": "string"}
        prop["title"] = pname.replace("_", " ").title()
        prop["type"] = ptype
        properties[pname] = prop
    parameters: dict[str, Any] = {"properties": properties}
    if params:
        parameters["required"] = [p[0] for p in params]
    parameters["title"] = "parameters"
    parameters["type"] = "object"
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


RETAIL_TOOL_SPECS: dict[str, ToolSpec] = {
    name: ToolSpec(name=name, kind=kind, schema=build_schema(name, desc, params))
    for name, (kind, desc, params) in _TOOLS.items()
}
