"""What each graded kernel reads and writes, and how the grading process launches it (one home for both sides).

The grader poisons or fills the outputs, checks that the inputs come back unchanged, that no thread wrote more
than its share (``Spec.most_writes``: a kernel is the code of one thread, not one thread doing the whole job)
and compares the outputs; the process that runs the learner's kernel (``grade_child``) launches it with
``launch``. This module
imports only the launchers, so the grading process can use it without the package's kernels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from ..layout import pack_size
from . import grid, launchers


@dataclass(frozen=True)
class Spec:
    """``inputs``: arrays the kernel only reads; ``outputs``: arrays it writes (poisoned, or holding the old
    gradient it adds into); ``scalars``: integers of the case; ``deterministic``: run twice, bits must agree."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    scalars: tuple[str, ...] = ()
    deterministic: bool = True
    packs_per_thread: int = 1  #: the most 128-bit packs of outputs one thread writes (or adds into); 0: one element

    def most_writes(self, arrays: dict) -> int:
        """The most elements of the outputs one thread of a right kernel writes or adds into, for these arrays."""
        if not self.packs_per_thread:
            return 1
        stored = arrays["dout"] if "dout" in arrays else arrays["wte"]
        return self.packs_per_thread * pack_size(stored.dtype)


@dataclass
class Case:
    """One problem of a check: its arrays as the grader keeps them (inputs and the outputs' starting values)."""

    label: str
    arrays: dict
    scalars: dict = field(default_factory=dict)
    runs: int = 1
    problem: object = None  # what the exercise's compare needs beyond the arrays
    description: str = ""


def fresh_rng() -> np.random.Generator:
    """A generator seeded from the operating system, never from anything a learner passes."""
    return np.random.default_rng(int.from_bytes(os.urandom(16), "little"))


SPECS = {
    "forward": Spec(("inp", "wte", "wpe"), ("out",)),
    "atomic": Spec(("dout", "inp"), ("dwte", "dwpe"), deterministic=False, packs_per_thread=2),
    "wpe": Spec(("dout",), ("dwpe",), ("seed",)),
    "wte_bucketed": Spec(("dout", "info", "bt_list"), ("dwte",), ("seed", "num_buckets")),
    "add_bias": Spec(("x", "bias"), ("out",), packs_per_thread=0),
    "warp_sum": Spec(("x",), ("out",), packs_per_thread=0),
    "block_sum": Spec(("x",), ("out",), packs_per_thread=0),
}


def launch(exercise: str, kernel, arrays: dict, scalars: dict, rng) -> tuple[int, int, int, int]:
    """Launch the per-thread ``kernel`` of ``exercise`` on ``arrays`` (outputs written in place); the block, thread
    and element count of the thread that wrote the most elements of global arrays, and the block size."""
    a = arrays
    if exercise == "forward":
        launchers.launch_forward(kernel, a["out"], a["inp"], a["wte"], a["wpe"], rng=rng)
    elif exercise == "atomic":
        launchers.launch_backward_atomic(kernel, a["dwte"], a["dwpe"], a["dout"], a["inp"], rng=rng)
    elif exercise == "wpe":
        launchers.launch_backward_wpe(kernel, a["dwpe"], a["dout"], scalars["seed"], rng=rng)
    elif exercise == "wte_bucketed":
        table = SimpleNamespace(info=a["info"], bt_list=a["bt_list"], num_buckets=scalars["num_buckets"])
        launchers.launch_backward_wte_bucketed(kernel, a["dwte"], table, a["dout"], scalars["seed"], rng=rng)
    elif exercise == "add_bias":
        launchers.launch_add_bias(kernel, a["out"], a["x"], a["bias"], rng=rng)
    elif exercise == "warp_sum":
        launchers.launch_warp_sum(kernel, a["out"], a["x"], rng=rng)
    elif exercise == "block_sum":
        launchers.launch_block_sum(kernel, a["out"], a["x"], rng=rng)
    else:
        raise ValueError(f"no launch for {exercise!r}")
    return grid.last_launch.busiest()
