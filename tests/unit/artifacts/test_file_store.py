"""The file backend (the embedded default): round trips, integrity, atomicity, errors, memory.

Everything here runs against a real directory; nothing is mocked. The same behaviour is
checked against a real S3 server in tests/integration/test_artifacts_s3.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from trace_common.artifacts import integrity, open_store
from trace_common.artifacts.integrity import CHUNK, OVERLAP_MIN
from trace_common.errors import ArtifactCorrupted, FailedPrecondition, InvalidArgument, NotFound

SIZES = [0, 1, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 5]


@pytest.fixture
def store(tmp_path):
    return open_store((tmp_path / "store").as_uri())


def payload(size: int) -> bytes:
    return bytes((i * 7 + size) % 251 for i in range(size)) if size < 4096 else os.urandom(size)


def write(store, how: str, key: str, data: bytes, tmp_path: Path):
    if how == "put_bytes":
        return store.put_bytes(key, data)
    if how == "put_bytearray":
        return store.put_bytes(key, bytearray(data))
    if how == "put_file":
        src = tmp_path / "src.bin"
        src.write_bytes(data)
        return store.put_file(key, src)
    if how == "put_stream":
        return store.put_stream(key, (data[i:i + 1000] for i in range(0, len(data), 1000)))
    raise AssertionError(how)


def read(store, how: str, key: str, tmp_path: Path) -> bytes:
    if how == "get_bytes":
        return store.get_bytes(key)
    if how == "get_file":
        dest = tmp_path / "out" / "dest.bin"
        info = store.get_file(key, dest)
        assert info.size == dest.stat().st_size
        return dest.read_bytes()
    if how == "iter_chunks":
        return b"".join(store.iter_chunks(key, chunk_size=4096))
    raise AssertionError(how)


WRITERS = ["put_bytes", "put_bytearray", "put_file", "put_stream"]
READERS = ["get_bytes", "get_file", "iter_chunks"]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("writer", WRITERS)
def test_round_trip(store, tmp_path, writer, reader, size):
    data = payload(size)
    info = write(store, writer, "runs/r1/obj.bin", data, tmp_path)
    assert (info.key, info.size, info.sha256) == ("runs/r1/obj.bin", size, hashlib.sha256(data).hexdigest())
    assert info.uri == store.uri_for("runs/r1/obj.bin")
    assert read(store, reader, "runs/r1/obj.bin", tmp_path) == data
    assert store.stat("runs/r1/obj.bin") == info


def test_sidecar_is_checked_by_sha256sum(store, tmp_path):
    store.put_bytes("d/model.bin", b"weights")
    directory = tmp_path / "store" / "d"
    result = subprocess.run(["sha256sum", "-c", "model.bin.sha256"], cwd=directory, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "model.bin: OK"


def test_overwrite_replaces_bytes_and_digest_and_leaves_no_temp_files(store, tmp_path):
    store.put_bytes("k", b"old")
    info = store.put_bytes("k", b"new bytes")
    assert store.get_bytes("k") == b"new bytes" and store.stat("k") == info
    assert sorted(os.listdir(tmp_path / "store")) == [".trace-lock", "k", "k.sha256"]


# --------------------------------------------------------------------------- corruption

def _flip(p: Path):
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))


def _truncate(p: Path):
    p.write_bytes(p.read_bytes()[:-1])


def _append(p: Path):
    p.write_bytes(p.read_bytes() + b"\0")


def _sidecar_other_digest(p: Path):
    side = p.with_name(p.name + ".sha256")
    side.write_text("0" * 64 + "  " + p.name + "\n")


def _sidecar_missing(p: Path):
    p.with_name(p.name + ".sha256").unlink()


def _sidecar_garbage(p: Path):
    p.with_name(p.name + ".sha256").write_text("not a digest\n")


def _sidecar_for_other_file(p: Path):
    side = p.with_name(p.name + ".sha256")
    side.write_text(side.read_text().replace(p.name, "other.bin"))


MUTATIONS = [_flip, _truncate, _append, _sidecar_other_digest, _sidecar_missing, _sidecar_garbage,
             _sidecar_for_other_file]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("mutate", MUTATIONS, ids=lambda f: f.__name__.strip("_"))
def test_corruption_is_detected_by_every_reader(store, tmp_path, mutate, reader):
    data = os.urandom(3 * CHUNK + 17)
    store.put_bytes("a/obj.bin", data)
    mutate(tmp_path / "store" / "a" / "obj.bin")
    with pytest.raises(ArtifactCorrupted, match="a/obj.bin"):
        read(store, reader, "a/obj.bin", tmp_path)
    out_dir = tmp_path / "out"
    assert not out_dir.exists() or os.listdir(out_dir) == []  # get_file published nothing, left no temp


@pytest.mark.parametrize("helper_thread", [False, True], ids=["inline-hash", "helper-thread-hash"])
@pytest.mark.parametrize("reader", READERS)
def test_large_objects_verify_with_either_hashing_mode(store, tmp_path, monkeypatch, reader, helper_thread):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: helper_thread and n >= OVERLAP_MIN)
    data = os.urandom(OVERLAP_MIN + 12345)
    store.put_bytes("big", data)
    assert read(store, reader, "big", tmp_path) == data
    _flip(tmp_path / "store" / "big")
    with pytest.raises(ArtifactCorrupted):
        read(store, reader, "big", tmp_path)


def test_iter_chunks_withholds_last_chunk_until_verified(store, tmp_path):
    data = os.urandom(10 * 4096)
    store.put_bytes("k", data)
    _flip(tmp_path / "store" / "k")
    received = []
    with pytest.raises(ArtifactCorrupted):
        for chunk in store.iter_chunks("k", chunk_size=4096):
            received.append(chunk)
    assert sum(map(len, received)) == len(data) - 4096


def test_get_file_keeps_previous_dest_on_corruption(store, tmp_path):
    store.put_bytes("k", b"good")
    dest = tmp_path / "dest.bin"
    store.get_file("k", dest)
    store.put_bytes("k", b"other bytes")
    _flip(tmp_path / "store" / "k")
    with pytest.raises(ArtifactCorrupted):
        store.get_file("k", dest, durable=True)
    assert dest.read_bytes() == b"good"
    assert set(os.listdir(tmp_path)) == {"store", "dest.bin"}  # no temp file left beside dest


def test_stat_raises_and_list_flags_a_missing_digest(store, tmp_path):
    store.put_bytes("k", b"x")
    _sidecar_missing(tmp_path / "store" / "k")
    with pytest.raises(ArtifactCorrupted):
        store.stat("k")
    [info] = store.list()
    assert (info.key, info.sha256, info.size) == ("k", "", 1) and "no valid sha256" in info.corruption


#: objects without a valid record, made behind the store's back: (what, how to make it under the root)
UNRECORDED = [
    ("written by hand", lambda root: _plant(root / "runs/r1/rollouts/mine.jsonl", b"{}\n")),
    ("sidecar deleted", lambda root: (root / "runs/r1/rollouts/p0.jsonl.sha256").unlink()),
    ("sidecar garbage", lambda root: (root / "runs/r1/rollouts/p0.jsonl.sha256").write_text("not a digest\n")),
    ("sidecar is a directory", lambda root: _plant(root / "runs/r1/rollouts/mine.jsonl", b"{}\n",
                                                   sidecar_dir=True)),
    ("sidecar is a FIFO", lambda root: _plant(root / "runs/r1/rollouts/mine.jsonl", b"{}\n", sidecar_fifo=True)),
    ("killed first write (bytes renamed, record not)", lambda root: _plant(root / "runs/r1/rollouts/mine.jsonl",
                                                                           b"{}\n")),
]


def _plant(path: Path, data: bytes, *, sidecar_dir: bool = False, sidecar_fifo: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    side = path.with_name(path.name + ".sha256")
    if sidecar_dir:
        side.mkdir()
    if sidecar_fifo:
        os.mkfifo(side)


@pytest.mark.parametrize("make", [m for _, m in UNRECORDED], ids=[w for w, _ in UNRECORDED])
def test_one_object_without_a_digest_does_not_fail_a_listing(store, tmp_path, make):
    """Defect: `list("runs/")` raised for the whole listing, and the embedded stack (which lists at
    start-up) would not start. Now the object is listed, flagged; reading it still raises the fix."""
    good = {k: store.put_bytes(k, k.encode()) for k in ["runs/r1/manifest.json", "runs/r1/rollouts/p0.jsonl",
                                                        "runs/r2/manifest.json"]}
    make(tmp_path / "store")
    listed = {i.key: i for i in store.list("runs/")}
    bad = [i for i in listed.values() if i.corruption]
    assert len(bad) == 1 and bad[0].sha256 == "" and "no valid sha256" in bad[0].corruption
    assert {k: v for k, v in listed.items() if not v.corruption} == {k: v for k, v in good.items()
                                                                     if k != bad[0].key}
    for read in (store.get_bytes, store.stat, lambda k: list(store.iter_chunks(k))):
        with pytest.raises(ArtifactCorrupted, match="no valid sha256.*rewrite it"):
            read(bad[0].key)
    assert store.exists(bad[0].key)
    assert store.list_dirs("runs/") == ["r1", "r2"]


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("op", [
    lambda s, p: s.get_bytes("missing"),
    lambda s, p: s.get_file("missing", p / "x"),
    lambda s, p: list(s.iter_chunks("missing")),
    lambda s, p: s.stat("missing"),
    lambda s, p: s.get_bytes("no/such/dir/obj"),
])
def test_missing_object_is_not_found(store, tmp_path, op):
    store.put_bytes("present", b"x")
    with pytest.raises(NotFound, match="missing|no/such"):
        op(store, tmp_path)
    assert not (tmp_path / "x").exists()


def test_missing_root_is_not_found_and_exists_false(tmp_path):
    store = open_store((tmp_path / "never-created").as_uri())
    with pytest.raises(NotFound):
        store.get_bytes("k")
    assert store.exists("k") is False and store.list() == []
    store.delete("k")  # idempotent, no error


@pytest.mark.parametrize("op", [
    lambda s, p: s.put_bytes("../escape", b"x"),
    lambda s, p: s.put_file("/abs", p / "f"),
    lambda s, p: s.put_stream("a//b", [b"x"]),
    lambda s, p: s.get_bytes("a\\b"),
    lambda s, p: s.get_file("a/../../etc/passwd", p / "f"),
    lambda s, p: s.iter_chunks("x.sha256"),
    lambda s, p: s.stat(""),
    lambda s, p: s.exists("a/.trace-lock"),
    lambda s, p: s.delete("a/\x00"),
    lambda s, p: s.uri_for("/x"),
])
def test_bad_keys_are_rejected_before_any_io(store, tmp_path, op):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(InvalidArgument) as exc:
        op(store, tmp_path)
    assert exc.value.field == "key"
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(("op", "field"), [
    (lambda s, p: s.put_bytes("k", "text"), "data"),
    (lambda s, p: s.put_file("k", p / "nope"), "path"),
    (lambda s, p: s.put_file("k", p), "path"),
    (lambda s, p: s.put_stream("k", 42), "chunks"),
    (lambda s, p: s.put_stream("k", [b"ok", "text"]), "chunks[1]"),
    (lambda s, p: s.get_file("k", p), "dest_path"),
    (lambda s, p: s.iter_chunks("k", chunk_size=0), "chunk_size"),
    (lambda s, p: s.list("../x"), "prefix"),
])
def test_bad_arguments_name_the_field(store, tmp_path, op, field):
    store.put_bytes("k", b"existing")
    with pytest.raises(InvalidArgument) as exc:
        op(store, tmp_path)
    assert exc.value.field == field
    assert store.get_bytes("k") == b"existing"


@pytest.mark.parametrize(("first", "second"), [("a", "a/b"), ("a/b", "a")])
def test_object_and_prefix_conflict_is_failed_precondition(store, first, second):
    store.put_bytes(first, b"1")
    with pytest.raises(FailedPrecondition, match="cannot hold both"):
        store.put_bytes(second, b"2")
    assert store.get_bytes(first) == b"1"


@pytest.mark.parametrize(("key", "rule"), [
    ("runs/x.sha256/b", "segments ending in '.sha256'"),
    ("a.sha256/b/c", "segments ending in '.sha256'"),
    ("runs/x.sha256", "segments ending in '.sha256'"),
    ("runs/\udcff", "not valid UTF-8"),
    ("runs/\udcff/manifest.json", "not valid UTF-8"),
    ("\ud800x", "not valid UTF-8"),
])
@pytest.mark.parametrize("op", ["put_bytes", "get_bytes", "stat", "exists", "delete", "uri_for"])
def test_keys_the_file_layout_cannot_hold_are_refused(store, tmp_path, key, rule, op):
    """Defect: a `.sha256` segment inside a key (`runs/x.sha256/b`) made the sidecar path of
    `runs/x` a directory; a lone surrogate (`tracectl report $'\\xff'`) raised UnicodeEncodeError
    from the file URI. Both are InvalidArgument naming the key and the rule, before any I/O."""
    with pytest.raises(InvalidArgument) as exc:
        if op == "put_bytes":
            store.put_bytes(key, b"x")
        else:
            getattr(store, op)(key)
    assert exc.value.field == "key" and rule in str(exc.value) and repr(key)[1:-1] in str(exc.value)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("op", ["list", "list_dirs"])
def test_a_prefix_that_is_not_utf8_is_refused(store, tmp_path, op):
    with pytest.raises(InvalidArgument) as exc:
        getattr(store, op)("runs/\udcff/")
    assert exc.value.field == "prefix"


def _old_store_wrote(root: Path, key: str, data: bytes, *, sidecar: bool = True) -> None:
    """Put `key` in the tree as a store before key rule 'no segment ends in .sha256' did."""
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if sidecar:
        path.with_name(path.name + ".sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")


@pytest.mark.parametrize("op", [
    lambda s, p: s.put_bytes("runs/x", b"new"),
    lambda s, p: s.put_file("runs/x", p / "src"),
    lambda s, p: s.put_stream("runs/x", [b"new"]),
])
def test_writing_beside_a_legacy_sidecar_directory_is_failed_precondition(store, tmp_path, op):
    """Defect: with `runs/x.sha256/b` stored, writing `runs/x` published its bytes, then raised a raw
    IsADirectoryError renaming the sidecar, leaving `runs/x` with no record."""
    root = tmp_path / "store"
    _old_store_wrote(root, "runs/x.sha256/b", b"b")
    (tmp_path / "src").write_bytes(b"new")
    with pytest.raises(FailedPrecondition, match="x.sha256"):
        op(store, tmp_path)
    assert not (root / "runs/x").exists()  # nothing published
    assert sorted(p.name for p in (root / "runs").iterdir()) == [".trace-lock", "x.sha256"]


@pytest.mark.parametrize(("op", "outcome"), [
    (lambda s: s.get_bytes("runs/x"), ArtifactCorrupted),
    (lambda s: list(s.iter_chunks("runs/x")), ArtifactCorrupted),
    (lambda s: s.stat("runs/x"), ArtifactCorrupted),
    (lambda s: s.exists("runs/x"), True),
    (lambda s: [(i.key, bool(i.corruption)) for i in s.list("runs/")], [("runs/r1/m.json", False),
                                                                         ("runs/x", True)]),
    (lambda s: s.list_dirs("runs/"), ["r1"]),
    (lambda s: (s.delete("runs/x"), s.exists("runs/x")), (None, False)),
])
def test_a_tree_left_by_the_old_key_rule_reads_as_domain_errors(store, tmp_path, op, outcome):
    """What the old defect left behind (`runs/x` without a record beside the directory
    `runs/x.sha256/`) reads as ArtifactCorrupted with its fix, never a raw IsADirectoryError; the
    unaddressable `runs/x.sha256/b` is left out of listings."""
    root = tmp_path / "store"
    store.put_bytes("runs/r1/m.json", b"{}")
    _old_store_wrote(root, "runs/x.sha256/b", b"b")
    _old_store_wrote(root, "runs/x", b"x", sidecar=False)
    if isinstance(outcome, type):
        with pytest.raises(outcome, match="no valid sha256.*rewrite it"):
            op(store)
    else:
        assert op(store) == outcome


def test_failed_write_leaves_previous_object_and_no_temp(store, tmp_path):
    store.put_bytes("k", b"previous")

    def chunks():
        yield b"partial"
        raise OSError("source broke")

    with pytest.raises(OSError, match="source broke"):
        store.put_stream("k", chunks())
    assert store.get_bytes("k") == b"previous"
    assert sorted(os.listdir(tmp_path / "store")) == [".trace-lock", "k", "k.sha256"]


# --------------------------------------------------------------------------- listing / delete

KEYS = ["runs/r1/manifest.json", "runs/r1/rollouts/p0.jsonl", "runs/r1/rollouts/p1.jsonl", "runs/r10/m.json",
        "runs/r2/m.json", "top.txt"]


@pytest.mark.parametrize(("prefix", "expected"), [
    ("", KEYS),
    ("runs/", KEYS[:5]),
    ("runs/r1", KEYS[:4]),
    ("runs/r1/", KEYS[:3]),
    ("runs/r1/rollouts/p", KEYS[1:3]),
    ("runs/r1/rollouts/p1.jsonl", KEYS[2:3]),
    ("runs/r3", []),
    ("nothing/here/", []),
])
def test_list_is_a_string_prefix_match_sorted(store, prefix, expected):
    for k in reversed(KEYS):
        store.put_bytes(k, k.encode())
    infos = store.list(prefix)
    assert [i.key for i in infos] == expected
    assert all(i == store.stat(i.key) for i in infos)


@pytest.mark.parametrize(("prefix", "expected"), [
    ("", ["runs"]),
    ("runs/", ["r1", "r10", "r2"]),
    ("runs/r1/", ["rollouts"]),
    ("runs/r1/rollouts/", []),
    ("runs/r3/", []),
])
def test_list_dirs_names_the_directories_directly_under_a_prefix(store, tmp_path, prefix, expected):
    for k in KEYS:
        store.put_bytes(k, k.encode())
    (tmp_path / "store" / "runs" / "r1" / "linked").symlink_to(tmp_path / "store" / "runs" / "r2")
    assert store.list_dirs(prefix) == expected
    with pytest.raises(InvalidArgument, match="ending in '/'"):
        store.list_dirs("runs")


def test_delete_removes_object_and_sidecar_and_is_idempotent(store, tmp_path):
    store.put_bytes("d/k", b"x")
    store.delete("d/k")
    store.delete("d/k")
    assert not store.exists("d/k")
    assert os.listdir(tmp_path / "store" / "d") == [".trace-lock"]
    with pytest.raises(NotFound):
        store.get_bytes("d/k")


# --------------------------------------------------------------------------- observer

def test_observer_sees_every_operation_with_outcome_and_bytes(tmp_path):
    calls = []
    store = open_store((tmp_path / "s").as_uri(), observer=lambda *a: calls.append(a))
    store.put_bytes("k", b"12345")
    store.get_bytes("k")
    list(store.iter_chunks("k"))
    store.stat("k")
    store.exists("k")
    store.list()
    with pytest.raises(NotFound):
        store.get_bytes("missing")
    with pytest.raises(InvalidArgument):
        store.get_bytes("../x")
    it = store.iter_chunks("k", chunk_size=1)
    next(it)
    it.close()
    _flip(tmp_path / "s" / "k")
    with pytest.raises(ArtifactCorrupted):
        store.get_bytes("k")
    store.delete("k")
    got = [(op, backend, outcome, n) for op, backend, outcome, n, seconds in calls]
    assert all(c[4] >= 0 for c in calls)
    assert got == [
        ("put_bytes", "file", "ok", 5), ("get_bytes", "file", "ok", 5), ("iter_chunks", "file", "ok", 5),
        ("stat", "file", "ok", 0), ("exists", "file", "ok", 0), ("list", "file", "ok", 0),
        ("get_bytes", "file", "not_found", 0), ("get_bytes", "file", "invalid_argument", 0),
        ("iter_chunks", "file", "abandoned", 1), ("get_bytes", "file", "corrupted", 0), ("delete", "file", "ok", 0),
    ]


def test_broken_observer_does_not_fail_the_operation(tmp_path, caplog):
    def observer(*args):
        raise ValueError("metrics backend down")

    store = open_store((tmp_path / "s").as_uri(), observer=observer)
    assert store.put_bytes("k", b"x").size == 1
    assert store.get_bytes("k") == b"x"
    assert "observer failed" in caplog.text


# --------------------------------------------------------------------------- memory

BIG = 24 * CHUNK


@pytest.mark.parametrize("op", ["put_file", "put_stream", "get_file", "iter_chunks"])
def test_streaming_operations_use_bounded_memory(store, tmp_path, monkeypatch, op):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: True)  # its block ring is the bigger footprint
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(BIG // CHUNK):
            f.write(os.urandom(CHUNK))
    if op.startswith("get") or op == "iter_chunks":
        store.put_file("big", src)

    def stream_file():
        with open(src, "rb") as f:
            while chunk := f.read(256 * 1024):
                yield chunk

    tracemalloc.start()
    try:
        if op == "put_file":
            store.put_file("big", src)
        elif op == "put_stream":
            store.put_stream("big", stream_file())
        elif op == "get_file":
            store.get_file("big", tmp_path / "out.bin")
        else:
            for _ in store.iter_chunks("big"):
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * CHUNK, f"{op} peaked at {peak / CHUNK:.1f} MiB for a {BIG // CHUNK} MiB object"
    assert store.stat("big").size == BIG


@pytest.mark.parametrize(("nbytes", "cores", "load", "expected"), [
    (OVERLAP_MIN - 1, 16, 0.0, False),  # small: on a busy machine the hand-offs cost more than they hide
    (OVERLAP_MIN, 16, 0.0, True),
    (OVERLAP_MIN, 2, 0.5, True),
    (OVERLAP_MIN, 2, 7.0, True),  # busy cores: still overlapped (never slower in wall time, bench/README.md)
    (256 * CHUNK, 2, 1.5, True),
    (OVERLAP_MIN, 1, 0.0, False),  # one core: nothing to overlap with
])
def test_helper_thread_for_reads_of_overlap_min_or_more_on_two_or_more_cores(monkeypatch, nbytes, cores, load, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert integrity.use_helper_thread(nbytes) is expected


def test_store_works_when_root_is_given_with_trailing_slash_and_spaces(tmp_path):
    root = tmp_path / "with space"
    store = open_store(root.as_uri() + "/")
    info = store.put_bytes("a b/c d.txt", b"x")
    assert info.uri == (root / "a b" / "c d.txt").as_uri()
    shutil.rmtree(root)
    assert not store.exists("a b/c d.txt")
