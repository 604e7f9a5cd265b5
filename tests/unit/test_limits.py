"""Request size caps (trace_common/limits.py) as the servicers apply them: proto -> `protoconv.parse` ->
INVALID_ARGUMENT naming the field, the cap and the fix; one past each cap is refused, the cap itself
and what the repo's own configs send (tau2 prompts, the pipeline's capability lists) are accepted."""

from __future__ import annotations

import pytest

from services.analysis.specs import AnalysisSpecModel
from services.environment.specs import GenerationSpecModel
from services.inference.specs import CompositionSpecModel, GenerateModel
from services.rollout.specs import RolloutSpecModel
from services.trainer.specs import TrainingSpecModel
from trace_common import limits
from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import types_pb2 as t

R, E = messages("rollout"), messages("environment")
A, T, INF = messages("analysis"), messages("trainer"), messages("inference")
IDS = [str(1_000_000 + i) for i in range(limits.TASK_IDS)]


def _rollout(**kw) -> R.RolloutSpec:
    tasks = kw.pop("tasks", R.TaskSelection(split="test", limit=1))
    env = kw.pop("env", t.EnvironmentRef(name="store"))
    return R.RolloutSpec(environment=env, tasks=tasks, **kw,
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model="expert"))


def _generation(**cap) -> E.GenerationSpec:
    return E.GenerationSpec(capabilities=[t.Capability(name="skill", **cap)], target=t.EnvironmentRef(name="store"),
                            mode=E.GENERATION_MODE_LIBRARY)


#: (spec model, proto spec, field in the message, cap in the message, fix fragment); None: accepted
CASES = [
    ("prompt at the cap", RolloutSpecModel, _rollout(system_prompt="p" * limits.PROMPT_CHARS), None),
    ("prompt past the cap", RolloutSpecModel, _rollout(system_prompt="p" * (limits.PROMPT_CHARS + 1)),
     ("spec.system_prompt", "65536", "shorten it")),
    ("task ids at the cap", RolloutSpecModel, _rollout(tasks=R.TaskSelection(task_ids=IDS)), None),
    ("task ids past the cap", RolloutSpecModel, _rollout(tasks=R.TaskSelection(task_ids=[*IDS, "1"])),
     ("spec.tasks.task_ids", "10000", "split the tasks over several jobs")),
    ("a long task id", RolloutSpecModel, _rollout(tasks=R.TaskSelection(task_ids=["1" * 257])),
     ("spec.tasks.task_ids.0", "256", "use the id or name as the service lists it")),
    ("a long split", RolloutSpecModel, _rollout(tasks=R.TaskSelection(split="s" * 257)),
     ("spec.tasks.split", "256", "")),
    ("too many params", RolloutSpecModel, _rollout(env=t.EnvironmentRef(name="store", params={
        f"p{i}": "v" for i in range(limits.PARAMS + 1)})), ("spec.environment.params", "64", "drop parameters")),
    ("a long param value", RolloutSpecModel, _rollout(env=t.EnvironmentRef(name="store", params={
        "p": "v" * (limits.PARAM_VALUE_CHARS + 1)})), ("spec.environment.params.p", "16384", "by URI")),
    ("the pipeline's capability", GenerationSpecModel, _generation(
        description="d" * 2000, evidence=["[1000001] quote " * 20] * 10, failed_task_ids=IDS[:100]), None),
    ("a long description", GenerationSpecModel, _generation(description="d" * (limits.TEXT_CHARS + 1)),
     ("spec.capabilities.0.description", "16384", "shorten it")),
    ("too much evidence", GenerationSpecModel, _generation(evidence=["q"] * (limits.EVIDENCE_ITEMS + 1)),
     ("spec.capabilities.0.evidence", "50", "keep the most telling")),
    ("too many failed ids", GenerationSpecModel, _generation(failed_task_ids=[*IDS, "1"]),
     ("spec.capabilities.0.failed_task_ids", "10000", "")),
]


@pytest.mark.parametrize(("model", "spec", "refusal"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_field_class_has_its_cap(model, spec, refusal):
    if refusal is None:
        parse(model, spec, "spec")
        return
    field, cap, fix = refusal
    with pytest.raises(InvalidArgument) as err:
        parse(model, spec, "spec")
    text = str(err.value)
    assert text.startswith(f"{field}: ") and f"over the cap of {cap} " in text and fix in text, text


#: One past the URI/reference cap: an absolute path, so only the cap refuses it.
LONG_URI = "/" + "a" * limits.URI_CHARS
LONG_ID = "a" * (limits.ID_CHARS + 1)
SCRIPTED = dict(backend=t.POLICY_BACKEND_SCRIPTED, model="expert")
ENV = t.EnvironmentRef(name="store")


def _policy(**kw) -> t.PolicyRef:
    return t.PolicyRef(**{**SCRIPTED, **kw})


def _sim(**kw) -> t.LlmEndpoint:
    return t.LlmEndpoint(**{"profile": "p", "model": "m", **kw})


def _training(**kw) -> T.TrainingSpec:
    return T.TrainingSpec(**{"kind": T.TRAINING_KIND_ADAPTER, "capability": "c", "environments": [ENV],
                             "policy": _policy(), **kw})


def _composition(**kw) -> INF.CompositionSpec:
    return INF.CompositionSpec(**{"name": "c", "base_model": "expert", **kw})


def _generate(**msg) -> INF.GenerateRequest:
    return INF.GenerateRequest(model="c", messages=[t.ChatMessage(**{"role": "user", "content": "hi", **msg})])


#: (id, spec model, proto, the field the refusal names, cap): every URI/reference and identifier field
#: of the five services' request specs, one past its cap. A 15 MiB `environment.uri` held ~55 MiB per
#: call before it reached the store's confinement check (review of issue 28).
URI_CASES = [
    ("environment.uri", RolloutSpecModel, _rollout(env=t.EnvironmentRef(name="store", uri=LONG_URI)),
     "spec.environment.uri", limits.URI_CHARS),
    ("environment.version", RolloutSpecModel, _rollout(env=t.EnvironmentRef(name="store", version=LONG_ID)),
     "spec.environment.version", limits.ID_CHARS),
    ("environment.name", RolloutSpecModel, _rollout(env=t.EnvironmentRef(name=LONG_ID)),
     "spec.environment.name", limits.ID_CHARS),
    *[(f"policy.{f}", RolloutSpecModel, R.RolloutSpec(environment=ENV, policy=_policy(**{f: v})),
       f"spec.policy.{f}", cap) for f, v, cap in [
        ("model", LONG_URI, limits.URI_CHARS), ("adapter_uri", LONG_URI, limits.URI_CHARS),
        ("composition_uri", LONG_URI, limits.URI_CHARS), ("endpoint", "http://h/" + "a" * limits.URI_CHARS,
                                                         limits.URI_CHARS),
        ("adapter_name", LONG_ID, limits.ID_CHARS), ("endpoint_profile", LONG_ID, limits.ID_CHARS)]],
    ("output_uri", RolloutSpecModel, _rollout(output_uri=LONG_URI), "spec.output_uri", limits.URI_CHARS),
    *[(f"user_simulator.{f}", RolloutSpecModel, _rollout(user_simulator=_sim(**{f: v})),
       f"spec.user_simulator.{f}", cap) for f, v, cap in [
        ("base_url", "http://h/" + "a" * limits.URI_CHARS, limits.URI_CHARS), ("model", LONG_URI, limits.URI_CHARS),
        ("profile", LONG_ID, limits.ID_CHARS), ("api_key_env", LONG_ID, limits.ID_CHARS)]],
    ("rollout_uris", AnalysisSpecModel, A.AnalysisSpec(rollout_uris=[LONG_URI], mode=A.ANALYST_MODE_DIAGNOSTICS),
     "spec.rollout_uris.0", limits.URI_CHARS),
    ("resume_from_uri", TrainingSpecModel, _training(resume_from_uri=LONG_URI), "spec.resume_from_uri",
     limits.URI_CHARS),
    ("adapter_uris value", TrainingSpecModel, _training(adapter_uris={"c": LONG_URI}), "spec.adapter_uris.c",
     limits.URI_CHARS),
    ("trainer environment.uri", TrainingSpecModel, _training(environments=[t.EnvironmentRef(name="s", uri=LONG_URI)]),
     "spec.environments.0.uri", limits.URI_CHARS),
    ("capability name", GenerationSpecModel, E.GenerationSpec(capabilities=[t.Capability(name=LONG_ID)], target=ENV,
                                                              mode=E.GENERATION_MODE_LIBRARY),
     "spec.capabilities.0.name", limits.ID_CHARS),
    ("calibration_policy.model", GenerationSpecModel, E.GenerationSpec(
        capabilities=[t.Capability(name="c")], target=ENV, mode=E.GENERATION_MODE_LIBRARY,
        calibration_policy=_policy(model=LONG_URI)), "spec.calibration_policy.model", limits.URI_CHARS),
    ("composition name", CompositionSpecModel, _composition(name=LONG_ID), "spec.name", limits.ID_CHARS),
    ("base_model", CompositionSpecModel, _composition(base_model=LONG_URI), "spec.base_model", limits.URI_CHARS),
    ("gates_uri", CompositionSpecModel, _composition(gates_uri=LONG_URI), "spec.gates_uri", limits.URI_CHARS),
    ("adapter uri", CompositionSpecModel, _composition(adapters=[INF.AdapterRef(name="a", uri=LONG_URI)]),
     "spec.adapters.0.uri", limits.URI_CHARS),
    ("adapter name", CompositionSpecModel, _composition(adapters=[INF.AdapterRef(name=LONG_ID, uri="/a")]),
     "spec.adapters.0.name", limits.ID_CHARS),
    ("generate model", GenerateModel, INF.GenerateRequest(model=LONG_ID, messages=[t.ChatMessage(role="user")]),
     "spec.model", limits.ID_CHARS),
    ("message role", GenerateModel, _generate(role=LONG_ID), "spec.messages.0.role", limits.ID_CHARS),
    ("message tool_call_id", GenerateModel, _generate(tool_call_id=LONG_ID), "spec.messages.0.tool_call_id",
     limits.ID_CHARS),
    ("message name", GenerateModel, _generate(name=LONG_ID), "spec.messages.0.name", limits.ID_CHARS),
]


@pytest.mark.parametrize(("model", "spec", "field", "cap"), [c[1:] for c in URI_CASES], ids=[c[0] for c in URI_CASES])
def test_every_uri_and_identifier_field_has_its_cap(model, spec, field, cap):
    with pytest.raises(InvalidArgument) as err:
        parse(model, spec, "spec")
    text = str(err.value)
    assert text.startswith(f"{field}: ") and f"over the cap of {cap} " in text, text
    assert len(text) < 1000                               # the refusal does not echo the value


def test_a_uri_at_the_cap_is_accepted():
    spec = _rollout(env=t.EnvironmentRef(name="store", uri=LONG_URI[:-1]), output_uri=LONG_URI[:-1])
    assert len(parse(RolloutSpecModel, spec, "spec").environment.uri) == limits.URI_CHARS


def test_the_real_tau2_prompts_are_far_under_the_prompt_cap():
    from tests.support.tau2_data import require_tau2_data
    from trace_common.domains.tau2.prompts import agent_system_prompt

    root = require_tau2_data()
    sizes = [len(agent_system_prompt((root / d / "policy.md").read_text())) for d in ("airline", "retail")]
    assert max(sizes) * 4 < limits.PROMPT_CHARS, sizes
