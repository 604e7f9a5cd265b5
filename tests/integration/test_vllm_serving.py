"""The services against a real model server: vLLM (CPU build) serving SmolLM2-135M-Instruct.

One server for the whole module (see tests/support/vllm.py). SmolLM2 is a weak model that
knows no tool-call format: these tests check that everything around a real model behaves
(jobs complete or fail with a documented reason, adapters are selected by name, outputs
are parsed and stored), not that the model is good.
"""

import httpx
import pytest
import torch

from tests.support.endpoints import allowed
from trace_common.artifacts import open_uri
from trace_common.env import loads_jsonl
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]
R, A, E = messages("rollout"), messages("analysis"), messages("environment")


@pytest.fixture
def vllm_allowed(embedded_stack, vllm_server):
    """The vLLM server as endpoint profile "vllm" of the embedded services (what an operator's
    TRACE_<SERVICE>_ENDPOINTS does for deployed ones); requests send its URL."""
    with allowed(embedded_stack, vllm_server.base_url, name="vllm"):
        yield


def _wait(stub, service_stem, job_id, pb):
    watch = getattr(stub, f"Watch{service_stem}")(getattr(pb, f"Watch{service_stem}Request")(job_id=job_id), timeout=900)
    return [m.job for m in watch][-1]


@pytest.fixture(scope="module")
def lora_adapter(smollm2_dir, tmp_path_factory, vllm_server):
    """A random (non-zero) LoRA adapter on SmolLM2, saved in PEFT format and hot-loaded into vLLM."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))
    out = tmp_path_factory.mktemp("adapter") / "cap-v1"
    peft.save_pretrained(out)
    r = httpx.post(vllm_server.base_url.removesuffix("/v1") + "/v1/load_lora_adapter",
                   json={"lora_name": "cap-v1", "lora_path": str(out)}, timeout=300)
    assert r.status_code == 200, r.text
    models = httpx.get(vllm_server.base_url + "/models", timeout=30).json()["data"]
    assert "cap-v1" in {m["id"] for m in models}
    return out


def test_vllm_greedy_under_adapter_equals_peft(vllm_server, lora_adapter, smollm2_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Cancel order #W1234567 please."}],
                                     tokenize=False, add_generation_prompt=True)
    r = httpx.post(vllm_server.base_url + "/completions", json={"model": "cap-v1", "prompt": prompt, "max_tokens": 12,
                                                                 "temperature": 0}, timeout=300).json()
    served = r["choices"][0]["text"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32),
                                      lora_adapter).eval()
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    local = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert served.strip() == local.strip()


def test_rollout_job_through_vllm_with_adapter_selected_by_name(embedded_stack, vllm_server, vllm_allowed, lora_adapter):
    spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_OPENAI_HTTP, model="smollm2",
                                            adapter_name="cap-v1", endpoint=vllm_server.base_url),
                         tasks=R.TaskSelection(split="test", limit=2), max_turns=2,
                         sampling=t.SamplingParams(temperature=0.0, max_tokens=48))
    stub = embedded_stack.stub("rollout")
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id="vllm")).job
    final = _wait(stub, "RolloutJob", job.job_id, R)
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error
    store, key = open_uri(next(o.uri for o in final.outputs if o.kind == "trajectories"))
    trajs = loads_jsonl(store.get_bytes(key))
    assert len(trajs) == 2
    assert all(tr.policy.adapter == "cap-v1" for tr in trajs)
    assert all(any(m.role == "assistant" and (m.content or m.tool_calls) for m in tr.messages) for tr in trajs)


def test_analysis_llm_mode_with_real_model(embedded_stack, vllm_server, vllm_allowed):
    from trace_common.domains.store.expert import ExpertConfig, StoreExpert
    from trace_common.env import dumps_jsonl, make

    # the analyst needs both outcomes: the default expert fails nearly every compound task (its
    # skills multiply per task), the perfect one passes every one
    seeds = range(1_000_000, 1_000_008)
    trajs = [StoreExpert(ExpertConfig.perfect() if i % 2 else ExpertConfig()).play(make("store"), seed)
             for i, seed in enumerate(seeds)]
    assert {tr.success for tr in trajs} == {True, False}
    store, _ = open_uri(embedded_stack.root.resolve().as_uri() + "/x")
    uri = store.put_bytes("runs/llm-analysis/rollouts/part-000.jsonl", dumps_jsonl(trajs)).uri
    spec = A.AnalysisSpec(rollout_uris=[uri], mode=A.ANALYST_MODE_LLM, num_runs=2, min_passing_runs=1,
                          max_candidates=3, llm=t.LlmEndpoint(base_url=vllm_server.base_url, model="smollm2",
                                                              timeout_seconds=300))
    stub = embedded_stack.stub("analysis")
    job = stub.CreateAnalysisJob(A.CreateAnalysisJobRequest(spec=spec, run_id="llm-analysis")).job
    final = _wait(stub, "AnalysisJob", job.job_id, A)
    # a weak real model either yields schema-valid labels or a documented failure -- never a crash
    if final.state == t.JOB_STATE_SUCCEEDED:
        resp = stub.GetAnalysisJob(A.GetAnalysisJobRequest(job_id=job.job_id))
        assert resp.mode == A.ANALYST_MODE_LLM and resp.results
    else:
        assert final.state == t.JOB_STATE_FAILED
        # RESOURCE_EXHAUSTED: the discovery prompt is longer than SmolLM2's 8k context (it says what to lower)
        assert final.error.code in {"FAILED_PRECONDITION", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "UNAVAILABLE",
                                    "RESOURCE_EXHAUSTED"}
        assert len(final.error.message) > 20 and "Traceback" not in final.error.message
        if final.error.code == "RESOURCE_EXHAUSTED":
            assert "TRACE_ANALYSIS_DISCOVERY_CHAR_BUDGET" in final.error.message


def test_environment_llm_mode_with_real_model(embedded_stack, vllm_server, vllm_allowed):
    spec = E.GenerationSpec(capabilities=[t.Capability(name="precondition_verification",
                                                       description="check an order's status before cancelling")],
                            target=t.EnvironmentRef(name="store"), mode=E.GENERATION_MODE_LLM, max_retries=0,
                            llm=t.LlmEndpoint(base_url=vllm_server.base_url, model="smollm2", timeout_seconds=600))
    stub = embedded_stack.stub("environment")
    job = stub.CreateGenerationJob(E.CreateGenerationJobRequest(spec=spec, run_id="llm-env")).job
    final = _wait(stub, "GenerationJob", job.job_id, E)
    resp = stub.GetGenerationJob(E.GetGenerationJobRequest(job_id=job.job_id))
    if final.state == t.JOB_STATE_SUCCEEDED:
        for rec in resp.environments:  # whatever the model wrote was validated in the sandbox
            assert rec.status in (E.VALIDATION_STATUS_ACCEPTED, E.VALIDATION_STATUS_REJECTED)
            assert rec.status == E.VALIDATION_STATUS_ACCEPTED or list(rec.rejection_reasons)
    else:
        assert final.error.code != "INTERNAL" and final.error.message
    assert stub.ListEnvironments(E.ListEnvironmentsRequest(include_rejected=True)) is not None
