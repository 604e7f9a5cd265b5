"""`trace_common.malloc.limit_arenas`: threads that allocate share at most the capped number of
glibc arenas (counted by glibc's own `malloc_stats`, in a fresh process per case)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import ctypes, sys, threading
from trace_common.malloc import limit_arenas
print("cap", limit_arenas(), file=sys.stderr)
def work():
    for _ in range(200):
        xs = [bytearray(64_000) for _ in range(20)]
        del xs
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL("libc.so.6").malloc_stats()
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc arenas are a Linux matter")


@pytest.mark.parametrize("env, cap, most_arenas", [
    ({}, "2", 2),                                  # TRACE's default
    ({"TRACE_MALLOC_ARENA_MAX": "1"}, "1", 1),
    ({"MALLOC_ARENA_MAX": "3"}, "3", 3),           # the user's own glibc setting wins
    ({"TRACE_MALLOC_ARENA_MAX": "0"}, "None", 64),  # glibc's default: one arena per contending thread
])
def test_arenas_are_capped(env, cap, most_arenas):
    base = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "TRACE_MALLOC_ARENA_MAX")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**base, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    arenas = sum(line.startswith("Arena ") for line in out.stderr.splitlines())
    assert f"cap {cap}" in out.stderr
    assert 1 <= arenas <= most_arenas
    if cap == "None":
        assert arenas > 2        # without the cap the 8 threads spread over more arenas: the probe can tell


def test_a_bad_setting_says_how_to_fix(monkeypatch):
    from trace_common.malloc import limit_arenas

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv("TRACE_MALLOC_ARENA_MAX", "two")
    with pytest.raises(ValueError, match="TRACE_MALLOC_ARENA_MAX='two': expected a whole number"):
        limit_arenas()


@pytest.mark.parametrize("command, prog", [
    ([sys.executable, "-m", "tracectl", "status"], "tracectl"),
    ([sys.executable, "-m", "services.analysis"], "analysis"),
    ([sys.executable, "-m", "services.trainer.worker", "--spec-file", "/nonexistent"], "training worker"),
])
def test_entry_points_refuse_a_bad_setting_with_exit_2(command, prog):
    base = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "TRACE_MALLOC_ARENA_MAX")}
    out = subprocess.run(command, cwd=REPO, env={**base, "TRACE_MALLOC_ARENA_MAX": "two"}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{prog}: TRACE_MALLOC_ARENA_MAX='two': expected a whole number" in out.stderr


@pytest.mark.parametrize(("min_interval_s", "bursts", "expected"), [
    (0.0, [5], 1),          # a burst of requests: one release
    (0.0, [3, 3], 2),       # two bursts, each after the last release: two
    (10.0, [3, 3], 1),      # the second burst falls inside min_interval_s: still pending at the end
])
def test_deferred_release_runs_once_per_burst(min_interval_s, bursts, expected):
    import asyncio

    from trace_common.malloc import DeferredRelease

    async def go() -> int:
        loop = asyncio.get_running_loop()
        release = DeferredRelease(0.01, min_interval_s)
        for n in bursts:
            for _ in range(n):
                release.request(loop)
            await asyncio.sleep(0.1)
        return release.count
    assert asyncio.run(go()) == expected
