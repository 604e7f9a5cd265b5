"""Long-running jobs, the same way in every service (rollout batches, analyses, generation,
training): ids, a state machine, progress, output artifacts, cancel, poll and watch.

Domain code only: the servicers translate `JobRecord` to the `trace.v1.Job` proto.

State machine: PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED (PENDING may go straight
to CANCELLED). A job body is an async function receiving a `JobContext`; it reports progress
and outputs through it. An exception fails the job with the exception's reason and status
code name (`TraceError.code`); a cancel request cancels the body's task. Outputs are only
published by SUCCEEDED jobs; what a body registered before failing stays listed but the job
is not reported complete.

`current_job()` is the running job's `JobContext` anywhere in its body's context -- worker
threads started with `asyncio.to_thread` included, since they copy the context -- so shared code
that runs for minutes inside some job (a base-agent build: `trace_common.agents`) reports as that
job's progress without every caller passing the context down. `JobContext.progress` may be called
from any thread: off the service's event loop it is handed to the loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import enum
import itertools
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, TraceError
from trace_common.metrics import ServiceMetrics

log = logging.getLogger(__name__)

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
MAX_LABELS = 16
MAX_LABEL_VALUE = 256


class JobState(enum.IntEnum):
    """Values equal the proto enum `trace.v1.JobState`."""

    PENDING = 1
    RUNNING = 2
    SUCCEEDED = 3
    FAILED = 4
    CANCELLED = 5

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Output:
    uri: str
    sha256: str
    size_bytes: int
    kind: str


@dataclass(frozen=True)
class JobRecord:
    """An immutable snapshot of a job; each change makes a new one (safe to hand to watchers)."""

    job_id: str
    kind: str
    state: JobState
    create_time: float
    run_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    start_time: float | None = None
    end_time: float | None = None
    completed: int = 0
    total: int = 0
    stage: str = ""
    message: str = ""
    outputs: tuple[Output, ...] = ()
    error_code: str = ""
    error_message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    #: Service-specific result (e.g. a rollout summary), set when SUCCEEDED.
    result: Any = None
    #: Monotonic version; watchers use it to skip duplicates.
    version: int = 0


def validate_run_id(run_id: str, field_name: str = "run_id") -> str:
    if run_id and not RUN_ID_RE.match(run_id):
        raise InvalidArgument(field=field_name, expected="1-64 characters of letters, digits, '-' or '_', "
                              "starting with a letter or digit", got=run_id, fix="e.g. 'demo-2026-11-29'")
    return run_id


def validate_labels(labels: dict[str, str], field_name: str = "labels") -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(field=field_name, expected=f"at most {MAX_LABELS} entries", got=len(labels),
                              fix="drop some labels")
    for k, v in labels.items():
        if not LABEL_KEY_RE.match(k):
            raise InvalidArgument(field=f"{field_name}[{k!r}]", expected="a lower-case key matching "
                                  r"[a-z][a-z0-9_.-]{0,62}", fix="rename the label key")
        if len(v) > MAX_LABEL_VALUE:
            raise InvalidArgument(field=f"{field_name}[{k!r}]", expected=f"a value of at most {MAX_LABEL_VALUE} "
                                  "characters", got=len(v), fix="shorten the value")
    return dict(labels)


class JobContext:
    """What a running job body may do: report progress, metrics and outputs."""

    def __init__(self, manager: JobManager, job_id: str, loop: asyncio.AbstractEventLoop | None = None):
        self._manager = manager
        self.job_id = job_id
        self._loop = loop
        self._loop_thread = threading.get_ident() if loop is not None else None

    def progress(self, completed: int | None = None, total: int | None = None, stage: str | None = None,
                 message: str | None = None) -> None:
        """Update the job's progress (any field left None keeps its value). Thread-safe: called off
        the job's event loop, the update is scheduled on it (watchers are notified there)."""
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            try:
                self._loop.call_soon_threadsafe(self.progress, completed, total, stage, message)
            except RuntimeError:  # the loop is closed: the service stopped, nobody watches
                pass
            return
        rec = self._manager._jobs.get(self.job_id)
        if rec is None or rec.state.terminal:
            return  # e.g. a worker thread of a cancelled job still reporting: the job's last state stands
        changes: dict[str, Any] = {}
        if completed is not None:
            changes["completed"] = completed
        if total is not None:
            changes["total"] = total
        if stage is not None:
            changes["stage"] = stage
        if message is not None:
            changes["message"] = message
        self._manager._update(self.job_id, **changes)

    def set_metrics(self, values: dict[str, float]) -> None:
        rec = self._manager._jobs[self.job_id]
        self._manager._update(self.job_id, metrics={**rec.metrics, **{k: float(v) for k, v in values.items()}})

    def add_output(self, output: Output) -> None:
        rec = self._manager._jobs[self.job_id]
        self._manager._update(self.job_id, outputs=(*rec.outputs, output))

    @property
    def record(self) -> JobRecord:
        return self._manager._jobs[self.job_id]


JobBody = Callable[[JobContext], Awaitable[Any]]

_CURRENT_JOB: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("trace_current_job", default=None)


def current_job() -> JobContext | None:
    """The `JobContext` of the job whose body (or a thread it started with `asyncio.to_thread`)
    runs this code; None outside any job."""
    return _CURRENT_JOB.get()


class JobManager:
    """In-memory job table of one service, with bounded concurrency and change notification.

    Jobs are not persisted across service restarts: durable state lives in the artifact store
    and the run manifest, which is how pipelines resume.
    """

    def __init__(self, service: str, metrics: ServiceMetrics | None = None, max_concurrent: int = 4,
                 max_queued: int = 1000, retain: int = 10_000):
        self.service = service
        self._metrics = metrics
        self._sem = asyncio.Semaphore(max_concurrent)
        self._max_queued = max_queued
        self._retain = retain
        self._jobs: dict[str, JobRecord] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._by_request: dict[str, str] = {}
        self._watchers: dict[str, set[asyncio.Queue[JobRecord]]] = {}
        self._seq = itertools.count()

    # -- queries ---------------------------------------------------------------------------
    def get(self, job_id: str) -> JobRecord:
        if not job_id:
            raise InvalidArgument(field="job_id", expected="a job id returned by Create…", got=job_id)
        try:
            return self._jobs[job_id]
        except KeyError:
            raise NotFound(f"no {self.service} job with id {job_id!r}; list jobs to see existing ids") from None

    def is_live(self, job_id: str) -> bool:
        """Whether `job_id` is pending or running (False for a finished or evicted job)."""
        rec = self._jobs.get(job_id)
        return rec is not None and not rec.state.terminal

    def list(self, states: list[JobState] | None = None, run_id: str = "", page_size: int = 0,
             page_token: str = "") -> tuple[list[JobRecord], str]:
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument(field="page_size", expected="0..1000 (0 means 100)", got=page_size)
        size = page_size or 100
        offset = 0
        if page_token:
            try:
                offset = int(base64.urlsafe_b64decode(page_token.encode()).decode())
                if offset < 0:
                    raise ValueError
            except (ValueError, UnicodeDecodeError):
                raise InvalidArgument(field="page_token", expected="a next_page_token from a previous "
                                      "response", got=page_token) from None
        jobs = [j for j in self._jobs.values()
                if (not states or j.state in states) and (not run_id or j.run_id == run_id)]
        jobs.sort(key=lambda j: (j.create_time, j.job_id), reverse=True)
        page = jobs[offset:offset + size]
        nxt = ""
        if offset + size < len(jobs):
            nxt = base64.urlsafe_b64encode(str(offset + size).encode()).decode()
        return page, nxt

    async def watch(self, job_id: str) -> AsyncIterator[JobRecord]:
        """Yield the job now and then every change (none skipped), ending after a terminal state."""
        rec = self.get(job_id)
        queue: asyncio.Queue[JobRecord] = asyncio.Queue()
        watchers = self._watchers.setdefault(job_id, set())
        watchers.add(queue)
        try:
            yield rec
            while not rec.state.terminal:
                rec = await queue.get()
                yield rec
        finally:
            watchers.discard(queue)

    # -- commands --------------------------------------------------------------------------
    @staticmethod
    def validate_request(run_id: str, labels: dict[str, str] | None, request_id: str) -> dict[str, str]:
        """Checks of the fields every Create…Job request has; call before any other work."""
        validate_run_id(run_id)
        if len(request_id) > 128:
            raise InvalidArgument(field="request_id", expected="at most 128 characters", got=len(request_id))
        return validate_labels(labels or {})

    def submit(self, kind: str, body: JobBody, *, run_id: str = "", labels: dict[str, str] | None = None,
               request_id: str = "") -> JobRecord:
        """Create a job and schedule its body. A repeated `request_id` returns the existing job."""
        labels = self.validate_request(run_id, labels, request_id)
        if request_id:
            if request_id in self._by_request:
                return self._jobs[self._by_request[request_id]]
        active = sum(1 for j in self._jobs.values() if not j.state.terminal)
        if active >= self._max_queued:
            raise ResourceExhausted(f"{active} {self.service} jobs are pending or running (limit "
                                    f"{self._max_queued}); wait for some to finish or cancel them")
        job_id = f"{kind[:12]}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        rec = JobRecord(job_id=job_id, kind=kind, state=JobState.PENDING, create_time=time.time(),
                        run_id=run_id, labels=labels, version=next(self._seq))
        self._jobs[job_id] = rec
        if request_id:
            self._by_request[request_id] = job_id
        if self._metrics:
            self._metrics.jobs_active.labels(kind).inc()
        self._tasks[job_id] = asyncio.get_running_loop().create_task(self._run(job_id, body))
        self._evict()
        return rec

    def by_request(self, request_id: str) -> JobRecord | None:
        """The job an earlier request with this `request_id` created (what `submit` returns again)."""
        job_id = self._by_request.get(request_id) if request_id else None
        return self._jobs.get(job_id) if job_id else None

    def cancel(self, job_id: str) -> JobRecord:
        rec = self.get(job_id)
        if rec.state.terminal:
            if rec.state == JobState.CANCELLED:
                return rec
            raise FailedPrecondition(f"job {job_id} already ended ({rec.state.name}); nothing to cancel")
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
        if rec.state == JobState.PENDING:
            self._finish(job_id, JobState.CANCELLED, message="cancelled before it started")
        return self._jobs[job_id]

    async def wait(self, job_id: str, timeout: float | None = None) -> JobRecord:
        """Wait for a terminal state (tests, embedded orchestration)."""
        async def _until_done() -> JobRecord:
            last = self.get(job_id)
            async for snapshot in self.watch(job_id):
                last = snapshot
            return last
        return await asyncio.wait_for(_until_done(), timeout)

    async def shutdown(self) -> None:
        """Cancel every unfinished job (service stop)."""
        for task in list(self._tasks.values()):
            if not task.done():
                task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # -- internals -------------------------------------------------------------------------
    async def _run(self, job_id: str, body: JobBody) -> None:
        try:
            async with self._sem:
                if self._jobs[job_id].state.terminal:
                    return
                self._update(job_id, state=JobState.RUNNING, start_time=time.time())
                ctx = JobContext(self, job_id, asyncio.get_running_loop())
                _CURRENT_JOB.set(ctx)  # this task's own context: seen by its body and the threads it starts
                result = await body(ctx)
            self._finish(job_id, JobState.SUCCEEDED, result=result)
        except asyncio.CancelledError:
            self._finish(job_id, JobState.CANCELLED, message="cancelled")
        except TraceError as err:
            self._finish(job_id, JobState.FAILED, error=(err.code, err.reason))
        except Exception as err:  # noqa: BLE001 -- a job failure must never crash the service
            log.exception("%s job %s crashed", self.service, job_id)
            self._finish(job_id, JobState.FAILED, error=("INTERNAL", f"{type(err).__name__}: {err}"))
        finally:
            self._tasks.pop(job_id, None)

    def _finish(self, job_id: str, state: JobState, *, result: Any = None, message: str | None = None,
                error: tuple[str, str] | None = None) -> None:
        rec = self._jobs[job_id]
        if rec.state.terminal:
            return
        changes: dict[str, Any] = {"state": state, "end_time": time.time()}
        if result is not None:
            changes["result"] = result
        if message is not None:
            changes["message"] = message
        if error is not None:
            changes["error_code"], changes["error_message"] = error
            changes["message"] = error[1][:200]
        self._update(job_id, **changes)
        if self._metrics:
            self._metrics.jobs_active.labels(rec.kind).dec()
            self._metrics.jobs.labels(rec.kind, state.name.lower()).inc()

    def _update(self, job_id: str, **changes: Any) -> None:
        rec = replace(self._jobs[job_id], **changes, version=next(self._seq))
        self._jobs[job_id] = rec
        for queue in self._watchers.get(job_id, ()):
            queue.put_nowait(rec)

    def _evict(self) -> None:
        if len(self._jobs) <= self._retain:
            return
        done = sorted((j for j in self._jobs.values() if j.state.terminal), key=lambda j: j.create_time)
        for j in done[: len(self._jobs) - self._retain]:
            self._jobs.pop(j.job_id, None)
            self._watchers.pop(j.job_id, None)
