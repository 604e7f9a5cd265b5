"""`materialize_dir`: artifact directories by URI -- a directory, or a file inside one (what
training jobs output) -- and clear errors otherwise."""

from __future__ import annotations

import pytest

from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.policy.factory import materialize_dir


@pytest.mark.parametrize("suffix", ["", "/adapter_model.safetensors", "/adapter_config.json"])
def test_directory_or_a_file_in_it(tmp_path, suffix):
    d = tmp_path / "adapters" / "cap" / "v1"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text("{}")
    assert materialize_dir(d.as_uri() + suffix) == d
    assert materialize_dir(str(d) + suffix) == d


@pytest.mark.parametrize("uri, error", [
    ("file:///nowhere/at/all", FailedPrecondition),
    ("relative/dir", InvalidArgument),
])
def test_bad_uris(uri, error):
    with pytest.raises(error):
        materialize_dir(uri)
