"""Long-running jobs, the same way in every service (rollout batches, analyses, generation,
training): ids, a state machine, progress, output artifacts, cancel, poll and watch.

Domain code only: the servicers translate `JobRecord` to the `trace.v1.Job` proto.

State machine: PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED (PENDING may go straight
to CANCELLED). A job body is an async function receiving a `JobContext`; it reports progress
and outputs through it. An exception fails the job with the exception's reason and status
code name (`TraceError.code`); a cancel request cancels the body's task. Outputs are only
published by SUCCEEDED jobs; what a body registered before failing stays listed but the job
is not reported complete.

Bounded per service (trust boundaries: no client can exhaust a service): at most `max_pending` jobs
wait as PENDING, and their specs together hold at most `max_pending_bytes` (each job's footprint,
given by the caller: `estimate_footprint` of what its body keeps); past either cap `submit` raises
ResourceExhausted with a retry hint. A job's footprint is released when it starts running or ends
while pending. A body may take its validated spec as `submit(spec=...)` instead of closing over it:
a pending job then holds the spec pickled, as one bytes object (its footprint is that size), and the
body reads it back as `ctx.spec` when the job starts. Ten thousand task ids held as objects spread
over ~1 MiB of small-object arenas, and a few long-lived objects allocated beside them (job records)
keep those arenas from ever being returned; one large bytes object is returned whole when freed.
A job cancelled before it started drops its body and spec at once, and the manager then hands freed
heap pages back to the OS (`trace_common.malloc.release_free_memory`), so the process's RSS returns
near where it was (tests/integration/test_job_flood.py measures it). Watching is bounded too: at most
MAX_WATCHERS_PER_JOB streams watch one job at once (one more is ResourceExhausted), and each holds at
most WATCH_QUEUE unread records: a watcher slower than the job's updates loses the oldest unread
ones, never the latest (so it always sees the terminal record).

`request_id` makes a Create idempotent within one run: the key is (run_id, request_id), so the same
request_id under another run_id is another request. The entry lives as long as its job: a job evicted
from the table (a finished job, past `retain` jobs) takes its entry with it, and a retry of that
request_id afterwards creates a new job (the old one is gone; its results stay in the store).

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
import pickle
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trace_common import limits
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, TraceError
from trace_common.malloc import DeferredRelease
from trace_common.metrics import ServiceMetrics

log = logging.getLogger(__name__)

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
MAX_LABELS = limits.LABELS
MAX_LABEL_VALUE = limits.LABEL_VALUE_CHARS
MAX_REQUEST_ID = limits.REQUEST_ID_CHARS
#: Defaults of the pending-job caps (ServiceSettings.max_pending_jobs / max_pending_bytes).
DEFAULT_MAX_PENDING = 1000
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024
#: Seconds after a pending job's cancellation before freed heap pages go back to the OS (one trim
#: for a burst of cancellations).
TRIM_DELAY_S = 0.5
#: Watch streams open on one job at once; one more is ResourceExhausted.
MAX_WATCHERS_PER_JOB = 64
#: Unread records held for one watcher; past it the oldest unread one is dropped for the newest.
WATCH_QUEUE = 16


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


def estimate_footprint(*values: Any) -> int:
    """Bytes `values` hold in this process, estimated: `sys.getsizeof` summed over each object and what
    it holds (dict keys and values, sequence and set items, pydantic models' and dataclasses' fields,
    `__slots__`), each object counted once. An estimate of what a pending job keeps alive: a spec of
    10,000 task ids holds ~6x its JSON size (every id is an object of its own)."""
    seen: set[int] = set()
    stack = list(values)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj, 64)
        if isinstance(obj, (str, bytes, bytearray, memoryview)):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            fields = getattr(obj, "__dict__", None)
            if isinstance(fields, dict):
                stack.append(fields)
            for name in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, name, None))
            private = getattr(obj, "__pydantic_private__", None)
            if isinstance(private, dict):
                stack.append(private)
    return total


class JobContext:
    """What a running job body may do: report progress, metrics and outputs."""

    def __init__(self, manager: JobManager, job_id: str, loop: asyncio.AbstractEventLoop | None = None):
        self._manager = manager
        self.job_id = job_id
        self._loop = loop
        self._loop_thread = threading.get_ident() if loop is not None else None
        #: The spec given to `submit(spec=...)`, read back when the job started (None when none was).
        self.spec: Any = None

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
                 max_pending: int = DEFAULT_MAX_PENDING, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 retain: int = 10_000):
        self.service = service
        self._metrics = metrics
        self._sem = asyncio.Semaphore(max_concurrent)
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes
        self._retain = retain
        self._jobs: dict[str, JobRecord] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        #: (run_id, request_id) -> job id, and back (pruned with the job in `_evict`).
        self._by_request: dict[tuple[str, str], str] = {}
        self._request_of: dict[str, tuple[str, str]] = {}
        #: PENDING job id -> its footprint in bytes (released when it starts or ends).
        self._pending: dict[str, int] = {}
        #: Job id -> its body, until the job starts (then the running task holds it) or ends before that
        #: (then it is dropped here: nothing else references it, not even a cancelled task's traceback).
        self._bodies: dict[str, JobBody] = {}
        #: Job id -> (pickled spec, or None, and the spec itself when it could not be pickled), until it starts.
        self._specs: dict[str, tuple[bytes | None, Any]] = {}
        self._trim = DeferredRelease(TRIM_DELAY_S)
        self._watchers: dict[str, set[asyncio.Queue[JobRecord]]] = {}
        self._seq = itertools.count()
        #: Called with a job id when the job is evicted: a service's own per-job tables (the rollout
        #: service's output-prefix writers, the trainer's iterations) shrink with the job table.
        self.on_evict: list[Callable[[str], None]] = []

    @classmethod
    def from_settings(cls, service: str, metrics: ServiceMetrics | None, settings: Any) -> JobManager:
        """The job table of a service configured by its ServiceSettings (max_concurrent_jobs,
        max_pending_jobs, max_pending_bytes, retained_jobs)."""
        return cls(service, metrics, max_concurrent=settings.max_concurrent_jobs,
                   max_pending=settings.max_pending_jobs, max_pending_bytes=settings.max_pending_bytes,
                   retain=settings.retained_jobs)

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
        """Yield the job now and then its changes in order, ending after a terminal state. A watcher
        that falls WATCH_QUEUE records behind skips the oldest it has not read (never the latest).
        ResourceExhausted when MAX_WATCHERS_PER_JOB streams already watch this job."""
        rec = self.get(job_id)
        watchers = self._watchers.setdefault(job_id, set())
        if len(watchers) >= MAX_WATCHERS_PER_JOB:
            raise ResourceExhausted(f"{len(watchers)} streams already watch {self.service} job {job_id} (limit "
                                    f"{MAX_WATCHERS_PER_JOB}); close one, or poll Get…Job instead of watching")
        queue: asyncio.Queue[JobRecord] = asyncio.Queue(maxsize=WATCH_QUEUE)
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
        if len(request_id) > MAX_REQUEST_ID:
            raise InvalidArgument(field="request_id", expected=f"at most {MAX_REQUEST_ID} characters",
                                  got=len(request_id), fix="use a short unique id, e.g. a UUID")
        return validate_labels(labels or {})

    @property
    def pending_bytes(self) -> int:
        """The footprints of the PENDING jobs, summed (bytes)."""
        return sum(self._pending.values())

    def submit(self, kind: str, body: JobBody, *, run_id: str = "", labels: dict[str, str] | None = None,
               request_id: str = "", footprint: int | None = None, spec: Any = None) -> JobRecord:
        """Create a job and schedule its body. A repeated `request_id` under the same `run_id` returns the
        existing job. `spec`: what the body reads as `ctx.spec`, held pickled while the job waits (held
        as is when it cannot be pickled). `footprint`: bytes the body keeps alive while the job waits
        (`estimate_footprint` of what it closes over); by default the pickled spec's size (or the
        spec's estimate). ResourceExhausted when the pending jobs' count or bytes would pass the caps
        (module docstring)."""
        labels = self.validate_request(run_id, labels, request_id)
        found = self.by_request(request_id, run_id=run_id)
        if found is not None:
            return found
        frozen: bytes | None = None
        if spec is not None:
            try:
                frozen = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError):
                frozen = None  # (e.g. a spec holding a lambda): held as is, counted by its estimate
        if footprint is None:
            footprint = len(frozen) if frozen is not None else estimate_footprint(spec)
        footprint = max(0, int(footprint))
        self._check_room(footprint)
        job_id = f"{kind[:12]}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        rec = JobRecord(job_id=job_id, kind=kind, state=JobState.PENDING, create_time=time.time(),
                        run_id=run_id, labels=labels, version=next(self._seq))
        self._jobs[job_id] = rec
        self._pending[job_id] = footprint
        if spec is not None:
            self._specs[job_id] = (frozen, None if frozen is not None else spec)
            del spec
        if request_id:
            self._by_request[(run_id, request_id)] = job_id
            self._request_of[job_id] = (run_id, request_id)
        if self._metrics:
            self._metrics.jobs_active.labels(kind).inc()
        self._bodies[job_id] = body
        del body
        self._tasks[job_id] = asyncio.get_running_loop().create_task(self._run(job_id))
        self._evict()
        return rec

    def by_request(self, request_id: str, *, run_id: str) -> JobRecord | None:
        """The job an earlier request with this `request_id` under this `run_id` created (what `submit`
        returns again); None when there is none, or its job was evicted."""
        job_id = self._by_request.get((run_id, request_id)) if request_id else None
        return self._jobs.get(job_id) if job_id else None

    def _check_room(self, footprint: int) -> None:
        """ResourceExhausted, with a retry hint, unless one more pending job of `footprint` bytes fits."""
        count, held = len(self._pending), self.pending_bytes
        setting = f"TRACE_{self.service.upper()}_MAX_PENDING"
        hint = ("retry after some of them start or finish (WatchJob / ListJobs show them), with backoff, "
                "or cancel pending jobs you no longer need")
        if count >= self._max_pending:
            raise ResourceExhausted(f"{count} {self.service} jobs are pending (limit {self._max_pending}, "
                                    f"{setting}_JOBS); {hint}")
        if held + footprint > self._max_pending_bytes:
            mib = 1 << 20
            raise ResourceExhausted(
                f"{count} pending {self.service} jobs hold {held / mib:.1f} MiB and this one "
                f"{footprint / mib:.1f} MiB, over the limit of {self._max_pending_bytes / mib:.1f} MiB of pending "
                f"specs ({setting}_BYTES); {hint}, or send smaller specs (fewer task ids, a shorter prompt)")

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
    async def _run(self, job_id: str) -> None:
        try:
            async with self._sem:
                body = self._bodies.pop(job_id, None)
                frozen, spec = self._specs.pop(job_id, (None, None))
                if body is None or self._jobs[job_id].state.terminal:
                    return
                self._pending.pop(job_id, None)
                self._update(job_id, state=JobState.RUNNING, start_time=time.time())
                ctx = JobContext(self, job_id, asyncio.get_running_loop())
                ctx.spec = pickle.loads(frozen) if frozen is not None else spec  # (bytes this manager pickled)
                frozen = spec = None
                _CURRENT_JOB.set(ctx)  # this task's own context: seen by its body and the threads it starts
                running, body = body(ctx), None  # (the coroutine holds the closure only while it runs)
                result = await running
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

    def _trim_soon(self) -> None:
        """Hand freed heap pages back to the OS shortly (one trim for a burst of cancellations): by
        then the ended tasks have dropped their bodies."""
        try:
            self._trim.request(asyncio.get_running_loop())
        except RuntimeError:  # no loop (the service stopped): nothing to hand back
            return

    def _finish(self, job_id: str, state: JobState, *, result: Any = None, message: str | None = None,
                error: tuple[str, str] | None = None) -> None:
        rec = self._jobs[job_id]
        if rec.state.terminal:
            return
        self._bodies.pop(job_id, None)                   # ended before it started: body and spec dropped now,
        self._specs.pop(job_id, None)
        if self._pending.pop(job_id, None) is not None:  # its room is free, and freed pages go back soon
            self._trim_soon()
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
            if queue.full():          # a slow watcher: drop its oldest unread record, keep the newest
                queue.get_nowait()
            queue.put_nowait(rec)

    def _evict(self) -> None:
        if len(self._jobs) <= self._retain:
            return
        done = sorted((j for j in self._jobs.values() if j.state.terminal), key=lambda j: j.create_time)
        for j in done[: len(self._jobs) - self._retain]:
            self._jobs.pop(j.job_id, None)
            self._watchers.pop(j.job_id, None)
            key = self._request_of.pop(j.job_id, None)
            if key is not None and self._by_request.get(key) == j.job_id:
                del self._by_request[key]
            for hook in self.on_evict:
                hook(j.job_id)
