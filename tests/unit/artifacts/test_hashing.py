"""The pieces verified reads are made of: the overlapped hasher, the in-place receive buffer, and
`receive_bytes`, which ties them together (both backends' get_bytes). Real hashing and real
threads; the sources are plain in-memory readers."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from trace_common.artifacts import buffers, integrity
from trace_common.artifacts.integrity import HASH_BLOCK, OVERLAP_MIN, ParallelSha256
from trace_common.artifacts.localio import receive_bytes, transfer_ended_early
from trace_common.errors import Unavailable

KiB, MiB = 1 << 10, 1 << 20


def reader_of(data: bytes, *, stop_at: int | None = None, max_read: int | None = None):
    """readinto(view) -> n over `data`, ending early at `stop_at`, at most `max_read` per call."""
    pos = 0
    end = len(data) if stop_at is None else stop_at

    def readinto(view: memoryview) -> int:
        nonlocal pos
        n = min(len(view), end - pos, max_read or len(view))
        view[:n] = data[pos:pos + n]
        pos += n
        return n

    return readinto


@pytest.mark.parametrize(("blocks", "block_size"), [(0, 0), (1, 1), (3, 4096), (40, HASH_BLOCK), (5, 3 * MiB + 1)])
def test_parallel_sha256_equals_hashlib_in_submission_order(blocks, block_size):
    parts = [os.urandom(block_size) for _ in range(blocks)]
    hasher = ParallelSha256(max_pending=2)
    for part in parts:
        hasher.update(memoryview(part))
    assert hasher.hexdigest() == hashlib.sha256(b"".join(parts)).hexdigest()
    assert hasher.hexdigest() == hashlib.sha256(b"".join(parts)).hexdigest()  # idempotent


def test_parallel_sha256_reports_done_per_buffer_after_hashing_it():
    done = []
    hasher = ParallelSha256()
    for i in range(20):
        hasher.update(b"x" * (i + 1), lambda i=i: done.append(i))
    hasher.hexdigest()
    assert done == list(range(20))


def test_parallel_sha256_bounds_pending_buffers():
    """With max_pending=1 and the helper stuck inside a block, a further update() cannot queue
    a second block: it hashes the queued one itself, and so waits for the helper's block."""
    started, gate = threading.Event(), threading.Event()
    hasher = ParallelSha256(max_pending=1)
    hasher.update(b"a", lambda: (started.set(), gate.wait()))
    assert started.wait(10), "no helper thread took the first block"
    hasher.update(b"b")
    third = threading.Thread(target=hasher.update, args=(b"c",))
    third.start()
    third.join(0.3)
    assert third.is_alive(), "update() queued past max_pending"
    gate.set()
    third.join(10)
    assert not third.is_alive()
    assert hasher.hexdigest() == hashlib.sha256(b"abc").hexdigest()


def test_caller_hashes_the_blocks_itself_when_every_helper_is_busy():
    """A transfer never waits for a helper to be scheduled: with all helpers occupied, the
    caller's update()/hexdigest() hash its blocks on the caller's own thread."""
    integrity._ensure_workers()
    gate = threading.Event()
    busy = []
    for _ in integrity._workers:
        started = threading.Event()
        h = ParallelSha256()
        h.update(b"x", lambda started=started: (started.set(), gate.wait()))
        assert started.wait(10)
        busy.append(h)
    try:
        hashed_by = []
        hasher = ParallelSha256(max_pending=2)
        parts = [os.urandom(1000) for _ in range(6)]
        for part in parts:
            hasher.update(part, lambda: hashed_by.append(threading.get_ident()))
        assert hasher.hexdigest() == hashlib.sha256(b"".join(parts)).hexdigest()
        assert hashed_by == [threading.get_ident()] * len(parts)
    finally:
        gate.set()
        for h in busy:
            h.close()


def test_parallel_sha256_surfaces_a_failed_callback():
    hasher = ParallelSha256(max_pending=1)

    def boom():
        raise RuntimeError("recycle failed")

    hasher.update(b"a", boom)
    for _ in range(5):
        hasher.update(b"b")
    with pytest.raises(RuntimeError, match="recycle failed"):
        hasher.hexdigest()


def test_hashing_threads_are_shared_across_transfers():
    ParallelSha256().hexdigest()
    before = {t.ident for t in threading.enumerate() if t.name == "artifact-sha256"}
    for _ in range(50):
        hasher = ParallelSha256()
        hasher.update(b"x" * 100_000)
        hasher.update(b"y" * 100_000)
        hasher.hexdigest()
    after = {t.ident for t in threading.enumerate() if t.name == "artifact-sha256"}
    assert before == after and 1 <= len(after) <= 4


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place-bytes", "bytesio"])
@pytest.mark.parametrize("size", [0, 1, 4 * KiB + 3, 2 * MiB + 1])
def test_bytes_builder_returns_what_was_written(in_place, size):
    if in_place and not buffers.IN_PLACE:
        pytest.fail("in-place bytes need CPython, which this project requires")
    data = os.urandom(size)
    out = buffers.BytesBuilder(size, in_place=in_place)
    out.view[:] = data
    got = out.finish()
    assert type(got) is bytes and got == data
    assert hash(got) == hash(data)  # a normal, hashable bytes object


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
@pytest.mark.parametrize(("size", "max_read"), [(0, None), (100, 7), (OVERLAP_MIN, None), (OVERLAP_MIN + 12345, 65536),
                                                 (5 * MiB + 3, None)])
def test_receive_bytes_returns_the_data_and_its_digest(monkeypatch, overlap, size, max_read):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: overlap)
    data = os.urandom(size)
    got, digest = receive_bytes(reader_of(data, max_read=max_read), size, transfer_ended_early("obj"))
    assert got == data and digest == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
@pytest.mark.parametrize("stop_at", [0, 1, HASH_BLOCK, 2 * MiB - 1])
def test_receive_bytes_raises_when_the_source_ends_early(monkeypatch, overlap, stop_at):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: overlap)
    data = os.urandom(2 * MiB)
    with pytest.raises(Unavailable, match=f"after {stop_at} of {2 * MiB} bytes"):
        receive_bytes(reader_of(data, stop_at=stop_at), len(data), transfer_ended_early("obj"))


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_receive_bytes_passes_a_source_error_through(monkeypatch, overlap):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: overlap)
    data = os.urandom(3 * MiB)
    inner = reader_of(data)
    calls = 0

    def failing(view):
        nonlocal calls
        calls += 1
        if calls == 2:  # mid-transfer in either mode (1 MiB blocks inline, 256 KiB overlapped)
            raise Unavailable("connection reset")
        return inner(view)

    with pytest.raises(Unavailable, match="connection reset"):
        receive_bytes(failing, len(data), transfer_ended_early("obj"))
