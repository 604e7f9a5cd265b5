"""Reading the files a user hands tracectl: run configs (YAML), GRPO configs and chat messages
(JSON), rollout trajectories (JSONL).

Each reader returns the parsed value or raises `InvalidArgument` with one line that names the
flag and the file and says what is wrong and what was expected: unreadable (missing, a
directory, no permission), binary (NUL bytes), not UTF-8 (the first bad byte and its offset),
empty, not parseable (line and column), or of the wrong shape (a list where a mapping belongs).
`tracectl.cli` turns that into exit status 2 (tracectl/exits.py), so a bad file never shows a
traceback and nothing is started.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trace_common.errors import InvalidArgument
from trace_common.suggest import error_lines

_KINDS = {dict: "a mapping", list: "a list", str: "a string", int: "a number", float: "a number", bool: "true/false"}


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    shown = repr(value)
    return f"{_KINDS.get(type(value), type(value).__name__)} ({shown[:40] + '...' if len(shown) > 40 else shown})"


def _bad(what: str, path: Path, reason: str, fix: str = "") -> InvalidArgument:
    return InvalidArgument(reason, field=f"{what} {path}", fix=fix or None)


def read_text(path: Path, what: str, fix: str = "") -> str:
    """The file's text; `what` names it in messages (the flag, e.g. "--config")."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise _bad(what, path, f"cannot read it ({err.strerror or type(err).__name__})", fix) from None
    nul = data.find(b"\x00")
    if nul >= 0:
        raise _bad(what, path, f"a binary file (NUL byte at offset {nul}), not text", fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _bad(what, path, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})", fix) from None


def read_json(path: Path, what: str, expected: type, fix: str = "") -> Any:
    """A JSON file whose top level is `expected` (dict or list)."""
    text = read_text(path, what, fix)
    if not text.strip():
        raise _bad(what, path, f"the file is empty; expected {_KINDS[expected]} in JSON", fix)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise _bad(what, path, f"not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}", fix) from None
    if not isinstance(value, expected):
        raise _bad(what, path, f"expected {_KINDS[expected]} at the top level, got {_kind(value)}", fix)
    return value


def read_yaml_mapping(path: Path, what: str, fix: str = "") -> dict[str, Any]:
    """A YAML file whose top level is a mapping (the shape of every tracectl config)."""
    text = read_text(path, what, fix)
    if not text.strip():
        raise _bad(what, path, "the file is empty; expected a mapping (key: value lines)", fix)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise _bad(what, path, f"not valid YAML{where}: {problem}", fix) from None
    if not isinstance(value, dict):
        raise _bad(what, path, f"expected a mapping (key: value lines) at the top level, got {_kind(value)}", fix)
    return value


def check_jsonl(path: Path, what: str, fix: str = "", model: type[BaseModel] | None = None) -> int:
    """The number of records in a JSONL file whose every non-blank line is a JSON object (and, with
    `model`, validates as one: the first three wrong fields of the first bad line are named)."""
    count = 0
    for number, line in enumerate(read_text(path, what, fix).splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise _bad(what, path, f"line {number} is not valid JSON (column {err.colno}: {err.msg})", fix) from None
        if not isinstance(value, dict):
            raise _bad(what, path, f"line {number} is {_kind(value)}, not a JSON object (one record per line)", fix)
        if model is not None:
            try:
                model.model_validate(value)
            except ValidationError as err:
                raise _bad(what, path, f"line {number} is not a {model.__name__} record ("
                           f"{'; '.join(error_lines(err, model, limit=3))})", fix) from None
        count += 1
    if count == 0:
        raise _bad(what, path, "the file is empty; expected one JSON record per line", fix)
    return count
