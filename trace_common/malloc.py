"""Cap glibc's malloc arenas in TRACE's long-lived CPU processes.

glibc gives each thread that contends for the heap its own arena, up to 8 x cores. A process that
runs models on many threads (asyncio's `to_thread`, the gRPC servers' pools, the generation
worker) then keeps freed tensor memory spread over many arenas, and none of it goes back to the
OS. Measured on the smollm2 run's evaluation stage (one `tracectl run` holding the embedded
services, 2 cores): the process grew from 4.9 GB to 8.8 GB over the first arms and was at
17 GB in the per-request arm when the kernel's OOM killer stopped it; run with 2 arenas, the
per-request arm held at 2.2-3.2 GB. `MALLOC_ARENA_MAX` does the same, but it must be in the environment
before the process starts; `mallopt(M_ARENA_MAX)` from Python, before the worker threads exist,
applies it to the running process.

Semantics:
    limit_arenas(n):  no-op unless Linux + glibc, or if MALLOC_ARENA_MAX is already set (the
                      user's choice wins); else mallopt(M_ARENA_MAX, n)
                      n comes from TRACE_MALLOC_ARENA_MAX when set (0 = leave glibc's default)
    returns the cap now in force (None when this process's arenas are glibc's default)
    release_free_memory(): malloc_trim(0) on Linux + glibc (else a no-op): freed heap pages of
                      every arena go back to the OS; True when glibc released some
    DeferredRelease(delay_s, min_interval_s, collect).request(loop):
                      at most one release pending; it runs on `loop` max(delay_s, last run +
                      min_interval_s - now) seconds later: gc.collect() first when `collect`,
                      then release_free_memory() (a burst of requests costs one heap walk)
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import sys

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # <malloc.h>
DEFAULT_ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the OS (`malloc_trim(0)`). Freed memory otherwise stays in
    the process (glibc keeps it for later allocations), so its RSS would not fall after, e.g., many
    large pending jobs are cancelled (trace_common/jobs.py calls this then). True when pages were
    released; False when none were, or this is not glibc."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:  # not glibc (musl has no malloc_trim)
        return False
    return bool(trim(ctypes.c_size_t(0)))


class DeferredRelease:
    """`release_free_memory` soon, on an event loop, once for a burst of requests (module docstring).
    The job table asks after pending jobs are cancelled; the gRPC error interceptor after a large
    refused request (`collect`: the handler's exception cycle still holds the request's copies).
    `request` may be called from any thread."""

    def __init__(self, delay_s: float, min_interval_s: float = 0.0, collect: bool = False):
        self.delay_s, self.min_interval_s, self.collect = delay_s, min_interval_s, collect
        self._pending = False
        self._last = float("-inf")
        self.count = 0  # releases run

    def request(self, loop: asyncio.AbstractEventLoop) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._schedule, loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._pending:
            return
        self._pending = True
        loop.call_later(max(self.delay_s, self._last + self.min_interval_s - loop.time()), self._run, loop)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending, self._last = False, loop.time()
        self.count += 1
        if self.collect:
            gc.collect()
        released = release_free_memory()
        log.debug("deferred heap release: %s", "pages released" if released else "none released")


def limit_arenas(n: int = DEFAULT_ARENAS) -> int | None:
    """Cap this process's malloc arenas (module docstring); call before starting threads."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return int(os.environ["MALLOC_ARENA_MAX"])
    raw = os.environ.get("TRACE_MALLOC_ARENA_MAX", "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"TRACE_MALLOC_ARENA_MAX={raw!r}: expected a whole number of arenas (e.g. 2), "
                             "or 0 to keep glibc's default") from None
    if n <= 0 or not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt arenas)
        return None
    return n if mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(n)) == 1 else None


def limit_arenas_or_exit(prog: str) -> int | None:
    """`limit_arenas()` for a program's entry point: a bad TRACE_MALLOC_ARENA_MAX is printed as
    "<prog>: <what to set>" on stderr and ends the process with exit status 2 (a usage error)."""
    try:
        return limit_arenas()
    except ValueError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
