"""Side-by-side benchmark harness: TRACE's implementation against a named peer, in one run.

Each case times a `trace` callable and a `peer` callable doing the same work, interleaved
(trace, peer, peer, trace, ...) so both see the same background noise (this project's
machines are small and shared), and reports medians, throughput and the ratio
trace/peer throughput (> 1: TRACE is faster). A bench then writes its table into
bench/RESULTS.md, replacing its own previous section, together with the exact command, the
date and the machine, so every number there can be reproduced.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


@dataclass(frozen=True)
class Case:
    """One measured pair: `trace()` and `peer()` each move `nbytes` per call."""

    op: str
    nbytes: int
    trace: Callable[[], object]
    peer: Callable[[], object]
    reps: int
    warmup: int = 1
    server_cpu: Callable[[], float] | None = None
    """Optional: cumulative CPU seconds of a server process both sides talk to (see
    `process_cpu_seconds`), so each call's server-side CPU is recorded too."""


@dataclass(frozen=True)
class Row:
    op: str
    nbytes: int
    reps: int
    trace_s: list[float]
    peer_s: list[float]
    trace_cpu: list[float] = field(default_factory=list)
    """CPU seconds of this process (all threads) per call."""
    peer_cpu: list[float] = field(default_factory=list)
    trace_server_cpu: list[float] = field(default_factory=list)
    peer_server_cpu: list[float] = field(default_factory=list)

    @property
    def trace_median(self) -> float:
        return statistics.median(self.trace_s)

    @property
    def peer_median(self) -> float:
        return statistics.median(self.peer_s)

    @property
    def ratio(self) -> float:
        """trace throughput / peer throughput (same bytes, so peer time / trace time)."""
        return self.peer_median / self.trace_median

    @property
    def pair_ratio(self) -> float:
        """Median over repetitions of the per-repetition ratio (each pair ran back to back)."""
        return statistics.median(p / t for p, t in zip(self.peer_s, self.trace_s, strict=True))

    @property
    def cpu_ratio(self) -> float:
        """(peer client + server CPU) / (TRACE client + server CPU): the throughput ratio a
        fully saturated machine would show, independent of other load. NaN if not measured."""
        trace = sum(self.trace_cpu) + sum(self.trace_server_cpu)
        peer = sum(self.peer_cpu) + sum(self.peer_server_cpu)
        return peer / trace if trace > 0 and self.trace_cpu else float("nan")

    @staticmethod
    def spread(samples: list[float]) -> float:
        """Interquartile range relative to the median."""
        if len(samples) < 4:
            return float("nan")
        q1, _, q3 = statistics.quantiles(samples, n=4)
        return (q3 - q1) / statistics.median(samples)


def run_case(case: Case) -> Row:
    for _ in range(case.warmup):
        case.trace()
        case.peer()
    row = Row(case.op, case.nbytes, case.reps, [], [])
    server = case.server_cpu or (lambda: 0.0)
    sides = ((case.trace, row.trace_s, row.trace_cpu, row.trace_server_cpu),
             (case.peer, row.peer_s, row.peer_cpu, row.peer_server_cpu))
    for i in range(case.reps):
        for fn, wall, cpu, server_cpu in (sides if i % 2 == 0 else sides[::-1]):
            s0, c0, t0 = server(), time.process_time(), time.perf_counter()
            fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            server_cpu.append(server() - s0)
    return row


def process_cpu_seconds(pid: int) -> Callable[[], float]:
    """A reader of another process's cumulative user+system CPU seconds (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stat = Path(f"/proc/{pid}/stat")

    def read() -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    return read


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def mib_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / (1 << 20)


def machine() -> str:
    model = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"nproc={os.cpu_count()}, cpu={model}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def command_line(module: str) -> str:
    return shlex.join([".venv/bin/python", "-m", module, *sys.argv[1:]])


def render(title: str, command: str, peer: str, rows: Sequence[Row], target: float, notes: Sequence[str]) -> str:
    lines = [
        f"## {title}",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; load average (1/5/15 min) at the end: "
        + "/".join(f"{x:.1f}" for x in os.getloadavg()),
        f"- peer: {peer}",
        f"- target: ratio >= {target:g} at every row (ratio = TRACE throughput / peer throughput, medians)",
        "",
        "| op | size | reps | TRACE MiB/s | peer MiB/s | ratio | paired ratio | spread T / P "
        "| client CPU ms/op T / P | server CPU ms/op T / P | CPU ratio | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ok = "ok" if r.ratio >= target else "**MISS**"
        lines.append(
            f"| {r.op} | {human_size(r.nbytes)} | {r.reps} | {mib_s(r.nbytes, r.trace_median):.1f} | "
            f"{mib_s(r.nbytes, r.peer_median):.1f} | {r.ratio:.2f} | {r.pair_ratio:.2f} | "
            f"{Row.spread(r.trace_s):.0%} / {Row.spread(r.peer_s):.0%} | "
            f"{_ms(r.trace_cpu)} / {_ms(r.peer_cpu)} | {_ms(r.trace_server_cpu)} / {_ms(r.peer_server_cpu)} | "
            f"{r.cpu_ratio:.2f} | {ok} |")
    if notes:
        lines.append("")
        lines.extend(f"- {n}" for n in notes)
    return "\n".join(lines) + "\n"


def _ms(samples: list[float]) -> str:
    """Mean (not median: CPU clocks tick in 10 ms steps, the mean of many calls resolves less)."""
    return f"{statistics.fmean(samples) * 1e3:.2f}" if samples else "-"


def print_row(r: Row) -> None:
    print(f"{r.op:>9} {human_size(r.nbytes):>8}  trace {mib_s(r.nbytes, r.trace_median):8.1f} MiB/s  "
          f"peer {mib_s(r.nbytes, r.peer_median):8.1f} MiB/s  ratio {r.ratio:.2f} (paired {r.pair_ratio:.2f})  "
          f"cpu ms/op client {_ms(r.trace_cpu)}/{_ms(r.peer_cpu)} server {_ms(r.trace_server_cpu)}/"
          f"{_ms(r.peer_server_cpu)}", flush=True)


_HEADER = ("# Benchmarks\n\nSide-by-side measurements of TRACE components against peers, produced by the "
           "harness in `bench/` (see bench/README.md). Each section is rewritten by the command it names.\n")


def write_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Insert or replace the section delimited by `<!-- bench:NAME -->` markers."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body}{end}\n"
    text = path.read_text() if path.exists() else _HEADER
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1].lstrip("\n")
        text = before + block + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)
