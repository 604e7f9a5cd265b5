"""A rollout job through gRPC with each built-in base agent (`micro`, `smollm2`) on the built-in
store domain, the artifact store on a real S3 server (`rclone serve s3`).

The trajectories are read back (sha256-verified by the store, and the object's digest checked
against the one the job reported) and then re-verified independently: every stored episode is
replayed -- its recorded assistant messages fed to a fresh environment with the same seed --
and must reach the same messages, reward and diagnostics. Token ids and logprobs of every
model turn must be stored.

Slow: `micro` is installed from the shipped artifact or built on first use (minutes; cached in
TRACE_AGENT_CACHE, shared with the pipeline test). `smollm2` gets a 4-step warm start here so CI can afford it: it is the same
build path as the default agent (`resolve_base_agent("smollm2")`), only shorter. The default
agents' pass rates are measured by `python -m trace_common.agents.evaluate_cli` (README).

A rollout job whose base agent another process is building waits for that build and says so in
its progress, which is what a second `tracectl run` shows while the first one builds `micro`."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from trace_common.agents import resolve_base_agent
from trace_common.agents.cache import default_cache_dir
from trace_common.agents.data import WarmStartData
from trace_common.agents.micro import MicroConfig
from trace_common.agents.sft import SFTConfig
from trace_common.agents.smollm2 import SmolLM2Config
from trace_common.artifacts import open_uri
from trace_common.domains.store import SPLITS, StoreEnv
from trace_common.env import loads_jsonl, run_episode
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.embedded import BackgroundStack
from tracectl.progress import follow

pytestmark = [pytest.mark.integration, pytest.mark.slow]
R = messages("rollout")

#: A short warm start of SmolLM2 (the default one takes tens of minutes on 2 cores).
SMOLLM2_SHORT = SmolLM2Config(data=WarmStartData(episodes=8),
                              sft=SFTConfig(steps=4, batch_size=1, learning_rate=1e-4, warmup_ratio=0.25))

AGENTS = {  # name -> (config for resolve_base_agent, tasks, samples, max_turns, max_tokens)
    "micro": (None, 8, 2, 0, 256),
    "smollm2": (SMOLLM2_SHORT, 2, 1, 3, 48),
}


@pytest.fixture(scope="module")
def s3_stack(tmp_path_factory, s3_server):
    bucket = s3_server.make_bucket()
    stack = BackgroundStack(tmp_path_factory.mktemp("s3-stack"), overrides={
        "artifact_root": f"s3://{bucket}", "s3_endpoint": s3_server.endpoint,
        "s3_access_key": s3_server.access_key, "s3_secret_key": s3_server.secret_key})
    yield stack, bucket
    stack.close()


def replay(traj, max_turns: int | None):
    """Feed the stored assistant messages to a fresh environment with the same seed."""
    recorded = iter([m for m in traj.messages if m.role == "assistant"])
    return run_episode(StoreEnv(), lambda _messages, _tools: next(recorded), traj.seed, max_turns or None,
                       sample_index=traj.sample_index)


@pytest.mark.timeout(3600)  # the first use builds the agent when it is not cached (micro: ~30 min here)
@pytest.mark.parametrize("agent", list(AGENTS))
def test_rollout_job_with_base_agent_on_s3(s3_stack, s3_server, agent):
    stack, bucket = s3_stack
    config, tasks, samples, max_turns, max_tokens = AGENTS[agent]
    model_dir = resolve_base_agent(agent, default_cache_dir(), config=config)
    spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=str(model_dir)),
                         tasks=R.TaskSelection(split="test", limit=tasks), samples_per_task=samples,
                         max_turns=max_turns, seed=7, concurrency=8,
                         sampling=t.SamplingParams(temperature=1.0, max_tokens=max_tokens))
    stub = stack.stub("rollout")
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id=f"agents-{agent}")).job
    final = [m.job for m in stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id), timeout=1800)][-1]
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error.message

    out = next(o for o in final.outputs if o.kind == "trajectories")
    assert out.uri.startswith(f"s3://{bucket}/runs/agents-{agent}/rollouts/")
    store, key = open_uri(out.uri, s3_server.settings)
    assert store.stat(key).sha256 == out.sha256
    trajs = loads_jsonl(store.get_bytes(key))  # the store verifies the body against its sha256
    assert sorted((int(tr.task_id), tr.sample_index) for tr in trajs) == [
        (s, k) for s in list(SPLITS["test"])[:tasks] for k in range(samples)]
    summary = stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=job.job_id)).summary
    assert summary.episodes == len(trajs) and summary.successes == sum(tr.success for tr in trajs)

    for tr in trajs:
        assert tr.policy.model == str(model_dir)
        assert tr.termination.value in ("done", "max_turns"), (tr.termination, tr.error)
        model_turns = [m for m in tr.messages if m.role == "assistant"]
        assert model_turns and len(tr.turns) == len(model_turns)
        assert all(r.completion_token_ids and len(r.logprobs) == len(r.completion_token_ids) for r in tr.turns)
        again = replay(tr, max_turns)
        assert [m.to_dict() for m in again.messages] == [m.to_dict() for m in tr.messages]
        assert (again.reward, again.success, again.termination) == (tr.reward, tr.success, tr.termination)
        assert [d.model_dump() for d in again.diagnostics] == [d.model_dump() for d in tr.diagnostics]


#: A one-layer micro model (seconds to build): the stand-in the other process puts in place.
STAND_IN = MicroConfig(hidden_size=64, num_layers=1, intermediate_size=64, num_kv_heads=1, vocab_size=512,
                       data=WarmStartData(episodes=8), sft=SFTConfig(steps=4, batch_size=2, copy_steps=4,
                                                                     copy_batch_size=4, max_seq_len=4096))

#: Another process "building" the default micro agent: it takes the cache lock for the default
#: key (provenance included) and, when told, puts a small real model there as that entry.
BUILDER = """
import shutil, sys, time
from pathlib import Path
from trace_common.agents.cache import cached_build
from trace_common.agents.micro import MicroConfig
from trace_common.agents.progress import BuildEvent
from trace_common.agents.resolve import provenance_of
cache, toy, flag = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
prov, _ = provenance_of("micro", MicroConfig(), cache)
def build(out, progress):
    progress(BuildEvent("micro", "imitation", step=1700, total=2200, loss=0.4, elapsed_s=600.0, eta_s=200.0))
    flag.with_name("holding").write_text("1")
    while not flag.exists():
        time.sleep(0.05)
    for f in toy.iterdir():
        if f.is_file() and f.name != "trace_agent.json":
            shutil.copyfile(f, out / f.name)
    return {"stand_in": True}
cached_build(cache, "micro", MicroConfig(), build, provenance=prov)
"""


@pytest.mark.timeout(600)
def test_rollout_job_waits_visibly_for_another_process_building_micro(tmp_path, monkeypatch, embedded_stack):
    """A second run's rollout job (model `micro`) while another process holds the build lock: the
    job's progress, as `tracectl`'s watch prints it, names that build's process and its progress;
    once the other build lands, the job plays with that model."""
    cache = tmp_path / "agents"
    monkeypatch.setenv("TRACE_AGENT_CACHE", str(cache))
    toy = resolve_base_agent("micro", tmp_path / "toy", config=STAND_IN)
    flag = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", BUILDER, str(cache), str(toy), str(flag)],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "holding").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the builder process did not take the lock"
            time.sleep(0.1)
        spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"),
                             policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model="micro"),
                             tasks=R.TaskSelection(split="test", limit=2), samples_per_task=1, max_turns=2,
                             seed=1, sampling=t.SamplingParams(temperature=1.0, max_tokens=16))
        stub = embedded_stack.stub("rollout")
        job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id="agents-wait")).job
        seen = []
        for msg in stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id), timeout=300):
            seen.append(msg)
            if sum("waiting for the build" in m.job.progress.message for m in seen) == 2:
                flag.write_text("1")
        proc.wait(60)
    finally:
        flag.write_text("1")
        proc.wait(60)
    buf = io.StringIO()
    final = follow(lambda: iter(seen), "base rollouts", out=Console(file=buf, force_terminal=False, width=100))
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error.message
    waiting = [ln for ln in buf.getvalue().splitlines() if "waiting for base agent micro" in ln]
    assert waiting, buf.getvalue()
    assert f"by pid {proc.pid} on " in waiting[0] and "imitation step 1700/2200 loss 0.4000" in waiting[0]
    assert "1700/2200 waiting for base agent micro" in waiting[0]  # the other build's steps as the count
