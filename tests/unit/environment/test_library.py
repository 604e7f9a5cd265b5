"""The capability environments, in-process, for both targets: the target's surface (system prompt,
greeting, all tools, tool outputs from the target's own tool code), contract, oracle, skill gap,
partial credit, guidance, calibration with the scripted skill mixture, self-contained bundles.
Their shape (the target's kinds, modes and lengths) is test_library_shape.py's."""

from __future__ import annotations

import ast
import copy
import hashlib
import itertools
import re
import statistics
from functools import cache
from pathlib import Path

import pytest

from services.environment import library
from services.environment.baseline_policies import NOOP_TEXT, RandomPolicy, draw, noop_policy
from services.environment.library import kit
from services.environment.validation import static_check
from tests.unit.env.contract import check_environment_contract
from trace_common.domains.store import tools as store_tools
from trace_common.domains.tau2.retail_db import RetailDB
from trace_common.domains.tau2.retail_tools import RetailTools
from trace_common.env import MessageAction, ToolAction, action_from_dict, run_episode
from trace_common.env.guidance import gold_actions_text
from trace_common.env.surface import toolkit_sha256
from trace_common.errors import FailedPrecondition, InvalidArgument

from .helpers import TARGET_NAMES, bundled, make_env, params, play, target, target_env

CASES = [(f, t) for f in library.FAMILIES for t in TARGET_NAMES]
SEEDS = list(range(500_000, 500_030))

#: family -> (lowest, highest) mean reward of the module's skill-less script over SEEDS, per target (it
#: handles the plain requests, so it earns their credit; measured 0.28, 0.06, 0.21, 0.23, 0.24, 0.17, 0.14, 0.08)
UNSKILLED_MEAN = {
    ("structured_data_reasoning", "store"): (0.24, 0.32), ("structured_data_reasoning", "tau2-retail"): (0.03, 0.11),
    ("multi_step_task_completion", "store"): (0.17, 0.25), ("multi_step_task_completion", "tau2-retail"): (0.18, 0.27),
    ("precondition_verification", "store"): (0.19, 0.28), ("precondition_verification", "tau2-retail"): (0.12, 0.21),
    ("tool_call_precision", "store"): (0.10, 0.19), ("tool_call_precision", "tau2-retail"): (0.04, 0.13)}


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_environment_contract(family, target_name):
    check_environment_contract(lambda: make_env(family, target_name), SEEDS[:4])


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_the_targets_surface_is_kept(family, target_name):
    """System prompt (the target's verbatim, then at most a short addendum), greeting, all tool schemas."""
    own = target_env(target_name).reset(0)
    env = make_env(family, target_name)
    for seed in SEEDS[:5]:
        obs = env.reset(seed)
        prompt = obs.messages[0].content
        assert obs.messages[0].role == "system"
        assert prompt[:len(own.messages[0].content)] == own.messages[0].content
        assert len(prompt) - len(own.messages[0].content) <= 600
        if target_name == "tau2-retail":
            assert (obs.messages[1].role, obs.messages[1].content) == (own.messages[1].role, own.messages[1].content)
        else:
            assert obs.messages[1].role == "user" and own.messages[1].role == "user"
        assert obs.tools == env.tool_schemas() == target_env(target_name).tool_schemas()
    # the store's policy already states the reporting rule the reward checks; tau2's gets it as the addendum
    assert (prompt == own.messages[0].content) is (target_name == "store")


def _target_output(target_name: str, db, name: str, args: dict) -> str:
    """The target's own tool code on a copy of `db`."""
    if target_name == "store":
        return store_tools.call_tool(copy.deepcopy(db), name, dict(args)).text
    return RetailTools(RetailDB.copy_on_write(db)).call(name, dict(args)).content


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_tool_outputs_are_the_targets_own(family, target_name):
    env = make_env(family, target_name)
    compared = 0
    for seed in SEEDS[:3]:
        env.reset(seed)
        case = next(r for r in env.inst.requests if r.order_id)
        loose = env.toolkit.loose_order_ids(case.order_id)[1]
        calls = [("get_user_details", {"user_id": env.inst.user.user_id}),
                 ("get_order_details", {"order_id": case.order_id}), ("get_order_details", {"order_id": loose}),
                 ("cancel_pending_order", {"order_id": case.order_id, "reason": "no longer needed"}),
                 ("get_order_details", {"order_id": case.order_id}), ("calculate", {"expression": "2 + 2"}),
                 ("list_user_orders", {"user_id": env.inst.user.user_id})]
        for name, args in calls:
            expected = _target_output(target_name, env.db, name, args)
            got = env.step(ToolAction(name=name, arguments=args, call_id="c")).observation[0].content
            assert got == expected, (seed, name, args)
            compared += 1
    assert compared == 21


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_oracle_reaches_one_and_the_skillless_script_does_not(family, target_name):
    env = make_env(family, target_name)
    module = __import__(f"services.environment.library.{family}", fromlist=["x"])
    unskilled = []
    for seed in SEEDS:
        assert play(env, seed, env.script(seed, skilled=True)) == 1.0, (seed, env.failure_reason())
        assert env.done
        if family != "multi_step_task_completion":
            assert env.diagnostics() == []
        unskilled.append(play(env, seed, env.script(seed, skilled=False)))
    lo, hi = UNSKILLED_MEAN[(family, target_name)]
    assert lo <= statistics.fmean(unskilled) <= hi, statistics.fmean(unskilled)
    assert max(unskilled) <= 1.0 and min(unskilled) < 1.0
    # the module-level functions the sandbox uses agree with the class (in a bundle kit and family are one
    # module, whose TARGET and TARGET_TOOLKIT the bundle binds: kit's here)
    kit.TARGET, kit.TARGET_TOOLKIT = env.target, type(env.toolkit)
    try:
        assert module.solve(SEEDS[0]) == env.script(SEEDS[0], skilled=True)
        assert module.solve_unskilled(SEEDS[0]) == env.script(SEEDS[0], skilled=False)
    finally:
        kit.TARGET, kit.TARGET_TOOLKIT = None, None


LEVELS = [(f, t, n) for f in library.FAMILIES for t in TARGET_NAMES for n in library.levels(f)]


@pytest.mark.parametrize(("family", "target_name", "cases"), LEVELS)
def test_every_level_keeps_the_skill_the_oracle_and_the_surface(family, target_name, cases):
    """At each level: at most `cases` capability cases per instance (the hardest level's, or some of
    them), the oracle reaches 1, the skill-less script and the trivial policies stay below it, the same
    surface as the hardest level, the same instance in a bundle as in-process; the hardest level is the
    family's default."""
    env, hardest = make_env(family, target_name, cases), make_env(family, target_name)
    unskilled = []
    for seed in SEEDS[:12]:
        first = env.reset(seed)
        got = [i for i, r in enumerate(env.inst.requests) if r.capability]
        hard = hardest.reset(seed)
        assert 1 <= len(got) <= cases and set(got) <= {i for i, r in enumerate(hardest.inst.requests) if r.capability}
        assert first.tools == hard.tools and first.messages[0] == hard.messages[0]
        assert play(env, seed, env.script(seed, skilled=True)) == 1.0, (seed, env.failure_reason())
        unskilled.append(play(env, seed, env.script(seed, skilled=False)))
        assert play(env, seed, [{"message": NOOP_TEXT}] * (len(env.inst.groups) + 2)) == 0.0
    assert statistics.fmean(unskilled) <= 0.45 and max(unskilled) < 1.0
    if cases == library.levels(family)[0]:
        assert [env.reset(s) for s in SEEDS[:3]] == [hardest.reset(s) for s in SEEDS[:3]]
    namespace: dict = {}
    exec(compile(library.bundle(family, params(family, target_name), cases=cases), "env.py", "exec"), namespace)
    assert namespace["TARGET"]["cases"] == cases
    assert namespace["ENVIRONMENT"]().reset(SEEDS[2]) == env.reset(SEEDS[2])
    assert namespace["ENVIRONMENT"].default_max_turns == env.default_max_turns == kit.turn_budget(env.target)


@pytest.mark.parametrize(("family", "cases"), [("tool_call_precision", 0), ("tool_call_precision", 4),
                                               ("multi_step_task_completion", 1), ("precondition_verification", True),
                                               ("structured_data_reasoning", "2")])
def test_a_level_the_family_lacks_is_refused(family, cases):
    with pytest.raises(InvalidArgument, match=r"target\.cases: expected one of this family's levels"):
        library.make_env(family, {**params(family, "store"), "cases": cases})
    if isinstance(cases, int) and not isinstance(cases, bool):
        with pytest.raises(FailedPrecondition, match=f"has no level of {cases} cases"):
            library.bundle(family, params(family, "store"), cases=cases)


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_trivial_policies_score_low(family, target_name):
    env = make_env(family, target_name)
    for seed in SEEDS[:8]:
        env.reset(seed)
        env.step(MessageAction(NOOP_TEXT))
        while not env.done:  # the sequential user gives the next request; the no-op answers each alike
            env.step(MessageAction(NOOP_TEXT))
        assert env.reward() == 0.0
    rewards = [run_episode(env, RandomPolicy(i), seed, None).reward for i, seed in enumerate(SEEDS[:16])]
    assert statistics.fmean(rewards) <= 0.05 and max(rewards) < 1.0
    assert run_episode(env, noop_policy, SEEDS[0], None).reward == 0.0


# family -> the credit the intermediate step alone earns per case (it is then SHARE * credit, averaged
# with the plain requests' 0)
STEP_CREDIT = {"structured_data_reasoning": 0.3, "multi_step_task_completion": 0.3,
               "precondition_verification": 0.4, "tool_call_precision": 0.3}


def _step_only(env) -> list[dict]:
    """The skill's intermediate step for every case about an order (its lookup), then one closing
    message per user message."""
    acts = [{"name": "find_user_id_by_email", "arguments": {"email": env.inst.user.email}}]
    for case in env.inst.cases:
        if case.order_id:
            acts.append({"name": "get_order_details", "arguments": {"order_id": case.order_id}})
    return acts + [{"message": "Done."}] * len(env.inst.groups)


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_intermediate_step_alone_earns_partial_credit(family, target_name):
    env = make_env(family, target_name)
    for seed in SEEDS[:10]:
        env.reset(seed)
        stepped = sum(1 for case in env.inst.cases if case.order_id)
        reward = play(env, seed, _step_only(env))
        expected = env.share * STEP_CREDIT[family] * stepped / len(env.inst.requests)
        assert reward == pytest.approx(expected), (seed, env.reward_breakdown())


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_guidance_is_the_oracles_gold_actions_and_never_in_the_messages(family, target_name):
    env = make_env(family, target_name)
    hints = set()
    for seed in SEEDS[:6]:
        obs = env.reset(seed)
        gold = env.script(seed, skilled=True)
        assert obs.guidance == gold_actions_text(gold) and len(obs.guidance) <= 4000
        assert all(case.record in obs.guidance for case in env.inst.cases)  # concrete: names this instance
        hints.add(obs.guidance)
        env.reset(seed)
        seen = [m.content or "" for m in obs.messages]
        for action in gold:
            seen += [m.content or "" for m in env.step(action_from_dict(action)).observation]
        assert not any(obs.guidance in text for text in seen)
    assert len(hints) == 6


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_reset_is_deterministic_per_seed_and_instances_differ(family, target_name):
    a, b = make_env(family, target_name), make_env(family, target_name)
    for seed in SEEDS[:4]:
        oa, ob = a.reset(seed), b.reset(seed)
        assert oa == ob and a.script(seed, True) == b.script(seed, True)
        assert a.toolkit.user(a.db, a.inst.user.user_id) == b.toolkit.user(b.db, b.inst.user.user_id)
    assert len({a.reset(s).messages[-1].content for s in SEEDS[:10]}) == 10


@pytest.mark.parametrize("target_name", TARGET_NAMES)
def test_precondition_instances_keep_a_forbidden_write_and_blind_writes_fail(target_name):
    env = make_env("precondition_verification", target_name)
    allowed, blind = [], []
    for seed in range(500_000, 500_120):
        env.reset(seed)
        allowed += [c.facts["allowed"] for c in env.inst.cases]
        assert not all(c.facts["allowed"] for c in env.inst.cases)
        acts = []
        for req in env.inst.requests:  # every write made without a look, the plain requests as the oracle does
            acts += (env.write_with_confirm(req.gold or env.write_action(req, env.order0(req.order_id)))
                     if req.capability else env.plain_actions(req)[0])
        blind.append(play(env, seed, acts + [{"message": "Done."}] * len(env.inst.groups)))
        assert blind[-1] < 1.0
        assert "write_precondition_false" in [d["event"] for d in env.diagnostics()]
    assert 0.25 <= statistics.fmean(allowed) <= 0.5
    assert statistics.fmean(blind) <= 0.3


@pytest.mark.parametrize(("family", "target_name", "kinds"), [
    ("tool_call_precision", "store", ("cancel", "return", "exchange", "status")),
    ("tool_call_precision", "tau2-retail", ("cancel", "return", "exchange", "modify", "status", "order_address")),
    ("structured_data_reasoning", "store", ("cancel", "return", "exchange")),
    ("structured_data_reasoning", "tau2-retail", ("cancel", "return", "exchange", "modify")),
    ("precondition_verification", "store", ("cancel", "return", "exchange")),
    ("precondition_verification", "tau2-retail", ("cancel", "return", "exchange", "modify", "order_address")),
    ("multi_step_task_completion", "store", ("cancel", "return", "exchange", "status", "address")),
])
def test_capability_cases_take_every_kind_they_can_and_only_those(family, target_name, kinds):
    env = make_env(family, target_name)
    seen = set()
    for seed in range(500_000, 500_150):
        env.reset(seed)
        seen |= {c.kind for c in env.inst.cases}
    assert seen == set(kinds)


@pytest.mark.parametrize("target_name", TARGET_NAMES)
def test_record_selection_lists_a_lookalike_first(target_name):
    env = make_env("structured_data_reasoning", target_name)
    for seed in SEEDS[:20]:
        env.reset(seed)
        listed = env.toolkit.user(env.db, env.inst.user.user_id).orders
        for case in env.inst.cases:
            assert listed.index(case.facts["decoy_order_id"]) < listed.index(case.order_id)
            gold, decoy = env.order0(case.order_id), env.order0(case.facts["decoy_order_id"])
            assert gold.status == decoy.status
            g = next(i for i in gold.items if i.item_id == case.facts["item_id"])
            d = next(i for i in decoy.items if i.item_id == case.facts["decoy_item_id"])
            assert g.product_id == d.product_id and g.options != d.options
            assert env.toolkit.describe_item(g) in case.text


@pytest.mark.parametrize("target_name", TARGET_NAMES)
def test_loose_ids_get_the_targets_error_and_count_as_malformed(target_name):
    env = make_env("tool_call_precision", target_name)
    env.reset(SEEDS[0])
    oid = env.inst.cases[0].order_id
    loose = "W" + oid[2:]
    out = env.step(ToolAction(name="get_order_details", arguments={"order_id": loose}, call_id="c"))
    expected = {"store": f"Error: order_id '{loose}' is invalid", "tau2-retail": "Error: Order not found"}[target_name]
    assert out.observation[0].content.startswith(expected)
    assert env.diagnostics()[0]["event"] == "malformed_argument"


# -- calibration with the scripted skill mixture (validation's stand-in for the base agent) ---------

@cache
def _rewards(family: str, target_name: str, seeds: tuple[int, ...]) -> dict:
    """seed -> {skill flags per case: reward}: every script the mixtures below can play, played once."""
    env = make_env(family, target_name)
    out = {}
    for seed in seeds:
        env.reset(seed)
        n = len(env.inst.cases)  # at most 3: at most 8 scripts per seed
        table = {}
        for flags in itertools.product((False, True), repeat=n):
            env.reset(seed)
            table[flags] = play(env, seed, env.mixed(list(flags)))
        env.reset(seed)
        table["unskilled"] = play(env, seed, env.script(seed, skilled=False))
        out[seed] = table
    return out


def _mixture(family, target_name, p, group_size=8, per_case=False):
    """(mean reward, informative fraction) of the skill mixture at p over 20 dev seeds: per episode
    (ScriptedSkillFactory: the oracle in a stratified fraction p of a group's samples, the skill-less
    script elsewhere) or per case (each case shows the skill with probability p, independently)."""
    seeds = tuple(SEEDS[:20])
    rewards = _rewards(family, target_name, seeds)
    groups = []
    for seed in seeds:
        table = rewards[seed]
        n = len(next(k for k in table if k != "unskilled"))
        group = []
        for k in range(group_size):
            if per_case:
                flags = [int(hashlib.sha256(f"{seed}:{k}:{i}".encode()).hexdigest()[:8], 16) / 16**8 < p
                         for i in range(n)]
                if family == "multi_step_task_completion":
                    flags[0] = True  # without the skill the first request is still handled
                group.append(table[tuple(flags)])
            else:
                group.append(table[(True,) * n] if draw(seed, k, p) else table["unskilled"])
        groups.append(group)
    flat = [r for g in groups for r in g]
    return statistics.fmean(flat), sum(max(g) > min(g) for g in groups) / len(groups)


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_the_skill_mixture_calibrates_inside_the_default_band(family, target_name):
    for p in (0.2, 0.3, 0.4):
        mean, informative = _mixture(family, target_name, p)
        assert 0.2 <= mean <= 0.6 and informative >= 0.5, (p, mean, informative)
    assert _mixture(family, target_name, 0.7)[0] > 0.6  # the oracle's 1 in 70 % of samples: above the band


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_a_per_case_skill_mixture_calibrates_inside_the_default_band(family, target_name):
    for p in (0.4, 0.5):
        mean, informative = _mixture(family, target_name, p, per_case=True)
        assert 0.2 <= mean <= 0.6 and informative >= 0.5, (p, mean, informative)


# -- bundles ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_bundle_is_self_contained_and_passes_static_checks(family, target_name):
    source = bundled(family, target_name)
    check = static_check(source)
    assert check.passed, check.reason
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert not [m for m in imported if m.startswith("services")]  # no import of TRACE's service code
    toolkit = target(target_name).surface.toolkit
    assert toolkit.split(":")[0] in imported and not [m for m in imported if m.startswith("trace_common.domains")
                                                       and m != toolkit.split(":")[0]]
    sha = toolkit_sha256(toolkit)
    assert f"(module sha256 {sha})" in source
    assert sha == hashlib.sha256(Path(__import__(toolkit.split(":")[0], fromlist=["x"]).__file__).read_bytes()
                                 ).hexdigest()
    namespace: dict = {}
    exec(compile(source, "env.py", "exec"), namespace)  # trusted library code: fine in-process here
    env = namespace["ENVIRONMENT"]()
    assert play(env, SEEDS[1], namespace["solve"](SEEDS[1])) == 1.0
    assert namespace["TARGET"]["surface"]["name"] == target_name
    assert env.reset(SEEDS[1]) == make_env(family, target_name).reset(SEEDS[1])  # the same instance as in-process


@pytest.mark.parametrize(("texts", "value", "anchor", "expected"), [
    (["Refund 45.17 to card."], "45.17", None, True),
    (["Refund 145.17 to card."], "45.17", None, False),
    (["Order #W12345 is processed."], "processed", "12345", True),
    (["Order #W12345 is fine. It is processed."], "processed", "12345", False),
])
def test_told_semantics(texts, value, anchor, expected):
    assert kit.told(texts, value, anchor) is expected


def test_ids_in_openings_follow_the_target():
    for target_name, pattern in (("store", r"#W\d{5}\b"), ("tau2-retail", r"#W\d{7}\b")):
        env = make_env("multi_step_task_completion", target_name)
        ids = re.findall(r"#W\d+", env.reset(SEEDS[3]).messages[-1].content)
        assert ids and all(re.fullmatch(pattern, i) for i in ids)
