"""The scripted expert on the probe types (compound tasks: test_compound.py): perfect with
every skill, each planted gap lowers exactly its task type and shows up in diagnostics, the
default gaps give a partial agent; config validation and deterministic, short episodes."""

from __future__ import annotations

from collections import defaultdict

import pytest
from pydantic import ValidationError

from tests.unit.domains.store.helpers import TEST_SEEDS
from trace_common.domains.store import (
    CAPABILITIES,
    CAPABILITY_OF,
    PROBE_TYPES,
    ExpertConfig,
    StoreEnv,
    StoreExpert,
)
from trace_common.env import dumps_jsonl, loads_jsonl

TYPE_OF = {c: t for t, c in CAPABILITY_OF.items()}


def _rates(config: ExpertConfig, seeds) -> tuple[dict[str, list[bool]], list]:
    env, expert = StoreEnv(task_types="probes"), StoreExpert(config)
    per_type: dict[str, list[bool]] = defaultdict(list)
    trajs = []
    for seed in seeds:
        traj = expert.play(env, seed)
        per_type[traj.info["task_type"]].append(traj.success)
        trajs.append(traj)
    return per_type, trajs


@pytest.mark.parametrize("seeds", [TEST_SEEDS[:200], range(0, 400), range(500_000, 500_200)],
                         ids=["test", "train-400", "dev"])
def test_perfect_expert_solves_every_task(seeds):
    per_type, trajs = _rates(ExpertConfig.perfect(), seeds)
    failed = [(t.seed, t.failure_reason) for t in trajs if not t.success]
    assert failed == []
    assert all(not t.diagnostics for t in trajs)
    assert all(t.termination == "done" for t in trajs)
    assert set(per_type) == set(PROBE_TYPES)


@pytest.mark.parametrize("capability, max_rate", [
    ("structured_data_reasoning", 0.0),   # always the look-alike order
    ("multi_step_task_completion", 0.4),  # only sequential-mode tasks survive
    ("precondition_verification", 0.6),  # only pending orders survive
    ("tool_call_precision", 0.0),         # always an error, then gives up
])
def test_each_gap_lowers_exactly_its_task_type(capability, max_rate):
    skills = {c: 1.0 for c in CAPABILITIES}
    skills[capability] = 0.0
    per_type, trajs = _rates(ExpertConfig(skills=skills), TEST_SEEDS[:200])
    target = TYPE_OF[capability]
    for task_type, results in per_type.items():
        rate = sum(results) / len(results)
        if task_type == target:
            assert rate <= max_rate and rate < 1.0
        else:
            assert rate == 1.0, f"{task_type} dropped to {rate} with only {capability} missing"
    for traj in trajs:
        caps = {d.capability for d in traj.diagnostics}
        assert caps <= {capability}
        if not traj.success:
            assert caps == {capability}, f"seed {traj.seed} failed without a {capability} diagnostic"


def test_default_gaps_give_a_partial_base_agent():
    per_type, trajs = _rates(ExpertConfig(), TEST_SEEDS[:200])
    overall = sum(t.success for t in trajs) / len(trajs)
    assert 0.2 <= overall <= 0.5
    for task_type, results in per_type.items():
        assert 0 < sum(results) < len(results), task_type
    for traj in trajs:
        if not traj.success:
            assert any(d.capability == traj.info["capability"] for d in traj.diagnostics)


def test_skill_draws_are_seeded_and_match_their_probability():
    config = ExpertConfig(skills={"precondition_verification": 0.3, "tool_call_precision": 0.0}, seed=4)
    expert = StoreExpert(config)
    draws = [expert.skill_flags(seed) for seed in range(3000)]
    assert draws == [StoreExpert(config).skill_flags(seed) for seed in range(3000)]
    share = sum(d["precondition_verification"] for d in draws) / len(draws)
    assert 0.27 <= share <= 0.33
    assert not any(d["tool_call_precision"] for d in draws)
    assert all(d["structured_data_reasoning"] for d in draws)  # left out -> 1.0
    assert [expert.skill_flags(s, 1) for s in range(50)] != [expert.skill_flags(s, 0) for s in range(50)]


def test_expert_episodes_are_deterministic_short_and_round_trip():
    env, expert = StoreEnv(task_types="probes"), StoreExpert()
    first = [expert.play(env, s) for s in TEST_SEEDS[:40]]
    again = [expert.play(env, s) for s in TEST_SEEDS[:40]]
    strip = lambda t: t.model_copy(update={"timings": {}})  # noqa: E731
    assert [strip(t) for t in first] == [strip(t) for t in again]
    assert [strip(t) for t in loads_jsonl(dumps_jsonl(first))] == [strip(t) for t in first]
    for traj in first:
        assert 3 <= traj.assistant_turns() <= 9
        chars = sum(len(m.content or "") + sum(len(c.function.arguments) for c in m.tool_calls or [])
                    for m in traj.messages[1:])
        assert chars < 2000, f"seed {traj.seed}: {chars} characters after the system prompt"
        assert traj.policy.model == "store-scripted-expert" and traj.policy.version == ExpertConfig().digest()


@pytest.mark.parametrize("skills, message", [
    ({"reading_minds": 0.5}, "unknown capability"),
    ({"tool_call_precision": 1.5}, "not a probability"),
])
def test_config_validation(skills, message):
    with pytest.raises(ValidationError, match=message):
        ExpertConfig(skills=skills)
