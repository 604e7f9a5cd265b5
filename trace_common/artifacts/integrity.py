"""The integrity rule shared by both backends, and the hashing that enforces it beside the I/O.

Rule: a read succeeds only if the sha256 of the bytes it delivered equals the well-formed digest
recorded when the object was written.

Cost: sha256 is the one thing a verified read does that a plain read does not (~0.8 ms of CPU
per MiB on this project's machines, against a loopback S3 GET of ~2.5-3.5 ms per MiB). Reads of
at least `OVERLAP_MIN` therefore hash on a helper thread (`ParallelSha256`), block by block,
while the caller receives the next block: hashlib releases the GIL while it hashes a buffer, so
with a core to spare the digest is ready almost as soon as the last byte arrived. On a machine
whose cores are all busy the hash still costs its CPU time.
"""

from __future__ import annotations

import collections
import hashlib
import os
import queue
import re
import threading
from collections.abc import Callable

from trace_common.errors import ArtifactCorrupted

CHUNK = 1024 * 1024
"""Read/hash/write granularity for streamed transfers hashed inline: big enough that per-call
overhead is negligible, small enough to stay in cache between the read and the hash."""

HASH_BLOCK = 256 * 1024
"""Granularity of overlapped transfers: each block is handed to the hashing thread as soon as
it has arrived, so only the last block's hash (~0.2 ms) is left once the transfer ends."""

OVERLAP_MIN = 4 * CHUNK
"""Transfers at least this big hash on a helper thread (see `use_helper_thread`)."""

MAX_PENDING = 8
"""Blocks a `ParallelSha256` queues before `update` hashes the oldest one itself: bounds the
memory a fast producer (a page-cache read) can pin ahead of the hash."""

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def no_digest_message(what: str, found: object = None) -> str:
    """What reading an object with no valid recorded digest raises (ArtifactCorrupted)."""
    return (f"{what}: no valid sha256 was recorded for this object (found {found!r}); "
            "it was not written by the artifact store or its record was lost; rewrite it")


def check_sha256(recorded: str | tuple[str, ...] | None, actual: str, what: str) -> None:
    """Raise ArtifactCorrupted unless `actual` equals the well-formed `recorded` digest.

    `recorded` may be a tuple of digests, newest first: the file backend's record of an overwrite
    that was interrupted between its renames holds the new version's digest and the previous
    one's, and the bytes there are one of those two complete versions."""
    if isinstance(recorded, tuple):
        if len(recorded) > 1 and all(is_sha256_hex(d) for d in recorded):
            if actual in recorded:
                return
            raise ArtifactCorrupted(f"{what}: content sha256 {actual} matches none of the recorded "
                                    f"{', '.join(recorded)} (an overwrite was interrupted, and the bytes are "
                                    "neither version); the stored bytes are damaged or were changed behind the "
                                    "store's back; rewrite the artifact from its source")
        recorded = recorded[0] if len(recorded) == 1 else None
    if recorded is None or not _HEX64.match(recorded):
        raise ArtifactCorrupted(no_digest_message(what, recorded))
    if recorded != actual:
        raise ArtifactCorrupted(f"{what}: content sha256 {actual} does not match the recorded {recorded}; "
                                "the stored bytes are damaged or were changed behind the store's back; "
                                "rewrite the artifact from its source")


def is_sha256_hex(value: str | None) -> bool:
    return value is not None and bool(_HEX64.match(value))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def use_helper_thread(nbytes: int) -> bool:
    """Whether a transfer of `nbytes` should hash on a helper thread rather than inline.

    Yes for transfers of at least `OVERLAP_MIN` when the process may run on two or more cores.
    Measured on the shared 2-core machine at load average ~7 (bench/README.md): from 4 MiB up the
    overlapped S3 reads were as fast or faster than inline hashing (16 MiB get 0.87x vs 0.73x of
    the raw SDK, get_file 0.93x vs 0.70x); at 1-2 MiB they were slower (get 0.76x vs 0.83x), the
    hand-offs costing more than the overlap hides while no core is free. There is no load test:
    the load average counts the transfer's own client and server, and an earlier gate on it
    turned the overlap off exactly when it was needed. With one core there is nothing to
    overlap with."""
    return nbytes >= OVERLAP_MIN and usable_cores() >= 2


_tasks: queue.SimpleQueue = queue.SimpleQueue()
"""One entry per queued block: the `ParallelSha256` it belongs to. Entries are interchangeable
(each hashes that hasher's oldest queued block, if any is left), so blocks a caller hashed
itself leave entries that find nothing to do."""
_workers: list[threading.Thread] = []
_workers_lock = threading.Lock()


def _work() -> None:
    while True:
        _tasks.get()._hash_next()


def _ensure_workers() -> None:
    """Start the shared hashing threads on first use (one per usable core, at most 4)."""
    if len(_workers) >= min(4, usable_cores()):
        return
    with _workers_lock:
        while len(_workers) < min(4, usable_cores()):
            thread = threading.Thread(target=_work, name="artifact-sha256", daemon=True)
            thread.start()
            _workers.append(thread)


def _forget_workers_after_fork() -> None:
    # A forked child has none of the parent's threads: start new ones on first use.
    global _tasks, _workers_lock
    _tasks = queue.SimpleQueue()
    _workers.clear()
    _workers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_workers_after_fork)


class ParallelSha256:
    """sha256 computed on a helper thread, in submission order, while the caller goes on
    reading. A few shared threads serve every transfer (starting one per read would cost more
    than a small overlapped read saves).

    The caller never waits for the helper to be scheduled: when `max_pending` buffers are
    queued, `update` hashes the oldest one itself, and `hexdigest`/`close` hash whatever is
    still queued. (On a machine whose cores are all busy the helper may not run for a while;
    the transfer then costs what inline hashing costs, not that plus a scheduling delay.)
    Blocks are taken from the queue and hashed under one lock, so whoever hashes them, they are
    hashed in order.

    `update(view, done)` queues a buffer; the caller must not change it until it is hashed:
    `done()` (if given) runs once it is, on whichever thread hashed it, so a caller can recycle
    it. Always call `hexdigest()` or `close()` (idempotent), also on error paths, so the helper
    goes back to its pool."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self._hasher = hashlib.sha256()
        self._hashing = threading.Lock()  # held while one block is taken and hashed: keeps the order
        self._state = threading.Lock()  # guards _pending
        self._pending: collections.deque = collections.deque()
        self._max = max(1, max_pending)
        self._closed = False
        self._error: BaseException | None = None
        _ensure_workers()

    def _hash_next(self) -> bool:
        """Take the oldest queued buffer and hash it; False when none is queued."""
        with self._hashing:
            with self._state:
                if not self._pending:
                    return False
                view, done = self._pending.popleft()
            try:
                if self._error is None:
                    self._hasher.update(view)
                if done is not None:
                    done()
            except BaseException as exc:  # reported by hexdigest(); keep draining so no producer waits forever
                self._error = self._error or exc
        return True

    def update(self, view, done: Callable[[], None] | None = None) -> None:
        with self._state:
            full = len(self._pending) >= self._max
        if full:
            self._hash_next()
        with self._state:
            self._pending.append((view, done))
        _tasks.put(self)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            while self._hash_next():
                pass
            with self._hashing:  # the helper may still be inside the last block it took
                pass

    def hexdigest(self) -> str:
        self.close()
        if self._error is not None:
            raise self._error
        return self._hasher.hexdigest()


def new_hasher(nbytes: int | None, max_pending: int = MAX_PENDING):
    """The hasher for a transfer of `nbytes` (None: unknown): overlapped or inline, one API."""
    if nbytes is not None and use_helper_thread(nbytes):
        return ParallelSha256(max_pending)
    return hashlib.sha256()


def block_size(hasher) -> int:
    """Read granularity that suits `hasher` (small blocks only pay off when hashing is overlapped)."""
    return HASH_BLOCK if isinstance(hasher, ParallelSha256) else CHUNK
