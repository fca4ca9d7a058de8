"""Build-it exercises: the learner writes a kernel; the graded check runs it and compares it with the mirror.

``check(exercise, kernel)`` takes either

* a per-thread Python kernel (a function ``kernel(cuda, ...)`` with the real kernel's arguments, run by the
  grid emulator through ``launchers`` with the real launch shape), which works everywhere; or
* CUDA source (the body that goes into ``skeletons.skeleton(exercise)``'s gap, or the whole file), which
  ``buildit_cuda`` compiles with the package's own loader and launches on the GPU.

Either way the kernel runs in a separate process (``grading`` says how, and what that defends against).
Exercises: ``"forward"``, ``"atomic"`` (the fp32 atomic backward), ``"wpe"`` and ``"wte_bucketed"``.
Every check draws its problems when it runs, shapes included (random ones, then the adversarial kinds:
B = 1 with T < maxT, odd sizes, one token hundreds of times, all ids distinct, C ending inside a channel group;
on the GPU two GPT-2-sized ones), computes what is expected with the NumPy mirror after the kernel ran, and
compares bit for bit. The atomic kernel is the exception: the order of its adds is decided at run time, so
its bits cannot be predicted; it must lie within ``compare.error_bound`` of the float64 reference instead
(and leave untouched rows untouched).

On a wrong result the returned ``Verdict`` holds the wrong elements, the threads that own them and the first
wrong element's bits; on a hazard (race, divergent barrier, fault) the emulator's picture of the block;
``Verdict.show()`` draws either.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import mirror, reference
from ..buckets import BucketTable, build_bucket_table
from ..compare import error_bound
from ..layout import BLOCK_SIZE, c_per_group, pack_size
from ..problems import Problem, poisoned, random_problem
from ..rounding import bfloat16
from .grading import grade, named_check
from .skeletons import KERNEL_EXERCISES
from .specs import Case
from .verdict import Verdict, elementwise_owner

TITLES = {
    "forward": "the forward kernel",
    "atomic": "the atomic backward (fp32 atomics)",
    "wpe": "the wpe backward",
    "wte_bucketed": "the bucketed wte backward",
}

HINTS = {
    "forward": "the thread map of section 2 gives (b, t, c); the kernel file's header says what it reads.",
    "atomic": "start from the forward's thread map; the header of encoder_backward_atomic.cu says where each "
              "pack is added.",
    "wpe": "the header of encoder_backward_wpe.cu says who owns each dwpe element and in which order it adds.",
    "wte_bucketed": "the header of encoder_backward_wte_bucketed.cu describes the table, the warps' items and "
                    "the combine; every thread must reach the barrier.",
}


def _with_ids(p: Problem, inp: np.ndarray) -> Problem:
    return replace(p, inp=np.ascontiguousarray(inp, dtype=np.int32))


def _with_special_values(p: Problem, rng) -> Problem:
    """``p`` with NaN, +-Inf and subnormals among its inputs, where they meet in the sums: the GPU flushes subnormal
    inputs and results to zero (``-ftz=true``) and keeps NaN and Inf as IEEE arithmetic does, so a kernel that adds
    without ``fadd`` or that clips non-finite values gives other bits."""
    wte, wpe, dout, dwte, dwpe = p.wte.copy(), p.wpe.copy(), p.dout.copy(), p.dwte.copy(), p.dwpe.copy()
    tiny = np.float32(1e-39)  # subnormal in fp32 and in bf16
    token, t = int(p.inp[0, 0]), 0
    wte[token, ::2], wpe[t, ::2] = tiny, tiny  # out[0, 0] adds two subnormals: 0 on the GPU
    dout[p.inp == token] = tiny  # the token's whole gradient is subnormal, onto a zero row: 0 on the GPU
    dwte[token] = 0
    for array in (wte, wpe, dout):
        flat = array.reshape(-1)
        where = rng.choice(flat.size, max(1, flat.size // 50), replace=False)
        flat[where] = rng.choice(np.array([np.nan, np.inf, -np.inf, tiny, -tiny], np.float32), where.size)
    return replace(p, wte=wte, wpe=wpe, dout=dout, dwte=dwte, dwpe=dwpe)


def _channels(rng, dtype, low: int = 1, high: int = 7) -> int:
    return pack_size(dtype) * int(rng.integers(low, high))


def draw_cases(exercise: str, rng, *, large: bool = False) -> list[tuple[str, Problem]]:
    """The problems of one check, drawn now from ``rng``: random shapes and ids, then the adversarial kinds (each
    with shapes drawn too, so no shape is known before the check runs: a kernel right only at some shapes fails).

    ``large`` adds GPT-2-sized problems (for the GPU, where they cost nothing).
    """
    def draw(label, B, T, C, V, dtype=bfloat16, extra_t=None, ids="uniform"):
        maxT = T + (int(rng.integers(1, 5)) if extra_t is None else extra_t)
        cases.append((label, random_problem(B, T, C, V, maxT=maxT, dtype=dtype, ids=ids, rng=rng)))

    # The per-thread bucketed kernel runs a block of 256 threads per bucket: few distinct tokens keep it quick.
    v_high = 8 if exercise == "wte_bucketed" else 40
    cases = []
    for dtype in (bfloat16, np.float32):
        draw(f"random {np.dtype(dtype).name}", int(rng.integers(2, 4)), int(rng.integers(3, 13)),
             _channels(rng, dtype, 2, 7), int(rng.integers(3, v_high)), dtype, int(rng.integers(0, 4)),
             str(rng.choice(["uniform", "zipf"])))
    draw("B=1, T < maxT", 1, int(rng.integers(2, 10)), _channels(rng, bfloat16, 1, 4), int(rng.integers(3, v_high)))
    draw("odd sizes", int(rng.integers(1, 4)), int(rng.integers(1, 8)) * 2 + 1, 8 * (2 * int(rng.integers(1, 4)) + 1),
         int(rng.integers(1, v_high // 2)) * 2 + 1)
    B, T = int(rng.integers(2, 4)), int(rng.integers(150, 300))
    draw("one token hundreds of times", B, T, 8, int(rng.integers(3, 9)))
    label, one = cases[-1]
    cases[-1] = (label, _with_ids(one, np.full((B, T), rng.integers(0, one.V))))
    B, T = int(rng.integers(1, 3)), int(rng.integers(2, 4 if exercise == "wte_bucketed" else 20))
    draw("all ids distinct (one-item buckets)", B, T, 16, B * T + int(rng.integers(0, 30)))
    label, distinct = cases[-1]
    cases[-1] = (label, _with_ids(distinct, rng.permutation(distinct.V)[: B * T].reshape(B, T)))
    # a vocabulary past 8-bit ids and rows past a small C, on few positions so the emulator stays quick
    draw("large vocabulary, wide rows", 1, int(rng.integers(2, 5)), _channels(rng, bfloat16, 16, 33),
         int(rng.integers(300, 3000)))
    label, wide = cases[-1]
    cases[-1] = (label, _with_ids(wide, rng.integers(256, wide.V, (wide.B, wide.T))))
    draw("NaN, Inf and subnormals", int(rng.integers(1, 3)), int(rng.integers(3, 9)), _channels(rng, bfloat16, 2, 5),
         int(rng.integers(3, 9)))
    cases[-1] = (cases[-1][0], _with_special_values(cases[-1][1], rng))
    if exercise == "wte_bucketed":
        draw("C ends inside a channel group (lanes past C)", int(rng.integers(1, 3)), int(rng.integers(2, 5)),
             8 * (32 + int(rng.integers(1, 32))), 3)
        draw("fp32, C ends inside a group", 2, int(rng.integers(2, 6)), 4 * (32 + int(rng.integers(1, 32))), 3,
             np.float32)
    if large:  # the vocabulary cut below 50257 rows: the host-side expectation stays quick
        for dtype in (bfloat16, np.float32):
            draw(f"GPT-2 size (Zipf ids, {np.dtype(dtype).name})", int(rng.integers(1, 9)), int(rng.integers(64, 1025)),
                 768, int(rng.integers(2048, 8193)), dtype, int(rng.integers(0, 64)), "zipf")
    return cases


def describe(p: Problem) -> str:
    return f"B={p.B}, T={p.T}, maxT={p.wpe.shape[0]}, C={p.C}, V={p.V}, {p.dtype.name}"


# ------------------------------------------------------------------------------------------------------
# What each exercise computes, on the mirror and with the learner's per-thread kernel.
def expected(exercise: str, p: Problem, seed: int, table: BucketTable | None) -> dict[str, np.ndarray]:
    """The mirror's result for the deterministic kernels (tensor name -> array)."""
    if exercise == "forward":
        out = poisoned((p.B, p.T, p.C), p.dtype)
        mirror.encoder_forward(out, p.inp, p.wte, p.wpe, p.B, p.T, p.C)
        return {"out": out}
    if exercise == "wpe":
        dwpe = p.dwpe.copy()
        mirror.encoder_backward_wpe(dwpe, p.dout, p.B, p.T, p.C, seed)
        return {"dwpe": dwpe}
    if exercise == "wte_bucketed":
        dwte = p.dwte.copy()
        mirror.encoder_backward_wte_bucketed(dwte, table, p.dout, p.C, seed)
        return {"dwte": dwte}
    raise ValueError(f"no bitwise expectation for {exercise!r}")


def owners(exercise: str, name: str, p: Problem, table: BucketTable | None):
    """(block, thread, row names) of every element of tensor ``name`` under the real launch shape."""
    if exercise == "forward":
        block, thread = elementwise_owner(p.B * p.T, p.C, p.dtype, BLOCK_SIZE)
        return block, thread, [f"b={r // p.T}, t={r % p.T}" for r in range(p.B * p.T)]
    rows = p.V if name == "dwte" else p.wpe.shape[0]
    names = [f"{'token' if name == 'dwte' else 't'}={r}" for r in range(rows)]
    if exercise == "wpe":
        return (*elementwise_owner(rows, p.C, p.dtype, BLOCK_SIZE, first_rows=p.T), names)
    block = np.full((rows, p.C), -1, dtype=np.int64)
    thread = np.full((rows, p.C), -1, dtype=np.int64)
    if exercise == "wte_bucketed":  # warp 0 of the bucket's block writes; lane l owns its pack
        group, size = c_per_group(p.dtype), pack_size(p.dtype)
        for bucket, (_, _, ix, g) in enumerate(table.info.tolist()):
            c = np.arange(g * group, min(p.C, (g + 1) * group))
            block[ix, c] = bucket
            thread[ix, c] = (c - g * group) // size
    return block, thread, names


def compare_case(exercise: str, label: str, p: Problem, table, got: dict, want: dict | None):
    """A failing ``Verdict`` for the first tensor that is wrong, or None when the case passes."""
    if exercise == "atomic":
        ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
        counts = np.bincount(p.inp.reshape(-1), minlength=p.V)
        terms = {"dwte": (counts + 1)[:, None], "dwpe": np.where(np.arange(p.wpe.shape[0]) < p.T, p.B + 1, 1)[:, None]}
        old = {"dwte": p.dwte, "dwpe": p.dwpe}
        untouched = {"dwte": (counts == 0)[:, None], "dwpe": (np.arange(p.wpe.shape[0]) >= p.T)[:, None]}
        for name, value, exact, magnitude in (("dwte", ref.dwte, ref.dwte, ref.dwte_abs),
                                              ("dwpe", ref.dwpe, ref.dwpe, ref.dwpe_abs)):
            bound = error_bound(p.dtype, magnitude, terms[name])
            result = got[name].astype(np.float64)
            with np.errstate(invalid="ignore"):  # inf - inf where the sums hold Inf: compared as equal values below
                near = np.abs(result - exact) <= bound
            wrong = ~(near | (result == exact) | (np.isnan(result) & np.isnan(exact)))
            same_bits = got[name].view(np.uint16 if p.dtype.itemsize == 2 else np.uint32) == \
                old[name].view(np.uint16 if p.dtype.itemsize == 2 else np.uint32)
            wrong |= untouched[name] & ~same_bits
            if wrong.any():
                block, thread, names = owners(exercise, name, p, table)
                nearest = value.astype(p.dtype)  # the reference, rounded: what "expected" shows
                return Verdict(exercise, False, f"{int(wrong.sum())} of {wrong.size} elements of {name} are "
                               "outside the error bound of the float64 reference (or changed although nothing "
                               "adds into them)", label, name, nearest, got[name], wrong, block, thread, names)
        return None
    for name, want_value in want.items():
        a = got[name].reshape(-1, p.C)
        e = want_value.reshape(-1, p.C)
        bits = np.uint16 if p.dtype.itemsize == 2 else np.uint32
        wrong = (a.view(bits) != e.view(bits)) & ~(np.isnan(a.astype(np.float32)) & np.isnan(e.astype(np.float32)))
        if wrong.any():
            block, thread, names = owners(exercise, name, p, table)
            return Verdict(exercise, False, f"{int(wrong.sum())} of {wrong.size} elements of {name} differ from the "
                           "mirror's bits", label, name, e, a, wrong, block, thread, names)
    return None


class BuildIt:
    """One kernel exercise as ``grading.grade`` runs it: its problems and its comparison."""

    has_cuda = True

    def __init__(self, name: str):
        self.name, self.title, self.hint = name, TITLES[name], HINTS[name]
        self.how = ("within the error bound of the float64 reference (the order of atomic adds changes from run to "
                    "run, so no fixed bits can be asked)" if name == "atomic" else "bit for bit equal to the mirror")

    def cases(self, rng, gpu: bool) -> list[Case]:
        out = []
        for i, (label, p) in enumerate(draw_cases(self.name, rng, large=gpu)):
            seed = int(rng.integers(0, 2**32))
            table = build_bucket_table(p.inp, p.C, p.dtype) if self.name == "wte_bucketed" else None
            arrays = {"forward": {"inp": p.inp, "wte": p.wte, "wpe": p.wpe, "out": poisoned((p.B, p.T, p.C), p.dtype)},
                      "atomic": {"dout": p.dout, "inp": p.inp, "dwte": p.dwte, "dwpe": p.dwpe},
                      "wpe": {"dout": p.dout, "dwpe": p.dwpe},
                      "wte_bucketed": {"dout": p.dout, "dwte": p.dwte}}[self.name]
            scalars = {} if self.name in ("forward", "atomic") else {"seed": seed}
            if table is not None:
                arrays.update(info=table.info, bt_list=table.bt_list)
                scalars["num_buckets"] = int(table.num_buckets)
            runs = 2 if self.name != "atomic" and (gpu or i < 2) else 1
            out.append(Case(label, arrays, scalars, runs, {"p": p, "seed": seed, "table": table}, describe(p)))
        return out

    def compare(self, case: Case, got: dict, against: dict | None = None) -> Verdict | None:
        """A failing verdict for ``got`` (against the expectation, computed now, or against another run)."""
        p, seed, table = case.problem["p"], case.problem["seed"], case.problem["table"]
        if against is None and self.name != "atomic":
            if "want" not in case.problem:
                case.problem["want"] = expected(self.name, p, seed, table)
            against = case.problem["want"]
        return compare_case(self.name, case.label, p, table, got, against)


def check(exercise: str, kernel, *, show: bool = False, time_it: bool = True) -> Verdict:
    """The graded check of ``kernel`` (per-thread Python or CUDA source) on problems drawn now, in a separate
    process (``grading``); prints and returns the verdict. ``show`` draws the failure picture. ``time_it`` (CUDA
    only) times a passing kernel next to the package's."""
    if exercise not in KERNEL_EXERCISES:
        raise ValueError(f"exercise must be one of {sorted(KERNEL_EXERCISES)}, got {exercise!r}")
    return grade(BuildIt(exercise), kernel, show=show, time_it=time_it)


check_forward = named_check(check, "forward", "check_forward")
check_backward_atomic = named_check(check, "atomic", "check_backward_atomic")
check_backward_wpe = named_check(check, "wpe", "check_backward_wpe")
check_backward_wte_bucketed = named_check(check, "wte_bucketed", "check_backward_wte_bucketed")
