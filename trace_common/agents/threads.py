"""Torch's CPU thread count for a warm start on a machine shared with other work.

Measured on this 2-core machine (micro agent, copying steps): quiet, 2 intra-op threads take
0.16-0.20 s a step and 1 thread 0.28 s; with other jobs on the cores (load average ~9), 2 threads
took 16.6 s a step and 1 thread 2.5 s. Two threads meet at a barrier after every operator, and when
the scheduler has parked one of them the other waits out its time slice, hundreds of times a step.
Neither setting is right in both cases, and the load changes while a 15-minute build runs, so
`ThreadTuner` measures: it times a few steps at each candidate count at the start of each training
phase and again every `period` steps, and trains with the fastest (seconds per token run, so
batches of different lengths compare). `sft.train` uses it for runs of at least `MIN_STEPS` steps,
where a trial's few slow steps cost little; shorter runs keep the process's thread count.

Changing the count changes only the order of floating-point sums inside kernels: replayed losses
differ by under 1e-6 over the first 30 steps (1 thread against 2, measured here), well inside the
tolerance a shipped build's replay allows (`shipped.LOSS_TOLERANCE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: Training runs shorter than this keep the thread count they were given.
MIN_STEPS = 100


@dataclass
class ThreadTuner:
    """Call `before(step, phase)` before each optimizer step and `after(step, seconds, tokens)` after it.

    Semantics:
        a trial = up to `trial` consecutive steps at one candidate count, timed (seconds / tokens)
        at a phase's first step and every `period` steps: the current count first, then each other
        candidate (cut after one step when that step is slower than `give_up` x the current median)
        then train at argmin over candidates of the trial's median seconds per token
    """

    candidates: tuple[int, ...] = field(default_factory=lambda: tuple(sorted({1, torch.get_num_threads()})))
    period: int = 200
    trial: int = 3
    give_up: float = 1.5
    chosen: int = field(default_factory=torch.get_num_threads)
    #: (step, phase, chosen thread count, {count: seconds per 1k tokens}) per decision, for the build record.
    decisions: list[tuple[int, str, int, dict[int, float]]] = field(default_factory=list)
    _queue: list[int] = field(default_factory=list)
    _samples: dict[int, list[float]] = field(default_factory=dict)
    _phase: str = ""
    _since: int = 0
    _current: int = 0

    def before(self, step: int, phase: str) -> None:
        if len(self.candidates) < 2:
            return
        if phase != self._phase or (not self._queue and step - self._since >= self.period):
            self._phase, self._since = phase, step
            others = [c for c in self.candidates if c != self.chosen]
            self._queue = [self.chosen] * self.trial + [c for c in others for _ in range(self.trial)]
            self._samples = {}
        self._current = self._queue[0] if self._queue else self.chosen
        if torch.get_num_threads() != self._current:
            torch.set_num_threads(self._current)

    def after(self, step: int, seconds: float, tokens: int) -> None:
        if not self._queue:
            return
        self._queue.pop(0)
        per_token = seconds / max(1, tokens)
        self._samples.setdefault(self._current, []).append(per_token)
        base = self._samples.get(self.chosen)
        if self._current != self.chosen and base and per_token > self.give_up * _median(base):
            self._queue = [c for c in self._queue if c != self._current]  # clearly slower: stop trying it
        if not self._queue:
            medians = {c: _median(v) for c, v in self._samples.items()}
            self.chosen = min(medians, key=medians.__getitem__)
            self.decisions.append((step, self._phase, self.chosen, {c: round(m * 1000, 4) for c, m in medians.items()}))
            torch.set_num_threads(self.chosen)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]
