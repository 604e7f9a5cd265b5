"""Where a local worker's scratch directory may live.

A worker runs under a uid of its own (`isolation.py`, layer `uid`), so it reaches its scratch
dir only if every directory above it lets other users search it (mode o+x). A private temp dir
(`mktemp -d` makes mode 0700, as CI and many job schedulers do for TMPDIR) does not: the
worker would start, lock down, and fail on its first file ("Permission denied").

    scratch_parent("", others_must_reach=True)
        tempdir = tempfile.gettempdir()
        if reachable_by_others(tempdir): return tempdir
        return first reachable of FALLBACKS (/tmp, /var/tmp, /dev/shm), said in the log
    scratch_parent(configured, True)
        configured, or FailedPrecondition naming the directory that blocks it and the fix

Only the worker's own scratch dir (mode 0711, its work/ owned by the worker's uid) is opened to
others; nothing above it is changed.

What the scratch dir holds is bounded by the service, not the kernel: RLIMIT_FSIZE caps one file, so
a worker could still fill the disk with many files. `usage` measures it (bytes on disk and entries,
links not followed, the walk stopped once past the entry cap; a directory the service cannot read is
reported, not skipped) and `deleted_open_bytes` adds the files the worker deleted but holds open; the
parent kills a worker past `SandboxConfig.scratch_mb` / `scratch_entries`, or one that hid a directory
(parent.py, violation "disk").
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from typing import NamedTuple

from trace_common.errors import FailedPrecondition

log = logging.getLogger(__name__)

FALLBACKS = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 - world-searchable by convention
_warned: set[str] = set()


def blocking_dir(path: str) -> str | None:
    """The first directory from / down to `path` that other users cannot search (or that does
    not exist); None when every one of them is o+x."""
    chain = [os.path.realpath(path)]
    while chain[-1] != os.sep:
        chain.append(os.path.dirname(chain[-1]))
    for current in reversed(chain):
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return current
        if not (stat.S_ISDIR(mode) and mode & stat.S_IXOTH):
            return current
    return None


def make_searchable_dirs(path: str) -> None:
    """`os.makedirs(path)`, each directory it creates made 0711 whatever the umask (under umask 077
    the service would otherwise create the very directory that blocks its workers); existing
    directories keep their modes."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.exists(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        os.mkdir(directory)
        os.chmod(directory, 0o711)


def _mode(path: str) -> str:
    try:
        return oct(stat.S_IMODE(os.stat(path).st_mode))
    except OSError:
        return "missing"


def scratch_parent(configured: str, others_must_reach: bool) -> str:
    """The directory to make per-worker scratch dirs in (see the module docstring)."""
    if configured:
        blocked = blocking_dir(configured) if others_must_reach else None
        if blocked is not None:
            raise FailedPrecondition(
                f"TRACE_ENVIRONMENT_SANDBOX_SCRATCH_ROOT={configured!r}: the sandbox uid cannot reach it "
                f"({blocked} is mode {_mode(blocked)}, not searchable by other users); choose a directory "
                "whose every parent is o+x (e.g. /var/tmp/trace-sandbox), or unset it for the default")
        return configured
    default = tempfile.gettempdir()
    if not others_must_reach:
        return default
    blocked = blocking_dir(default)
    if blocked is None:
        return default
    for candidate in FALLBACKS:
        if blocking_dir(candidate) is None and os.access(candidate, os.W_OK | os.X_OK):
            if default not in _warned:
                _warned.add(default)
                log.warning("sandbox scratch: the temp dir %s is not reachable by the sandbox uid (%s is mode %s); "
                            "scratch dirs go to %s instead (set TRACE_ENVIRONMENT_SANDBOX_SCRATCH_ROOT to choose)",
                            default, blocked, _mode(blocked), candidate)
            return candidate
    raise FailedPrecondition(
        f"no scratch directory the sandbox uid can reach: the temp dir {default} is blocked at {blocked} "
        f"(mode {_mode(blocked)}) and none of {', '.join(FALLBACKS)} is usable; set "
        "TRACE_ENVIRONMENT_SANDBOX_SCRATCH_ROOT to a directory whose every parent is o+x")


class ScratchUsage(NamedTuple):
    """What a scratch dir holds: bytes allocated on disk, files and directories, and the first directory
    the walk could not read ("" when none: a worker that hides one from the service is refused)."""

    bytes: int
    entries: int
    unreadable: str = ""


def usage(path: str, max_entries: int) -> ScratchUsage:
    """What `path` holds, symbolic links not followed; the walk stops once it has seen more than
    `max_entries` entries (their count is then max_entries + 1) or met a directory it cannot read.
    Entries that vanish while it walks are skipped."""
    total, entries = 0, 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            it = os.scandir(current)
        except FileNotFoundError:
            continue
        except OSError:
            return ScratchUsage(total, entries, current)
        with it:
            for entry in it:
                entries += 1
                if entries > max_entries:
                    return ScratchUsage(total, entries)
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return ScratchUsage(total, entries)


def deleted_open_bytes(pid: int) -> int:
    """Bytes allocated to files process `pid` holds open after they were deleted: in no directory, so
    `usage` cannot see them, yet on disk until closed. 0 where its fds cannot be read."""
    fds = f"/proc/{pid}/fd"
    total = 0
    try:
        names = os.listdir(fds)
    except OSError:
        return 0
    for name in names:
        try:
            if not os.readlink(f"{fds}/{name}").endswith(" (deleted)"):
                continue
            st = os.stat(f"{fds}/{name}")
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_blocks * 512
    return total
