"""Calibration statistics, the validation policies, the target descriptions and the seccomp program."""

from __future__ import annotations

import pytest

from services.environment import library
from services.environment.baseline_policies import RandomPolicy, draw
from services.environment.calibration import summarise
from services.environment.library import family_for, require_family
from services.environment.sandbox.isolation import DENIED_SYSCALLS, seccomp_program
from services.environment.targets import TargetInfo, resolve_target
from trace_common.env import Message
from trace_common.errors import FailedPrecondition, NotFound

from .helpers import TARGET_NAMES, target


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


@pytest.mark.parametrize("name", TARGET_NAMES)
@pytest.mark.parametrize("family", library.FAMILIES)
def test_every_family_fits_both_targets(name, family):
    info = target(name)
    params = info.library_params(library.roles(family))
    assert params["surface"]["system_prompt"] == info.system_prompt
    assert params["surface"]["tool_schemas"] == info.tool_schemas and params["toolkit_sha256"] == info.toolkit_sha256


def _with(info: TargetInfo, **changes) -> TargetInfo:
    return TargetInfo(info.surface.model_copy(update=changes), info.params, info.toolkit_sha256)


def _renamed(info: TargetInfo, old: str, new: str) -> TargetInfo:
    schemas = [dict(s, function=dict(s["function"], name=new)) if s["function"]["name"] == old else s
               for s in info.tool_schemas]
    return _with(info, tool_schemas=schemas)


def _changed_args(info: TargetInfo, tool: str) -> TargetInfo:
    schemas = []
    for s in info.tool_schemas:
        if s["function"]["name"] == tool:
            params = dict(s["function"]["parameters"], properties={"id": {"type": "string"}}, required=["id"])
            s = dict(s, function=dict(s["function"], parameters=params))
        schemas.append(s)
    return _with(info, tool_schemas=schemas)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: _renamed(target("store"), "get_order_details", "order_lookup"), "lacks the tool 'get_order_details'"),
    (lambda: _changed_args(target("tau2-retail"), "cancel_pending_order"), "the library does not fit"),
    (lambda: _with(target("store"), toolkit=None, toolkit_params={}), "publishes no record toolkit"),
])
def test_targets_the_library_does_not_fit_fail_clearly(make, message):
    with pytest.raises(FailedPrecondition, match=message):
        make().library_params(library.roles("precondition_verification"))


def test_tau2_target_reads_its_data_directory(tmp_path):
    info = target("tau2-retail")
    assert "Retail agent policy" in info.system_prompt and len(info.tool_schemas) == 16
    assert info.system_prompt.startswith("<instructions>") and info.greeting == "Hi! How can I help you today?"
    assert info.summary()["toolkit"] == "trace_common.domains.tau2.record_toolkit:TOOLKIT"
    with pytest.raises(NotFound):
        resolve_target("tau2-retail", uri=tmp_path.as_uri())


def _run_bpf(prog: list[tuple[int, int, int, int]], arch: int, nr: int, arg0: int = 0) -> int:
    """A classic-BPF interpreter for the instructions the filter uses (ld abs, jeq, jge, jset, ret)."""
    data = {0: nr & 0xFFFFFFFF, 4: arch, 16: arg0 & 0xFFFFFFFF}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc, pc = data[k], pc + 1
        elif code in (0x15, 0x35, 0x45):
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected BPF instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_semantics(machine):
    """The filter, run by an interpreter, does what its Semantics table says for every listed call."""
    import errno
    import struct

    from services.environment.sandbox.isolation import (
        _ARCHES,
        KILLING_SYSCALLS,
        SELF_ONLY_EPERM_SYSCALLS,
        SELF_ONLY_SIGNAL_SYSCALLS,
    )

    own = 1  # pid 1 of the worker's own PID namespace
    prog = [struct.unpack("=HBBI", ins) for ins in seccomp_program(machine, own_pid=own)]
    arch, numbers = _ARCHES[machine]
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    run = lambda nr, arg0=0, a=arch: _run_bpf(prog, a, nr, arg0)  # noqa: E731
    other = next(n for n in range(1000) if n not in numbers.values())  # a call no list names (e.g. read)
    assert run(other, a=arch ^ 1) == kill                                # another architecture
    assert run(0x40000000 + 1) == eperm                                  # the x32 ABI
    for name in DENIED_SYSCALLS:
        if name in numbers:
            assert run(numbers[name]) == eperm, name
    for name in KILLING_SYSCALLS:
        if name in numbers:
            assert run(numbers[name]) == kill, name
    for name in SELF_ONLY_SIGNAL_SYSCALLS:
        if name in numbers:
            assert run(numbers[name], own) == allow and run(numbers[name], 4242) == kill, name
    for name in SELF_ONLY_EPERM_SYSCALLS:
        if name in numbers:
            assert run(numbers[name], 0) == allow and run(numbers[name], own) == allow, name
            assert run(numbers[name], 4242) == eperm, name
    assert run(numbers["clone3"]) == enosys
    assert run(numbers["clone"], 0x10000) == allow and run(numbers["clone"], 0x11) == eperm  # threads only
    assert run(other) == allow


#: The mount API's syscalls (numbered after the unification of syscall tables: the same on every
#: architecture). Each one could build or change a mount, so each is refused with EPERM.
MOUNT_API_SYSCALLS = [("open_tree", 428), ("move_mount", 429), ("fsopen", 430), ("fsconfig", 431),
                      ("fsmount", 432), ("fspick", 433), ("mount_setattr", 442)]


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize(("name", "nr"), MOUNT_API_SYSCALLS, ids=[n for n, _ in MOUNT_API_SYSCALLS])
def test_seccomp_denies_every_mount_api_syscall(machine, name, nr):
    import errno
    import struct

    from services.environment.sandbox.isolation import _ARCHES

    arch, numbers = _ARCHES[machine]
    assert name in DENIED_SYSCALLS and numbers.get(name) == nr, (name, numbers.get(name))
    prog = [struct.unpack("=HBBI", ins) for ins in seccomp_program(machine, own_pid=1)]
    assert _run_bpf(prog, arch, nr) == 0x00050000 | errno.EPERM
