"""Validation: every library environment is ACCEPTED for both targets; planted bad modules are
REJECTED with the right reason; static checks and tool-shape checks as tables."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from services.environment import library
from services.environment.baseline_policies import ScriptedSkillFactory
from services.environment.validation import ValidationConfig, static_check, tool_check, validate

from .helpers import FAST, SANDBOX, TARGET_NAMES, bundled, patched, target

EVIL = Path("/tmp") / f"trace-validation-evil-{uuid.uuid4().hex}"


@pytest.mark.parametrize("target_name", TARGET_NAMES)
@pytest.mark.parametrize("family", library.FAMILIES)
def test_library_environment_is_accepted(family, target_name):
    report = validate(bundled(family, target_name), target(target_name), FAST, SANDBOX, ScriptedSkillFactory(0.3),
                      label=family)
    assert report.status == "ACCEPTED", report.reasons
    n = report.numbers
    assert n["oracle_mean"] == 1.0 and n["noop_mean"] <= 0.1 and n["random_mean"] <= 0.25
    assert 0.2 <= n["calibration_mean"] <= 0.6 and n["informative_fraction"] >= 0.5
    assert [c.name for c in report.checks] == ["static", "loads", "tools", "deterministic", "oracle", "noop",
                                               "random", "calibration"]
    assert report.isolation["audit_hook"] and report.isolation["network"] in ("netns", "seccomp")
    assert report.calibration_policy == "scripted:skill-mixture@0.3"
    json.loads(report.to_json())  # the artifact is plain JSON


BASE = ("precondition_verification", "store")


def _planted(name: str) -> str:
    src = bundled(*BASE)
    if name == "global_rng":
        return patched(src, "rng = random.Random(seed)\n        world", "rng = random.Random()\n        world")
    if name == "hash_order":
        return patched(src, 'rng.choice(("processed", "delivered", "cancelled"))',
                       'sorted({"processed", "delivered", "cancelled"}, key=hash)[rng.randrange(3)]')
    if name == "seed_ignored":
        return patched(src, "rng = random.Random(seed)\n        world", "rng = random.Random(0)\n        world")
    if name == "wrong_tool_name":
        return src + 'TARGET["tools"]["cancel"]["function"]["name"] = "cancel_order"\n'
    if name == "wrong_argument":
        return src + 'TARGET["tools"]["cancel"]["function"]["parameters"]["properties"]["why"] = {"type": "string"}\n'
    if name == "unsolvable_oracle":
        return src + '_solve = solve\n\n\ndef solve(seed):\n    return [a for a in _solve(seed) if "message" not in a]\n'
    if name == "always_one":
        return src + "PreconditionVerificationEnv.reward = lambda self: 1.0\n"
    if name == "unskilled_is_oracle":
        return src + "solve_unskilled = solve\n"
    if name == "syntax_error":
        return src + "def broken(:\n    pass\n"
    if name == "forbidden_import":
        return patched(src, "import copy\n", "import copy\nimport socket\n")
    if name == "raises_on_load":
        return src + "raise RuntimeError('boom at import')\n"
    if name == "runtime_escape":
        return src + (f'_solve = solve\n\n\ndef solve(seed):\n    __builtins__["open"]("{EVIL}", "w")\n'
                      "    return _solve(seed)\n")
    if name == "no_docstring":
        return patched(src, src.split('"""', 2)[1], "Short.")
    raise AssertionError(name)


PLANTED = [
    # name, the check that must fail, a substring of its reason
    ("global_rng", "deterministic", "differ"),
    ("hash_order", "deterministic", "differ"),
    ("seed_ignored", "deterministic", "same instance"),
    ("wrong_tool_name", "tools", "'cancel_order' is not a tool of store"),
    ("wrong_argument", "tools", "argument 'why' is not an argument"),
    ("unsolvable_oracle", "oracle", "oracle reached reward 0.40"),
    ("always_one", "noop", "noop policy scores mean 1.00"),
    ("unskilled_is_oracle", "calibration", "outside the band"),
    ("syntax_error", "static", "syntax error"),
    ("forbidden_import", "static", "import of socket is not allowed"),
    ("raises_on_load", "loads", "RuntimeError: boom at import"),
    ("runtime_escape", "deterministic", "sandbox violation (filesystem)"),
    ("no_docstring", "static", "docstring has 6 characters"),
]


@pytest.mark.parametrize(("name", "failed", "reason"), PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bad_module_is_rejected_with_the_right_reason(name, failed, reason):
    report = validate(_planted(name), target(BASE[1]), FAST, SANDBOX, ScriptedSkillFactory(0.3), label=name)
    assert report.status == "REJECTED"
    failing = {c.name: c.reason for c in report.checks if not c.passed}
    assert failed in failing, (failing, report.reasons)
    assert reason in failing[failed], failing[failed]
    assert any(r.startswith(f"{failed}: ") for r in report.reasons)
    assert not EVIL.exists()


def test_always_one_also_fails_random_and_calibration():
    report = validate(_planted("always_one"), target(BASE[1]), FAST, SANDBOX, ScriptedSkillFactory(0.3))
    failing = {c.name for c in report.checks if not c.passed}
    assert {"noop", "random", "calibration"} <= failing
    assert report.numbers["informative_fraction"] == 0.0


def test_no_calibration_policy_is_a_failed_check():
    report = validate(bundled(*BASE), target(BASE[1]), FAST, SANDBOX, None)
    assert report.status == "REJECTED" and report.reasons == ["calibration: no calibration policy configured"]


@pytest.mark.parametrize(("source", "ok", "fragment"), [
    ('"""' + "d" * 200 + '"""\nimport json\nfrom trace_common.env import Environment\ndef solve(seed):\n    return []\n',
     True, ""),
    ('"""' + "d" * 200 + '"""\nimport os\ndef solve(seed):\n    return []\n', False, "import of os"),
    ('"""' + "d" * 200 + '"""\nfrom subprocess import run\ndef solve(seed):\n    return []\n', False,
     "import from subprocess"),
    ('"""' + "d" * 200 + '"""\nfrom . import x\ndef solve(seed):\n    return []\n', False, "relative imports"),
    ('"""' + "d" * 200 + '"""\ndef solve(seed):\n    return eval("[]")\n', False, "call of eval()"),
    ('"""' + "d" * 200 + '"""\ndef solve(seed):\n    return ().__class__.__subclasses__()\n', False,
     "access to __subclasses__"),
    ('"""' + "d" * 200 + '"""\nx = 1\n', False, "no module-level function solve"),
    ('"""short"""\ndef solve(seed):\n    return []\n', False, "docstring has 5 characters"),
])
def test_static_check(source, ok, fragment):
    check = static_check(source)
    assert check.passed is ok and fragment in check.reason


def _schema(name: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props,
                                                                        "required": required}}}


S = {"type": "string"}


@pytest.mark.parametrize(("schemas", "ok", "fragment"), [
    ([_schema("get_order_details", {"order_id": S}, ["order_id"]),
      _schema("find_user_id_by_email", {"email": S}, ["email"]),
      _schema("cancel_pending_order", {"order_id": S, "reason": S}, ["order_id", "reason"])], True, ""),
    ([_schema("get_order_details", {"order_id": S}, ["order_id"]),
      _schema("find_user_id_by_email", {"email": S}, ["email"]),
      _schema("cancel_pending_order", {"order_id": S}, ["order_id"])], False, "lacks the target's required"),
    ([_schema("get_order_details", {"order_id": {"type": "integer"}}, ["order_id"]),
      _schema("find_user_id_by_email", {"email": S}, ["email"]),
      _schema("cancel_pending_order", {"order_id": S, "reason": S}, [])], False, "type 'integer' differs"),
    ([_schema("get_order_details", {"order_id": S}, ["order_id"])], False, "1 tools; reuse between 3 and 5"),
    ([_schema("get_order_details", {"order_id": S}, ["order_id"])] * 3, False, "appears twice"),
    ([{"name": "not_openai"}] * 3, False, "not an OpenAI function schema"),
])
def test_tool_check(schemas, ok, fragment):
    check = tool_check(schemas, target("store"), 3, 5)
    assert check.passed is ok and fragment in check.reason


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"band": (0.6, 0.2)}, "band"),
    ({"min_tools": 6, "max_tools": 5}, "min_tools"),
])
def test_validation_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ValidationConfig(**kwargs)


@pytest.mark.parametrize("spec_fields, band, min_informative", [
    ({}, (0.2, 0.6), 0.5),                                            # unset: the service's defaults
    ({"calibration_reward_min": 0.001, "calibration_min_informative": 0.0}, (0.001, 0.6), 0.0),
    ({"calibration_reward_max": 0.9, "calibration_min_informative": 0.75}, (0.2, 0.9), 0.75),
])
def test_generation_spec_sets_the_calibration_thresholds(spec_fields, band, min_informative):
    from services.environment.settings import EnvironmentSettings
    from services.environment.specs import GenerationSpecModel

    spec = GenerationSpecModel.model_validate({"capabilities": [{"name": "tool_call_precision"}],
                                               "target": {"name": "store"}, "mode": "GENERATION_MODE_LIBRARY",
                                               **spec_fields})
    cfg = EnvironmentSettings().validation_config(band=spec.band, seed=spec.seed,
                                                  min_informative=spec.calibration_min_informative)
    assert cfg.band == band and cfg.min_informative == min_informative
