"""Stale training scratch: a trainer service killed with SIGKILL never removes its
`trace-trainer-*` dir; the next one removes it at start-up, and only dirs whose recorded owner
process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from services.trainer.executors import (
    OWNER_FILE,
    SCRATCH_PREFIX,
    LocalExecutor,
    _start_time,
    clean_stale_scratch,
)
from services.trainer.settings import TrainerSettings

REPO = Path(__file__).resolve().parents[3]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def make(root: Path, name: str, record: str | None) -> Path:
    d = root / f"{SCRATCH_PREFIX}{name}"
    d.mkdir()
    (d / "cache").mkdir()
    if record is not None:
        (d / OWNER_FILE).write_text(record)
    return d


CASES = [
    # name, owner record (PID / START placeholders), removed?
    ("dead_owner", lambda: f"{dead_pid()} 12345", True),
    ("dead_owner_no_start_time", lambda: f"{dead_pid()}", True),
    ("live_owner", lambda: f"{os.getpid()} {_start_time(os.getpid())}", False),
    ("live_pid_reused_by_another_process", lambda: f"{os.getpid()} 1", True),
    ("no_owner_record", lambda: None, False),
    ("unreadable_record", lambda: "not a pid", False),
]


@pytest.mark.parametrize(("name", "record", "removed"), CASES, ids=[c[0] for c in CASES])
def test_only_dirs_of_dead_owners_are_removed(tmp_path, name, record, removed):
    d = make(tmp_path, name, record())
    got = clean_stale_scratch(tmp_path)
    assert (got == [d]) is removed and d.exists() is not removed


def test_links_and_other_users_dirs_are_left_alone(tmp_path):
    target = make(tmp_path, "real-target", f"{dead_pid()} 1")
    (tmp_path / f"{SCRATCH_PREFIX}link").symlink_to(target)
    other = make(tmp_path, "other-user", f"{dead_pid()} 1")
    if os.geteuid() == 0:
        os.chown(other, 65534, 65534)
    removed = clean_stale_scratch(tmp_path)
    assert removed == [target] and (tmp_path / f"{SCRATCH_PREFIX}link").is_symlink()
    assert other.exists() is (os.geteuid() == 0)


def test_a_sigkilled_service_leaves_scratch_that_the_next_start_removes():
    code = ("import sys, time\nfrom services.trainer.executors import LocalExecutor\n"
            "from services.trainer.settings import TrainerSettings\n"
            "executor = LocalExecutor(TrainerSettings())\nprint(executor._work_dir(), flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        scratch = Path(proc.stdout.readline().strip())
        assert scratch.is_dir() and scratch.parent == Path(tempfile.gettempdir())
        assert (scratch / OWNER_FILE).read_text().split()[0] == str(proc.pid)
        assert LocalExecutor(TrainerSettings()) and scratch.is_dir()  # its owner still runs: kept
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert scratch.is_dir()  # SIGKILL: no cleanup ran
    LocalExecutor(TrainerSettings())  # the next service start
    assert not scratch.exists()
