"""The answers a notebook keeps closed until asked: the package's per-thread forms and the CUDA kernel files.

A notebook run from top to bottom must not print the answer of a build-it right under the learner's empty
attempt. So the cell after each build-it calls ``perthread(name, unlocked=verdict)`` or ``kernel(name,
unlocked=verdict)``: the source is shown once the learner's check passed (a ``Verdict`` is true then), or when
the learner asks with ``unlocked=True``; otherwise one line says how to open it. ``name`` is the build-it's
name, the same as ``skeletons.KERNEL_EXERCISES``'s keys.
"""

from __future__ import annotations

import inspect

from gpt2enc_edu.course import perthread as _perthread
from gpt2enc_edu.course.skeletons import KERNEL_EXERCISES
from gpt2enc_edu.loader import kernel_source

#: The package's per-thread form (in ``course/perthread.py``) of each build-it.
PER_THREAD = {
    "forward": _perthread.encoder_forward,
    "atomic": _perthread.encoder_backward_atomic_fp32,
    "wpe": _perthread.encoder_backward_wpe,
    "wte_bucketed": _perthread.encoder_backward_wte_bucketed,
}


def _show(text: str, language: str) -> None:
    try:
        from IPython.display import Markdown, display
    except ImportError:  # outside a notebook: plain text
        print(text)
        return
    display(Markdown(f"```{language}\n{text}\n```"))


def _closed(what: str, call: str) -> None:
    print(f"{what} opens once your kernel above passes its check (try it first); to open it now: {call}")


def _check(name: str, known) -> None:
    if name not in known:
        raise ValueError(f"no build-it named {name!r}; the names are {', '.join(map(repr, known))}")


def perthread(name: str, *, unlocked) -> None:
    """Show the package's per-thread form of build-it ``name`` if ``unlocked`` is true, else how to open it."""
    _check(name, PER_THREAD)
    if not unlocked:
        _closed(f"The package's per-thread form of {name!r}", f"reveal.perthread({name!r}, unlocked=True)")
        return
    _show(inspect.getsource(PER_THREAD[name]), "python")


def kernel(name: str, *, unlocked) -> None:
    """Show the whole CUDA file of build-it ``name`` (as the package compiles it) if ``unlocked`` is true, else
    how to open it."""
    _check(name, KERNEL_EXERCISES)
    file = KERNEL_EXERCISES[name].file
    if not unlocked:
        _closed(f"kernels/{file}", f"reveal.kernel({name!r}, unlocked=True)")
        return
    _show(kernel_source(file), "cuda")
