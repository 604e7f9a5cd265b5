"""Where scratch dirs go when the worker runs under a uid of its own (`sandbox/scratch.py`).

A private temp dir (mode 0700, what `mktemp -d` makes: CI's TMPDIR, many schedulers') keeps the
sandbox uid from reaching anything below it; the worker must still start and serve."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from services.environment.sandbox import scratch as sc
from services.environment.sandbox.parent import SandboxConfig, SandboxWorker
from tests.unit.environment.test_sandbox import module
from trace_common.errors import FailedPrecondition

ROOT = os.geteuid() == 0


@pytest.fixture
def base():
    """A dir every user can search (pytest's own tmp dirs sit under a 0700 one), removed after."""
    path = Path(tempfile.mkdtemp(prefix="trace-scratch-test-", dir="/tmp"))  # noqa: S108
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tree(base):
    """base/private (mode 0700, with an open inner dir) and base/open (0755)."""
    (base / "private").mkdir(mode=0o700)
    (base / "private" / "inner").mkdir(mode=0o755)
    (base / "open").mkdir(mode=0o755)
    return base


@pytest.mark.parametrize(("where", "must_reach", "expect"), [
    ("open", True, "open"),                 # every parent o+x: used as configured
    ("private/inner", False, "private/inner"),  # the worker keeps our uid: no need to reach
    ("private/inner", True, "private"),     # refused, naming the directory that blocks it
    ("missing/dir", True, "missing"),       # a parent that does not exist blocks too
])
def test_a_configured_root_is_used_or_refused_naming_the_blocker(tree, where, must_reach, expect):
    path = str(tree / where)
    if expect == where:
        assert sc.scratch_parent(path, must_reach) == path
        return
    with pytest.raises(FailedPrecondition) as err:
        sc.scratch_parent(path, must_reach)
    msg = str(err.value)
    assert "TRACE_ENVIRONMENT_SANDBOX_SCRATCH_ROOT" in msg and str(tree / expect) in msg and "o+x" in msg


@pytest.mark.parametrize(("tempdir", "must_reach", "fallback"), [
    ("open", True, False),             # a reachable temp dir is the default
    ("private", False, False),         # not dropping privileges: the temp dir as it is
    ("private", True, True),           # unreachable: a world-searchable fallback, said in the log
])
def test_the_default_is_the_temp_dir_unless_the_worker_cannot_reach_it(
        tree, monkeypatch, caplog, tempdir, must_reach, fallback):
    monkeypatch.setattr(tempfile, "tempdir", str(tree / tempdir))
    monkeypatch.setattr(sc, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=sc.__name__):
        got = sc.scratch_parent("", must_reach)
    if not fallback:
        assert got == str(tree / tempdir) and not caplog.records
        return
    assert got in sc.FALLBACKS and sc.blocking_dir(got) is None
    assert str(tree / tempdir) in caplog.text and "0o700" in caplog.text


def test_no_reachable_fallback_is_an_error_naming_the_setting(tree, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tree / "private"))
    monkeypatch.setattr(sc, "FALLBACKS", (str(tree / "private" / "inner"),))
    with pytest.raises(FailedPrecondition, match="TRACE_ENVIRONMENT_SANDBOX_SCRATCH_ROOT"):
        sc.scratch_parent("", True)


@pytest.mark.skipif(not ROOT, reason="distinct sandbox uids need root")  # CI runs as root
def test_a_worker_started_under_a_private_temp_dir_serves(tree, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tree / "private"))
    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="private-tmp") as w:
        assert w.isolation["uid_distinct"]
        w.call("load", source=module())
        w.call("reset", instance="a", seed=5)
        assert w.call("step", instance="a", action=w.call("solve", seed=5)[0])["done"]
        assert w.call("result", instance="a")["reward"] == 1.0
        assert not w.transport.scratch.startswith(str(tree / "private"))


def test_a_configured_root_it_creates_is_reachable_whatever_the_umask(base):
    target = base / "made" / "by" / "the-service"
    old = os.umask(0o077)
    try:
        sc.make_searchable_dirs(str(target))
    finally:
        os.umask(old)
    assert sc.blocking_dir(str(target)) is None
    assert sc.scratch_parent(str(target), True) == str(target)


@pytest.mark.skipif(not ROOT, reason="distinct sandbox uids need root")
def test_a_workers_scratch_is_closed_to_other_workers(tree, monkeypatch):
    import stat

    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="closed") as w:
        work = os.path.join(w.transport.scratch, "work")
        st = os.stat(work)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == w.isolation["uid"]


# -- what a scratch dir holds (scratch.usage) ------------------------------------------------------------

def _usage_as(uid: int, path: str, max_entries: int) -> sc.ScratchUsage:
    """`sc.usage(path)` measured by a child process running as `uid` (as a non-root service would)."""
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            os.write(write, json.dumps(sc.usage(path, max_entries)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    return sc.ScratchUsage(*json.loads(out))


@pytest.mark.skipif(not ROOT, reason="measuring as another uid needs root")
@pytest.mark.parametrize("mode, hidden", [(0o700, False), (0o300, True), (0o100, True)])
def test_a_directory_the_measuring_uid_cannot_read_is_reported_not_skipped(mode, hidden):
    """A worker running as the service's own uid could chmod a directory it filled so that the service
    could not list it: the walk reports that directory instead of measuring around it."""
    nobody = 65534
    tmp_path = Path(tempfile.mkdtemp(prefix="trace-usage-", dir="/tmp"))  # noqa: S108 - nobody must reach it
    try:
        _measure_hidden(tmp_path, nobody, mode, hidden)
    finally:
        shutil.rmtree(tmp_path)


def _measure_hidden(tmp_path: Path, nobody: int, mode: int, hidden: bool) -> None:
    work = tmp_path / "work"
    (work / "d").mkdir(parents=True)
    (work / "d" / "blob").write_bytes(b"x" * (1 << 20))
    for p in (tmp_path, work, work / "d", work / "d" / "blob"):
        os.chown(p, nobody, nobody)
    os.chmod(tmp_path, 0o755)
    os.chmod(work / "d", mode)
    measured = _usage_as(nobody, str(work), 100)
    assert bool(measured.unreadable) is hidden, measured
    if hidden:
        assert measured.unreadable == str(work / "d")
    else:
        assert measured.bytes >= 1 << 20 and measured.entries == 2


@pytest.mark.parametrize("files, cap, entries", [(3, 10, 3), (10, 10, 10), (11, 10, 11), (50, 10, 11)])
def test_the_walk_counts_entries_and_stops_past_the_cap(tmp_path, files, cap, entries):
    for i in range(files):
        (tmp_path / f"f{i}").write_bytes(b"x" * 4096)
    measured = sc.usage(str(tmp_path), cap)
    assert measured.entries == entries and not measured.unreadable


def test_a_worker_whose_scratch_cannot_be_read_is_a_disk_violation(monkeypatch):
    from services.environment.sandbox import parent
    from services.environment.sandbox.parent import SandboxViolation

    with SandboxWorker(SandboxConfig(call_timeout_s=10.0), label="hidden") as w:
        w.call("load", source=module())
        hidden = os.path.join(w.transport.scratch, "work", "d")
        monkeypatch.setattr(parent, "usage", lambda path, cap: sc.ScratchUsage(0, 2, hidden))
        with pytest.raises(SandboxViolation) as caught:
            w.call("solve", seed=1)
        assert caught.value.kind == "disk" and "work/d" in str(caught.value)
        assert not w.alive
