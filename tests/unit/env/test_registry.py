"""Registry of environments by name and version."""

from __future__ import annotations

import pytest

from tests.unit.env.toy_env import ToyEnv
from trace_common.env import Registry, get_spec, list_environments, make
from trace_common.errors import AlreadyExists, InvalidArgument, NotFound


def _registry() -> Registry:
    reg = Registry()
    reg.register("toy", "1.0.0", ToyEnv, description="v1")
    reg.register("toy", "1.10.0", lambda limit=100: ToyEnv(limit), description="v1.10")
    reg.register("toy", "1.9.0", ToyEnv, description="v1.9")
    return reg


@pytest.mark.parametrize("version, description", [(None, "v1.10"), ("", "v1.10"), ("1.9.0", "v1.9"),
                                                  ("1.0.0", "v1")])
def test_version_selection(version, description):
    assert _registry().get("toy", version).description == description


def test_make_passes_params_and_lists_sorted():
    reg = _registry()
    env = reg.make("toy", "1.0.0", limit=3)
    assert isinstance(env, ToyEnv) and env.limit == 3
    assert [(s.name, s.version) for s in reg.list()] == [("toy", "1.0.0"), ("toy", "1.9.0"), ("toy", "1.10.0")]


@pytest.mark.parametrize("call, error, text", [
    (lambda r: r.get("nope"), NotFound, "'nope' is not registered (registered: toy)"),
    (lambda r: r.get("toy", "2.0.0"), NotFound, "available: 1.0.0, 1.9.0, 1.10.0"),
    (lambda r: r.make("toy", "1.0.0", limt=3), InvalidArgument, "only these parameters: limit"),
    (lambda r: r.register("Bad Name", "1.0.0", ToyEnv), InvalidArgument, "name"),
    (lambda r: r.register("toy", "v1", ToyEnv), InvalidArgument, "dotted integers"),
    (lambda r: r.register("toy", "1.0.0", lambda: ToyEnv()), AlreadyExists, "already registered"),
    (lambda r: r.register("x", "1.0.0", "not callable"), InvalidArgument, "callable"),
])
def test_errors(call, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        call(_registry())


def test_factory_must_return_an_environment():
    reg = Registry()
    reg.register("broken", "1.0.0", lambda: object())
    with pytest.raises(InvalidArgument, match="an Environment instance"):
        reg.make("broken")


def test_replace_allows_reregistering():
    reg = _registry()
    reg.register("toy", "1.0.0", lambda: ToyEnv(7), description="new", replace=True)
    assert reg.get("toy", "1.0.0").description == "new"


def test_default_registry_loads_builtin_store_lazily():
    assert ("store", "2.0.0") in [(s.name, s.version) for s in list_environments()]
    assert get_spec("store").params["task_types"].startswith("comma-separated")
    assert make("store").name == "store"
