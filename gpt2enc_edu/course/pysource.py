"""A learner's per-thread kernel as source text, ready for the grading process (``grade_child``).

The graded run never calls the learner's function object: it sends its *source* (``inspect.getsource``), and
the sources of the helper functions the learner wrote, to a separate process that compiles them in a fresh
namespace. What else the kernel names is resolved here, in the notebook's process, and sent as plain facts:

* a module or a function of an allowed module (NumPy, ``math``, the emulator ``course.grid``, ``layout``,
  ``rounding``) is imported again in the grading process;
* a function defined in the notebook (or the kernel's own module) is sent as source, under the same rules;
* a constant (a number, a string, a tuple or list of them) is sent as its value (a list as a tuple, so
  threads cannot pass values through it);
* anything else is refused with a message saying why: an array or a list of the notebook (a kernel reads
  only its arguments), any name of the package's own kernels, mirror or the worked solutions (``mirror``,
  ``perthread``, ``solutions``, ...), and the ways around these rules (``eval``/``exec``/``open``/``getattr``,
  ``import`` of other modules, dunder names, private attributes, frame and code attributes, ``global``,
  assignments to attributes or into a module's objects, ``.flags`` and the emulator's own bookkeeping). A kernel
  whose code is one of the package's own per-thread kernels (the same syntax tree, whatever its name and docstring)
  is refused too.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path

import numpy as np

#: Modules a graded per-thread kernel may use (the grading process imports nothing else for it).
ALLOWED_MODULES = ("numpy", "math", "gpt2enc_edu.course.grid", "gpt2enc_edu.layout", "gpt2enc_edu.rounding")
#: Names a graded kernel may not use: the package's own kernels and answers, and the ways around the rules.
FORBIDDEN_NAMES = frozenset({
    "mirror", "perthread", "solutions", "reference", "buildit", "grading", "grade_child", "launchers", "buckets",
    "encoder", "gpt2enc_edu", "eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars",
    "getattr", "setattr", "delattr", "breakpoint", "input", "importlib", "sys", "os", "inspect", "gc", "builtins",
    "subprocess", "ctypes", "pickle", "marshal", "types", "traceback", "threading", "io", "pathlib", "shutil",
})
_FORBIDDEN_ATTRIBUTES = frozenset({"base", "setflags", "flags", "ctypes", "tofile", "dump", "dumps", "frombuffer",
                                   "load", "fromfile", "loadtxt", "genfromtxt", "memmap", "lib", "ctypeslib",
                                   # the emulator's own bookkeeping: a kernel that reaches it could rewrite its record
                                   "forget", "pending", "last_launch", "launch", "Tracker", "Memory", "DeviceArray",
                                   "device_array"})
_FRAME_PREFIXES = ("f_", "gi_", "tb_", "cr_", "ag_", "co_")
#: Builtins the grading process takes away from the learner's namespace (``__import__`` is replaced).
REMOVED_BUILTINS = ("open", "eval", "exec", "compile", "globals", "locals", "vars", "breakpoint", "input",
                    "getattr", "setattr", "delattr", "help", "exit", "quit", "memoryview", "__loader__", "__spec__")


_SCALAR_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                  "float32", "float64")


class SourceRejected(ValueError):
    """The kernel cannot be graded as it is written; the message says what to change."""


def _scan(tree: ast.AST, name: str) -> None:
    """Refuse the constructs of the module docstring's list, naming the line."""
    def refuse(node, why):
        raise SourceRejected(f"{name}, line {getattr(node, 'lineno', '?')}: {why}")

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if getattr(node, "level", 0) or any(m not in ALLOWED_MODULES for m in modules):
                refuse(node, f"a graded kernel may import only {', '.join(ALLOWED_MODULES)}")
            for alias in node.names if isinstance(node, ast.ImportFrom) else ():
                if alias.name.startswith("_") or alias.name in _FORBIDDEN_ATTRIBUTES | FORBIDDEN_NAMES:
                    refuse(node, f"`{alias.name}` is not available to a graded kernel")
        elif isinstance(node, ast.Name) and node.id.startswith("__"):
            refuse(node, f"`{node.id}` is not available to a graded kernel")
        elif isinstance(node, ast.Attribute):
            attr = node.attr
            if attr.startswith("_") or attr.startswith(_FRAME_PREFIXES) or attr in _FORBIDDEN_ATTRIBUTES \
                    or attr in FORBIDDEN_NAMES:
                refuse(node, f"`.{attr}` is not available to a graded kernel")
            if isinstance(node.ctx, ast.Store) or isinstance(node.ctx, ast.Del):
                refuse(node, "a kernel does not assign attributes; threads share data only through arrays")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and \
                isinstance(node.value, ast.Attribute):
            refuse(node, "a kernel writes only into arrays it names (its parameters and the arrays it makes), not "
                         "into a module's or an object's: threads share data only through arrays")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            refuse(node, "a kernel keeps no state outside its arrays (`global`/`nonlocal`)")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            defaults = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            if any(not isinstance(d, ast.Constant) for d in defaults):
                refuse(node, "default values of a kernel's parameters must be constants")
            if getattr(node, "decorator_list", None):
                refuse(node, "a graded kernel has no decorators")


def _function_tree(text: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(text)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise SourceRejected(f"{name}: define the kernel with `def` (a lambda or a generated function has no "
                             "source the grader can read)")
    return tree.body[0]


def _loaded_names(fn: ast.FunctionDef) -> set[str]:
    """Names the function reads that it does not bind itself (its globals and closure variables)."""
    bound = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    bound |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
    loads = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not fn:
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return loads - bound


def _shape(fn: ast.FunctionDef) -> str:
    """The function's syntax tree without its name and docstring: equal for copies of one kernel."""
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and \
        isinstance(getattr(fn.body[0], "value", None), ast.Constant) else fn.body
    return ast.dump(ast.Module(body=body, type_ignores=[]), annotate_fields=False)


def _reference_shapes() -> set[str]:
    """Syntax trees of the package's own per-thread kernels (``perthread.py``, read as text, never imported)."""
    tree = ast.parse((Path(__file__).resolve().parent / "perthread.py").read_text())
    return {_shape(node) for node in tree.body if isinstance(node, ast.FunctionDef)}


def is_stub(kernel) -> bool:
    """True for a function whose body (past its docstring) only raises ``NotImplementedError``: an open exercise."""
    try:
        fn = _function_tree(textwrap.dedent(inspect.getsource(kernel)), getattr(kernel, "__name__", "kernel"))
    except (OSError, TypeError, SyntaxError, SourceRejected):
        return False
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and \
        isinstance(getattr(fn.body[0], "value", None), ast.Constant) else fn.body
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def _constant(value):
    """A JSON form of a constant the kernel reads, or None when ``value`` is not one."""
    if value is None or isinstance(value, (bool, int, float, str)) and not (isinstance(value, str) and
                                                                           len(value) > 200):
        return {"value": value}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"value": value.item(), "dtype": value.dtype.name}
    if isinstance(value, (tuple, list)) and len(value) <= 64:  # a list travels as a tuple: no state to share
        items = [_constant(v) for v in value]
        if all(i is not None and "tuple" not in i for i in items):
            return {"tuple": items}
    return None


def _from_allowed_module(value) -> tuple[str, str] | None:
    """(module, attribute) under which an allowed module holds ``value``, or None."""
    name = getattr(value, "__name__", None)
    for module in ALLOWED_MODULES:
        held = sys.modules.get(module)
        if held is not None and name and getattr(held, name, None) is value:
            return module, name
    return None


def _check_function(text: str, name: str, references: set[str]) -> set[str]:
    """Check the source of one function (see the module docstring); the global names it reads."""
    tree = _function_tree(text, name)
    if tree.name != name:
        raise SourceRejected(f"the source sent for {name} defines {tree.name}")
    _scan(tree, name)
    free = _loaded_names(tree)
    if free & FORBIDDEN_NAMES:
        raise SourceRejected(f"{name} uses `{sorted(free & FORBIDDEN_NAMES)[0]}`, which a graded kernel cannot: it "
                             "would reach the package's own kernels, the checker, or the process around the kernel")
    if _shape(tree) in references:
        raise SourceRejected(f"{name} is the package's own per-thread kernel, not yours: write the kernel yourself")
    return free


def validate(payload) -> dict:
    """Check a payload again where it is graded (the notebook's process may have skipped ``collect``'s checks);
    ``SourceRejected`` for anything ``collect`` would not have produced."""
    try:
        sources, imports, constants = payload["sources"], payload["imports"], payload["constants"]
        references = _reference_shapes()
        for filename, first, text, name, alias in sources:
            if not all(isinstance(v, str) for v in (filename, text, name, alias)) or not isinstance(first, int):
                raise SourceRejected("malformed source entry")
            if not alias.isidentifier():
                raise SourceRejected(f"{alias!r} is not a name")
            _check_function(text, name, references)
        for alias, module, attribute in imports:
            if module not in ALLOWED_MODULES or not str(alias).isidentifier() or \
                    (attribute is not None and (not str(attribute).isidentifier() or attribute.startswith("_")
                                                or attribute in _FORBIDDEN_ATTRIBUTES)):
                raise SourceRejected(f"a graded kernel may use only {', '.join(ALLOWED_MODULES)}")
        for name, constant in constants.items():
            items = constant.get("tuple", [constant])
            if not str(name).isidentifier() or any(not isinstance(i.get("value"), (bool, int, float, str, type(None)))
                                                   or len(str(i.get("value"))) > 200 for i in items):
                raise SourceRejected(f"the constant {name} is not a number or a short string")
            if "dtype" in constant and constant["dtype"] not in _SCALAR_DTYPES:
                raise SourceRejected(f"the constant {name} has dtype {constant['dtype']!r}")
        if payload["name"] not in {entry[3] for entry in sources}:
            raise SourceRejected("the kernel's own source is missing")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, SourceRejected):
            raise
        raise SourceRejected(f"malformed kernel payload ({exc})") from exc
    return payload


def collect(kernel) -> dict:
    """The graded form of ``kernel``: ``{"name", "sources": [[filename, first_line, text, name]], "imports":
    [[alias, module, attribute]], "constants": {name: value}}`` (JSON); ``SourceRejected`` saying why not."""
    if not inspect.isfunction(kernel):
        raise SourceRejected(f"hand the check a function written with `def`, not {type(kernel).__name__}")
    references = _reference_shapes()
    payload = {"name": kernel.__name__, "sources": [], "imports": [], "constants": {}}
    todo, seen = [(kernel.__name__, kernel)], set()
    while todo:
        alias, fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as exc:
            raise SourceRejected(f"{fn.__name__}: its source cannot be read ({exc}); define it in a notebook cell "
                                 "or a file") from exc
        text = textwrap.dedent("".join(lines))
        free = _check_function(text, fn.__name__, references)
        payload["sources"].append([fn.__code__.co_filename, max(first, 1), text, fn.__name__, alias])
        closure = dict(zip(fn.__code__.co_freevars, [c.cell_contents for c in fn.__closure__ or ()]))
        for name in sorted(free):
            if name in closure:
                value = closure[name]
            elif name in fn.__globals__:
                value = fn.__globals__[name]
            else:
                continue  # a builtin (or a NameError the grading process reports like Python would)
            _resolve(name, value, fn, kernel, payload, todo)
    return payload


def _resolve(name: str, value, fn, kernel, payload: dict, todo: list) -> None:
    """Add what ``fn`` reads under ``name`` to ``payload`` (an import, a constant, a helper), or refuse it."""
    if inspect.ismodule(value):
        if value.__name__ not in ALLOWED_MODULES:
            raise SourceRejected(f"{fn.__name__} uses the module {value.__name__} (as `{name}`): a graded kernel "
                                 f"may use only {', '.join(ALLOWED_MODULES)}")
        payload["imports"].append([name, value.__name__, None])
        return
    home = _from_allowed_module(value)
    if home is not None:
        if home[1] in _FORBIDDEN_ATTRIBUTES:
            raise SourceRejected(f"{fn.__name__} uses `{name}` ({home[0]}.{home[1]}), which is not available to a "
                                 "graded kernel")
        payload["imports"].append([name, *home])
        return
    if inspect.isfunction(value) and value.__module__ in ("__main__", kernel.__module__) and \
            not any(part in FORBIDDEN_NAMES for part in value.__module__.split(".")):
        todo.append((name, value))
        return
    constant = _constant(value)
    if constant is not None:
        payload["constants"][name] = constant
        return
    where = getattr(value, "__module__", None) or type(value).__module__
    if any(part in FORBIDDEN_NAMES for part in str(where).split(".")):
        raise SourceRejected(f"{fn.__name__} calls `{name}` from {where}: the package's own kernels, mirror and "
                             "solutions are not accepted as yours")
    raise SourceRejected(f"{fn.__name__} reads `{name}` ({type(value).__name__}) from the notebook: a kernel "
                         "reads only its arguments, constants and functions you wrote")

