"""Reading the files a user hands tracectl: run configs (YAML), GRPO configs and chat messages
(JSON), rollout trajectories (JSONL).

Each reader returns the parsed value or raises `InvalidArgument` with one line that names the
flag and the file and says what is wrong and what was expected: unreadable (missing, a
directory, no permission), not a regular file (a FIFO, a device such as /dev/zero, a socket),
larger than its cap, binary (NUL bytes), not UTF-8 (the first bad byte and its offset),
empty, not parseable (line and column), nested too deeply to parse (thousands of `[` or `{`:
refused, not a RecursionError), a YAML file with an alias (`*name`: refused, since aliases let a
few bytes expand without bound), or of the wrong shape (a list where a mapping belongs).

Only regular files are read, and only up to a cap: `CONFIG_MAX_BYTES` (1 MiB) for configs and
message files, `DATA_MAX_BYTES` (256 MiB) for data (a tau2 task list, rollout trajectories). The
file's type and size come from `os.stat` before it is opened, so a FIFO is never opened (no hang)
and a device or huge file is never read (bounded memory); the file is then opened non-blocking and
read through at most cap + 1 bytes, in case it changed in between.
`tracectl.cli` turns that into exit status 2 (tracectl/exits.py), so a bad file never shows a
traceback and nothing is started.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trace_common.errors import InvalidArgument
from trace_common.suggest import error_lines

#: The largest config or message file tracectl reads (a real run config is a few KB).
CONFIG_MAX_BYTES = 1 << 20
#: The largest data file tracectl reads (tau2 retail's tasks.json is 346 KB; trajectories of a
#: 500-task evaluation are tens of MB).
DATA_MAX_BYTES = 256 << 20

#: libyaml's safe loader where PyYAML has it: ~10x faster than the pure-Python one on a large file
#: (a 1 MiB YAML list: 6 s instead of 89 s, measured on this project's 2-core CI machine).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _YAML_LOADER(_SAFE_LOADER):  # noqa: N801 (named as the loader it replaces)
    """The safe loader, refusing a key written twice in one mapping. YAML says keys are unique, but
    PyYAML keeps the last value: a second `training:` block silently replaced the first one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # merge keys (`<<: {...}`) first, as the base constructor does
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the base constructor says so
                break
            if earlier is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is written twice in one mapping (first at line "
                    f"{earlier.start_mark.line + 1}); keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

_KINDS = {dict: "a mapping", list: "a list", str: "a string", int: "a number", float: "a number", bool: "true/false"}


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    shown = repr(value)
    return f"{_KINDS.get(type(value), type(value).__name__)} ({shown[:40] + '...' if len(shown) > 40 else shown})"


def _bad(what: str, path: Path, reason: str, fix: str = "") -> InvalidArgument:
    return InvalidArgument(reason, field=f"{what} {path}", fix=fix or None)


_NOT_REGULAR = ((stat.S_ISDIR, "a directory, not a file"), (stat.S_ISFIFO, "a FIFO (named pipe), not a regular file"),
                (stat.S_ISCHR, "a character device, not a regular file"),
                (stat.S_ISBLK, "a block device, not a regular file"), (stat.S_ISSOCK, "a socket, not a regular file"))


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def _read_capped(path: Path, what: str, fix: str, max_bytes: int) -> bytes:
    """The bytes of `path` if it is a regular file of at most `max_bytes` (module docstring)."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise _bad(what, path, f"cannot read it ({err.strerror or type(err).__name__})", fix) from None
    for test, kind in _NOT_REGULAR:
        if test(st.st_mode):
            raise _bad(what, path, f"cannot read it ({kind})", fix)
    if not stat.S_ISREG(st.st_mode):
        raise _bad(what, path, "cannot read it (not a regular file)", fix)
    too_big = f"too large: over the cap of {_size(max_bytes)} for this file; give a smaller file"
    if st.st_size > max_bytes:
        raise _bad(what, path, f"{_size(st.st_size)}, {too_big}", fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise _bad(what, path, f"cannot read it ({err.strerror or type(err).__name__})", fix) from None
    with open(fd, "rb", buffering=0) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the stat and the open
            raise _bad(what, path, "cannot read it (not a regular file)", fix)
        try:
            data = f.read(max_bytes + 1)
        except OSError as err:
            raise _bad(what, path, f"cannot read it ({err.strerror or type(err).__name__})", fix) from None
    if len(data) > max_bytes:
        raise _bad(what, path, f"it grew while read, {too_big}", fix)
    return data


def read_text(path: Path, what: str, fix: str = "", max_bytes: int = CONFIG_MAX_BYTES) -> str:
    """The file's text; `what` names it in messages (the flag, e.g. "--config"); `max_bytes`: the cap
    (CONFIG_MAX_BYTES, or DATA_MAX_BYTES for data)."""
    data = _read_capped(Path(path), what, fix, max_bytes)
    nul = data.find(b"\x00")
    if nul >= 0:
        raise _bad(what, path, f"a binary file (NUL byte at offset {nul}), not text", fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _bad(what, path, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})", fix) from None


def read_json(path: Path, what: str, expected: type, fix: str = "", max_bytes: int = CONFIG_MAX_BYTES) -> Any:
    """A JSON file whose top level is `expected` (dict or list), of at most `max_bytes`."""
    text = read_text(path, what, fix, max_bytes)
    if not text.strip():
        raise _bad(what, path, f"the file is empty; expected {_KINDS[expected]} in JSON", fix)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise _bad(what, path, f"not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}", fix) from None
    except RecursionError:  # e.g. 100k nested `[`: the parser recurses once per level
        raise _bad(what, path, _TOO_DEEP.format(kind="JSON"), fix) from None
    if not isinstance(value, expected):
        raise _bad(what, path, f"expected {_KINDS[expected]} at the top level, got {_kind(value)}", fix)
    return value


#: What a reader says about a file whose nesting exceeds the parser's recursion limit.
_TOO_DEEP = ("nested too deeply to parse ({kind} lists or mappings inside each other beyond Python's recursion "
             "limit); no tracectl input nests more than a few levels: check the file")


def _refuse_aliases(text: str, what: str, path: Path, fix: str) -> None:
    """InvalidArgument at the first YAML alias (`*name`) in `text`.

    An alias reuses an anchored node without copying its text, so a few hundred bytes of nested
    aliases compose into billions of nodes (an "alias bomb": 9 levels of 10 aliases each took
    `tracectl run --check` past 60 s and 4 GB) and the byte cap alone cannot bound the parsed size.
    No TRACE config needs them, so they are refused before anything is composed. The scan parses
    events only (no nodes are built), and only when the text holds a '*' at all."""
    if "*" not in text:
        return
    for event in yaml.parse(text, Loader=_YAML_LOADER):
        if isinstance(event, yaml.AliasEvent):
            mark = event.start_mark
            raise _bad(what, path, f"uses a YAML alias (*{event.anchor}) at line {mark.line + 1}, column "
                       f"{mark.column + 1}; tracectl does not expand YAML anchors and aliases: write the "
                       "repeated value out in full where it is used", fix)


def read_yaml_mapping(path: Path, what: str, fix: str = "") -> dict[str, Any]:
    """A YAML file whose top level is a mapping (the shape of every tracectl config)."""
    text = read_text(path, what, fix)
    if not text.strip():
        raise _bad(what, path, "the file is empty; expected a mapping (key: value lines)", fix)
    try:
        _refuse_aliases(text, what, path, fix)
        value = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise _bad(what, path, f"not valid YAML{where}: {problem}", fix) from None
    except RecursionError:
        raise _bad(what, path, _TOO_DEEP.format(kind="YAML"), fix) from None
    if not isinstance(value, dict):
        raise _bad(what, path, f"expected a mapping (key: value lines) at the top level, got {_kind(value)}", fix)
    return value


def check_jsonl(path: Path, what: str, fix: str = "", model: type[BaseModel] | None = None) -> int:
    """The number of records in a JSONL file whose every non-blank line is a JSON object (and, with
    `model`, validates as one: the first three wrong fields of the first bad line are named)."""
    count = 0
    for number, line in enumerate(read_text(path, what, fix, DATA_MAX_BYTES).splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise _bad(what, path, f"line {number} is not valid JSON (column {err.colno}: {err.msg})", fix) from None
        except RecursionError:
            raise _bad(what, path, f"line {number} is {_TOO_DEEP.format(kind='JSON')}", fix) from None
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


def writable_dir(path: Path, what: str, fix: str = "") -> Path:
    """`path` as a directory tracectl may write under (an artifact store, a cache), created with its
    parents when missing; InvalidArgument naming `what` (the flag) when it cannot be: a file is in the
    way, no permission, or a file system that holds no directories of ours (/proc, a read-only mount)."""
    path = Path(path)
    fix = fix or f"Give {what} a directory this user can write (it is created when missing)"
    if path.exists() and not path.is_dir():
        raise _bad(what, path, "it is a file, not a directory", fix)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _bad(what, path, f"cannot create this directory ({err.strerror or type(err).__name__})", fix) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _bad(what, path, "cannot write under this directory (permission denied)", fix)
    return path


#: The largest value of a proto int32 / int64 field (a larger flag value would crash the request's
#: construction instead of being refused).
INT32_MAX, INT64_MAX = (1 << 31) - 1, (1 << 63) - 1


def int_flag(low: int, high: int = INT32_MAX, meaning: str = ""):
    """An argparse `type` for a whole-number flag in [low, high]: a value outside is refused while the
    arguments are parsed (exit 2, `argument --FLAG: ...`), before any work. `meaning` explains a
    special value in the message (e.g. "0: the service's default")."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or value > high:
            bound = f"at least {low}" if value < low else f"at most {high}"
            raise argparse.ArgumentTypeError(f"expected a whole number {bound}{f' ({meaning})' if meaning else ''}, "
                                             f"got {value}")
        return value

    parse.__name__ = f"int_{low}_{high}"
    return parse


#: A count of something that must happen at least once (optimizer steps, samples, tokens).
positive_int = int_flag(1)
#: A count where 0 asks for the service's default (or "all").
default_or_count = int_flag(0, meaning="0: the default")
#: A TCP port; 0 picks a free one.
port_number = int_flag(0, 65535, meaning="0: any free port")
#: A seed (a proto int64 field).
seed_int = int_flag(-INT64_MAX - 1, INT64_MAX)
