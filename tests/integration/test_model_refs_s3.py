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
    assert not list(cache.glob("*.partial*"))


def test_concurrent_downloads_of_one_uri_each_publish_a_whole_copy(tmp_path, s3_server, s3_bucket):
    """Two jobs naming the same uncached model: each downloads into its own directory (they shared one
    fixed `.partial` directory, which one removed while the other wrote, so an incomplete model could be
    published and then reused for good)."""
    from concurrent.futures import ThreadPoolExecutor

    store = open_store(f"s3://{s3_bucket}", s3=s3_server.settings)
    weights = {f"m/shard-{i}.bin": bytes([i]) * 100_000 for i in range(8)}
    for key, data in {"m/config.json": b"{}", **weights}.items():
        store.put_bytes(key, data)
    cache, allowed = tmp_path / "cache", ModelRoots(store=f"s3://{s3_bucket}")
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: materialize(f"s3://{s3_bucket}/m", allowed=allowed, cache_dir=cache,
                                                     s3=s3_server.settings), range(4)))
    assert len(set(paths)) == 1
    assert {p.name: p.read_bytes() for p in paths[0].iterdir()} == \
        {k.split("/")[1]: v for k, v in {"m/config.json": b"{}", **weights}.items()}
    assert [p.name for p in cache.iterdir()] == [paths[0].name]        # every download directory removed


def test_a_prefix_that_is_no_model_directory_downloads_nothing(tmp_path, s3_server, s3_bucket):
    """A reference at a store's root (allowed: it lies in the store) would copy the whole store."""
    from trace_common.errors import NotFound

    store = open_store(f"s3://{s3_bucket}/store", s3=s3_server.settings)
    store.put_bytes("runs/r/adapters/a/v1/adapter_config.json", b"{}")
    store.put_bytes("runs/r/rollouts/j/trajectories.jsonl", b"{}\n")
    cache = tmp_path / "cache"
    for ref in (f"s3://{s3_bucket}/store", f"s3://{s3_bucket}/store/runs"):
        with pytest.raises(NotFound, match="no config.json or adapter_config.json at its top"):
            materialize(ref, allowed=ModelRoots(store=f"s3://{s3_bucket}/store"), cache_dir=cache,
                        s3=s3_server.settings)
    assert not cache.exists() or list(cache.iterdir()) == []


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
    assert list(cache.glob("*")) == []                  # not even its download directory


@pytest.mark.parametrize("ref", ["s3://{other}/m", "s3://{bucket}/store/../m", "s3://{bucket}/storex/m"])
def test_s3_outside_the_store_prefix_is_refused_before_any_request(tmp_path, s3_server, s3_bucket, ref):
    from trace_common.errors import PermissionDenied

    store = open_store(f"s3://{s3_bucket}", s3=s3_server.settings)
    store.put_bytes("m/config.json", b"{}")       # exists, but outside the store's prefix
    with pytest.raises(PermissionDenied, match=f"s3://{s3_bucket}/store"):
        materialize(ref.format(bucket=s3_bucket, other=s3_bucket + "-other"),
                    allowed=ModelRoots(store=f"s3://{s3_bucket}/store"), cache_dir=tmp_path, s3=s3_server.settings)
    assert list(tmp_path.iterdir()) == []       # nothing downloaded
