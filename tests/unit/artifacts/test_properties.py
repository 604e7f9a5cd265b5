"""Property-based tests of the file backend: round trips of arbitrary bytes, detection of any
single flipped bit, and concurrent writers (threads and processes) to one key, where every
read must return exactly one writer's bytes, verified."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trace_common.artifacts import open_store
from trace_common.errors import ArtifactCorrupted, NotFound

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CONCURRENT = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def root():
    with tempfile.TemporaryDirectory(prefix="trace-artifacts-prop-") as d:
        yield Path(d)


def fresh_key() -> str:
    return f"p/{uuid.uuid4().hex}/obj.bin"


@PROPS
@given(data=st.binary(max_size=20_000))
def test_put_bytes_get_bytes_round_trip(root, data):
    store = open_store(root.as_uri())
    key = fresh_key()
    info = store.put_bytes(key, data)
    assert store.get_bytes(key) == data
    assert store.stat(key) == info


@PROPS
@given(chunks=st.lists(st.binary(max_size=3000), max_size=12), chunk_size=st.integers(1, 5000))
def test_put_stream_iter_chunks_round_trip(root, chunks, chunk_size):
    store = open_store(root.as_uri())
    key = fresh_key()
    info = store.put_stream(key, iter(chunks))
    out = list(store.iter_chunks(key, chunk_size=chunk_size))
    assert b"".join(out) == b"".join(chunks)
    assert all(0 < len(c) <= chunk_size for c in out)
    assert info.size == sum(map(len, chunks))


@PROPS
@given(data=st.binary(min_size=1, max_size=20_000), where=st.floats(0, 1, exclude_max=True),
       bit=st.integers(0, 7), reader=st.sampled_from(["get_bytes", "iter_chunks", "get_file"]))
def test_any_flipped_bit_is_detected(root, data, where, bit, reader):
    store = open_store(root.as_uri())
    key = fresh_key()
    store.put_bytes(key, data)
    path = root / key
    raw = bytearray(path.read_bytes())
    raw[int(where * len(raw))] ^= 1 << bit
    path.write_bytes(bytes(raw))
    dest = root / f"{uuid.uuid4().hex}.out"
    with pytest.raises(ArtifactCorrupted):
        if reader == "get_bytes":
            store.get_bytes(key)
        elif reader == "iter_chunks":
            for _ in store.iter_chunks(key, chunk_size=997):
                pass
        else:
            store.get_file(key, dest)
    assert not dest.exists()


# --------------------------------------------------------------------------- concurrency

def writer_payload(writer: int, size: int) -> bytes:
    """Writer i's bytes: constant i+1, so any interleaving of two writers would show."""
    return bytes([writer + 1]) * size


def write_many(root_uri: str, key: str, writer: int, size: int, rounds: int) -> int:
    store = open_store(root_uri)
    data = writer_payload(writer, size)
    for _ in range(rounds):
        store.put_bytes(key, data)
    return rounds


def read_until(store, key: str, expected: set[bytes], done: threading.Event | None, pending) -> int:
    """Read `key` until the writers finish; every read must be one writer's complete bytes."""
    reads = 0
    while not (done.is_set() if done is not None else all(p.ready() for p in pending)):
        for how in ("get_bytes", "iter_chunks"):
            try:
                data = store.get_bytes(key) if how == "get_bytes" else b"".join(store.iter_chunks(key, 8192))
            except NotFound:
                continue  # before the first writer published
            assert data in expected, f"{how} returned a mix or a partial object ({len(data)} bytes)"
            reads += 1
    return reads


sizes = st.lists(st.integers(1, 96 * 1024), min_size=2, max_size=4)


@CONCURRENT
@given(sizes=sizes)
def test_concurrent_thread_writers_never_produce_a_mixed_object(root, sizes):
    store = open_store(root.as_uri())
    key = fresh_key()
    expected = {writer_payload(i, n) for i, n in enumerate(sizes)}
    done = threading.Event()
    with ThreadPoolExecutor(len(sizes) + 1) as pool:
        reader = pool.submit(read_until, store, key, expected, done, None)
        writers = [pool.submit(write_many, root.as_uri(), key, i, n, 8) for i, n in enumerate(sizes)]
        for w in writers:
            w.result()
        done.set()
        reader.result()
    assert store.get_bytes(key) in expected
    assert store.stat(key).sha256 in {open_store(root.as_uri()).put_bytes(fresh_key(), e).sha256 for e in expected}


@pytest.fixture(scope="module")
def process_pool():
    # spawn: a clean interpreter per worker, independent of the test process's threads.
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        yield pool


@CONCURRENT
@given(sizes=st.lists(st.integers(1, 96 * 1024), min_size=2, max_size=3))
def test_concurrent_process_writers_never_produce_a_mixed_object(root, process_pool, sizes):
    store = open_store(root.as_uri())
    key = fresh_key()
    expected = {writer_payload(i, n) for i, n in enumerate(sizes)}
    pending = [process_pool.apply_async(write_many, (root.as_uri(), key, i, n, 10)) for i, n in enumerate(sizes)]
    read_until(store, key, expected, None, pending)
    assert sum(p.get(timeout=60) for p in pending) == 10 * len(sizes)
    assert store.get_bytes(key) in expected
    leftovers = [n for n in os.listdir(root / os.path.dirname(key)) if n.startswith(".trace-tmp")]
    assert leftovers == []
