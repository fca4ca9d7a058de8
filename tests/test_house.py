"""The house rules that keep the code readable, checked on the tree itself:

* no module over 400 lines and no function over 80 lines in ``gpt2enc_edu/`` and ``scripts/``;
* the tests reach at most 5 private names of the package (``from gpt2enc_edu... import _x``, ``module._x``);
* no import cycle among the package's modules, imports inside functions included, and the arrows between the
  rooms point down: the library imports neither the course (``gpt2enc_edu.course``) nor the bench.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gpt2enc_edu"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
MAX_PRIVATE_NAMES = 5


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if ".ipynb_checkpoints" not in p.parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_modules_and_functions_are_short():
    too_long = []
    for path in _python_files(PACKAGE, "scripts"):
        text = path.read_text()
        where = path.relative_to(ROOT)
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{where}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert too_long == [], f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function: {too_long}"


def _private_names_reached(tree: ast.Module) -> set[str]:
    """``gpt2enc_edu...._x`` names a test module imports or reads as an attribute of a package module it imported."""
    modules, reached = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    reached.add(f"{node.module}.{alias.name}")
                else:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    modules[alias.asname or PACKAGE] = alias.name if alias.asname else PACKAGE
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                reached.add(f"{modules[node.value.id]}.{node.attr}")
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "setattr" and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name) and node.args[0].id in modules
                and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")):
            reached.add(f"{modules[node.args[0].id]}.{node.args[1].value}")  # monkeypatch.setattr(module, "_x", ...)
    return reached


def test_tests_reach_few_private_names():
    reached = {}
    for path in _python_files("tests"):
        for name in _private_names_reached(ast.parse(path.read_text())):
            reached.setdefault(name, []).append(path.name)
    assert len(reached) <= MAX_PRIVATE_NAMES, (
        f"tests reach {len(reached)} private names of the package (at most {MAX_PRIVATE_NAMES}; make the name public "
        f"or test through the public API): {reached}")


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside a function (relative imports resolved)."""
    files = {_module_name(p): p for p in _python_files(PACKAGE)}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # ``from .x import y``: y is the submodule x.y where there is one, else a name of x's
                edges |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names}
        graph[name] = {edge for edge in edges if edge in files and edge != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle():
    graph = _import_graph()
    assert "gpt2enc_edu.buckets.gpu" in graph and graph["gpt2enc_edu.validate"]  # the graph was read
    # The package's __init__ imports the public names of its rooms; a module importing ``from . import x`` goes
    # through it only to reach x, so the edges into the top package itself say nothing about layering.
    graph = {name: edges - {PACKAGE} for name, edges in graph.items()}
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_library_imports_neither_the_course_nor_the_bench():
    rooms = (f"{PACKAGE}.course", f"{PACKAGE}.bench")
    graph = _import_graph()
    library = [name for name in graph if not name.startswith(rooms)]
    upward = {name: sorted(edge for edge in graph[name] if edge.startswith(rooms)) for name in library}
    assert {name: edges for name, edges in upward.items() if edges} == {}
