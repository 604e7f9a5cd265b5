"""Running a training job: the local executor (a child process of the service, the embedded
default) and the shared outcome handling of every executor.

An executor turns a `WorkerSpec` into a running worker, forwards the worker's events to the
job (`on_event`), and returns the final `result` event -- or raises the domain error the
worker reported, or one describing how the worker died. Cancelling the job's task stops the
worker: SIGTERM first (the worker checkpoints and exits), SIGKILL after the grace period.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_common import errors as E

from .jobspec import ENVIRONMENT_TLS_CA_ENV, ENVIRONMENT_TOKEN_ENV, WorkerSpec, decode_line
from .settings import TrainerSettings, environment_token

log = logging.getLogger(__name__)

EventFn = Callable[[dict[str, Any]], None]
REPO_ROOT = Path(__file__).resolve().parents[2]

_CODES: dict[str, type[E.TraceError]] = {
    "INVALID_ARGUMENT": E.InvalidArgument, "NOT_FOUND": E.NotFound, "FAILED_PRECONDITION": E.FailedPrecondition,
    "UNAVAILABLE": E.Unavailable, "RESOURCE_EXHAUSTED": E.ResourceExhausted, "DATA_LOSS": E.ArtifactCorrupted,
    "UNIMPLEMENTED": E.Unimplemented, "CANCELLED": E.Cancelled, "DEADLINE_EXCEEDED": E.DeadlineExceeded,
}


def error_from_event(event: dict[str, Any]) -> E.TraceError:
    """The domain error a worker's `error` event describes (same status code)."""
    cls = _CODES.get(str(event.get("code", "")), E.TraceError)
    return cls(str(event.get("message", "training failed")))


SCRATCH_PREFIX = "trace-trainer-"
#: In each scratch dir: "<pid> <start time>" of the service process that made it.
OWNER_FILE = "owner.pid"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22); None if gone or unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(record: str) -> bool:
    pid_text, _, start = record.strip().partition(" ")
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a process of another user has that pid: not ours to judge, keep the dir
    now = _start_time(pid)
    return not (start and now and now != start)  # same pid, other start time: the pid was reused


def clean_stale_scratch(root: str | Path | None = None) -> list[Path]:
    """Remove `trace-trainer-*` scratch dirs under `root` (default: the system temp dir) whose owner
    is gone: a service process that was SIGKILLed never ran its cleanup. Only dirs of this user
    that record their owner (OWNER_FILE) are judged; a live owner's dir, a dir without a record
    and anything that is not a plain directory are left alone. Returns what was removed."""
    removed = []
    for d in sorted(Path(root or tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*")):
        try:
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            record = (d / OWNER_FILE).read_text()
            if _owner_alive(record):
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d)
    if removed:
        log.info("removed %d stale training scratch dir(s) of dead service processes: %s", len(removed),
                 ", ".join(str(d) for d in removed))
    return removed


class LocalExecutor:
    """`python -m services.trainer.worker --spec-file <file>` as a child process.

    Its scratch dir (`trace-trainer-*` under the system temp dir, unless settings.work_dir) records
    its owner; at construction, scratch dirs left by dead service processes are removed
    (`clean_stale_scratch`)."""

    def __init__(self, settings: TrainerSettings):
        self.settings = settings
        self._tmp: tempfile.TemporaryDirectory | None = None
        #: Running worker processes by job id (observability; tests use the pids).
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        if not settings.work_dir:
            clean_stale_scratch()

    def _work_dir(self) -> Path:
        if self.settings.work_dir:
            return Path(self.settings.work_dir)
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX)
            pid = os.getpid()
            (Path(self._tmp.name) / OWNER_FILE).write_text(f"{pid} {_start_time(pid) or ''}".strip() + "\n")
        return Path(self._tmp.name)

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        secret = self.settings.s3_secret_key
        if secret is not None:
            env["TRACE_TRAINER_S3_SECRET_KEY"] = secret.get_secret_value()
        token = environment_token(self.settings)
        if token:
            env[ENVIRONMENT_TOKEN_ENV] = token  # the worker plays environments served by the environment service
        if self.settings.environment_tls_ca_file is not None:
            env[ENVIRONMENT_TLS_CA_ENV] = str(self.settings.environment_tls_ca_file)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def run(self, spec: WorkerSpec, on_event: EventFn) -> dict[str, Any]:
        work = self._work_dir() / spec.job_id
        work.mkdir(parents=True, exist_ok=True)
        if not spec.cache_dir:
            spec = spec.model_copy(update={"cache_dir": str(self._work_dir() / "cache")})
        if not spec.torch_threads and self.settings.torch_threads:
            spec = spec.model_copy(update={"torch_threads": self.settings.torch_threads})
        spec_file = work / "spec.json"
        spec_file.write_text(spec.model_dump_json())
        python = self.settings.worker_python or sys.executable
        proc = await asyncio.create_subprocess_exec(
            python, "-m", "services.trainer.worker", "--spec-file", str(spec_file), cwd=str(REPO_ROOT),
            env=self.child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, limit=1 << 24)
        self.processes[spec.job_id] = proc
        stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        final: dict[str, Any] = {}

        async def read_stdout() -> None:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                event = decode_line(raw.decode("utf-8", "replace").rstrip("\n"))
                if event is None:
                    continue
                if event["event"] in ("result", "error"):
                    final.clear()
                    final.update(event)
                else:
                    on_event(event)

        async def read_stderr() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                stderr_tail.append(line)
                log.debug("worker %s: %s", spec.job_id, line)

        readers = asyncio.gather(read_stdout(), read_stderr())
        try:
            await readers
            rc = await proc.wait()
        except asyncio.CancelledError:
            await asyncio.shield(self._stop(proc))
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await readers
            raise
        finally:
            self.processes.pop(spec.job_id, None)
        if final.get("event") == "result" and rc == 0:
            return final
        if final.get("event") == "error":
            raise error_from_event(final)
        tail = " | ".join(list(stderr_tail)[-5:])
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        raise E.TraceError(f"training worker {how} without reporting a result{_kill_hint(rc)}; "
                           f"last output: {tail[-600:]}")

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.settings.cancel_grace_seconds)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _kill_hint(rc: int | None) -> str:
    """What a SIGKILL nobody in TRACE sent most likely was, and what to change.

    The executor itself only sends SIGKILL after a cancel's grace period, and then the job is
    CANCELLED, not failed; a worker killed by signal 9 otherwise was almost always stopped by the
    kernel's out-of-memory killer (as when two SmolLM2 workers each took 21 GB for one
    32-episode backward pass on a 23 GB machine)."""
    if rc != -signal.SIGKILL:
        return ""
    return (" (SIGKILL from outside TRACE: usually the kernel's out-of-memory killer, see `dmesg`). To lower the "
            "worker's peak memory raise the config's gradient_accumulation_steps (smaller micro-batches, same "
            "update) or set gradient_checkpointing: true, or run fewer training jobs at once (training.parallel); "
            "a re-run continues from the job's last checkpoint")
