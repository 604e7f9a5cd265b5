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
the kernel's OOM-kill counter; the pod's container status) by `endings.classify_ending`, whose
module docstring has the table of kinds (cpu, memory, killed, syscall, file_size, crash).

The settings (`SandboxConfig`, `PodConfig`) live in `config.py` and the classification of an
ending in `endings.py`, so that `pods.py` uses both without importing this module.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trace_common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable

from .. import metrics as m
from .config import SandboxConfig
from .endings import classify_ending, exit_report, oom_kills, without_exit_report
from .isolation import NOBODY, REQUIRED_LAYERS, missing_layers
from .scratch import ScratchUsage, deleted_open_bytes, make_searchable_dirs, scratch_parent, usage

#: Root of TRACE's sources (what the child needs on PYTHONPATH).
PROJECT_ROOT = Path(__file__).resolve().parents[3]
VIOLATION_KINDS = ("cpu", "memory", "processes", "file_size", "disk", "timeout", "network", "output", "filesystem",
                   "limits", "native", "introspection", "environment", "syscall", "killed", "crash", "protocol")


#: How deeply a worker's response may nest lists and objects. Generated code chooses what `step`'s
#: info or `diagnostics` return; a value nested ~1,000 deep still encodes in the worker's shallow stack
#: but fails to parse (RecursionError) or to convert (protobuf, JSON) in the service's deeper one. No
#: environment's results need more than a few levels.
MAX_RESPONSE_DEPTH = 64


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests lists/objects more than `limit` deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


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
    an LLM wrote gets the operator's setting (refused unless `allow_weak`, docs/design.md "Trust boundaries")."""
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
    def scratch_usage(self) -> ScratchUsage | None:
        """What the worker's scratch dir holds where the service bounds it, else None (a pod's emptyDir
        has its sizeLimit)."""
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
        drops = os.geteuid() == 0 and self.config.drop_privileges and not self.config.plain
        if self.config.scratch_root:
            make_searchable_dirs(self.config.scratch_root)
        root = scratch_parent(self.config.scratch_root, others_must_reach=drops)
        self.scratch = tempfile.mkdtemp(prefix=f"trace-sbx-{self.label[:20]}-", dir=root)
        work = os.path.join(self.scratch, "work")
        os.mkdir(work)
        os.chmod(work, 0o700)  # the worker's own (chowned to its uid): no other worker can list or read it
        os.chmod(self.scratch, 0o711)  # the worker (a sandbox uid) must traverse it to reach work/
        self._stderr_path = os.path.join(self.scratch, "worker.stderr")
        uid, distinct = NOBODY, False
        if drops:
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

    def scratch_usage(self) -> ScratchUsage | None:
        """What the worker's scratch dir holds (`scratch.usage`) plus the deleted files the worker holds
        open; None before it exists."""
        if not self.scratch:
            return None
        found = usage(self.scratch, self.config.scratch_entries)
        pid = self.worker_pid if self.alive() else None
        return found._replace(bytes=found.bytes + deleted_open_bytes(pid)) if pid else found

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
        report = exit_report(self.stderr_tail(8000))
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

    def scratch_usage(self) -> ScratchUsage | None:
        """What its scratch dir holds (process backend), None where the service does not bound it."""
        return self.transport.scratch_usage() if self.transport is not None else None

    def cpu_used(self) -> float | None:
        """CPU seconds the worker has used so far (its RLIMIT_CPU counts them all, across every call and
        episode it served); None where not observable (a pod)."""
        stat = self.transport.cpu_state() if self.transport is not None else None
        return stat[1] if stat else None

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
            except RecursionError:  # nested deeper than this stack can parse
                raise self._fail("protocol", f"a response nested deeper than {MAX_RESPONSE_DEPTH} levels", op) from None
            if _nested_deeper(msg, MAX_RESPONSE_DEPTH):
                raise self._fail("protocol", f"a response nested deeper than {MAX_RESPONSE_DEPTH} levels", op)
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
        tick = self.config.scratch_check_s
        while b"\n" not in self._buf:
            self._check_scratch(op)
            left = deadline - time.perf_counter()
            if left <= 0:
                # busy (runnable, or most of the time on a CPU) = a compute overrun, else blocked
                stat = self.transport.cpu_state()
                used = stat[1] - cpu0 if stat and cpu0 is not None else 0.0
                busy = stat is not None and (stat[0] == "R" or used >= 0.5 * timeout)
                how = ("busy computing" if busy else "blocked") if stat is not None else "state not observable"
                raise self._fail("cpu" if busy else "timeout",
                                 f"no response within {timeout:g} s ({how}, {used:.1f} CPU seconds)", op)
            chunk = self.transport.read(min(left, 1.0, tick))
            if chunk is None:
                continue
            if not chunk:
                raise self._died(op)
            self._buf += chunk
            if len(self._buf) > cap + 1:
                raise self._fail("output", f"response exceeds {cap} bytes", op)
        line, self._buf = self._buf.split(b"\n", 1)
        self._check_scratch(op)  # what a quick call wrote before it answered
        return line

    def _check_scratch(self, op: str) -> None:
        """Kill the worker (violation "disk") once its scratch dir holds more than scratch_mb or
        scratch_entries (scratch.py: RLIMIT_FSIZE bounds one file only)."""
        measured = self.transport.scratch_usage()
        if measured is None:
            return
        used, entries, unreadable = measured
        if unreadable:
            raise self._fail("disk", f"scratch dir holds a directory the service cannot read "
                             f"({os.path.relpath(unreadable, self.transport.scratch)}), so cannot measure", op)
        if used > self.config.scratch_mb << 20:
            raise self._fail("disk", f"scratch dir holds {used >> 20} MiB, over its {self.config.scratch_mb} MiB "
                             "(scratch_mb)", op)
        if entries > self.config.scratch_entries:
            raise self._fail("disk", f"scratch dir holds more than {self.config.scratch_entries} files and "
                             "directories (scratch_entries)", op)

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
        tail = without_exit_report(self.transport.stderr_tail())
        if tail:
            detail += f"; stderr: {tail[-300:]}"
        return self._fail(kind, detail, op)

    def stderr_tail(self, limit: int = 2000) -> str:
        """The last bytes the worker wrote before lockdown (trusted startup errors)."""
        return self.transport.stderr_tail(limit) if self.transport is not None else ""
