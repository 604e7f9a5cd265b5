"""The GEPA arm end to end: a real Pipeline over the embedded stack's rollout service (gRPC),
real `gepa.optimize`, a real OpenAI-compatible HTTP client for the reflection model.

The agent is the store domain's scripted `expert` (planted capability gaps, so some episodes
fail and GEPA has feedback to reflect on). It ignores its system prompt, so these tests check
plumbing, budget and records -- not that GEPA improves the agent (the unit tests do that with a
prompt-sensitive stand-in). `FakeOpenAI` stands in for the reflection model's *transport only*:
it answers every chat completion with a fixed proposal in gepa's ``` format.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from tests.support.fake_openai import FakeOpenAI, completion
from tests.support.ports import closed_port
from trace_common.artifacts import open_store, open_uri
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.evaluation.gepa import GepaSettings, run_gepa
from tracectl.evaluation.scoring import read_trajectories
from tracectl.run.config import RunConfig
from tracectl.run.jobs import JobRunner, StageFailed
from tracectl.run.manifest import Manifest
from tracectl.run.pipeline import Pipeline

pytestmark = pytest.mark.integration
R = messages("rollout")
PROPOSAL = "You are a careful store agent. Check an order's status before changing it."


class ScriptedPipeline(Pipeline):
    """The real pipeline with the scripted store expert as its base agent."""

    def base_policy(self, **kw: str) -> t.PolicyRef:
        return t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model="expert", **kw)


def _pipeline(stack, run_id: str, llm: dict, eval_limit: int = 10) -> Pipeline:
    cfg = RunConfig(run_id=run_id, seed=1, rollout={"limit": 12, "samples": 2, "concurrency": 8},
                    evaluation={"split": "test", "limit": eval_limit, "arms": ["gepa"], "gepa": llm})
    p = ScriptedPipeline(cfg, JobRunner(stack), open_store(stack.root.resolve().as_uri()), Manifest(run_id=run_id))
    out = p.stage_rollout()  # the base rollouts GEPA takes its training tasks and seed prompt from
    rec = p.manifest.stages["rollout"]
    rec.outputs, rec.jobs, rec.status = out["outputs"], out["jobs"], "completed"
    return p


def _run_jobs(stack, run_id: str) -> list:
    return list(stack.stub("rollout").ListRolloutJobs(
        R.ListRolloutJobsRequest(filter=t.JobFilter(run_id=run_id), page_size=1000)).jobs)


@pytest.mark.parametrize("budget", [30, 45])
def test_run_gepa_end_to_end(embedded_stack, budget):
    fake = FakeOpenAI(default={"status": 200, "json": completion(f"New prompt:\n```\n{PROPOSAL}\n```")})
    try:
        run_id = f"gepa-e2e-{budget}"
        p = _pipeline(embedded_stack, run_id, {"base_url": fake.base_url, "model": "reflector"})
        base = read_trajectories(p.store, p.manifest.stages["rollout"].outputs["trajectories"])
        seed_prompt = base[0].messages[0].content
        res = run_gepa(p, budget=budget, settings=GepaSettings(val_size=4, acceptance="improvement_or_equal"))
    finally:
        fake.close()

    # the arm record has the shape of the other arms
    for key in ("job", "uri", "episodes", "successes", "pass_rate", "ci", "reward_mean", "wall_seconds",
                "training_episodes", "breakdown", "wall_seconds_total", "jobs", "prompt", "prompt_sha256"):
        assert key in res, key
    assert res["episodes"] == 10 and res["ci"][0] <= res["pass_rate"] <= res["ci"][1]
    # compound tasks: one row per capability a task needs, counted over the arm's own trajectories
    needed = Counter(str(c) for tr in read_trajectories(p.store, res["uri"]) for c in tr.info["capabilities"])
    assert {k: b["n"] for k, b in res["breakdown"].items()} == needed and "all" not in res["breakdown"]
    assert 2 * 10 <= sum(needed.values()) <= 4 * 10
    assert res["prompt_sha256"] == hashlib.sha256(res["prompt"].encode()).hexdigest()
    assert res["seed_prompt_sha256"] == hashlib.sha256(seed_prompt.encode()).hexdigest()
    store, key = open_uri(res["prompt_uri"])
    assert store.get_bytes(key).decode() == res["prompt"]

    # budget: every GEPA job is a real, succeeded rollout job; their episodes are the rollouts spent
    stub = embedded_stack.stub("rollout")
    got = {j: stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=j)) for j in res["jobs"]}
    assert all(g.job.state == t.JOB_STATE_SUCCEEDED for g in got.values())
    assert res["jobs"][-1] == res["job"]
    gepa_jobs = res["jobs"][:-1]
    assert sum(got[j].summary.episodes for j in gepa_jobs) == res["training_episodes"] <= budget
    g = res["gepa"]
    assert budget - res["training_episodes"] < 2 * g["minibatch_size"] + g["val_tasks"]
    assert g["val_tasks"] == 4 and g["train_tasks"] == 8 and g["iterations"] >= 1
    assert {j.job_id for j in _run_jobs(embedded_stack, run_id)} >= set(res["jobs"])

    # the reflection model: probed first, then shown the seed prompt and the failures' feedback
    assert g["reflection_calls"] == len(fake.requests) - 1 >= 1 and g["reflection_errors"] == 0
    reflection = fake.requests[1]["messages"][0]["content"]
    assert seed_prompt in reflection and "Feedback" in reflection and "Reward " in reflection
    assert g["candidates"] >= 2  # the (equal-scoring) proposal was accepted and validated
    assert res["prompt"] in (seed_prompt, PROPOSAL)


@pytest.mark.parametrize("endpoint", ["closed-port", "http-500", "unset-key"])
def test_unusable_reflection_model_fails_before_any_gepa_rollout(embedded_stack, endpoint):
    fake = FakeOpenAI(default={"status": 500, "json": {"error": "boom"}})
    try:
        url = f"http://127.0.0.1:{closed_port()}/v1" if endpoint == "closed-port" else fake.base_url
        llm = {"base_url": url, "model": "reflector"}
        if endpoint == "unset-key":
            llm["api_key_env"] = "TRACE_TEST_GEPA_KEY_THAT_IS_NOT_SET"
        run_id = f"gepa-bad-{endpoint}"
        p = _pipeline(embedded_stack, run_id, llm)
        before = len(_run_jobs(embedded_stack, run_id))
        with pytest.raises(StageFailed, match="GEPA reflection model at ") as err:
            run_gepa(p, budget=30)
    finally:
        fake.close()
    assert url in str(err.value) and "evaluation.gepa" in str(err.value)
    assert len(_run_jobs(embedded_stack, run_id)) == before  # no rollout was spent


def test_reflection_failing_after_the_probe_fails_the_arm(embedded_stack):
    fake = FakeOpenAI(script=[{"status": 200, "json": completion("ready")}],
                      default={"status": 503, "json": {"error": "overloaded"}})
    try:
        p = _pipeline(embedded_stack, "gepa-flaky", {"base_url": fake.base_url, "model": "reflector"})
        with pytest.raises(StageFailed, match=r"failed on all \d+ calls; first error: .*HTTP 503") as err:
            run_gepa(p, budget=40, settings=GepaSettings(val_size=4, reflection_max_retries=0))
    finally:
        fake.close()
    assert fake.base_url in str(err.value)
    assert len(fake.requests) >= 2  # the probe, then at least one reflection
