"""The compound target: the generator's mixture and structure, and the scripted expert on it
-- perfect with every skill, and a task fails without a skill exactly when the task needs
it, so `Task.capabilities` is exact; the attribution names only the missing skills."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.unit.domains.store.helpers import TEST_SEEDS, task_of
from trace_common.domains.store import CAPABILITIES, DEFAULT_SKILLS, ExpertConfig, StoreEnv, StoreExpert
from trace_common.domains.store.task_model import trait_capabilities

TRAIN_200, TEST_200 = range(0, 200), TEST_SEEDS[:200]
MULTI = "multi_step_task_completion"


def _play(skills: dict[str, float], seeds, seed: int = 0):
    env, expert = StoreEnv(), StoreExpert(ExpertConfig(skills=skills, seed=seed))
    return [expert.play(env, s) for s in seeds]


def test_test_split_mixture():
    """The measured shares the compound module's docstring states (test split, 600 tasks)."""
    tasks = [task_of(s) for s in TEST_SEEDS]
    needs = {c: sum(c in t.capabilities for t in tasks) for c in CAPABILITIES}
    assert needs == {"structured_data_reasoning": 338, MULTI: 423, "precondition_verification": 349,
                     "tool_call_precision": 358}
    assert all(n >= 0.35 * len(tasks) for n in needs.values())
    assert Counter(len(t.capabilities) for t in tasks) == {2: 366, 3: 200, 4: 34}


@pytest.mark.parametrize("seeds", [TEST_SEEDS, range(0, 600)], ids=["test", "train-600"])
def test_structure_of_every_task(seeds):
    for seed in seeds:
        task = task_of(seed)
        subs = task.subrequests
        assert task.task_type == "compound" and task.capability is None
        assert 2 <= len(subs) <= 3 and len({sr.base_kind for sr in subs}) == len(subs)
        for sr in subs:
            assert sr.capabilities == trait_capabilities(sr.traits)
            assert ("forbidden_status" in sr.traits) == sr.kind.endswith("_refused") == (not sr.gold
                                                                                       and sr.kind != "status")
        required = {c for sr in subs for c in sr.capabilities}
        if task.scenario.mode == "all_at_once":
            required.add(MULTI)
            assert all(sr.text in task.scenario.opening for sr in subs)
        assert task.capabilities == sorted(required) and 2 <= len(required) <= 4
        orders = task.db["users"][task.user_id]["orders"]
        assert len({sr.order_id for sr in subs if sr.order_id}) == sum(1 for sr in subs if sr.order_id)
        for sr in subs:
            if "by_attributes" in sr.traits:  # the look-alike is listed first and holds the same product
                decoy = task.db["orders"][sr.facts["decoy_order_id"]]
                assert orders.index(decoy["order_id"]) < orders.index(sr.order_id)
                assert decoy["status"] == task.db["orders"][sr.order_id]["status"]
                assert any(r["product_id"] == sr.facts["product_id"] for r in decoy["items"])
                allowed = task.db["orders"][sr.order_id]["status"]
                target = next(r for r in task.db["orders"][sr.order_id]["items"] if r["item_id"] == sr.facts["item_id"])
                holding = [o for o in orders if task.db["orders"][o]["status"] == allowed and any(
                    r["product_id"] == target["product_id"] for r in task.db["orders"][o]["items"])]
                matching = [o for o in holding if any(r["item_id"] == target["item_id"]
                                                      for r in task.db["orders"][o]["items"])]
                assert matching == [sr.order_id] and holding[0] == decoy["order_id"]  # unique; decoy first
            if "loose_id" in sr.traits:
                assert sr.facts["raw_order_ref"] != sr.order_id and sr.order_id[2:] in sr.facts["raw_order_ref"]
                assert sr.order_id not in sr.text


@pytest.mark.parametrize("seeds", [TRAIN_200, TEST_200], ids=["train", "test"])
def test_all_skills_expert_passes_every_task(seeds):
    trajs = _play({c: 1.0 for c in CAPABILITIES}, seeds)
    assert [(t.seed, t.failure_reason) for t in trajs if t.reward != 1.0] == []
    assert all(not t.diagnostics and t.termination == "done" for t in trajs)
    assert max(t.assistant_turns() for t in trajs) < StoreEnv.default_max_turns


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_without_one_skill_exactly_the_tasks_needing_it_fail(capability):
    skills = {c: 1.0 for c in CAPABILITIES}
    skills[capability] = 0.0
    trajs = _play(skills, TEST_200)
    needing = [t.seed for t in trajs if capability in t.info["capabilities"]]
    assert sorted(t.seed for t in trajs if not t.success) == needing
    assert 0 < len(needing) < len(trajs)
    for traj in trajs:
        assert {d.capability for d in traj.diagnostics} <= {capability}
        if not traj.success:
            assert any(d.event == "subgoal_failed" and d.capability == capability for d in traj.diagnostics)


@pytest.mark.parametrize("skills, expert_seed", [({c: 0.5 for c in CAPABILITIES}, 0), (DEFAULT_SKILLS, 1)])
def test_a_task_passes_iff_every_needed_skill_is_shown(skills, expert_seed):
    """With several skills missing at once: pass == needed <= shown, and every event names a
    skill missing in that episode (so the pass rate is E[prod_{c needed} p_c])."""
    trajs = _play(skills, TEST_200, seed=expert_seed)
    for traj in trajs:
        shown = traj.info["expert_skills"]
        assert traj.success == all(shown[c] for c in traj.info["capabilities"]), traj.seed
        assert not any(shown[d.capability] for d in traj.diagnostics), traj.seed
        assert traj.success or traj.diagnostics


def test_sequential_tasks_do_not_need_the_multi_step_skill():
    trajs = _play({c: 1.0 for c in CAPABILITIES} | {MULTI: 0.0}, TEST_200)
    sequential = [t for t in trajs if t.info["mode"] == "sequential"]
    assert sequential and all(t.success for t in sequential)
    assert all(MULTI not in t.info["capabilities"] for t in sequential)


@pytest.mark.parametrize("skills", [{c: 1.0 for c in CAPABILITIES}, {c: 0.5 for c in CAPABILITIES}],
                         ids=["all-skills", "half"])
def test_every_argument_comes_from_what_the_agent_saw(skills):
    """Imitability: each string the expert writes into a call was in the conversation before
    (system prompt, user messages, tool results), canonical id prefix aside ('#W' + digits)."""
    for traj in _play(skills, TEST_200[:100]):
        seen = ""
        for message in traj.messages:
            for tool_call in message.tool_calls or []:
                for value in json.loads(tool_call.function.arguments).values():
                    for v in value if isinstance(value, list) else [value]:
                        assert v in seen or (v.startswith("#W") and v[2:] in seen), (traj.seed, v)
            seen += "\n" + (message.content or "")
