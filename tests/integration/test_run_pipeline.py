"""`tracectl run --config examples/quick.yaml`: the whole TRACE loop on the embedded default,
as a user runs it (a `tracectl` process), with the artifact store on a real S3 server
(`rclone serve s3`), killed with SIGKILL once its first stages are done, then re-run:
completed stages are reused (same jobs, same artifacts), the rest runs, the report is
written, and `tracectl report` re-renders it.

Slow: minutes (the `micro` base agent is built on first use and cached in TRACE_AGENT_CACHE)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quick.yaml"


def tracectl(*args: str, cwd: Path, s3=None, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    if s3 is not None:
        env.update(TRACE_S3_ACCESS_KEY=s3.access_key, TRACE_S3_SECRET_KEY=s3.secret_key)
    return subprocess.Popen([sys.executable, "-m", "tracectl", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


def read(store, key: str) -> bytes | None:
    from trace_common.errors import NotFound

    try:
        return store.get_bytes(key)
    except NotFound:
        return None


def manifest(store, run_id: str = "quick") -> dict:
    data = read(store, f"runs/{run_id}/manifest.json")
    return json.loads(data) if data else {}


@pytest.mark.timeout(3600)  # the first run builds the `micro` agent when it is not cached (~30 min here)
def test_quick_run_survives_kills_and_completes(tmp_path, s3_server, s3_bucket):
    from trace_common.artifacts import open_store

    cfg = yaml.safe_load(QUICK.read_text())
    cfg["store"] = {"root": f"s3://{s3_bucket}", "s3_endpoint": s3_server.endpoint}
    config = tmp_path / "quick-s3.yaml"
    config.write_text(yaml.safe_dump(cfg))
    store = open_store(f"s3://{s3_bucket}", s3_server.settings)

    def run_until(condition) -> None:
        """Start `tracectl run`, SIGKILL it (the whole process group) once `condition()` holds."""
        proc = tracectl("run", "--config", str(config), cwd=tmp_path, s3=s3_server)
        deadline = time.time() + 1800
        while time.time() < deadline and proc.poll() is None and not condition():
            time.sleep(0.5)
        assert proc.poll() is None, f"tracectl exited early:\n{proc.stdout.read()[-4000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def status(stage: str) -> str:
        return manifest(store).get("stages", {}).get(stage, {}).get("status", "")

    # -- kill 1: between stages, as soon as the analysis stage is recorded complete ---------------
    run_until(lambda: status("analysis") == "completed")
    before = manifest(store)["stages"]
    assert before["rollout"]["status"] == before["analysis"]["status"] == "completed"
    assert before["report"]["status"] == "pending"
    cap = before["analysis"]["result"]["capabilities"][0]["name"]

    # -- kill 2: inside a training job, once its first checkpoint is in the store ----------------
    ckpt1 = f"runs/quick/adapters/{cap}/ckpt-1/checkpoint.json"
    run_until(lambda: read(store, ckpt1) is not None)
    assert status("adapters") == "running" and status("environments") == "completed"
    mid = manifest(store)["stages"]

    # -- third attempt: resumes after the last completed stage and finishes --------------------
    proc = tracectl("run", "--config", str(config), cwd=tmp_path, s3=s3_server)
    out, _ = proc.communicate(timeout=3600)
    assert proc.returncode == 0, out[-6000:]
    for stage in ("rollout", "analysis", "environments"):
        assert f"stage {stage}: done earlier, reused" in out
    after = manifest(store)["stages"]
    for stage in ("rollout", "analysis"):
        assert after[stage]["jobs"] == before[stage]["jobs"] and after[stage]["outputs"] == before[stage]["outputs"]
    assert after["environments"]["jobs"] == mid["environments"]["jobs"]
    assert all(rec["status"] == "completed" for rec in after.values()), {k: v["status"] for k, v in after.items()}
    # the killed training job's checkpoint was continued, not redone: every iteration once, in order
    curve = read(store, store.key_of(after["adapters"]["result"]["curves"][cap])).decode().splitlines()
    assert [json.loads(line)["iteration"] for line in curve] == [1, 2, 3]

    # -- what the run produced ------------------------------------------------------------------
    caps = {c["name"] for c in after["analysis"]["result"]["capabilities"]}
    assert caps and set(after["adapters"]["outputs"]) == set(after["environments"]["outputs"]) <= caps
    assert "composition" in after["gates"]["outputs"]
    arms = after["evaluation"]["result"]["arms"]
    assert set(arms) == {"base", "best_single", "grpo_target", "trace_routing", "trace_per_request"}
    for name, arm in arms.items():
        assert arm["episodes"] == 24, name  # evaluation.limit of quick.yaml
        assert 0.0 <= arm["ci"][0] <= arm["pass_rate"] <= arm["ci"][1] <= 1.0, name
        assert arm["breakdown"], name
    assert arms["base"]["training_rollouts"] == 0 < arms["trace_routing"]["training_rollouts"]
    assert arms["grpo_target"]["training_rollouts"] >= 0.9 * arms["trace_routing"]["training_rollouts"]
    usage = after["evaluation"]["result"]["expert_usage"]
    assert usage["experts"][0] == "base" and sum(map(sum, next(iter(usage["rows"].values())))) > 0
    md = read(store, "runs/quick/report/report.md").decode()
    assert "| trace_routing |" in md and "not available" not in md, md
    html_before = read(store, "runs/quick/report/report.html")
    assert html_before and after["report"]["outputs"]["html"].startswith(f"s3://{s3_bucket}/")
    assert not (tmp_path / ".trace" / "runs").exists()   # every artifact went to S3

    # -- `tracectl report` re-renders from the manifest in S3 ----------------------------------
    store.delete("runs/quick/report/report.html")
    proc = tracectl("report", "quick", "--config", str(config), cwd=tmp_path, s3=s3_server)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert read(store, "runs/quick/report/report.html")
