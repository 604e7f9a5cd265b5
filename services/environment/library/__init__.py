"""The environment library: one capability environment family per capability, written by TRACE.

| capability                  | module                          | capability cases (the other requests are plain)   |
|-----------------------------|---------------------------------|---------------------------------------------------|
| structured_data_reasoning   | structured_data_reasoning.py    | an item named by its attributes, among look-alike orders (levels 3, 2, 1) |
| multi_step_task_completion  | multi_step_task_completion.py   | the requests stated together in the opening message (levels 3, 2) |
| precondition_verification   | precondition_verification.py    | a write whose status may forbid it: check, refuse when it does (levels 3, 2) |
| tool_call_precision         | tool_call_precision.py          | a loose order id or a paraphrased reason to make exact (levels 3, 2, 1) |

Every instance is a conversation shaped like the target's (kit.py "Shape"): the target's mix of
request kinds, its number of requests and its request mode, measured from the target's own tasks
(kit.REQUEST_MIX); one or more requests are capability cases from the family's own generator,
the rest plain requests of the target's kinds. A level bounds the capability cases (kit.py
"Levels"): an easier one makes more of the same requests plain, never the conversation shorter.

These are the four capabilities TRACE reported on tau2-bench. Every family keeps its
target's surface (kit.py): the target's system prompt verbatim, all of its tools, its world
and tool outputs through the target's record toolkit (trace_common/env/records.py), so a
family works for any target whose surface names a toolkit (the store and tau2 retail do).

A family module is an ordinary environment, testable in-process with `make_env(family,
target_params)`, but what gets registered and served is its *bundle*:
`bundle(capability, target_params)` returns one self-contained module -- the family's
docstring, a header naming the kit's sha256 and the target toolkit module with its
sha256, the kit's code, the static import of the target's toolkit module (the one
`trace_common.domains` module the sandbox worker allows), the family's code, then `TARGET
= <the target surface and toolkit parameters>` and the environment's turn budget on that target
(kit.turn_budget) -- so its sha256 covers every line that runs except the toolkit module, whose own
sha256 the header (and the record's manifest, via the target summary) records.

Mode `library` of the environment service selects a family by capability name (or one of
the aliases below) and bundles it for the job's target; no LLM is involved. A level (capability
cases per instance at most, kit.py "Levels") is baked in as `TARGET["cases"]` (`bundle(..., cases=n)`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

from trace_common import pyast
from trace_common.env import Environment
from trace_common.env.records import split_ref
from trace_common.env.surface import TargetSurface, load_toolkit
from trace_common.errors import FailedPrecondition

from .kit import SCRIPT_TOOLS

HERE = Path(__file__).resolve().parent
FAMILIES = ("structured_data_reasoning", "multi_step_task_completion", "precondition_verification",
            "tool_call_precision")
#: Other names an analysis run may give the same capabilities.
ALIASES = {
    "record_selection": "structured_data_reasoning",
    "structured_data_lookup": "structured_data_reasoning",
    "multi_request_completion": "multi_step_task_completion",
    "task_completion": "multi_step_task_completion",
    "precondition_checking": "precondition_verification",
    "state_verification": "precondition_verification",
    "argument_formatting": "tool_call_precision",
    "tool_argument_precision": "tool_call_precision",
    "argument_precision": "tool_call_precision",
}
KIT_MODULE = "services.environment.library.kit"
#: The name a bundle binds the target's toolkit class to (kit.py reads it).
TOOLKIT_NAME = "TARGET_TOOLKIT"


def family_for(capability: str) -> str | None:
    """The library family for a capability name, or None."""
    if capability in FAMILIES:
        return capability
    return ALIASES.get(capability)


def require_family(capability: str) -> str:
    family = family_for(capability)
    if family is None:
        raise FailedPrecondition(f"the environment library has no environment for capability {capability!r} "
                                 f"(it covers {', '.join(FAMILIES)}, aliases {', '.join(sorted(ALIASES))}); "
                                 "use GENERATION_MODE_LLM for other capabilities")
    return family


def source_path(family: str) -> Path:
    return HERE / f"{family}.py"


def env_class(family: str):
    """The family's Environment class (imported in-process: trusted, TRACE-written code)."""
    return importlib.import_module(f"services.environment.library.{family}").ENVIRONMENT


def roles(family: str) -> tuple[str, ...]:
    """The target tools the family's scripts call (a target must have them, with their arguments)."""
    return tuple(env_class(family).tools_used)


def levels(family: str) -> tuple[int, ...]:
    """The family's levels (capability cases per instance at most), hardest first (kit.py "Levels")."""
    return tuple(env_class(family).levels)


def at_level(target_params: dict[str, Any], cases: int | None) -> dict[str, Any]:
    """`target_params` asking for `cases` per instance (unchanged for None: the hardest level)."""
    return dict(target_params) if cases is None else {**target_params, "cases": cases}


def make_env(family: str, target_params: dict[str, Any], cases: int | None = None) -> Environment:
    """The family's environment for baked `target_params`, in-process (its toolkit imported here)."""
    surface = TargetSurface.model_validate(target_params["surface"])
    return env_class(family)(at_level(target_params, cases), toolkit=load_toolkit(surface))


def kit_sha256() -> str:
    return hashlib.sha256((HERE / "kit.py").read_bytes()).hexdigest()


def _split(source: str, drop_import_of: str | None) -> tuple[str, str]:
    """(docstring source text, remaining code) without `from __future__` and the kit import."""
    tree = pyast.parse(source)
    lines = source.splitlines(keepends=True)
    drop: list[tuple[int, int]] = []
    doc = ""
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        doc = "".join(lines[body[0].lineno - 1:body[0].end_lineno])
        drop.append((body[0].lineno, body[0].end_lineno))
    for node in body:
        if isinstance(node, ast.ImportFrom) and (node.module == "__future__" or node.module == drop_import_of):
            drop.append((node.lineno, node.end_lineno))
    keep = [line for i, line in enumerate(lines, start=1) if not any(a <= i <= b for a, b in drop)]
    return doc, "".join(keep).strip("\n") + "\n"


def toolkit_import(target_params: dict[str, Any]) -> str:
    """The static import line a bundle uses for the target's toolkit class."""
    ref = target_params["surface"].get("toolkit")
    if not ref:
        raise FailedPrecondition(f"target {target_params['surface'].get('name')!r} names no record toolkit; the "
                                 "environment library needs one (use GENERATION_MODE_LLM for this target)")
    module, attribute = split_ref(ref)
    return f"from {module} import {attribute} as {TOOLKIT_NAME}"


def target_literal(target_params: dict[str, Any]) -> str:
    """`import json` + `TARGET = json.loads('...')`: the baked parameters (key order kept: the toolkit builds from it)."""
    return f"import json\n\nTARGET = json.loads({json.dumps(target_params)!r})\n"


def bundle(capability: str, target_params: dict[str, Any], cases: int | None = None) -> str:
    """One self-contained module (see module docstring), at level `cases` (None: the hardest)."""
    family = require_family(capability)
    if cases is not None and cases not in levels(family):
        raise FailedPrecondition(f"family {family} has no level of {cases} cases; its levels are "
                                 f"{list(levels(family))}")
    target_params = at_level(target_params, cases)
    doc, env_code = _split(source_path(family).read_text(encoding="utf-8"), KIT_MODULE)
    _, kit_code = _split((HERE / "kit.py").read_text(encoding="utf-8"), None)
    surface = target_params["surface"]
    return (f"{doc}\n"
            "from __future__ import annotations\n\n"
            f"# Bundled by TRACE from services/environment/library/{family}.py and kit.py "
            f"(kit sha256 {kit_sha256()[:16]}) for target {surface.get('name')!r}.\n"
            f"# Target record toolkit {surface.get('toolkit')} (module sha256 "
            f"{target_params.get('toolkit_sha256')}).\n\n"
            "# ---- kit -------------------------------------------------------------------------------------\n"
            f"{kit_code}\n\n"
            "# ---- the target's record toolkit ------------------------------------------------------------------\n"
            f"{toolkit_import(target_params)}\n\n"
            "# ---- environment -------------------------------------------------------------------------------\n"
            f"{env_code}\n\n"
            "# ---- target parameters baked in by TRACE ----------------------------------------------------------\n"
            f"{target_literal(target_params)}\n"
            "ENVIRONMENT.default_max_turns = turn_budget(TARGET)\n")


__all__ = ["ALIASES", "FAMILIES", "SCRIPT_TOOLS", "at_level", "bundle", "env_class", "family_for", "kit_sha256",
           "levels", "make_env", "require_family", "roles", "target_literal", "toolkit_import"]
