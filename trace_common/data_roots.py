"""Data directories a request names, confined to the directories the operator lists.

A request may name a data directory (the tau2 `data` parameter: `EnvironmentRef.uri` or
`EnvironmentRef.params["data"]`). The rollout, environment and trainer services accept one only
when it lies under one of their operator-listed data roots (`TRACE_ROLLOUT_DATA_ROOTS`,
`TRACE_ENVIRONMENT_DATA_ROOTS`, `TRACE_TRAINER_DATA_ROOTS`; default: the directory `$TRACE_TAU2_DATA`
names, when set):

    value       an absolute path or a file:/// URI; anything else is refused
    '.', '..'   refused as segments (also percent-encoded in a URI), before anything is resolved
    symlinks    resolved (os.path.realpath) in the value and in every root; the resolved value must
                be a root or lie under one

A refusal is `PermissionDenied` naming the field and the setting, with one message for every
refused value: it never says whether the path exists, where it points, or what the roots are (the
default root is the service's own data path, and it may lie under HOME). What is accepted is
passed on resolved, so the loader reads the directory that was checked.

A request that names no data directory gets the service's own (`$TRACE_TAU2_DATA`). When that is
unset or missing, the loader's NotFound says so (naming the path it looked in);
`own_data_hidden` re-raises it as a NotFound that names the environment and the settings only
(the rollout, environment and trainer services wrap the environment's first instantiation in it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

from trace_common.errors import NotFound, PermissionDenied, TraceError

#: The variable whose directory is every service's default data root (trace_common/domains/tau2/data.py).
TAU2_DATA_ENV = "TRACE_TAU2_DATA"

ROOTS_DESCRIPTION = (
    "Directories under which a request may name a data directory (the tau2 `data` parameter, from "
    "EnvironmentRef.uri or params['data']); symlinks are resolved and '..' is refused. A JSON list or "
    "an os.pathsep-separated string of absolute paths. Default: the directory $TRACE_TAU2_DATA names, "
    "when set, else none (a request may then only leave `data` empty, which uses the service's own).")


def default_roots() -> list[Path]:
    """[$TRACE_TAU2_DATA] when it names an absolute path, else []."""
    value = os.environ.get(TAU2_DATA_ENV, "")
    return [Path(value)] if value.startswith("/") else []


def parse_roots(value: object) -> list[Path]:
    """A settings value -> absolute root paths. ValueError (saying how to fix it) otherwise."""
    if value is None or value == "":
        return []
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"data roots: {exc}; write a JSON list of absolute paths, e.g. [\"/data/tau2\"]") from None
    if isinstance(value, str):
        items: Iterable[object] = [p for p in value.split(os.pathsep) if p]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ValueError(f"data roots: expected a list of absolute paths, got {type(value).__name__}")
    out = []
    for item in items:
        text = str(item)
        if not text.startswith("/") or any(seg in (".", "..") for seg in text.split("/")):
            raise ValueError(f"data root {text!r} is not an absolute path without '.' or '..' segments; "
                             "list absolute directories, e.g. [\"/data/tau2\"]")
        out.append(Path(text))
    return out


def _local_path(value: str) -> str | None:
    """The absolute path a value names (file:/// URIs percent-decoded), or None."""
    if value.startswith("file://"):
        rest = value[len("file://"):]
        rest = rest[len("localhost"):] if rest.startswith("localhost/") else rest
        value = unquote(rest)
    if not value.startswith("/") or "\x00" in value or "\\" in value:
        return None
    if any(seg in (".", "..") for seg in value.split("/")):
        return None
    return value


def is_within(path: str, roots: Sequence[Path]) -> bool:
    """`path` (symlinks resolved) equals or lies under one of `roots` (symlinks resolved)."""
    real = os.path.realpath(path)
    for root in roots:
        base = os.path.realpath(root)
        if real == base or real.startswith(base.rstrip("/") + "/"):
            return True
    return False


def confine(value: str, roots: Sequence[Path], *, field: str, setting: str) -> str:
    """The resolved absolute directory `value` names when it lies under `roots`; else PermissionDenied
    (one message for every refused value: see the module docstring)."""
    path = _local_path(value)
    if path is None or not is_within(path, roots):
        raise PermissionDenied(
            f"a data directory must be an absolute path under a data root the operator lists in {setting} "
            "(symlinks resolved, no '.' or '..' segments); the request names one that is not",
            field=field, fix="leave it empty to use the service's own data, or ask the operator to list the "
            f"directory in {setting}")
    return os.path.realpath(path)


def uses_own_data(name: str, version: str | None, params: Mapping[str, object]) -> bool:
    """The registered environment `name` takes a `data` parameter and `params` name none, so it
    reads the service's own data directory. False for a name the registry does not hold."""
    # imported here: the registry imports every built-in environment; this module stays light
    from trace_common.env.registry import get_spec

    try:
        spec = get_spec(name, version or None)
    except TraceError:
        return False
    return "data" in spec.params and not params.get("data")


@contextmanager
def own_data_hidden(name: str, version: str | None, params: Mapping[str, object], *, setting: str) -> Iterator[None]:
    """Run the block that instantiates environment `name` with `params`. When it reads the service's
    own data (`uses_own_data`) and that raises NotFound, re-raise a NotFound naming the environment,
    TRACE_TAU2_DATA and `setting` -- never the missing path, which may lie under HOME. Any other
    error, and a NotFound about a directory the request named, passes unchanged."""
    try:
        yield
    except NotFound:
        if not uses_own_data(name, version, params):
            raise
        raise NotFound(f"environment {name!r}: this service has no data for it (its {TAU2_DATA_ENV} is unset or "
                       f"incomplete); name a data directory under one of the operator's data roots ({setting}), "
                       f"or ask the operator to set {TAU2_DATA_ENV}") from None
