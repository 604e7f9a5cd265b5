"""The house rules of imports (docs/design.md "Architecture"; issue #20), checked over the source.

* `trace_common` (the library) names no service and not the CLI;
* a service's modules (`services/<a>/`) import no other service (`services.<b>`, b != a); the
  launcher at the top of `services/` (`services/launch.py`) may import every service, no other
  top-level module of `services/` imports any, and of the launcher a service imports it only in
  its entry point (`services/<a>/__main__.py`, which runs `services.launch.main`);
* `tracectl` imports services only to start them in-process: in the modules of `TRACECTL_STARTERS`,
  and there only `services.launch`.

`bench/` and `tests/` are exempt. Every import form counts: `import x`, `from x import y`
(recorded as `x.y`, since `y` may be a submodule), relative imports (resolved against the
module's package), imports under `if TYPE_CHECKING:`, and the string arguments of
`importlib.import_module(...)` / `import_module(...)` / `__import__(...)` -- an f-string counts by
its literal prefix, so `import_module(f"services.{name}.app")` is an import of some service.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("trace_common", "services", "tracectl")  # bench/ and tests/ are exempt
#: tracectl modules that start services in this process -> the service modules each may import.
TRACECTL_STARTERS = {
    "tracectl.embedded": ("services.launch",),
    "tracectl.commands.serve": ("services.launch",),
}
IMPORT_FUNCTIONS = {"import_module", "__import__"}


@dataclass(frozen=True)
class ImportRef:
    """One import in a module: the absolute dotted name (for a dynamic import, its literal prefix)."""

    target: str
    line: int
    dynamic: bool = False


def module_name(path: str) -> str:
    """`services/inference/app.py` -> `services.inference.app`; a package's `__init__.py` -> the package."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def _literal_prefix(node: ast.expr) -> tuple[str, bool] | None:
    """(the string, False) of a constant; (its literal prefix, True) of an f-string; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, False
    if isinstance(node, ast.JoinedStr):
        prefix = ""
        for part in node.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            prefix += part.value
        return prefix.rstrip("."), True
    return None


def imports_of(source: str, path: str) -> list[ImportRef]:
    """Every import of the module at repository path `path` whose text is `source`."""
    module, is_package = module_name(path), path.endswith("__init__.py")
    refs: list[ImportRef] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            refs += [ImportRef(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module) if node.level else node.module or ""
            refs += [ImportRef(base if alias.name == "*" else f"{base}.{alias.name}", node.lineno)
                     for alias in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            literal = _literal_prefix(node.args[0]) if called in IMPORT_FUNCTIONS else None
            if literal is not None:
                target, dynamic = literal
                if target.startswith("."):  # import_module(".x", package=__package__): relative to this package
                    target = _resolve(module, is_package, len(target) - len(target.lstrip(".")),
                                      target.lstrip(".") or None)
                refs.append(ImportRef(target, node.lineno, dynamic))
    return refs


def _under(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def _top(target: str) -> str:
    return target.split(".", 1)[0]


def _service_of(path: str) -> str | None:
    """The service a `services/` file belongs to (`services/<a>/...` -> a); None for a top-level module."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else None


def _library(path: str, ref: ImportRef) -> str | None:
    if _top(ref.target) in ("services", "tracectl"):
        return f"the library imports {ref.target!r}" + (" (dynamic)" if ref.dynamic else "")
    return None


def _services(path: str, ref: ImportRef) -> str | None:
    if path == "services/launch.py" or _top(ref.target) != "services" or (ref.target == "services"
                                                                          and not ref.dynamic):
        return None
    parts = ref.target.split(".")
    own = _service_of(path)
    if own is None:
        return f"{path} is not the launcher (services/launch.py) but imports {ref.target!r}"
    if len(parts) < 2:  # a dynamic import of some service: not provably its own
        return f"service {own!r} imports an unknown service ({ref.target!r}..., dynamic)"
    if parts[1] == "launch" and path == f"services/{own}/__main__.py" and not ref.dynamic:
        return None  # the process entry point runs the shared launcher
    if parts[1] != own:
        return f"service {own!r} imports service {parts[1]!r} ({ref.target})"
    return None


def _cli(path: str, ref: ImportRef) -> str | None:
    if _top(ref.target) != "services":
        return None
    allowed = TRACECTL_STARTERS.get(module_name(path), ())
    if any(_under(ref.target, a) for a in allowed) and not ref.dynamic:
        return None
    where = f"only {', '.join(allowed)}" if allowed else "no service module (it starts none; use the gRPC API)"
    return f"{module_name(path)} imports {ref.target!r}; it may import {where}"


@dataclass(frozen=True)
class Rule:
    name: str
    applies: Callable[[str], bool]  # repository path of a .py file -> is it checked by this rule
    refusal: Callable[[str, ImportRef], str | None]  # why this import breaks the rule (None: it does not)


RULES = [
    Rule("library-names-no-service", lambda p: p.startswith("trace_common/"), _library),
    Rule("services-import-no-other-service", lambda p: p.startswith("services/"), _services),
    Rule("tracectl-imports-services-only-to-start-them", lambda p: p.startswith("tracectl/"), _cli),
]
RULE = {r.name: r for r in RULES}


def violations(rule: Rule, source: str, path: str) -> list[str]:
    if not rule.applies(path):
        return []
    return [f"{path}:{ref.line}: {why}" for ref in imports_of(source, path)
            if (why := rule.refusal(path, ref)) is not None]


def _checked_files() -> list[str]:
    files = []
    for top in CHECKED:
        files += [p.relative_to(ROOT).as_posix() for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files)


# ---- the checker itself, on planted sources ---------------------------------------------------------------
@pytest.mark.parametrize("rule, path, source, broken", [
    # the library
    ("library-names-no-service", "trace_common/x.py", "import services.inference.specs", True),
    ("library-names-no-service", "trace_common/x.py", "from services.launch import build", True),
    ("library-names-no-service", "trace_common/x.py", "from services import trainer", True),
    ("library-names-no-service", "trace_common/grpc/x.py", "import importlib\nimportlib.import_module('services.trainer.app')",
     True),
    ("library-names-no-service", "trace_common/grpc/x.py",
     "from importlib import import_module\ndef f(s):\n    return import_module(f'services.{s}.settings')", True),
    ("library-names-no-service", "trace_common/x.py", "m = __import__('tracectl.cli')", True),
    ("library-names-no-service", "trace_common/x.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tracectl.progress import Bar", True),
    ("library-names-no-service", "trace_common/moe/x.py", "from . import composed\nfrom ..errors import NotFound",
     False),
    ("library-names-no-service", "trace_common/x.py", "import importlib\nimportlib.import_module('trace_common.moe')",
     False),
    # the services
    ("services-import-no-other-service", "services/trainer/x.py", "from services.inference.specs import A", True),
    ("services-import-no-other-service", "services/trainer/x.py", "from services import inference", True),
    ("services-import-no-other-service", "services/trainer/gates/x.py", "from ...rollout import policies", True),
    ("services-import-no-other-service", "services/trainer/x.py",
     "import importlib\nimportlib.import_module(f'services.{name}.app')", True),
    ("services-import-no-other-service", "services/trainer/x.py", "from services.launch import build", True),
    ("services-import-no-other-service", "services/trainer/__main__.py", "from services.launch import main", False),
    ("services-import-no-other-service", "services/helpers.py", "import services.rollout", True),
    ("services-import-no-other-service", "services/trainer/gates/x.py",
     "from ..grpo import loss\nfrom services.trainer.grpo import lora\nfrom . import job", False),
    ("services-import-no-other-service", "services/launch.py",
     "import importlib\nimportlib.import_module(f'services.{s}.app')\nfrom services.inference import app", False),
    # the CLI
    ("tracectl-imports-services-only-to-start-them", "tracectl/commands/serve.py",
     "from services.launch import build", False),
    ("tracectl-imports-services-only-to-start-them", "tracectl/embedded.py", "from services import launch", False),
    ("tracectl-imports-services-only-to-start-them", "tracectl/commands/serve.py",
     "from services.inference.specs import CompositionSpecModel", True),
    ("tracectl-imports-services-only-to-start-them", "tracectl/commands/route_trace.py",
     "def f():\n    from services.launch import build", True),
    ("tracectl-imports-services-only-to-start-them", "tracectl/run/x.py",
     "import importlib\nimportlib.import_module('services.trainer.grpo.config')", True),
    ("tracectl-imports-services-only-to-start-them", "tracectl/commands/x.py",
     "from tracectl.commands.serve import inference_in_process\nfrom trace_common.grpc import client", False),
    # exempt trees
    ("library-names-no-service", "bench/x.py", "import services.inference", False),
    ("services-import-no-other-service", "tests/unit/x.py", "from services.inference import specs", False),
])
def test_checker_finds_planted_violations(rule, path, source, broken):
    found = violations(RULE[rule], source, path)
    assert bool(found) == broken, found


@pytest.mark.parametrize("path, source, expect", [
    ("services/inference/app.py", "from .metrics import M", ["services.inference.metrics.M"]),
    ("services/inference/__init__.py", "from . import app", ["services.inference.app"]),
    ("services/trainer/gates/job.py", "from ..grpo.config import X", ["services.trainer.grpo.config.X"]),
    ("trace_common/x.py", "import a.b, c", ["a.b", "c"]),
    ("trace_common/x.py", "import importlib\nimportlib.import_module('.y', package=__package__)", ["importlib",
                                                                                                  "trace_common.y"]),
])
def test_imports_are_resolved_to_absolute_names(path, source, expect):
    assert [r.target for r in imports_of(source, path)] == expect


# ---- the house ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_the_source_keeps_the_rule(rule):
    files = [p for p in _checked_files() if rule.applies(p)]
    assert files, f"no files checked by {rule.name}: has the tree moved?"
    found = [v for p in files for v in violations(rule, (ROOT / p).read_text(), p)]
    assert not found, "\n".join(found)


# ---- citations: the repository stands on its own -----------------------------------------------------------
#: What a clone of this repository does not hold, and so no tracked file may cite (code, docstrings, README,
#: configs): the development machines' shared directory next to the checkout and its two documents, their work
#: tree, and wherever this checkout lies (an absolute path of this machine). The design is `docs/design.md`.
OUTSIDE = [
    (re.compile(r"\.\./shared\b"), "cites ../shared (a directory next to the checkout, not in a clone)"),
    (re.compile(r"/work/"), "cites /work/ (the development machines' work tree)"),
    (re.compile(r"\b(?:DESIGN|TOOLING)(?:\.md)?\b"), "cites a document outside the repository (DESIGN/TOOLING; "
     "the design is docs/design.md)"),
]
#: Files allowed some of those patterns, and why. The CI entry point points TRACE_TAU2_DATA at the development
#: machines' copy of the tau2-bench data when the variable is unset and that copy exists (issue #29); this
#: module names every pattern it looks for, in OUTSIDE and in its planted cases.
CITATION_EXEMPT = {".ci/run": {OUTSIDE[0][0].pattern},
                   "tests/unit/test_import_rules.py": {pattern.pattern for pattern, _ in OUTSIDE}}


def _here_patterns() -> list[tuple[re.Pattern[str], str]]:
    """This checkout's own absolute path (wherever it is cloned), unless it is too short to mean a place."""
    root = ROOT.as_posix()
    return [(re.compile(re.escape(root) + r"(?![\w.-])"), f"cites this checkout's absolute path {root}")] \
        if len(ROOT.parts) > 2 else []


def citations(path: str, text: str, patterns: Sequence[tuple[re.Pattern[str], str]] = tuple(OUTSIDE)) -> list[str]:
    """`path:line: why` for every place in `text` (the file at repository path `path`) that matches one of
    `patterns` (default: OUTSIDE), less the file's exemptions."""
    exempt = CITATION_EXEMPT.get(path, set())
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, why in patterns:
            if pattern.pattern not in exempt and pattern.search(line):
                found.append(f"{path}:{number}: {why}: {line.strip()[:160]}")
    return found


def _tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): the tracked files are unknown, so the citation rule is unchecked")
    return [p for p in out.decode().split("\0") if p]


@pytest.mark.parametrize("path, text, broken", [
    ("README.md", "Design: [`../shared/DESIGN.md`](../shared/DESIGN.md).", True),
    ("README.md", "Design: [`docs/design.md`](docs/design.md).", False),
    ("trace_common/x.py", '"""Contrastive statistics (DESIGN.md, "Analysis statistics")."""', True),
    ("trace_common/x.py", '"""Guided rollouts (DESIGN "Rare behaviours")."""', True),
    ("trace_common/x.py", "# pinned to what installs here (TOOLING)", True),
    ("trace_common/x.py", '"""Contrastive statistics (docs/design.md, "Analysis statistics")."""', False),
    ("trace_common/x.py", "# a designed environment; design choices", False),
    ("trace_common/x.py", "root = REPO.parent / 'shared' / 'tau2'  # ../shared/tau2", True),
    ("tests/x.py", "DATA = Path('/work/shared/tau2')", True),
    ("bench/RESULTS.md", "through `file:///work/checkout/.trace/runs/x/composition.json`", True),
    ("examples/x.yaml", "uri: /data/tau2/retail   # inside the pods", False),
    ("tests/chart/values/x.yaml", "mountPath: /shared/adapters", False),
    (".ci/run", 'export TRACE_TAU2_DATA="$(cd ../shared/tau2 && pwd)"', False),
    (".ci/run", "# see ../shared/DESIGN.md", True),   # the exemption covers ../shared, not the documents
    ("Makefile", "TRACE_TAU2_DATA ?= ../shared/tau2", True),
])
def test_citation_checker_finds_planted_citations(path, text, broken):
    found = citations(path, text)
    assert bool(found) == broken, found


def test_citation_checker_finds_this_checkouts_path():
    here = _here_patterns()
    assert here, f"{ROOT} is too short a path to check"
    assert citations("x.py", f"MODEL = '{ROOT.as_posix()}/models/m'", here)
    assert not citations("x.py", f"MODEL = '{ROOT.as_posix()}-other/models/m'", here)


def test_no_file_cites_a_path_outside_the_repository():
    files = _tracked_text_files()
    assert "README.md" in files, "README.md is not tracked: has the tree moved?"
    here = _here_patterns()
    found = []
    for path in files:
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue   # binary (weights, images) or deleted in the work tree: nothing to cite
        found += citations(path, text, [*OUTSIDE, *here])
    assert not found, "\n".join(found)
