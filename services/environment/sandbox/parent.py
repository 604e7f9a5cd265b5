"""Parent side of the sandbox: start a worker, talk JSON Lines to it, contain its failures.

    worker = SandboxWorker(SandboxConfig(...))   # a local process, or a pod (backend="kubernetes")
    worker.start()                               # handshake; worker.isolation says which layers hold
    info = worker.call("load", source=text)      # then reset / step / result / solve ...
    worker.close()

Generated environment code never runs in the service process: it runs in the worker,
which locks itself down before reading the first request (see `isolation.py`). Where the
worker runs is the config's `backend`:

- `process` (default): a child process `python -m services.environment.sandbox.worker` with
  a clean environment (no `TRACE_*` settings, tokens or credentials: only PATH, PYTHONPATH to
  TRACE's sources, HOME/TMPDIR = scratch, locale, a fixed hash seed), a per-worker scratch
  directory (its cwd, removed on close) and a uid of its own from `uid_base`/`uid_count`
  (`UidPool`; released on close).
- `kubernetes`: a Pod per worker created through the Kubernetes API, the same protocol over
  the pod's attached stdin/stdout (`pods.py`).

Before a worker serves anything, `start()` compares the layers it reports with the layers the
backend needs (`isolation.REQUIRED_LAYERS`, or `pods.REQUIRED_POD_LAYERS`) and refuses it
(`SandboxRefused`, a FailedPrecondition naming what is missing and how to fix it) unless
`allow_weak` is set; the report (`isolation`, returned by start() and kept on the worker) lists
`held`, `required`, `missing` and `allowed_weak`.

Per call: a wall-clock deadline (past it the worker is killed and the call fails with a
`timeout` violation -- or `cpu` when the worker was busy computing for most of that time),
and a cap on each response line (`output`). A worker that died on its own is classified from
what can be observed (the PID-namespace supervisor's exit line: signal, CPU seconds, peak RSS;
the kernel's OOM-kill counter; the pod's container status):

| how it ended                                   | kind      |
|------------------------------------------------|-----------|
| SIGXCPU, or SIGKILL with its CPU time at RLIMIT_CPU (>= CPU_LIMIT_MARGIN of it) | cpu |
| SIGKILL while the kernel counted an OOM kill (/proc/vmstat oom_kill), or a pod OOMKilled | memory |
| SIGKILL otherwise: not by the service, not at a limit, no OOM kill recorded | killed (from outside the sandbox) |
| SIGSYS (a system call seccomp kills for: signalling/tracing another process) | syscall |
| SIGXFSZ                                        | file_size |
| other signals or exit codes                    | crash     |

Every violation is raised as `SandboxViolation` (a `ResourceExhausted`, so gRPC callers get
RESOURCE_EXHAUSTED) after the worker is killed; an exception raised by environment code is
`EnvironmentCodeError` (FAILED_PRECONDITION) and the worker stays usable. Neither ever
takes the service down. `SandboxWorker` is thread-safe (one call at a time per worker).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trace_common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable

from .. import metrics as m
from .isolation import EXIT_MARKER, NOBODY, REQUIRED_LAYERS, missing_layers

#: Root of TRACE's sources (what the child needs on PYTHONPATH).
PROJECT_ROOT = Path(__file__).resolve().parents[3]
#: A SIGKILLed worker whose CPU time reached this fraction of RLIMIT_CPU is taken to have hit the limit.
CPU_LIMIT_MARGIN = 0.85
VIOLATION_KINDS = ("cpu", "memory", "processes", "file_size", "timeout", "network", "output", "filesystem",
                   "limits", "native", "introspection", "environment", "syscall", "killed", "crash", "protocol")


class PodConfig(BaseModel):
    """Where and how sandbox pods are created (backend "kubernetes"; see pods.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field("", description="Namespace of the sandbox pods (default: the service's own, from its "
                           "service-account mount, else 'default').")
    template: str = Field("", description="Path of the pod template JSON the chart renders "
                          "(/etc/trace/templates/sandbox-pod.json); empty = the built-in template.")
    image: str = Field("", description="Sandbox image; overrides the template's (required without a template).")
    cpu: str = Field("1", description="CPU limit of a sandbox pod (Kubernetes quantity).")
    deadline_s: int = Field(3600, ge=60, le=7 * 86_400, description="activeDeadlineSeconds of a sandbox pod.")
    scratch_mb: int = Field(512, ge=16, le=1 << 20, description="sizeLimit of the pod's scratch emptyDir (MiB).")
    poll_s: float = Field(0.25, gt=0, le=10, description="How often pod status is read while it starts.")
    require_egress_policy: bool = Field(
        True, description="Count the 'pod' layer only when a NetworkPolicy denying all egress selects the pod.")


class SandboxConfig(BaseModel):
    """Limits and isolation layers of one sandbox worker (see isolation.py for the layers)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    backend: Literal["process", "kubernetes"] = Field(
        "process", description="Where workers run: a local child process, or a Kubernetes pod per worker.")
    cpu_seconds: int = Field(300, ge=1, le=86_400, description="Total CPU seconds of a worker (RLIMIT_CPU).")
    memory_mb: int = Field(1024, ge=128, le=1 << 20, description="Address-space limit (RLIMIT_AS) in MiB.")
    file_size_mb: int = Field(16, ge=1, le=1 << 20, description="Largest file the worker may write (RLIMIT_FSIZE).")
    max_processes: int = Field(0, ge=0, le=4096, description="RLIMIT_NPROC of the sandbox uid; 0 forbids fork.")
    open_files: int = Field(64, ge=16, le=65_536, description="RLIMIT_NOFILE.")
    call_timeout_s: float = Field(10.0, gt=0, le=3600, description="Wall-clock deadline of one call.")
    startup_timeout_s: float = Field(30.0, gt=0, le=600, description="Deadline of the startup handshake.")
    max_output_kb: int = Field(1024, ge=4, le=1 << 20, description="Largest response line in KiB.")
    pid_namespace: bool = Field(True, description="Run the worker as pid 1 of its own PID namespace (root only).")
    network_namespace: bool = Field(True, description="Unshare a network namespace (root or userns).")
    mount_namespace: bool = Field(True, description="Read-only root except scratch, private /proc (root only).")
    drop_privileges: bool = Field(True, description="Drop to a sandbox uid when started as root.")
    uid_base: int = Field(1_000_000, ge=0, le=4_000_000_000, description=(
        "First uid of the range workers run as (one uid per live worker). 0: every worker runs as nobody "
        "(65534), and uid_distinct is not in force. The uids must be mapped where the service runs."))
    uid_count: int = Field(65_536, ge=1, le=1 << 24, description="Size of the uid range.")
    seccomp: bool = Field(True, description="Install the seccomp filter.")
    audit_hook: bool = Field(True, description="Install the Python audit hook (typed violation reports).")
    require_network_isolation: bool = Field(
        True, description="Refuse a worker in which no kernel layer (netns or seccomp) blocks the network.")
    allow_weak: bool = Field(False, description=(
        "Let workers run although a required isolation layer is missing (e.g. a non-root service, a restricted "
        "pod). The validation report still names the missing layers. Never for untrusted code in production."))
    plain: bool = Field(False, description="No lockdown at all: benchmark baseline only, never untrusted code.")
    scratch_root: str = Field("", description="Parent directory of per-worker scratch dirs (default: system tmp).")
    hash_seed: int = Field(0, ge=0, le=4_294_967_295, description="PYTHONHASHSEED of the worker.")
    python: str = Field("", description="Interpreter for the worker (default: this one).")
    pod: PodConfig = Field(default_factory=PodConfig, description="Sandbox pods (backend 'kubernetes').")
    kubernetes_api: Callable[[], Any] | None = Field(
        None, exclude=True, repr=False, description="Factory of the kubernetes ApiClient (default: in-cluster "
        "config, else kubeconfig); tests point it at an emulated API server.")

    @model_validator(mode="before")
    @classmethod
    def _flat_pod_names(cls, data: Any) -> Any:
        """Pod fields spelled flat, as the environment settings' variables spell them
        (TRACE_ENVIRONMENT_SANDBOX_NAMESPACE -> pod.namespace, ..._POD_<FIELD> -> pod.<field>)."""
        if not isinstance(data, dict):
            return data
        flat = [k for k in data if k == "namespace" or k.startswith("pod_")]
        if not flat:
            return data
        data = dict(data)
        pod = data.get("pod") or {}
        pod = pod.model_dump() if isinstance(pod, PodConfig) else dict(pod)
        for k in flat:
            pod["namespace" if k == "namespace" else k.removeprefix("pod_")] = data.pop(k)
        data["pod"] = pod
        return data

    @model_validator(mode="after")
    def _uids(self) -> SandboxConfig:
        if self.uid_base and self.uid_base <= NOBODY < self.uid_base + self.uid_count:
            raise ValueError(f"the sandbox uid range [{self.uid_base}, {self.uid_base + self.uid_count}) contains "
                             f"nobody ({NOBODY}); move TRACE_ENVIRONMENT_SANDBOX_UID_BASE past it (e.g. 1000000)")
        return self

    def worker_json(self, scratch: str, uid: int = NOBODY, uid_distinct: bool = False) -> str:
        return json.dumps({
            "scratch": scratch,
            "limits": {"cpu_seconds": self.cpu_seconds, "memory_bytes": self.memory_mb << 20,
                       "file_size_bytes": self.file_size_mb << 20, "max_processes": self.max_processes,
                       "open_files": self.open_files},
            "pid_namespace": self.pid_namespace, "network_namespace": self.network_namespace,
            "mount_namespace": self.mount_namespace, "drop_privileges": self.drop_privileges,
            "uid": uid, "uid_distinct": uid_distinct, "seccomp": self.seccomp, "audit_hook": self.audit_hook,
            "plain": self.plain, "max_output_bytes": self.max_output_kb << 10})


class SandboxViolation(ResourceExhausted):
    """The environment code hit a sandbox limit or tried a forbidden operation (or, kind
    "killed", the worker was killed from outside the sandbox)."""

    def __init__(self, kind: str, detail: str, *, op: str = ""):
        self.kind, self.detail, self.op = kind, detail, op
        super().__init__(f"sandbox violation ({kind}) during {op or 'startup'}: {detail}")


#: Generation modes whose code TRACE wrote (records and candidates carry the proto mode name).
TRUSTED_MODES = ("GENERATION_MODE_LIBRARY",)


def sandbox_for(config: SandboxConfig, mode: str) -> SandboxConfig:
    """The sandbox for code of generation `mode`. Library environments are TRACE's own code (bundled
    from services/environment/library), so a missing isolation layer is reported, not refused, for
    them: on a machine without root (a newcomer's `make demo`) the embedded default still runs. Code
    an LLM wrote gets the operator's setting (refused unless `allow_weak`, DESIGN "Trust boundaries")."""
    if mode in TRUSTED_MODES and not config.allow_weak:
        return config.model_copy(update={"allow_weak": True})
    return config


class SandboxRefused(FailedPrecondition):
    """The sandbox cannot contain code here (a required isolation layer is missing): no candidate's
    fault, so callers should fail the job rather than reject the candidate."""


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


def oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat oom_kill), None when unreadable."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


class UidPool:
    """Hands out sandbox uids from [base, base + count), one per live worker of this service.

    Picked at random among the free ones, so two services sharing a machine rarely collide
    (the PID namespace keeps them apart even then). base 0 gives every worker nobody (65534)."""

    def __init__(self) -> None:
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def take(self, base: int, count: int) -> tuple[int, bool]:
        """(uid, distinct): distinct is False when base is 0 (shared nobody)."""
        if not base:
            return NOBODY, False
        with self._lock:
            if len(self._used) >= count:
                raise ResourceExhausted(f"all {count} sandbox uids from {base} are in use; raise "
                                        "TRACE_ENVIRONMENT_SANDBOX_UID_COUNT or close workers")
            while True:
                uid = base + random.randrange(count)
                if uid not in self._used:
                    self._used.add(uid)
                    return uid, True

    def give(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


UIDS = UidPool()


# -- transports ------------------------------------------------------------------------------------

class Transport(Protocol):
    """How bytes reach a worker and how its end is observed (ProcessTransport, pods.PodTransport)."""

    label: str

    def open(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    def read(self, timeout: float) -> bytes | None:
        """Bytes of the worker's stdout; b"" at EOF; None when nothing came within `timeout`."""
    def cpu_state(self) -> tuple[str, float] | None:
        """(state letter, CPU seconds) of the worker process, None where it cannot be seen."""
    def alive(self) -> bool: ...
    def kill(self) -> None: ...
    def shutdown(self, line: bytes) -> None:
        """Send the shutdown request and give the worker a moment to exit."""
    def ending(self) -> dict[str, Any]:
        """After EOF: how the worker ended (signal / code / cpu_seconds / max_rss_kb / reason ...)."""
    def stderr_tail(self, limit: int = 2000) -> str: ...
    def layers(self) -> dict[str, Any]:
        """Isolation facts of the transport itself, merged into the worker's report."""
    def required_layers(self) -> tuple[str, ...]: ...
    def close_streams(self) -> None: ...
    def cleanup(self) -> None: ...


def _reap(proc: subprocess.Popen, scratch: str, uid: int | None) -> None:
    """Last-resort cleanup of an abandoned worker (weakref finalizer)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    shutil.rmtree(scratch, ignore_errors=True)
    if uid is not None:
        UIDS.give(uid)


class ProcessTransport:
    """The worker as a local child process (its own session, scratch dir and uid)."""

    def __init__(self, config: SandboxConfig, label: str, owner: object):
        self.config, self.label = config, label
        self.proc: subprocess.Popen | None = None
        self.scratch = ""
        self.uid: int | None = None
        self._owner = owner
        self._stderr_path = ""
        self._finalizer: weakref.finalize | None = None
        self._oom_at_start = oom_kills()
        self._worker_pid: int | None = None

    def open(self) -> None:
        root = self.config.scratch_root or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self.scratch = tempfile.mkdtemp(prefix=f"trace-sbx-{self.label[:20]}-", dir=root)
        work = os.path.join(self.scratch, "work")
        os.mkdir(work)
        os.chmod(self.scratch, 0o711)  # the worker (a sandbox uid) must traverse it to reach work/
        self._stderr_path = os.path.join(self.scratch, "worker.stderr")
        uid, distinct = NOBODY, False
        if os.geteuid() == 0 and self.config.drop_privileges and not self.config.plain:
            uid, distinct = UIDS.take(self.config.uid_base, self.config.uid_count)
            self.uid = uid if distinct else None
        cmd = [self.config.python or sys.executable, "-s", "-B", "-m", "services.environment.sandbox.worker",
               "--config", self.config.worker_json(work, uid, distinct)]
        with open(self._stderr_path, "wb") as err:
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                             cwd=work, env=clean_env(work, self.config.hash_seed),
                                             start_new_session=True, close_fds=True)
            except OSError as exc:
                self.cleanup()
                raise Unavailable(f"cannot start the sandbox worker ({cmd[0]}): {exc}") from exc
        # if the owner never calls close() (a crash, interpreter exit), still kill the worker and remove scratch
        self._finalizer = weakref.finalize(self._owner, _reap, self.proc, self.scratch, self.uid)
        os.set_blocking(self.proc.stdout.fileno(), False)

    @property
    def worker_pid(self) -> int | None:
        """Host pid of the process running the environment code (the supervisor's child when the
        worker has a PID namespace of its own; the started process otherwise)."""
        if self.proc is None:
            return None
        if self._worker_pid is None:
            kids = _children(self.proc.pid)
            self._worker_pid = kids[0] if kids else None
        return self._worker_pid or self.proc.pid

    def write(self, data: bytes) -> None:
        assert self.proc is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, timeout: float) -> bytes | None:
        assert self.proc is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        try:
            return os.read(fd, 1 << 16)
        except BlockingIOError:
            return None

    def cpu_state(self) -> tuple[str, float] | None:
        pid = self.worker_pid
        return _proc_stat(pid) if pid else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the supervisor and the worker share its process group
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def shutdown(self, line: bytes) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
            proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass

    def ending(self) -> dict[str, Any]:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        end: dict[str, Any] = {}
        report = _exit_report(self.stderr_tail(8000))
        if report is not None:
            end.update(report)
        elif code is not None and code < 0:
            end["signal"] = -code
        else:
            end["code"] = code
        oom_now = oom_kills()
        if self._oom_at_start is not None and oom_now is not None:
            end["oom_kills"] = oom_now - self._oom_at_start
        return end

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

    def layers(self) -> dict[str, Any]:
        return {"backend": "process"}

    def required_layers(self) -> tuple[str, ...]:
        return REQUIRED_LAYERS

    def close_streams(self) -> None:
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass

    def cleanup(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = ""
        if self.uid is not None:
            UIDS.give(self.uid)
            self.uid = None


def _exit_report(tail: str) -> dict[str, Any] | None:
    """The PID-namespace supervisor's last EXIT_MARKER line, if it wrote one."""
    for line in reversed(tail.splitlines()):
        if line.startswith(EXIT_MARKER):
            try:
                data = json.loads(line[len(EXIT_MARKER):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _without_exit_report(tail: str) -> str:
    return "\n".join(line for line in tail.splitlines() if not line.startswith(EXIT_MARKER)).strip()


@dataclass
class CallStats:
    calls: int = 0
    seconds: float = 0.0
    violations: list[dict[str, str]] = field(default_factory=list)


class SandboxWorker:
    """One worker (a process or a pod). `call(op, **fields)` returns the result or raises (see module doc)."""

    def __init__(self, config: SandboxConfig | None = None, *, label: str = "env"):
        self.config = config or SandboxConfig()
        self.label = label
        self.isolation: dict[str, Any] = {}
        self.stats = CallStats()
        self._lock = threading.Lock()
        self._buf = b""
        self._next_id = 1
        self._killed_by_us = False
        self._dead: SandboxViolation | None = None
        self.transport: Any = None

    @property
    def proc(self) -> subprocess.Popen | None:
        """The started process (process backend), else None."""
        return getattr(self.transport, "proc", None)

    # -- lifecycle ---------------------------------------------------------------------------
    def _make_transport(self) -> Any:
        if self.config.backend == "kubernetes":
            from .pods import PodTransport  # the kubernetes client is only needed here

            return PodTransport(self.config, self.label)
        return ProcessTransport(self.config, self.label, self)

    def start(self) -> dict[str, Any]:
        self.transport = self._make_transport()
        self.transport.open()
        try:
            hello = self.call("hello", _timeout=self.config.startup_timeout_s)
        except BaseException:
            self.close()
            raise
        iso = dict(hello["isolation"])
        extra = dict(self.transport.layers())
        notes = extra.pop("notes", [])
        iso.update(extra)
        iso["notes"] = [*iso.get("notes", []), *notes]
        held = list(iso.get("held") or [])
        if iso.get("pod"):
            held.append("pod")
        iso["held"] = held
        required = self.transport.required_layers()
        iso["required"] = list(required)
        iso["missing"] = [] if self.config.plain else missing_layers(held, required)
        iso["allowed_weak"] = bool(iso["missing"]) and self.config.allow_weak
        self.isolation = iso
        if (self.config.require_network_isolation and not self.config.plain and self.config.backend == "process"
                and not (iso.get("netns") or iso.get("seccomp"))):
            self.close()
            raise SandboxRefused(
                "no kernel-level network isolation is available for the sandbox (neither a network namespace "
                f"nor seccomp): {'; '.join(iso.get('notes', []))}. Run the service where one works, "
                "or set TRACE_ENVIRONMENT_SANDBOX_REQUIRE_NETWORK_ISOLATION=false to rely on the audit hook")
        if iso["missing"] and not self.config.allow_weak:
            notes = "; ".join(n for n in iso.get("notes", []) if n.startswith(tuple(iso["missing"])))
            self.close()
            raise SandboxRefused(
                f"the sandbox refuses to run environment code: isolation layer(s) {', '.join(iso['missing'])} "
                f"not in force ({notes or 'see the isolation notes'}). Run the environment service as root on "
                "Linux >= 5.12 (process backend), or in Kubernetes with TRACE_ENVIRONMENT_SANDBOX_BACKEND="
                "kubernetes (a pod per worker); or, knowing that generated code is then less contained, set "
                "TRACE_ENVIRONMENT_SANDBOX_ALLOW_WEAK=true")
        return {**hello, "isolation": iso}

    @property
    def alive(self) -> bool:
        return self.transport is not None and self.transport.alive() and self._dead is None

    def close(self) -> None:
        """Stop the worker (politely if it is idle and healthy, else kill it) and remove its scratch / pod."""
        transport = self.transport
        if transport is None:
            return
        if transport.alive():
            if self._dead is None and self._lock.acquire(timeout=0.5):
                try:
                    transport.shutdown(b'{"op": "shutdown", "id": 0}\n')
                finally:
                    self._lock.release()
            self._kill()
        transport.close_streams()
        transport.cleanup()

    def _kill(self) -> None:
        if self.transport is None or not self.transport.alive():
            return
        self._killed_by_us = True
        self.transport.kill()

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
            if self.transport is None:
                raise FailedPrecondition("the sandbox worker is not started: call start() first")
            rid = self._next_id
            self._next_id += 1
            line = (json.dumps({"id": rid, "op": op, **fields}) + "\n").encode()
            started = time.perf_counter()
            stat0 = self.transport.cpu_state()
            cpu0 = stat0[1] if stat0 else None
            try:
                self.transport.write(line)
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
        cap = self.config.max_output_kb << 10
        deadline = started + timeout
        while b"\n" not in self._buf:
            left = deadline - time.perf_counter()
            if left <= 0:
                # busy (runnable, or most of the time on a CPU) = a compute overrun, else blocked
                stat = self.transport.cpu_state()
                used = stat[1] - cpu0 if stat and cpu0 is not None else 0.0
                busy = stat is not None and (stat[0] == "R" or used >= 0.5 * timeout)
                how = ("busy computing" if busy else "blocked") if stat is not None else "state not observable"
                raise self._fail("cpu" if busy else "timeout",
                                 f"no response within {timeout:g} s ({how}, {used:.1f} CPU seconds)", op)
            chunk = self.transport.read(min(left, 1.0))
            if chunk is None:
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
        """The worker ended on its own (or was ended from outside): classify how."""
        end = self.transport.ending()
        kind, detail = classify_ending(end, self.config, killed_by_us=self._killed_by_us)
        tail = _without_exit_report(self.transport.stderr_tail())
        if tail:
            detail += f"; stderr: {tail[-300:]}"
        return self._fail(kind, detail, op)

    def stderr_tail(self, limit: int = 2000) -> str:
        """The last bytes the worker wrote before lockdown (trusted startup errors)."""
        return self.transport.stderr_tail(limit) if self.transport is not None else ""


def classify_ending(end: dict[str, Any], config: SandboxConfig, *, killed_by_us: bool = False) -> tuple[str, str]:
    """(violation kind, detail) for a worker that ended without answering (module docstring table).

    `end` holds what the transport observed: signal or code, cpu_seconds and max_rss_kb (the
    supervisor's wait4), oom_kills (OOM kills the kernel counted while it ran), and for pods
    reason / message (the container's terminated state or the pod's)."""
    sig = end.get("signal")
    reason = str(end.get("reason") or "")
    cpu = end.get("cpu_seconds")
    rss = end.get("max_rss_kb")
    facts = []
    if cpu is not None:
        facts.append(f"{cpu:.1f} of {config.cpu_seconds} CPU seconds used")
    if rss is not None:
        facts.append(f"peak RSS {rss / 1024:.0f} MiB (address-space limit {config.memory_mb} MiB)")
    facts_text = f" ({', '.join(facts)})" if facts else ""
    if reason == "OOMKilled":
        return "memory", f"the sandbox pod's container was OOMKilled (memory limit {config.memory_mb} MiB)"
    if reason == "PodDeleted":
        return "killed", "the sandbox pod was deleted from outside the service"
    if reason == "DeadlineExceeded":
        return "timeout", f"the sandbox pod ran past its activeDeadlineSeconds ({config.pod.deadline_s} s)"
    if sig is None:
        message = str(end.get("message") or "")
        extra = f" ({reason}{': ' + message if message else ''})" if reason else ""
        return "crash", f"worker exited with status {end.get('code')}{extra}"
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
    if sig == signal.SIGXCPU:
        return "cpu", f"worker killed by SIGXCPU at its CPU-time limit{facts_text}"
    if sig == signal.SIGSYS:
        return "syscall", ("worker killed by SIGSYS: it made a system call the sandbox forbids outright (signalling, "
                           "tracing or reading another process: kill/tgkill aimed elsewhere, pidfd_open, "
                           f"pidfd_send_signal, ptrace, process_vm_readv ...){facts_text}")
    if sig == signal.SIGXFSZ:
        return "file_size", f"worker killed by SIGXFSZ (file size limit {config.file_size_mb} MiB)"
    if sig != signal.SIGKILL:
        return "crash", f"worker killed by {name}{facts_text}"
    if killed_by_us:
        return "crash", "worker killed by the service"
    # RLIMIT_CPU (soft == hard) kills with SIGKILL; the kernel's tick-based limit check runs ahead of
    # the CPU time wait4 reports (measured here: 0.8-0.97 s reported at a 1 s limit), hence the margin
    if cpu is not None and cpu >= CPU_LIMIT_MARGIN * config.cpu_seconds - 0.1:
        return "cpu", f"worker killed by SIGKILL at its CPU-time limit (RLIMIT_CPU){facts_text}"
    ooms = end.get("oom_kills")
    if ooms:
        return "memory", (f"worker killed by SIGKILL while the kernel recorded {ooms} OOM kill(s) (/proc/vmstat "
                          f"oom_kill): most likely the OOM killer{facts_text}")
    if ooms == 0:
        evidence = end.get("oom_evidence") or "the kernel recorded no OOM kill meanwhile (/proc/vmstat oom_kill)"
        return "killed", (f"worker killed by SIGKILL from outside the sandbox: not by the service, not at its CPU "
                          f"limit, and {evidence}{facts_text}")
    return "killed", (f"worker killed by SIGKILL from outside the worker: not by the service and not at its CPU "
                      f"limit; whether the OOM killer did it is unknown (no OOM-kill counter readable){facts_text}")
