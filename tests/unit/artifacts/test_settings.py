"""S3Settings validation and open_store argument checks (no network)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trace_common.artifacts import FileStore, S3Settings, S3Store, open_store, open_uri
from trace_common.errors import InvalidArgument

MiB = 1 << 20
OK = {"endpoint": "minio:9000", "access_key": "k", "secret_key": "s"}


@pytest.mark.parametrize(("override", "fragment"), [
    ({"endpoint": "http://minio:9000"}, "use endpoint='minio:9000'"),
    ({"endpoint": "https://minio:9000/"}, "secure=True"),
    ({"endpoint": "minio:9000/bucket"}, "no path"),
    ({"part_size": 1 * MiB}, "greater than or equal"),
    ({"part_size": 600 * MiB}, "must not exceed multipart_threshold"),
    ({"secret_key": ""}, "secret_key is empty"),
    ({"unknown_field": 1}, "Extra inputs"),
])
def test_bad_settings_say_how_to_fix(override, fragment):
    with pytest.raises(ValidationError) as exc:
        S3Settings(**{**OK, **override})
    assert fragment in str(exc.value)


def test_settings_defaults_and_secret_hidden():
    s = S3Settings(**OK)
    assert (s.region, s.secure, s.multipart_threshold, s.part_size) == ("us-east-1", False, 512 * MiB, 64 * MiB)
    assert "s'" not in repr(s) and s.secret_key.get_secret_value() == "s"


@pytest.mark.parametrize(("uri", "settings", "cls"), [
    ("file:///tmp/x", None, FileStore),
    ("s3://bucket/p", S3Settings(**OK), S3Store),
])
def test_open_store_picks_backend_by_scheme_without_io(uri, settings, cls):
    store = open_store(uri, s3=settings)
    assert isinstance(store, cls)
    assert store.root_uri == uri


def test_s3_root_without_settings_is_invalid_argument():
    with pytest.raises(InvalidArgument) as exc:
        open_store("s3://bucket")
    assert exc.value.field == "s3" and "S3Settings(endpoint=" in str(exc.value)


def test_open_uri_returns_store_and_key():
    store, key = open_uri("s3://bucket/runs/r1/m.json", s3=S3Settings(**OK))
    assert (store.root_uri, key) == ("s3://bucket", "runs/r1/m.json")
    assert store.uri_for(key) == "s3://bucket/runs/r1/m.json"
