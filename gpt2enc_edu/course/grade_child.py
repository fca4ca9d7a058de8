"""The grading process: runs a learner's kernel on the cases the checker sends and sends back what it wrote.

The grader starts it as ``python -I <this file> python|cuda <site folders>`` (isolated: no ``PYTHON*``
variables, no user site, not the notebook's ``sys.path``; the folders where the notebook's Python found NumPy,
ml_dtypes and CuPy are added back), writes one request to its stdin and reads one reply (``wire``). A process
for per-thread Python is started ahead of its request (it imports what it needs, then waits), so a
check does not wait for Python and NumPy to start; each serves one request and ends. It never computes
what a kernel should write and never judges it: the grader keeps the problems, computes the expectation after
this process has ended and compares.

Per-thread Python: the kernel arrives as source text and is compiled here in a namespace of its own, with
builtins that cannot import (except the allowed modules), open files or evaluate text. The package is loaded
without its ``__init__`` (so the public API and, through it, the mirror never load) and an import hook refuses
the package's kernels, mirror, checker and the worked solutions. The kernel's prints go to stderr; the reply
leaves through a private copy of stdout. CUDA: the checked source is compiled and launched here; the
package's own kernel is compiled only to time the learner's beside it.
"""

import os
import sys

#: Modules the learner's code can never import here (``prefix`` or ``prefix.*``).
BLOCKED = ("gpt2enc_edu.mirror", "gpt2enc_edu.course.perthread", "gpt2enc_edu.course.buildit",
           "gpt2enc_edu.course.grading", "gpt2enc_edu.course.exercises", "gpt2enc_edu.course.warmups",
           "gpt2enc_edu.encoder", "gpt2enc_edu.reference", "gpt2enc_edu.buckets", "gpt2enc_edu.cuda",
           "gpt2enc_edu.methods", "gpt2enc_edu.bench", "gpt2enc_edu.torch", "solutions")


class _Blocker:
    """A ``sys.meta_path`` finder that refuses the ``BLOCKED`` modules."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{name} cannot be imported while a learner's kernel is graded")
        return None


def _bootstrap(python: bool) -> None:
    """Make ``gpt2enc_edu`` importable from this file's checkout; for Python kernels without its ``__init__``."""
    import types
    from pathlib import Path

    package = Path(__file__).resolve().parents[1]
    if python:
        stub = types.ModuleType("gpt2enc_edu")
        stub.__path__ = [str(package)]
        sys.modules["gpt2enc_edu"] = stub
        sys.meta_path.insert(0, _Blocker())
    else:
        sys.path.insert(0, str(package.parent))


def _learner_namespace(payload: dict):
    """The learner's kernel, compiled from its source in a namespace with guarded builtins."""
    import builtins
    import importlib
    import linecache

    from gpt2enc_edu.course.grid_memory import kernel_numpy
    from gpt2enc_edu.course.pysource import ALLOWED_MODULES, REMOVED_BUILTINS

    real_import = builtins.__import__
    numpy_for_kernels = kernel_numpy()

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        # NumPy's C code imports its own helpers lazily (``x.sum()`` imports numpy._core._methods) through the
        # running frame's builtins, which are these: NumPy's and ml_dtypes' own modules pass.
        inside = name.split(".")[0] in ("numpy", "ml_dtypes")
        if level or not (name in ALLOWED_MODULES or inside):
            raise ImportError(f"a graded kernel may import only {', '.join(ALLOWED_MODULES)} (not {name})")
        if name == "numpy" and globals is namespace:  # the kernel's own `import numpy`: see kernel_numpy
            return numpy_for_kernels
        return real_import(name, globals, locals, fromlist, level)

    safe = {k: v for k, v in vars(builtins).items() if k not in REMOVED_BUILTINS}
    safe["__import__"] = guarded_import
    namespace = {"__builtins__": safe, "__name__": "learner"}
    import numpy as np

    for alias, module, attribute in payload["imports"]:
        held = numpy_for_kernels if module == "numpy" else importlib.import_module(module)
        namespace[alias] = getattr(held, attribute) if attribute else held
    for name, constant in payload["constants"].items():
        value = tuple(c["value"] for c in constant["tuple"]) if "tuple" in constant else constant["value"]
        namespace[name] = np.dtype(constant["dtype"]).type(value) if "dtype" in constant else value
    for filename, first, text, name, alias in payload["sources"]:
        code = compile("\n" * (first - 1) + text, filename, "exec")
        lines = ["\n"] * (first - 1) + text.splitlines(keepends=True)
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
        exec(code, namespace)
        namespace[alias] = namespace[name]
    return namespace[payload["name"]]


def _learner_traceback(exc: BaseException, files: set) -> str:
    """The traceback of an error the kernel raised, trimmed to the learner's own frames."""
    import traceback

    tb = traceback.TracebackException.from_exception(exc)
    tb.stack = traceback.StackSummary.from_list([f for f in tb.stack if f.filename in files] or tb.stack[-1:])
    return "".join(tb.format())[-4000:]


def _run_cases(header: dict, arrays: dict, run_one) -> tuple[dict, dict]:
    """Run every case (``runs`` times each, outputs fresh from the request); stop at the first hazard/error."""
    from gpt2enc_edu.course.grid import Hazard

    reply, out = {"status": "ran"}, {}
    for i, case in enumerate(header["cases"]):
        mine = {name: arrays[f"{i}/{name}"] for name in case["arrays"]}
        written = mine
        for run in range(case["runs"]):
            fresh = {name: a.copy() for name, a in mine.items()}
            try:
                written = run_one(fresh, case["scalars"])
            except NotImplementedError:
                return {"status": "open"}, {}
            except Hazard as exc:
                return {"status": "hazard", "case": i, "message": str(exc), "picture": exc.picture,
                        "kind": type(exc).__name__}, {}
            except Exception as exc:  # the learner's own error: its traceback, trimmed to the learner's lines
                return {"status": "error", "case": i, "message": _learner_traceback(exc, header["files"])}, {}
            out.update({f"{i}/{run}/{name}": written[name] for name in case["outputs"]})
            if "busiest" in written:
                reply.setdefault("busiest", {})[str(i)] = [int(v) for v in written["busiest"]]
        # the inputs as the kernel left them (the emulator's are immutable copies; a GPU's are read back)
        out.update({f"{i}/in/{name}": written.get(name, mine[name]) for name in case["inputs"]})
    return reply, out


def _python(header: dict, arrays: dict) -> tuple[dict, dict]:
    import numpy as np

    from gpt2enc_edu.course import specs

    try:
        kernel = _learner_namespace(header["kernel"])
    except Exception as exc:  # a syntax error, a refused import at definition time
        return {"status": "error", "case": None, "message": _learner_traceback(exc, header["files"])}, {}
    rng = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))

    def run_one(fresh, scalars):
        busiest = specs.launch(header["exercise"], kernel, fresh, scalars, rng)
        return {**fresh, "busiest": busiest}

    return _run_cases(header, arrays, run_one)


def _cuda(header: dict, arrays: dict) -> tuple[dict, dict]:
    from gpt2enc_edu.course import buildit_cuda
    from gpt2enc_edu.loader import CudaUnavailableError, KernelCompileError

    try:
        runner = buildit_cuda.Runner.create(header["exercise"], header["source"])
    except CudaUnavailableError as exc:
        return {"status": "no_gpu", "message": str(exc)}, {}
    except KernelCompileError as exc:
        return {"status": "compile", "message": str(exc)}, {}
    reply, out = _run_cases(header, arrays, runner.run)
    if reply["status"] == "ran" and header.get("time_it"):
        reply["timings"] = runner.time_against_package()
    return reply, out


def main() -> None:
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the kernel's prints (and anything else on stdout) go to stderr, never into the reply
    python = sys.argv[1] == "python"
    sys.path.extend(folder for folder in sys.argv[2:] if folder not in sys.path)  # grading.site_dirs()
    _bootstrap(python)
    from gpt2enc_edu.course import wire

    if python:  # imported before the request arrives: a process started ahead is ready when it comes
        from gpt2enc_edu.course import pysource, specs  # noqa: F401
    request = sys.stdin.buffer.read()
    if not request:  # started ahead, and the notebook ended before it was needed
        return
    header, arrays = wire.unpack(request)
    header["files"] = {s[0] for s in header["kernel"]["sources"]} if python else set()
    reply, out = (_python if python else _cuda)(header, arrays)
    result.write(wire.pack(reply, out))
    result.flush()


if __name__ == "__main__":
    main()
