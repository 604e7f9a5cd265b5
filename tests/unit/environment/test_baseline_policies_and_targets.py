"""Calibration statistics, the validation policies, the target tables and the seccomp program."""

from __future__ import annotations

import pytest

from services.environment.baseline_policies import RandomPolicy, draw
from services.environment.calibration import summarise
from services.environment.library import family_for, require_family
from services.environment.sandbox.isolation import DENIED_SYSCALLS, seccomp_program
from services.environment.targets import PROFILES, TargetInfo, resolve_target
from trace_common.env import Message
from trace_common.errors import FailedPrecondition, NotFound

from .helpers import target


@pytest.mark.parametrize(("rewards", "mean", "informative"), [
    ([[1, 0], [1, 1]], 0.75, 0.5),
    ([[0.4, 0.4, 0.4], [1.0, 0.4, 0.0]], 0.4333, 0.5),
    ([[0, 0], [0, 0]], 0.0, 0.0),
    ([[0.3], [0.7]], 0.5, 0.0),
    ([], 0.0, 0.0),
])
def test_summarise(rewards, mean, informative):
    got_mean, got_frac = summarise(rewards)
    assert got_mean == pytest.approx(mean, abs=1e-4) and got_frac == informative


@pytest.mark.parametrize(("p", "group"), [(0.3, 8), (0.25, 8), (0.5, 6), (0.0, 8), (1.0, 8)])
def test_skill_draws_are_stratified_per_group(p, group):
    for seed in range(200):
        skilled = sum(draw(seed, k, p) for k in range(group))
        assert abs(skilled - p * group) < 1.0 + 1e-9


def test_random_policy_is_seeded_and_uses_seen_tokens():
    tools = target("store").tool_schemas
    msgs = [Message.system("s"), Message.user("cancel #W12345 please, my email is a@b.com")]
    a = [RandomPolicy(7)(msgs, tools).model_dump() for _ in range(1)]
    b = [RandomPolicy(7)(msgs, tools).model_dump() for _ in range(1)]
    assert a == b
    calls = [RandomPolicy(s)(msgs, tools) for s in range(40)]
    args = [c.tool_calls[0].function.arguments for c in calls if c.tool_calls]
    assert any("#W12345" in x for x in args)
    assert any(c.content for c in calls)  # it also talks sometimes


@pytest.mark.parametrize(("capability", "family"), [
    ("precondition_verification", "precondition_verification"), ("argument_formatting", "tool_call_precision"),
    ("record_selection", "structured_data_reasoning"), ("task_completion", "multi_step_task_completion"),
    ("empathy", None),
])
def test_library_families_by_capability(capability, family):
    assert family_for(capability) == family
    if family is None:
        with pytest.raises(FailedPrecondition, match="GENERATION_MODE_LLM"):
            require_family(capability)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_fit_their_targets(name):
    info = target(name)
    params = info.library_params(("find_user", "get_user", "get_order", "cancel", "return_items"))
    assert set(params["tools"]) == {"find_user", "get_user", "get_order", "cancel", "return_items"}
    assert params["style"] == PROFILES[name].style


def _renamed(info: TargetInfo, old: str, new: str) -> TargetInfo:
    schemas = [dict(s, function=dict(s["function"], name=new)) if s["function"]["name"] == old else s
               for s in info.tool_schemas]
    return TargetInfo(info.name, info.version, info.params, schemas, info.policy, info.system_template,
                      info.greeting, info.profile)


def _changed_args(info: TargetInfo, tool: str) -> TargetInfo:
    schemas = []
    for s in info.tool_schemas:
        if s["function"]["name"] == tool:
            params = dict(s["function"]["parameters"], properties={"id": {"type": "string"}}, required=["id"])
            s = dict(s, function=dict(s["function"], parameters=params))
        schemas.append(s)
    return TargetInfo(info.name, info.version, info.params, schemas, info.policy, info.system_template,
                      info.greeting, info.profile)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: _renamed(target("store"), "get_order_details", "order_lookup"), "lacks the tool 'get_order_details'"),
    (lambda: _changed_args(target("tau2-retail"), "cancel_pending_order"), "the library does not fit"),
    (lambda: TargetInfo("toy", "1", {}, [], "", "{policy}", None, None), "has no tool mapping"),
])
def test_targets_whose_tools_do_not_fit_fail_clearly(make, message):
    with pytest.raises(FailedPrecondition, match=message):
        make().library_params(("find_user", "get_order", "cancel"))


def test_tau2_target_reads_its_data_directory(tmp_path):
    info = target("tau2-retail")
    assert "Retail agent policy" in info.policy and len(info.tool_schemas) == 16
    assert info.system_template.startswith("<instructions>") and info.greeting
    with pytest.raises(NotFound):
        resolve_target("tau2-retail", uri=tmp_path.as_uri())


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_semantics(machine):
    import errno
    import struct

    from services.environment.sandbox.isolation import _ARCHES

    prog = [struct.unpack("=HBBI", ins) for ins in seccomp_program(machine)]
    audit_arch, numbers = _ARCHES[machine]
    assert prog[0] == (0x20, 0, 0, 4) and prog[1][3] == audit_arch and prog[2] == (0x06, 0, 0, 0x80000000)
    eperm = 0x00050000 | errno.EPERM
    denied = {prog[i][3] for i in range(3, len(prog) - 1)
              if prog[i][0] == 0x15 and prog[i + 1] == (0x06, 0, 0, eperm)}
    assert denied == {numbers[n] for n in DENIED_SYSCALLS if n in numbers}
    clone3 = next(i for i, ins in enumerate(prog) if ins[0] == 0x15 and ins[3] == numbers["clone3"])
    assert prog[clone3 + 1] == (0x06, 0, 0, 0x00050000 | errno.ENOSYS)
    clone = next(i for i, ins in enumerate(prog) if ins[0] == 0x15 and ins[3] == numbers["clone"])
    assert prog[clone + 2][0] == 0x45 and prog[clone + 2][3] == 0x10000  # allowed only with CLONE_THREAD
    assert prog[-1] == (0x06, 0, 0, 0x7FFF0000)
