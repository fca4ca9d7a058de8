"""Build-it exercises: the learner writes a kernel; the check runs it and compares it with the mirror.

``check(exercise, kernel)`` takes either

* a per-thread Python kernel (a function ``kernel(cuda, ...)`` with the real kernel's arguments, run by
  ``grid.launch`` through the ``perthread.launch_*`` functions with the real launch shape), which works
  everywhere; or
* CUDA source (the body that goes into ``skeletons.skeleton(exercise)``'s gap, or the whole file), which
  ``buildit_cuda`` compiles with the package's own loader and launches on the GPU.

Exercises: ``"forward"``, ``"atomic"`` (the fp32 atomic backward), ``"wpe"`` and ``"wte_bucketed"``.
Every check draws its problems when it runs (fresh seeds, plus the adversarial shapes: B=1, T < maxT,
C=8, one token 3000 times, all ids distinct, C not a multiple of the channel group), computes what is
expected with the NumPy mirror at that moment, and compares bit for bit. The atomic kernel is the
exception: the order of its adds is decided at run time, so its bits cannot be predicted; it must lie
within ``compare.error_bound`` of the float64 reference instead (and leave untouched rows untouched).

On a failure the returned ``Verdict`` holds the wrong elements, the threads that own them and the first
wrong element's bits; ``Verdict.show()`` draws them. Nothing here holds an answer: the expectations are
computed from the inputs drawn at check time.
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
from . import perthread
from .grid import BarrierHazard, KernelFault
from .skeletons import GAP_MARK, KERNEL_EXERCISES
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


def draw_cases(exercise: str, rng, *, large: bool = False) -> list[tuple[str, Problem]]:
    """The problems of one check, drawn now from ``rng``: random shapes and ids, then the adversarial ones.

    ``large`` adds GPT-2-sized problems (for the GPU, where they cost nothing).
    """
    cases = []
    for dtype in (bfloat16, np.float32):
        size = pack_size(dtype)
        B, T = int(rng.integers(2, 4)), int(rng.integers(3, 13))
        C = size * int(rng.integers(2, 7))
        V = int(rng.integers(5, 40))
        p = random_problem(B, T, C, V, maxT=T + int(rng.integers(0, 4)), dtype=dtype,
                           ids=str(rng.choice(["uniform", "zipf"])), rng=rng)
        cases.append((f"random {np.dtype(dtype).name}", p))
    cases.append(("B=1, T < maxT", random_problem(1, 5, 8, 11, maxT=9, rng=rng)))
    cases.append(("C=8", random_problem(3, 4, 8, 7, rng=rng)))
    one = random_problem(3, 1000, 8, 5, rng=rng)
    cases.append(("one token 3000 times", _with_ids(one, np.full((3, 1000), rng.integers(0, 5)))))
    distinct = random_problem(2, 16, 16, 64, rng=rng)
    cases.append(("all ids distinct (one-item buckets)", _with_ids(distinct, rng.permutation(64)[:32].reshape(2, 16))))
    if exercise == "wte_bucketed":
        cases.append(("C=776 (lanes past C in the last group)", random_problem(2, 3, 776, 4, rng=rng)))
        cases.append(("fp32, C=260", random_problem(2, 5, 260, 6, dtype=np.float32, rng=rng)))
    if large:  # the vocabulary cut to 8192 rows, as in the notebooks: the host-side expectation stays quick
        for dtype in (bfloat16, np.float32):
            cases.append((f"GPT-2 size, Zipf ids, {np.dtype(dtype).name}",
                          random_problem(4, 1024, 768, 8192, dtype=dtype, ids="zipf", rng=rng)))
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


def run_perthread(exercise: str, kernel, p: Problem, seed: int, table: BucketTable | None, rng):
    """Run the learner's per-thread kernel on ``p`` with the real launch shape; tensor name -> result."""
    if exercise == "forward":
        out = poisoned((p.B, p.T, p.C), p.dtype)
        perthread.launch_forward(kernel, out, p.inp, p.wte, p.wpe, rng=rng)
        return {"out": out}
    if exercise == "wpe":
        dwpe = p.dwpe.copy()
        perthread.launch_backward_wpe(kernel, dwpe, p.dout, seed, rng=rng)
        return {"dwpe": dwpe}
    if exercise == "wte_bucketed":
        dwte = p.dwte.copy()
        perthread.launch_backward_wte_bucketed(kernel, dwte, table, p.dout, seed, rng=rng)
        return {"dwte": dwte}
    dwte, dwpe = p.dwte.copy(), p.dwpe.copy()
    perthread.launch_backward_atomic(kernel, dwte, dwpe, p.dout, p.inp, rng=rng)
    return {"dwte": dwte, "dwpe": dwpe}


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
            wrong = ~(np.abs(result - exact) <= bound) & ~(np.isnan(result) & np.isnan(exact))
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


def _is_open(kernel) -> bool:
    return kernel is None or (isinstance(kernel, str) and (GAP_MARK in kernel or not kernel.strip()))


def check(exercise: str, kernel, *, rng=None, show: bool = False, time_it: bool = True) -> Verdict:
    """Run ``kernel`` (per-thread Python or CUDA source) on freshly drawn problems; print and return the verdict.

    ``show`` draws the failure picture. ``time_it`` (CUDA only) times a passing kernel next to the package's.
    """
    if exercise not in KERNEL_EXERCISES:
        raise ValueError(f"exercise must be one of {sorted(KERNEL_EXERCISES)}, got {exercise!r}")
    rng = np.random.default_rng() if rng is None else rng
    cuda_source = isinstance(kernel, str) or kernel is None
    form = "CUDA" if cuda_source else "per-thread Python"
    title = f"Build it ({form}): {TITLES[exercise]}"
    if _is_open(kernel):
        print(f"{title}: not done yet - hint: {HINTS[exercise]}")
        return Verdict(exercise, False, "not done yet")
    runner = None
    if cuda_source:
        from ..loader import KernelCompileError
        from . import buildit_cuda

        try:
            runner = buildit_cuda.Runner.create(exercise, kernel)
        except KernelCompileError as exc:
            print(f"{title}: your kernel does not compile.\n{exc}")
            return Verdict(exercise, False, str(exc))
        if runner is None:
            return Verdict(exercise, False, "no GPU")
    cases = draw_cases(exercise, rng, large=cuda_source)
    for label, p in cases:
        seed = int(rng.integers(0, 2**32))
        table = build_bucket_table(p.inp, p.C, p.dtype) if exercise == "wte_bucketed" else None
        try:
            if cuda_source:
                got = runner.run(p, seed, table)
            else:
                got = run_perthread(exercise, kernel, p, seed, table, rng)
        except NotImplementedError:
            print(f"{title}: not done yet - hint: {HINTS[exercise]}")
            return Verdict(exercise, False, "not done yet")
        except (BarrierHazard, KernelFault) as exc:
            print(f"{title}: FAILED on case '{label}' ({describe(p)}):\n  {exc}")
            return Verdict(exercise, False, str(exc), label)
        want = None if exercise == "atomic" else expected(exercise, p, seed, table)
        verdict = compare_case(exercise, label, p, table, got, want)
        if verdict is not None:
            print(f"{title}: FAILED on case '{label}' ({describe(p)}): {verdict.message}.\n  "
                  f"{verdict.describe_first_wrong()}")
            if show:
                verdict.show()
            return verdict
    how = ("within the error bound of the float64 reference (the order of atomic adds changes from run to run, "
           "so no fixed bits can be asked)" if exercise == "atomic" else "bit for bit equal to the NumPy mirror")
    print(f"{title}: correct - {len(cases)} problems drawn just now ({', '.join(label for label, _ in cases)}), "
          f"{how}.")
    verdict = Verdict(exercise, True, "correct")
    if runner is not None and time_it:
        verdict.timings = runner.time_against_package(rng)
    return verdict


def check_forward(kernel, **kwargs) -> Verdict:
    return check("forward", kernel, **kwargs)


def check_backward_atomic(kernel, **kwargs) -> Verdict:
    return check("atomic", kernel, **kwargs)


def check_backward_wpe(kernel, **kwargs) -> Verdict:
    return check("wpe", kernel, **kwargs)


def check_backward_wte_bucketed(kernel, **kwargs) -> Verdict:
    return check("wte_bucketed", kernel, **kwargs)
