"""Trajectories with planted capability deficits, built directly as `Trajectory` records.

The known-answer set (`planted_set`) has 200 episodes, 50 failed / 150 passed:

| capability                  | exercised by                 | LACKING in                       | expected |
|-----------------------------|------------------------------|----------------------------------|----------|
| precondition_verification   | 50 tasks (info.capability)   | 20 failed (all its failures)     | retained (Cov 0.4, Delta 1) |
| multi_step_task_completion  | 50 tasks (info.capability)   | 20 failed (all its failures)     | retained (Cov 0.4, Delta 1) |
| tool_call_precision         | every task (info.capabilities)| 15 of 50 failed, 45 of 150 passed | rejected: gap (Delta 0) |
| date_arithmetic             | 10 tasks                      | 2 failed, 8 passed PRESENT       | rejected: coverage (Cov 0.04) |

The remaining 10 failures carry no diagnostics (unexplained failures, as in real rollouts).
"""

from __future__ import annotations

from trace_common.env import EnvInfo, Message, PolicyInfo, ToolCall, Trajectory
from trace_common.env.environment import Diagnostic, Termination

PLANTED_RETAINED = {"precondition_verification", "multi_step_task_completion"}
EQUAL_GAP = "tool_call_precision"
RARE = "date_arithmetic"


def make_trajectory(task_id: str, *, success: bool, capability: str | None = None,
                    capabilities: tuple[str, ...] = (), failures: tuple[str, ...] = (),
                    user_text: str = "Please cancel order #W1000001.", turns: int = 1,
                    tool_output: str = "order #W1000001 status: pending") -> Trajectory:
    msgs = [Message.system("You are a store agent. Only cancel pending orders."), Message.user(user_text)]
    for k in range(turns):
        msgs.append(Message.assistant(tool_calls=[ToolCall.create(f"call_{k}", "get_order_details",
                                                                  {"order_id": f"#W{1000001 + k}"})]))
        msgs.append(Message.tool(f"call_{k}", tool_output))
    msgs.append(Message.assistant("Your order has been cancelled." if success else "I could not do that."))
    info: dict = {}
    if capability:
        info["capability"] = capability
    if capabilities:
        info["capabilities"] = list(capabilities)
    return Trajectory(
        task_id=task_id, seed=int("".join(ch for ch in task_id if ch.isdigit()) or 0),
        env=EnvInfo(name="test", version="1"), policy=PolicyInfo(model="planted"), messages=msgs,
        reward=1.0 if success else 0.0, success=success, termination=Termination.DONE,
        diagnostics=[Diagnostic(capability=c, event="planted_failure", turn=1, detail={"task": task_id})
                     for c in failures],
        info=info)


def planted_set() -> list[Trajectory]:
    out: list[Trajectory] = []
    n = 0

    def add(success: bool, capability: str | None, failures: tuple[str, ...], extra: tuple[str, ...] = ()):
        nonlocal n
        out.append(make_trajectory(f"t{n:03d}", success=success, capability=capability,
                                   capabilities=(EQUAL_GAP, *extra), failures=failures))
        n += 1

    failed_tcp = iter([True] * 15 + [False] * 35)  # tool_call_precision LACKING in 15 of 50 failed
    passed_tcp = iter([True] * 45 + [False] * 105)  # ... and in 45 of 150 passed

    def tcp(it) -> tuple[str, ...]:
        return (EQUAL_GAP,) if next(it) else ()

    for cap in sorted(PLANTED_RETAINED):
        for _ in range(20):
            add(False, cap, (cap, *tcp(failed_tcp)))
        for _ in range(30):
            add(True, cap, tcp(passed_tcp))
    for k in range(10):  # unexplained failures; two of them lack the rare capability
        if k < 2:
            add(False, None, (RARE, *tcp(failed_tcp)), extra=(RARE,))
        else:
            add(False, None, tcp(failed_tcp))
    for k in range(90):
        add(True, None, tcp(passed_tcp), extra=(RARE,) if k < 8 else ())
    assert sum(not t.success for t in out) == 50 and len(out) == 200
    return out


def small_planted_set() -> list[Trajectory]:
    """40 episodes (20 failed / 20 passed) with the same four roles as `planted_set`, small enough
    for LLM-path tests (40 labeling requests per run):
    precondition_verification LACKING in 10 failed, PRESENT in 6 passed (retained);
    multi_step_task_completion LACKING in 6 failed, PRESENT in 6 passed (retained);
    tool_call_precision LACKING in 6 of 20 failed and 6 of 20 passed (rejected: gap);
    date_arithmetic LACKING in 1 failed, PRESENT in 4 passed (rejected: coverage, Cov 0.05)."""
    a, b = sorted(PLANTED_RETAINED, reverse=True)  # precondition_verification, multi_step_task_completion
    out: list[Trajectory] = []
    tcp_f = iter([True] * 6 + [False] * 14)
    tcp_p = iter([True] * 6 + [False] * 14)

    def add(success, capability, failures, extra=()):
        it = tcp_p if success else tcp_f
        failures = (*failures, *((EQUAL_GAP,) if next(it) else ()))
        out.append(make_trajectory(f"s{len(out):02d}", success=success, capability=capability,
                                   capabilities=(EQUAL_GAP, *extra), failures=failures))

    for _ in range(10):
        add(False, a, (a,))
    for _ in range(6):
        add(False, b, (b,))
    add(False, None, (RARE,), (RARE,))
    for _ in range(3):
        add(False, None, ())
    for cap in (a, b):
        for _ in range(6):
            add(True, cap, ())
    for k in range(8):
        add(True, None, (), (RARE,) if k < 4 else ())
    return out
