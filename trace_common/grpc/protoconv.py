"""Generic proto -> plain data conversion used by servicers before pydantic validation."""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from pydantic import BaseModel, ValidationError

from trace_common.errors import InvalidArgument


def to_dict(msg: Message) -> dict[str, Any]:
    """Proto message -> dict with proto field names, enum names and defaults omitted."""
    return MessageToDict(msg, preserving_proto_field_name=True, use_integers_for_enums=False)


def parse(model: type[BaseModel], msg: Message, field: str):
    """Validate a proto message into a pydantic model; errors name the field path under `field`."""
    try:
        return model.model_validate(to_dict(msg))
    except ValidationError as err:
        parts = []
        for e in err.errors()[:5]:
            loc = ".".join([field, *(str(p) for p in e["loc"])])
            msg_text = e["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {msg_text}")
        raise InvalidArgument("; ".join(parts)) from None
