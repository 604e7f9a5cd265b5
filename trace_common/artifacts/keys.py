"""Artifact keys and store URIs: validation, parsing, formatting.

A *key* names an object inside a store (`runs/r1/rollouts/part-000.jsonl`). Both backends
accept exactly the same keys, so code written against the embedded file store behaves the
same against S3. The rules exist because keys become file paths in the file backend:

- relative, `/`-separated, no empty segment (`a//b`, leading or trailing `/`), no `.` or `..`;
- valid UTF-8: no lone surrogates (what Python makes of undecodable bytes in a file name or a
  command-line argument; neither a file URI nor an S3 request can carry them);
- no backslash, NUL or other control character;
- at most `MAX_KEY_BYTES` UTF-8 bytes (S3's object-name limit) and `MAX_SEGMENT_BYTES` per
  segment (a file name plus the `.sha256` sidecar suffix must fit the usual 255-byte limit);
- names reserved by the file layout: a segment may not start with `.trace-` (temp files and
  the directory lock) and no segment may end in `.sha256`: the file backend keeps the digest of
  `a/x` in the file `a/x.sha256`, so a key `a/x.sha256/b` would make that a directory.

A *root URI* names a store: `file:///abs/dir` or `s3://bucket[/prefix]`. An *object URI* is a
root URI plus a key (`ArtifactStore.uri_for`); `split_uri` turns one back into (root, key).
File URIs percent-encode the path (RFC 8089, like `pathlib.Path.as_uri`); S3 URIs carry the
key raw, as the AWS tools print them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, unquote

from trace_common.errors import InvalidArgument

MAX_KEY_BYTES = 1024
MAX_SEGMENT_BYTES = 240
RESERVED_SEGMENT_PREFIX = ".trace-"
SIDECAR_SUFFIX = ".sha256"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# S3 bucket naming rules (the subset every S3 implementation accepts).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IPV4 = re.compile(r"^\d+\.\d+\.\d+\.\d+$")

_KEY_EXPECTED = ("a relative '/'-separated key of non-empty segments (e.g. 'runs/r1/manifest.json'), "
                 "no '.'/'..' segments, backslashes or control characters")


def _bad_key(field: str, key: object, reason: str, fix: str) -> InvalidArgument:
    return InvalidArgument(reason, field=field, expected=_KEY_EXPECTED, got=key, fix=fix)


def validate_key(key: object, *, field: str = "key") -> str:
    """Return `key` unchanged if both backends can store it; raise InvalidArgument otherwise."""
    if not isinstance(key, str):
        raise _bad_key(field, key, f"a key is a str, not {type(key).__name__}", "pass the key as a str")
    if not key:
        raise _bad_key(field, key, "the key is empty", "name the object, e.g. 'runs/<run_id>/manifest.json'")
    if not is_utf8(key):
        raise _bad_key(field, key, "the key is not valid UTF-8 (it holds a lone surrogate, which is what undecodable "
                       "bytes in a file name or a command-line argument become)",
                       "spell the key in UTF-8 text")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise _bad_key(field, key, f"the key is longer than {MAX_KEY_BYTES} UTF-8 bytes",
                       "shorten the key (hash long names)")
    if "\\" in key:
        raise _bad_key(field, key, "backslashes are not allowed", "use '/' to separate segments")
    if _CONTROL.search(key):
        raise _bad_key(field, key, "control characters (NUL, newline, ...) are not allowed",
                       "remove control characters from the key")
    if key.startswith("/"):
        raise _bad_key(field, key, "absolute keys are not allowed", "drop the leading '/'")
    segments = key.split("/")
    for segment in segments:
        if segment == "":
            raise _bad_key(field, key, "empty segment ('//' or a trailing '/')",
                           "remove doubled and trailing slashes")
        if segment in (".", ".."):
            raise _bad_key(field, key, f"'{segment}' segments are not allowed",
                           "spell out the path without '.' or '..'")
        if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise _bad_key(field, key, f"segment longer than {MAX_SEGMENT_BYTES} UTF-8 bytes",
                           "shorten that segment")
        if segment.startswith(RESERVED_SEGMENT_PREFIX):
            raise _bad_key(field, key, f"segments starting with '{RESERVED_SEGMENT_PREFIX}' are reserved "
                           "for the store's temp and lock files", "rename that segment")
        if segment.endswith(SIDECAR_SUFFIX):
            raise _bad_key(field, key, f"segments ending in '{SIDECAR_SUFFIX}' ({segment!r}) are reserved for "
                           "checksum sidecars, at the end of a key and inside it",
                           f"use another suffix, e.g. '{SIDECAR_SUFFIX}.txt'")
    return key


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class RootSpec:
    """A parsed root URI. For `file`, `location` is an absolute directory path; for `s3`, it is
    the bucket and `prefix` is '' or a key-like path without leading/trailing '/'."""

    scheme: Literal["file", "s3"]
    location: str
    prefix: str = ""

    @property
    def uri(self) -> str:
        if self.scheme == "file":
            return file_uri(self.location)
        return f"s3://{self.location}" + (f"/{self.prefix}" if self.prefix else "")


_ROOT_EXPECTED = "'file:///absolute/dir' or 's3://bucket[/prefix]'"


def file_uri(path: str) -> str:
    """`file://` URI of an absolute path, percent-encoded like `pathlib.Path.as_uri`."""
    return "file://" + quote(path, safe="/")


def _parse_file_path(uri: str, field: str) -> str:
    rest = uri[len("file://"):]
    if rest.startswith("localhost/"):
        rest = rest[len("localhost"):]
    if not rest.startswith("/"):
        raise InvalidArgument("a file URI needs an absolute path (three slashes)", field=field,
                              expected=_ROOT_EXPECTED, got=uri,
                              fix=f"write 'file:///{rest}' if '{rest}' is meant from the filesystem root")
    path = unquote(rest)
    if not is_utf8(path):
        raise InvalidArgument("the path is not valid UTF-8 (it holds a lone surrogate)", field=field,
                              expected=_ROOT_EXPECTED, got=uri, fix="spell the path in UTF-8 text")
    if "\\" in path or _CONTROL.search(path):
        raise InvalidArgument("backslashes and control characters are not allowed in paths", field=field,
                              expected=_ROOT_EXPECTED, got=uri, fix="use a plain POSIX path")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise InvalidArgument("'.' and '..' segments are not allowed", field=field,
                              expected=_ROOT_EXPECTED, got=uri, fix="give the resolved absolute path")
    return "/" + "/".join(parts)


def _check_bucket(bucket: str, uri: str, field: str) -> None:
    if not _BUCKET.match(bucket) or ".." in bucket or _IPV4.match(bucket):
        raise InvalidArgument("invalid bucket name", field=field, expected=_ROOT_EXPECTED, got=uri,
                              fix="bucket names are 3-63 characters of lowercase letters, digits, '.' and '-', "
                                  "starting and ending with a letter or digit")


def parse_root_uri(uri: object, *, field: str = "root_uri") -> RootSpec:
    """Parse a store root URI; raise InvalidArgument with a fix when it is malformed."""
    if not isinstance(uri, str) or not uri:
        raise InvalidArgument(field=field, expected=_ROOT_EXPECTED, got=uri, fix="pass the store's root URI as a str")
    if uri.startswith("file://"):
        return RootSpec("file", _parse_file_path(uri, field))
    if uri.startswith("s3://"):
        rest = uri[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        _check_bucket(bucket, uri, field)
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix, field=f"{field} (prefix)")
        return RootSpec("s3", bucket, prefix)
    scheme = uri.split(":", 1)[0] if ":" in uri else ""
    fix = ("prefix an absolute path with 'file://'" if uri.startswith("/")
           else f"scheme '{scheme}' is not supported; use file:// or s3://")
    raise InvalidArgument(field=field, expected=_ROOT_EXPECTED, got=uri, fix=fix)


def split_uri(uri: object, *, field: str = "uri") -> tuple[str, str]:
    """Split a full object URI into (root URI, key) such that
    `open_store(root).uri_for(key) == uri` for URIs that `uri_for` produced.

    `s3://bucket/a/b` -> ('s3://bucket', 'a/b'). For `file://` URIs the root is the object's
    directory and the key its file name: the file layout (sidecar, lock) lives in the object's
    own directory, so every split of a path addresses the same object.
    """
    if not isinstance(uri, str) or not uri:
        raise InvalidArgument(field=field, expected="'file:///dir/name' or 's3://bucket/key'", got=uri,
                              fix="pass a full object URI as a str")
    if uri.startswith("s3://"):
        bucket, sep, key = uri[len("s3://"):].partition("/")
        if not sep or not key:
            raise InvalidArgument("the URI names a bucket but no object", field=field,
                                  expected="'s3://bucket/key'", got=uri, fix="append the object's key")
        _check_bucket(bucket, uri, field)
        return f"s3://{bucket}", validate_key(key, field=field)
    if uri.startswith("file://"):
        path = _parse_file_path(uri, field)
        directory, _, name = path.rpartition("/")
        if not name or uri.endswith("/"):
            raise InvalidArgument("the URI names no file", field=field, expected="'file:///dir/name'",
                                  got=uri, fix="append the file name")
        return file_uri(directory or "/"), validate_key(name, field=field)
    raise InvalidArgument(field=field, expected="'file:///dir/name' or 's3://bucket/key'", got=uri,
                          fix="artifact URIs use the file:// or s3:// scheme")
