"""Process lockdown for the sandbox worker: the layers that contain untrusted environment code.

The sandbox worker (`worker.py`) calls `lock_down(...)` once, after it has imported
everything it needs and before it loads any untrusted module. Each layer is best effort
and reports whether it is in force, so the validation report can say exactly what
contained a candidate (`IsolationReport`). Layers, outermost first:

| layer           | kernel-enforced | what it stops                                             | needs                       |
|-----------------|-----------------|-----------------------------------------------------------|-----------------------------|
| `netns`         | yes             | any network: a fresh network namespace has only a down `lo` | root, or unprivileged user namespaces |
| `mount_ro`      | yes             | writes outside the scratch dir: `/` recursively read-only in a private mount namespace, scratch bind-mounted writable | root (mount_setattr, Linux >= 5.12) |
| `uid`           | yes             | reading other processes' secrets (/proc/<pid>/environ), root-owned files; makes RLIMIT_NPROC count (it never applies to uid 0) | root (drops to nobody, 65534) |
| `rlimits`       | yes             | CPU time (SIGXCPU), address space (MemoryError), file size (EFBIG), new processes/threads (RLIMIT_NPROC), open files, core dumps | nothing |
| `seccomp`       | yes             | socket(), fork/vfork/clone-without-CLONE_THREAD, execve, ptrace, mount, unshare, bpf, io_uring ... answered with EPERM (clone3 with ENOSYS so glibc falls back to clone) | x86_64 or aarch64, no_new_privs |
| `audit_hook`    | no (Python)     | the same operations at the Python level with a typed violation record: sockets, subprocess/exec/fork, file writes outside scratch, reads outside the interpreter's and TRACE's code, signals, rlimit changes, ctypes, gc introspection | nothing |

The audit hook is not a security boundary on its own (Python code can sometimes escape
a hook); it exists so that a blocked attempt is *reported* as a violation of a known kind
even when the environment code catches the resulting exception. Containment comes from
the kernel layers. On this project's development machine (root, Linux 6.x) every layer
is in force; in a Kubernetes pod (non-root, RuntimeDefault seccomp profile) `netns`,
`mount_ro` and `uid` are usually unavailable and the pod's own controls (NetworkPolicy
denying egress, read-only root filesystem, no service-account token, non-root user)
take their place, while `rlimits`, `seccomp` and `audit_hook` still apply.

Only Linux is supported; on other systems `lock_down` reports every kernel layer as
unavailable.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import signal
import struct
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

NOBODY = 65534

# -- constants from the Linux UAPI headers ---------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x1, 0x20, 0x1000, 0x4000, 1 << 18
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # same number on every architecture (new syscalls are unified)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

# BPF opcodes and seccomp return values
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000

#: arch -> (AUDIT_ARCH value, syscall numbers). Only syscalls these numbers name are filtered.
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "socket": 41, "connect": 42, "socketpair": 53, "clone": 56, "fork": 57, "vfork": 58,
        "execve": 59, "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "unshare": 272, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
        "bpf": 321, "execveat": 322, "perf_event_open": 298, "io_uring_setup": 425,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "clone3": 435, "mount_setattr": 442}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "socketpair": 199, "connect": 203, "clone": 220, "execve": 221,
        "ptrace": 117, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97,
        "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280,
        "execveat": 281, "perf_event_open": 241, "io_uring_setup": 425, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "clone3": 435, "mount_setattr": 442}),
}
#: Syscalls refused with EPERM (clone is refused only without CLONE_THREAD; clone3 gets ENOSYS).
DENIED_SYSCALLS = ("socket", "connect", "socketpair", "fork", "vfork", "execve", "execveat", "ptrace",
                   "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "process_vm_readv",
                   "process_vm_writev", "bpf", "perf_event_open", "io_uring_setup", "open_tree",
                   "move_mount", "fsopen", "mount_setattr")


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
    netns: bool = False
    mount_ro: bool = False
    uid: int | None = None
    seccomp: bool = False
    audit_hook: bool = False
    rlimits: dict[str, int] = field(default_factory=dict)
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

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "network": self.network}


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


def _read_only_root(libc: ctypes.CDLL, scratch: str) -> str | None:
    """In a fresh mount namespace: make every mount read-only except a bind mount of scratch."""
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return f"make / private: {_errno_text()}"
    path = scratch.encode()
    if libc.mount(path, path, None, MS_BIND | MS_REC, None) != 0:
        return f"bind scratch: {_errno_text()}"
    ro = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(ro), ctypes.sizeof(ro)) != 0:
        return f"mount_setattr(/, ro, recursive): {_errno_text()}"
    rw = _MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path, 0, ctypes.byref(rw), ctypes.sizeof(rw)) != 0:
        return f"mount_setattr(scratch, rw): {_errno_text()}"
    return None


# -- seccomp ------------------------------------------------------------------------------------

def _stmt(code: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> list[bytes]:
    """The BPF filter (one 8-byte instruction per item) for `machine` (default: this one).

    Semantics:
        if arch != this arch:            kill the process (no syscall-number confusion)
        if nr >= 0x40000000 (x32 ABI):   EPERM
        if nr in DENIED_SYSCALLS:        EPERM
        if nr == clone3:                 ENOSYS (glibc then falls back to clone)
        if nr == clone:                  allow iff flags & CLONE_THREAD (threads yes, processes no)
        otherwise:                       allow
    """
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp table for {machine}")
    audit_arch, numbers = _ARCHES[machine]
    prog = [_stmt(_BPF_LD_W_ABS, 4), _jump(_BPF_JEQ_K, audit_arch, 1, 0), _stmt(_BPF_RET_K, _RET_KILL_PROCESS),
            _stmt(_BPF_LD_W_ABS, 0), _jump(_BPF_JGE_K, 0x40000000, 0, 1), _stmt(_BPF_RET_K, _RET_ERRNO | errno.EPERM)]
    for name in DENIED_SYSCALLS:
        if name in numbers:
            prog += [_jump(_BPF_JEQ_K, numbers[name], 0, 1), _stmt(_BPF_RET_K, _RET_ERRNO | errno.EPERM)]
    prog += [_jump(_BPF_JEQ_K, numbers["clone3"], 0, 1), _stmt(_BPF_RET_K, _RET_ERRNO | errno.ENOSYS)]
    # clone: arg0 (flags), low 32 bits at offset 16 (little-endian)
    prog += [_jump(_BPF_JEQ_K, numbers["clone"], 0, 4), _stmt(_BPF_LD_W_ABS, 16),
             _jump(_BPF_JSET_K, CLONE_THREAD, 0, 1), _stmt(_BPF_RET_K, _RET_ALLOW),
             _stmt(_BPF_RET_K, _RET_ERRNO | errno.EPERM)]
    prog.append(_stmt(_BPF_RET_K, _RET_ALLOW))
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(libc: ctypes.CDLL) -> str | None:
    try:
        prog = seccomp_program()
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

def _drop_privileges(scratch: str, paths_to_own: Iterable[str]) -> str | None:
    try:
        for path in (scratch, *paths_to_own):
            os.chown(path, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    except OSError as exc:
        return f"drop to uid {NOBODY}: {exc}"
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
_DENIED_IMPORTS = {"socket": "network", "_socket": "network", "ssl": "network", "http": "network",
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
            if top in _DENIED_IMPORTS:
                deny(_DENIED_IMPORTS[top], f"import {args[0]}")
        elif event in _DENIED_EVENTS:
            deny(_DENIED_EVENTS[event], event)

    return hook


# -- entry point --------------------------------------------------------------------------------

def lock_down(scratch: str, limits: Limits, *, network_namespace: bool = True, mount_namespace: bool = True,
              drop_privileges: bool = True, seccomp: bool = True, audit_hook: bool = True,
              read_roots: Iterable[str] = (), list_roots: Iterable[str] = (), own_paths: Iterable[str] = (),
              record: Callable[[str, str], None] = lambda kind, detail: None) -> IsolationReport:
    """Apply every enabled layer to this process (irreversible) and report what is in force.

    Order matters: namespaces and mounts need root, so they come before the uid drop;
    seccomp comes after (it forbids mount/unshare) and the audit hook last (it forbids
    ctypes, which seccomp setup uses).
    """
    report = IsolationReport(platform=f"{platform.system()} {platform.release()} {platform.machine()}")
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
                if mount_namespace:
                    why_ro = _read_only_root(libc, scratch)
                    report.mount_ro = why_ro is None
                    os.chdir(scratch)  # re-enter scratch through the new writable bind mount
                    if why_ro:
                        report.notes.append(f"mount_ro unavailable: {why_ro}")
            else:
                report.notes.append(f"namespaces unavailable: unshare: {why}")
        elif network_namespace:
            why = _unshare(libc, CLONE_NEWUSER | CLONE_NEWNET)
            report.netns = why is None
            if why:
                report.notes.append(f"netns unavailable (unprivileged user namespace): {why}")
    if drop_privileges and is_root and linux:
        why = _drop_privileges(scratch, own_paths)
        if why:
            report.notes.append(why)
        else:
            report.uid = NOBODY
    elif not is_root:
        report.uid = os.geteuid()
        if drop_privileges:
            report.notes.append(f"already unprivileged (uid {os.geteuid()})")
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
    return report
