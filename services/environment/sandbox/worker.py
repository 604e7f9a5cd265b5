"""The sandbox worker: hosts one environment module (generated or library) in a locked-down process.

Run as `python -m services.environment.sandbox.worker [--config JSON] [--module PATH]`.
The environment service starts it as a child process (`sandbox.SandboxWorker`); in
Kubernetes the same command is the entrypoint of the sandbox pod (Dockerfile.sandbox), and
the service talks to it over the pod's attached stdin/stdout. Either way:

1. Startup (trusted code only): parse the config (`--config`, else `$TRACE_SANDBOX_CONFIG`,
   else defaults with scratch = `$TMPDIR` or the working directory), pre-import the modules
   environment code may use (where the worker has no root of its own -- layer `fs_root` off --
   the interpreter's own directory may be unreadable after the uid drop), move into a PID
   namespace of its own (`isolation.fork_supervised`:
   the started process stays behind as a supervisor that reports how the worker ended, on
   stderr), keep private duplicates of stdin/stdout for the protocol, read `--module PATH` if
   given, list what the worker's own root must hold (`_root_binds`), then
   `isolation.lock_down(...)`. From here on fd 0 is /dev/null and fds 1/2 go to
   `<scratch>/output.log` (capped by RLIMIT_FSIZE), so `print` in environment code cannot
   corrupt the protocol.
2. Protocol: JSON Lines. Each request is one line `{"id": n, "op": ..., ...}`; each
   response one line `{"id": n, "ok": true, "result": ..., "violations": [...]}` or
   `{"id": n, "ok": false, "error": {"type", "code", "message"}, "violations": [...]}`.

   | op           | request fields                     | result                                          |
   |--------------|------------------------------------|-------------------------------------------------|
   | hello        |                                    | isolation report, pid, python, limits           |
   | load         | source, params? (or --module)      | env name, version, class, tool_schemas, has_solve, has_solve_unskilled, splits |
   | reset        | instance, seed                     | observation {messages, task_id, seed, tools, info, guidance} |
   | step         | instance, action {name, arguments, call_id} or {message} | {observation, done, info} |
   | result       | instance                           | {reward, breakdown, failure_reason, diagnostics, done, termination, task_id} |
   | reward / diagnostics / tool_schemas / splits | instance | the one value                      |
   | solve / solve_unskilled | seed                    | list of action dicts                            |
   | close        | instance                           | null                                            |
   | shutdown     |                                    | null, then the worker exits                     |

   `violations` lists what the audit hook blocked while serving the request
   ({"kind", "detail"}; kinds: network, processes, filesystem, limits, native,
   introspection, environment) plus memory (MemoryError), file_size (EFBIG) and output
   (a response larger than `max_output_bytes`). The parent treats any violation as fatal
   for this worker. CPU-time and wall-clock overruns are seen by the parent (the process
   dies of SIGXCPU or is killed at its deadline).

A module is loaded with `compile` + `exec` into a fresh module named `sandbox_env` (with the
audit hook on, its builtins are `guarded_builtins`: no eval/exec/compile/globals/vars, and
getattr & co. refusing dunder names and module objects -- Python-level, like the hook); its
environment class is `ENVIRONMENT` if set, else the single concrete `Environment`
subclass defined in it; `solve(seed)` (required for validation) and `solve_unskilled(seed)`
(optional) are module-level functions returning action dicts.
"""

from __future__ import annotations

# Pre-imported before lockdown: without the worker's own root (fs_root) the interpreter's stdlib directory
# may be unreadable after the uid drop, so environment code may import exactly these (validation checks
# it statically).
import _strptime  # noqa: F401 - datetime.strptime imports it on first use
import abc  # noqa: F401
import argparse
import bisect  # noqa: F401
import collections  # noqa: F401
import collections.abc  # noqa: F401
import copy  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import encodings.idna  # noqa: F401
import enum  # noqa: F401
import errno
import fractions  # noqa: F401
import functools  # noqa: F401
import hashlib  # noqa: F401
import heapq  # noqa: F401
import inspect
import itertools  # noqa: F401
import json
import linecache
import math  # noqa: F401
import numbers  # noqa: F401
import operator  # noqa: F401
import os
import random  # noqa: F401
import re  # noqa: F401
import site
import statistics  # noqa: F401
import string  # noqa: F401
import sys
import sysconfig
import textwrap  # noqa: F401
import traceback
import types
import typing  # noqa: F401
from dataclasses import dataclass, field
from typing import Any

import pydantic

import trace_common
import trace_common.domains.store.record_toolkit  # noqa: F401 - the targets' record toolkits (RECORD_TOOLKITS)
import trace_common.domains.tau2.record_toolkit  # noqa: F401
import trace_common.env
from trace_common.env import (
    Environment,
    Message,
    Observation,
    StepResult,
    action_from_dict,
)
from trace_common.errors import TraceError

from .isolation import NOBODY, IsolationReport, Limits, fork_supervised, lock_down

WORKER_VERSION = "1"
MODULE_NAME = "sandbox_env"

#: The targets' record toolkits (trace_common/env/records.py): the only modules of trace_common.domains a
#: capability environment may import, so its tool calls run the target's own tool code (pre-imported above).
RECORD_TOOLKITS = ("trace_common.domains.store.record_toolkit", "trace_common.domains.tau2.record_toolkit")
#: Modules environment code may import, with their submodules (checked statically by validation too).
ALLOWED_IMPORTS = ("__future__", "abc", "bisect", "collections", "copy", "dataclasses", "datetime", "decimal",
                   "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers",
                   "operator", "random", "re", "statistics", "string", "textwrap", "typing", "pydantic",
                   "trace_common.env", "trace_common.errors", *RECORD_TOOLKITS)


@dataclass
class WorkerConfig:
    """What the parent passes on the command line (JSON). Defaults suit a pod."""

    scratch: str = ""
    limits: dict[str, int] = field(default_factory=dict)
    pid_namespace: bool = True
    network_namespace: bool = True
    mount_namespace: bool = True
    #: a root of its own (isolation layer fs_root): only what `_root_binds` lists, read-only, plus scratch
    fs_root: bool = True
    drop_privileges: bool = True
    #: the sandbox uid to drop to when started as root; uid_distinct: given to this worker alone
    uid: int = NOBODY
    uid_distinct: bool = False
    seccomp: bool = True
    audit_hook: bool = True
    #: No lockdown at all (the benchmark's plain-subprocess baseline). Never for untrusted code.
    plain: bool = False
    max_output_bytes: int = 1 << 20
    max_request_bytes: int = 8 << 20
    max_instances: int = 64

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        data = json.loads(text) if text else {}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SystemExit(f"sandbox worker: unknown config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


class _Fatal(Exception):
    """A violation after which this worker must not serve more requests."""


class Worker:
    def __init__(self, config: WorkerConfig, out_fd: int):
        self.config = config
        self.out_fd = out_fd
        self.violations: list[dict[str, str]] = []
        self.isolation = IsolationReport()
        self.env_cls: type[Environment] | None = None
        self.module: types.ModuleType | None = None
        self.params: dict[str, Any] = {}
        self.instances: dict[str, Environment] = {}

    def record(self, kind: str, detail: str) -> None:
        if len(self.violations) < 50:
            self.violations.append({"kind": kind, "detail": detail[:300]})

    # -- module ----------------------------------------------------------------------------
    def load(self, source: str, params: dict[str, Any] | None) -> dict[str, Any]:
        if self.module is not None:
            raise UsageError("a module is already loaded; start a new worker for another module")
        module = types.ModuleType(MODULE_NAME)
        module.__file__ = "env.py"
        sys.modules[MODULE_NAME] = module
        if self.config.audit_hook and not self.config.plain:  # the Python-level layer, with the audit hook
            module.__dict__["__builtins__"] = guarded_builtins(self.record)
        linecache.cache["env.py"] = (len(source), None, source.splitlines(keepends=True), "env.py")
        code = compile(source, "env.py", "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - this is the sandbox's whole purpose
        self.module = module
        cls = getattr(module, "ENVIRONMENT", None)
        if cls is None:
            found = [v for v in vars(module).values()
                     if isinstance(v, type) and issubclass(v, Environment) and v.__module__ == MODULE_NAME
                     and not inspect.isabstract(v)]
            if len(found) != 1:
                raise UsageError(f"the module must define exactly one concrete Environment subclass (found "
                             f"{[c.__name__ for c in found]}) or name it in ENVIRONMENT")
            cls = found[0]
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise UsageError(f"ENVIRONMENT is {cls!r}, not an Environment subclass")
        self.env_cls = cls
        self.params = dict(params or {})
        probe = cls(**self.params)
        return {"name": getattr(cls, "name", ""), "version": getattr(cls, "version", ""), "class": cls.__name__,
                "description": getattr(cls, "description", ""),
                "default_max_turns": int(getattr(cls, "default_max_turns", 20)),
                "doc": (module.__doc__ or "")[:4000], "tool_schemas": probe.tool_schemas(),
                "splits": _splits(probe.splits()),
                "has_solve": callable(getattr(module, "solve", None)),
                "has_solve_unskilled": callable(getattr(module, "solve_unskilled", None))}

    def instance(self, req: dict[str, Any], create: bool = False) -> Environment:
        key = str(req.get("instance", "0"))
        env = self.instances.get(key)
        if env is None:
            if not create:
                raise UsageError(f"no instance {key!r}: call reset first")
            if self.env_cls is None:
                raise UsageError("no module loaded: send a load request first")
            if len(self.instances) >= self.config.max_instances:
                raise UsageError(f"too many instances ({self.config.max_instances}); close some")
            env = self.env_cls(**self.params)
            self.instances[key] = env
        return env

    def solve(self, name: str, seed: Any) -> list[dict[str, Any]]:
        fn = getattr(self.module, name, None)
        if not callable(fn):
            raise UsageError(f"the module has no {name}(seed) function")
        actions = fn(seed)
        out = []
        for a in list(actions):
            action = action_from_dict(a)  # validates the shape
            out.append(action.to_dict())
        return out

    # -- dispatch --------------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> Any:
        op = req.get("op")
        if op == "hello":
            return {"isolation": self.isolation.to_dict(), "pid": os.getpid(), "python": sys.version.split()[0],
                    "worker_version": WORKER_VERSION, "plain": self.config.plain}
        if op == "load":
            source = req.get("source")
            if not isinstance(source, str):
                raise UsageError("load needs 'source' (the module text)")
            return self.load(source, req.get("params"))
        if op == "reset":
            obs = self.instance(req, create=True).reset(req.get("seed"))
            if not isinstance(obs, Observation):
                raise UsageError(f"reset() returned {type(obs).__name__}, not an Observation")
            return {"messages": [m.to_dict() for m in obs.messages], "task_id": obs.task_id, "seed": obs.seed,
                    "tools": obs.tools, "info": obs.info, "guidance": obs.guidance}
        if op == "step":
            env = self.instance(req)
            result = env.step(action_from_dict(req.get("action")))
            if not isinstance(result, StepResult):
                raise UsageError(f"step() returned {type(result).__name__}, not a StepResult")
            return {"observation": [m.to_dict() for m in result.observation], "done": bool(env.done),
                    "info": result.info}
        if op == "result":
            env = self.instance(req)
            reward = env.reward()
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not 0.0 <= reward <= 1.0:
                raise UsageError(f"reward() returned {reward!r}; it must be a float in [0, 1]")
            return {"reward": float(reward), "breakdown": env.reward_breakdown(),
                    "failure_reason": env.failure_reason(), "diagnostics": env.diagnostics(),
                    "done": bool(env.done), "termination": str(env.termination), "task_id": env.task_id}
        if op == "reward":
            return float(self.instance(req).reward())
        if op == "diagnostics":
            return self.instance(req).diagnostics()
        if op == "tool_schemas":
            return self.instance(req, create=True).tool_schemas()
        if op == "splits":
            return _splits(self.instance(req, create=True).splits())
        if op in ("solve", "solve_unskilled"):
            return self.solve(op, req.get("seed"))
        if op == "close":
            self.instances.pop(str(req.get("instance", "0")), None)
            return None
        if op == "shutdown":
            return None
        raise UsageError(f"unknown op {op!r}")

    def respond(self, rid: Any, payload: dict[str, Any]) -> None:
        payload = {"id": rid, **payload, "violations": self.violations}
        self.violations = []
        try:
            line = json.dumps(payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            line = json.dumps({"id": rid, "ok": False, "violations": payload["violations"],
                               "error": {"type": "TypeError", "code": "",
                                         "message": f"the environment returned data that is not JSON: {exc}"}})
        data = (line + "\n").encode()
        if len(data) > self.config.max_output_bytes:
            data = (json.dumps({"id": rid, "ok": False, "violations": [
                {"kind": "output", "detail": f"response of {len(data)} bytes exceeds {self.config.max_output_bytes}"}],
                "error": {"type": "OutputLimit", "code": "", "message": "response too large"}}) + "\n").encode()
        view = memoryview(data)
        while view:
            written = os.write(self.out_fd, view)
            view = view[written:]

    def serve(self, stream) -> None:
        while True:
            raw = stream.readline(self.config.max_request_bytes + 1)
            if not raw:
                return
            try:
                req = json.loads(raw)
                if not isinstance(req, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                self.respond(None, {"ok": False, "error": {"type": "ProtocolError", "code": "",
                                                           "message": f"bad request line: {exc}"}})
                continue
            rid = req.get("id")
            fatal = False
            try:
                result = self.handle(req)
                payload: dict[str, Any] = {"ok": True, "result": result}
            except MemoryError:
                self.record("memory", f"MemoryError during {req.get('op')} (address-space limit "
                            f"{self.isolation.rlimits.get('memory_bytes', 'unset')} bytes)")
                payload, fatal = {"ok": False, "error": {"type": "MemoryError", "code": "", "message":
                                                         "memory limit reached"}}, True
            except BaseException as exc:  # noqa: BLE001 - everything the module raises is reported, typed
                if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
                    self.record("file_size", str(exc))
                    fatal = True
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    self.record("crash", f"environment code raised {type(exc).__name__}")
                    fatal = True
                payload = {"ok": False, "error": _error(exc)}
            if self.violations:
                fatal = True
            self.respond(rid, payload)
            if fatal or req.get("op") == "shutdown":
                return


class UsageError(Exception):
    """Contract misuse by the environment module or the caller (reported, not fatal)."""


#: Builtins environment code does not get: code from strings and other namespaces (validation's
#: static check refuses them too). `open` stays: the worker may write its scratch dir.
REMOVED_BUILTINS = ("eval", "exec", "compile", "breakpoint", "input", "globals", "locals", "vars", "help")


def _allowed_module(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ALLOWED_IMPORTS)


def guarded_builtins(record: Any) -> dict[str, Any]:
    """The builtins the environment module runs with when the audit hook is on (Python-level, so
    advisory like the hook; `record(kind, detail)` reports what it refuses the same way).

    getattr / hasattr / setattr / delattr refuse dunder names (`getattr(x, "__cl" + "ass__")`) and
    getattr never hands out a module that is not an allowed import (`getattr(random, "_os")`), both
    recorded as introspection; REMOVED_BUILTINS are absent. Imports stay the real ones: the audit
    hook reports the dangerous ones by kind. Code of the allowed modules keeps the real builtins."""
    import builtins

    real_getattr = builtins.getattr

    def checked(name: Any, what: str) -> None:
        if not isinstance(name, str) or (name.startswith("__") and name.endswith("__")):
            record("introspection", f"{what} {name!r}")
            raise AttributeError(f"sandbox: {what} of {name!r} is not allowed")

    def guarded_getattr(obj, name, *default):
        checked(name, "getattr")
        value = real_getattr(obj, name, *default)
        if isinstance(value, types.ModuleType) and not _allowed_module(value.__name__):
            record("introspection", f"getattr {name!r} (module {value.__name__})")
            raise AttributeError(f"sandbox: {name!r} is a module environment code may not use")
        return value

    def guarded_hasattr(obj, name):
        checked(name, "hasattr")
        return builtins.hasattr(obj, name)

    def guarded_setattr(obj, name, value):
        checked(name, "setattr")
        builtins.setattr(obj, name, value)

    def guarded_delattr(obj, name):
        checked(name, "delattr")
        builtins.delattr(obj, name)

    table = {k: v for k, v in vars(builtins).items() if k not in REMOVED_BUILTINS}
    table.update(getattr=guarded_getattr, hasattr=guarded_hasattr, setattr=guarded_setattr, delattr=guarded_delattr)
    return table


def _error(exc: BaseException) -> dict[str, str]:
    # lookup_lines=False: reading other source files would trip the sandbox; env.py's lines
    # are in linecache already (put there by load), so only its frames show code.
    frames = traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__), lookup_lines=False)
    where = ""
    for frame in reversed(frames):
        if frame.filename == "env.py":
            where = f"env.py line {frame.lineno} in {frame.name}: {frame.line or ''}".strip()
            break
    code = exc.code if isinstance(exc, TraceError) else ""
    return {"type": type(exc).__name__, "code": code, "message": str(exc)[:2000], "where": where[:300]}


def _splits(splits: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, seeds in dict(splits).items():
        if isinstance(seeds, range):
            out[str(name)] = {"range": [seeds.start, seeds.stop, seeds.step]}
        else:
            out[str(name)] = [int(s) for s in list(seeds)[:100_000]]
    return out


def _read_roots() -> list[str]:
    roots = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"), sysconfig.get_path("purelib"),
             sysconfig.get_path("platlib"), os.path.dirname(trace_common.__file__),
             os.path.dirname(os.path.dirname(pydantic.__file__)), sys.prefix, sys.base_prefix}
    roots.update(site.getsitepackages())
    return sorted(r for r in roots if r)


def _root_binds() -> tuple[list[str], list[str]]:
    """What the worker's own root holds (isolation layer `fs_root`), as (host paths bound
    read-only, names whose symlinks are recreated):

    - the interpreter (sys.executable's real path) and the directory of every shared library this
      process has mapped (/proc/self/maps: libpython, libc and its siblings, extension modules'
      bundled libraries), so a lazily imported extension module's dependencies load;
    - the standard library and the site-packages directories (sysconfig, site);
    - of the other sys.path entries (PYTHONPATH: the project root), only the packages environment
      code may import (ALLOWED_IMPORTS) loaded from there -- trace_common, not the project tree.

    The names: sys.executable, every sys.path entry and the loader's /lib* links, so paths that
    reach these through symlinks (a venv's lib64 -> lib, a merged /usr) resolve as on the host."""
    binds = {os.path.realpath(sys.executable)}
    mapped: set[str] = set()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ""
                name = os.path.basename(path)
                if path.startswith("/") and (name.endswith(".so") or ".so." in name):
                    mapped.add(path)  # the kernel names the file by its real path already
    except OSError:
        pass
    binds.update(os.path.dirname(p) for p in mapped)
    libraries = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    libraries.update(site.getsitepackages())
    binds.update(os.path.realpath(p) for p in libraries if p)
    inside = tuple(p.rstrip("/") + "/" for p in libraries if p)
    for name in ALLOWED_IMPORTS:  # those outside the libraries: trace_common (from PYTHONPATH)
        mod = sys.modules.get(name.split(".", 1)[0])
        where = list(getattr(mod, "__path__", None) or []) or [getattr(mod, "__file__", None) or ""]
        binds.update(os.path.realpath(p) for p in where if p and os.path.isabs(p) and not p.startswith(inside))
    aliases = [sys.executable, *(p for p in sys.path if p), *(f"/{d}" for d in ("lib", "lib64", "lib32", "libx32"))]
    return sorted(binds), aliases


def _warm_up() -> None:
    """Exercise the pydantic models once, so their lazy imports happen before lockdown."""
    obs = Observation(messages=[Message.system("s"), Message.user("u")], task_id="0", seed=0, tools=[])
    StepResult(observation=[Message.tool("c", "t")], done=False).model_dump()
    json.dumps([m.to_dict() for m in obs.messages])
    action_from_dict({"name": "x", "arguments": "{\"a\": 1}"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.environment.sandbox.worker",
                                     description="Sandbox worker for TRACE environments (JSON Lines on stdin/stdout).")
    parser.add_argument("--config", default=os.environ.get("TRACE_SANDBOX_CONFIG", ""),
                        help="JSON WorkerConfig (default: $TRACE_SANDBOX_CONFIG, else defaults)")
    parser.add_argument("--module", default="", help="load this module file at startup (pod mode)")
    args = parser.parse_args(argv)
    config = WorkerConfig.from_json(args.config)
    scratch = os.path.realpath(config.scratch or os.environ.get("TMPDIR") or os.getcwd())
    os.makedirs(scratch, exist_ok=True)
    pid_note: str | None = "plain worker: no lockdown"
    if not config.plain:
        # From here on this code runs as pid 1 of a new PID namespace (pid_note None) or, pid_note
        # says why not, in the old one; the process that started it stays behind as the supervisor.
        pid_note = fork_supervised(pid_namespace=config.pid_namespace)

    # private protocol descriptors; the standard ones are re-pointed after lockdown
    in_fd, out_fd = os.dup(0), os.dup(1)
    stream = os.fdopen(in_fd, "rb", buffering=1 << 16)
    preload = ""
    if args.module:
        with open(args.module, encoding="utf-8") as fh:
            preload = fh.read()
    _warm_up()
    worker = Worker(config, out_fd)
    if not config.plain:
        binds, aliases = _root_binds() if config.fs_root else ([], [])
        worker.isolation = lock_down(
            scratch, Limits(**config.limits), network_namespace=config.network_namespace,
            mount_namespace=config.mount_namespace, drop_privileges=config.drop_privileges,
            uid=config.uid, uid_distinct=config.uid_distinct, pid_namespace=pid_note is None,
            pid_namespace_note=pid_note,
            fs_root=config.fs_root, root_binds=binds, root_aliases=aliases,
            seccomp=config.seccomp, audit_hook=config.audit_hook, read_roots=_read_roots(),
            list_roots=[p for p in sys.path if p], record=worker.record)
    else:
        os.chdir(scratch)
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != scratch]
    log_fd = os.open(os.path.join(scratch, "output.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(null_fd)
    os.close(log_fd)
    if preload:
        try:
            worker.load(preload, None)
        except BaseException as exc:  # noqa: BLE001 - reported on the first request instead
            worker.record("crash", f"--module failed to load: {type(exc).__name__}: {exc}")
    worker.serve(stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
