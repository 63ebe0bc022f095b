"""Integer arithmetic over a case's axes, for suites whose axes are tied to each other.

A suite may derive an axis from others (``batch = "16384 // seq_len"``: tokens per batch
held fixed). Expressions are parsed once into a small tree and evaluated by walking it:
integers, axis names, ``+ - * // %``, unary minus, parentheses, ``min(...)`` and
``max(...)``. Nothing else is accepted (no attribute access, no calls beyond those two, no
``/``), and nothing is ever handed to Python's ``eval``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b}
_FUNCTIONS = {"min": min, "max": max}
# Beyond this an expression is a typo, not a plan (and keeps a hostile suite cheap).
MAX_LENGTH = 200
MAX_MAGNITUDE = 10**15


class ArithError(ValueError):
    """An expression outside the grammar, or one that cannot be evaluated at a point."""


@dataclass(frozen=True)
class Expression:
    text: str
    tree: ast.expr
    names: frozenset[str]

    def __call__(self, env: Mapping[str, int]) -> int:
        value = _evaluate(self.tree, env)
        if abs(value) > MAX_MAGNITUDE:
            raise ArithError(f"{self.text!r} gives {value}, beyond {MAX_MAGNITUDE:g}")
        return value


def parse(text: str, allowed_names) -> Expression:
    """Parse ``text``; names must be among ``allowed_names``. ArithError says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ArithError("must be a non-empty string such as \"16384 // seq_len\"")
    if len(text) > MAX_LENGTH:
        raise ArithError(f"longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ArithError("not an arithmetic expression (allowed: integers, axis names, "
                         "+ - * // %, parentheses, min(), max())") from None
    names = frozenset(_check(tree))
    unknown = sorted(names - set(allowed_names))
    if unknown:
        raise ArithError(f"unknown name {unknown[0]!r}; allowed: "
                         f"{', '.join(sorted(allowed_names))}")
    return Expression(text, tree, names)


def _check(node: ast.expr) -> list[str]:
    """Names used by ``node``; ArithError for anything outside the grammar."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return []
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _check(node.left) + _check(node.right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _check(node.operand)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS and not node.keywords
            and not any(isinstance(a, ast.Starred) for a in node.args)):
        if len(node.args) < 2:  # max(seq_len) would iterate an integer
            raise ArithError(f"{node.func.id}() takes two or more arguments, e.g. "
                             f"{node.func.id}(seq_len, 64)")
        return [n for a in node.args for n in _check(a)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        raise ArithError("'/' is not integer division; use //")
    raise ArithError(f"{ast.unparse(node)!r} is not allowed (allowed: integers, axis names, "
                     f"+ - * // %, parentheses, min(), max())")


def _evaluate(node: ast.expr, env: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        value = env.get(node.id)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArithError(f"{node.id} is {value!r} here, not an integer")
        return value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            raise ArithError(f"division by zero in {ast.unparse(node)!r}")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Call):
        return _FUNCTIONS[node.func.id](*(_evaluate(a, env) for a in node.args))
    raise ArithError(f"cannot evaluate {type(node).__name__}")  # _check rejects it first
