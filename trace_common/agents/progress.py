"""Progress of a base-agent build, as events a caller shows (a job's progress, a terminal bar, a log).

A first-use build of `micro` runs for minutes; the code that asks for the agent (a rollout job,
a calibration, `tracectl agents build`) hands `resolve_base_agent` a `BuildProgress` callback
and turns each `BuildEvent` into its own display. Events come:

* once when a build starts (`phase="start"`: what is built, why, and where it will be cached),
  and once per phase change (`data`, `tokenizer`, `copying`, `imitation`, `evaluating`,
  `saving`, `installing`, `done`);
* during training every `report_every` optimizer steps, with the step, the mean loss of the
  steps since the last event, elapsed time and an ETA;
* while another process holds the build lock (`phase="waiting"`), every `poll_s` seconds,
  with who builds it, since when, and that builder's last event.

`throttled(progress, seconds)` drops step events that come faster than a display needs, never
a phase change. `job_progress(ctx)` shows events as a service job's progress (stage + message,
steps as completed/total), which is what `resolve_base_agent` does by itself inside any job
(`trace_common.jobs.current_job`): `tracectl` then shows the build while it watches the job.
`log_progress` is the fallback outside jobs when the caller passes no callback: log lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

log = logging.getLogger("trace_common.agents")


@dataclass(frozen=True)
class BuildEvent:
    agent: str                   # "micro", "smollm2", ...
    phase: str                   # start | waiting | data | tokenizer | copying | imitation | evaluating | ...
    step: int = 0                # optimizer steps done (copying + imitation)
    total: int = 0               # optimizer steps planned; 0 outside training
    loss: float | None = None    # mean loss of the steps since the previous event
    elapsed_s: float = 0.0       # since the build (or the wait) started
    eta_s: float | None = None   # estimated seconds left; None when unknown
    message: str = ""            # the human part: what happens, why, where
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        """One log/progress line, e.g. `imitation step 1700/2200 loss 0.4123, 9m12s elapsed, ETA 4m40s`."""
        detail = self.detail()
        return f"{self.phase} {detail}" if detail and not detail.startswith(":") else f"{self.phase}{detail}"

    def detail(self) -> str:
        """`line()` without the phase: steps, loss, times, then the message after a colon."""
        parts = []
        if self.total:
            parts.append(f"step {self.step}/{self.total}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        text = " ".join(parts)
        timing = [f"{fmt_seconds(self.elapsed_s)} elapsed"] if self.elapsed_s >= 1 else []
        if self.eta_s is not None:
            timing.append(f"ETA {fmt_seconds(self.eta_s)}")
        if timing:
            text = f"{text}, {', '.join(timing)}" if text else ", ".join(timing)
        if self.message:
            text = f"{text}: {self.message}" if text else f": {self.message}"
        return text

    def to_dict(self) -> dict:
        return asdict(self)


BuildProgress = Callable[[BuildEvent], None]


def fmt_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def throttled(progress: BuildProgress, seconds: float) -> BuildProgress:
    """Forward every phase change and the last step of training; other step events at most every `seconds`."""
    last: dict[str, object] = {"phase": None, "t": float("-inf")}

    def forward(event: BuildEvent) -> None:
        now = time.monotonic()
        final_step = bool(event.total) and event.step >= event.total
        if event.phase != last["phase"] or final_step or now - float(last["t"]) >= seconds:  # type: ignore[arg-type]
            last["phase"], last["t"] = event.phase, now
            progress(event)
    return forward


def log_progress(event: BuildEvent) -> None:
    """The default display: one INFO log line per event (callers pass `throttled(log_progress, 30)`)."""
    log.info("base agent %s: %s", event.agent, event.line())


@dataclass
class StepClock:
    """Elapsed time and ETA of a two-phase warm start (copying steps, then imitation steps).

    Semantics:
        rate_c = seconds per copying step measured so far
        rate_i = seconds per imitation step measured so far, or, before the first one,
                 rate_c * tokens_i / tokens_c * IMITATION_TOKEN_COST  (an estimate)
        eta    = (copy steps left) * rate_c + (imitation steps left) * rate_i
    """

    copy_steps: int
    steps: int
    copy_tokens_per_step: float = 0.0
    imitation_tokens_per_step: float = 0.0
    started: float = field(default_factory=lambda: time.perf_counter())
    _copy_done: int = 0
    _copy_seconds: float = 0.0
    _imit_done: int = 0
    _imit_seconds: float = 0.0
    _last: float = 0.0

    #: An imitation token costs about 2.5x a copying token here (measured on the micro agent, 2 cores:
    #: 0.18 s for a 1,760-token copying step, 1.0 s for a 3,930-token imitation step whose suffixes
    #: attend to a ~1,100-token shared system prompt).
    IMITATION_TOKEN_COST = 2.5

    def __post_init__(self) -> None:
        self._last = self.started

    def tick(self, step: int) -> None:
        """Step `step` (1-based, over both phases) just finished."""
        now = time.perf_counter()
        if step <= self.copy_steps:
            self._copy_done, self._copy_seconds = self._copy_done + 1, self._copy_seconds + now - self._last
        else:
            self._imit_done, self._imit_seconds = self._imit_done + 1, self._imit_seconds + now - self._last
        self._last = now

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def eta(self, step: int) -> float | None:
        rate_c = self._copy_seconds / self._copy_done if self._copy_done else None
        if self._imit_done:
            rate_i: float | None = self._imit_seconds / self._imit_done
        elif rate_c is not None and self.copy_tokens_per_step and self.imitation_tokens_per_step:
            rate_i = rate_c * self.imitation_tokens_per_step / self.copy_tokens_per_step * self.IMITATION_TOKEN_COST
        else:
            rate_i = None
        copy_left = max(0, self.copy_steps - step)
        imit_left = max(0, self.steps - max(step - self.copy_steps, 0))
        if (copy_left and rate_c is None) or (imit_left and rate_i is None):
            return None
        return copy_left * (rate_c or 0.0) + imit_left * (rate_i or 0.0)


#: Job stage shown for each phase (the stage stays the same through a build, so a watcher's
#: plain-line display logs per 10 % of steps rather than per event).
JOB_STAGES = {"waiting": "waiting for base agent {agent}", "installing": "installing base agent {agent}",
              "data": "checking base agent {agent}", "done": "base agent {agent} ready"}


def job_stage(event: BuildEvent) -> str:
    return JOB_STAGES.get(event.phase, "building base agent {agent}").format(agent=event.agent)


def job_progress(ctx, interval_s: float = 1.0) -> BuildProgress:
    """Events -> `ctx.progress` of a `trace_common.jobs.JobContext` (thread-safe), at most one step
    event per `interval_s`: stage `job_stage(event)`, message `event.line()`, completed/total = steps."""
    def forward(event: BuildEvent) -> None:
        ctx.progress(completed=event.step, total=event.total, stage=job_stage(event), message=event.line())
    return throttled(forward, interval_s)


def default_progress() -> BuildProgress:
    """Inside a service job (`trace_common.jobs.current_job`): the job's progress (`job_progress`);
    elsewhere one log line per 30 s (`log_progress`)."""
    from trace_common.jobs import current_job

    ctx = current_job()
    return job_progress(ctx) if ctx is not None else throttled(log_progress, 30.0)
