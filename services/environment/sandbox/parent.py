"""Parent side of the sandbox: start a worker process, talk JSON Lines to it, contain its failures.

    worker = SandboxWorker(SandboxConfig(...))   # spawns `python -m services.environment.sandbox.worker`
    worker.start()                               # handshake; worker.isolation says which layers hold
    info = worker.call("load", source=text)      # then reset / step / result / solve ...
    worker.close()

Generated environment code never runs in the service process: it runs in the worker,
which locks itself down before reading the first request (see `isolation.py`). What the
parent adds:

- a clean environment for the child (no `TRACE_*` settings, tokens or credentials: only
  PATH, PYTHONPATH to TRACE's sources, HOME/TMPDIR = scratch, locale, a fixed hash seed);
- a per-worker scratch directory (the child's cwd), removed on close;
- a wall-clock deadline per call: past it the worker's process group is killed and the call
  fails with a `timeout` violation -- or `cpu` when the worker was busy computing for most
  of that time (an infinite loop) rather than blocked;
- a cap on each response line (`output` violation) and on the stderr it keeps;
- classification of a dead worker: SIGXCPU -> cpu, SIGKILL not sent by us -> memory (the
  OOM killer), SIGSYS -> syscall, other signals or exit codes -> crash.

Every violation is raised as `SandboxViolation` (a `ResourceExhausted`, so gRPC callers get
RESOURCE_EXHAUSTED) after the worker is killed; an exception raised by environment code is
`EnvironmentCodeError` (FAILED_PRECONDITION) and the worker stays usable. Neither ever
takes the service down. `SandboxWorker` is thread-safe (one call at a time per worker).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trace_common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable

from .. import metrics as m

#: Root of TRACE's sources (what the child needs on PYTHONPATH).
PROJECT_ROOT = Path(__file__).resolve().parents[3]
VIOLATION_KINDS = ("cpu", "memory", "processes", "file_size", "timeout", "network", "output", "filesystem",
                   "limits", "native", "introspection", "environment", "syscall", "crash", "protocol")


class SandboxConfig(BaseModel):
    """Limits and isolation layers of one sandbox worker (see isolation.py for the layers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_seconds: int = Field(300, ge=1, le=86_400, description="Total CPU seconds of a worker (RLIMIT_CPU).")
    memory_mb: int = Field(1024, ge=128, le=1 << 20, description="Address-space limit (RLIMIT_AS) in MiB.")
    file_size_mb: int = Field(16, ge=1, le=1 << 20, description="Largest file the worker may write (RLIMIT_FSIZE).")
    max_processes: int = Field(0, ge=0, le=4096, description="RLIMIT_NPROC of the sandbox uid; 0 forbids fork.")
    open_files: int = Field(64, ge=16, le=65_536, description="RLIMIT_NOFILE.")
    call_timeout_s: float = Field(10.0, gt=0, le=3600, description="Wall-clock deadline of one call.")
    startup_timeout_s: float = Field(30.0, gt=0, le=600, description="Deadline of the startup handshake.")
    max_output_kb: int = Field(1024, ge=4, le=1 << 20, description="Largest response line in KiB.")
    network_namespace: bool = Field(True, description="Unshare a network namespace (root or userns).")
    mount_namespace: bool = Field(True, description="Read-only root except scratch (root only).")
    drop_privileges: bool = Field(True, description="Drop to uid nobody when started as root.")
    seccomp: bool = Field(True, description="Install the seccomp filter.")
    audit_hook: bool = Field(True, description="Install the Python audit hook (typed violation reports).")
    require_network_isolation: bool = Field(
        True, description="Refuse a worker in which no kernel layer (netns or seccomp) blocks the network.")
    plain: bool = Field(False, description="No lockdown at all: benchmark baseline only, never untrusted code.")
    scratch_root: str = Field("", description="Parent directory of per-worker scratch dirs (default: system tmp).")
    hash_seed: int = Field(0, ge=0, le=4_294_967_295, description="PYTHONHASHSEED of the worker.")
    python: str = Field("", description="Interpreter for the worker (default: this one).")

    def worker_json(self, scratch: str) -> str:
        return json.dumps({
            "scratch": scratch,
            "limits": {"cpu_seconds": self.cpu_seconds, "memory_bytes": self.memory_mb << 20,
                       "file_size_bytes": self.file_size_mb << 20, "max_processes": self.max_processes,
                       "open_files": self.open_files},
            "network_namespace": self.network_namespace, "mount_namespace": self.mount_namespace,
            "drop_privileges": self.drop_privileges, "seccomp": self.seccomp, "audit_hook": self.audit_hook,
            "plain": self.plain, "max_output_bytes": self.max_output_kb << 10})


class SandboxViolation(ResourceExhausted):
    """The environment code hit a sandbox limit or tried a forbidden operation."""

    def __init__(self, kind: str, detail: str, *, op: str = ""):
        self.kind, self.detail, self.op = kind, detail, op
        super().__init__(f"sandbox violation ({kind}) during {op or 'startup'}: {detail}")


class EnvironmentCodeError(FailedPrecondition):
    """The environment module raised (a bug in it, or contract misuse); the worker survives."""

    def __init__(self, op: str, error: dict[str, str]):
        self.op, self.error = op, error
        where = f" at {error['where']}" if error.get("where") else ""
        super().__init__(f"environment code failed in {op}: {error.get('type', 'Error')}: "
                         f"{error.get('message', '')}{where}")


def clean_env(scratch: str, hash_seed: int) -> dict[str, str]:
    """The child's whole environment: nothing inherited from the service."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "HOME": scratch,
            "TMPDIR": scratch, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": str(hash_seed),
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1"}


def _proc_stat(pid: int) -> tuple[str, float] | None:
    """(state letter, CPU seconds used) of a process, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _cpu_seconds(pid: int) -> float | None:
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def _reap(proc: subprocess.Popen, scratch: str) -> None:
    """Last-resort cleanup of an abandoned worker (weakref finalizer)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class CallStats:
    calls: int = 0
    seconds: float = 0.0
    violations: list[dict[str, str]] = field(default_factory=list)


class SandboxWorker:
    """One worker process. `call(op, **fields)` returns the result or raises (see module doc)."""

    def __init__(self, config: SandboxConfig | None = None, *, label: str = "env"):
        self.config = config or SandboxConfig()
        self.label = label
        self.proc: subprocess.Popen | None = None
        self.scratch: str = ""
        self.isolation: dict[str, Any] = {}
        self.stats = CallStats()
        self._lock = threading.Lock()
        self._buf = b""
        self._next_id = 1
        self._killed_by_us = False
        self._dead: SandboxViolation | None = None
        self._stderr_path = ""
        self._finalizer: weakref.finalize | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        root = self.config.scratch_root or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self.scratch = tempfile.mkdtemp(prefix=f"trace-sbx-{self.label[:20]}-", dir=root)
        work = os.path.join(self.scratch, "work")
        os.mkdir(work)
        os.chmod(self.scratch, 0o711)  # the worker (uid nobody) must traverse it to reach work/
        self._stderr_path = os.path.join(self.scratch, "worker.stderr")
        cmd = [self.config.python or sys.executable, "-s", "-B", "-m", "services.environment.sandbox.worker",
               "--config", self.config.worker_json(work)]
        with open(self._stderr_path, "wb") as err:
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                             cwd=work, env=clean_env(work, self.config.hash_seed),
                                             start_new_session=True, close_fds=True)
            except OSError as exc:
                self._cleanup()
                raise Unavailable(f"cannot start the sandbox worker ({cmd[0]}): {exc}") from exc
        # if the owner never calls close() (a crash, interpreter exit), still kill the worker and remove scratch
        self._finalizer = weakref.finalize(self, _reap, self.proc, self.scratch)
        os.set_blocking(self.proc.stdout.fileno(), False)
        try:
            hello = self.call("hello", _timeout=self.config.startup_timeout_s)
        except BaseException:
            self.close()
            raise
        self.isolation = hello["isolation"]
        if (self.config.require_network_isolation and not self.config.plain
                and not (self.isolation.get("netns") or self.isolation.get("seccomp"))):
            self.close()
            raise FailedPrecondition(
                "no kernel-level network isolation is available for the sandbox (neither a network namespace "
                f"nor seccomp): {'; '.join(self.isolation.get('notes', []))}. Run the service where one works, "
                "or set TRACE_ENVIRONMENT_SANDBOX_REQUIRE_NETWORK_ISOLATION=false to rely on the audit hook")
        return hello

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self._dead is None

    def close(self) -> None:
        """Stop the worker (politely if it is idle and healthy, else SIGKILL) and remove scratch."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            if self._dead is None and self._lock.acquire(timeout=0.5):
                try:
                    proc.stdin.write(b'{"op": "shutdown", "id": 0}\n')
                    proc.stdin.flush()
                    proc.wait(timeout=1.0)
                except (OSError, subprocess.TimeoutExpired, ValueError):
                    pass
                finally:
                    self._lock.release()
            self._kill()
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        self._cleanup()

    def _cleanup(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = ""

    def _kill(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self._killed_by_us = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> SandboxWorker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------------------------
    def call(self, op: str, _timeout: float | None = None, **fields: Any) -> Any:
        """One request/response. Raises SandboxViolation, EnvironmentCodeError or Unavailable."""
        with self._lock:
            if self._dead is not None:
                raise self._dead
            if self.proc is None:
                raise FailedPrecondition("the sandbox worker is not started: call start() first")
            rid = self._next_id
            self._next_id += 1
            line = (json.dumps({"id": rid, "op": op, **fields}) + "\n").encode()
            started = time.perf_counter()
            cpu0 = _cpu_seconds(self.proc.pid)
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._died(op) from None
            reply = self._read_line(op, _timeout or self.config.call_timeout_s, started, cpu0)
            elapsed = time.perf_counter() - started
            m.SANDBOX_STEP_DURATION.observe(elapsed)
            self.stats.calls += 1
            self.stats.seconds += elapsed
            try:
                msg = json.loads(reply)
            except ValueError:
                raise self._fail("protocol", f"unparseable response line ({reply[:80]!r})", op) from None
            if not isinstance(msg, dict) or msg.get("id") != rid:
                raise self._fail("protocol", f"response id {msg.get('id') if isinstance(msg, dict) else '?'} "
                                 f"does not answer request {rid}", op)
            violations = msg.get("violations") or []
            if violations:
                self.stats.violations.extend(violations)
                first = violations[0]
                raise self._fail(str(first.get("kind", "crash")), str(first.get("detail", "")), op,
                                 count_extra=violations[1:])
            if not msg.get("ok"):
                error = msg.get("error") or {}
                if error.get("code") == "INVALID_ARGUMENT":
                    raise InvalidArgument(f"environment rejected the {op} request: {error.get('message', '')}")
                raise EnvironmentCodeError(op, error)
            return msg.get("result")

    def _read_line(self, op: str, timeout: float, started: float, cpu0: float | None) -> bytes:
        assert self.proc is not None
        fd = self.proc.stdout.fileno()
        cap = self.config.max_output_kb << 10
        deadline = started + timeout
        while b"\n" not in self._buf:
            left = deadline - time.perf_counter()
            if left <= 0:
                # busy (runnable, or most of the time on a CPU) = a compute overrun, else blocked
                stat = _proc_stat(self.proc.pid)
                used = stat[1] - cpu0 if stat and cpu0 is not None else 0.0
                busy = stat is not None and (stat[0] == "R" or used >= 0.5 * timeout)
                raise self._fail("cpu" if busy else "timeout",
                                 f"no response within {timeout:g} s ({'busy computing' if busy else 'blocked'}, "
                                 f"{used:.1f} CPU seconds)", op)
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise self._died(op)
            self._buf += chunk
            if len(self._buf) > cap + 1:
                raise self._fail("output", f"response exceeds {cap} bytes", op)
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _fail(self, kind: str, detail: str, op: str, count_extra: list | None = None) -> SandboxViolation:
        """Kill the worker and return the violation to raise (recorded and counted)."""
        self._kill()
        violation = SandboxViolation(kind if kind in VIOLATION_KINDS else "crash", detail, op=op)
        m.SANDBOX_VIOLATIONS.labels(violation.kind).inc()
        for extra in count_extra or []:
            k = str(extra.get("kind", "crash"))
            m.SANDBOX_VIOLATIONS.labels(k if k in VIOLATION_KINDS else "crash").inc()
        self._dead = violation
        return violation

    def _died(self, op: str) -> SandboxViolation:
        """The worker exited on its own: classify how."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self.proc.returncode
        tail = self.stderr_tail()
        if code is not None and code < 0:
            sig = -code
            kind = {signal.SIGXCPU: "cpu", signal.SIGKILL: "memory", signal.SIGSYS: "syscall",
                    signal.SIGXFSZ: "file_size"}.get(sig, "crash")
            if sig == signal.SIGKILL and self._killed_by_us:
                kind = "crash"
            detail = f"worker killed by {signal.Signals(sig).name}"
        else:
            kind, detail = "crash", f"worker exited with status {code}"
        if tail:
            detail += f"; stderr: {tail[-300:]}"
        return self._fail(kind, detail, op)

    def stderr_tail(self, limit: int = 2000) -> str:
        """The last bytes the worker wrote before lockdown (trusted startup errors)."""
        try:
            with open(self._stderr_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - limit))
                return fh.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
