"""The static check of environment source: advisory, never what contains the code.

Validation runs this on a candidate before it goes near a worker, so that the generation
agent hears early (with line numbers) that its module reaches for things environment code
has no business with. It is *advisory*: Python offers endless ways to reach a module or a
builtin from a string or an object graph, and no list of patterns closes them all. What
contains generated code is the sandbox's kernel layers (PID / network / mount namespaces, a
uid of its own, rlimits, seccomp: isolation.py) or its pod (pods.py); the validation report
says so (`static_check_advisory`) beside the layers that held.

What it refuses (each finding names the line):

| pattern                                                       | why                                           |
|---------------------------------------------------------------|-----------------------------------------------|
| imports outside `worker.ALLOWED_IMPORTS`; relative imports; `from X import <module-like name>` | the worker pre-imports only those |
| any use (call or reference) of eval, exec, compile, open, __import__, breakpoint, input, globals, locals, vars, setattr, delattr | code from strings, other namespaces |
| the names __builtins__, __builtin__, builtins, __loader__, __spec__ and other dunder names (but __name__, __doc__, __all__) | `__builtins__["__import__"]("os")` and its variants |
| dunder attributes but __init__, __name__, __doc__, __qualname__ (so __class__, __mro__, __base__, __subclasses__, __globals__, __dict__, __code__, __getattribute__ ...) | object-graph walks to builtins and modules |
| attributes naming dangerous modules (os, sys, builtins, importlib, types, inspect, threading ...), the aliases under which allowed modules hold them (`random._os`, `enum.bltns`: `forbidden_attrs`) or interpreter internals (modules, f_globals, gi_frame, tb_frame, attrgetter, get_type_hints ...) | `random._os.system`, `dataclasses.sys.modules`, frame walks, attribute getters built from strings |
| getattr / hasattr with a name that is not a literal, unless `getattr(self, f"<prefix>{...}")` with a literal prefix; getattr / hasattr passed as values | names built at run time (the worker's guarded getattr refuses dunder and module names there) |
| pydantic's string-importing types (ImportString, v1.PyObject)  | `TypeAdapter(ImportString).validate_python("os.system")` |
| string literals (not docstrings) that begin or end with "__" or contain a dunder name (but __init__, __name__, __doc__, __main__) | `"{0.__class__}".format(x)`, `"__cl" + "ass__"` halves |
| string annotations that parse to a forbidden expression       | pydantic / typing evaluate them with eval      |
| match class patterns on dunder attributes                     | `case object(__class__=c)`                     |
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import types
from collections.abc import Iterator

from trace_common import pyast

from .worker import ALLOWED_IMPORTS

ADVISORY_NOTE = ("the static check is advisory (pattern-based, bypassable); what contains environment code is the "
                 "sandbox's kernel layers or pod, named in the isolation report")
FORBIDDEN_NAMES = frozenset({"eval", "exec", "compile", "open", "__import__", "breakpoint", "input", "globals",
                             "locals", "vars", "setattr", "delattr", "__builtins__", "__builtin__", "builtins",
                             "__loader__", "__spec__"})
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__doc__", "__all__"})
ALLOWED_DUNDER_ATTRS = frozenset({"__init__", "__name__", "__doc__", "__qualname__"})
ALLOWED_DUNDER_STRINGS = frozenset({"__init__", "__name__", "__doc__", "__main__"})
#: Modules that hand out files, processes, threads, code objects, frames or the import system.
DANGEROUS_MODULES = frozenset({
    "os", "posix", "nt", "sys", "builtins", "importlib", "_imp", "subprocess", "_posixsubprocess", "socket",
    "_socket", "ctypes", "_ctypes", "_thread", "threading", "multiprocessing", "asyncio", "inspect", "types",
    "pathlib", "io", "_io", "codecs", "shutil", "tempfile", "pickle", "_pickle", "marshal", "gc", "resource",
    "mmap", "fcntl", "pty", "runpy", "pkgutil", "zipimport", "linecache", "traceback", "sysconfig"})
#: Attribute names of frames, code objects and attribute getters (whatever object they are read on).
_INTERNAL_ATTRS = frozenset({
    "modules", "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "gi_frame", "gi_code", "cr_frame",
    "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code", "func_globals", "func_code", "_getframe",
    "settrace", "setprofile", "attrgetter", "methodcaller", "get_field", "get_type_hints", "ForwardRef",
    "_evaluate", "evaluate_forward_ref", "_eval_type",
    # pydantic types that import an object named by a string (ImportString("os.system"))
    "ImportString", "PyObject", "v1"})


@functools.cache
def forbidden_attrs() -> frozenset[str]:
    """Attribute names refused everywhere: dangerous module names, internals, and every name under
    which an allowed module (walked three levels deep) holds a dangerous module -- aliases such as
    `random._os`, `collections._sys` or `enum.bltns` (builtins) -- in this interpreter."""
    names = set(DANGEROUS_MODULES) | set(_INTERNAL_ATTRS)
    seen: set[str] = set()

    def visit(mod: types.ModuleType, depth: int) -> None:
        if mod.__name__ in seen or depth > 3:
            return
        seen.add(mod.__name__)
        for key, value in list(vars(mod).items()):
            if isinstance(value, types.ModuleType):
                if value.__name__.split(".", 1)[0] in DANGEROUS_MODULES:
                    names.add(key)
                elif _allowed_import(value.__name__):
                    visit(value, depth + 1)
    for name in ALLOWED_IMPORTS:
        try:
            visit(importlib.import_module(name), 0)
        except ImportError:
            continue
    return frozenset(names)


_DUNDER = re.compile(r"__\w+__")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _allowed_import(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED_IMPORTS)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


def _bad_string(text: str) -> str | None:
    for token in _DUNDER.findall(text):
        if token not in ALLOWED_DUNDER_STRINGS:
            return f"names {token}"
    if text.strip() not in ALLOWED_DUNDER_STRINGS and (text.startswith("__") or text.endswith("__")):
        return "begins or ends with '__' (half a dunder name)"
    return None


def _getattr_name_ok(call: ast.Call) -> str | None:
    """None when a getattr/hasattr call's name is acceptable, else why not."""
    if len(call.args) < 2:
        return "the attribute name is not a literal"
    obj, name = call.args[0], call.args[1]
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        if _is_dunder(name.value) or name.value in forbidden_attrs():
            return f"attribute {name.value!r} is not allowed"
        return None
    if isinstance(obj, ast.Name) and obj.id == "self" and isinstance(name, ast.JoinedStr) and name.values \
            and isinstance(name.values[0], ast.Constant) and not str(name.values[0].value).startswith("__"):
        return None  # getattr(self, f"_{role}"): the instance's own methods by a literal prefix
    return "the attribute name is built at run time"


def findings(source: str) -> Iterator[tuple[int, str]]:
    """(line, problem) for every forbidden pattern in `source` (raises SyntaxError when it does not parse)."""
    tree = pyast.parse(source)
    yield from _walk(tree, _docstring_nodes(tree))


def _walk(tree: ast.AST, docstrings: set[int]) -> Iterator[tuple[int, str]]:
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if not _allowed_import(a.name)]
            if bad:
                yield line, f"import of {', '.join(bad)} is not allowed"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                yield line, "relative imports are not allowed"
            elif not _allowed_import(node.module or ""):
                yield line, f"import from {node.module} is not allowed"
            for alias in node.names:
                if alias.name in forbidden_attrs() or alias.name in FORBIDDEN_NAMES or _is_dunder(alias.name):
                    yield line, f"importing the name {alias.name} from {node.module} is not allowed"
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                yield line, f"call of {node.id}() is not allowed" if id(node) in called else \
                    f"use of {node.id} is not allowed"
            elif node.id in ("getattr", "hasattr") and id(node) not in called:
                yield line, f"{node.id} used as a value (its attribute names could not be checked)"
            elif _is_dunder(node.id) and node.id not in ALLOWED_DUNDER_NAMES:
                yield line, f"use of the name {node.id} is not allowed"
        elif isinstance(node, ast.Attribute):
            if _is_dunder(node.attr) and node.attr not in ALLOWED_DUNDER_ATTRS:
                yield line, f"access to {node.attr} is not allowed"
            elif node.attr in forbidden_attrs():
                yield line, f"access to the attribute {node.attr} is not allowed (it reaches a module, a frame or " \
                            "an attribute getter)"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            why = _getattr_name_ok(node)
            if why:
                yield line, f"{node.func.id}(): {why}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            why = _bad_string(node.value)
            if why:
                yield line, f"a string literal {why}"
        elif isinstance(node, ast.MatchClass):
            for attr in node.kwd_attrs:
                if _is_dunder(attr):
                    yield line, f"a class pattern on {attr} is not allowed"
        if isinstance(node, (ast.AnnAssign, ast.arg, ast.FunctionDef, ast.AsyncFunctionDef)):
            ann = node.returns if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else node.annotation
            yield from _string_annotations(ann, line, docstrings)


def _string_annotations(ann: ast.AST | None, line: int, docstrings: set[int]) -> Iterator[tuple[int, str]]:
    if ann is None:
        return
    for sub in ast.walk(ann):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                inner = pyast.parse(sub.value, mode="eval")
            except SyntaxError:
                yield line, "a string annotation that is not an expression"
                continue
            for _, problem in _walk(inner, docstrings):
                yield line, f"in a string annotation: {problem}"
            if any(isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr)) for n in ast.walk(inner)):
                yield line, "a string annotation with a call in it (annotations are evaluated with eval)"
