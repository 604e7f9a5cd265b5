"""`tracectl tau2 replay-gold` (in-process and as a subprocess off a terminal).

A small domain directory (three real retail tasks, the real db.json and policy linked in
from the shared data) keeps the command fast; the full 114-task replay is checked against
tau2's reference in test_gold_replay.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.tau2.test_gold_replay import EXPECTED_GOLD_ERRORS
from trace_common.domains.tau2.data import load_domain
from trace_common.domains.tau2.replay import replay_actions, replay_task
from tracectl.commands import tau2 as tau2_command

TASK_IDS = ["0", "38", "46"]  # an exchange; a cancellation and a return, both after failing lookups
REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def mini_data(tmp_path: Path, data_root: Path) -> Path:
    domain = tmp_path / "tau2" / "retail"
    domain.mkdir(parents=True)
    for name in ("db.json", "policy.md"):
        (domain / name).symlink_to(data_root / "retail" / name)
    tasks = [t for t in json.loads((data_root / "retail" / "tasks.json").read_text()) if t["id"] in TASK_IDS]
    (domain / "tasks.json").write_text(json.dumps(tasks))
    return tmp_path / "tau2"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tracectl")
    tau2_command.register(p.add_subparsers(dest="command", required=True))
    return p


def test_replay_gold_command_writes_outputs_and_hashes(mini_data, tmp_path, capsys, retail):
    out = tmp_path / "out" / "gold.json"
    args = parser().parse_args(["tau2", "replay-gold", "--data", str(mini_data), "--out", str(out), "--no-progress"])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert list(result) == TASK_IDS
    for task_id in TASK_IDS:
        expected = replay_task(retail, task_id)
        assert result[task_id] == {"outputs": [r.content for r in expected.results],
                                   "final_db_sha256": expected.db.sha256_hex()}
    assert result["46"]["outputs"][1] == "Error: Order not found"
    summary = json.loads(capsys.readouterr().out)
    n_actions = sum(len(retail.task_by_id(t).gold_actions) for t in TASK_IDS)
    n_errors = sum(len(EXPECTED_GOLD_ERRORS.get(t, {})) for t in TASK_IDS)
    assert (n_actions, n_errors) == (16, 3)
    assert summary == {"domain": "retail", "tasks": 3, "actions": n_actions, "tool_errors": n_errors,
                       "seconds": summary["seconds"], "out": str(out)}


def test_final_db_hash_is_the_canonical_json_hash(mini_data, tmp_path):
    out = tmp_path / "gold.json"
    args = parser().parse_args(["tau2", "replay-gold", "--data", str(mini_data), "--out", str(out), "--no-progress"])
    args.func(args)
    domain = load_domain(mini_data)
    db = domain.validated_db()  # a fully independent DB, hashed the slow, obvious way
    replay_actions(db, domain.task_by_id("38").gold_actions)
    text = json.dumps(db.plain_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(text.encode()).hexdigest()
    assert json.loads(out.read_text())["38"]["final_db_sha256"] == expected
    assert replay_task(domain, "38").final_db_sha256() == expected


@pytest.mark.parametrize(("argv_tail", "message"), [
    (["--data", "/nonexistent/tau2"], "no tau2 tasks.json under /nonexistent/tau2"),
    (["--domain", "airline"], "no TRACE tool implementation"),
])
def test_replay_gold_reports_data_problems(argv_tail, message, tmp_path, capsys, data_root):
    argv = ["tau2", "replay-gold", "--out", str(tmp_path / "x.json"), "--no-progress"]
    if "--data" not in argv_tail:
        argv += ["--data", str(data_root)]
    args = parser().parse_args(argv + argv_tail)
    assert args.func(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_command_line_with_plain_progress_lines(mini_data, tmp_path):
    out = tmp_path / "gold.json"
    proc = subprocess.run([sys.executable, "-m", "tracectl", "tau2", "replay-gold", "--data", str(mini_data),
                           "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tasks"] == 3
    assert "replay-gold retail" in proc.stderr and "3/3" in proc.stderr
    assert set(json.loads(out.read_text())) == set(TASK_IDS)
