"""Hostile environment modules against the real sandbox: workers must not see, signal or trace
one another, the service, or anything else outside themselves.

Each case is a module *body* (it runs when the module loads, as a generated candidate's would)
that aims at a victim worker started first, at the service (this test process) or at every
process at once. It runs in two sandboxes:

- `full`: every layer (kernel layers + the Python audit hook and guarded builtins);
- `kernel`: the Python layers off, so only the kernel layers (PID namespace, private /proc,
  a uid of its own, seccomp, rlimits) stand between the module and its target.

The file-read cases aim at host files instead: a world-readable bait file in the host's shared
temp dir, the system's password file, a rollout file in an artifact store directory and a file in
the victim's scratch dir. Each module carries what it read out in its load-error text (how the
attack reached the validation report). With the audit hook off they must fail because the file
is not there at all ("No such file or directory": layer `fs_root`, the worker's own root) -- not
merely because of the uid (the bait files are 0644).

A case passes when the attempt is rejected (the worker dies with a violation whose kind and
detail name the reason) or contained (the module loads, and what it saw shows nothing of any
other process), and afterwards the victim -- started before every case -- still answers, and
the service got no signal. The payloads get `os` without importing it (`random._os`), as code
that slipped past the advisory static check would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from services.environment.sandbox.parent import (
    EnvironmentCodeError,
    SandboxConfig,
    SandboxViolation,
    SandboxWorker,
)
from trace_common.errors import FailedPrecondition

ROOT = os.geteuid() == 0 and sys.platform.startswith("linux")
pytestmark = pytest.mark.skipif(not ROOT, reason="the sandbox's kernel layers need root on Linux (the "
                                "service refuses weak workers); this machine runs the tests as root")

TOY = '''"""A toy environment for the hostile-module tests: say the seeded number back."""
import json
import random

from trace_common.env import Environment, Message, Observation, StepResult

LEAK = []
BODY


class Toy(Environment):
    name = "toy"
    version = "1.0.0"

    def __init__(self):
        self._done, self.seed, self.said = False, None, ""

    def reset(self, seed):
        self.seed, self._done = seed, False
        self.number = random.Random(seed).randrange(1000)
        return Observation(messages=[Message.system("say it"), Message.user(f"say {self.number}")],
                           task_id=str(seed), seed=seed)

    def tool_schemas(self):
        return []

    def step(self, action):
        self._done, self.said = True, getattr(action, "content", "")
        return StepResult(observation=[Message.user("bye ###STOP###")], done=True)

    @property
    def done(self):
        return self._done

    def reward(self):
        return 1.0 if self._done and str(self.number) in self.said else 0.0

    def splits(self):
        return {"train": range(0, 100)}

    @property
    def task_id(self):
        return str(self.seed)


def solve(seed):
    return [{"message": json.dumps(LEAK)}]
'''

OS = "os = random._os\n"
SIGNAL = OS + "signal = os.sys.modules['signal']\n"
CTYPES = OS + "ctypes = os.sys.modules['ctypes']\nlibc = ctypes.CDLL(None)\n"
PROC_WALK = OS + '''for entry in sorted(os.listdir("/proc")):
    if entry.isdigit():
        for what in ("environ", "cmdline", "status"):
            try:
                with open(f"/proc/{entry}/{what}", "rb") as fh:
                    LEAK.append([entry, what, fh.read(400).decode("latin-1")])
            except OSError as exc:
                LEAK.append([entry, what, exc.strerror])
for what in ("environ", "cmdline", "status", "mem"):
    try:
        with open(f"/proc/VICTIM/{what}", "rb") as fh:
            LEAK.append(["VICTIM", what, fh.read(400).decode("latin-1")])
    except OSError as exc:
        LEAK.append(["VICTIM", what, exc.strerror])
'''

#: What the bait files hold; no module may ever show it (nor the password file's first entry).
SECRET = f"trace-bait-secret-{uuid.uuid4().hex}"
PASSWD_ROOT = "root:x:0:0"
#: A module that reads PATH and fails to load with what it read in the error text.
READ = '''try:
    LEAK.append(open(PATH).read())
except OSError as exc:
    LEAK.append(exc.strerror)
raise ValueError("exfiltrated: " + json.dumps(LEAK))
'''
#: Placeholders of the bait paths (filled by `module` from `plant_bait`).
BAIT_TMP, BAIT_STORE, BAIT_SCRATCH = "BAIT_TMP", "BAIT_STORE", "BAIT_SCRATCH"
ABSENT = "No such file or directory"


def _read(path: str) -> str:
    return READ.replace("PATH", repr(path))


def plant_bait(store_root: Path, other_scratch: str) -> dict[str, str]:
    """Write SECRET into 0644 files (under 0755 directories where this code makes them): one in the
    host's shared temp dir, a rollout file in the store at `store_root`, one in `other_scratch` (another
    worker's scratch dir). Returns the placeholder -> path table `module` fills in."""
    tmp = Path(tempfile.gettempdir()) / f"trace-bait-{uuid.uuid4().hex[:12]}.txt"
    store = store_root / "runs" / "other-run" / "rollouts" / "trajectories.jsonl"
    store.parent.mkdir(parents=True, exist_ok=True)
    for d in (store.parent, store.parent.parent, store.parent.parent.parent):
        d.chmod(0o755)
    scratch = Path(other_scratch) / "work" / "bait.txt"
    for path in (tmp, store, scratch):
        path.write_text(SECRET + "\n")
        path.chmod(0o644)
    return {BAIT_TMP: str(tmp), BAIT_STORE: str(store), BAIT_SCRATCH: str(scratch)}


REJECT, CONTAIN = "rejected", "contained"
#: name, module body (VICTIM = the victim worker's pid, SERVICE = this process), then per sandbox:
#: (REJECT, violation kind, fragment of its detail) or (CONTAIN, fragment of what the module saw)
CASES = [
    ("sibling_kill_by_pid", OS + "os.kill(VICTIM, 9)",
     (REJECT, "processes", "os.kill"), (REJECT, "syscall", "SIGSYS")),
    ("sibling_kill_by_pidfd", SIGNAL + "signal.pidfd_send_signal(os.pidfd_open(VICTIM), 9)",
     (REJECT, "syscall", "SIGSYS"), (REJECT, "syscall", "SIGSYS")),
    ("sibling_kill_by_pidfd_of_proc_dir", SIGNAL + "signal.pidfd_send_signal(os.open('/proc/VICTIM', os.O_RDONLY), 9)",
     (REJECT, "filesystem", "/proc/VICTIM"), (CONTAIN, "No such file or directory")),
    ("kill_every_process", OS + "os.kill(-1, 9)",
     (REJECT, "processes", "os.kill"), (REJECT, "syscall", "SIGSYS")),
    ("kill_own_process_group", OS + "os.kill(0, 9)",
     (REJECT, "processes", "os.kill"), (REJECT, "syscall", "SIGSYS")),
    ("signal_the_parent", SIGNAL + "os.kill(os.getppid(), signal.SIGUSR1)",
     (REJECT, "processes", "os.kill"), (REJECT, "syscall", "SIGSYS")),
    ("signal_the_service", SIGNAL + "os.kill(SERVICE, signal.SIGUSR1)",
     (REJECT, "processes", "os.kill"), (REJECT, "syscall", "SIGSYS")),
    ("tgkill_the_victim", CTYPES + "LEAK.append(libc.syscall(TGKILL, VICTIM, VICTIM, 9))",
     (REJECT, "native", "ctypes"), (REJECT, "syscall", "SIGSYS")),
    # tgkill(own pid, VICTIM): the filter lets a thread signal within the worker through; the kernel
    # finds no such thread in it (ESRCH, returned as -1)
    ("tgkill_own_group_victim_tid", CTYPES + "LEAK.append(libc.syscall(TGKILL, os.getpid(), VICTIM, 9))",
     (REJECT, "native", "ctypes"), (CONTAIN, "[-1]")),
    ("proc_walk_of_other_workers", PROC_WALK,
     (REJECT, "filesystem", "list /proc"), (CONTAIN, "No such file or directory")),
    ("ptrace_attach", CTYPES + "LEAK.append(libc.ptrace(16, VICTIM, 0, 0))",
     (REJECT, "native", "ctypes"), (REJECT, "syscall", "SIGSYS")),
    ("process_vm_readv", CTYPES + "LEAK.append(libc.process_vm_readv(VICTIM, None, 0, None, 0, 0))",
     (REJECT, "native", "ctypes"), (REJECT, "syscall", "SIGSYS")),
    # host files (issue #28): the audit hook refuses the read; without it the file is not in the worker's root
    ("read_bait_in_shared_tmp", _read(BAIT_TMP), (REJECT, "filesystem", f"read {BAIT_TMP}"), (CONTAIN, ABSENT)),
    ("read_password_file", _read("/etc/passwd"), (REJECT, "filesystem", "read /etc/passwd"), (CONTAIN, ABSENT)),
    ("read_store_rollouts", _read(BAIT_STORE), (REJECT, "filesystem", f"read {BAIT_STORE}"), (CONTAIN, ABSENT)),
    ("read_other_workers_scratch", _read(BAIT_SCRATCH), (REJECT, "filesystem", f"read {BAIT_SCRATCH}"),
     (CONTAIN, ABSENT)),
]
SANDBOXES = {"full": SandboxConfig(call_timeout_s=15.0), "kernel": SandboxConfig(call_timeout_s=15.0, audit_hook=False)}
TABLE = [(name, body, sandbox, expect) for name, body, full, kernel in CASES
         for sandbox, expect in (("full", full), ("kernel", kernel))]


TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine, -1)


def fill(text: str, victim: int, bait: dict[str, str] | None = None) -> str:
    """`text` with the placeholders filled: the bait paths, VICTIM, SERVICE, TGKILL."""
    for placeholder, path in (bait or {}).items():
        text = text.replace(placeholder, path)
    return text.replace("VICTIM", str(victim)).replace("SERVICE", str(os.getpid())).replace("TGKILL", str(TGKILL))


def module(body: str, victim: int, bait: dict[str, str] | None = None) -> str:
    body = fill(body, victim, bait)
    return TOY.replace("BODY", body)


@pytest.fixture(scope="module")
def victims():
    """One victim worker per sandbox, started before every case and never restarted."""
    started = {}
    for name, config in SANDBOXES.items():
        w = SandboxWorker(config, label="victim")
        w.start()
        w.call("load", source=module("", 0))
        w.call("reset", instance="v", seed=3)
        started[name] = w
    yield started
    for w in started.values():
        w.close()


@pytest.fixture(scope="module")
def bait(victims, tmp_path_factory):
    """Bait files per sandbox (module docstring); the scratch one lies in that sandbox's victim's scratch."""
    store = tmp_path_factory.mktemp("store")
    planted = {name: plant_bait(store, w.transport.scratch) for name, w in victims.items()}
    yield planted
    for paths in planted.values():
        Path(paths[BAIT_TMP]).unlink(missing_ok=True)


@pytest.fixture
def service_signals():
    """SIGUSR1 deliveries to this process (the service) while the test runs."""
    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda sig, frame: got.append(sig))
    yield got
    signal.signal(signal.SIGUSR1, old)


def victim_answers(victim: SandboxWorker) -> None:
    assert victim.alive, "the victim worker died"
    os.kill(victim.transport.worker_pid, 0)  # its process exists (raises ProcessLookupError otherwise)
    assert victim.call("reset", instance="v", seed=7)["task_id"] == "7"
    assert victim.call("step", instance="v", action={"message": "x"})["done"]


@pytest.mark.parametrize(("name", "body", "sandbox", "expect"), TABLE, ids=[f"{t[0]}-{t[2]}" for t in TABLE])
def test_hostile_module_is_rejected_or_contained(name, body, sandbox, expect, victims, bait, service_signals):
    victim = victims[sandbox]
    victim_answers(victim)
    attacker = SandboxWorker(SANDBOXES[sandbox], label=f"attacker-{name[:12]}")
    attacker.start()
    try:
        assert attacker.isolation["pidns"] and attacker.isolation["proc_private"] and attacker.isolation["seccomp"]
        source = module(body, victim.transport.worker_pid, bait[sandbox])
        if expect[0] == REJECT:
            _, kind, fragment = expect
            with pytest.raises(SandboxViolation) as caught:
                attacker.call("load", source=source)
            assert caught.value.kind == kind, str(caught.value)
            fragment = fill(fragment, victim.transport.worker_pid, bait[sandbox])
            assert fragment in caught.value.detail, str(caught.value)
            assert not attacker.alive
        else:
            try:
                attacker.call("load", source=source)
                seen = attacker.call("solve", seed=1)[0]["message"]
            except EnvironmentCodeError as exc:  # the attempt failed inside the module: also contained
                seen = str(exc)
            assert expect[1] in seen, seen
            assert SECRET not in seen and PASSWD_ROOT not in seen, f"the module read a host file: {seen}"
            assert "trace-sbx-victim" not in seen, "the module read the victim's command line"
            leak = [e for e in (json.loads(seen) if seen.startswith("[") else []) if isinstance(e, list)]
            mine, victim_pid = "1", str(victim.transport.worker_pid)  # pid 1: the module's own worker
            others = {entry for entry, _, _ in leak if entry not in (mine, victim_pid)}
            assert not others, f"the module saw other processes in /proc: {sorted(others)}"
            assert all(text == "No such file or directory" for entry, _, text in leak if entry == victim_pid), leak
            if name == "proc_walk_of_other_workers":
                assert any(entry == mine for entry, _, _ in leak), "the walk saw not even its own process"
    finally:
        attacker.close()
    victim_answers(victim)
    assert service_signals == [], "the service (this process) was signalled"


def test_signal_sent_from_outside_is_named_as_such():
    """A worker SIGKILLed by another process (not at its limits, no OOM kill) is reported as killed
    from outside the sandbox -- not blamed on the OOM killer."""
    from services.environment.sandbox.endings import oom_kills

    with SandboxWorker(SandboxConfig(call_timeout_s=15.0), label="killed") as w:
        w.call("load", source=module("import time\n", 0).replace("def solve(seed):\n",
                                                                   "def solve(seed):\n    time.sleep(8)\n"))
        before = oom_kills()
        threading.Timer(1.0, os.kill, (w.transport.worker_pid, signal.SIGKILL)).start()
        with pytest.raises(SandboxViolation) as caught:
            w.call("solve", seed=1)
    if before is not None and oom_kills() != before:
        pytest.fail("the kernel recorded an OOM kill during the test; the classification cannot be checked")
    assert caught.value.kind == "killed" and "from outside the sandbox" in caught.value.detail, str(caught.value)
    assert "OOM kill meanwhile" in caught.value.detail


@pytest.mark.parametrize(("overrides", "solve_body", "kind", "fragment"), [
    # RLIMIT_CPU ends a busy worker with SIGKILL (soft == hard); its CPU time says it was the limit
    ({"cpu_seconds": 1, "call_timeout_s": 20.0}, "    while True:\n        pass\n", "cpu", "CPU-time limit"),
    # blocked past the call deadline: the service kills it
    ({"call_timeout_s": 3.0}, "    __import__('time').sleep(30)\n", "timeout", "no response within 3 s (blocked"),
])
def test_own_limits_are_named(overrides, solve_body, kind, fragment):
    with SandboxWorker(SandboxConfig(**overrides), label="limits") as w:
        w.call("load", source=module("", 0).replace("def solve(seed):\n", "def solve(seed):\n" + solve_body))
        with pytest.raises(SandboxViolation) as caught:
            w.call("solve", seed=1)
    assert caught.value.kind == kind and fragment in caught.value.detail, str(caught.value)


def test_without_the_kernel_layers_a_sibling_dies_and_that_is_named():
    """The control: with the PID namespace, seccomp, the audit hook and distinct uids off (what the
    operator gets with ALLOW_WEAK and those layers disabled), the kill-by-pidfd case does kill the
    victim, and the victim's next call names it as killed from outside the sandbox."""
    weak = SandboxConfig(call_timeout_s=15.0, pid_namespace=False, seccomp=False, audit_hook=False, uid_base=0,
                         require_network_isolation=False, allow_weak=True)
    with SandboxWorker(weak, label="victim-weak") as victim, SandboxWorker(weak, label="attacker-weak") as attacker:
        assert set(victim.isolation["missing"]) == {"pidns", "proc_private", "seccomp"}
        assert victim.isolation["allowed_weak"]
        victim.call("load", source=module("", 0))
        attacker.call("load", source=module(SIGNAL + "signal.pidfd_send_signal(os.pidfd_open(VICTIM), 9)",
                                            victim.transport.worker_pid))
        with pytest.raises(SandboxViolation) as caught:
            victim.call("reset", instance="v", seed=1)
    assert caught.value.kind == "killed" and "from outside" in caught.value.detail, str(caught.value)


def test_weak_isolation_is_refused_unless_allowed():
    config = SandboxConfig(call_timeout_s=15.0, pid_namespace=False)
    with pytest.raises(FailedPrecondition, match=r"layer\(s\) pidns, proc_private not in force.*ALLOW_WEAK=true"):
        SandboxWorker(config, label="weak").start()
    with SandboxWorker(config.model_copy(update={"allow_weak": True}), label="weak") as w:
        assert w.isolation["missing"] == ["pidns", "proc_private"] and w.isolation["allowed_weak"]
