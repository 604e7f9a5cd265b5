"""The reference environments, in-process, for both targets: contract, oracle, skill gap, balance,
partial credit for the intermediate step, target-shaped tools/ids/prompts, self-contained bundles."""

from __future__ import annotations

import ast
import re
import statistics

import pytest

from services.environment import library
from services.environment.library import kit
from services.environment.validation import static_check
from tests.unit.env.contract import check_environment_contract
from trace_common.env import MessageAction

from .helpers import TARGET_NAMES, bundled, make_env, play, target

CASES = [(f, t) for f in library.FAMILIES for t in TARGET_NAMES]
SEEDS = list(range(500_000, 500_040))

#: family -> (lowest, highest) mean reward of the module's skill-less script over SEEDS
UNSKILLED_MEAN = {"structured_data_reasoning": (0.0, 0.2), "multi_step_task_completion": (0.3, 0.37),
                  "precondition_verification": (0.15, 0.45), "tool_call_precision": (0.0, 0.0)}


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_environment_contract(family, target_name):
    check_environment_contract(lambda: make_env(family, target_name), SEEDS[:5])


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_oracle_reaches_one_and_the_skillless_script_does_not(family, target_name):
    env = make_env(family, target_name)
    module = __import__(f"services.environment.library.{family}", fromlist=["x"])
    unskilled = []
    for seed in SEEDS:
        assert play(env, seed, env.script(seed, skilled=True)) == 1.0, (seed, env.failure_reason())
        assert env.done and env.diagnostics() == [] or family == "multi_step_task_completion"
        unskilled.append(play(env, seed, env.script(seed, skilled=False)))
    lo, hi = UNSKILLED_MEAN[family]
    assert lo <= statistics.fmean(unskilled) <= hi
    assert max(unskilled) <= 1.0 and min(unskilled) < 1.0
    # the module-level functions the sandbox uses agree with the class
    module.TARGET = env.target
    try:
        assert module.solve(SEEDS[0]) == env.script(SEEDS[0], skilled=True)
    finally:
        module.TARGET = None


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_doing_nothing_scores_zero(family, target_name):
    env = make_env(family, target_name)
    for seed in SEEDS[:10]:
        env.reset(seed)
        env.step(MessageAction("I'm sorry, I can't help with that."))
        assert env.done and env.reward() == 0.0


# family -> (actions that perform only the skill's intermediate step, the partial credit they earn)
def _lookup_only(env):
    gold = env.inst.gold
    if "parts" in gold:
        return [env.act("get_order", order_id=p["order_id"]) for p in gold["parts"]], 0.3
    credit = {"precondition_verification": 0.4}.get(env.capability, 0.3)
    return [env.act("get_order", order_id=gold["order_id"])], credit


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_intermediate_step_alone_earns_partial_credit(family, target_name):
    env = make_env(family, target_name)
    for seed in SEEDS[:10]:
        env.reset(seed)
        actions, credit = _lookup_only(env)
        reward = play(env, seed, [*actions, {"message": "Done."}])
        assert reward == pytest.approx(credit), (seed, env.reward_breakdown())


def test_precondition_instances_are_balanced_and_blind_cancel_fails_on_the_others():
    env = make_env("precondition_verification", "store")
    pending, blind = [], []
    for seed in range(500_000, 500_200):
        env.reset(seed)
        gold = env.inst.gold
        pending.append(gold["status"] == "pending")
        blind.append(play(env, seed, [env.act("cancel", order_id=gold["order_id"], reason=gold["reason"]),
                                      {"message": f"Done, refund {gold.get('refund')}."}]))
        if gold["status"] != "pending":
            assert blind[-1] == 0.0
            assert [d["event"] for d in env.diagnostics()] == ["write_precondition_false"]
    assert 0.4 <= statistics.fmean(pending) <= 0.6
    assert statistics.fmean(blind) <= 0.35


@pytest.mark.parametrize(("family", "key", "values"), [
    ("tool_call_precision", "kind", ("cancel", "return", "status")),
    ("structured_data_reasoning", "action", ("cancel", "return")),
])
def test_request_kinds_are_balanced(family, key, values):
    env = make_env(family, "store")
    seen = []
    for seed in range(500_000, 500_300):
        env.reset(seed)
        seen.append(env.inst.gold[key])
    for value in values:
        assert abs(seen.count(value) / len(seen) - 1 / len(values)) < 0.1, (value, seen.count(value))


def test_record_selection_lookalike_usually_listed_first():
    env = make_env("structured_data_reasoning", "store")
    first_is_gold = 0
    for seed in range(500_000, 500_300):
        env.reset(seed)
        gold = env.inst.gold
        product_orders = [o for o in env.inst.user["orders"]
                          if any(r["name"] == gold["product"] for r in env.inst.db["orders"][o]["items"])
                          and env.inst.db["orders"][o]["status"] != "processed"]
        first_is_gold += product_orders[0] == gold["order_id"]
    assert first_is_gold / 300 < 0.15


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_tools_are_the_targets_own_schemas(family, target_name):
    env = make_env(family, target_name)
    info = target(target_name)
    schemas = env.tool_schemas()
    assert 3 <= len(schemas) <= 5
    for schema in schemas:
        assert schema == info.schema(schema["function"]["name"])


@pytest.mark.parametrize(("target_name", "order_re", "system_start", "greeting"), [
    ("store", r"#W\d{5}\b", "# ", None),
    ("tau2-retail", r"#W\d{7}\b", "<instructions>", "Hi! How can I help you today?"),
])
@pytest.mark.parametrize("family", library.FAMILIES)
def test_ids_and_prompt_follow_the_target(family, target_name, order_re, system_start, greeting):
    env = make_env(family, target_name)
    obs = env.reset(SEEDS[3])
    assert obs.messages[0].content.startswith(system_start)
    assert (obs.messages[1].content if greeting else None) == greeting
    ids = re.findall(r"#W\d+", obs.messages[-1].content + " ".join(
        a.get("arguments", {}).get("order_id", "") for a in env.oracle()))
    assert ids and all(re.fullmatch(order_re, i) for i in ids)


@pytest.mark.parametrize(("target_name", "output_check"), [
    ("store", lambda text: text.startswith("order #W")),
    ("tau2-retail", lambda text: text.startswith("{") and '"order_id"' in text),
])
def test_tool_outputs_follow_the_targets_style(target_name, output_check):
    env = make_env("precondition_verification", target_name)
    env.reset(SEEDS[0])
    oid = env.inst.gold["order_id"]
    result = env.step(__import__("trace_common.env", fromlist=["x"]).ToolAction(
        name="get_order_details", arguments={"order_id": oid}, call_id="c1"))
    assert output_check(result.observation[0].content)


@pytest.mark.parametrize(("target_name", "loose", "error"), [
    ("store", "W12345", "Error: order_id 'W12345' is invalid"),
    ("tau2-retail", "W1234567", "Error: Order not found"),
])
def test_loose_ids_get_the_targets_error_and_count_as_malformed(target_name, loose, error):
    from trace_common.env import ToolAction

    env = make_env("tool_call_precision", target_name)
    env.reset(SEEDS[0])
    out = env.step(ToolAction(name="get_order_details", arguments={"order_id": loose}, call_id="c"))
    assert out.observation[0].content.startswith(error)
    assert env.diagnostics()[0]["event"] == "malformed_argument"


@pytest.mark.parametrize(("family", "target_name"), CASES)
def test_bundle_is_self_contained_and_passes_static_checks(family, target_name):
    source = bundled(family, target_name)
    check = static_check(source)
    assert check.passed, check.reason
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert not [m for m in imported if m.startswith("services")]  # no import of TRACE's service code
    namespace: dict = {}
    exec(compile(source, "env.py", "exec"), namespace)  # trusted library code: fine in-process here
    env = namespace["ENVIRONMENT"]()
    assert play(env, SEEDS[1], namespace["solve"](SEEDS[1])) == 1.0
    assert namespace["TARGET"]["name"] == target_name


def test_kit_money_and_told_semantics():
    assert kit.money(4517) == "45.17" and kit.money(5) == "0.05"
    assert kit.told(["Refund 45.17 to card."], "45.17")
    assert not kit.told(["Refund 145.17 to card."], "45.17")
    assert kit.told(["Order #W12345 is processed."], "processed", anchor="12345")
    assert not kit.told(["Order #W12345 is fine. It is processed."], "processed", anchor="12345")
