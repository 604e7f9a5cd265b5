"""The retail `calculate` tool's arithmetic, without `eval`.

tau2 checks that the expression only contains digits, `+-*/().` and spaces, then evaluates it
with Python's `eval` and answers `str(round(float(result), 2))`. That character set still
admits `**`, so `9**9**9**9` would hang a worker; here the expression is compiled with the
same filename (so syntax errors read exactly like tau2's) and its syntax tree is walked with
Python's own operators, refusing powers whose result would be astronomically large.

Semantics:
    if any char not in "0123456789+-*/(). ": raise ValueError("Invalid characters in expression")
    tree = parse(expr, "<string>", "eval")                 # SyntaxError text as eval's
    value = walk(tree)      # ints stay exact ints, "/" is true division, "//" floor, "**" power
    return str(round(float(value), 2))
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from trace_common import pyast

_ALLOWED = set("0123456789+-*/(). ")
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
#: A power whose integer result would exceed this many bits is refused (TRACE guard).
_MAX_POW_BITS = 4096


def calculate_expression(expression: str) -> str:
    if not all(char in _ALLOWED for char in expression):
        raise ValueError("Invalid characters in expression")
    tree = pyast.parse(expression, "<string>", "eval")
    value = _walk(tree.body)
    return str(round(float(value), 2))


def _walk(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_walk(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Call):
        func = _walk(node.func)
        for arg in node.args:
            _walk(arg)
        raise TypeError(f"'{type(func).__name__}' object is not callable")
    raise ValueError("Invalid expression")


def _check_power(base: Any, exponent: Any) -> None:
    if not isinstance(base, (int, float)) or not isinstance(exponent, (int, float)):
        return
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * abs(base).bit_length() > _MAX_POW_BITS:
            raise OverflowError("exponent too large")
