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
