"""The embedded default: all five services in one process on loopback ports, `file://` store.

Used by `tracectl up`, `tracectl run` (when no service address is given) and by the test suite's
`embedded_stack` fixture. The addresses are written to `<root>/embedded.json` so `tracectl status`
(or any client) can find them, and the file is removed when the stack that wrote it stops. One stack
per root owns that file: while it names a live `tracectl up` other than this process, another `up`
refuses to start on that root (InvalidArgument naming the pid); a one-command stack (`up --once`,
`run`, `rollout`, ...) starts beside any live owner on ports of its own, says so in one log line,
and neither overwrites nor removes the file; an `up` beside a live one-command stack takes the file.
A file whose pid is gone, or now names another process (the boot id and start time recorded in it
differ), is stale and replaced (`other_stack`). An unusable root (a file, no permission, /proc) and a `--host`
that cannot be listened on are InvalidArgument naming the flag (`writable_dir`, `check_host`,
`start_listening`).

Auth, per service: the token in TRACE_<SERVICE>_AUTH_TOKEN when that variable is set (what the
standalone service reads too), else the stack's `token` (`tracectl up --token` / $TRACE_AUTH_TOKEN),
else none. A blank variable is refused, as the standalone service refuses it. `embedded.json`
records per service whether auth is on and where its token comes from (the variable's name,
never the token); a client in the same environment gets the same token from
`trace_common.config.service_token`. When any service runs without auth the stack logs one
warning saying which, and that they listen on loopback only (or, louder, that they do not).

Outbound endpoints: tracectl is the operator of the services it embeds. Each calling service
(analysis, environment, rollout) starts with its TRACE_<SERVICE>_ENDPOINTS profiles, and
`allow_endpoint` adds one in-process (no request can): `tracectl run` adds the run config's
endpoints this way (`overrides[EMBEDDED_ENDPOINTS]`, see tracectl/run/endpoints.py), and tests
allow their local fake servers.

Data directories: the rollout, environment and trainer services accept a data directory a request
names (the tau2 `data`) only under their data roots (TRACE_<SERVICE>_DATA_ROOTS, trace_common/data_roots.py).
`allow_data_root` adds one in-process, the same way: `tracectl run`, `tracectl rollout --env DIR` and
`tracectl train --env DIR` add the directory their input names (`overrides[EMBEDDED_DATA_ROOTS]`), and the test suite adds
its tau2 data.

Model references: every service loads a model, adapter, composition or gates file a request names only
if it is a built-in agent, lies in its store, or lies under its model roots (TRACE_<SERVICE>_MODEL_ROOTS,
trace_common/model_refs.py). A service tracectl starts itself lists, besides that variable's roots, the
working directory (not for the long-lived `tracectl up` and `serve`) and the built-in agent cache
(`local_model_roots`), and the directories a command's
input names (`allow_models_from_command`: `tracectl rollout/train --model DIR`, `serve --base DIR`, a
run config's local base agent), so a user's own model directories keep working; a deployed service
(`--target`) keeps its operator's roots.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import logging
import os
import socket
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from services.launch import build
from trace_common.config import SERVICE_NAMES, check_token, service_token, token_env
from trace_common.endpoints import EndpointProfile
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.grpc.client import Endpoint, open_channel, stub
from trace_common.grpc.server import TraceServer
from tracectl.inputs import writable_dir

log = logging.getLogger(__name__)

#: The services that call outbound endpoints (each has an `endpoints` allow-list on its domain).
CALLERS = ("analysis", "environment", "rollout")
#: Key of `EmbeddedStack.overrides` holding endpoints to allow at start: service -> {profile -> fields}.
EMBEDDED_ENDPOINTS = "embedded_endpoints"
#: The services that read a data directory a request names (each has `data_roots` on its domain).
DATA_READERS = ("environment", "rollout", "trainer")
#: Key of `EmbeddedStack.overrides` holding directories to list as data roots at start.
EMBEDDED_DATA_ROOTS = "embedded_data_roots"
#: Key of `EmbeddedStack.overrides` holding directories to list as model roots of every service at start.
EMBEDDED_MODEL_ROOTS = "embedded_model_roots"


def local_model_roots(service: str, extra: tuple[str | Path, ...] | list[str | Path] = (), *,
                      cwd: bool = True) -> list[str]:
    """The model roots of `service` when tracectl starts it (module docstring): its
    TRACE_<SERVICE>_MODEL_ROOTS, the working directory (unless `cwd` is False: a long-lived server,
    `tracectl up` or `serve`, started from / or HOME would otherwise serve every model under it to
    every token holder), the built-in agent cache, then `extra`."""
    from trace_common.agents.cache import default_cache_dir
    from trace_common.config import parse_model_roots

    listed = parse_model_roots(os.environ.get(f"TRACE_{service.upper()}_MODEL_ROOTS", ""))
    try:
        cache = [default_cache_dir()]
    except FailedPrecondition:   # TRACE_AGENT_CACHE names a file: no root; a job that needs it says so
        cache = []
    local = [*([Path.cwd()] if cwd else []), *cache, *(Path(d) for d in extra)]
    roots = [*listed, *(p.expanduser().resolve().as_uri() for p in local)]
    return list(dict.fromkeys(roots))


def model_dirs(*refs: str) -> list[Path]:
    """The local directories `refs` name (a file's directory for a file; none for built-in agent
    names, s3:// URIs and empty refs), for `allow_models_from_command`."""
    from trace_common.agents.resolve import BUILT_IN

    out = []
    for ref in refs:
        if not ref or ref in BUILT_IN or "://" in ref.removeprefix("file://"):
            continue
        path = Path(ref.removeprefix("file://")).expanduser()
        if "/" not in ref and not path.exists():
            continue  # a name (a served model, a scripted policy), not a path
        out.append(path.parent if path.is_file() else path)
    return out


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _phase(server: TraceServer) -> str:
    """Which listener of `server` failed to start: `TraceServer.start` opens /metrics, then runs the
    on_start hooks (the inference service's OpenAI-compatible HTTP API), then binds gRPC."""
    return {"metrics": "metrics", "hooks": "http"}.get(server.starting, "grpc")


def _is_bind_failure(err: BaseException, phase: str) -> bool:
    """Whether `err`, raised by `TraceServer.start` in `phase`, says an address could not be listened on
    (not, say, an unreadable TLS file): grpc's "Failed to bind" RuntimeError (or TraceServer's own
    "could not bind" OSError), or a socket error of the metrics or HTTP listener."""
    if phase == "grpc":
        return "bind" in str(err).lower() and isinstance(err, (RuntimeError, OSError))
    return isinstance(err, socket.gaierror) or (
        isinstance(err, OSError) and err.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES))


def _host_problem(host: str) -> str | None:
    """Why nothing can listen on `host` at all (it does not resolve, or is no address of this machine);
    None when a free port on it can be bound."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        return f"the name does not resolve ({getattr(err, 'strerror', None) or err})"
    # the servers listen wherever one of the addresses binds (gRPC on any; a family this machine cannot
    # use, e.g. localhost's ::1 with IPv6 off, is skipped), so the host is refused only when none binds
    failure: OSError | None = None
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
            return None
        except OSError as err:
            if failure is None or err.errno != errno.EAFNOSUPPORT:   # say why a usable family failed
                failure = err
    reason = (failure.strerror or str(failure)) if failure is not None else "no address"
    return f"it is not an address of this machine ({reason})"


def _bad_host(host: str, flag: str, problem: str) -> InvalidArgument:
    return InvalidArgument(problem, field=f"{flag} {host}", fix="Give an address of this machine: 127.0.0.1 (this "
                           "machine only) or 0.0.0.0 (every interface)")


def check_host(host: str, flag: str = "--host") -> None:
    """InvalidArgument naming `flag` when nothing can listen on `host` (`_host_problem`): checked before
    any server starts, so a bad --host is one line and nothing is left half-started."""
    problem = _host_problem(host)
    if problem is not None:
        raise _bad_host(host, flag, problem)


async def start_listening(server: TraceServer, flags: dict[str, str]) -> None:
    """`server.start()`, where an address that cannot be listened on -- a host that does not resolve or
    is not this machine's, a busy or privileged port -- becomes InvalidArgument naming the flag that chose
    it (`flags`: "host" and, where a command has one, the port flag of "grpc", "metrics" or "http"), and
    the half-started server is stopped. Any other failure is raised as it is."""
    try:
        await server.start()
    except (OSError, RuntimeError) as err:
        phase = _phase(server)
        if not _is_bind_failure(err, phase):
            raise
        try:
            await server.stop(grace=0)
        except Exception:  # noqa: BLE001 -- stopping must finish; the bind failure is what the user needs
            log.debug("stopping %s after a failed start", server.definition.name, exc_info=True)
        s = server.settings
        host, port = {"grpc": (s.host, s.port), "metrics": (s.metrics_host, s.metrics_port),
                      "http": (getattr(s, "http_host", s.host), getattr(s, "http_port", 0))}[phase]
        what = {"grpc": "gRPC", "metrics": "Prometheus /metrics", "http": "OpenAI-compatible HTTP"}[phase]
        check_host(host, flags["host"])
        if phase not in flags or not port:
            raise _bad_host(host, flags["host"], f"cannot listen there ({getattr(err, 'strerror', None) or 'the bind failed'})") from None
        code = err.errno if isinstance(err, OSError) and err.errno else _port_errno(host, port)
        reason = {errno.EADDRINUSE: "the port is in use", errno.EACCES: "ports below 1024 need privileges"}.get(
            code, "cannot listen there")
        raise InvalidArgument(f"{what} on {host}:{port}: {reason}", field=f"{flags[phase]} {port}",
                              fix="Give a free port, or 0 for any free one") from None


def _port_errno(host: str, port: int) -> int | None:
    """The errno of binding `host:port` now (grpc's bind error carries none), None when it binds."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.bind(address)
    except OSError as err:
        return err.errno
    return None


@dataclass
class EmbeddedStack:
    root: Path
    host: str = "127.0.0.1"
    #: The token of every service whose TRACE_<SERVICE>_AUTH_TOKEN is unset; None = no auth there.
    token: str | None = None
    #: Where `token` came from, as embedded.json names it ("--token", "TRACE_AUTH_TOKEN", ...).
    token_source: str = "token argument"
    #: Extra settings for every service (e.g. max_message_bytes), over the env vars.
    overrides: dict = field(default_factory=dict)
    servers: dict[str, TraceServer] = field(default_factory=dict)
    #: Whether the working directory is a model root of every service (`local_model_roots`): True for
    #: the one-command stacks of `run`/`rollout`/`train`/`analyze`, False for `tracectl up`.
    cwd_model_root: bool = True
    #: service -> (token or None, its source or None), fixed by `start`.
    auth: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    #: The flag (or config field) that chose `root`, for messages about it.
    root_flag: str = "--root"
    #: What to do about an unusable `root`, where "Give <root_flag> a writable directory" does not fit.
    root_fix: str = ""
    #: True for `tracectl up`: refuse to start (InvalidArgument) while another live process's stack owns
    #: `root`'s embedded.json. False (every one-command stack): start beside it, on ports of its own,
    #: leaving that file alone (module docstring).
    exclusive: bool = False
    #: Whether this stack wrote `state_file` (False when another live stack owns it), fixed by `start`.
    owns_state: bool = False

    @property
    def state_file(self) -> Path:
        return self.root / "embedded.json"

    @property
    def targets(self) -> dict[str, str]:
        return {name: s.target for name, s in self.servers.items()}

    @property
    def metrics_urls(self) -> dict[str, str]:
        return {name: s.metrics_server.url for name, s in self.servers.items() if s.metrics_server}

    @property
    def http_urls(self) -> dict[str, str]:
        """HTTP fronts served beside gRPC (the inference service's OpenAI-compatible API)."""
        return {name: s.definition.http_url for name, s in self.servers.items() if s.definition.http_url}

    def resolve_auth(self) -> dict[str, tuple[str | None, str | None]]:
        """service -> (token, source): TRACE_<SERVICE>_AUTH_TOKEN, else the stack token, else (None, None).
        ValueError (naming the variable) for a blank or malformed token."""
        if self.token is not None:
            check_token(self.token, self.token_source)
        out: dict[str, tuple[str | None, str | None]] = {}
        for name in SERVICE_NAMES:
            if os.environ.get(token_env(name)) is not None:
                out[name] = (service_token(name), token_env(name))
            elif self.token is not None:
                out[name] = (self.token, self.token_source)
            else:
                out[name] = (None, None)
        return out

    def token_of(self, service: str) -> str | None:
        return self.auth.get(service, (None, None))[0]

    def allow_endpoint(self, name: str, base_url: str, api_key_env: str = "", models: tuple[str, ...] = (),
                       services: tuple[str, ...] = CALLERS) -> None:
        """Let `services` call `base_url` as profile `name` (the operator's act, in-process). A URL one of
        them already allows with the same key and models is left as it is; with another key, ValueError."""
        profile = EndpointProfile(base_url=base_url, api_key_env=api_key_env, models=models)
        for service in services:
            endpoints = self.servers[service].definition.domain.endpoints
            same = [n for n, p in endpoints.profiles.items() if p.base_url == profile.base_url]
            if same and endpoints.profiles[same[0]] == profile:
                continue
            endpoints.add(name, profile)

    def forbid_endpoint(self, name: str, services: tuple[str, ...] = CALLERS) -> None:
        for service in services:
            self.servers[service].definition.domain.endpoints.remove(name)

    def allow_data_root(self, directory: str | Path, services: tuple[str, ...] = DATA_READERS) -> None:
        """Let requests to `services` name data under `directory` (the operator's act, in-process)."""
        for service in services:
            roots = self.servers[service].definition.domain.data_roots
            if Path(directory) not in roots:
                roots.append(Path(directory))

    def _warn_without_auth(self) -> None:
        open_ = [name for name in SERVICE_NAMES if self.token_of(name) is None]
        if not open_:
            return
        what = "all five services" if len(open_) == len(SERVICE_NAMES) else ", ".join(open_)
        how = "set TRACE_<SERVICE>_AUTH_TOKEN (or `tracectl up --token`) to require a token"
        hosts = sorted({self.servers[name].settings.host for name in open_ if name in self.servers} or {self.host})
        if all(is_loopback(h) for h in hosts):
            log.warning("embedded stack: %s run without auth, on loopback (%s) only: any process on this machine "
                        "may call them; %s", what, ", ".join(hosts), how)
        else:
            log.warning("embedded stack: %s run WITHOUT AUTH on %s, reachable from other machines: anyone who can "
                        "connect may call every method; %s", what, ", ".join(hosts), how)

    async def start(self) -> None:
        writable_dir(self.root, self.root_flag, self.root_fix)
        check_host(self.host)
        other = other_stack(self.root)
        if other is not None and self.exclusive and other.exclusive:
            raise InvalidArgument(f"`tracectl up` (pid {other.pid}) is already running on it ({self.state_file})",
                                  field=f"{self.root_flag} {self.root}",
                                  fix=f"Use that one (`tracectl status --root {self.root}`), stop it first (Ctrl-C "
                                      f"where it runs, or `kill {other.pid}`), or give another {self.root_flag}; if "
                                      f"pid {other.pid} is no TRACE stack, delete {self.state_file}")
        self.auth = self.resolve_auth()
        allowed = self.overrides.get(EMBEDDED_ENDPOINTS) or {}
        common = {**dict(host=self.host, port=0, metrics_host=self.host, metrics_port=0,
                         artifact_root=self.root.resolve().as_uri()),
                  **{k: v for k, v in self.overrides.items()  # e.g. an s3:// root
                     if k not in (EMBEDDED_ENDPOINTS, EMBEDDED_DATA_ROOTS, EMBEDDED_MODEL_ROOTS, "model_roots")}}
        # model roots: tracectl's own (local_model_roots), then those the overrides and the command name
        model_roots = [*(self.overrides.get("model_roots") or ()), *(self.overrides.get(EMBEDDED_MODEL_ROOTS) or ())]
        try:
            for name in SERVICE_NAMES:
                extra = {"model_roots": local_model_roots(name, model_roots, cwd=self.cwd_model_root)}
                if name == "trainer":  # environments of a run are played through the environment service
                    extra["environment_address"] = self.servers["environment"].target
                    extra["environment_token"] = self.token_of("environment")  # its token, not the trainer's
                settings, definition = build(name, **common, **extra, auth_token=self.token_of(name))
                server = TraceServer(settings, definition, warn_without_auth=False)  # said once, below
                await start_listening(server, {"host": "--host"})  # every port is 0: only the host can fail
                self.servers[name] = server
            for service, profiles in allowed.items():
                for profile, fields in profiles.items():
                    self.allow_endpoint(profile, **fields, services=(service,))
            for directory in self.overrides.get(EMBEDDED_DATA_ROOTS) or ():
                self.allow_data_root(directory)
        except BaseException:
            await self.stop()
            raise
        self._warn_without_auth()
        auth = {name: {"enabled": token is not None, "token_from": source}
                for name, (token, source) in self.auth.items()}  # where the token is, never the token
        other = other_stack(self.root)
        if other is not None and not (self.exclusive and not other.exclusive):
            # its embedded.json stays: `tracectl status` keeps finding that stack
            log.warning("embedded stack: another stack (pid %d) is running on %s and owns %s; this one serves on "
                        "ports of its own until it stops and leaves that file alone", other.pid, self.root,
                        self.state_file)
            return
        if other is not None:  # `up` beside a one-command stack (a run): `status` should find the `up`
            log.warning("embedded stack: a one-command stack (pid %d) is running on %s; %s now names this one",
                        other.pid, self.root, self.state_file)
        tmp = self.state_file.with_suffix(f".{os.getpid()}.tmp")  # two processes on one root never share it
        tmp.write_text(json.dumps({"pid": os.getpid(), "process": process_identity(os.getpid()),
                                   "exclusive": self.exclusive, "artifact_root": common["artifact_root"],
                                   "targets": self.targets, "metrics": self.metrics_urls, "http": self.http_urls,
                                   "auth": auth}, indent=2))
        os.replace(tmp, self.state_file)
        self.owns_state = True

    async def stop(self, grace: float = 2.0) -> None:
        for server in list(self.servers.values())[::-1]:
            await server.stop(grace)
        self.servers.clear()
        try:
            state = json.loads(self.state_file.read_text())
            if state.get("pid") == os.getpid():
                self.state_file.unlink()
        except (OSError, ValueError):
            pass


def allow_from_command(args, service: str, name: str, base_url: str, api_key_env: str = "") -> None:
    """A command that names an endpoint by URL (`--llm-url`, `--endpoint`) is the operator of the
    service it embeds: allow the URL there (as profile `name`, key from `api_key_env` in this
    process's environment). A deployed service (`--target`) keeps its operator's profiles: the
    request carries only the URL, which that service maps to one of them or refuses."""
    if not base_url:
        return
    overrides = dict(getattr(args, "overrides", None) or {})
    allowed = {k: dict(v) for k, v in (overrides.get(EMBEDDED_ENDPOINTS) or {}).items()}
    allowed.setdefault(service, {})[name] = {"base_url": base_url, "api_key_env": api_key_env}
    args.overrides = {**overrides, EMBEDDED_ENDPOINTS: allowed}


def allow_models_from_command(args, *refs: str) -> None:
    """A command that names local model, adapter or gates paths is the operator of the services it
    embeds: list their directories as model roots (module docstring). A deployed service keeps its own."""
    dirs = model_dirs(*refs)
    if not dirs:
        return
    overrides = dict(getattr(args, "overrides", None) or {})
    roots = list(overrides.get(EMBEDDED_MODEL_ROOTS) or ())
    args.overrides = {**overrides, EMBEDDED_MODEL_ROOTS: [*roots, *dirs]}


def allow_data_from_command(args, directory: str | Path) -> None:
    """A command that names a local data directory (`tracectl run`'s target.uri, `tracectl rollout/train
    --env DIR`) is the operator of the services it embeds: list the directory as their data root. A
    deployed service (`--target`) keeps its operator's roots."""
    overrides = dict(getattr(args, "overrides", None) or {})
    roots = list(overrides.get(EMBEDDED_DATA_ROOTS) or ())
    args.overrides = {**overrides, EMBEDDED_DATA_ROOTS: [*roots, Path(directory)]}


@dataclass(frozen=True)
class OtherStack:
    """The stack of another live process that `root`'s embedded.json names."""

    pid: int
    exclusive: bool  # a long-running `tracectl up` (files written before the field: taken as one)


def process_identity(pid: int) -> str | None:
    """'<boot id>:<start time>' of process `pid` (Linux /proc), which no later process with a reused pid
    shares; None where it cannot be read."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return f"{boot}:{fields[19]}"  # field 22, starttime (fields[0] is field 3, after "pid (comm)")
    except (OSError, IndexError):
        return None


def other_stack(root: Path) -> OtherStack | None:
    """The stack `root`'s embedded.json names when its process is alive and is not this one; None
    otherwise (no file, a stale one -- its process gone, or its pid now another process's, told apart
    by the boot id and start time recorded beside it -- or this process's)."""
    state = read_state(root)
    pid = state.get("pid") if state else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except PermissionError:
        pass  # alive, under another user
    except OSError:
        return None
    recorded = state.get("process")
    if isinstance(recorded, str) and process_identity(pid) not in (None, recorded):
        return None  # the pid was reused (or the machine rebooted): that stack is gone
    return OtherStack(pid, state.get("exclusive") is not False)


def read_state(root: Path) -> dict | None:
    try:
        state = json.loads((root / "embedded.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("targets"), dict) else None  # damaged: none


class BackgroundStack:
    """An EmbeddedStack on its own event-loop thread, for blocking callers (tracectl, tests).

    `stub(service)` gives a real gRPC stub to it; `call(coro)` runs a coroutine on the
    servers' loop (to reach a service's domain object in-process)."""

    def __init__(self, root: Path, token: str | None = None, overrides: dict | None = None,
                 root_flag: str = "--root", root_fix: str = ""):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="embedded-stack", daemon=True)
        self.thread.start()
        self.stack = EmbeddedStack(root=root, token=token, overrides=overrides or {}, root_flag=root_flag,
                                   root_fix=root_fix)
        self.channels: dict[str, object] = {}
        self._channels_lock = threading.Lock()
        try:
            self.call(self.stack.start())
        except BaseException:
            self._stop_loop()
            raise

    def call(self, coro, timeout: float = 60):
        fut: Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    @property
    def root(self) -> Path:
        return self.stack.root

    @property
    def targets(self) -> dict[str, str]:
        return self.stack.targets

    @property
    def metrics_urls(self) -> dict[str, str]:
        return self.stack.metrics_urls

    def domain(self, service: str):
        return self.stack.servers[service].definition.domain

    def http_url(self, service: str) -> str | None:
        return self.stack.servers[service].definition.http_url

    @property
    def token(self) -> str | None:
        """The stack-wide token (services with their own TRACE_<SERVICE>_AUTH_TOKEN use that)."""
        return self.stack.token

    def token_of(self, service: str) -> str | None:
        """The token `service` requires (None: it runs without auth)."""
        return self.stack.token_of(service)

    def allow_endpoint(self, name: str, base_url: str, api_key_env: str = "", models: tuple[str, ...] = (),
                       services: tuple[str, ...] = CALLERS) -> None:
        """EmbeddedStack.allow_endpoint, on the servers' loop."""
        async def allow() -> None:
            self.stack.allow_endpoint(name, base_url, api_key_env, models, services)
        self.call(allow())

    def forbid_endpoint(self, name: str, services: tuple[str, ...] = CALLERS) -> None:
        async def forbid() -> None:
            self.stack.forbid_endpoint(name, services)
        self.call(forbid())

    def allow_data_root(self, directory: str | Path, services: tuple[str, ...] = DATA_READERS) -> None:
        """EmbeddedStack.allow_data_root, on the servers' loop."""
        async def allow() -> None:
            self.stack.allow_data_root(directory, services)
        self.call(allow())

    def stub(self, service: str, token: str | None | bool = True):
        """A stub with the token `service` requires (token=True), none (None) or the given one."""
        tok = self.token_of(service) if token is True else token
        key = f"{service}:{tok}"
        with self._channels_lock:  # one channel per key, also when threads ask at once
            if key not in self.channels:
                self.channels[key] = open_channel(Endpoint(self.targets[service], tok or None))
            channel = self.channels[key]
        return stub(service, channel)

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()
        self.call(self.stack.stop(grace=1.0))
        self._stop_loop()

    def __enter__(self) -> BackgroundStack:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
