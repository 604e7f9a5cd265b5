"""Process lockdown for the sandbox worker: the layers that contain untrusted environment code.

The sandbox worker (`worker.py`) calls `lock_down(...)` once, after it has imported
everything it needs and before it loads any untrusted module. Each layer is best effort
and reports whether it is in force, so the validation report can say exactly what
contained a candidate (`IsolationReport`). Layers, outermost first:

| layer           | kernel-enforced | what it stops                                             | needs                       |
|-----------------|-----------------|-----------------------------------------------------------|-----------------------------|
| `pidns`         | yes             | seeing or signalling any process outside the worker: the worker code runs as pid 1 of its own PID namespace (`fork_supervised`), so no other worker, the service or the host has a pid it can name | root (CLONE_NEWPID) |
| `netns`         | yes             | any network: a fresh network namespace has only a down `lo` | root, or unprivileged user namespaces |
| `mount_ro`      | yes             | writes outside the scratch dir: `/` recursively read-only in a private mount namespace, scratch bind-mounted writable | root (mount_setattr, Linux >= 5.12) |
| `fs_root`       | yes             | reading host files: the worker's `/` is an empty tmpfs (pivot_root) holding only read-only binds of the interpreter, the directories of its loaded shared libraries, the standard library, site-packages, the project packages environment code may import, `/dev/null`, `/dev/zero`, `/dev/urandom`, the private /proc, and scratch (writable); no /etc, no host temp dir, no artifact store, no other worker's scratch. Parents of each bind are fresh 0755 tmpfs directories, so a project under a 0700 home is reachable | root, a mount namespace, pivot_root |
| `proc_private`  | yes             | reading other processes' /proc entries (environ, cmdline, status): a fresh procfs of the worker's own PID namespace is mounted on /proc | `pidns` and `mount_ro` |
| `uid`           | yes             | reading other processes' secrets, root-owned files; makes RLIMIT_NPROC count (it never applies to uid 0). Each worker gets its own uid from a configured range (`uid_distinct`), so no two workers share file or signal permissions | root (setuid) |
| `rlimits`       | yes             | CPU time (SIGKILL at the limit: soft == hard), address space (MemoryError), file size (EFBIG), new processes/threads (RLIMIT_NPROC), open files, core dumps | nothing |
| `seccomp`       | yes             | socket(), fork/vfork/clone-without-CLONE_THREAD, execve, mount, unshare, bpf, io_uring ... answered with EPERM (clone3 with ENOSYS so glibc falls back to clone); signalling, tracing or reading another process (kill/tkill/tgkill/rt_sigqueueinfo aimed at any pid but the worker's own, pidfd_open, pidfd_send_signal, pidfd_getfd, ptrace, process_vm_readv/writev, kcmp, process_madvise) kills the worker with SIGSYS, so the attempt is always reported | x86_64 or aarch64, no_new_privs |
| `audit_hook`    | no (Python)     | the same operations at the Python level with a typed violation record: sockets, subprocess/exec/fork, file writes outside scratch, reads outside the interpreter's and TRACE's code, signals, rlimit changes, ctypes, gc introspection | nothing |

Besides these layers the service bounds the worker's scratch dir as a whole (`scratch.usage`,
`SandboxConfig.scratch_mb` / `scratch_entries`: RLIMIT_FSIZE caps one file only), measuring it during
and after every call and killing a worker past it (violation "disk"); a pod's emptyDir has its
sizeLimit instead.

The audit hook is not a security boundary on its own (Python code can sometimes escape
a hook); it exists so that a blocked attempt is *reported* as a violation of a known kind
even when the environment code catches the resulting exception. Containment comes from
the kernel layers; the validation's static check of the source is advisory too. On this
project's development machine (root, Linux 6.x) every layer is in force; in a Kubernetes
pod (non-root, RuntimeDefault seccomp profile) `pidns`, `netns`, `mount_ro`, `fs_root` and `uid` are
unavailable inside the container, which is why the service refuses such a worker unless the
operator allows weak isolation (`missing_layers`, `REQUIRED_LAYERS`) and runs generated code
in sandbox pods instead (`pods.py`): there the pod's own controls (its own PID, mount and
network namespaces, a NetworkPolicy denying egress, read-only root filesystem holding only the
image, no host paths or store mounted, no service-account token, non-root user) take their place, while `rlimits`, `seccomp` and
`audit_hook` still apply in the container.

Only Linux is supported; on other systems `lock_down` reports every kernel layer as
unavailable.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

NOBODY = 65534

# -- constants from the Linux UAPI headers ---------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x1, 0x20, 0x1000, 0x4000, 1 << 18
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
MNT_DETACH = 0x2
#: pivot_root has no libc wrapper: syscall numbers per architecture
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_MOUNT_SETATTR = 442  # same number on every architecture (new syscalls are unified)
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2

# BPF opcodes and seccomp return values
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
#: offsets in struct seccomp_data: nr, arch, then args[6] (u64 each; the low half first on little-endian)
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16

#: arch -> (AUDIT_ARCH value, syscall numbers). Only syscalls these numbers name are filtered.
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "socket": 41, "connect": 42, "socketpair": 53, "clone": 56, "fork": 57, "vfork": 58,
        "execve": 59, "kill": 62, "ptrace": 101, "rt_sigqueueinfo": 129, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "tkill": 200, "tgkill": 234, "add_key": 248, "request_key": 249,
        "keyctl": 250, "migrate_pages": 256, "unshare": 272, "move_pages": 279, "rt_tgsigqueueinfo": 297,
        "prlimit64": 302, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "bpf": 321, "execveat": 322, "userfaultfd": 323,
        "perf_event_open": 298, "pidfd_send_signal": 424, "io_uring_setup": 425, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434,
        "clone3": 435, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
        "process_mrelease": 448}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "socketpair": 199, "connect": 203, "clone": 220, "execve": 221,
        "ptrace": 117, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "add_key": 217, "request_key": 218,
        "keyctl": 219, "migrate_pages": 238, "move_pages": 239, "rt_tgsigqueueinfo": 240, "prlimit64": 261,
        "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271,
        "kcmp": 272, "bpf": 280, "execveat": 281, "userfaultfd": 282, "perf_event_open": 241,
        "pidfd_send_signal": 424, "io_uring_setup": 425, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
        "process_madvise": 440, "mount_setattr": 442, "process_mrelease": 448}),
}
#: Syscalls refused with EPERM (clone is refused only without CLONE_THREAD; clone3 gets ENOSYS).
DENIED_SYSCALLS = ("socket", "connect", "socketpair", "fork", "vfork", "execve", "execveat",
                   "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf", "perf_event_open",
                   "io_uring_setup", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
                   "mount_setattr", "add_key", "request_key", "keyctl", "userfaultfd", "open_by_handle_at",
                   "migrate_pages", "move_pages")
#: Syscalls that only ever reach another process: the worker is killed (SIGSYS) on the first one,
#: so an attempt cannot be caught and hidden by the environment code.
KILLING_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_send_signal",
                    "pidfd_getfd", "kcmp", "process_madvise", "process_mrelease")
#: Signal syscalls allowed only when their first argument (pid / tgid) is the worker's own pid;
#: aimed anywhere else (another pid, 0 = the process group, -1 = everyone) they kill the worker.
SELF_ONLY_SIGNAL_SYSCALLS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
#: Process-wide limits may be read or lowered on the worker itself (pid 0 or its own), never elsewhere.
SELF_ONLY_EPERM_SYSCALLS = ("prlimit64",)

#: Layers that must all hold for a process-mode worker to run generated code (see missing_layers).
REQUIRED_LAYERS = ("pidns", "netns", "mount_ro", "fs_root", "proc_private", "uid", "rlimits", "seccomp")
#: Device nodes the worker's own root holds (bound from the host's /dev).
ROOT_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")


@dataclass
class Limits:
    """Resource limits applied with setrlimit (soft == hard, so the code cannot raise them)."""

    cpu_seconds: int = 300          # total CPU seconds of the worker (SIGXCPU when passed)
    memory_bytes: int = 1 << 30     # RLIMIT_AS: allocations beyond it raise MemoryError
    file_size_bytes: int = 16 << 20  # RLIMIT_FSIZE: larger writes fail with EFBIG
    max_processes: int = 0          # RLIMIT_NPROC of the sandbox uid: 0 = no fork, no threads
    open_files: int = 64            # RLIMIT_NOFILE


@dataclass
class IsolationReport:
    """Which layers are in force in this worker (recorded in every validation report)."""

    platform: str = ""
    pidns: bool = False
    netns: bool = False
    mount_ro: bool = False
    #: the worker's root is a tmpfs of its own holding only `fs_root_binds` (read-only) and scratch
    fs_root: bool = False
    fs_root_binds: list[str] = field(default_factory=list)
    proc_private: bool = False
    uid: int | None = None
    #: the worker dropped from root to a sandbox uid (a uid the service does not run as)
    uid_dropped: bool = False
    #: that uid was given to this worker alone (TRACE_ENVIRONMENT_SANDBOX_UID_BASE / _UID_COUNT)
    uid_distinct: bool = False
    seccomp: bool = False
    audit_hook: bool = False
    rlimits: dict[str, int] = field(default_factory=dict)
    #: wall-clock milliseconds lock_down took (namespaces, mounts, uid, limits, filters)
    lockdown_ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def network(self) -> str:
        """The strongest network barrier in force: netns > seccomp > audit_hook > none."""
        if self.netns:
            return "netns"
        if self.seccomp:
            return "seccomp"
        if self.audit_hook:
            return "audit_hook"
        return "none"

    def held(self) -> list[str]:
        """The layers in force, by name (the names of REQUIRED_LAYERS, plus uid_distinct and audit_hook)."""
        flags = {"pidns": self.pidns, "netns": self.netns, "mount_ro": self.mount_ro, "fs_root": self.fs_root,
                 "proc_private": self.proc_private, "uid": self.uid_dropped, "uid_distinct": self.uid_distinct,
                 "rlimits": bool(self.rlimits), "seccomp": self.seccomp, "audit_hook": self.audit_hook}
        return [name for name, on in flags.items() if on]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "network": self.network, "held": self.held()}


def missing_layers(held: Iterable[str], required: Iterable[str] = REQUIRED_LAYERS) -> list[str]:
    """The required layers that are not in `held` (an IsolationReport's `held` list)."""
    have = set(held)
    return [layer for layer in required if layer not in have]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


# -- namespaces -------------------------------------------------------------------------------

def _unshare(libc: ctypes.CDLL, flags: int) -> str | None:
    if libc.unshare(flags) != 0:
        return _errno_text()
    return None


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _mount_private_proc(libc: ctypes.CDLL) -> str | None:
    """Mount a procfs of this process's own PID namespace on /proc (needs a private mount namespace)."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"proc", b"/proc", b"proc", flags, None) != 0:
        return f"mount proc: {_errno_text()}"
    return None


def _read_only_root(libc: ctypes.CDLL, scratch: str, private_proc: bool) -> tuple[str | None, str | None]:
    """In a fresh mount namespace: make every mount read-only except a bind mount of scratch
    (and first, when `private_proc`, mount a procfs of the worker's PID namespace on /proc).
    Returns (why read-only failed, why /proc failed), None meaning it worked."""
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return f"make / private: {_errno_text()}", "no private mount namespace"
    why_proc = _mount_private_proc(libc) if private_proc else "no PID namespace of its own"
    path = scratch.encode()
    if libc.mount(path, path, None, MS_BIND | MS_REC, None) != 0:
        return f"bind scratch: {_errno_text()}", why_proc
    ro = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(ro), ctypes.sizeof(ro)) != 0:
        return f"mount_setattr(/, ro, recursive): {_errno_text()}", why_proc
    rw = _MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path, 0, ctypes.byref(rw), ctypes.sizeof(rw)) != 0:
        return f"mount_setattr(scratch, rw): {_errno_text()}", why_proc
    return None, why_proc


_OLD = "/.oldroot"


def _mkdirs(path: str) -> None:
    """Create `path` and its missing parents in the new root, each 0755 whatever the umask."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        os.mkdir(d)
        os.chmod(d, 0o755)


def symlinks_along(paths: Iterable[str]) -> list[tuple[str, str]]:
    """The host's symlinks along `paths` (names Python uses, such as a venv's bin/python or a
    lib64 -> lib), as (where, target), following each into its target, so the same names can be
    recreated in the worker's own root and resolve there as on the host."""
    found: dict[str, str] = {}

    def walk(path: str, depth: int) -> None:
        if depth > 8:
            return
        cur = "/"
        for comp in [c for c in path.split("/") if c]:
            nxt = os.path.join(cur, comp)
            if os.path.islink(nxt):
                target = os.readlink(nxt)
                if nxt not in found:
                    found[nxt] = target
                    walk(os.path.normpath(os.path.join(cur, target)), depth + 1)
                cur = os.path.realpath(nxt)
            elif os.path.lexists(nxt):
                cur = nxt
            else:
                return

    for p in paths:
        if p:
            walk(os.path.abspath(p), 0)
    return sorted(found.items())


def _own_root(libc: ctypes.CDLL, scratch: str, binds: Iterable[str], aliases: Iterable[str],
              private_proc: bool) -> tuple[str | None, str | None, list[str]]:
    """Make this process's root an empty tmpfs holding read-only binds of `binds` (host paths,
    each at its own path), ROOT_DEVICES, a private /proc (when `private_proc`) and scratch
    (writable); `aliases` are names whose symlinks are recreated (`symlinks_along`). Must run in a
    private mount namespace (after `/` was made MS_PRIVATE). Returns (why the root failed, why
    /proc failed, the paths bound), None meaning it worked.

    Semantics:
        mount tmpfs (mode 0755) on scratch; mkdir <tmpfs>/.oldroot; pivot_root(tmpfs, .oldroot)
        for p in dedup(binds) + ROOT_DEVICES + [scratch]:      # nested paths dropped
            create p's parents (0755 dirs) and p (dir, or empty file) in the tmpfs
            bind /.oldroot/p -> p (recursive)
        recreate the host's symlinks along each alias (outside binds); mount proc on /proc if private_proc
        detach /.oldroot; mount_setattr(/, ro+nosuid, recursive); mount_setattr(scratch, rw)

    A failure before pivot_root leaves the old root in place (the caller falls back to
    `_read_only_root`); one after it raises OSError: the worker must not go on in a half-built root.
    """
    machine = platform.machine()
    if machine not in SYS_PIVOT_ROOT:
        return f"no pivot_root number for {machine}", "no root of its own", []
    links = symlinks_along(aliases)  # read while the host's tree is still the root
    stage = scratch.encode()
    if libc.mount(b"tmpfs", stage, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m") != 0:
        return f"mount tmpfs: {_errno_text()}", "no root of its own", []
    os.mkdir(scratch + _OLD, 0o700)
    if libc.syscall(SYS_PIVOT_ROOT[machine], stage, (scratch + _OLD).encode()) != 0:
        why = _errno_text()
        libc.umount2(stage, MNT_DETACH)
        return f"pivot_root: {why}", "no root of its own", []
    os.chdir("/")
    wanted = sorted({os.path.normpath(p) for p in binds if p and os.path.lexists(_OLD + p)})
    bound: list[str] = []
    for p in wanted:  # sorted: a parent comes before what lies under it, which it already holds
        if not _under(p, tuple(bound)):
            bound.append(p)
    rw = os.path.normpath(scratch)
    bound = [p for p in bound if not _under(p, (rw,)) and not _under(rw, (p,))]
    devices = [d for d in ROOT_DEVICES if os.path.exists(_OLD + d)]
    for p in (*bound, *devices, rw):
        _mkdirs(os.path.dirname(p))
        if os.path.isdir(_OLD + p):
            _mkdirs(p)
        else:
            with open(p, "x"):
                pass
        src = (_OLD + p).encode()
        if libc.mount(src, p.encode(), None, MS_BIND | MS_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"sandbox fs_root: bind {p}: {_errno_text()}")
    held = (*bound, *devices, rw)
    for where, target in links:  # never inside a bind: that would write to the host
        if not _under(where, held) and not os.path.lexists(where):
            parent = os.path.dirname(where)
            if os.path.islink(parent) or _under(parent, held):
                continue
            _mkdirs(parent)
            os.symlink(target, where)
    why_proc = None
    if private_proc:
        _mkdirs("/proc")
        why_proc = _mount_private_proc(libc)
    else:
        why_proc = "no PID namespace of its own (no /proc in the worker's root)"
    if libc.umount2(_OLD.encode(), MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), f"sandbox fs_root: detach the old root: {_errno_text()}")
    os.rmdir(_OLD)
    ro = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(ro), ctypes.sizeof(ro)) != 0:
        raise OSError(ctypes.get_errno(), f"sandbox fs_root: mount_setattr(/, ro): {_errno_text()}")
    writable = _MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, rw.encode(), 0, ctypes.byref(writable),
                    ctypes.sizeof(writable)) != 0:
        raise OSError(ctypes.get_errno(), f"sandbox fs_root: mount_setattr(scratch, rw): {_errno_text()}")
    return None, why_proc, [*bound, *devices]


# -- PID namespace --------------------------------------------------------------------------------

#: Prefix of the line the PID-namespace supervisor writes to stderr when the worker has ended.
EXIT_MARKER = "trace-sandbox-exit: "


def fork_supervised(pid_namespace: bool = True, libc: ctypes.CDLL | None = None) -> str | None:
    """Fork the worker off a supervisor, into a PID namespace of its own when `pid_namespace`
    (unshare(CLONE_NEWPID) before the fork; needs root).

    Returns, in the child: None when it is pid 1 of a new PID namespace (the worker code goes
    on there), else the reason it is not (not root, unshare refused, disabled). The parent never
    returns: it becomes the worker's supervisor -- it lets go of stdin/stdout (the child answers
    the service directly), waits for the child, writes one `EXIT_MARKER` JSON line to stderr
    (how the child ended, its CPU seconds and peak RSS from wait4) and exits with the child's
    status (128 + signal when it was killed). It runs no untrusted code; the child is in its
    process group and gets SIGKILL if the supervisor dies (PR_SET_PDEATHSIG). Only where fork
    itself fails (or not on Linux) is there no supervisor: the reason then says so.

    Semantics:
        if pid_namespace: unshare(CLONE_NEWPID), or note why not
        pid = fork()
        child:  prctl(PR_SET_PDEATHSIG, SIGKILL); return note (None: own PID namespace)
        parent: stdin, stdout := /dev/null; (status, rusage) = wait4(pid)
                stderr <- EXIT_MARKER {"signal"|"code", "cpu_seconds", "max_rss_kb", "pid_namespace"}
                _exit(code, or 128 + signal)
    """
    if not sys.platform.startswith("linux"):
        return "not Linux (no supervisor either)"
    libc = libc or _libc()
    note: str | None = None
    if not pid_namespace:
        note = "disabled by the sandbox config"
    elif os.geteuid() != 0:
        note = f"not root (uid {os.geteuid()}): CLONE_NEWPID needs CAP_SYS_ADMIN"
    else:
        why = _unshare(libc, CLONE_NEWPID)
        if why is not None:
            note = f"unshare(CLONE_NEWPID): {why}"
    try:
        pid = os.fork()
    except OSError as exc:
        return f"{note or 'no PID namespace'}; fork of the supervisor failed: {exc}"
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return note
    _supervise(pid, pid_namespace=note is None)  # never returns
    return note  # pragma: no cover


def _supervise(pid: int, pid_namespace: bool) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # the service stops the worker with SIGKILL (process group)
    while True:
        try:
            _, status, usage = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            status, usage = 0, None
            break
    report: dict[str, Any] = {"pid_namespace": pid_namespace}
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
        code = 128 + report["signal"]
    else:
        report["code"] = code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
    if usage is not None:
        report["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 3)
        report["max_rss_kb"] = int(usage.ru_maxrss)
    try:
        os.write(2, f"\n{EXIT_MARKER}{json.dumps(report)}\n".encode())
    except OSError:
        pass
    os._exit(code)


# -- seccomp ------------------------------------------------------------------------------------

def _stmt(code: int, k: int) -> tuple[int, int, Any, Any]:
    return (code, k, 0, 0)


def _jump(code: int, k: int, jt: Any, jf: Any) -> tuple[int, int, Any, Any]:
    """A conditional jump; jt / jf are labels (str) or relative offsets (int, 0 = next)."""
    return (code, k, jt, jf)


def _assemble(prog: list[Any]) -> list[bytes]:
    """Resolve labels (strings in the list mark positions; jump targets name them) into BPF."""
    where: dict[str, int] = {}
    body: list[tuple[int, int, Any, Any]] = []
    for item in prog:
        if isinstance(item, str):
            where[item] = len(body)
        else:
            body.append(item)
    out = []
    for i, (code, k, jt, jf) in enumerate(body):
        offs = []
        for target in (jt, jf):
            off = where[target] - i - 1 if isinstance(target, str) else target
            if not 0 <= off <= 255:
                raise ValueError(f"BPF jump out of range at {i}: {target!r}")
            offs.append(off)
        out.append(struct.pack("=HBBI", code, offs[0], offs[1], k & 0xFFFFFFFF))
    return out


def seccomp_program(machine: str | None = None, own_pid: int | None = None) -> list[bytes]:
    """The BPF filter (one 8-byte instruction per item) for `machine` (default: this one).

    `own_pid` is the worker's pid as it sees it (1 in its own PID namespace; default getpid()).

    Semantics:
        if arch != this arch:                      kill the process (no syscall-number confusion)
        if nr >= 0x40000000 (x32 ABI):             EPERM
        if nr in DENIED_SYSCALLS:                  EPERM
        if nr in KILLING_SYSCALLS:                 kill the process (SIGSYS)
        if nr in SELF_ONLY_SIGNAL_SYSCALLS:        allow iff (int) arg0 == own_pid, else kill the process
        if nr in SELF_ONLY_EPERM_SYSCALLS:         allow iff (int) arg0 in {0, own_pid}, else EPERM
        if nr == clone3:                           ENOSYS (glibc then falls back to clone)
        if nr == clone:                            allow iff flags & CLONE_THREAD (threads yes, processes no)
        otherwise:                                 allow
    """
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp table for {machine}")
    own = os.getpid() if own_pid is None else own_pid
    audit_arch, numbers = _ARCHES[machine]
    prog: list[Any] = [_stmt(_BPF_LD_W_ABS, _OFF_ARCH), _jump(_BPF_JEQ_K, audit_arch, 0, "kill"),
                       _stmt(_BPF_LD_W_ABS, _OFF_NR), _jump(_BPF_JGE_K, 0x40000000, "eperm", 0)]
    for names, label in ((DENIED_SYSCALLS, "eperm"), (KILLING_SYSCALLS, "kill"),
                         (SELF_ONLY_SIGNAL_SYSCALLS, "self_or_kill"), (SELF_ONLY_EPERM_SYSCALLS, "self_or_eperm")):
        prog += [_jump(_BPF_JEQ_K, numbers[name], label, 0) for name in names if name in numbers]
    prog += [_jump(_BPF_JEQ_K, numbers["clone3"], "enosys", 0), _jump(_BPF_JEQ_K, numbers["clone"], "clone", 0),
             _stmt(_BPF_RET_K, _RET_ALLOW)]
    # pid_t is an int: the kernel reads the low 32 bits of arg0 (little-endian: the first word)
    prog += ["self_or_kill", _stmt(_BPF_LD_W_ABS, _OFF_ARG0), _jump(_BPF_JEQ_K, own, "allow", "kill")]
    prog += ["self_or_eperm", _stmt(_BPF_LD_W_ABS, _OFF_ARG0), _jump(_BPF_JEQ_K, 0, "allow", 0),
             _jump(_BPF_JEQ_K, own, "allow", "eperm")]
    prog += ["clone", _stmt(_BPF_LD_W_ABS, _OFF_ARG0), _jump(_BPF_JSET_K, CLONE_THREAD, "allow", "eperm")]
    prog += ["allow", _stmt(_BPF_RET_K, _RET_ALLOW), "eperm", _stmt(_BPF_RET_K, _RET_ERRNO | errno.EPERM),
             "enosys", _stmt(_BPF_RET_K, _RET_ERRNO | errno.ENOSYS), "kill", _stmt(_BPF_RET_K, _RET_KILL_PROCESS)]
    return _assemble(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(libc: ctypes.CDLL) -> str | None:
    try:
        prog = seccomp_program(own_pid=os.getpid())
    except OSError as exc:
        return str(exc)
    buf = ctypes.create_string_buffer(b"".join(prog))
    fprog = _SockFprog(len(prog), ctypes.addressof(buf))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"no_new_privs: {_errno_text()}"
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"seccomp filter: {_errno_text()}"
    return None


# -- privileges and limits ----------------------------------------------------------------------

def _drop_privileges(scratch: str, paths_to_own: Iterable[str], uid: int) -> str | None:
    try:
        for path in (scratch, *paths_to_own):
            os.chown(path, uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except OSError as exc:
        hint = (" (the uid is not mapped in this user namespace: set TRACE_ENVIRONMENT_SANDBOX_UID_BASE to a "
                "mapped range, or 0 for nobody)") if exc.errno == errno.EINVAL else ""
        return f"uid unavailable: drop to uid {uid}: {exc}{hint}"
    return None


def _set_limits(limits: Limits) -> dict[str, int]:
    applied: dict[str, int] = {}
    table = {"cpu_seconds": resource.RLIMIT_CPU, "memory_bytes": resource.RLIMIT_AS,
             "file_size_bytes": resource.RLIMIT_FSIZE, "max_processes": resource.RLIMIT_NPROC,
             "open_files": resource.RLIMIT_NOFILE}
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, which in table.items():
        value = int(getattr(limits, name))
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))
        applied[name] = value
    # Python ignores SIGXFSZ already; make sure, so an oversized write is an EFBIG error.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return applied


# -- audit hook ---------------------------------------------------------------------------------

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_NETWORK_EVENTS = frozenset({"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
                             "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto",
                             "socket.sendmsg", "urllib.Request", "http.client.connect", "ftplib.connect",
                             "smtplib.connect", "telnetlib.Telnet.open", "ssl.wrap_socket"})
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                             "os.fork", "os.forkpty", "pty.spawn", "os.startfile", "os.kill", "os.killpg",
                             "signal.pthread_kill", "_posixsubprocess.fork_exec"})
#: Modules whose import is itself reported (top-level name -> violation kind).
DENIED_IMPORTS = {"socket": "network", "_socket": "network", "ssl": "network", "http": "network",
                   "urllib": "network", "ftplib": "network", "smtplib": "network", "telnetlib": "network",
                   "xmlrpc": "network", "socketserver": "network", "subprocess": "processes",
                   "_posixsubprocess": "processes", "multiprocessing": "processes", "pty": "processes",
                   "ctypes": "native", "_ctypes": "native", "cffi": "native"}
_PATH_WRITE_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                                "os.link", "os.symlink", "os.truncate", "os.utime", "os.chflags",
                                "os.lchflags", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile",
                                "shutil.copytree", "shutil.move", "os.setxattr", "os.removexattr"})
_DENIED_EVENTS = {"resource.setrlimit": "limits", "resource.prlimit": "limits", "ctypes.dlopen": "native",
                  "ctypes.dlsym": "native", "ctypes.cdata": "native", "gc.get_objects": "introspection",
                  "gc.get_referrers": "introspection", "gc.get_referents": "introspection",
                  "sys.addaudithook": "introspection", "os.putenv": "environment",
                  "os.unsetenv": "environment", "os.chroot": "filesystem"}


class SandboxDenied(PermissionError):
    """What the audit hook raises for a blocked operation (a PermissionError, so ordinary
    `except OSError` handlers in environment code see a normal failure)."""


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def make_audit_hook(scratch: str, read_roots: Iterable[str], list_roots: Iterable[str],
                    record: Callable[[str, str], None]) -> Callable[[str, tuple], None]:
    """The hook: deny (raise SandboxDenied) and `record(kind, detail)` each blocked event.

    Reads are allowed under `read_roots` (the interpreter, site-packages, TRACE's own packages,
    scratch) and a few device files; directory listings also under `list_roots` (sys.path
    entries: the import system lists them); writes only under scratch.
    """
    scratch = os.path.realpath(scratch)
    reads = tuple(sorted({os.path.realpath(p) for p in read_roots} | {scratch, "/dev/null", "/dev/urandom",
                                                                       "/dev/zero", "/usr/share/zoneinfo",
                                                                       "/etc/localtime", "/proc/self"}))
    lists = tuple(sorted({os.path.realpath(p) for p in list_roots} | set(reads)))
    writes = (scratch, "/dev/null")

    def deny(kind: str, detail: str) -> None:
        record(kind, detail)
        raise SandboxDenied(errno.EPERM, f"sandbox: {kind} denied ({detail})")

    def resolve(path: Any) -> str | None:
        if isinstance(path, int):
            return None  # an already-open descriptor
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            path = os.fspath(path)
        return os.path.realpath(path)

    watched = frozenset({"open", "import", "os.listdir", "os.scandir", *_NETWORK_EVENTS, *_PROCESS_EVENTS,
                         *_PATH_WRITE_EVENTS, *_DENIED_EVENTS})

    def hook(event: str, args: tuple) -> None:
        if event not in watched:  # fast path: hot events such as builtins.id (deepcopy) pass untouched
            return
        if event == "open":
            path = resolve(args[0])
            if path is None:
                return
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            writing = any(c in mode for c in "wax+") or bool(flags & _WRITE_FLAGS)
            if writing and not _under(path, writes):
                deny("filesystem", f"write {path}")
            if not writing and not _under(path, reads):
                deny("filesystem", f"read {path}")
        elif event in _NETWORK_EVENTS:
            deny("network", event)
        elif event in _PROCESS_EVENTS:
            deny("processes", event)
        elif event in _PATH_WRITE_EVENTS:
            for arg in args[:2]:
                if isinstance(arg, (str, bytes, os.PathLike)):
                    path = resolve(arg)
                    if path is not None and not _under(path, writes):
                        deny("filesystem", f"{event} {path}")
        elif event in ("os.listdir", "os.scandir"):
            path = resolve(args[0] if args and args[0] is not None else ".")
            if path is not None and not _under(path, lists):
                deny("filesystem", f"list {path}")
        elif event == "import":
            top = str(args[0]).split(".", 1)[0] if args else ""
            if top in DENIED_IMPORTS:
                deny(DENIED_IMPORTS[top], f"import {args[0]}")
        elif event in _DENIED_EVENTS:
            deny(_DENIED_EVENTS[event], event)

    return hook


# -- entry point --------------------------------------------------------------------------------

def lock_down(scratch: str, limits: Limits, *, network_namespace: bool = True, mount_namespace: bool = True,
              drop_privileges: bool = True, seccomp: bool = True, audit_hook: bool = True,
              read_roots: Iterable[str] = (), list_roots: Iterable[str] = (), own_paths: Iterable[str] = (),
              uid: int = NOBODY, uid_distinct: bool = False, pid_namespace: bool = False,
              pid_namespace_note: str | None = None, fs_root: bool = True, root_binds: Iterable[str] = (),
              root_aliases: Iterable[str] = (),
              record: Callable[[str, str], None] = lambda kind, detail: None) -> IsolationReport:
    """Apply every enabled layer to this process (irreversible) and report what is in force.

    `pid_namespace` says that this process already runs as pid 1 of its own PID namespace
    (`fork_supervised` made one; else `pid_namespace_note` says why not): then a private
    /proc is mounted with the read-only root. `uid` is the sandbox uid to drop to (root only);
    `uid_distinct` that the caller gave it to this worker alone. `fs_root` (with
    `mount_namespace`) gives the worker a root of its own holding `root_binds` read-only, the
    symlinks along `root_aliases`, ROOT_DEVICES and scratch (`_own_root`); where that cannot be
    set up before pivot_root, the host's root is kept read-only instead (`mount_ro` alone, noted).

    Order matters: namespaces and mounts need root, so they come before the uid drop;
    seccomp comes after (it forbids mount/unshare) and the audit hook last (it forbids
    ctypes, which seccomp setup uses).
    """
    started = time.perf_counter()
    report = IsolationReport(platform=f"{platform.system()} {platform.release()} {platform.machine()}")
    report.pidns = pid_namespace
    if not pid_namespace:
        report.notes.append(f"pidns unavailable: {pid_namespace_note or 'not requested'}")
    scratch = os.path.realpath(scratch)
    os.chdir(scratch)
    linux = sys.platform.startswith("linux")
    libc = _libc() if linux else None
    is_root = os.geteuid() == 0
    if libc is not None and (network_namespace or mount_namespace):
        if is_root:
            flags = (CLONE_NEWNET if network_namespace else 0) | (CLONE_NEWNS if mount_namespace else 0)
            why = _unshare(libc, flags)
            if why is None:
                report.netns = network_namespace
                why_root: str | None = "disabled by the sandbox config" if not fs_root else None
                if mount_namespace and fs_root:
                    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
                        why_root = f"make / private: {_errno_text()}"
                    else:
                        why_root, why_proc, report.fs_root_binds = _own_root(
                            libc, scratch, root_binds, root_aliases, private_proc=pid_namespace)
                        report.fs_root = report.mount_ro = why_root is None
                        report.proc_private = report.fs_root and why_proc is None
                        os.chdir(scratch)
                        if report.fs_root and why_proc:
                            report.notes.append(f"proc_private unavailable: {why_proc}")
                if mount_namespace and why_root:
                    report.notes.append(f"fs_root unavailable: {why_root}")
                if mount_namespace and not report.fs_root:
                    why_ro, why_proc = _read_only_root(libc, scratch, private_proc=pid_namespace)
                    report.mount_ro = why_ro is None
                    report.proc_private = why_ro is None and why_proc is None
                    os.chdir(scratch)  # re-enter scratch through the new writable bind mount
                    if why_ro:
                        report.notes.append(f"mount_ro unavailable: {why_ro}")
                    if why_proc:
                        report.notes.append(f"proc_private unavailable: {why_proc}")
            else:
                report.notes.append(f"namespaces unavailable: unshare: {why}")
        elif network_namespace:
            why = _unshare(libc, CLONE_NEWUSER | CLONE_NEWNET)
            report.netns = why is None
            if why:
                report.notes.append(f"netns unavailable (unprivileged user namespace): {why}")
    if not report.fs_root and not any(n.startswith("fs_root") for n in report.notes):
        report.notes.append("fs_root unavailable: " + ("not root (a mount namespace of its own needs CAP_SYS_ADMIN)"
                                                       if not is_root else "needs a mount namespace of its own"))
    if not report.proc_private and not any(n.startswith("proc_private") for n in report.notes):
        report.notes.append("proc_private unavailable: /proc is the host's (needs pidns and a mount namespace)")
    if drop_privileges and is_root and linux:
        why = _drop_privileges(scratch, own_paths, uid)
        if why:
            report.notes.append(why)
        else:
            report.uid, report.uid_dropped, report.uid_distinct = uid, True, uid_distinct
            if pid_namespace and libc is not None:
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # setuid cleared it
    elif not is_root:
        report.uid = os.geteuid()
        report.notes.append(f"uid unavailable: already unprivileged (uid {os.geteuid()}), the same uid as "
                            "the process that started the worker")
    else:
        report.notes.append("uid unavailable: drop_privileges is off (the worker runs as root)")
    report.rlimits = _set_limits(limits)
    if is_root and report.uid is None and limits.max_processes >= 0:
        report.notes.append("uid 0: RLIMIT_NPROC is not enforced for root; seccomp blocks process creation")
    if seccomp and libc is not None:
        why = _install_seccomp(libc)
        report.seccomp = why is None
        if why:
            report.notes.append(f"seccomp unavailable: {why}")
    if audit_hook:
        sys.addaudithook(make_audit_hook(scratch, read_roots, list_roots, record))
        report.audit_hook = True
    report.lockdown_ms = round((time.perf_counter() - started) * 1000, 1)
    return report
