"""The environment library: one reference environment family per capability, written by TRACE.

| capability                  | module                          | task                                        |
|-----------------------------|---------------------------------|---------------------------------------------|
| structured_data_reasoning   | structured_data_reasoning.py    | act on the one order matching every attribute |
| multi_step_task_completion  | multi_step_task_completion.py   | carry out all three parts of a request       |
| precondition_verification   | precondition_verification.py    | check status before cancelling; refuse if not pending |
| tool_call_precision         | tool_call_precision.py          | canonical ids and enum values from loose user text |

These are the four capabilities TRACE reported on tau2-bench. Each module is an ordinary
environment (importable, testable in-process with an explicit `target=`), but what gets
registered and served is its *bundle*: `bundle(capability, target_params)` returns one
self-contained module -- the family's docstring, then `kit.py`'s code, then the family's
code, then `TARGET = <the target's tool schemas, id formats and prompt frame>` -- which
imports only the standard library and `trace_common.env`, so its sha256 covers every line
that runs and the sandbox worker can load it like any generated candidate.

Mode `library` of the environment service selects a family by capability name (or one of
the aliases below) and bundles it for the job's target; no LLM is involved.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

from trace_common import pyast
from trace_common.errors import FailedPrecondition

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
    return tuple(env_class(family).roles)


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


def bundle(capability: str, target_params: dict[str, Any]) -> str:
    """One self-contained module: family docstring + kit + family code + baked TARGET."""
    family = require_family(capability)
    doc, env_code = _split(source_path(family).read_text(encoding="utf-8"), KIT_MODULE)
    _, kit_code = _split((HERE / "kit.py").read_text(encoding="utf-8"), None)
    target_literal = repr(json.dumps(target_params, sort_keys=True))
    return (f"{doc}\n"
            "from __future__ import annotations\n\n"
            f"# Bundled by TRACE from services/environment/library/{family}.py and kit.py "
            f"(kit sha256 {kit_sha256()[:16]}) for target {target_params.get('name')!r}.\n\n"
            "# ---- kit -------------------------------------------------------------------------------------\n"
            f"{kit_code}\n\n"
            "# ---- environment -------------------------------------------------------------------------------\n"
            f"{env_code}\n\n"
            "# ---- target parameters baked in by TRACE ----------------------------------------------------------\n"
            f"TARGET = json.loads({target_literal})\n")


__all__ = ["ALIASES", "FAMILIES", "bundle", "env_class", "family_for", "kit_sha256", "require_family", "roles"]
