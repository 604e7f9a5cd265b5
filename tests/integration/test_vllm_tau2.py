"""tau2 retail through the rollout service, SmolLM2-135M (real vLLM server) as agent and as user.

Two tau2 retail tasks (data read in place from the directory $TRACE_TAU2_DATA names) are played by a
rollout job whose policy is the vLLM server over the OpenAI protocol (POLICY_BACKEND_OPENAI_HTTP)
and whose simulated user (`RolloutSpec.user_simulator`) is the same server. tau2's agent
prompt is ~6k tokens (instructions, policy, 16 tool schemas), so budgets are small: 3 agent
turns (`RolloutSpec.max_turns`), 48 tokens per agent turn, 48 per user reply
(`user_max_tokens`: without a cap vLLM lets a reply run to the end of the context window, and
a weak model rarely stops -- the cause of the >15 min per task seen before), and vLLM's
prefix caching (tests/support/vllm.py) so each turn only prefills what is new.

Checked: the job succeeds; every trajectory ended by a documented rule (user ###STOP### ->
done, ###TRANSFER###/###OUT-OF-SCOPE### -> user_stop, agent turn budget -> max_turns, tool
errors -> agent_error); it was scored by tau2's evaluator (reward in [0, 1], the evaluator's
failure reason whenever reward < 1, 0 for an unfinished episode); user replies respect the
cap; trajectories and summary are read back from the artifact store. The model is too weak
for any task to pass; what is tested is everything around it.

Wall time measured here (2 shared cores, load ~5, server already up): 27-49 s for the job
(both episodes ended at the 3-turn budget: max_turns, reward 0, "terminated early (not_finished)").
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.endpoints import allowed
from trace_common.artifacts import open_uri
from trace_common.env import Termination, loads_jsonl
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]
R = messages("rollout")
MAX_TURNS, AGENT_TOKENS, USER_TOKENS = 3, 48, 48
ENDINGS = {Termination.DONE, Termination.USER_STOP, Termination.MAX_TURNS, Termination.AGENT_ERROR}


@pytest.fixture
def vllm_allowed(embedded_stack, vllm_server):
    """The vLLM server as endpoint profile "vllm" of the embedded services (what an operator's
    TRACE_<SERVICE>_ENDPOINTS does for deployed ones); requests send its URL."""
    with allowed(embedded_stack, vllm_server.base_url, name="vllm"):
        yield


def tau2_retail_dir() -> str:
    from tests.unit.environment.helpers import tau2_retail_dir as find

    return find()


@pytest.mark.timeout(900)
def test_tau2_retail_rollout_with_llm_agent_and_llm_user(embedded_stack, vllm_server, vllm_allowed, smollm2_dir):
    from transformers import AutoTokenizer

    spec = R.RolloutSpec(
        environment=t.EnvironmentRef(name="tau2-retail", uri="file://" + tau2_retail_dir(),
                                     params={"user_max_tokens": str(USER_TOKENS), "user_seed": "7"}),
        policy=t.PolicyRef(backend=t.POLICY_BACKEND_OPENAI_HTTP, model="smollm2", endpoint=vllm_server.base_url),
        user_simulator=t.LlmEndpoint(base_url=vllm_server.base_url, model="smollm2", timeout_seconds=300),
        tasks=R.TaskSelection(split="test", limit=2), max_turns=MAX_TURNS, concurrency=2,
        sampling=t.SamplingParams(temperature=0.0, max_tokens=AGENT_TOKENS))
    stub = embedded_stack.stub("rollout")
    t0 = time.monotonic()
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id="tau2-vllm")).job
    final = [m.job for m in stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id), timeout=900)][-1]
    wall = time.monotonic() - t0
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error

    outputs = {o.kind: o for o in final.outputs}
    store, key = open_uri(outputs["trajectories"].uri)
    trajs = loads_jsonl(store.get_bytes(key))
    assert len(trajs) == 2 and len({tr.task_id for tr in trajs}) == 2
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    for tr in trajs:
        assert tr.env.name == "tau2-retail"
        assert tr.termination in ENDINGS, (tr.termination, tr.error)
        assert tr.error is None or tr.termination == Termination.AGENT_ERROR, tr.error
        roles = [m.role for m in tr.messages]
        assert roles[:3] == ["system", "assistant", "user"]       # tau2 greeting, then the LLM user speaks
        assert 1 <= roles[3:].count("assistant") <= MAX_TURNS
        if tr.termination == Termination.MAX_TURNS:
            assert roles[3:].count("assistant") == MAX_TURNS
        user_texts = [m.content or "" for m in tr.messages if m.role == "user"]
        assert all(text.strip() for text in user_texts)
        assert all(len(tok(text, add_special_tokens=False)["input_ids"]) <= USER_TOKENS + 2 for text in user_texts)
        # scored by tau2's evaluator: reward in [0, 1], its failure reason whenever the task is not passed
        assert 0.0 <= tr.reward <= 1.0 and tr.success == (tr.reward == 1.0)
        if tr.reward < 1.0:
            assert tr.failure_reason, tr
        if tr.termination in (Termination.MAX_TURNS, Termination.AGENT_ERROR):
            assert tr.reward == 0.0 and "terminated early" in tr.failure_reason, tr.failure_reason
    store, key = open_uri(outputs["rollout-summary"].uri)
    summary = json.loads(store.get_bytes(key))
    assert summary["episodes"] == 2
    assert sum(summary["terminations"].values()) == 2
    print(f"tau2 rollout job, 2 tasks: {wall:.1f} s; terminations {summary['terminations']}; "
          f"rewards {[tr.reward for tr in trajs]}; reasons {[tr.failure_reason for tr in trajs]}")
