"""Closest-name hints ("did you mean 'limit'?") for a mistyped field name or choice, and one-line
messages for pydantic validation errors that carry them.

A typo in a config is the commonest mistake a user makes, and pydantic's own message for it
("Extra inputs are not permitted") names the wrong key but not the right one. Every place that
validates user input against a pydantic model (the `tracectl run` config, the trainer's GRPO
configs, service specs) can turn its `ValidationError` into lines with `error_lines`, which walks
the model to the failing location and, for an unknown key or a value outside a `Literal`, adds
the closest valid name by `difflib` similarity (ratio >= 0.6, case-insensitive).

Semantics:
    closest(name, choices) = argmax_{c in choices, ratio(lower(c), lower(name)) >= 0.6} ratio(...)
                             (difflib.SequenceMatcher ratio; None when no choice reaches 0.6;
                              ties keep the first in `choices`)
    error_lines(err, model, prefix) = ["<prefix>.<loc>: <message>[; did you mean '<closest>'?]" per error,
                                       except "<f>: Field required" when an unknown key's closest name is f]
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

#: Lowest difflib ratio for a suggestion (difflib's own default): "limt" ~ "limit" 0.89,
#: "lerning_rate" ~ "learning_rate" 0.96, "limt" ~ "split" 0.67 (so the closer "limit" wins where
#: both exist), "limt" ~ "samples" 0.18 (never suggested).
CUTOFF = 0.6


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice most similar to `name` (see module Semantics), or None."""
    best, best_ratio = None, 0.0
    matcher = difflib.SequenceMatcher(b=str(name).lower())
    for choice in choices:
        matcher.set_seq1(str(choice).lower())
        ratio = matcher.ratio()
        if ratio >= CUTOFF and ratio > best_ratio:
            best, best_ratio = str(choice), ratio
    return best


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """"; did you mean 'limit'?" for the closest choice, "" when none is close."""
    best = closest(name, choices)
    return f"; did you mean {best!r}?" if best is not None and best != name else ""


def field_names(model: type[BaseModel]) -> list[str]:
    """Every key `model` accepts: its field names and their aliases."""
    names = list(model.model_fields)
    names += [f.alias for f in model.model_fields.values() if f.alias and f.alias not in names]
    return names


def _members(tp: Any) -> list[Any]:
    """The non-None members of an Optional / Union annotation (the annotation itself otherwise)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return [a for a in typing.get_args(tp) if a is not type(None)]
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    return [tp]


def _step(tp: Any, part: str | int) -> Any:
    """The annotation one location step below `tp` (a field of a model, an item of a list, a value
    of a dict), or None when the step cannot be followed (a union of several types)."""
    members = _members(tp)
    if len(members) != 1:
        return None
    tp = members[0]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(part))
        if field is None:
            field = next((f for f in tp.model_fields.values() if f.alias == part), None)
        return None if field is None else field.annotation
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple, set, frozenset) and isinstance(part, int) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def annotation_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> Any:
    """The annotation at pydantic location `loc` below `model` (None where it cannot be followed)."""
    tp: Any = model
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return None
    return tp


def suggestion(error: dict[str, Any], model: type[BaseModel]) -> str | None:
    """The closest valid name for one pydantic error dict: for an unknown key, the nearest field of
    the model it is in; for a value outside a Literal, the nearest allowed value; else None."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "extra_forbidden" and loc:
        parent = _members(annotation_at(model, loc[:-1]))
        if len(parent) == 1 and isinstance(parent[0], type) and issubclass(parent[0], BaseModel):
            return closest(str(loc[-1]), [n for n in field_names(parent[0]) if n != loc[-1]])
    if error.get("type") == "literal_error" and isinstance(error.get("input"), str):
        allowed = [a for m in _members(annotation_at(model, loc)) if typing.get_origin(m) is Literal
                   for a in typing.get_args(m)]
        return closest(error["input"], [str(a) for a in allowed if str(a) != error["input"]])
    return None


def hint(error: dict[str, Any], model: type[BaseModel]) -> str:
    """"; did you mean '<suggestion>'?" for one pydantic error dict, "" when there is none."""
    best = suggestion(error, model)
    return f"; did you mean {best!r}?" if best is not None else ""


def dotted(prefix: str, loc: Iterable[str | int]) -> str:
    """A pydantic location as the user writes it: ("evaluation", "arms", 1) -> "evaluation.arms[1]"."""
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def error_line(error: dict[str, Any], model: type[BaseModel], prefix: str = "") -> str:
    """One pydantic error dict as a line: the dotted location under `prefix`, pydantic's message
    without its "Value error, " prefix ("unknown field" for an unknown key), and the hint."""
    where = dotted(prefix, error.get("loc", ())) or "(top level)"
    msg = error.get("msg", "invalid").removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        msg = "unknown field"
    return f"{where}: {msg}{hint(error, model)}"


def error_lines(err: ValidationError, model: type[BaseModel], prefix: str = "", limit: int = 10) -> list[str]:
    """`error_line` for each error of `err` (at most `limit`, then a count of the rest). A required
    field reported missing is left out when an unknown key of the same model is its misspelling
    ("modle" for "model": one mistake, one line)."""
    errors = err.errors()
    misspelt = {(*tuple(e["loc"])[:-1], best) for e in errors
                if e.get("type") == "extra_forbidden" and (best := suggestion(e, model)) is not None}
    errors = [e for e in errors if not (e.get("type") == "missing" and tuple(e["loc"]) in misspelt)]
    lines = [error_line(e, model, prefix) for e in errors[:limit]]
    if len(errors) > limit:
        lines.append(f"... and {len(errors) - limit} more")
    return lines
