"""JSON schemas of the analyst's replies and the validation that turns a reply into data.

A reply is accepted only if (1) it parses as one JSON object, (2) it satisfies the JSON schema
built for *this* request (for labeling: `ref` is the constant asked for, `capability` is an
enum of this request's candidates, `labels` has exactly one entry per candidate), and (3) the
checks a schema cannot express hold (unique names, evidence on non-NA labels). Any failure
raises `ReplyInvalid` whose message is fed back to the model on a retry, so it must say what
to change.

This is the only way a label enters the analysis: labels are keyed by the (trajectory,
capability) pair the request asked about, never by anything the reply claims beyond the
schema.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from .compaction import one_line
from .stats import Label

SNAKE_RE = r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$"
MAX_EVIDENCE = 200
_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.S)
_THINK = re.compile(r"\A\s*<think>.*?</think>", re.S)


class ReplyInvalid(ValueError):
    """The model's reply is not acceptable; `kind` is 'invalid_json' or 'schema_error'."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def discovery_schema(max_candidates: int) -> dict[str, Any]:
    return {
        "type": "object", "additionalProperties": False, "required": ["capabilities"],
        "properties": {"capabilities": {
            "type": "array", "minItems": 1, "maxItems": max_candidates,
            "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "description", "example_task_ids"],
                "properties": {
                    "name": {"type": "string", "pattern": SNAKE_RE, "maxLength": 64},
                    "description": {"type": "string", "minLength": 10, "maxLength": 600},
                    "example_task_ids": {"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 80}},
                },
            },
        }},
    }


def label_schema(ref: str, capability_names: list[str]) -> dict[str, Any]:
    n = len(capability_names)
    return {
        "type": "object", "additionalProperties": False, "required": ["ref", "labels"],
        "properties": {
            "ref": {"const": ref},
            "labels": {
                "type": "array", "minItems": n, "maxItems": n,
                "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["capability", "label", "evidence"],
                    "properties": {
                        "capability": {"enum": list(capability_names)},
                        "label": {"enum": [lb.value for lb in Label]},
                        "evidence": {"type": "string", "maxLength": 400},
                    },
                },
            },
        },
    }


def parse_json_object(text: str) -> dict[str, Any]:
    """The reply as a JSON object; tolerates surrounding whitespace, a ```json fence and a
    leading <think> block (reasoning models), nothing else."""
    body = _THINK.sub("", text or "").strip()
    m = _FENCE.match(body)
    if m:
        body = m.group(1)
    if not body:
        raise ReplyInvalid("invalid_json", "the reply was empty; reply with one JSON object")
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        raise ReplyInvalid("invalid_json", f"the reply is not valid JSON ({err.msg} at line {err.lineno} "
                           f"column {err.colno}); reply with one JSON object and nothing else") from None
    if not isinstance(data, dict):
        raise ReplyInvalid("invalid_json", f"the reply is JSON but a {type(data).__name__}, not an object; "
                           "reply with one JSON object")
    return data


def _describe(e: jsonschema.ValidationError) -> str:
    """jsonschema's message, or -- when it would echo a long value back -- the rule broken."""
    if len(e.message) <= 200:
        return e.message
    return f"the value breaks the schema rule {e.validator}={json.dumps(e.validator_value)[:120]}"


def check_schema(data: dict[str, Any], schema: dict[str, Any]) -> None:
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        shown = "; ".join(f"at {'/'.join(map(str, e.path)) or '(root)'}: {_describe(e)}" for e in errors[:5])
        raise ReplyInvalid("schema_error", f"the reply does not match the schema: {shown}")


@dataclass(frozen=True)
class Candidate:
    """A capability proposed by discovery (or, in diagnostics mode, named by the environment)."""

    name: str
    description: str
    example_task_ids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "example_task_ids": list(self.example_task_ids)}


def validate_discovery(data: dict[str, Any], max_candidates: int, shown_task_ids: set[str]
                       ) -> tuple[list[Candidate], list[str]]:
    """Candidates from a discovery reply, plus warnings (example ids that were not shown are
    dropped with a warning rather than failing the run: they do not affect any statistic)."""
    check_schema(data, discovery_schema(max_candidates))
    names = [c["name"] for c in data["capabilities"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ReplyInvalid("schema_error", f"capability names must be unique; repeated: {dupes}")
    warnings: list[str] = []
    out = []
    for c in data["capabilities"]:
        ids = [t for t in c["example_task_ids"] if t in shown_task_ids]
        if len(ids) != len(c["example_task_ids"]):
            unknown = [t for t in c["example_task_ids"] if t not in shown_task_ids]
            warnings.append(f"discovery: dropped example_task_ids of {c['name']} that were not shown: "
                            f"{unknown[:5]}")
        out.append(Candidate(c["name"], one_line(c["description"]), tuple(dict.fromkeys(ids))))
    return out, warnings


@dataclass(frozen=True)
class PairLabel:
    label: Label
    evidence: str


def validate_labels(data: dict[str, Any], ref: str, capability_names: list[str]) -> dict[str, PairLabel]:
    """{capability: PairLabel} for exactly the capabilities asked, from a labeling reply."""
    check_schema(data, label_schema(ref, capability_names))
    seen = [item["capability"] for item in data["labels"]]
    missing = [c for c in capability_names if c not in seen]
    if missing:
        dupes = sorted({c for c in seen if seen.count(c) > 1})
        raise ReplyInvalid("schema_error", f"every capability needs exactly one label; missing {missing}"
                           + (f", repeated {dupes}" if dupes else ""))
    out: dict[str, PairLabel] = {}
    for item in data["labels"]:
        label = Label(item["label"])
        evidence = one_line(item["evidence"])
        if label is not Label.NA and not evidence:
            raise ReplyInvalid("schema_error", f"label {label.value} for {item['capability']} needs a one-line "
                               "evidence quote from the episode")
        if len(evidence) > MAX_EVIDENCE:
            evidence = evidence[:MAX_EVIDENCE - 3] + "..."
        out[item["capability"]] = PairLabel(label, evidence)
    return out
