"""Where the CUDA sources are, and the numbers they share with the Python side (``kernels/constants.cuh``).

It imports nothing of the package, so that every module may read the kernels' constants: ``layout`` and
``rounding`` take theirs from ``kernel_constants()``, which parses the header's ``#define NAME value`` lines (an
integer, or an expression of names defined above it), as the preprocessor reads them.
"""

from __future__ import annotations

import ast
import functools
import operator
import re
from pathlib import Path

#: The header every kernel includes (through ``common.cuh``) and ``kernel_constants`` reads.
CONSTANTS_HEADER = "constants.cuh"

_DEFINE = re.compile(r"^#define\s+(\w+)\s+(.+?)\s*$", re.M)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
              ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def kernel_dir() -> Path:
    """The folder holding the ``.cu`` files: inside the installed package, else the checkout's ``kernels/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"kernel sources not found in {here / 'kernels'} or {here.parent / 'kernels'}")


def _evaluate(text: str, known: dict[str, int], name: str) -> int:
    """The value of a ``#define``'s text: integers (a ``u`` suffix allowed), names defined above, + - * / << >>."""
    def value(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"{CONSTANTS_HEADER}: #define {name} {text}: only integers, names defined above and "
                         "+ - * / << >> can be read")
    return value(ast.parse(re.sub(r"\b(\d+)u\b", r"\1", text), mode="eval").body)


@functools.cache
def kernel_constants() -> dict[str, int]:
    """Every ``#define`` of ``kernels/constants.cuh``, by name, as the preprocessor evaluates it."""
    text = re.sub(r"//[^\n]*", "", (kernel_dir() / CONSTANTS_HEADER).read_text())
    known: dict[str, int] = {}
    for name, body in _DEFINE.findall(text):
        known[name] = _evaluate(body, known, name)
    return known
