"""Artifact store: sha256-verified, atomically written objects addressed by URI.

    store = open_store("file:///var/lib/trace")                      # embedded default
    store = open_store("s3://trace/prod", s3=S3Settings(endpoint="minio:9000", ...))
    info = store.put_file("runs/r1/adapters/cap/v1/adapter_model.safetensors", path)
    store2, key = open_uri(info.uri, s3=settings)                    # from a URI in a proto
    data = store2.get_bytes(key)                                     # verified or raises

Guarantees (docs/design.md "Data contracts"): no partially written object is ever visible under its
final key; every object carries the sha256 recorded when it was written; every read verifies
it and raises `trace_common.errors.ArtifactCorrupted` rather than return damaged bytes. Bad
keys and URIs raise `InvalidArgument`, missing objects `NotFound`, an unreachable S3 server
`Unavailable`. The API is synchronous and thread-safe (services use `asyncio.to_thread`).
"""

from __future__ import annotations

from trace_common.errors import InvalidArgument

from .base import ArtifactInfo, ArtifactStore, Observer
from .file_store import FileStore
from .keys import parse_root_uri, split_uri, validate_key
from .s3_store import S3Store
from .settings import S3Settings

__all__ = ["ArtifactInfo", "ArtifactStore", "FileStore", "Observer", "S3Settings", "S3Store", "open_store",
           "open_uri", "split_uri", "validate_key"]


def open_store(root_uri: str, s3: S3Settings | None = None, observer: Observer | None = None) -> ArtifactStore:
    """The store rooted at `root_uri` (`file:///abs/dir` or `s3://bucket[/prefix]`).

    Opening does no I/O: a missing directory is created by the first write, a missing bucket
    is reported (FailedPrecondition) by the first request."""
    spec = parse_root_uri(root_uri)
    if spec.scheme == "file":
        return FileStore(spec, observer)
    if not isinstance(s3, S3Settings):
        raise InvalidArgument(field="s3", expected="S3Settings for an s3:// root", got=s3,
                              fix="pass s3=S3Settings(endpoint='host:port', access_key=..., secret_key=...)")
    return S3Store(spec, s3, observer)


def open_uri(uri: str, s3: S3Settings | None = None, observer: Observer | None = None) -> tuple[ArtifactStore, str]:
    """(store, key) for a full object URI such as `ArtifactInfo.uri`."""
    root, key = split_uri(uri)
    return open_store(root, s3, observer), key
