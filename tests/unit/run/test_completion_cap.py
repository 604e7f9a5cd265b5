"""One completion cap for every stage of a run (tracectl/run/completion_cap.py, issue 31): derived from
the target's scripted expert in the base agent's tokens plus the stated margin, or set once at the
top level with a reason; per-stage values are refused with the fix; and the pipeline hands the cap
(with the adapters' sampling) to calibration, the adapters, the gates and every rollout, and each
adapter its environment's calibration batches."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from tests.unit.trainer.helpers import save_store_model
from trace_common.artifacts import open_store
from trace_common.domains.store import ExpertConfig, StoreEnv, StoreExpert
from trace_common.env import dumps_jsonl
from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.run.completion_cap import derive, margin, reply_lengths
from tracectl.run.config import RunConfig
from tracectl.run.manifest import Manifest
from tracectl.run.pipeline import Pipeline
from tracectl.run.results import CompletionCap, Rollout

E, T = messages("environment"), messages("trainer")


@pytest.mark.parametrize("data, fragment", [
    ({"training": {"grpo": {"max_completion_length": 96}}}, "training.grpo.max_completion_length is not a per-stage"),
    ({"gates": {"config": {"max_completion_length": 96}}}, "gates.config.max_completion_length is not a per-stage"),
    ({"training": {"grpo": {"initial_batches_uri": "file:///x"}}}, "tracectl passes each adapter"),
    ({"max_completion_length": {"tokens": 96}}, "reason"),                                  # the reason is required
    ({"max_completion_length": {"tokens": 4, "reason": "a reason long enough"}}, "tokens"),
])
def test_the_cap_is_set_once_at_the_top_level(data, fragment):
    with pytest.raises(ValueError) as err:
        RunConfig(run_id="x", **data)
    assert fragment in str(err.value)
    if "per-stage" in fragment:
        assert "max_completion_length: {tokens: N, reason: '...'}" in str(err.value)   # says what to write instead


def test_a_top_level_cap_changes_the_rollout_stage_hash():
    a = RunConfig(run_id="x").section("rollout")
    b = RunConfig(run_id="x", max_completion_length={"tokens": 96, "reason": "set by hand for a test"}).section("rollout")
    assert a != b and a["max_completion_length"] == "derived from the target"


class ExpertPipeline(Pipeline):
    """A Pipeline whose one rollout job plays the store's scripted expert here (what the rollout
    service's SCRIPTED backend plays) and stores its trajectories."""

    def setup(self) -> ExpertPipeline:
        self.rollouts: list[tuple] = []
        return self

    def rollout(self, policy, split, limit, samples, temperature, label, seed=0, *, env_params=None,
                system_prompt="", max_tokens=None, task_ids=None, labels=None):
        self.rollouts.append((policy.backend, policy.model, split, limit, max_tokens))
        env, expert = StoreEnv(), StoreExpert(ExpertConfig.perfect())
        trajs = [expert.play(env, s) for s in range(8)]
        info = self.store.put_bytes("runs/cap/rollouts/expert.jsonl", dumps_jsonl(trajs))
        return Rollout(job="expert-job", uri=info.uri, episodes=len(trajs))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_store_model(tmp_path_factory.mktemp("cap-base") / "base")


def _pipeline(tmp_path, **cfg) -> ExpertPipeline:
    return ExpertPipeline(RunConfig(run_id="cap", **cfg), runner=None, store=open_store(tmp_path.as_uri()),
                          manifest=Manifest(run_id="cap")).setup()


def test_the_derived_cap_is_the_longest_expert_reply_plus_the_margin(tmp_path, base_dir):
    from transformers import AutoTokenizer

    p = _pipeline(tmp_path, base_agent={"name": str(base_dir)})
    cap = derive(p)
    assert p.rollouts == [(t.POLICY_BACKEND_SCRIPTED, "expert:perfect", "train", 200, 0)]
    tok = AutoTokenizer.from_pretrained(base_dir)
    env, expert = StoreEnv(), StoreExpert(ExpertConfig.perfect())
    lengths = reply_lengths(tok, [expert.play(env, s) for s in range(8)])
    replies = sum(m.role == "assistant" for s in range(8) for m in expert.play(env, s).messages)
    assert len(lengths) == replies == cap.expert_replies and min(lengths) > 1   # every reply, end marker included
    assert cap.longest_expert_turn == max(lengths) and cap.margin == margin(max(lengths))
    assert cap.tokens == max(lengths) + max(16, -(-max(lengths) // 4)) and cap.source == "derived"


@pytest.mark.parametrize("cfg, fragment", [
    ({"base_agent": {"name": "served", "backend": "http", "endpoint": "http://vllm:8000/v1"}}, "served base agent"),
    ({"target": {"env": "tau2-retail"}}, "scripted expert"),
    ({"base_agent": {"name": "/no/such/model"}}, "no local model directory"),
])
def test_a_cap_that_cannot_be_derived_must_be_set(tmp_path, cfg, fragment):
    p = _pipeline(tmp_path, **cfg)
    with pytest.raises(InvalidArgument, match=fragment) as err:
        derive(p)
    assert "max_completion_length: {tokens: N, reason:" in str(err.value) and not p.rollouts


def test_a_set_cap_plays_nothing(tmp_path):
    p = _pipeline(tmp_path, base_agent={"name": "served", "backend": "http", "endpoint": "http://vllm:8000/v1"},
                  max_completion_length={"tokens": 300, "reason": "served model, measured by hand"})
    assert derive(p) == CompletionCap(tokens=300, source="config", reason="served model, measured by hand")
    assert not p.rollouts


# -- every stage gets the one cap ---------------------------------------------------------------------
class Runner:
    """Stand-in for JobRunner + Connection: records every spec; the trainer's own config models parse
    the configs (ValidateTrainingConfig)."""

    def __init__(self):
        self.specs: list[tuple[str, object]] = []
        self.conn = SimpleNamespace(stub=lambda name: SimpleNamespace(ValidateTrainingConfig=self.validate))

    def validate(self, request):
        from services.trainer.configs import validate_training_config

        values = validate_training_config(T.TrainingKind.Name(request.kind), MessageToDict(request.config.values),
                                          request.field_path).model_dump(mode="json")
        s = Struct()
        s.update(values)
        return T.ValidateTrainingConfigResponse(config=t.Config(values=s))

    def run(self, service, spec, run_id, description, **kw):
        self.specs.append((service, spec))
        job = t.Job(job_id=f"{service}-{len(self.specs)}", outputs=[t.ArtifactRef(uri="file:///a", kind="adapter"),
                                                                     t.ArtifactRef(uri="file:///c", kind="composition")])
        if service == "environment":
            return E.GetGenerationJobResponse(job=job, environments=[E.EnvironmentRecord(
                name="with", version="1", capability="with", status=E.VALIDATION_STATUS_ACCEPTED,
                code=t.ArtifactRef(uri="file:///env.py"))])
        return T.GetTrainingJobResponse(job=job)


def _batches_manifest(store, seeds: int, group_size: int) -> str:
    """A calibration-batches manifest of `seeds` groups of `group_size` (its episodes are not read here)."""
    from trace_common.env.calibration_batches import CalibrationBatches

    manifest = CalibrationBatches(
        environment="with", version="1", code_sha256="0" * 64, policy_model="micro", policy_backend="in_process",
        sampling={"temperature": 0.8, "top_p": 1.0, "top_k": 40, "max_tokens": 120}, max_turns=24, split="train",
        seeds=list(range(seeds)), group_size=group_size, episodes=seeds * group_size, token_ids=True,
        sampling_seeds="test", trajectories={"uri": "file:///b/calibration.jsonl", "key": "b/calibration.jsonl",
                                             "sha256": "0" * 64, "size": 0})
    return store.put_bytes("runs/cap/environments/with/v1/calibration_batches.json",
                           json.dumps(manifest.model_dump(mode="json")).encode()).uri


# (calibration seeds x samples, max_steps) -> the max_steps the adapter's job gets: raised to the
# iterations its calibration batches fill (groups_per_batch 4, num_generations 8), so every counted
# episode trains; never lowered
@pytest.mark.parametrize("seeds, group_size, max_steps, expected", [
    (8, 8, 2, 2),      # 8 groups = 2 iterations: as configured
    (8, 8, 6, 6),      # more on-policy iterations after them
    (16, 8, 2, 4),     # 16 groups = 4 iterations > 2: raised
    (9, 16, 3, 5),     # 18 groups (2 per seed) = ceil(18 / 4) = 5
])
def test_every_stage_gets_the_one_cap_and_each_adapter_its_calibration_batches(tmp_path, seeds, group_size, max_steps,
                                                                               expected):
    store = open_store(tmp_path.as_uri())
    m = Manifest(run_id="cap")
    m.stages["rollout"].result = {"max_completion_length": {"tokens": 120, "source": "derived"}}
    m.stages["rollout"].outputs = {"trajectories": "file:///base.jsonl"}
    m.stages["analysis"].result = {"capabilities": [{"name": "precondition_verification"}]}
    with_uri = _batches_manifest(store, seeds, group_size)
    reports = {"with": {"calibration_batches": {"uri": with_uri, "token_ids": True}},
               "without": {"calibration_batches": {"uri": "file:///c/calibration_batches.json", "token_ids": False}}}
    envs = []
    for cap, rep in reports.items():
        info = store.put_bytes(f"runs/cap/environments/{cap}/v1/validation.json", json.dumps(rep).encode())
        envs.append({"capability": cap, "name": cap, "version": "1", "status": "VALIDATION_STATUS_ACCEPTED",
                     "validation_report": {"uri": info.uri}})
    m.stages["environments"].result = {"environments": envs}
    runner = Runner()
    grpo = {"max_steps": max_steps, "temperature": 0.8, "top_k": 40, "groups_per_batch": 4, "num_generations": 8}
    p = Pipeline(RunConfig(run_id="cap", training={"grpo": grpo}), runner=runner, store=store, manifest=m)
    p.stage_environments()
    adapters = p.stage_adapters()
    m.stages["adapters"].outputs = adapters["outputs"]
    p.stage_gates()
    [(_, gen)] = [s for s in runner.specs if s[0] == "environment"]
    assert (gen.calibration_sampling.max_tokens, gen.calibration_sampling.top_k, gen.calibration_sampling.top_p) == \
        (120, 40, 1.0) and gen.calibration_sampling.temperature == pytest.approx(0.8)
    configs = {s.capability: MessageToDict(s.config.values) for name, s in runner.specs if name == "trainer"}
    assert {c: v["max_completion_length"] for c, v in configs.items()} == {"with": 120, "without": 120, "cap-moe": 120}
    assert configs["with"]["initial_batches_uri"] == with_uri
    assert "initial_batches_uri" not in configs["without"]   # no token ids: nothing the trainer could score
    assert adapters["result"]["initial_batches"] == {"with": with_uri, "without": ""}
    assert (int(configs["with"]["max_steps"]), int(configs["without"]["max_steps"])) == (expected, max_steps)
    assert adapters["result"]["max_steps_raised"] == ({"with": expected} if expected > max_steps else {})
    # the turn budget its calibration played (24 in the manifest); the adapter without batches keeps its own
    assert (int(configs["with"]["max_turns"]), int(configs["without"].get("max_turns", 0))) == (24, 0)
