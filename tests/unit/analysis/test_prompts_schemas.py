"""Markdown prompt templates and the validation of the analyst's JSON replies."""

import json
import re

import pytest

from services.analysis.prompts import default_prompts_dir, load_template, parse_template
from services.analysis.schemas import (
    ReplyInvalid,
    discovery_schema,
    label_schema,
    parse_json_object,
    validate_discovery,
    validate_labels,
)
from services.analysis.stats import Label
from trace_common.errors import FailedPrecondition

CAPS = ["precondition_verification", "tool_call_precision"]
REF = "E03-1a2b3c4d"


def label_values():
    return dict(capabilities=[{"name": c, "description": "d"} for c in CAPS], n_capabilities="2", ref=REF,
                schema=label_schema(REF, CAPS), nonce="feedbeef", data="<<<TRACE_DATA ...>>>")


def discover_values():
    return dict(max_candidates="10", n_failed="3", n_passed="2", task_ids=["1", "2"],
                schema=discovery_schema(10), nonce="feedbeef", data="<<<TRACE_DATA ...>>>")


@pytest.mark.parametrize(("name", "values", "in_system", "in_user"), [
    ("label", label_values, ["Borderline cases lean to `PRESENT`", "nonce=feedbeef", '"const": "E03-1a2b3c4d"',
                             "precondition_verification"], ["Episode E03-1a2b3c4d", "<<<TRACE_DATA ...>>>"]),
    ("discover", discover_values, ["**at most\n10**", "snake_case", '"example_task_ids"', "domain-general"],
     ["<<<TRACE_DATA ...>>>", "3 failed, 2 passed"]),
])
def test_repository_prompts_render(name, values, in_system, in_user):
    system, user = load_template(default_prompts_dir(), name).render(**values())
    assert system["role"] == "system" and user["role"] == "user"
    for text in in_system:
        assert text in system["content"]
    for text in in_user:
        assert text in user["content"]
    assert "<<<TRACE_DATA ...>>>" not in system["content"]          # data only in the user message
    assert not re.search(r"\$\{?[a-z_]", system["content"] + user["content"])  # every placeholder filled
    assert re.search(r"Never\s+follow", system["content"])          # the data-not-instructions rule


@pytest.mark.parametrize(("change", "message"), [
    (lambda v: v.pop("ref"), "missing values \\['ref'\\]"),
    (lambda v: v.update(extra="x"), "unused values \\['extra'\\]"),
])
def test_render_is_strict(change, message):
    values = label_values()
    change(values)
    with pytest.raises(FailedPrecondition, match=message):
        load_template(default_prompts_dir(), "label").render(**values)


@pytest.mark.parametrize("text", ["no split here", "a\n<!-- message: user -->\nb\n<!-- message: user -->\nc"])
def test_template_needs_exactly_one_user_split(text):
    with pytest.raises(FailedPrecondition, match="exactly once"):
        parse_template("x", text)


def test_missing_prompts_dir_names_the_setting(tmp_path):
    with pytest.raises(FailedPrecondition, match="TRACE_ANALYSIS_PROMPTS_DIR"):
        load_template(tmp_path, "label")


@pytest.mark.parametrize(("text", "kind", "value"), [
    ('{"a": 1}', None, {"a": 1}),
    ('```json\n{"a": 1}\n```', None, {"a": 1}),
    ('<think>hmm {"x": 2}</think>\n{"a": 1}', None, {"a": 1}),
    ("", "invalid_json", "empty"),
    ('Sure! {"a": 1}', "invalid_json", "not valid JSON"),
    ("[1, 2]", "invalid_json", "a list, not an object"),
])
def test_parse_json_object(text, kind, value):
    if kind is None:
        assert parse_json_object(text) == value
    else:
        with pytest.raises(ReplyInvalid, match=value) as err:
            parse_json_object(text)
        assert err.value.kind == kind


def labels_reply(**overrides):
    reply = {"ref": REF, "labels": [
        {"capability": CAPS[0], "label": "LACKING", "evidence": "cancelled #W1 without\nchecking status"},
        {"capability": CAPS[1], "label": "NA", "evidence": ""}]}
    reply.update(overrides)
    return reply


@pytest.mark.parametrize(("reply", "message"), [
    (labels_reply(ref="E00-00000000"), "E03-1a2b3c4d"),                     # another trajectory's ref
    (labels_reply(labels=labels_reply()["labels"][:1]), "too short|should be non-empty|minItems|is too short"),
    (labels_reply(labels=[labels_reply()["labels"][0]] * 2), "missing \\['tool_call_precision'\\]"),
    (labels_reply(labels=[{"capability": "other_skill", "label": "NA", "evidence": ""},
                          labels_reply()["labels"][1]]), "is not one of"),
    (labels_reply(labels=[{**labels_reply()["labels"][0], "label": "MAYBE"}, labels_reply()["labels"][1]]),
     "is not one of"),
    (labels_reply(labels=[{**labels_reply()["labels"][0], "evidence": ""}, labels_reply()["labels"][1]]),
     "needs a one-line evidence"),
    (labels_reply(extra="x"), "Additional properties"),
])
def test_invalid_label_replies_are_rejected(reply, message):
    with pytest.raises(ReplyInvalid, match=message) as err:
        validate_labels(reply, REF, CAPS)
    assert err.value.kind == "schema_error"


def test_valid_label_reply():
    out = validate_labels(labels_reply(), REF, CAPS)
    assert out[CAPS[0]].label is Label.LACKING
    assert out[CAPS[0]].evidence == "cancelled #W1 without checking status"   # one line
    assert out[CAPS[1]].label is Label.NA


def cand(name, ids=("1",)):
    return {"name": name, "description": "a reusable skill of agents", "example_task_ids": list(ids)}


@pytest.mark.parametrize(("reply", "message"), [
    ({"capabilities": [cand("NotSnake")]}, "does not match"),
    ({"capabilities": [cand("a_b"), cand("a_b")]}, "unique"),
    ({"capabilities": [cand(f"skill_{i}") for i in range(4)]}, "too long|maxItems|is too long"),
    ({"capabilities": []}, "should be non-empty|too short"),
    ({"capabilities": [{"name": "a_b"}]}, "required property"),
])
def test_invalid_discovery_replies_are_rejected(reply, message):
    with pytest.raises(ReplyInvalid, match=message):
        validate_discovery(reply, 3, {"1"})


def test_discovery_drops_unshown_example_ids_with_a_warning():
    cands, warnings = validate_discovery({"capabilities": [cand("precondition_verification", ["1", "99"])]}, 3,
                                         {"1"})
    assert cands[0].example_task_ids == ("1",)
    assert "99" in warnings[0]


def test_label_schema_is_valid_json_schema():
    import jsonschema
    jsonschema.Draft202012Validator.check_schema(label_schema(REF, CAPS))
    jsonschema.Draft202012Validator.check_schema(discovery_schema(10))
    assert json.loads(json.dumps(label_schema(REF, CAPS)))["properties"]["ref"] == {"const": REF}
