"""`trace_common.pyast.parse` from several threads while finalizers run Python code.

With plain `ast.parse` in its place, the first test fails within seconds on CPython 3.11
(SystemError: AST constructor recursion depth mismatch); the serialised parse must succeed every
time and give the tree `ast.parse` gives.
"""

import ast
import sys
import threading

import pytest

from trace_common import pyast

SOURCE = open(ast.__file__).read()  # a large real module: deep trees, many objects
BODY = len(ast.parse(SOURCE).body)


class _Finalized:
    def __del__(self):
        sum(range(50))  # Python code in a finalizer lets the interpreter switch threads mid-parse


def _churn(n: int) -> None:
    for _ in range(n):
        cycle = [_Finalized(), _Finalized()]
        cycle.append(cycle)  # only the cyclic collector frees it: finalizers run during allocations


def test_parallel_parses_with_finalizers_never_fail():
    errors: list[BaseException] = []
    parsed: list[int] = []

    def parse_many() -> None:
        try:
            for _ in range(40):
                parsed.append(len(pyast.parse(SOURCE, "ast.py").body))  # keep no trees: GC stays cheap
        except BaseException as exc:  # noqa: BLE001 - any failure is the test's finding
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    threads = [threading.Thread(target=_churn, args=(200_000,))] + \
        [threading.Thread(target=parse_many) for _ in range(3)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert parsed == [BODY] * 120


@pytest.mark.parametrize(("source", "mode"), [
    ("x = (", "exec"),
    ("1 +", "eval"),
    ("def f(:\n  pass", "exec"),
])
def test_syntax_errors_are_ast_parses(source, mode):
    with pytest.raises(SyntaxError) as got:
        pyast.parse(source, "<string>", mode)
    with pytest.raises(SyntaxError) as want:
        ast.parse(source, "<string>", mode)
    assert (str(got.value), got.value.lineno, got.value.offset) == \
        (str(want.value), want.value.lineno, want.value.offset)


def test_same_tree_as_ast_parse():
    assert ast.dump(pyast.parse("a = [x * 2 for x in b if x]")) == ast.dump(ast.parse("a = [x * 2 for x in b if x]"))
