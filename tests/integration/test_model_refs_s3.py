"""`trace_common.model_refs.materialize` of s3:// references against a real S3 server (rclone):
downloaded once per URI, every object verified, published whole (a corrupted object leaves nothing
a later call would use)."""

from __future__ import annotations

import io

import pytest

from trace_common.artifacts import open_store
from trace_common.errors import ArtifactCorrupted
from trace_common.model_refs import ModelRoots, materialize

pytestmark = pytest.mark.integration


def test_s3_is_downloaded_once_verified_and_published_whole(tmp_path, s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}", s3=s3_server.settings)
    store.put_bytes("m/config.json", b"{}")
    store.put_bytes("m/model.safetensors", b"weights")
    uri = f"s3://{s3_bucket}/m"
    cache = tmp_path / "cache"
    allowed = ModelRoots(store=f"s3://{s3_bucket}")  # the service's own s3:// store
    path = materialize(uri, allowed=allowed, cache_dir=cache, s3=s3_server.settings)
    assert (path / "model.safetensors").read_bytes() == b"weights"
    store.put_bytes("m/model.safetensors", b"changed")   # a published copy is reused, not re-downloaded
    assert materialize(uri + "/config.json", allowed=allowed, cache_dir=cache, s3=s3_server.settings) == path
    assert (path / "model.safetensors").read_bytes() == b"weights"
    assert not list(cache.glob("*.partial"))


def test_a_corrupted_object_leaves_nothing_published(tmp_path, s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}", s3=s3_server.settings)
    store.put_bytes("bad/config.json", b"{}")
    digest = store.stat("bad/config.json").sha256
    data = b"{ }"  # other bytes behind the store's back, the recorded digest kept
    s3_server.client().put_object(s3_bucket, "bad/config.json", io.BytesIO(data), len(data), metadata={"sha256": digest})
    cache = tmp_path / "cache"
    with pytest.raises(ArtifactCorrupted):
        materialize(f"s3://{s3_bucket}/bad", allowed=ModelRoots(store=f"s3://{s3_bucket}"), cache_dir=cache,
                    s3=s3_server.settings)
    assert [p for p in cache.glob("*") if not p.name.endswith(".partial")] == []


@pytest.mark.parametrize("ref", ["s3://{other}/m", "s3://{bucket}/store/../m", "s3://{bucket}/storex/m"])
def test_s3_outside_the_store_prefix_is_refused_before_any_request(tmp_path, s3_server, s3_bucket, ref):
    from trace_common.errors import PermissionDenied

    store = open_store(f"s3://{s3_bucket}", s3=s3_server.settings)
    store.put_bytes("m/config.json", b"{}")       # exists, but outside the store's prefix
    with pytest.raises(PermissionDenied, match=f"s3://{s3_bucket}/store"):
        materialize(ref.format(bucket=s3_bucket, other=s3_bucket + "-other"),
                    allowed=ModelRoots(store=f"s3://{s3_bucket}/store"), cache_dir=tmp_path, s3=s3_server.settings)
    assert list(tmp_path.iterdir()) == []       # nothing downloaded
