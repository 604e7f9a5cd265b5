"""`trace_common.model_refs`: every local form of model reference -> its directory, with errors
naming the field (s3:// against a real S3 server: tests/integration/test_model_refs_s3.py)."""

from __future__ import annotations

import pytest

from trace_common.errors import InvalidArgument, NotFound
from trace_common.model_refs import check_model_ref, local_dir, materialize


def _model_dir(root):
    d = root / "adapters" / "cap" / "v1"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text("{}")
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize("form", ["uri", "abs", "uri+file", "abs+file"])
def test_local_forms_resolve_to_the_directory(tmp_path, form):
    d = _model_dir(tmp_path)
    ref = {"uri": d.as_uri(), "abs": str(d), "uri+file": d.as_uri() + "/adapter_model.safetensors",
           "abs+file": str(d) + "/adapter_config.json"}[form]
    assert materialize(ref) == d and local_dir(ref) == d
    check_model_ref(ref)


@pytest.mark.parametrize("ref, error, text", [
    ("", InvalidArgument, "policy.model"),
    ("file:///nowhere/at/all", NotFound, "is not a directory"),
    ("relative/dir/that/is/not/there", NotFound, "neither a model directory"),
    ("nano", NotFound, "micro"),   # not a built-in agent: the message lists them
])
def test_bad_references_name_the_field(ref, error, text):
    with pytest.raises(error, match=text) as err:
        materialize(ref, field="policy.model")
    assert "policy.model" in str(err.value) or ref == ""


@pytest.mark.parametrize("ref, error", [("file:///nowhere", NotFound), ("micro-xl", NotFound),
                                        ("", InvalidArgument)])
def test_check_model_ref_is_cheap_and_refuses(ref, error):
    with pytest.raises(error):
        check_model_ref(ref)
