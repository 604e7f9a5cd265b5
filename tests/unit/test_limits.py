"""Request size caps (trace_common/limits.py) as the servicers apply them: proto -> `protoconv.parse` ->
INVALID_ARGUMENT naming the field, the cap and the fix; one past each cap is refused, the cap itself
and what the repo's own configs send (tau2 prompts, the pipeline's capability lists) are accepted."""

from __future__ import annotations

import pytest

from services.environment.specs import GenerationSpecModel
from services.rollout.specs import RolloutSpecModel
from trace_common import limits
from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import types_pb2 as t

R, E = messages("rollout"), messages("environment")
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
     ("spec.tasks.task_ids.0", "256", "use the id as the environment lists it")),
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


def test_the_real_tau2_prompts_are_far_under_the_prompt_cap():
    from pathlib import Path

    from trace_common.domains.tau2.data import default_data_root
    from trace_common.domains.tau2.prompts import agent_system_prompt

    root = Path(default_data_root())
    sizes = [len(agent_system_prompt((root / d / "policy.md").read_text())) for d in ("airline", "retail")]
    assert max(sizes) * 4 < limits.PROMPT_CHARS, sizes
