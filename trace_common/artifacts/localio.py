"""Local-file plumbing shared by both backends: streamed hashing, full writes, fsync of a
directory, and the verified, atomic publication of a downloaded file (get_file)."""

from __future__ import annotations

import hashlib
import os
import queue
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from trace_common.errors import InvalidArgument, Unavailable

from . import integrity
from .integrity import CHUNK, ParallelSha256, check_sha256
from .keys import RESERVED_SEGMENT_PREFIX

if TYPE_CHECKING:
    from .base import ArtifactInfo

TMP_PREFIX = RESERVED_SEGMENT_PREFIX + "tmp-"


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: str, buf_size: int = CHUNK) -> tuple[str, int]:
    """sha256 hex and size of a local file, read with one reused buffer."""
    digest = hashlib.sha256()
    buf = bytearray(buf_size)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
            size += n
    return digest.hexdigest(), size


def source_file(path: object) -> str:
    """Resolve a put_file source path, or raise InvalidArgument saying what is wrong with it."""
    try:
        p = os.fspath(path)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(field="path", expected="a str or os.PathLike", got=path,
                              fix="pass the path of a local file") from None
    if not os.path.isfile(p):
        raise InvalidArgument(field="path", expected="an existing regular file", got=p,
                              fix="check the path; directories and missing files cannot be uploaded")
    return p


def dest_file(path: object) -> str:
    try:
        p = os.path.abspath(os.fspath(path))  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(field="dest_path", expected="a str or os.PathLike", got=path,
                              fix="pass the local path to write") from None
    if os.path.isdir(p):
        raise InvalidArgument(field="dest_path", expected="a file path", got=p,
                              fix="name the file to create inside that directory")
    return p


def publish_verified(dest: str, durable: bool, what: str, recorded: str | None,
                     readinto: Callable[[memoryview], int], make_info: Callable[[str, int], ArtifactInfo],
                     expected_size: int | None = None, size_hint: int | None = None) -> ArtifactInfo:
    """Copy bytes from `readinto(buf) -> n` (0 at the end) into a temp file beside `dest`,
    hashing them on the way; rename it to `dest` only if the digest matches `recorded`
    (and, for network sources, the transfer delivered all `expected_size` bytes).

    Large transfers (`size_hint`, see `integrity.use_helper_thread`) hash on a helper thread
    while the next block is read and written, cycling through a few blocks so memory stays
    bounded."""
    directory = os.path.dirname(dest)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        try:
            if integrity.use_helper_thread(size_hint or 0):
                digest, size = _copy_parallel(readinto, fd)
            else:
                digest, size = _copy_inline(readinto, fd)
            if expected_size is not None and size != expected_size:
                raise Unavailable(f"{what}: the transfer ended after {size} of {expected_size} bytes; retry")
            check_sha256(recorded, digest, what)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dest)
        if durable:
            fsync_dir(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return make_info(digest, size)


def _copy_inline(readinto: Callable[[memoryview], int], fd: int) -> tuple[str, int]:
    hasher = hashlib.sha256()
    view = memoryview(bytearray(CHUNK))
    size = 0
    while n := readinto(view):
        hasher.update(view[:n])
        write_all(fd, view[:n])
        size += n
    return hasher.hexdigest(), size


_RING = 3  # blocks in flight: one being read/written, up to two waiting for the hasher
_BLOCK = CHUNK


def _copy_parallel(readinto: Callable[[memoryview], int], fd: int) -> tuple[str, int]:
    free: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(_RING):
        free.put(memoryview(bytearray(_BLOCK)))
    hasher = ParallelSha256()
    size = 0
    try:
        while True:
            block = free.get()  # blocks while the hasher still holds all of them
            n = readinto(block)
            if not n:
                break
            write_all(fd, block[:n])
            size += n
            hasher.update(block[:n], lambda b=block: free.put(b))
    finally:
        digest = hasher.hexdigest()
    return digest, size
