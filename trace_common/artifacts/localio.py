"""Local-file plumbing shared by both backends: streamed hashing, full writes, fsync of a
directory, the verified read of a whole object into memory (get_bytes), and the verified,
atomic publication of a downloaded file (get_file). Large transfers hash beside the I/O
(`integrity.ParallelSha256`)."""

from __future__ import annotations

import hashlib
import os
import queue
import uuid
from collections.abc import Callable

from trace_common.errors import InvalidArgument, Unavailable

from .buffers import BytesBuilder
from .info import ArtifactInfo
from .integrity import CHUNK, HASH_BLOCK, MAX_PENDING, ParallelSha256, block_size, check_sha256, new_hasher
from .keys import RESERVED_SEGMENT_PREFIX

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
    """sha256 hex and size of a local file, read with one reused buffer.

    (Hashing through an mmap would save the copy, ~15 % of this pass, but a file truncated by
    another process while mapped kills the reader with SIGBUS; `put_file` must survive sources
    that change under it.)"""
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


def transfer_ended_early(what: str) -> Callable[[int, int], BaseException]:
    """The error for a network source that delivered fewer bytes than it announced."""
    return lambda got, size: Unavailable(f"{what}: the transfer ended after {got} of {size} bytes; retry")


def receive_bytes(readinto: Callable[[memoryview], int], size: int,
                  short: Callable[[int, int], BaseException]) -> tuple[bytes, str]:
    """Read exactly `size` bytes from `readinto(view) -> n` (0 at the end) into the bytes object
    that is returned, hashing each block as it lands: (data, sha256 hex). One copy in all
    (source -> the returned object). A source that ends early raises `short(got, size)`.

    Transfers of `integrity.OVERLAP_MIN` or more hash on the helper thread while the next
    block is read; the hasher only ever reads blocks that are complete, and is joined before
    the buffer is handed out."""
    out = BytesBuilder(size)
    view = out.view
    hasher = new_hasher(size)
    block = block_size(hasher)
    got = 0
    try:
        try:
            while got < size:
                n = readinto(view[got:got + block])
                if not n:
                    break
                hasher.update(view[got:got + n])
                got += n
        finally:
            digest = hasher.hexdigest()  # joins the helper thread: no view of the buffer outlives this
        if got != size:
            raise short(got, size)
    except BaseException:
        out.discard()
        raise
    return out.finish(), digest


def publish_verified(dest: str, durable: bool, what: str, recorded: str | tuple[str, ...] | None,
                     readinto: Callable[[memoryview], int], make_info: Callable[[str, int], ArtifactInfo],
                     expected_size: int | None = None, size_hint: int | None = None) -> ArtifactInfo:
    """Copy bytes from `readinto(buf) -> n` (0 at the end) into a temp file beside `dest`,
    hashing them on the way; rename it to `dest` only if the digest matches `recorded` (one of
    them, given a tuple: see `integrity.check_sha256`) and, for network sources, the transfer
    delivered all `expected_size` bytes. On any failure the temp file is removed and `dest` is
    left as it was.

    Large transfers (`size_hint`, see `integrity.use_helper_thread`) hash on a helper thread
    while the next block is read and written, cycling through a ring of blocks so memory stays
    bounded."""
    directory = os.path.dirname(dest)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        try:
            hasher = new_hasher(size_hint or 0)
            if isinstance(hasher, ParallelSha256):
                size = _copy_parallel(readinto, fd, hasher)
            else:
                size = _copy_inline(readinto, fd, hasher)
            digest = hasher.hexdigest()
            if expected_size is not None and size != expected_size:
                raise transfer_ended_early(what)(size, expected_size)
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


def _copy_inline(readinto: Callable[[memoryview], int], fd: int, hasher) -> int:
    view = memoryview(bytearray(CHUNK))
    size = 0
    while n := readinto(view):
        hasher.update(view[:n])
        write_all(fd, view[:n])
        size += n
    return size


def _copy_parallel(readinto: Callable[[memoryview], int], fd: int, hasher: ParallelSha256) -> int:
    # Ring of blocks, allocated as needed: at most MAX_PENDING are queued in the hasher and one
    # is inside it (update() hashes a block itself rather than queue more), so with
    # MAX_PENDING + 2 blocks one is always free for the next read. A fast hasher keeps handing
    # blocks back, so a small transfer allocates only a few.
    free: queue.SimpleQueue = queue.SimpleQueue()
    allocated = 0
    size = 0
    try:
        while True:
            try:
                block = free.get_nowait()
            except queue.Empty:
                if allocated < MAX_PENDING + 2:
                    allocated += 1
                    block = memoryview(bytearray(HASH_BLOCK))
                else:
                    block = free.get()
            n = readinto(block)
            if not n:
                break
            write_all(fd, block[:n])
            size += n
            hasher.update(block[:n], lambda b=block: free.put(b))
    finally:
        hasher.close()  # the caller's hexdigest() then returns at once; on errors this ends the helper
    return size
