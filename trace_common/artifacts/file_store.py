"""Local-filesystem backend (`file:///abs/root`): the embedded default.

Layout, per object `<root>/<key>`:

    <dir>/<name>            the bytes
    <dir>/<name>.sha256     "<hex>  <name>\\n", the `sha256sum` format (`sha256sum -c` checks it)
    <dir>/.trace-lock       one lock file per directory (never deleted or replaced)
    <dir>/.trace-tmp-*      in-flight writes (hidden from listings)

Writes: the bytes and their one-line record go to temp files in the object's directory and are
fsynced; then, holding the directory lock exclusively, the store publishes them in an order that
leaves the previous version or the new one readable at every crash point (a SIGKILL, or a power
loss: the directory is fsynced between the steps), never new bytes beside an old digest:

1. when the key holds bytes with a recorded digest, the sidecar is first replaced by a record of
   both versions, newest first (`"<new>  <name>\\n<old>  <name>\\n"`, two `sha256sum` lines);
2. the bytes are renamed into place;
3. the sidecar is replaced by the new one-line record.

A first write (or one over bytes with no valid record, or of the same bytes again) has nothing to
keep readable: its one-line record goes into place first, then its bytes, so a crash between the
two leaves a record without bytes and the key reads as absent. Reads accept bytes that match either
digest of a two-version record (the bytes are one of two complete versions); `stat` and `list`,
which report the recorded digest without reading, hash the bytes to tell which version is there
in that case; the next write of the key replaces the record with a one-line one. Until then
`sha256sum -c` reports the absent version's line as FAILED.

Readers hold the lock shared while they read the sidecar and open the data file, and then read from
that open descriptor, so they always pair a digest with the bytes it describes even while other
threads or processes overwrite the key: each rename alone is atomic, but without the lock a reader
could pair the bytes of one write with the record of another. Writers to one directory are
serialized by the same lock (held exclusively from step 1 to step 3), so concurrent writers of a
key leave the last writer's complete version. `flock` locks belong to an open file description, so
they exclude threads of one process as well as processes.

Unlike S3, a path cannot be both an object and a "directory" of other objects: writing
`a/b` when `a` is an object (or vice versa) raises FailedPrecondition. Reading an object whose
path holds a directory (or a FIFO, a device) raises `NotAFile`, an ArtifactCorrupted: the tree was
changed behind the store's back. A sidecar that is not a regular file counts as no record.
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
from .integrity import CHUNK, ParallelSha256, check_sha256, is_sha256_hex, new_hasher, no_digest_message
from .keys import RESERVED_SEGMENT_PREFIX, SIDECAR_SUFFIX, RootSpec, file_uri
from .localio import TMP_PREFIX, fsync_dir, publish_verified, receive_bytes, sha256_file, write_all

LOCK_NAME = RESERVED_SEGMENT_PREFIX + "lock"
SIDECAR_READ_MAX = 4096
"""Bytes of a sidecar read (a two-version record of a 240-byte name is ~620 bytes)."""


class NotAFile(ArtifactCorrupted):
    """Reading an artifact whose path holds no file but a directory (or another non-file): the store
    was changed behind its back (e.g. `runs/<id>/manifest.json` made a directory). Damaged stored
    data, like a digest mismatch, and never a traceback: the caller says what to delete or re-run."""


def _kind(mode: int) -> str:
    return "a directory" if stat_mod.S_ISDIR(mode) else "something other than a file"


def sidecar_line(hexdigest: str, name: str) -> bytes:
    return f"{hexdigest}  {name}\n".encode()


def sidecar_record(digests: tuple[str, ...], name: str) -> bytes:
    """A sidecar's content: one `sha256sum` line per digest, newest first."""
    return b"".join(sidecar_line(d, name) for d in digests)


def parse_sidecar(content: bytes, name: str) -> tuple[str, ...] | None:
    """The digests recorded for `name`, newest first (one, or two while an interrupted overwrite is
    unsettled), or None if the sidecar is empty, malformed or names another file."""
    lines = content.decode("utf-8", "replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    digests: list[str] = []
    for line in lines:
        digest, rest = line[:64], line[64:]
        if not is_sha256_hex(digest) or rest[:2] not in ("  ", " *") or rest[2:] != name:
            return None
        if digest not in digests:
            digests.append(digest)
    return tuple(digests) or None


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

    def _read_record(self, path: str) -> tuple[str, ...] | None:
        """The digests recorded for the object at `path` (see `parse_sidecar`); None when there is no
        valid record: no sidecar, a malformed one, or something other than a file in its place."""
        try:  # (non-blocking: a FIFO planted at the sidecar's path must not hang the reader)
            fd = os.open(path + SIDECAR_SUFFIX, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                return None
            content = os.read(fd, SIDECAR_READ_MAX)
        finally:
            os.close(fd)
        return parse_sidecar(content, os.path.basename(path))

    def _settled(self, key: str, recorded: tuple[str, ...], size: int) -> ArtifactInfo:
        """What stat and list report for `key`: its recorded digest, or, while a two-version record
        is unsettled, the one its bytes match (the newest when neither does: reading it fails)."""
        if len(recorded) == 1:
            return self._info(key, recorded[0], size)
        with self._open_source(key) as (f, now, size):
            if now is None:
                raise ArtifactCorrupted(no_digest_message(self._uri_for(key)))
            if len(now) == 1:
                return self._info(key, now[0], size)
            hasher = hashlib.sha256()
            while chunk := f.read(CHUNK):
                hasher.update(chunk)
        digest = hasher.hexdigest()
        return self._info(key, digest if digest in now else now[0], size)

    @contextmanager
    def _open_source(self, key: str) -> Iterator[tuple[BinaryIO, tuple[str, ...] | None, int]]:
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
        """Create the object from `fill(fd, hasher) -> size` with the crash-safe protocol above."""
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
        tmp_both = tmp + "-both" + SIDECAR_SUFFIX
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                hasher = hashlib.sha256()
                size = fill(fd, hasher)
                os.fsync(fd)
            finally:
                os.close(fd)
            digest = hasher.hexdigest()
            _write_synced(tmp_sidecar, sidecar_line(digest, name))
            with self._dir_lock(directory, exclusive=True):
                self._publish(key, tmp, tmp_sidecar, tmp_both, digest)
            fsync_dir(directory)
        finally:
            for leftover in (tmp, tmp_sidecar, tmp_both):
                try:
                    os.unlink(leftover)
                except FileNotFoundError:
                    pass
        return self._info(key, digest, size)

    def _publish(self, key: str, tmp: str, tmp_sidecar: str, tmp_both: str, digest: str) -> None:
        """Steps 1-3 of the module docstring; the caller holds the directory lock exclusively."""
        final = self._path(key)
        directory, name = os.path.split(final)
        sidecar = final + SIDECAR_SUFFIX
        if os.path.isdir(final):
            raise self._holds_others(key)
        if os.path.isdir(sidecar):
            raise FailedPrecondition(
                f"cannot store {self._uri_for(key)}: a directory stands where its checksum file "
                f"{file_uri(sidecar)} belongs (e.g. a key '{key}{SIDECAR_SUFFIX}/...', stored before such keys were "
                "refused); "
                "move that directory away or choose a different key")
        keep = tuple(d for d in self._current_digests(final) if d != digest)
        if keep:
            _write_synced(tmp_both, sidecar_record((digest, *keep), name))
            os.replace(tmp_both, sidecar)  # 1. old and new bytes both verify
            fsync_dir(directory)
            self._replace_data(key, tmp, final)  # 2. the new bytes
            fsync_dir(directory)
            os.replace(tmp_sidecar, sidecar)  # 3. only the new bytes verify
        else:
            os.replace(tmp_sidecar, sidecar)  # no bytes to keep readable: the record first,
            fsync_dir(directory)
            self._replace_data(key, tmp, final)  # then the bytes

    def _replace_data(self, key: str, tmp: str, final: str) -> None:
        try:
            os.replace(tmp, final)
        except IsADirectoryError:
            raise self._holds_others(key) from None

    def _holds_others(self, key: str) -> FailedPrecondition:
        return FailedPrecondition(
            f"cannot store {self._uri_for(key)}: that path holds other artifacts ('{key}/...'), "
            "and the file backend cannot hold both 'a' and 'a/b'; choose a different key")

    def _current_digests(self, final: str) -> tuple[str, ...]:
        """The digest of the bytes now at `final`, when it has a valid record (for a two-version record,
        hashed to tell which one: an earlier write was interrupted); () when there is nothing to keep."""
        recorded = self._read_record(final)
        if not recorded:
            return ()
        try:
            if not stat_mod.S_ISREG(os.stat(final).st_mode):
                return ()
        except (FileNotFoundError, NotADirectoryError):
            return ()
        if len(recorded) == 1:
            return recorded
        actual, _ = sha256_file(final)
        return (actual,) if actual in recorded else ()

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
        return self._settled(key, recorded, st.st_size)

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
        unsettled = []
        with self._dir_lock(directory, exclusive=False):
            for key in keys:
                path = self._path(key)
                try:
                    st = os.stat(path)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # deleted since the walk
                if stat_mod.S_ISDIR(st.st_mode):
                    continue  # replaced by a directory since the walk
                recorded = self._read_record(path)
                if recorded is None:
                    infos.append(ArtifactInfo(uri=self._uri_for(key), key=key, sha256="", size=st.st_size,
                                              corruption=no_digest_message(self._uri_for(key))))
                elif len(recorded) > 1:
                    unsettled.append((key, recorded, st.st_size))
                else:
                    infos.append(self._info(key, recorded[0], st.st_size))
        for key, recorded, size in unsettled:  # (hashed outside the lock: writers need not wait)
            try:
                infos.append(self._settled(key, recorded, size))
            except NotFound:
                continue  # deleted since the walk
            except ArtifactCorrupted as exc:  # changed behind the store's back since the walk
                infos.append(ArtifactInfo(uri=self._uri_for(key), key=key, sha256="", size=size, corruption=str(exc)))
        return infos

    def _list_dirs(self, prefix: str) -> Iterable[str]:
        try:
            with os.scandir(os.path.join(self._dir, prefix) if prefix else self._dir) as entries:
                # (not through symlinks: the walk in `_list` does not follow them either)
                return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

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


def _write_synced(path: str, data: bytes) -> None:
    """Create `path` (it must not exist) holding `data`, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
