"""References as text: a control character (a NUL above all, which `os.path.realpath` and `open` fail on
with a bare ValueError) is refused as INVALID_ARGUMENT naming the field, by the request specs and by
`ModelRoots.resolve` itself; every spelling of one gates file (`/./`, `//`, `..`, file:// or a plain path)
shares one cache copy; a gates file's metadata is checked before its tensors are loaded."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import save_file

from services.inference.specs import CompositionSpecModel
from trace_common.artifacts import open_store
from trace_common.errors import InvalidArgument
from trace_common.model_refs import UNCONFINED, ModelRoots, check_model_ref, fetch_file, materialize
from trace_common.moe import composition_io
from trace_common.specs import PolicyRefModel, check_uri

CONTROL = ["\x00", "\n", "\r", "\t", "\x1b", "\x7f", "\x85"]


@pytest.mark.parametrize("uri", ["/x/a{c}b", "file:///x/{c}", "s3://bucket/k{c}", "/x/{c}"])
@pytest.mark.parametrize("char", CONTROL)
def test_check_uri_refuses_control_characters(uri, char):
    with pytest.raises(ValueError, match="gates_uri holds the control character") as err:
        check_uri(uri.format(c=char), "gates_uri")
    assert repr(char) in str(err.value) and "remove it" in str(err.value)


@pytest.mark.parametrize("uri", ["/x/é/模型", "file:///x/a b", "s3://bucket/k~!$&'()*+,;=@"])
def test_check_uri_keeps_printable_text(uri):
    assert check_uri(uri, "gates_uri") == uri


def _spec(**kw) -> dict:
    return {"name": "n", "base_model": "micro", **kw}


@pytest.mark.parametrize("fields, needle", [
    (_spec(base_model="/x/a\x00b"), "base_model"),
    (_spec(base_model="mi\ncro"), "base_model"),
    (_spec(gates_uri="/x/g\x00"), "gates_uri"),
    (_spec(adapters=[{"name": "a", "uri": "/x/\x00/a"}]), "adapter uri"),
])
def test_composition_specs_with_control_characters_name_the_field(fields, needle):
    with pytest.raises(ValidationError) as err:
        CompositionSpecModel.model_validate(fields)
    assert f"{needle} holds the control character" in str(err.value)


def test_policy_model_with_a_control_character_is_refused():
    with pytest.raises(ValidationError, match="policy.model holds the control character"):
        PolicyRefModel(backend="POLICY_BACKEND_IN_PROCESS", model="/models/a\x00b")
    assert PolicyRefModel(backend="POLICY_BACKEND_IN_PROCESS", model="micro").model == "micro"


@pytest.fixture
def roots(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    return store, ModelRoots(store=store.as_uri(), roots=(tmp_path.as_uri(),), setting="TRACE_TEST_MODEL_ROOTS")


@pytest.mark.parametrize("allowed", ["roots", "unconfined"])
@pytest.mark.parametrize("ref", ["/x/a\x00b", "file:///x/a\x00b", "./a\x00b", "s3://bucket/a\x00b", "{store}/g\x00",
                                 "{store}/a\nb"])
@pytest.mark.parametrize("call", ["resolve", "materialize", "check_model_ref", "fetch_file"])
def test_references_with_control_characters_are_invalid_arguments_naming_the_field(roots, tmp_path, allowed, ref,
                                                                                   call):
    store, rule = roots
    rule = rule if allowed == "roots" else UNCONFINED
    ref = ref.format(store=store)
    with pytest.raises(InvalidArgument) as err:
        if call == "resolve":
            rule.resolve(ref, "spec.base_model")
        elif call == "materialize":
            materialize(ref, allowed=rule, field="spec.base_model")
        elif call == "check_model_ref":
            check_model_ref(ref, "spec.base_model", allowed=rule)
        else:
            fetch_file(ref, tmp_path / "cache", allowed=rule, field="spec.base_model")
    assert str(err.value).startswith("spec.base_model: ") and "control character" in str(err.value)


def test_every_spelling_of_one_gates_file_shares_one_cache_copy(roots, tmp_path):
    store_dir, rule = roots
    info = open_store(store_dir.as_uri()).put_bytes("runs/r/moe/gates.safetensors", b"gates")
    path = str(store_dir / "runs/r/moe/gates.safetensors")
    spellings = [info.uri, path, path.replace("/runs/", "/./runs/"), path.replace("/runs/", "/././runs/"),
                 path.replace("/runs/", "//runs/"), path.replace("/moe/", "/moe/../moe/"),
                 "file://" + path.replace("/r/", "/r/./")]
    cache = tmp_path / "cache"
    for allowed in (rule, UNCONFINED):
        got = {fetch_file(uri, cache, allowed=allowed) for uri in spellings}
        assert len(got) == 1 and next(iter(got)).read_bytes() == b"gates"
    assert len(list((cache / "files").iterdir())) == 1


class LoadSpy:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {"format": "trace-moe-composition/v0"}])
def test_a_safetensors_file_that_is_no_gates_file_is_refused_before_its_tensors_load(tmp_path, monkeypatch,
                                                                                     metadata):
    spy = LoadSpy(composition_io.load_file)
    monkeypatch.setattr(composition_io, "load_file", spy)
    path = tmp_path / "adapter_model.safetensors"
    save_file({"w": torch.zeros(256, 256)}, str(path), metadata=metadata)
    with pytest.raises(InvalidArgument, match="gates_uri: expected gates with metadata format"):
        composition_io.read_gates(path)
    assert spy.calls == 0
    path.write_bytes(b"not safetensors")
    with pytest.raises(InvalidArgument, match="not a readable safetensors file"):
        composition_io.read_gates(path)
    save_file({"0.weight": torch.ones(3, 4)}, str(path), metadata={"format": composition_io.FORMAT})
    tensors, meta = composition_io.read_gates(path)
    assert spy.calls == 1 and torch.equal(tensors["0.weight"], torch.ones(3, 4))
    assert meta["format"] == composition_io.FORMAT
