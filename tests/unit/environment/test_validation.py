"""Validation: every library environment is ACCEPTED for both targets with the default calibration
band; planted bad modules are REJECTED with the right reason; static checks and the surface check
(all of the target's tools, its system prompt verbatim, its greeting) as tables."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from services.environment import library
from services.environment.baseline_policies import ScriptedSkillFactory
from services.environment.validation import ValidationConfig, static_check, surface_check, validate

from .helpers import FAST, RESET_ANCHOR, SANDBOX, TARGET_NAMES, bundled, patched, target

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
    assert FAST.band == (0.2, 0.6) and FAST.min_informative == 0.5  # the defaults, not a lowered band
    assert [c.name for c in report.checks] == ["static", "loads", "surface", "deterministic", "oracle", "noop",
                                               "random", "calibration"]
    assert report.target["toolkit_sha256"] and report.target["toolkit"].endswith("record_toolkit:TOOLKIT")
    assert report.isolation["audit_hook"] and report.isolation["network"] in ("netns", "seccomp")
    assert report.calibration_policy == "scripted:skill-mixture@0.3"
    json.loads(report.to_json())  # the artifact is plain JSON


BASE = ("precondition_verification", "store")


KIT_SCHEMAS = '        return copy.deepcopy(self.surface["tool_schemas"])\n'
KIT_PROMPT = '        return self.surface["system_prompt"] + (f"\\n\\n{extra}" if extra else "")\n'


def _planted(name: str) -> str:
    src = bundled(*BASE)
    if name == "global_rng":
        return patched(src, RESET_ANCHOR, RESET_ANCHOR.replace("random.Random(seed)", "random.Random()"))
    if name == "hash_order":
        return patched(src, "else rng.choice(FORBIDDING[kind])",
                       "else sorted(set(FORBIDDING[kind]), key=hash)[rng.randrange(2)]")
    if name == "seed_ignored":
        return patched(src, RESET_ANCHOR, RESET_ANCHOR.replace("random.Random(seed)", "random.Random(0)"))
    if name == "missing_tool":
        return patched(src, KIT_SCHEMAS, KIT_SCHEMAS.replace(")\n", ")[:-1]\n"))
    if name == "renamed_tool":
        return patched(src, KIT_SCHEMAS, '        out = copy.deepcopy(self.surface["tool_schemas"])\n'
                       '        out[5]["function"]["name"] = "cancel_order"\n        return out\n')
    if name == "changed_schema":
        return patched(src, KIT_SCHEMAS, '        out = copy.deepcopy(self.surface["tool_schemas"])\n'
                       '        out[5]["function"]["parameters"]["properties"]["why"] = {"type": "string"}\n'
                       '        return out\n')
    if name == "rewritten_prompt":
        return patched(src, KIT_PROMPT, '        return "You are a helpful support agent. Cancel what the user asks."\n')
    if name == "long_addendum":
        return patched(src, KIT_PROMPT, '        return self.surface["system_prompt"] + "\\n\\n" + "Be careful. " * 60\n')
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
    if name == "runtime_escape":  # nothing the static check can see: the address-space limit stops it
        return src + "_solve = solve\n\n\ndef solve(seed):\n    hoard = bytearray(1 << 40)\n    return _solve(seed)\n"
    if name == "no_docstring":
        return patched(src, src.split('"""', 2)[1], "Short.")
    raise AssertionError(name)


PLANTED = [
    # name, the check that must fail, a substring of its reason
    ("global_rng", "deterministic", "differ"),
    ("hash_order", "deterministic", "differ"),
    ("seed_ignored", "deterministic", "same instance"),
    ("missing_tool", "surface", "missing the target's tool(s) modify_user_address"),
    ("renamed_tool", "surface", "cancel_order are not tools of store"),
    ("changed_schema", "surface", "the schema of cancel_pending_order differs"),
    ("rewritten_prompt", "surface", "does not start with store's system prompt verbatim"),
    ("long_addendum", "surface", "addendum after the target's system prompt has 722 characters (at most 600)"),
    ("unsolvable_oracle", "oracle", "oracle reached reward 0.20"),
    ("always_one", "noop", "noop policy scores mean 1.00"),
    ("unskilled_is_oracle", "calibration", "outside the band"),
    ("syntax_error", "static", "syntax error"),
    ("forbidden_import", "static", "import of socket is not allowed"),
    ("raises_on_load", "loads", "RuntimeError: boom at import"),
    ("runtime_escape", "deterministic", "sandbox violation (memory)"),
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


def _opening(target_name: str, prompt=None, greeting: str | None = "target") -> Callable[[], list[dict]]:
    """The opening messages, built when the test runs (the tau2 target reads its data then, or skips).
    `prompt`: the system prompt, or a function of the target's."""
    def build() -> list[dict]:
        info = target(target_name)
        system = info.system_prompt if prompt is None else prompt(info.system_prompt) if callable(prompt) else prompt
        messages = [{"role": "system", "content": system}]
        if greeting == "target" and info.greeting:
            messages.append({"role": "assistant", "content": info.greeting})
        elif greeting not in (None, "target"):
            messages.append({"role": "assistant", "content": greeting})
        return messages + [{"role": "user", "content": "Hi, please cancel order #W1234567."}]
    return build


def _schemas(target_name: str, change=None) -> Callable[[], list[dict]]:
    """The target's tool schemas (changed by `change`), built when the test runs."""
    def build() -> list[dict]:
        schemas = json.loads(json.dumps(target(target_name).tool_schemas))
        return change(schemas) if change else schemas
    return build


def _describe(schemas):
    schemas[3]["function"]["description"] = "Look an order up."
    return schemas


SURFACE_CASES = [
    # target, schemas, opening, passes, reason fragment
    ("store", _schemas("store"), _opening("store"), True, ""),
    ("tau2-retail", _schemas("tau2-retail"), _opening("tau2-retail"), True, ""),
    ("store", _schemas("store"), _opening("store", target("store").system_prompt + "\n\n" + "x" * 598), True, ""),
    ("store", _schemas("store", lambda s: s[:-1]), _opening("store"), False, "missing the target's tool(s) "
                                                                              "modify_user_address"),
    ("tau2-retail", _schemas("tau2-retail", lambda s: s[1:]), _opening("tau2-retail"), False,
     "missing the target's tool(s) calculate"),
    ("store", _schemas("store", _describe), _opening("store"), False, "the schema of get_order_details differs"),
    ("store", _schemas("store", lambda s: [*s, {"type": "function", "function": {"name": "refund_all"}}]),
     _opening("store"), False, "refund_all are not tools of store"),
    ("store", _schemas("store", lambda s: s[::-1]), _opening("store"), False, "not in the target's order"),
    ("store", _schemas("store"), _opening("store", "You are a helpful agent."), False,
     "does not start with store's system prompt verbatim"),
    ("tau2-retail", _schemas("tau2-retail"), _opening("tau2-retail", lambda p: "# Retail policy\n" + p),
     False, "does not start with tau2-retail's system prompt verbatim"),
    ("store", _schemas("store"), _opening("store", target("store").system_prompt + "x" * 601), False,
     "has 601 characters (at most 600)"),
    ("tau2-retail", _schemas("tau2-retail"), _opening("tau2-retail", greeting=None), False,
     "must open with tau2-retail's greeting 'Hi! How can I help you today?'"),
    ("store", _schemas("store"), _opening("store", greeting="Hello! What can I do for you?"), False,
     "store opens with the user's message"),
]


@pytest.mark.parametrize(("target_name", "schemas", "messages", "ok", "fragment"), SURFACE_CASES)
def test_surface_check(target_name, schemas, messages, ok, fragment):
    check = surface_check(schemas(), messages(), target(target_name), 600)
    assert check.passed is ok, check.reason
    assert fragment in check.reason


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"band": (0.6, 0.2)}, "band"),
    ({"max_addendum_chars": -1}, "max_addendum_chars"),
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
