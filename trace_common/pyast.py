"""`ast.parse` that several threads may call at once.

Why this exists: CPython 3.11 keeps the AST constructor's recursion counter in interpreter-wide
state. Building the tree's Python objects can run a garbage-collector finalizer, which lets the
interpreter switch threads; a second thread parsing then moves the same counter, and one of the two
parses fails with `SystemError: AST constructor recursion depth mismatch (before=.., after=..)`
(cpython gh-106905 and its duplicates; seen here when the environment service validated two
capability environments in parallel, and reproduced by tests/unit/test_pyast.py in under a second
without this lock). Parsing is quick, so one process-wide lock costs nothing measurable. The lock is
re-entrant because a finalizer run inside a parse may itself parse.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.RLock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)` serialised across threads (same result, same errors)."""
    with _LOCK:
        return ast.parse(source, filename, mode)
