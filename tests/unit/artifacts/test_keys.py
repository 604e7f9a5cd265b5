"""Key validation, root-URI parsing and object-URI splitting (no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_common.artifacts import open_store, split_uri, validate_key
from trace_common.artifacts.keys import MAX_KEY_BYTES, MAX_SEGMENT_BYTES, RootSpec, parse_root_uri
from trace_common.errors import InvalidArgument

VALID_KEYS = [
    "a",
    "runs/r1/manifest.json",
    "runs/r1/adapters/cap/v3/adapter_model.safetensors",
    "with space/and-dash_under.score",
    "unicode/ünïcödé/名前.txt",
    ".hidden/.dotfile",
    "x" * MAX_SEGMENT_BYTES,
    "checksums.sha256.txt",
    "runs/x.sha256.d/b",
    "runs/sha256/b",
    "a/" * 300 + "b",  # deep but within MAX_KEY_BYTES
]


@pytest.mark.parametrize("key", VALID_KEYS)
def test_valid_keys_pass_unchanged(key):
    assert validate_key(key) == key


INVALID_KEYS = [
    # (key, fragment of the message that names the problem)
    ("", "empty"),
    ("/abs/path", "absolute"),
    ("a//b", "empty segment"),
    ("a/b/", "empty segment"),
    ("a/../b", "'..'"),
    ("..", "'..'"),
    ("./a", "'.'"),
    ("a\\b", "backslash"),
    ("a\x00b", "control"),
    ("a\nb", "control"),
    ("x" * (MAX_SEGMENT_BYTES + 1), "segment longer"),
    ("a/" * 600 + "b", f"longer than {MAX_KEY_BYTES}"),
    ("a/.trace-lock", "reserved"),
    (".trace-tmp-123", "reserved"),
    ("model.sha256", "sidecar"),
    # a `.sha256` segment anywhere: the file backend's sidecar of `runs/x` is the file `runs/x.sha256`
    ("runs/x.sha256/b", "segments ending in '.sha256'"),
    ("a.sha256/b", "segments ending in '.sha256'"),
    # lone surrogates (undecodable bytes of a file name or argv): no file URI or S3 request carries them
    ("runs/\udcff", "not valid UTF-8"),
    ("runs/\udcff/report/report.md", "not valid UTF-8"),
    ("\ud800", "not valid UTF-8"),
    (b"bytes-key", "str"),
    (None, "str"),
]


@pytest.mark.parametrize(("key", "fragment"), INVALID_KEYS)
def test_invalid_keys_raise_invalid_argument_with_fix(key, fragment):
    with pytest.raises(InvalidArgument) as exc:
        validate_key(key)
    msg = str(exc.value)
    assert exc.value.field == "key"
    assert fragment in msg
    assert "expected" in msg  # field/expected/fix shape


ROOTS = [
    ("file:///data/trace", RootSpec("file", "/data/trace")),
    ("file:///data/trace/", RootSpec("file", "/data/trace")),
    ("file://localhost/data/trace", RootSpec("file", "/data/trace")),
    ("file:///data/with%20space", RootSpec("file", "/data/with space")),
    ("file:///", RootSpec("file", "/")),
    ("s3://bucket", RootSpec("s3", "bucket")),
    ("s3://bucket/", RootSpec("s3", "bucket")),
    ("s3://my-bucket.v2/pre/fix", RootSpec("s3", "my-bucket.v2", "pre/fix")),
]


@pytest.mark.parametrize(("uri", "spec"), ROOTS)
def test_root_uris_parse(uri, spec):
    assert parse_root_uri(uri) == spec


BAD_ROOTS = [
    ("relative/path", "file://"),  # fix text mentions the scheme
    ("/abs/path", "prefix an absolute path with 'file://'"),
    ("file://relative/dir", "three slashes"),
    ("file:///a/../b", "'..'"),
    ("http://host/x", "not supported"),
    ("s3://Bad_Bucket", "bucket"),
    ("s3://ab", "bucket"),
    ("s3://192.168.1.1", "bucket"),
    ("s3://bucket/a/../b", "'..'"),
    ("", "root URI"),
    (42, "root URI"),
]


@pytest.mark.parametrize(("uri", "fragment"), BAD_ROOTS)
def test_bad_root_uris_raise_invalid_argument(uri, fragment):
    with pytest.raises(InvalidArgument) as exc:
        parse_root_uri(uri)
    assert fragment in str(exc.value)


SPLITS = [
    ("s3://bucket/a/b/c.json", ("s3://bucket", "a/b/c.json")),
    ("s3://bucket/c.json", ("s3://bucket", "c.json")),
    ("file:///data/trace/runs/r1/m.json", ("file:///data/trace/runs/r1", "m.json")),
    ("file:///m.json", ("file:///", "m.json")),
    ("file:///d/with%20space.txt", ("file:///d", "with space.txt")),
]


@pytest.mark.parametrize(("uri", "expected"), SPLITS)
def test_split_uri(uri, expected):
    assert split_uri(uri) == expected


BAD_SPLITS = [
    ("s3://bucket", "no object"),
    ("s3://bucket/", "no object"),
    ("s3://bucket/a/../b", "'..'"),
    ("file:///data/", "names no file"),
    ("file:///data/x.sha256", "sidecar"),
    ("ftp://x/y", "scheme"),
    (None, "full object URI"),
]


@pytest.mark.parametrize(("uri", "fragment"), BAD_SPLITS)
def test_bad_object_uris_raise(uri, fragment):
    with pytest.raises(InvalidArgument) as exc:
        split_uri(uri)
    assert fragment in str(exc.value)


_segment = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\"),
                   min_size=1, max_size=20).filter(
    lambda s: s not in (".", "..") and not s.startswith(".trace-") and len(s.encode()) <= MAX_SEGMENT_BYTES)
_keys = st.lists(_segment, min_size=1, max_size=5).map("/".join).filter(lambda k: not k.endswith(".sha256"))


@given(key=_keys)
def test_uri_for_round_trips_through_split_uri_file(key):
    store = open_store("file:///data/trace root")
    root, k = split_uri(store.uri_for(key))
    assert k == key.rsplit("/", 1)[-1]
    assert open_store(root).uri_for(k) == store.uri_for(key)


@given(key=_keys)
def test_uri_for_round_trips_through_split_uri_s3(key):
    uri = f"s3://bucket/prefix/{key}"
    assert split_uri(uri) == ("s3://bucket", f"prefix/{key}")


@pytest.mark.parametrize("uri", ["s3://bucket/runs/x.sha256/b", "s3://bucket/\udcff", "file:///data/\udcff",
                                 "file:///data/\udcff/x", "s3://bucket/\udcff/x"])
def test_object_uris_with_keys_no_backend_can_hold_are_invalid_argument(uri):
    with pytest.raises(InvalidArgument):
        split_uri(uri)


@pytest.mark.parametrize("uri", ["file:///data/\udcff", "s3://bucket/\udcff"])
def test_root_uris_that_are_not_utf8_are_invalid_argument(uri):
    with pytest.raises(InvalidArgument):
        open_store(uri)
