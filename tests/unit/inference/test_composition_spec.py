"""CompositionSpec.routing: the proto enum <-> the routing modes the inference domain serves.

The servicer validates the proto spec into `CompositionSpecModel` (services/inference/specs.py),
whose `routing` is the mode `load_composition` takes; `CompositionInfo` answers with the mode
actually served. The mapping lives in trace_common.specs (tracectl builds specs from it too).
"""

from __future__ import annotations

from typing import get_args

import pytest

from services.inference.servicer import _info
from services.inference.specs import CompositionSpecModel
from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages
from trace_common.grpc.protoconv import parse
from trace_common.moe.composition_io import Routing
from trace_common.specs import COMPOSITION_ROUTING, COMPOSITION_ROUTING_DEFAULT, composition_routing_mode

INF = messages("inference")
ENUM = INF.CompositionRouting


def _proto(routing: int) -> object:
    return INF.CompositionSpec(name="c", base_model="/models/base", routing=routing)


@pytest.mark.parametrize("routing, mode", [
    (ENUM.Value("COMPOSITION_ROUTING_UNSPECIFIED"), "token"),
    (ENUM.Value("COMPOSITION_ROUTING_TOKEN"), "token"),
    (ENUM.Value("COMPOSITION_ROUTING_PER_REQUEST"), "per_request"),
    (ENUM.Value("COMPOSITION_ROUTING_MERGED"), "merged"),
    (ENUM.Value("COMPOSITION_ROUTING_SOFT_TRAJECTORY"), "soft_trajectory"),
])
def test_proto_routing_becomes_the_served_mode(routing, mode):
    assert parse(CompositionSpecModel, _proto(routing), "spec").routing == mode


@pytest.mark.parametrize("value, needle", [
    (99, "routing 99 is not a CompositionRouting"),  # a value from a newer client
    ("COMPOSITION_ROUTING_SOMETHING", "use one of COMPOSITION_ROUTING_UNSPECIFIED"),
    ("soft", "Input should be 'token', 'per_request', 'merged' or 'soft_trajectory'"),
])
def test_unknown_routing_is_refused_naming_the_field(value, needle):
    if isinstance(value, int):
        with pytest.raises(InvalidArgument) as err:
            parse(CompositionSpecModel, _proto(value), "spec")
        assert "spec.routing" in str(err.value) and needle in str(err.value)
    else:
        with pytest.raises(ValueError, match="routing") as err:
            CompositionSpecModel(name="c", base_model="/models/base", routing=value)
        assert needle in str(err.value)


def test_mapping_names_every_enum_value_and_every_mode():
    """A value added to the proto (or a mode added to `Routing`) without its mapping fails here."""
    assert set(ENUM.keys()) == {COMPOSITION_ROUTING_DEFAULT, *COMPOSITION_ROUTING.values()}
    assert set(COMPOSITION_ROUTING) == set(get_args(Routing))
    assert ENUM.Value(COMPOSITION_ROUTING_DEFAULT) == 0
    for mode, name in COMPOSITION_ROUTING.items():
        assert composition_routing_mode(name) == mode


@pytest.mark.parametrize("mode", get_args(Routing))
def test_composition_info_names_the_served_routing(mode):
    info = {"name": "c", "base_model": "/models/base", "adapters": [{"name": "refunds", "uri": "/a/refunds"}],
            "gates_uri": "", "num_layers": 2, "hidden_size": 64, "gate_parameters": 0, "routing": mode}
    spec = _info(info).spec
    assert ENUM.Name(spec.routing) == COMPOSITION_ROUTING[mode]
    assert parse(CompositionSpecModel, spec, "spec").routing == mode  # the answer loads back as it serves
