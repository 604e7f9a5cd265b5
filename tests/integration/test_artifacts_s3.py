"""The artifact store against a real S3 server (`rclone serve s3`), side by side with the file
backend: the same behavioural cases run on every backend variant.

Backend variants:
  file            the embedded default
  s3              default settings: one streamed PUT per object (signed with the artifact digest)
  s3-multipart    multipart_threshold = part_size = 5 MiB, so the 12 MiB objects go multipart
  s3-sdk-path     the store's fallback through the SDK's public put_object (as if the SDK
                  internals the fast path needs had changed)
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import minio.api
import pytest

from tests.support.s3 import CuttingProxy, S3Server, start_rclone_s3
from trace_common.artifacts import S3Settings, integrity, open_store, s3_store
from trace_common.artifacts.integrity import OVERLAP_MIN
from trace_common.errors import (
    ArtifactCorrupted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
)

pytestmark = pytest.mark.integration

KiB, MiB = 1 << 10, 1 << 20
BACKENDS = ["file", "s3", "s3-multipart", "s3-sdk-path"]


@dataclass
class Env:
    name: str
    store: object
    corrupt: object  # corrupt(key, new_bytes, keep_digest=True): replace the bytes behind the store's back
    reopen: object  # reopen(observer) -> a store on the same root with that observer
    part_size: int = 0


def small_settings(server: S3Server, **overrides) -> S3Settings:
    base = server.settings.model_dump()
    base["secret_key"] = server.secret_key
    return S3Settings(**{**base, "stream_buffer": 1 * MiB, **overrides})


@pytest.fixture(params=BACKENDS)
def env(request, tmp_path, monkeypatch) -> Env:
    if request.param == "file":
        root = tmp_path / "store"
        store = open_store(root.as_uri())

        def corrupt(key: str, data: bytes, keep_digest: bool = True) -> None:
            (root / key).write_bytes(data)
            if not keep_digest:
                (root / (key + ".sha256")).unlink()

        return Env("file", store, corrupt, lambda observer: open_store(root.as_uri(), observer=observer))

    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.make_bucket()
    overrides = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB} if request.param == "s3-multipart" else {}
    if request.param == "s3-sdk-path":
        monkeypatch.setattr(s3_store, "FAST_PATH", False)
        overrides = {"part_size": 5 * MiB, "multipart_threshold": 5 * MiB}
    settings = small_settings(server, **overrides)
    store = open_store(f"s3://{bucket}/pre", s3=settings)
    client = server.client()

    def corrupt(key: str, data: bytes, keep_digest: bool = True) -> None:
        meta = {"sha256": store.stat(key).sha256} if keep_digest else None
        client.put_object(bucket, f"pre/{key}", io.BytesIO(data), len(data), metadata=meta)

    return Env(request.param, store, corrupt,
               lambda observer: open_store(f"s3://{bucket}/pre", s3=settings, observer=observer),
               overrides.get("part_size", 0))


def payload(size: int) -> bytes:
    return os.urandom(size)


def write(store, how: str, key: str, data: bytes, tmp_path: Path):
    if how == "put_bytes":
        return store.put_bytes(key, data)
    if how == "put_file":
        src = tmp_path / "src.bin"
        src.write_bytes(data)
        return store.put_file(key, src)
    return store.put_stream(key, (data[i:i + 300 * KiB] for i in range(0, len(data), 300 * KiB)))


def read(store, how: str, key: str, tmp_path: Path) -> bytes:
    if how == "get_bytes":
        return store.get_bytes(key)
    if how == "get_file":
        dest = tmp_path / "out" / "dest.bin"
        store.get_file(key, dest)
        return dest.read_bytes()
    return b"".join(store.iter_chunks(key, chunk_size=256 * KiB))


@pytest.mark.parametrize("size", [0, 1 * KiB, 12 * MiB])
@pytest.mark.parametrize("reader", ["get_bytes", "get_file", "iter_chunks"])
@pytest.mark.parametrize("writer", ["put_bytes", "put_file", "put_stream"])
def test_round_trip(env, tmp_path, monkeypatch, writer, reader, size):
    # alternate the read hashing mode across cases so both run against every backend
    helper = (writer == "put_file") == (reader == "get_file")
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: helper)
    data = payload(size)
    info = write(env.store, writer, "runs/r1/obj.bin", data, tmp_path)
    assert (info.size, info.sha256) == (size, hashlib.sha256(data).hexdigest())
    assert read(env.store, reader, "runs/r1/obj.bin", tmp_path) == data
    assert env.store.stat("runs/r1/obj.bin") == info
    assert env.store.list("runs/") == [info]


CORRUPTIONS = [  # (size, hashing overlapped with the transfer, byte changed: first | middle | last)
    (OVERLAP_MIN - 1, False, "last"),
    (2 * MiB, True, "first"),
    (2 * MiB, False, "middle"),
    (2 * MiB + 1, True, "last"),
    (12 * MiB + 5, True, "middle"),
    (12 * MiB + 5, False, "last"),
]


@pytest.mark.parametrize(("size", "overlap", "where"), CORRUPTIONS,
                         ids=[f"{s}B-{'overlap' if o else 'inline'}-{w}" for s, o, w in CORRUPTIONS])
@pytest.mark.parametrize("reader", ["get_bytes", "get_file", "iter_chunks"])
def test_bytes_changed_behind_the_stores_back_are_detected(env, tmp_path, monkeypatch, reader, size, overlap, where):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: overlap)
    data = payload(size)
    env.store.put_bytes("a/obj.bin", data)
    at = {"first": 0, "middle": size // 2, "last": size - 1}[where]
    env.corrupt("a/obj.bin", data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
    with pytest.raises(ArtifactCorrupted, match="a/obj.bin"):
        read(env.store, reader, "a/obj.bin", tmp_path)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
@pytest.mark.parametrize("reader", ["get_bytes", "get_file", "iter_chunks"])
def test_object_without_a_digest_is_refused(env, tmp_path, monkeypatch, reader, overlap):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: overlap)
    data = payload(2 * MiB)
    env.store.put_bytes("a/obj.bin", data)
    env.corrupt("a/obj.bin", data, keep_digest=False)
    with pytest.raises(ArtifactCorrupted, match="no valid sha256"):
        read(env.store, reader, "a/obj.bin", tmp_path)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("op", ["get_bytes", "get_file", "iter_chunks", "stat"])
def test_missing_key_is_not_found(env, tmp_path, op):
    env.store.put_bytes("present", b"x")
    with pytest.raises(NotFound, match="missing"):
        if op == "get_file":
            env.store.get_file("missing", tmp_path / "x")
        elif op == "iter_chunks":
            list(env.store.iter_chunks("missing"))
        else:
            getattr(env.store, op)("missing")
    assert env.store.exists("missing") is False and env.store.exists("present") is True
    env.store.delete("missing")  # deleting an absent key is fine


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a\\b", "x.sha256", ""])
def test_bad_key_is_invalid_argument(env, key):
    with pytest.raises(InvalidArgument) as exc:
        env.store.put_bytes(key, b"x")
    assert exc.value.field == "key"


def test_overwrite_list_delete(env):
    for k in ["runs/r1/a", "runs/r1/b", "runs/r2/a"]:
        env.store.put_bytes(k, b"first " + k.encode())
    env.store.put_bytes("runs/r1/a", b"second")
    assert env.store.get_bytes("runs/r1/a") == b"second"
    assert [i.key for i in env.store.list("runs/r1")] == ["runs/r1/a", "runs/r1/b"]
    assert [i.key for i in env.store.list()] == ["runs/r1/a", "runs/r1/b", "runs/r2/a"]
    env.store.delete("runs/r1/a")
    assert [i.key for i in env.store.list("runs/")] == ["runs/r1/b", "runs/r2/a"]


def test_one_object_without_a_digest_is_listed_flagged_not_fatal(env, tmp_path):
    """Defect: listing raised ArtifactCorrupted for the whole listing when one object had no
    recorded digest (written by `mc cp` or `cp`, or whose record was lost), and the environment
    service, which lists at start-up, stopped the embedded stack. Every backend now lists it
    flagged (`corruption`, sha256 "") beside the others; reading it still raises the fix."""
    good = {k: env.store.put_bytes(k, k.encode()) for k in ["runs/r1/manifest.json", "runs/r1/rollouts/a.jsonl",
                                                            "runs/r2/manifest.json"]}
    env.store.put_bytes("runs/r1/rollouts/mine.jsonl", b"{}")
    env.corrupt("runs/r1/rollouts/mine.jsonl", b"{}\n", keep_digest=False)
    listed = env.store.list("runs/")
    assert [i.key for i in listed] == ["runs/r1/manifest.json", "runs/r1/rollouts/a.jsonl",
                                       "runs/r1/rollouts/mine.jsonl", "runs/r2/manifest.json"]
    bad = listed[2]
    assert (bad.sha256, bad.size) == ("", 3) and "no valid sha256" in bad.corruption
    assert [i for i in listed if not i.corruption] == sorted(good.values(), key=lambda i: i.key)
    for reader in ("get_bytes", "get_file", "iter_chunks"):
        with pytest.raises(ArtifactCorrupted, match="no valid sha256.*rewrite it"):
            read(env.store, reader, bad.key, tmp_path)
    with pytest.raises(ArtifactCorrupted, match="no valid sha256"):
        env.store.stat(bad.key)
    assert env.store.exists(bad.key)
    env.store.put_bytes(bad.key, b"rewritten")  # the fix the message gives
    assert not any(i.corruption for i in env.store.list("runs/"))


@pytest.mark.parametrize(("key", "rule"), [
    ("runs/x.sha256/b", "segments ending in '.sha256'"),
    ("runs/x.sha256", "segments ending in '.sha256'"),
    ("runs/\udcff/manifest.json", "not valid UTF-8"),
])
@pytest.mark.parametrize("op", ["put_bytes", "get_bytes", "stat", "exists", "delete", "uri_for"])
def test_keys_one_backend_cannot_hold_are_refused_by_every_backend(env, key, rule, op):
    """Defect: S3 stored `runs/x.sha256/b` and `runs/x` side by side where the file backend could
    not (its sidecar of `runs/x` is `runs/x.sha256`), and a key with a lone surrogate raised
    UnicodeEncodeError. Every backend refuses both the same way, before any request."""
    with pytest.raises(InvalidArgument) as exc:
        if op == "put_bytes":
            env.store.put_bytes(key, b"x")
        else:
            getattr(env.store, op)(key)
    assert exc.value.field == "key" and rule in str(exc.value)
    assert env.store.list() == []


@pytest.mark.parametrize(("prefix", "expected"), [
    ("", ["runs", "top"]),
    ("runs/", ["r1", "r10", "r2"]),
    ("runs/r1/", ["environments", "rollouts"]),
    ("runs/r1/rollouts/", []),
    ("nothing/", []),
])
def test_list_dirs_names_the_same_directories_on_every_backend(env, prefix, expected):
    for k in ["runs/r1/manifest.json", "runs/r1/rollouts/p0.jsonl", "runs/r1/environments/c/v1/manifest.json",
              "runs/r10/m.json", "runs/r2/m.json", "top/x", "top.txt"]:
        env.store.put_bytes(k, b"x")
    assert env.store.list_dirs(prefix) == expected


def test_concurrent_writers_to_one_key_never_mix(env):
    """Every read returns exactly one writer's complete bytes or fails loudly.

    rclone serve s3 (the test server) is not atomic under concurrent overwrites of one key:
    a GET can carry one version's Content-Length or metadata and another version's body.
    The store reads such a body again (`S3Store._reread`); when every re-read races a write
    too it must raise (Unavailable for a short body, ArtifactCorrupted for a digest that does
    not match) instead of returning anything; the file backend must never fail."""
    payloads = [bytes([i + 1]) * (300 * KiB + i) for i in range(3)]
    tolerated = (ArtifactCorrupted, Unavailable) if env.name.startswith("s3") else ()
    done = threading.Event()
    reads, refused = [], []

    def reader():
        while not done.is_set():
            try:
                reads.append(env.store.get_bytes("shared"))
            except NotFound:
                pass
            except tolerated as exc:
                refused.append(exc)

    with ThreadPoolExecutor(4) as pool:
        r = pool.submit(reader)
        writers = [pool.submit(lambda p=p: [env.store.put_bytes("shared", p) for _ in range(5)]) for p in payloads]
        for w in writers:
            w.result()
        done.set()
        r.result()
    # How many concurrent reads rclone spoils depends on scheduling (CI once saw 4 refused to
    # 3 clean), so only the property is asserted: nothing mixed was ever returned, and once
    # the writers are done a read returns one writer's complete bytes.
    assert reads or refused
    assert all(x in payloads for x in reads)
    assert env.store.get_bytes("shared") in payloads


BIG = 40 * MiB


@pytest.mark.parametrize("op", ["put_file", "put_stream", "get_file", "iter_chunks"])
def test_streaming_operations_use_bounded_memory(env, tmp_path, monkeypatch, op):
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: True)  # its block ring is the bigger footprint
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(BIG // MiB):
            f.write(os.urandom(MiB))
    if op in ("get_file", "iter_chunks"):
        env.store.put_file("big", src)

    def stream():
        with open(src, "rb") as f:
            while chunk := f.read(256 * KiB):
                yield chunk

    tracemalloc.start()
    try:
        if op == "put_file":
            env.store.put_file("big", src)
        elif op == "put_stream":
            env.store.put_stream("big", stream())
        elif op == "get_file":
            env.store.get_file("big", tmp_path / "out.bin")
        else:
            for _ in env.store.iter_chunks("big"):
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Multipart uploads hold whole parts in memory, through the SDK's put_object: 2 parts in
    # flight, 1 a finished worker still references until it takes its next task, and the part
    # being read, which read_part_data briefly holds three times (the read, `one_byte + data`,
    # and the `[:-1]` slice). That is up to 6 parts; CI once measured 5.0 (25.0 MiB) against an
    # earlier bound of 4. An upload holding the whole object would still exceed the bound:
    # 4 MiB + 6 x 5 MiB = 34 MiB < BIG = 40 MiB.
    bound = 4 * MiB + (6 * env.part_size if op.startswith("put") else 0)
    assert bound < BIG, "the bound must stay below the object size, or the test could not fail"
    assert peak < bound, f"{op} peaked at {peak / MiB:.1f} MiB for a {BIG // MiB} MiB object"
    assert env.store.stat("big").size == BIG


def test_observer_reports_backend(env):
    calls = []
    store = env.reopen(lambda *a: calls.append(a))
    store.put_bytes("k", b"abc")
    store.get_bytes("k")
    with pytest.raises(NotFound):
        store.get_bytes("nope")
    backend = "file" if env.name == "file" else "s3"
    assert [c[:4] for c in calls] == [("put_bytes", backend, "ok", 3), ("get_bytes", backend, "ok", 3),
                                      ("get_bytes", backend, "not_found", 0)]


# --------------------------------------------------------------------------- S3 only

def _sdk_hashed_bytes(monkeypatch) -> list[int]:
    seen: list[int] = []
    original = minio.api.sha256_hash

    def counting(data):
        seen.append(len(data) if data else 0)
        return original(data)

    monkeypatch.setattr(minio.api, "sha256_hash", counting)
    return seen


@pytest.mark.parametrize(("fast", "op"), [(True, "put_bytes"), (True, "put_file"), (False, "put_bytes")])
def test_fast_path_hashes_each_byte_once(s3_server, tmp_path, monkeypatch, fast, op):
    """The SDK signs with the store's digest instead of hashing the body again; the fallback
    (public put_object) does hash it again, which is what the fast path exists to avoid."""
    monkeypatch.setattr(s3_store, "FAST_PATH", fast)
    store = open_store(f"s3://{s3_server.make_bucket()}", s3=small_settings(s3_server))
    data = payload(3 * MiB)
    seen = _sdk_hashed_bytes(monkeypatch)
    if op == "put_bytes":
        store.put_bytes("k", data)
    else:
        (tmp_path / "f").write_bytes(data)
        store.put_file("k", tmp_path / "f")
    assert (sum(seen) < 1024) is fast, seen
    assert store.get_bytes("k") == data


@pytest.mark.parametrize("variant", ["single-put", "multipart", "multipart-content-check"])
def test_source_changed_after_hashing_is_refused_and_nothing_is_stored(s3_server, tmp_path, monkeypatch, variant):
    """A file rewritten between hashing and sending must not be stored under the stale digest:
    the upload is aborted before its last byte and the key stays absent. The file's stat
    fingerprint catches it first; `multipart-content-check` blinds that check (as a write
    within one timestamp tick would) to show the multipart path re-hashes what it sends."""
    overrides = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB} if variant.startswith("multipart") else {}
    if variant == "multipart-content-check":
        monkeypatch.setattr(s3_store, "fingerprint", lambda st: (st.st_dev, st.st_ino, st.st_size))
    store = open_store(f"s3://{s3_server.make_bucket()}", s3=small_settings(s3_server, **overrides))
    src = tmp_path / "f"
    src.write_bytes(payload(12 * MiB))
    real = s3_store.sha256_file

    def hash_then_rewrite(path):
        result = real(path)
        with open(path, "r+b") as f:  # same size, different bytes, same inode
            f.seek(6 * MiB)
            f.write(b"changed")
        return result

    monkeypatch.setattr(s3_store, "sha256_file", hash_then_rewrite)
    with pytest.raises(FailedPrecondition, match="changed"):
        store.put_file("k", src)
    assert store.exists("k") is False


def test_server_down_is_unavailable_with_endpoint(tmp_path):
    server = start_rclone_s3(tmp_path / "data")
    try:
        settings = S3Settings(endpoint=server.endpoint, access_key=server.access_key, secret_key=server.secret_key,
                              max_retries=0, connect_timeout_s=2)
        store = open_store(f"s3://{server.make_bucket()}", s3=settings)
        store.put_bytes("k", b"x")
    finally:
        server.stop()
    for op in (lambda: store.get_bytes("k"), lambda: store.put_bytes("k", b"y"), lambda: store.stat("k"),
               lambda: store.list(), lambda: list(store.iter_chunks("k")), lambda: store.delete("k"),
               lambda: store.get_file("k", tmp_path / "out")):
        with pytest.raises(Unavailable, match=server.endpoint):
            op()
    assert not (tmp_path / "out").exists()


def test_missing_bucket_is_failed_precondition(s3_server):
    store = open_store("s3://no-such-bucket-here", s3=small_settings(s3_server))
    with pytest.raises(FailedPrecondition, match="no-such-bucket-here"):
        store.put_bytes("k", b"x")


def test_wrong_credentials_are_unauthenticated(s3_server):
    settings = S3Settings(endpoint=s3_server.endpoint, access_key=s3_server.access_key, secret_key="wrong-secret")
    store = open_store(f"s3://{s3_server.make_bucket()}", s3=settings)
    with pytest.raises(Unauthenticated, match="secret_key"):
        store.put_bytes("k", b"x")


# --------------------------------------------------------------------------- broken transfers

BROKEN_READS = [  # (object size, body bytes the network delivers before it breaks, hashing overlapped)
    (2 * MiB, 0, True),
    (2 * MiB, MiB, False),
    (2 * MiB, MiB + 1, True),
    (2 * MiB, 2 * MiB - 1, True),  # all but the last byte
    (2 * MiB, 2 * MiB - 1, False),
    (12 * MiB, 7 * MiB, True),
]


@pytest.mark.parametrize(("size", "delivered", "overlap"), BROKEN_READS,
                         ids=[f"{s}B-cut-at-{d}-{'overlap' if o else 'inline'}" for s, d, o in BROKEN_READS])
@pytest.mark.parametrize("reader", ["get_bytes", "get_file", "iter_chunks"])
def test_read_broken_mid_transfer_is_unavailable_and_publishes_nothing(s3_server, tmp_path, monkeypatch, reader,
                                                                       size, delivered, overlap):
    """The connection breaks mid-body: the read raises Unavailable, get_file leaves the previous
    destination file untouched and no temp file, iter_chunks never yields the final chunk."""
    monkeypatch.setattr(integrity, "use_helper_thread", lambda n: overlap)
    bucket = s3_server.make_bucket()
    data = payload(size)
    open_store(f"s3://{bucket}", s3=small_settings(s3_server)).put_bytes("k", data)
    dest = tmp_path / "out" / "dest.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"previous download")
    with CuttingProxy(s3_server.endpoint, delivered) as proxy:
        store = open_store(f"s3://{bucket}", s3=small_settings(s3_server, endpoint=proxy.endpoint, max_retries=0))
        received = 0
        with pytest.raises(Unavailable, match="k"):
            if reader == "get_bytes":
                store.get_bytes("k")
            elif reader == "get_file":
                store.get_file("k", dest)
            else:
                for chunk in store.iter_chunks("k", chunk_size=256 * KiB):
                    received += len(chunk)
        assert proxy.cuts == 1
    assert received < size
    assert os.listdir(dest.parent) == ["dest.bin"] and dest.read_bytes() == b"previous download"


REREADS = [  # (reader, max_retries, times the network breaks (None: every body), bytes more each cut,
    #          outcome, bodies cut)
    ("get_bytes", 1, 1, 0, "whole", 1),
    ("get_file", 1, 1, 0, "whole", 1),
    ("get_bytes", 3, 2, 1, "whole", 2),
    ("get_bytes", 3, None, 0, Unavailable, 2),  # the same cut twice: raised at once
    ("get_file", 3, None, 0, Unavailable, 2),
    ("get_bytes", 2, None, 1, Unavailable, 3),  # different cuts: gives up after max_retries re-reads
    ("get_file", 1, None, 1, Unavailable, 2),
    ("get_bytes", 0, 1, 0, Unavailable, 1),  # max_retries=0: no re-read
    ("iter_chunks", 2, 1, 0, Unavailable, 1),  # chunks were handed out already: never re-read
]


def rereads(caplog) -> int:
    return sum("re-reading" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("reader", "retries", "breaks", "step", "outcome", "cuts"), REREADS,
                         ids=[f"{r}-retries-{n}-breaks-{b}-step-{d}" for r, n, b, d, _, _ in REREADS])
def test_a_body_cut_short_is_read_again(s3_server, tmp_path, caplog, reader, retries, breaks, step, outcome, cuts):
    """Whole reads (get_bytes, get_file) read a body that failed again, up to max_retries times,
    until the same failure repeats; nothing is left behind by the attempts."""
    bucket = s3_server.make_bucket()
    data = payload(2 * MiB)
    open_store(f"s3://{bucket}", s3=small_settings(s3_server)).put_bytes("k", data)
    with CuttingProxy(s3_server.endpoint, MiB, max_cuts=breaks, step=step) as proxy:
        store = open_store(f"s3://{bucket}", s3=small_settings(s3_server, endpoint=proxy.endpoint,
                                                               max_retries=retries))
        if outcome == "whole":
            assert read(store, reader, "k", tmp_path) == data
        else:
            with pytest.raises(outcome) as exc:
                read(store, reader, "k", tmp_path)
            assert not isinstance(exc.value.__context__, s3_store._BadBody)  # the store's own wrapper stays inside
        assert proxy.cuts == cuts
    assert rereads(caplog) == (cuts if outcome == "whole" else cuts - 1)
    if reader == "get_file":
        assert os.listdir(tmp_path / "out") == (["dest.bin"] if outcome == "whole" else [])


@pytest.mark.parametrize("damage", ["mismatch", "no-digest"])
@pytest.mark.parametrize("reader", ["get_bytes", "get_file"])
def test_damage_that_repeats_is_raised_after_one_reread(s3_server, tmp_path, caplog, reader, damage):
    bucket = s3_server.make_bucket()
    store = open_store(f"s3://{bucket}", s3=small_settings(s3_server, max_retries=3))
    data = payload(64 * KiB)
    store.put_bytes("k", data)
    meta = {"sha256": store.stat("k").sha256} if damage == "mismatch" else None
    s3_server.client().put_object(bucket, "k", io.BytesIO(data[::-1]), len(data), metadata=meta)
    match = "does not match the recorded" if damage == "mismatch" else "no valid sha256"
    with pytest.raises(ArtifactCorrupted, match=match):
        read(store, reader, "k", tmp_path)
    assert rereads(caplog) == 1


def test_failures_before_the_body_are_not_reread(s3_server, tmp_path, caplog):
    """A missing key and a server that is down fail as before (the SDK's pool retries the
    latter); neither is re-read by the store."""
    bucket = s3_server.make_bucket()
    store = open_store(f"s3://{bucket}", s3=small_settings(s3_server, max_retries=2))
    for reader in ("get_bytes", "get_file"):
        with pytest.raises(NotFound):
            read(store, reader, "missing", tmp_path)
    server = start_rclone_s3(tmp_path / "down")
    down = open_store(f"s3://{server.make_bucket()}", s3=small_settings(server, max_retries=1))
    down.put_bytes("k", b"x")
    server.stop()
    for reader in ("get_bytes", "get_file"):
        with pytest.raises(Unavailable, match=server.endpoint):
            read(down, reader, "k", tmp_path)
    assert rereads(caplog) == 0


BROKEN_WRITES = [  # (writer, size, multipart, body bytes the server receives before the network breaks)
    ("put_bytes", 3 * MiB, False, 0),
    ("put_bytes", 3 * MiB, False, 3 * MiB - 1),
    ("put_file", 3 * MiB, False, MiB),
    ("put_stream", 3 * MiB, False, 2 * MiB),
    ("put_file", 12 * MiB, True, MiB),  # breaks inside the first 5 MiB part
    ("put_bytes", 12 * MiB, True, 4 * MiB),
]


@pytest.mark.parametrize(("writer", "size", "multipart", "delivered"), BROKEN_WRITES,
                         ids=[f"{w}-{s}B-{'multipart' if m else 'single'}-cut-at-{d}" for w, s, m, d in BROKEN_WRITES])
@pytest.mark.parametrize("existing", [False, True], ids=["new-key", "overwrite"])
def test_write_broken_mid_transfer_stores_nothing(s3_server, tmp_path, writer, size, multipart, delivered, existing):
    """The connection breaks while the body is sent: the write raises Unavailable and the key
    keeps what it held before (nothing, or the previous version with its digest)."""
    bucket = s3_server.make_bucket()
    overrides = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB} if multipart else {}
    direct = open_store(f"s3://{bucket}", s3=small_settings(s3_server, **overrides))
    old = b"the previous version"
    if existing:
        direct.put_bytes("k", old)
    with CuttingProxy(s3_server.endpoint, delivered, cut_requests=True) as proxy:
        store = open_store(f"s3://{bucket}", s3=small_settings(s3_server, endpoint=proxy.endpoint, max_retries=0,
                                                               **overrides))
        with pytest.raises(Unavailable):
            write(store, writer, "k", payload(size), tmp_path)
        assert proxy.cuts >= 1
    if existing:
        assert direct.get_bytes("k") == old
    else:
        assert direct.exists("k") is False
