"""What each graded kernel reads and writes, and how the grading process launches it (one home for both sides).

The checker (``grading``) poisons or fills the outputs, checks that the inputs come back unchanged and compares
the outputs; the grading process (``grade_child``) launches the learner's kernel with ``launch``. This module
imports only the launchers, so the grading process can use it without the package's kernels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from . import launchers


@dataclass(frozen=True)
class Spec:
    """``inputs``: arrays the kernel only reads; ``outputs``: arrays it writes (poisoned, or holding the old
    gradient it adds into); ``scalars``: integers of the case; ``deterministic``: run twice, bits must agree."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    scalars: tuple[str, ...] = ()
    deterministic: bool = True


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
    "atomic": Spec(("dout", "inp"), ("dwte", "dwpe"), deterministic=False),
    "wpe": Spec(("dout",), ("dwpe",), ("seed",)),
    "wte_bucketed": Spec(("dout", "info", "bt_list"), ("dwte",), ("seed", "num_buckets")),
    "add_bias": Spec(("x", "bias"), ("out",)),
    "warp_sum": Spec(("x",), ("out",)),
    "block_sum": Spec(("x",), ("out",)),
}


def launch(exercise: str, kernel, arrays: dict, scalars: dict, rng) -> None:
    """Launch the per-thread ``kernel`` of ``exercise`` on ``arrays`` (outputs written in place)."""
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
