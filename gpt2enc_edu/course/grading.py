"""The graded check as the notebook calls it: the kernel goes out as text, the verdict comes back.

``grade(exercise, kernel)`` is what every build-it check calls. An open exercise (a stub that only raises
``NotImplementedError``, or CUDA with nothing but comments) is "not done yet" and nothing runs. Otherwise the
kernel becomes text (``pysource.collect`` for per-thread Python: its source and its helpers' sources; CUDA
source as it is), and the grader (``grader``, a process of its own, started ahead of the check) does the rest:
it checks the text again, draws the problems, runs the kernel in a third process, computes the expectation,
compares, records the verdict for ``course.report()`` and sends it back; this module prints it.

This process never computes a verdict: the grader imports nothing from it, so what a notebook does to its own
process (patching NumPy, the checker's functions or this module) cannot change a verdict or a record. The
grader and the process that runs the kernel are started with ``python -I`` (no ``PYTHON*`` variables, no
user site, not this process's ``sys.path``; only the folders NumPy, ml_dtypes and CuPy were found in are
added back, ``site_dirs``), each serves one check and ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import cudasource, pysource, record, wire
from .verdict import Verdict

_GRADER = Path(__file__).resolve().parent / "grader.py"
_ahead: subprocess.Popen | None = None  # a grader started ahead, waiting for its request


def site_dirs() -> list[str]:
    """The folders this Python found NumPy, ml_dtypes and CuPy in (a user site or a ``PYTHONPATH`` folder, say):
    the grading processes add them to their ``sys.path``, which ``-I`` leaves without them."""
    import importlib.util

    dirs = []
    for name in ("numpy", "ml_dtypes", "cupy"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            folder = str(Path(spec.origin).resolve().parents[1])
            if folder not in dirs:
                dirs.append(folder)
    return dirs


def _start() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", str(_GRADER), *site_dirs()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(_GRADER.parent),
                            env={**os.environ, "GPT2ENC_EDU_GRADING": "1"})


def start_ahead() -> None:
    """Start the next grader now, so the next check finds it (and its kernel process) ready; never from inside a
    grading process."""
    global _ahead
    if os.environ.get("GPT2ENC_EDU_GRADING"):
        return
    if _ahead is None or _ahead.poll() is not None:
        _ahead = _start()


def _ask(request: dict) -> tuple[dict, dict]:
    """Send one request to a grader; its reply (header, arrays)."""
    global _ahead
    start_ahead()
    grader, _ahead = _ahead or _start(), None
    try:
        stdout, stderr = grader.communicate(wire.pack(request, {}), timeout=max(wire.TIMEOUT_S.values()) + 120)
    except subprocess.TimeoutExpired:
        grader.kill()
        grader.communicate()
        raise RuntimeError("the grader did not answer in time") from None
    finally:
        start_ahead()
    if grader.returncode != 0 or not stdout:
        raise RuntimeError(f"the grader failed:\n{stderr.decode(errors='replace')[-3000:]}")
    return wire.unpack(stdout)


def named_check(check, exercise: str, name: str):
    """``check`` with its first argument fixed to ``exercise``, under the public name ``name`` (``check_forward``,
    ``check_warp_sum``, ...): the one-argument form a notebook cell calls."""

    def named(kernel, **kwargs) -> Verdict:
        return check(exercise, kernel, **kwargs)

    named.__name__ = named.__qualname__ = name
    named.__doc__ = f"``check({exercise!r}, kernel, **kwargs)``: {check.__doc__}"
    return named


def grade(exercise, kernel, *, show: bool = False, time_it: bool = True) -> Verdict:
    """The graded check of ``kernel`` (per-thread Python function, or CUDA source) for ``exercise`` (an object
    with ``name``, ``title`` and ``hint``); prints the verdict and returns it (``show``: draw a failure)."""
    cuda = isinstance(kernel, str)
    form = "CUDA" if cuda else "per-thread Python"
    title = f"Build it ({form}): {exercise.title}"
    if kernel is None or (cudasource.is_open(kernel, exercise.name) if cuda else pysource.is_stub(kernel)):
        print(f"{title}: not done yet - hint: {exercise.hint}")
        return Verdict(exercise.name, False, "not done yet", status="not done", form=form)
    if cuda:
        payload = kernel
    else:
        try:
            payload = pysource.collect(kernel)
        except pysource.SourceRejected as exc:
            print(f"{title}: refused: {exc}")
            return Verdict(exercise.name, False, f"refused: {exc}", status="refused", form=form)
    header, arrays = _ask({"exercise": exercise.name, "form": form, "payload": payload, "time_it": time_it,
                           "record": str(record.path())})
    verdict = Verdict(**header["verdict"], **arrays)
    print(header["text"])
    if show and not verdict.passed:
        verdict.show()
    return verdict


start_ahead()  # the first check of a notebook finds its grader ready too
