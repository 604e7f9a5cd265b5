"""The backend-independent half of the artifact store: the public API, argument checks,
per-operation observation, and the integrity rules every backend shares.

Integrity rules (docs/design.md, "Data contracts"): every object carries the sha256 of its bytes,
recorded when it was written; every read recomputes it and raises `ArtifactCorrupted` on a
mismatch or a missing record instead of returning the bytes. `stat`, `exists` and `list` report
the *recorded* digest and do not read the data. `stat` of an object with no valid record raises
ArtifactCorrupted; `list` returns it flagged (`ArtifactInfo.corruption`, logged as a warning), so
one such object never fails a whole listing.

The API is synchronous and thread-safe; services call it through `asyncio.to_thread`.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import ClassVar, Protocol

from trace_common.errors import ArtifactCorrupted, InvalidArgument, TraceError

from . import localio
from .info import ArtifactInfo
from .integrity import CHUNK
from .keys import RootSpec, is_utf8, validate_key

__all__ = ["ArtifactInfo", "ArtifactStore", "Observer", "as_buffer", "chunks_of", "hold_back_last", "outcome_of"]

log = logging.getLogger(__name__)


class Observer(Protocol):
    """Called once per operation, e.g. to feed Prometheus counters and histograms.

    op: put_bytes | put_file | put_stream | get_bytes | get_file | iter_chunks | stat | exists |
        list | list_dirs | delete. backend: file | s3. outcome: ok | not_found | corrupted | unavailable |
        invalid_argument | failed_precondition | abandoned (iter_chunks closed early) | error.
    nbytes: object bytes moved (0 for metadata operations). seconds: wall time.
    """

    def __call__(self, op: str, backend: str, outcome: str, nbytes: int, seconds: float) -> None: ...


def outcome_of(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, ArtifactCorrupted):
        return "corrupted"
    if isinstance(exc, TraceError):
        return {"NOT_FOUND": "not_found", "UNAVAILABLE": "unavailable", "INVALID_ARGUMENT": "invalid_argument",
                "FAILED_PRECONDITION": "failed_precondition"}.get(exc.code, "error")
    if isinstance(exc, GeneratorExit):
        return "abandoned"
    return "error"


def as_buffer(data: object) -> bytes | memoryview:
    """Accept bytes-like input without copying; reject anything else with a fix."""
    if isinstance(data, bytes):
        return data
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(field="data", expected="bytes, bytearray or memoryview", got=type(data).__name__,
                              fix="encode text first, e.g. text.encode('utf-8')") from None
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class ArtifactStore(abc.ABC):
    """An object store rooted at one URI. Subclasses implement the `_`-prefixed methods;
    keys reaching them are already validated."""

    backend: ClassVar[str]

    def __init__(self, root: RootSpec, observer: Observer | None = None):
        self._root = root
        self._observer = observer

    # ----------------------------------------------------------------- identity

    @property
    def root_uri(self) -> str:
        return self._root.uri

    def uri_for(self, key: str) -> str:
        """Full URI of `key` in this store (what protos carry)."""
        return self._uri_for(validate_key(key))

    def key_of(self, uri: str) -> str:
        """The key of a full object URI inside this store (inverse of `uri_for`)."""
        root = self.root_uri.rstrip("/") + "/"
        if not isinstance(uri, str) or not uri.startswith(root):
            raise InvalidArgument(field="uri", expected=f"an object URI under this store's root {root}", got=uri,
                                  fix="read it through a store opened on its own root (artifacts.open_uri)")
        return validate_key(uri[len(root):])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root_uri!r})"

    # ----------------------------------------------------------------- writes

    def put_bytes(self, key: str, data: bytes | bytearray | memoryview) -> ArtifactInfo:
        """Store `data` under `key` atomically, replacing any previous object."""
        with self._observe("put_bytes") as obs:
            key = validate_key(key)
            buf = as_buffer(data)
            info = self._put_bytes(key, buf)
            obs.nbytes = info.size
            return info

    def put_file(self, key: str, path: str | os.PathLike[str]) -> ArtifactInfo:
        """Store the contents of a local file, streamed (never wholly in memory)."""
        with self._observe("put_file") as obs:
            key = validate_key(key)
            info = self._put_file(key, localio.source_file(path))
            obs.nbytes = info.size
            return info

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> ArtifactInfo:
        """Store the concatenation of `chunks` (bounded memory; length need not be known)."""
        with self._observe("put_stream") as obs:
            key = validate_key(key)
            try:
                it = iter(chunks)
            except TypeError:
                raise InvalidArgument(field="chunks", expected="an iterable of bytes", got=type(chunks).__name__,
                                      fix="pass a list or generator of bytes chunks") from None
            info = self._put_stream(key, chunks_of(it))
            obs.nbytes = info.size
            return info

    # ----------------------------------------------------------------- reads

    def get_bytes(self, key: str) -> bytes:
        """The verified bytes of `key`. NotFound if absent, ArtifactCorrupted on mismatch."""
        with self._observe("get_bytes") as obs:
            data = self._get_bytes(validate_key(key))
            obs.nbytes = len(data)
            return data

    def get_file(self, key: str, dest_path: str | os.PathLike[str], *, durable: bool = False) -> ArtifactInfo:
        """Download `key` to `dest_path`. Bytes land in a temp file next to it and are renamed
        into place only after their sha256 matched, so `dest_path` never holds unverified or
        partial data. `durable=True` also fsyncs the file and its directory."""
        with self._observe("get_file") as obs:
            key = validate_key(key)
            info = self._get_file(key, localio.dest_file(dest_path), durable)
            obs.nbytes = info.size
            return info

    def iter_chunks(self, key: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """Stream the object's bytes. The final chunk is yielded only after the whole object's
        sha256 matched; on a mismatch ArtifactCorrupted is raised in its place."""
        key = validate_key(key)
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise InvalidArgument(field="chunk_size", expected="a positive int", got=chunk_size,
                                  fix=f"use e.g. {CHUNK} (1 MiB)")
        return self._observed_iter(key, chunk_size)

    def _observed_iter(self, key: str, chunk_size: int) -> Iterator[bytes]:
        with self._observe("iter_chunks") as obs:
            for chunk in self._iter_chunks(key, chunk_size):
                obs.nbytes += len(chunk)
                yield chunk

    def stat(self, key: str) -> ArtifactInfo:
        """Recorded size and sha256 of `key` (the data is not read)."""
        with self._observe("stat"):
            return self._stat(validate_key(key))

    def exists(self, key: str) -> bool:
        with self._observe("exists"):
            return self._exists(validate_key(key))

    def list(self, prefix: str = "") -> list[ArtifactInfo]:
        """Every object whose key starts with `prefix` (a plain string prefix, as in S3), sorted by key.

        An object with no valid recorded digest is listed with `sha256=""` and `corruption` set
        (reading it raises ArtifactCorrupted with that message) and logged as a warning. Objects
        whose names are not valid keys (written behind the store's back, or by an older store that
        allowed them, e.g. 'a/x.sha256/b') cannot be read through the store: they are left out,
        with a warning."""
        with self._observe("list"):
            _check_prefix(prefix)
            found = []
            for info in self._list(prefix):
                try:
                    validate_key(info.key)
                except InvalidArgument as exc:
                    log.warning("%s: listing %r leaves out an object the store cannot address (%s)",
                                self.root_uri, prefix, exc)
                    continue
                if info.corruption:
                    log.warning("listing %r: %s", prefix, info.corruption)
                found.append(info)
            return sorted(found, key=lambda info: info.key)

    def list_dirs(self, prefix: str = "") -> list[str]:
        """The "directories" directly under `prefix` ('' or ending in '/'), sorted: the distinct
        segments that follow `prefix` in the keys of the objects below it, as S3 lists common
        prefixes with the delimiter '/' (`list(prefix + name + '/')` lists each one's objects).
        Reads no object and no record. The file backend also names a directory that holds no
        object any more (its objects were deleted), and leaves out directories reached through
        symbolic links, as `list` does."""
        with self._observe("list_dirs"):
            _check_prefix(prefix)
            if prefix and not prefix.endswith("/"):
                raise InvalidArgument(field="prefix", expected="'' or a prefix ending in '/'", got=prefix,
                                      fix=f"use '{prefix}/'")
            names = set()
            for name in self._list_dirs(prefix):
                try:
                    validate_key(prefix + name)
                except InvalidArgument:
                    continue  # the store's own directories (.trace-*), or names no key can have
                names.add(name)
            return sorted(names)

    def delete(self, key: str) -> None:
        """Remove `key`; deleting an absent key is not an error (retries are safe)."""
        with self._observe("delete"):
            self._delete(validate_key(key))

    # ----------------------------------------------------------------- observation

    @contextmanager
    def _observe(self, op: str) -> Iterator[_Obs]:
        obs = _Obs()
        start = time.perf_counter()
        exc: BaseException | None = None
        try:
            yield obs
        except BaseException as e:
            exc = e
            raise
        finally:
            if self._observer is not None:
                try:
                    self._observer(op, self.backend, outcome_of(exc), obs.nbytes, time.perf_counter() - start)
                except Exception:  # a broken metrics hook must not fail the transfer
                    log.exception("artifact store observer failed (op=%s)", op)

    # ----------------------------------------------------------------- backend hooks

    @abc.abstractmethod
    def _uri_for(self, key: str) -> str: ...

    @abc.abstractmethod
    def _put_bytes(self, key: str, data: bytes | memoryview) -> ArtifactInfo: ...

    @abc.abstractmethod
    def _put_file(self, key: str, path: str) -> ArtifactInfo: ...

    @abc.abstractmethod
    def _put_stream(self, key: str, chunks: Iterator[bytes]) -> ArtifactInfo: ...

    @abc.abstractmethod
    def _get_bytes(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def _get_file(self, key: str, dest: str, durable: bool) -> ArtifactInfo: ...

    @abc.abstractmethod
    def _iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]: ...

    @abc.abstractmethod
    def _stat(self, key: str) -> ArtifactInfo: ...

    @abc.abstractmethod
    def _exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> Iterable[ArtifactInfo]: ...

    @abc.abstractmethod
    def _list_dirs(self, prefix: str) -> Iterable[str]: ...

    @abc.abstractmethod
    def _delete(self, key: str) -> None: ...


def _check_prefix(prefix: object) -> None:
    if (not isinstance(prefix, str) or "\\" in prefix or prefix.startswith("/") or ".." in prefix.split("/")
            or not is_utf8(prefix)):
        raise InvalidArgument(field="prefix", expected="'' or the start of a key", got=prefix,
                              fix="use a relative '/'-separated UTF-8 prefix such as 'runs/r1/'")


class _Obs:
    __slots__ = ("nbytes",)

    def __init__(self) -> None:
        self.nbytes = 0


def chunks_of(stream: Iterator[object]) -> Iterator[bytes | memoryview]:
    """Type-check each element of a put_stream iterable as it is consumed."""
    for i, chunk in enumerate(stream):
        try:
            yield as_buffer(chunk)
        except InvalidArgument:
            raise InvalidArgument(field=f"chunks[{i}]", expected="bytes-like chunks", got=type(chunk).__name__,
                                  fix="yield bytes from the iterable") from None


def hold_back_last(chunks: Iterator[bytes], verify) -> Iterator[bytes]:
    """Yield `chunks` but keep the last one until `verify()` (called after the source is
    exhausted) has passed, so a consumer never receives a complete, unverified object."""
    prev: bytes | None = None
    for chunk in chunks:
        if prev is not None:
            yield prev
        prev = chunk
    verify()
    if prev is not None:
        yield prev
