"""The target a capability environment must keep the surface of, as the SDK describes it.

`resolve_target(ref)` instantiates the target from the registry (so a tau2 target reads its
data directory -- a missing directory is an error, never a silent fallback) and describes it
with `trace_common.env.surface.describe_target`: the system prompt verbatim, the greeting,
ALL tool schemas, and the record toolkit with its parameters. Nothing here is written per
target: a new target gets library environments by publishing a toolkit in its surface.

`TargetInfo.library_params(tools)` is what the environment library bakes into a bundle
(`{"surface": <the surface>, "toolkit_sha256": <sha256 of the toolkit module>}`); it fails
with a clear FailedPrecondition when the target names no toolkit, or lacks a tool the
family's scripts call with the arguments they pass (a renamed tool, a changed argument).
`summary()` -- recorded in every validation report and environment manifest -- names the
toolkit and its module's sha256.

A request's target names a data directory only under the operator's data roots:
`confined_params` checks it (trace_common/data_roots.py) before `resolve_target` reads anything.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_common.data_roots import confine
from trace_common.env import make
from trace_common.env.records import RecordToolkit
from trace_common.env.surface import TargetSurface, describe_target, toolkit_class, toolkit_sha256
from trace_common.errors import FailedPrecondition

from .library.kit import SCRIPT_TOOLS


@dataclass
class TargetInfo:
    """What generation and validation need to know about the target."""

    surface: TargetSurface
    params: dict[str, str]
    toolkit_sha256: str | None = None

    @property
    def name(self) -> str:
        return self.surface.name

    @property
    def version(self) -> str:
        return self.surface.version

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.surface.tool_schemas

    @property
    def system_prompt(self) -> str:
        return self.surface.system_prompt

    @property
    def greeting(self) -> str | None:
        return self.surface.greeting

    def schema(self, tool: str) -> dict[str, Any] | None:
        return self.surface.schema(tool)

    def tool_names(self) -> list[str]:
        return self.surface.tool_names()

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "params": self.params, "tools": self.tool_names(),
                "toolkit": self.surface.toolkit, "toolkit_sha256": self.toolkit_sha256}

    def toolkit_contract(self) -> str | None:
        """The record-toolkit contract and this target's toolkit, as text (None without a toolkit)."""
        if self.surface.toolkit is None:
            return None
        cls = toolkit_class(self.surface.toolkit)
        methods = []
        for name, fn in inspect.getmembers(RecordToolkit, inspect.isfunction):
            if not name.startswith("_"):
                methods.append(f"    def {name}{inspect.signature(fn)}:\n        \"\"\"{inspect.getdoc(fn) or ''}\"\"\"")
        module = inspect.getmodule(RecordToolkit)
        return "\n\n".join([
            f"Toolkit of this target: {self.surface.toolkit} (class {cls.__name__}).",
            inspect.getdoc(module) or "", "class RecordToolkit:  # the contract",
            "\n".join(methods), f"{cls.__name__}: {inspect.getdoc(inspect.getmodule(cls)) or ''}"])

    def library_params(self, tools: tuple[str, ...] = tuple(SCRIPT_TOOLS)) -> dict[str, Any]:
        """The TARGET constant baked into a library environment whose scripts call `tools`."""
        if self.surface.toolkit is None:
            raise FailedPrecondition(
                f"target {self.name!r} publishes no record toolkit in its surface, so the environment library "
                "cannot build worlds in its schema; use GENERATION_MODE_LLM for it, or give the target a toolkit "
                "(trace_common/env/records.py)")
        for tool in tools:
            schema = self.schema(tool)
            if schema is None:
                raise FailedPrecondition(f"target {self.name!r} lacks the tool {tool!r} that the library's scripts "
                                         f"call; its tools are {', '.join(self.tool_names())}")
            props = set((schema["function"].get("parameters") or {}).get("properties") or {})
            want = set(SCRIPT_TOOLS.get(tool, ()))
            if not want <= props:
                raise FailedPrecondition(
                    f"target {self.name!r}: tool {tool!r} takes {sorted(props)} but the library passes "
                    f"{sorted(want)}; the library does not fit this target")
        return self.baked()

    def baked(self) -> dict[str, Any]:
        """`{"surface": ..., "toolkit_sha256": ...}`: the TARGET constant TRACE binds in a module."""
        return {"surface": self.surface.model_dump(mode="json"), "toolkit_sha256": self.toolkit_sha256}


def _params(name: str, uri: str, params: dict[str, str]) -> dict[str, str]:
    out = dict(params)
    if uri and name.startswith("tau2"):
        out.setdefault("data", uri.removeprefix("file://"))
    return out


#: The setting listing the directories a request's target may name data under (EnvironmentSettings.data_roots).
DATA_ROOTS_SETTING = "TRACE_ENVIRONMENT_DATA_ROOTS"


def confined_params(name: str, uri: str, params: dict[str, str], data_roots: Sequence[Path],
                    setting: str = DATA_ROOTS_SETTING) -> dict[str, str]:
    """A request's target parameters with its data directory (`params['data']`, else a tau2 target's
    `uri`) checked against the operator's `data_roots` and resolved (trace_common/data_roots.py):
    PermissionDenied, naming the field, for one outside them. Pass the result to `resolve_target`."""
    out = dict(params)
    if out.get("data"):
        out["data"] = confine(out["data"], data_roots, field="spec.target.params['data']", setting=setting)
    elif uri and name.startswith("tau2"):
        out["data"] = confine(uri, data_roots, field="spec.target.uri", setting=setting)
    return out


def resolve_target(name: str, version: str = "", uri: str = "", params: dict[str, str] | None = None) -> TargetInfo:
    """Instantiate the target from the registry and describe it (see module docstring)."""
    args = _params(name, uri, params or {})
    surface = describe_target(make(name, version or None, **args))
    sha = toolkit_sha256(surface.toolkit) if surface.toolkit else None
    return TargetInfo(surface=surface, params=args, toolkit_sha256=sha)
