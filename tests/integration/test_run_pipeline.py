"""`tracectl run --config examples/quick.yaml`: the whole TRACE loop on the embedded default,
as a user runs it (a `tracectl` process), with the artifact store on a real S3 server
(`rclone serve s3`), killed with SIGKILL (the whole process group: the CLI and the in-process
services) inside every stage in turn -- at a random moment after the stage starts (seeded;
the seed is in every failure message), inside a training job once its first checkpoint is
stored -- and re-run after each kill. At the end: the manifest is complete, no stage that had
committed its output before a kill was redone (same jobs, same artifacts), the killed training
job continued from its checkpoint, the finished evaluation arm was kept, every artifact the manifest names reads back with its
sha256 intact, the report is written, and `tracectl report` re-renders it. Then the evaluation is
run again uninterrupted (`--from evaluation`): the resumed evaluation's tables -- every arm's
per-task outcomes, the paired statistics, the budget and the GRPO curve -- are the same as the
uninterrupted one's (greedy decoding), and so are the report's tables.

Slow: minutes (the `micro` base agent is built on first use and cached in TRACE_AGENT_CACHE)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tracectl.run.manifest import STAGES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quick.yaml"


def tracectl(*args: str, cwd: Path, s3=None, **kw) -> subprocess.Popen:
    # One intra-op thread per process (two jobs share CI's 2 cores, as in `make demo`), and a smaller
    # calibration in the embedded environment service (4 seeds x 4 samples instead of 16 x 8): TRACE's
    # budget, and with it the GRPO curve the evaluation trains, stays a smoke-test size.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120", "OMP_NUM_THREADS": "1",
           "TRACE_ENVIRONMENT_VALIDATION_GROUPS": "4", "TRACE_ENVIRONMENT_VALIDATION_GROUP_SIZE": "4"}
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


def artifact_uris(value) -> list[str]:
    """Every artifact URI (s3://...) named anywhere in a manifest value."""
    if isinstance(value, str):
        return [value] if value.startswith("s3://") else []
    if isinstance(value, dict):
        return [u for v in value.values() for u in artifact_uris(v)]
    if isinstance(value, list):
        return [u for v in value for u in artifact_uris(v)]
    return []


@pytest.mark.timeout(3600)  # the first run builds the `micro` agent when it is not cached (~30 min here)
def test_quick_run_survives_kills_in_every_stage(tmp_path, s3_server, s3_bucket):
    from trace_common.artifacts import open_store

    cfg = yaml.safe_load(QUICK.read_text())
    cfg["store"] = {"root": f"s3://{s3_bucket}", "s3_endpoint": s3_server.endpoint}
    config = tmp_path / "quick-s3.yaml"
    config.write_text(yaml.safe_dump(cfg))
    store = open_store(f"s3://{s3_bucket}", s3_server.settings)
    seed = int(os.environ.get("TRACE_KILL_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    where = f"(kill seed {seed}; rerun with TRACE_KILL_SEED={seed})"

    def status(stage: str) -> str:
        return manifest(store).get("stages", {}).get(stage, {}).get("status", "")

    def partial(stage: str) -> dict:
        return manifest(store).get("stages", {}).get(stage, {}).get("partial", {})

    def run_until(condition, delay: float = 0.0) -> bool:
        """Start `tracectl run`; once `condition()` holds, wait `delay` s and SIGKILL the whole
        process group. False if the run finished first (only allowed for the report stage)."""
        proc = tracectl("run", "--config", str(config), cwd=tmp_path, s3=s3_server)
        deadline = time.time() + 1800
        while time.time() < deadline and proc.poll() is None and not condition():
            time.sleep(0.1)
        time.sleep(delay)
        if proc.poll() is not None:
            out = proc.stdout.read()
            assert proc.returncode == 0, f"tracectl failed {where}:\n{out[-4000:]}"
            return False
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        return True

    committed: dict[str, tuple] = {}  # stage -> (jobs, outputs) when first seen completed

    def note_committed() -> None:
        for stage, rec in manifest(store)["stages"].items():
            if rec["status"] == "completed":
                committed.setdefault(stage, (rec["jobs"], rec["outputs"]))

    killed: list[str] = []
    cap = ""
    for stage in STAGES:
        if stage == "adapters":
            # inside a training job, once its first checkpoint is in the store
            cap = manifest(store)["stages"]["analysis"]["result"]["capabilities"][0]["name"]
            ckpt1 = f"runs/quick/adapters/{cap}/ckpt-1/checkpoint.json"
            done = run_until(lambda ckpt1=ckpt1: read(store, ckpt1) is not None)
        elif stage == "evaluation":
            # once its first arm is recorded: the re-run must keep that arm, not play it again
            done = run_until(lambda: "arm base" in partial("evaluation"), rng.uniform(0.0, 1.5))
            base_arm = partial("evaluation").get("arm base") or {}
        else:
            done = run_until(lambda stage=stage: status(stage) in ("running", "completed"), rng.uniform(0.0, 1.5))
        if not done:
            assert stage == "report", f"the run finished before the kill in stage {stage} {where}"
            break
        killed.append(stage)
        note_committed()
        running = [k for k, rec in manifest(store)["stages"].items() if rec["status"] == "running"]
        print(f"kill aimed at {stage}: landed in {running or 'between stages'} {where}")
        assert manifest(store)["stages"]["report"]["status"] != "completed" or stage == "report", where
    assert killed[:6] == list(STAGES[:6]), (killed, where)

    # -- last attempt: resumes after the last completed stage and finishes ------------------------
    proc = tracectl("run", "--config", str(config), cwd=tmp_path, s3=s3_server)
    out, _ = proc.communicate(timeout=3600)
    assert proc.returncode == 0, f"{where}\n{out[-6000:]}"
    after = manifest(store)["stages"]
    assert all(rec["status"] == "completed" for rec in after.values()), ({k: v["status"] for k, v in after.items()},
                                                                        where)
    for stage, (jobs, outputs) in committed.items():  # committed work was reused, never redone
        assert (after[stage]["jobs"], after[stage]["outputs"]) == (jobs, outputs), (stage, where)
    assert {"rollout", "analysis", "environments"} <= committed.keys(), where
    # the killed training job's checkpoint was continued, not redone: every iteration once, in order
    curve = read(store, store.key_of(after["adapters"]["result"]["curves"][cap])).decode().splitlines()
    assert [json.loads(line)["iteration"] for line in curve] == [1, 2, 3], where
    # every artifact the manifest names is intact (reads verify the stored sha256)
    uris = sorted(set(artifact_uris(after)))
    assert len(uris) >= 10, uris
    for uri in uris:
        assert store.get_bytes(store.key_of(uri)), uri

    # -- what the run produced ------------------------------------------------------------------
    caps = {c["name"] for c in after["analysis"]["result"]["capabilities"]}
    assert caps and set(after["adapters"]["outputs"]) == set(after["environments"]["outputs"]) <= caps
    assert "composition" in after["gates"]["outputs"]
    arms = after["evaluation"]["result"]["arms"]
    assert base_arm and arms["base"]["job"] == base_arm["job"], where   # the arm finished before the kill was kept
    assert list(arms) == cfg["evaluation"]["arms"]
    for name, arm in arms.items():
        assert arm["episodes"] == 24 == len(arm["outcomes"]), name  # evaluation.limit of quick.yaml
        assert 0.0 <= arm["ci"][0] <= arm["pass_rate"] <= arm["ci"][1] <= 1.0, name
        assert arm["breakdown"], name
        assert arm["probes"]["episodes"] == 8 and arm["probes"]["by_probe"], name   # evaluation.probe_limit
    # TRACE's budget counts every episode: base rollouts (limit x samples), calibration, adapters, gates
    ev = after["evaluation"]["result"]
    budget = ev["budget"]
    comps = budget["components"]
    assert comps["rollout"]["episodes"] == 32 * 2 and comps["calibration"]["episodes"] > 0
    assert comps["adapters"]["episodes"] == sum(m["rollouts_total"] for m in after["adapters"]["result"]["metrics"]
                                                .values())
    assert comps["gates"]["episodes"] == after["gates"]["result"]["metrics"]["rollouts_total"] > 0
    assert budget["total_episodes"] == sum(c["episodes"] for c in comps.values()) == ev["trace_budget_episodes"]
    assert arms["base"]["training_episodes"] == 0 < arms["trace_routing"]["training_episodes"] == budget["total_episodes"]
    # the curve: one GRPO run, checkpointed at 0.5x and 1x; the 1x point is the grpo_target arm
    assert [p["multiple"] for p in ev["grpo_curve"]] == [0.5, 1.0] and all("pass_rate" in p for p in ev["grpo_curve"])
    assert arms["grpo_target"]["training_episodes"] >= budget["total_episodes"]
    assert set(ev["paired"]["vs"]) == (set(arms) - {"trace_routing"}) | {"grpo_target@0.5x"}
    usage = after["evaluation"]["result"]["expert_usage"]
    assert usage["experts"][0] == "base" and sum(map(sum, next(iter(usage["rows"].values())))) > 0
    md = read(store, "runs/quick/report/report.md").decode()
    assert "| trace_routing |" in md and "not available" not in md, md
    assert "| report | this report |" in md and "| report | running |" not in md
    html_before = read(store, "runs/quick/report/report.html")
    assert html_before and after["report"]["outputs"]["html"].startswith(f"s3://{s3_bucket}/")
    assert not (tmp_path / ".trace" / "runs").exists()   # every artifact went to S3

    # -- `tracectl report` re-renders from the manifest in S3 ----------------------------------
    store.delete("runs/quick/report/report.html")
    proc = tracectl("report", "quick", "--config", str(config), cwd=tmp_path, s3=s3_server)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert read(store, "runs/quick/report/report.html")

    # -- the same evaluation uninterrupted gives the same tables ---------------------------------
    proc = tracectl("run", "--config", str(config), "--from", "evaluation", cwd=tmp_path, s3=s3_server)
    out, _ = proc.communicate(timeout=3600)
    assert proc.returncode == 0, out[-6000:]
    again = manifest(store)["stages"]
    assert {s: again[s]["jobs"] for s in STAGES[:5]} == {s: after[s]["jobs"] for s in STAGES[:5]}   # only evaluation
    assert tables(again["evaluation"]["result"]) == tables(ev), where
    assert report_tables(read(store, "runs/quick/report/report.md").decode()) == report_tables(md)


#: What an evaluation's tables consist of, per arm (job ids, artifact URIs and wall-clock times differ
#: between two evaluations of the same checkpoints; these must not).
ARM_TABLE = ("episodes", "successes", "pass_rate", "ci", "outcomes", "task_ids_sha256", "breakdown",
             "training_episodes", "training_tokens", "adapter", "iteration")


def tables(ev: dict) -> dict:
    arms = {**ev["arms"], **ev.get("grpo_curve_points", {})}
    return {"arms": {name: {**{k: a.get(k) for k in ARM_TABLE},
                            "probes": {k: a.get("probes", {}).get(k) for k in ("outcomes", "by_probe")}}
                     for name, a in arms.items()},
            "paired": ev["paired"], "power": ev["power"], "budget": ev["budget"],
            "curve": [{k: p.get(k) for k in ("multiple", "iteration", "training_episodes", "pass_rate", "ci")}
                      for p in ev["grpo_curve"]]}


def report_tables(md: str) -> str:
    """The report's evaluation tables: from the per-arm table to the capability analysis, the per-arm
    table's wall-clock column dropped."""
    body = md[md.index("## Held-out pass rate per arm"):md.index("## Capability analysis")]
    return "\n".join(re.sub(r" \d+ \|$", " |", line) for line in body.splitlines())
