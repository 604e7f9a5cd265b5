"""Local-filesystem backend (`file:///abs/root`): the embedded default.

Layout, per object `<root>/<key>`:

    <dir>/<name>            the bytes
    <dir>/<name>.sha256     "<hex>  <name>\\n", the `sha256sum` format (`sha256sum -c` checks it)
    <dir>/.trace-lock       one lock file per directory (never deleted or replaced)
    <dir>/.trace-tmp-*      in-flight writes (hidden from listings)

Writes: bytes and sidecar go to temp files in the object's directory, are fsynced, then both
are renamed into place while holding the directory lock exclusively, then the directory is
fsynced. Readers hold the lock shared while they read the sidecar and open the data file, and
then read from that open descriptor, so they always pair a digest with the bytes it describes
even while other threads or processes overwrite the key: the data rename alone is atomic,
but without the lock a reader could see new bytes with the old sidecar. `flock` locks belong
to an open file description, so they exclude threads of one process as well as processes.

A crash between the two renames leaves new bytes beside the old digest; readers then raise
ArtifactCorrupted (never return unverified bytes) until the key is rewritten.

Unlike S3, a path cannot be both an object and a "directory" of other objects: writing
`a/b` when `a` is an object (or vice versa) raises FailedPrecondition. Reading an object whose
path holds a directory (or a FIFO, a device) raises `NotAFile`, an ArtifactCorrupted: the tree was
changed behind the store's back.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat as stat_mod
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from trace_common.errors import ArtifactCorrupted, FailedPrecondition, NotFound

from .base import ArtifactStore, Observer, hold_back_last
from .info import ArtifactInfo
from .integrity import CHUNK, ParallelSha256, check_sha256, is_sha256_hex, new_hasher
from .keys import RESERVED_SEGMENT_PREFIX, SIDECAR_SUFFIX, RootSpec, file_uri
from .localio import TMP_PREFIX, fsync_dir, publish_verified, receive_bytes, write_all

LOCK_NAME = RESERVED_SEGMENT_PREFIX + "lock"


class NotAFile(ArtifactCorrupted):
    """Reading an artifact whose path holds no file but a directory (or another non-file): the store
    was changed behind its back (e.g. `runs/<id>/manifest.json` made a directory). Damaged stored
    data, like a digest mismatch, and never a traceback: the caller says what to delete or re-run."""


def _kind(mode: int) -> str:
    return "a directory" if stat_mod.S_ISDIR(mode) else "something other than a file"


def sidecar_line(hexdigest: str, name: str) -> bytes:
    return f"{hexdigest}  {name}\n".encode()


def parse_sidecar(content: bytes, name: str) -> str | None:
    """The digest recorded for `name`, or None if the sidecar is malformed or names another file."""
    line = content.decode("utf-8", "replace").split("\n", 1)[0]
    digest, rest = line[:64], line[64:]
    if not is_sha256_hex(digest) or rest[:2] not in ("  ", " *") or rest[2:] != name:
        return None
    return digest


class FileStore(ArtifactStore):
    backend = "file"

    def __init__(self, root: RootSpec, observer: Observer | None = None):
        super().__init__(root, observer)
        self._dir = root.location

    # ----------------------------------------------------------------- paths and locks

    def _path(self, key: str) -> str:
        return os.path.join(self._dir, key)

    def _uri_for(self, key: str) -> str:
        return file_uri(self._path(key))

    def _info(self, key: str, digest: str, size: int) -> ArtifactInfo:
        return ArtifactInfo(uri=self._uri_for(key), key=key, sha256=digest, size=size)

    @contextmanager
    def _dir_lock(self, directory: str, exclusive: bool, key: str | None = None) -> Iterator[None]:
        """Hold `directory`'s lock. Shared mode raises NotFound(key) when the directory does not
        exist: reading on without the lock could race the first writer creating it."""
        path = os.path.join(directory, LOCK_NAME)
        fd = -1
        if exclusive:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        else:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
                except (FileNotFoundError, NotADirectoryError):
                    raise NotFound(f"artifact {self._uri_for(key) if key else directory} does not exist") from None
                except (PermissionError, OSError) as exc:
                    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                        raise
                    # A tree we may not write to: nothing we could race is writing it.
            except NotADirectoryError:
                raise NotFound(f"artifact {self._uri_for(key) if key else directory} does not exist") from None
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            if fd >= 0:
                os.close(fd)  # closing the last descriptor releases the flock

    def _read_record(self, path: str) -> str | None:
        try:
            with open(path + SIDECAR_SUFFIX, "rb") as f:
                content = f.read(4096)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return parse_sidecar(content, os.path.basename(path))

    @contextmanager
    def _open_source(self, key: str) -> Iterator[tuple[BinaryIO, str | None, int]]:
        """Open the data file and read its recorded digest as one consistent pair."""
        path = self._path(key)
        with self._dir_lock(os.path.dirname(path), exclusive=False, key=key):
            recorded = self._read_record(path)
            try:  # (non-blocking: a FIFO planted at the path must not hang the reader; a file reads as usual)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            except (FileNotFoundError, NotADirectoryError):
                raise NotFound(f"artifact {self._uri_for(key)} does not exist") from None
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):  # (before open(): a directory's fd raises IsADirectoryError there)
            os.close(fd)
            raise NotAFile(f"artifact {self._uri_for(key)} is not a file ({_kind(st.st_mode)} stands where its bytes "
                           "belong); remove it and rewrite the artifact from its source")
        f = open(fd, "rb", buffering=0)
        try:
            yield f, recorded, st.st_size
        finally:
            f.close()

    # ----------------------------------------------------------------- writes

    def _write(self, key: str, fill) -> ArtifactInfo:
        """Create the object from `fill(fd, hasher) -> size` with the atomic protocol above."""
        final = self._path(key)
        directory, name = os.path.split(final)
        try:
            os.makedirs(directory, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise FailedPrecondition(
                f"cannot store {self._uri_for(key)}: a parent path is an artifact, and the file backend "
                "cannot hold both 'a' and 'a/b'; choose a different key") from None
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        tmp_sidecar = tmp + SIDECAR_SUFFIX
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                hasher = hashlib.sha256()
                size = fill(fd, hasher)
                os.fsync(fd)
            finally:
                os.close(fd)
            digest = hasher.hexdigest()
            fd = os.open(tmp_sidecar, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                write_all(fd, sidecar_line(digest, name))
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._dir_lock(directory, exclusive=True):
                try:
                    os.replace(tmp, final)
                except IsADirectoryError:
                    raise FailedPrecondition(
                        f"cannot store {self._uri_for(key)}: that path holds other artifacts ('{key}/...'), "
                        "and the file backend cannot hold both 'a' and 'a/b'; choose a different key") from None
                os.replace(tmp_sidecar, final + SIDECAR_SUFFIX)
            fsync_dir(directory)
        finally:
            for leftover in (tmp, tmp_sidecar):
                try:
                    os.unlink(leftover)
                except FileNotFoundError:
                    pass
        return self._info(key, digest, size)

    def _put_bytes(self, key: str, data: bytes | memoryview) -> ArtifactInfo:
        def fill(fd: int, hasher) -> int:
            hasher.update(data)
            write_all(fd, data)
            return len(data)

        return self._write(key, fill)

    def _put_file(self, key: str, path: str) -> ArtifactInfo:
        def fill(fd: int, hasher) -> int:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            size = 0
            with open(path, "rb", buffering=0) as src:
                while n := src.readinto(buf):
                    hasher.update(view[:n])
                    write_all(fd, view[:n])
                    size += n
            return size

        return self._write(key, fill)

    def _put_stream(self, key: str, chunks: Iterator[bytes]) -> ArtifactInfo:
        def fill(fd: int, hasher) -> int:
            size = 0
            for chunk in chunks:
                hasher.update(chunk)
                write_all(fd, chunk)
                size += len(chunk)
            return size

        return self._write(key, fill)

    # ----------------------------------------------------------------- reads

    def _get_bytes(self, key: str) -> bytes:
        what = self._uri_for(key)
        with self._open_source(key) as (f, recorded, size):
            data, digest = receive_bytes(f.readinto, size, lambda got, n: ArtifactCorrupted(
                f"{what}: the file shrank from {n} to {got} bytes while it was read; it was changed "
                "behind the store's back; rewrite the artifact from its source"))
        check_sha256(recorded, digest, what)
        return data

    def _iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        with self._open_source(key) as (f, recorded, size):
            # Immutable chunks, hashed beside the consumer; at most ~1 MiB waits for the hasher.
            hasher = new_hasher(size, max_pending=max(1, CHUNK // chunk_size))

            def read() -> Iterator[bytes]:
                while chunk := f.read(chunk_size):
                    hasher.update(chunk)
                    yield chunk

            try:
                yield from hold_back_last(read(), lambda: check_sha256(recorded, hasher.hexdigest(),
                                                                       self._uri_for(key)))
            finally:
                if isinstance(hasher, ParallelSha256):
                    hasher.close()  # abandoned or failed stream: hand the helper thread back

    def _get_file(self, key: str, dest: str, durable: bool) -> ArtifactInfo:
        with self._open_source(key) as (f, recorded, size):
            return publish_verified(dest, durable, self._uri_for(key), recorded, f.readinto,
                                    lambda digest, n: self._info(key, digest, n), size_hint=size)

    # ----------------------------------------------------------------- metadata

    def _stat(self, key: str) -> ArtifactInfo:
        path = self._path(key)
        with self._dir_lock(os.path.dirname(path), exclusive=False, key=key):
            recorded = self._read_record(path)
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                raise NotFound(f"artifact {self._uri_for(key)} does not exist") from None
        if not stat_mod.S_ISREG(st.st_mode):
            raise NotFound(f"artifact {self._uri_for(key)} does not exist (it is a directory of other artifacts)")
        if recorded is None:
            check_sha256(None, "", self._uri_for(key))
        return self._info(key, recorded, st.st_size)

    def _exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def _list(self, prefix: str) -> Iterable[ArtifactInfo]:
        base = prefix.rpartition("/")[0]
        start = os.path.join(self._dir, base) if base else self._dir
        if not os.path.isdir(start):
            return []
        found: list[ArtifactInfo] = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(RESERVED_SEGMENT_PREFIX)]
            rel = os.path.relpath(dirpath, self._dir)
            rel = "" if rel == "." else rel + "/"
            keys = [rel + name for name in filenames
                    if not name.startswith(RESERVED_SEGMENT_PREFIX) and not name.endswith(SIDECAR_SUFFIX)
                    and (rel + name).startswith(prefix)]
            if not keys:
                continue
            try:
                found.extend(self._infos_in(dirpath, keys))
            except NotFound:
                continue  # directory removed since the walk
        return found

    def _infos_in(self, directory: str, keys: list[str]) -> list[ArtifactInfo]:
        infos = []
        with self._dir_lock(directory, exclusive=False):
            for key in keys:
                path = self._path(key)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue  # deleted since the walk
                recorded = self._read_record(path)
                if recorded is None:
                    check_sha256(None, "", self._uri_for(key))
                infos.append(self._info(key, recorded, st.st_size))
        return infos

    def _delete(self, key: str) -> None:
        path = self._path(key)
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            return
        with self._dir_lock(directory, exclusive=True):
            for victim in (path, path + SIDECAR_SUFFIX):
                try:
                    os.unlink(victim)
                except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                    pass
                except PermissionError as e:  # unlink(2) on a directory reports EISDIR or EPERM
                    if e.errno != errno.EPERM or not os.path.isdir(victim):
                        raise


