"""The sandbox worker: protocol, error handling, and the containment matrix.

Each containment case loads a small valid environment module whose `solve(seed)` carries a
payload (fork bomb, busy loop, 8 GB allocation, a connection to a listener on 127.0.0.1,
writes outside scratch, reading the service's secrets, a shell...). The case passes when the
payload is contained (nothing happened outside the worker), the violation is reported with
the expected kind, and a fresh worker serves the next request normally.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from services.environment.sandbox.parent import (
    EnvironmentCodeError,
    SandboxConfig,
    SandboxViolation,
    SandboxWorker,
)

REPO = Path(__file__).resolve().parents[3]
ROOT = os.geteuid() == 0 and sys.platform.startswith("linux")

TOY = '''"""A toy environment for sandbox tests: say the seeded number back."""
import os
import random
import time

from trace_common.env import Environment, Message, Observation, StepResult


class Toy(Environment):
    name = "toy"
    version = "1.0.0"

    def __init__(self):
        self._done, self.seed = False, None

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
    PAYLOAD
    return [{"message": str(random.Random(seed).randrange(1000))}]
'''


def module(payload: str = "pass") -> str:
    body = "\n    ".join(payload.splitlines())
    return TOY.replace("PAYLOAD", body)


def worker(**overrides) -> SandboxWorker:
    w = SandboxWorker(SandboxConfig(call_timeout_s=2.0, **overrides), label="test")
    w.start()
    return w


def serves_normally() -> None:
    """A fresh worker loads, plays and scores the toy environment: the parent is unharmed."""
    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="after") as w:
        w.call("load", source=module())
        w.call("reset", instance="a", seed=5)
        action = w.call("solve", seed=5)[0]
        assert w.call("step", instance="a", action=action)["done"]
        assert w.call("result", instance="a")["reward"] == 1.0


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def nothing_connected(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def _exposes_host_tmp(bind: str) -> bool:
    """A bind of the host's /tmp or of anything in it but the code the worker runs: a checkout or a
    virtual environment may lie under /tmp (a CI clone does), and then its package and interpreter
    binds do too; nothing else there may be visible."""
    tmp, path = Path("/tmp"), Path(bind)
    if path != tmp and tmp not in path.parents:
        return False
    code = [REPO / "trace_common", Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    code = [c for c in code if tmp in c.parents]   # only a code root strictly inside /tmp exempts a bind there
    return not any(path == c or c in path.parents for c in code)


def marker() -> Path:
    return Path("/tmp") / f"trace-sbx-escape-{uuid.uuid4().hex}"


# -- protocol -------------------------------------------------------------------------------------

def test_protocol_round_trip_and_isolation_report():
    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="proto") as w:
        iso = w.isolation
        assert iso["audit_hook"] and iso["rlimits"]["max_processes"] == 0
        if ROOT:  # every layer is in force when the service runs as root on Linux
            assert iso["pidns"] and iso["netns"] and iso["mount_ro"] and iso["proc_private"] and iso["seccomp"]
            assert iso["fs_root"] and "fs_root" in iso["held"] and "/dev/null" in iso["fs_root_binds"]
            assert not any(b == "/etc" or b.startswith("/etc/") for b in iso["fs_root_binds"])
            assert [b for b in iso["fs_root_binds"] if _exposes_host_tmp(b)] == []
            assert iso["uid_dropped"] and iso["uid_distinct"] and 1_000_000 <= iso["uid"] < 1_065_536
            assert iso["network"] == "netns" and iso["missing"] == [] and not iso["allowed_weak"]
        info = w.call("load", source=module())
        assert (info["name"], info["class"], info["has_solve"], info["has_solve_unskilled"]) == \
            ("toy", "Toy", True, False)
        assert info["splits"] == {"train": {"range": [0, 100, 1]}}
        obs = w.call("reset", instance="x", seed=3)
        assert obs["messages"][0] == {"role": "system", "content": "say it"}
        assert w.call("step", instance="x", action={"message": "wrong"})["done"]
        assert w.call("result", instance="x")["reward"] == 0.0


@pytest.mark.parametrize(("op", "fields", "expected"), [
    ("step", {"instance": "nope", "action": {"message": "hi"}}, "no instance 'nope'"),
    ("frobnicate", {}, "unknown op"),
    ("solve_unskilled", {"seed": 1}, "no solve_unskilled"),
    ("load", {"source": "x = 1"}, "already loaded"),
])
def test_environment_errors_are_reported_and_the_worker_survives(op, fields, expected):
    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="errors") as w:
        w.call("load", source=module())
        with pytest.raises(EnvironmentCodeError, match=expected):
            w.call(op, **fields)
        assert w.alive
        assert w.call("solve", seed=2) == [{"message": str(__import__("random").Random(2).randrange(1000))}]


@pytest.mark.parametrize(("depth", "kinds"), [
    (950, {"protocol"}),            # encodes in the worker's shallow stack, past what the service's parses
    (990, {"protocol", "crash"}),   # near the worker's own limit: it may fail to encode it (a crash) instead
    (100, {"protocol"}),            # parses, but deeper than the service accepts
])
def test_a_step_info_nested_too_deep_is_a_sandbox_violation(depth, kinds):
    """`step`'s info passes through the worker unchecked: one nested about 1,000 deep still encodes in
    the worker but failed to parse in the service (RecursionError: an INTERNAL error, not a violation)."""
    nested = TOY.replace("return StepResult(observation=[Message.user(\"bye ###STOP###\")], done=True)",
                         f"info = 'x'\n        for _ in range({depth}):\n            info = [info]\n"
                         "        return StepResult(observation=[Message.user(\"bye ###STOP###\")], done=True, "
                         "info={'deep': info})").replace("PAYLOAD", "pass")
    assert nested != module()
    w = worker()
    try:
        w.call("load", source=nested)
        w.call("reset", instance="a", seed=1)
        with pytest.raises(SandboxViolation) as caught:
            w.call("step", instance="a", action={"message": "hi"})
        assert caught.value.kind in kinds, str(caught.value)
        assert caught.value.kind != "protocol" or "nested deeper than 64" in str(caught.value)
        assert not w.alive
    finally:
        w.close()
    serves_normally()


def test_module_that_raises_on_load_is_an_environment_error():
    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="bad") as w:
        with pytest.raises(EnvironmentCodeError, match="ZeroDivisionError"):
            w.call("load", source=module() + "\n1 / 0\n")


# -- containment matrix -----------------------------------------------------------------------------

CASES = [
    # name, payload (may use MARK, PORT, PPID, REPO), expected violation kind
    ("fork_bomb", "while True:\n    os.fork()", "processes"),
    ("spawn_shell", "import subprocess\nsubprocess.run(['sh', '-c', 'touch MARK'])", "processes"),
    ("os_system", "os.system('touch MARK')", "processes"),
    ("infinite_loop", "while True:\n    pass", "cpu"),
    ("blocked_forever", "time.sleep(3600)", "timeout"),
    ("allocate_8gb", "x = bytearray(8 << 30)", "memory"),
    ("socket_connect", "import socket\nsocket.socket().connect(('127.0.0.1', PORT))", "network"),
    ("dns_lookup", "import socket\nsocket.getaddrinfo('example.com', 80)", "network"),
    ("write_tmp", "open('MARK', 'w').write('x')", "filesystem"),
    ("write_repo", "open('REPO/pwned-by-sandbox.txt', 'w').write('x')", "filesystem"),
    ("read_service_environ", "print(open('/proc/PPID/environ').read())", "filesystem"),
    ("huge_output", "return [{'message': 'x' * 5_000_000}]", "output"),
    ("file_size", "open('big.bin', 'wb').write(b'x' * (64 << 20))", "file_size"),
    # files under RLIMIT_FSIZE each, past scratch_mb together / past scratch_entries (CASE_LIMITS)
    ("fill_scratch", "for i in range(200):\n    open(f'f{i}.bin', 'wb').write(b'x' * (8 << 20))", "disk"),
    ("many_files", "for i in range(1_000_000):\n    open(f'e{i}', 'w').close()", "disk"),
    ("many_dirs", "for i in range(1_000_000):\n    os.mkdir(f'd{i}')", "disk"),
    # deleted while held open: in no directory, still on disk (counted from the worker's fds)
    ("deleted_open_files", "held = []\nfor i in range(40):\n    f = open(f'h{i}', 'wb')\n    f.write(b'x' * (8 << 20))"
     "\n    f.flush()\n    os.remove(f'h{i}')\n    held.append(f)\ntime.sleep(5)", "disk"),
    # the worker's stderr is a file in its scratch dir: RLIMIT_FSIZE bounds it
    ("stderr_flood", "import sys\nwhile True:\n    sys.stderr.write('x' * 65536)", "file_size"),
    ("hard_exit", "os._exit(3)", "crash"),
    ("native_code", "import ctypes\nctypes.CDLL(None)", "native"),
    ("raise_limits", "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "limits"),
]


#: Limits of some cases below their defaults (256 MiB, 10,000 entries), so each is reached well within
#: the call's 2 s on a loaded machine.
CASE_LIMITS = {"fill_scratch": {"scratch_mb": 64}, "deleted_open_files": {"scratch_mb": 64},
               "many_files": {"scratch_entries": 1000},
               "many_dirs": {"scratch_entries": 1000}}


@pytest.mark.parametrize(("name", "payload", "kind"), CASES, ids=[c[0] for c in CASES])
def test_containment(name, payload, kind, listener):
    mark = marker()
    code = (payload.replace("MARK", str(mark)).replace("PORT", str(listener.getsockname()[1]))
            .replace("PPID", str(os.getpid())).replace("REPO", str(REPO)))
    w = worker(**CASE_LIMITS.get(name, {}))
    try:
        w.call("load", source=module(code))
        started = time.perf_counter()
        with pytest.raises(SandboxViolation) as caught:
            w.call("solve", seed=1)
        assert caught.value.kind == kind, str(caught.value)
        assert time.perf_counter() - started < 10
        assert not w.alive
    finally:
        w.close()
    assert not mark.exists()
    assert not (REPO / "pwned-by-sandbox.txt").exists()
    assert nothing_connected(listener)
    serves_normally()


def test_service_secrets_are_not_in_the_workers_environment(monkeypatch):
    monkeypatch.setenv("TRACE_ENVIRONMENT_AUTH_TOKEN", "s3cret-token-value")
    monkeypatch.setenv("TRACE_ENVIRONMENT_S3_SECRET_KEY", "s3cret-key-value")
    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="env") as w:
        w.call("load", source=module("return [{'message': repr(dict(os.environ))}]"))
        seen = w.call("solve", seed=0)[0]["message"]
    assert "s3cret" not in seen and "TRACE_ENVIRONMENT" not in seen
    assert "PYTHONPATH" in seen  # the clean environment really was what the worker saw


# -- the kernel layers on their own (audit hook off) -------------------------------------------------

KERNEL_CASES = [
    ("socket_connect", "import socket\nsocket.socket().connect(('127.0.0.1', PORT))", ("Operation not permitted",
                                                                                     "Network is unreachable")),
    ("fork", "os.fork()", ("Operation not permitted", "Resource temporarily unavailable")),
    ("spawn_shell", "import subprocess\nsubprocess.run(['sh', '-c', 'touch MARK'])", ("Operation not permitted",
                                                                                     "Permission denied")),
    ("write_tmp", "open('MARK', 'w').write('x')", ("Read-only file system", "Permission denied")),
    # the worker's private /proc has no such pid at all (without it: uid permissions refuse the read)
    ("read_service_environ", "open('/proc/PPID/environ').read()", ("No such file or directory", "Permission denied")),
]


@pytest.mark.skipif(not ROOT, reason="the namespace / uid layers need the service to run as root on Linux")
@pytest.mark.parametrize(("name", "payload", "errors"), KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_kernel_layers_contain_without_the_audit_hook(name, payload, errors, listener):
    mark = marker()
    code = (payload.replace("MARK", str(mark)).replace("PORT", str(listener.getsockname()[1]))
            .replace("PPID", str(os.getpid())))
    with SandboxWorker(SandboxConfig(call_timeout_s=5.0, audit_hook=False), label="kernel") as w:
        assert not w.isolation["audit_hook"]
        w.call("load", source=module(code))
        with pytest.raises(EnvironmentCodeError) as caught:
            w.call("solve", seed=1)
        assert any(e in str(caught.value) for e in errors), str(caught.value)
    assert not mark.exists()
    assert nothing_connected(listener)


def test_require_network_isolation_refuses_a_worker_without_kernel_layers():
    from trace_common.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition, match="network isolation"):
        SandboxWorker(SandboxConfig(network_namespace=False, seccomp=False), label="weak").start()


def test_pod_mode_entrypoint_reads_the_module_from_a_path_and_speaks_stdin_stdout(request):
    """What a Kubernetes sandbox pod runs: the bare entrypoint, config from $TRACE_SANDBOX_CONFIG,
    the module from a mounted path, requests on stdin, responses on stdout."""
    import json
    import shutil
    import subprocess
    import tempfile

    from services.environment.sandbox.parent import PROJECT_ROOT, clean_env

    base = Path(tempfile.mkdtemp(prefix="trace-pod-", dir="/tmp"))  # pytest's tmp dirs are 0700 (root only)
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    base.chmod(0o755)
    path = base / "env.py"
    path.write_text(module())
    scratch = base / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)  # the pod's emptyDir; the worker drops to uid nobody when started as root
    env = clean_env(str(scratch), 0) | {"TRACE_SANDBOX_CONFIG": json.dumps({"scratch": str(scratch)})}
    requests = [{"id": 1, "op": "hello"}, {"id": 2, "op": "reset", "instance": "a", "seed": 4},
                {"id": 3, "op": "solve", "seed": 4}, {"id": 4, "op": "load", "source": "x = 1"},
                {"id": 5, "op": "shutdown"}]
    proc = subprocess.run([sys.executable, "-m", "services.environment.sandbox.worker", "--module", str(path)],
                          input="".join(json.dumps(r) + "\n" for r in requests).encode(), capture_output=True,
                          env=env, cwd=PROJECT_ROOT, timeout=60)
    replies = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [r["id"] for r in replies] == [1, 2, 3, 4, 5] and proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert replies[0]["result"]["isolation"]["audit_hook"]
    assert replies[1]["result"]["messages"][1]["content"].startswith("say ")
    assert replies[2]["result"][0]["message"] in replies[1]["result"]["messages"][1]["content"]
    assert not replies[3]["ok"] and "already loaded" in replies[3]["error"]["message"]


# -- how a dead worker is classified, and the filter program ----------------------------------------

ENDINGS = [
    # what the transport observed, kind, fragment of the detail
    ({"signal": 9, "cpu_seconds": 299.0, "oom_kills": 0}, "cpu", "CPU-time limit"),
    ({"signal": 9, "cpu_seconds": 0.2, "oom_kills": 1}, "memory", "most likely the OOM killer"),
    ({"signal": 9, "cpu_seconds": 0.2, "oom_kills": 0}, "killed", "from outside the sandbox"),
    ({"signal": 9, "cpu_seconds": 0.2}, "killed", "whether the OOM killer did it is unknown"),
    ({"signal": 31}, "syscall", "SIGSYS"),
    ({"signal": 24}, "cpu", "SIGXCPU"),
    ({"signal": 25}, "file_size", "SIGXFSZ"),
    ({"signal": 11}, "crash", "SIGSEGV"),
    ({"code": 3}, "crash", "status 3"),
    ({"code": 137, "signal": 9, "reason": "OOMKilled", "oom_kills": 1}, "memory", "OOMKilled"),
    ({"reason": "DeadlineExceeded"}, "timeout", "activeDeadlineSeconds"),
    ({"reason": "PodDeleted"}, "killed", "deleted from outside"),
]


@pytest.mark.parametrize(("end", "kind", "fragment"), ENDINGS, ids=[f"{e[1]}-{i}" for i, e in enumerate(ENDINGS)])
def test_a_dead_worker_is_classified_from_what_was_observed(end, kind, fragment):
    from services.environment.sandbox.endings import classify_ending

    got, detail = classify_ending(end, SandboxConfig())
    assert got == kind and fragment in detail, detail


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_program_assembles_for_each_architecture(machine):
    from services.environment.sandbox.isolation import seccomp_program

    prog = seccomp_program(machine, own_pid=1)
    assert 20 < len(prog) < 4096 and all(len(ins) == 8 for ins in prog)


def test_no_seccomp_table_is_an_error_not_a_silent_allow():
    from services.environment.sandbox.isolation import seccomp_program

    with pytest.raises(OSError, match="no seccomp table"):
        seccomp_program("riscv64")


#: Modules environment code may use, each exercised in a way that imports more on first use.
ALLOWED = [
    "import datetime\nx = datetime.datetime.strptime('2026-01-02', '%Y-%m-%d')",   # imports _strptime lazily
    "import datetime\nx = datetime.date(2026, 1, 2).strftime('%A %d %B')",
    "import decimal\nx = decimal.Decimal('1.105').quantize(decimal.Decimal('0.01'), rounding=decimal.ROUND_HALF_UP)",
    "import statistics\nx = statistics.median([1, 2, 3]) + statistics.fmean([1.0])",
    "import pydantic\nx = pydantic.TypeAdapter(int).validate_python('3')",
    "import json\nx = json.dumps({'a': [1, 2.5]}, indent=2, sort_keys=True)",
    "import string\nx = string.Template('$a').substitute(a=1)",
]


@pytest.mark.parametrize("code", ALLOWED)
def test_allowed_modules_work_after_lockdown(code):
    """Whatever an allowed module imports on first use must load after lockdown: through the worker's
    own root (fs_root binds the stdlib and site-packages), or, where that layer is off, because the
    worker pre-imported it (the sandbox uid may not read a Python under /root, mode 0700)."""
    with SandboxWorker(SandboxConfig(call_timeout_s=20.0), label="allowed") as w:
        w.call("load", source=module(code))
        assert w.call("solve", seed=5)


#: Run inside a private mount namespace with the repository bound at CLONE (under a 0700 directory):
#: the allowed-module table through real workers, with and without the worker's own root.
_DRIVER = """
import json, sys
from services.environment.sandbox.parent import PROJECT_ROOT, SandboxConfig, SandboxWorker
from tests.unit.environment.test_sandbox import ALLOWED, module
out = {"project_root": str(PROJECT_ROOT), "prefix": sys.prefix, "cases": {}, "without_fs_root": ""}
for code in ALLOWED:
    try:
        with SandboxWorker(SandboxConfig(call_timeout_s=20.0), label="p0700") as w:
            out["fs_root_binds"] = w.isolation["fs_root_binds"]
            w.call("load", source=module(code))
            w.call("solve", seed=5)
        out["cases"][code] = "ok"
    except Exception as exc:
        out["cases"][code] = f"{type(exc).__name__}: {exc}"
with SandboxWorker(SandboxConfig(call_timeout_s=20.0), label="p0700-mode") as w:  # the 0700 dir, as the worker sees it
    w.call("load", source=module("return [{'message': oct(os.stat('%s').st_mode & 0o777)}]" % PROJECT_ROOT.parent))
    out["parent_mode_in_worker"] = w.call("solve", seed=1)[0]["message"]
try:
    weak = SandboxConfig(call_timeout_s=20.0, fs_root=False, allow_weak=True)
    with SandboxWorker(weak, label="p0700-weak") as w:
        w.call("load", source=module(next(c for c in ALLOWED if "TypeAdapter" in c)))
        w.call("solve", seed=5)
    out["without_fs_root"] = "ok"
except Exception as exc:
    out["without_fs_root"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(out))
"""

#: Binds the repository at CLONE in a private mount namespace, then runs _DRIVER with CLONE's venv.
_BIND_AND_RUN = """
import ctypes, os, sys
repo, clone, driver = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x00020000) == 0, os.strerror(ctypes.get_errno())                    # CLONE_NEWNS
assert libc.mount(None, b"/", None, 0x4000 | (1 << 18), None) == 0, os.strerror(ctypes.get_errno())  # rprivate
assert libc.mount(repo.encode(), clone.encode(), None, 0x1000 | 0x4000, None) == 0, os.strerror(ctypes.get_errno())
os.chdir(clone)
python = os.path.join(clone, ".venv", "bin", "python")
os.execve(python, [python, "-c", driver], {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp", "LANG": "C.UTF-8"})
"""


@pytest.mark.skipif(not ROOT, reason="binding the project under a 0700 directory needs root (CI runs as root)")
@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="needs the project's .venv")
def test_allowed_modules_work_with_the_project_under_a_0700_directory():
    """Issue #28, defect 7: a clone inside a 0700 directory (as root's home is). Rather than copy the
    project and its virtualenv (hundreds of MB), this test binds the repository -- .venv included --
    at <0700 dir>/clone in a private mount namespace of a helper process (so nothing changes for the
    rest of the machine), and runs the allowed-module table there with that clone's interpreter: the
    service's project root, PYTHONPATH and site-packages all lie under the 0700 directory, exactly as
    in a fresh clone under /root. With the worker's own root (`fs_root`: the binds' parents are fresh
    0755 directories) every case works; without it (control) the sandbox uid cannot reach the
    virtualenv, and pydantic's lazy import fails as the issue reports."""
    import json
    import shutil
    import subprocess
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="trace-0700-"))  # mkdtemp: mode 0700, owned by root
    clone = base / "clone"
    clone.mkdir()
    try:
        assert base.stat().st_mode & 0o777 == 0o700
        proc = subprocess.run([sys.executable, "-c", _BIND_AND_RUN, str(REPO), str(clone), _DRIVER],
                              capture_output=True, text=True, timeout=300)
    finally:
        clone.rmdir()  # rmdir, never rmtree: the bind lived only in the helper's namespace
        shutil.rmtree(base)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["project_root"] == str(clone) and out["prefix"] == str(clone / ".venv")
    assert any(b.startswith(str(clone)) for b in out["fs_root_binds"])
    failed = {code: why for code, why in out["cases"].items() if why != "ok"}
    assert not failed and len(out["cases"]) == len(ALLOWED), failed
    assert out["parent_mode_in_worker"] == "0o755"  # a fresh directory of the worker's root, not the host's 0700
    assert "ModuleNotFoundError" in out["without_fs_root"], out["without_fs_root"]
