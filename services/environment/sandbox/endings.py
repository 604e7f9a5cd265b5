"""How a sandbox worker that stopped answering ended, in words: what the process and pod
transports observed, turned into a violation kind and a detail.

Both transports (`parent.ProcessTransport`, `pods.PodTransport`) read the PID-namespace
supervisor's exit line (`exit_report`: signal, CPU seconds, peak RSS); the process transport
also compares the kernel's OOM-kill counter (`oom_kills`) before and after; the pod transport
adds the container's terminated state. `classify_ending` maps that to a kind:

| how it ended                                   | kind      |
|------------------------------------------------|-----------|
| SIGXCPU, or SIGKILL with its CPU time at RLIMIT_CPU (>= CPU_LIMIT_MARGIN of it) | cpu |
| SIGKILL while the kernel counted an OOM kill (/proc/vmstat oom_kill), or a pod OOMKilled | memory |
| SIGKILL otherwise: not by the service, not at a limit, no OOM kill recorded | killed (from outside the sandbox) |
| SIGSYS (a system call seccomp kills for: signalling/tracing another process) | syscall |
| SIGXFSZ                                        | file_size |
| other signals or exit codes                    | crash     |

This module imports only the config and the isolation constants, so the parent side and the
pod transport both depend on it and on nothing of each other's.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from .config import SandboxConfig
from .isolation import EXIT_MARKER

#: A SIGKILLed worker whose CPU time reached this fraction of RLIMIT_CPU is taken to have hit the limit.
CPU_LIMIT_MARGIN = 0.85


def oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat oom_kill), None when unreadable."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def exit_report(tail: str) -> dict[str, Any] | None:
    """The PID-namespace supervisor's last EXIT_MARKER line, if it wrote one."""
    for line in reversed(tail.splitlines()):
        if line.startswith(EXIT_MARKER):
            try:
                data = json.loads(line[len(EXIT_MARKER):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def without_exit_report(tail: str) -> str:
    return "\n".join(line for line in tail.splitlines() if not line.startswith(EXIT_MARKER)).strip()


def classify_ending(end: dict[str, Any], config: SandboxConfig, *, killed_by_us: bool = False) -> tuple[str, str]:
    """(violation kind, detail) for a worker that ended without answering (this module's docstring table).

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
