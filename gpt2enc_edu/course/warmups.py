"""The warm-up build-its of notebook 00: three small per-thread kernels before the encoder's.

1. ``add_bias``: one thread per element, ``out[r, c] = x[r, c] + bias[c]``; threads past the end do nothing.
2. ``warp_sum``: one warp per 32 values; the lanes add with ``__shfl_down_sync`` (offsets 16, 8, 4, 2, 1) and
   lane 0 writes the sum. The order of the adds is part of the answer: fp32 addition is not associative.
3. ``block_sum``: one block of four warps per 128 values; each warp sums its 32 as in 2, lane 0 of each warp
   leaves its sum in shared memory, and after ``__syncthreads()`` thread 0 adds the four in warp order.

Each has a NumPy spec (``spec_*``, the bits the check expects) and a graded check (``check_*``, run like the
encoder's build-its by ``grading``: a separate process, problems drawn then, inputs checked unchanged, outputs
poisoned). Arrays are fp32 and sums use ``fadd``, the GPU's add. Launch shapes live in ``launchers``.
"""

from __future__ import annotations

import numpy as np

from ..layout import WARP_SIZE
from ..problems import poisoned
from ..rounding import fadd
from .grading import grade, named_check
from .launchers import WARMUP_BLOCK
from .specs import Case
from .verdict import Verdict


def spec_add_bias(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``out[r, c] = x[r, c] + bias[c]`` for ``x`` of shape (R, C), in fp32."""
    return fadd(x, bias[None, :])


def spec_warp_sum(x: np.ndarray) -> np.ndarray:
    """The sum of each 32 values of ``x`` as a warp computes it with ``__shfl_down_sync``: at offset 16, 8, 4, 2
    and 1, lane l adds lane l + offset's value (a lane past the warp gets its own back); lane 0 ends with the sum."""
    v = x.reshape(-1, WARP_SIZE).copy()
    for offset in (16, 8, 4, 2, 1):
        received = v.copy()
        received[:, : WARP_SIZE - offset] = v[:, offset:]
        v = fadd(v, received)
    return v[:, 0].copy()


def spec_block_sum(x: np.ndarray) -> np.ndarray:
    """The sum of each 128 values of ``x``: four warp sums (``spec_warp_sum``), added in warp order."""
    warps = spec_warp_sum(x).reshape(-1, WARMUP_BLOCK // WARP_SIZE)
    total = warps[:, 0]
    for w in range(1, warps.shape[1]):
        total = fadd(total, warps[:, w])
    return total.copy()


TITLES = {"add_bias": "warm-up 1, add a bias", "warp_sum": "warm-up 2, a warp's sum with shuffles",
          "block_sum": "warm-up 3, a block's sum through shared memory"}
HINTS = {
    "add_bias": "i = blockIdx.x * blockDim.x + threadIdx.x is this thread's element; the grid has more threads "
                "than elements, so threads with i >= n return first; the element's column is i % C.",
    "warp_sum": "warp = global thread index // 32, lane = threadIdx.x % 32; load x[warp * 32 + lane], then for "
                "offset 16, 8, 4, 2, 1: value = fadd(value, (yield cuda.shfl_down_sync(value, offset))); lane 0 "
                "writes out[warp]. A warp past the end returns as a whole, before any shuffle.",
    "block_sum": "the warp sum of warm-up 2, then lane 0 of each warp writes it to a shared array of 4 floats; "
                 "`yield cuda.syncthreads()` where every thread reaches it; then thread 0 adds the 4 in order.",
}


class Warmup:
    """One warm-up as ``grading.grade`` runs it."""

    has_cuda = False
    how = "bit for bit equal to the NumPy spec"

    def __init__(self, name: str):
        self.name, self.title, self.hint = name, TITLES[name], HINTS[name]

    def cases(self, rng, gpu: bool = False) -> list[Case]:
        cases = []
        for i in range(5):
            x = rng.standard_normal(self._size(rng, i), dtype=np.float32)
            if self.name == "add_bias":
                R, C = x.shape
                arrays = {"x": x, "bias": rng.standard_normal(C, dtype=np.float32),
                          "out": poisoned(x.shape, np.float32)}
                description = f"R={R}, C={C} ({R * C} elements)"
            else:
                per = WARP_SIZE if self.name == "warp_sum" else WARMUP_BLOCK
                arrays = {"x": x, "out": poisoned(x.size // per, np.float32)}
                count = x.size // per
                description = f"n={x.size} ({count} {'warp' if per == WARP_SIZE else 'block'}{'s' * (count > 1)})"
            cases.append(Case(description, arrays, {}, 2 if i < 2 else 1, {}, description))
        return cases

    def _size(self, rng, i: int):
        if self.name == "add_bias":  # the first problem fits in one block; the others need a partial last block
            return (int(rng.integers(1, 4)), int(rng.integers(1, 30))) if i == 0 else \
                (int(rng.integers(2, 40)), int(rng.integers(1, 70)))
        per = WARP_SIZE if self.name == "warp_sum" else WARMUP_BLOCK
        return per * (1 if i == 0 else int(rng.integers(2, 24 if per == WARP_SIZE else 7)))

    def expected(self, case: Case) -> np.ndarray:
        x = case.arrays["x"]
        if self.name == "add_bias":
            return spec_add_bias(x, case.arrays["bias"])
        return spec_warp_sum(x) if self.name == "warp_sum" else spec_block_sum(x)

    def compare(self, case: Case, got: dict, against: dict | None = None) -> Verdict | None:
        want = self.expected(case) if against is None else against["out"]
        out = got["out"]
        wrong = (out.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(out) & np.isnan(want))
        if not wrong.any():
            return None
        n = out.size
        if self.name == "add_bias":
            flat = np.arange(n).reshape(out.shape)
            block, thread = flat // WARMUP_BLOCK, flat % WARMUP_BLOCK
            names = [f"r={r}" for r in range(out.shape[0])]
        else:
            per_block = WARMUP_BLOCK // WARP_SIZE if self.name == "warp_sum" else 1
            index = np.arange(n)[:, None]
            block = index // per_block
            thread = (index % per_block) * WARP_SIZE
            names = [f"{'warp' if self.name == 'warp_sum' else 'block'} {i}" for i in range(n)]
        as_rows = (lambda a: a.reshape(out.shape)) if out.ndim == 2 else (lambda a: a.reshape(n, 1))
        return Verdict(self.name, False, f"{int(wrong.sum())} of {n} elements of out differ from the spec's bits",
                       case.label, "out", as_rows(want), as_rows(out), as_rows(wrong), as_rows(block),
                       as_rows(thread), names)


def check(name: str, kernel, *, show: bool = False) -> Verdict:
    """The graded check of a warm-up kernel (per-thread Python); prints and returns the verdict."""
    if name not in TITLES:
        raise ValueError(f"warm-up must be one of {sorted(TITLES)}, got {name!r}")
    return grade(Warmup(name), kernel, show=show)


check_add_bias = named_check(check, "add_bias", "check_add_bias")
check_warp_sum = named_check(check, "warp_sum", "check_warp_sum")
check_block_sum = named_check(check, "block_sum", "check_block_sum")
