"""Checks for the exercises in notebooks 01-06 (the arithmetic ones; ``buildit`` checks the kernels).

Each notebook has a function stub for the learner to fill in; it raises ``NotImplementedError`` until
then. The notebook's next cell hands the function to a ``check_*`` function here, which

* prints ``Exercise N (...): not done yet - hint: ...`` and returns ``False`` while the stub still raises
  ``NotImplementedError`` (so the notebook runs cleanly from top to bottom with the exercises open);
* raises ``ExerciseError`` (an ``AssertionError``) naming the first wrong case when an answer is wrong;
* prints ``Exercise N (...): correct`` and returns ``True`` when every case agrees.

What keeps the checks honest: every problem is drawn when the check runs (fresh, unseeded generators:
no seed in this file), so an answer recorded from one run or typed in as a table fails the next; the
expected answers are computed at that moment from the package itself (the forward's launch shape, the
token counts, the bucket table, the exact rounding rule, ``bench.floor.minimal_bytes``); exact answers
are compared exactly (the rounding probability is checked on every one of the 65536 patterns of the
dropped bits); integer answers must be integers (``12.0`` or ``12 + 0.9`` is not a byte count, ``True``
is not a bucket index). Worked solutions live outside the package, in ``solutions/exercises.py``.

These checks run in the notebook's own process (a learner could patch them there); ``course.report()`` lists
them as "in-process", apart from the build-its, which are graded in a separate process (``grading``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..backend import array_module, to_numpy
from ..layout import CHUNK_ITEMS, pack_size
from ..rounding import bfloat16
from . import record


class ExerciseError(AssertionError):
    """A filled-in exercise returned a wrong answer; the message names the case."""


@dataclass(frozen=True)
class Exercise:
    """One exercise: its number (the notebook's), a short title and the hint printed while it is open."""

    number: int
    title: str
    hint: str

    def not_done(self) -> NotImplementedError:
        """The error a stub raises: ``raise EXERCISES[1].not_done()`` (a plain ``NotImplementedError`` works too)."""
        return NotImplementedError(f"Exercise {self.number}: {self.title} (not filled in yet)")


EXERCISES = {
    1: Exercise(1, "which thread writes out[b, t, c]",
                "section 2 (which thread computes what): how a thread turns its index into the flat index of the "
                "first element of its pack, and back into (b, t, c)."),
    2: Exercise(2, "which dwte rows can change between atomic runs (dwte starting at zero)",
                "for each row, list the orders in which its adds can arrive, and ask which of them can give "
                "different fp32 results when the row starts at 0 (section 3, float addition is not associative)."),
    3: Exercise(3, "find the bucket and item of dout[b, t, c]",
                "the bucket table's documented order (section 2 of this notebook, and the docstring of "
                "gpt2enc_edu.buckets): which bucket holds a (token, channel group), and how its items are sorted."),
    4: Exercise(4, "probability that stochastic rounding moves away from zero",
                "section 4 (the 16-bit threshold trick) and round_to_storage in kernels/common.cuh: when are the "
                "dropped bits set to ones, and how is the threshold distributed?"),
    5: Exercise(5, "the minimal bytes of the backward",
                "section 1 of this notebook (minimal bytes): which arrays must the backward read, which must it "
                "write, and which rows of the gradients does it touch at all?"),
    6: Exercise(6, "find the unit, channel group and item of dout[b, t, c]",
                "section 2 (the words): a unit is one chunk of one token, and its row of table.units says which "
                "token, which chunk and where the token's whole list lies in bt_list; a warp sums one channel group."),
}


class _NotDone(Exception):
    """The learner's function raised NotImplementedError: the exercise is still open."""


def _call(fn, *args):
    """Call the learner's function on copies of ``args`` (so that an answer which overwrites its inputs cannot change
    what the check compares it with); its ``NotImplementedError`` means "not done", anything else propagates."""
    try:
        return fn(*copy.deepcopy(args))
    except NotImplementedError as exc:
        raise _NotDone() from exc


def _report(number: int, check) -> bool:
    """Run ``check()``; print whether exercise ``number`` is open or correct, record a wrong or right answer for
    ``course.report()`` (form "in-process"), and return True when correct."""
    exercise = EXERCISES[number]
    try:
        check()
    except _NotDone:
        print(f"Exercise {number} ({exercise.title}): not done yet - hint: {exercise.hint}")
        return False
    except ExerciseError as exc:
        record.add(f"exercise {number}", "in-process", SimpleNamespace(status="failed", message=str(exc)))
        raise
    record.add(f"exercise {number}", "in-process", SimpleNamespace(status="correct", message="correct"))
    print(f"Exercise {number} ({exercise.title}): correct.")
    return True


def _xp(xp):
    """The array module to run a check on: ``xp``, or the active backend's by default."""
    return array_module() if xp is None else xp


def _as_int_array(value, name: str, number: int, shape) -> np.ndarray:
    """``value`` as an int64 NumPy array of ``shape``, or ExerciseError saying what came back instead."""
    array = to_numpy(value)
    if array.shape != tuple(shape):
        raise ExerciseError(f"Exercise {number}: {name} should have shape {tuple(shape)}, got {array.shape}")
    if array.dtype.kind not in "iu":
        raise ExerciseError(f"Exercise {number}: {name} should hold integers, got {array.dtype}")
    return array.astype(np.int64)


def _as_int(value, name: str, number: int) -> int:
    """``value`` if it is an integer (Python or NumPy, not bool); ExerciseError for floats and anything else."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ExerciseError(f"Exercise {number}: {name} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


# ------------------------------------------------------------------------------------------------------
# Exercise 1 (notebook 01): the forward kernel's thread map, backwards.
def check_element_to_thread(fn, xp=None) -> bool:
    """Check ``fn(b, t, c, T, C, dtype) -> (thread, k)``: which thread of the forward kernel writes
    ``out[b, t, c]``, and at which place ``k`` of its 128-bit pack.

    ``b``, ``t``, ``c`` are ``xp`` int64 arrays listing every element of a (B, T, C) tensor, for shapes drawn
    now. The expected thread is the one whose index math (``idx = thread * x128::size``) lands on the pack.
    """
    xp = _xp(xp)
    rng = np.random.default_rng()
    cases = [(1, 1, 8, bfloat16)] + [(int(rng.integers(1, 5)), int(rng.integers(1, 40)),
                                      pack_size(dtype) * int(rng.integers(1, 100)), dtype)
                                     for dtype in (bfloat16, np.float32, bfloat16, np.float32)]

    def check():
        for B, T, C, dtype in cases:
            size = pack_size(dtype)
            b, t, c = (xp.asarray(a.reshape(-1)) for a in np.indices((B, T, C), dtype=np.int64))
            answer = _call(fn, b, t, c, T, C, dtype)
            if not isinstance(answer, tuple) or len(answer) != 2:
                raise ExerciseError("Exercise 1: return a tuple (thread, k) of two arrays")
            thread, k = (_as_int_array(a, name, 1, b.shape) for a, name in zip(answer, ("thread", "k")))
            starts = np.arange(0, B * T * C, size)  # thread i starts its pack at flat element starts[i]
            flat = np.arange(B * T * C)
            want_thread = np.searchsorted(starts, flat, side="right") - 1
            want_k = flat - starts[want_thread]
            wrong = np.flatnonzero((thread != want_thread) | (k != want_k))
            if wrong.size:
                i = int(wrong[0])
                where = tuple(int(v) for v in np.unravel_index(i, (B, T, C)))
                raise ExerciseError(
                    f"Exercise 1: B={B}, T={T}, C={C} ({np.dtype(dtype).name}, {size} per pack): out{list(where)} "
                    f"is element k={want_k[i]} of thread {want_thread[i]}'s pack, your function gave "
                    f"thread {thread[i]}, k={k[i]}")

    return _report(1, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 2 (notebook 02): where the atomic backward's order can show.
def _adds_per_row(inp, V: int) -> np.ndarray:
    return np.bincount(to_numpy(inp).reshape(-1), minlength=V)


def check_rows_that_can_differ(fn, xp=None, runs: int = 4) -> bool:
    """Check ``fn(inp, V) -> mask``: a (V,) boolean array, True for the dwte rows whose bits can depend on
    the order of the atomic adds, when dwte starts at zero (a fresh gradient) and is stored in fp32.

    A row with no add or one add has one possible result; a row with two adds too, because it starts at
    zero: ``(0 + a) + b == (0 + b) + a``. From three adds on, ``(a + b) + c`` and ``(a + c) + b`` can round
    differently. The ids are drawn now; then the package's atomic backward runs ``runs`` times from zero,
    and every row that changed bits must be in the mask.
    """
    import gpt2enc_edu as enc

    from ..tokens import make_ids

    xp = _xp(xp)
    rng = np.random.default_rng()
    cases = [(np.array([[5, 2, 5], [2, 9, 5]], dtype=np.int32), 12)]
    for kind in ("zipf", "uniform", "zipf"):
        V = int(rng.integers(8, 80))
        cases.append((make_ids(kind, int(rng.integers(1, 5)), int(rng.integers(4, 70)), V=V, seed=rng), V))

    def check():
        for inp, V in cases:
            mask = to_numpy(_call(fn, xp.asarray(inp), V))
            if mask.shape != (V,) or mask.dtype != np.bool_:
                raise ExerciseError(f"Exercise 2: return a boolean array of shape ({V},), "
                                    f"got {mask.dtype} of shape {mask.shape}")
            counts = _adds_per_row(inp, V)
            wrong = np.flatnonzero(mask != (counts >= 3))
            if wrong.size:
                row = int(wrong[0])
                raise ExerciseError(f"Exercise 2: token {row} occurs {counts[row]} times in inp "
                                    f"{inp.tolist() if inp.size <= 8 else f'(shape {inp.shape})'}, so with dwte "
                                    f"starting at zero its row {'can' if counts[row] >= 3 else 'cannot'} change, "
                                    f"your mask says {bool(mask[row])}")
        # The demonstration: run the real thing from zero and look.
        inp, V = max(cases, key=lambda case: int(_adds_per_row(*case).max()))
        B, T = inp.shape
        dout = rng.standard_normal((B, T, 64), dtype=np.float32)
        results = []
        for _ in range(runs):
            dwte, dwpe = xp.zeros((V, 64), dtype=np.float32), xp.zeros((T, 64), dtype=np.float32)
            enc.encoder_backward(dwte, dwpe, xp.asarray(dout), xp.asarray(inp), seed=0, method="atomic")
            results.append(to_numpy(dwte))
        changed = np.zeros(V, dtype=bool)
        for r in results[1:]:
            changed |= (r.view(np.uint32) != results[0].view(np.uint32)).any(axis=1)
        mask = to_numpy(_call(fn, xp.asarray(inp), V))
        if (changed & ~mask).any():
            raise ExerciseError(f"Exercise 2: rows {np.flatnonzero(changed & ~mask).tolist()} changed although "
                                "they get at most two adds: please report this, it is a bug in the package")
        print(f"In {runs} runs of the atomic kernel ({enc.last_backend().name}) from dwte = 0, {int(changed.sum())} "
              f"rows changed bits, all among the {int(mask.sum())} rows you predicted.")

    return _report(2, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 3 (notebook 03): reading the bucket table.
def check_locate(fn, samples: int = 200) -> bool:
    """Check ``fn(table, inp, b, t, c) -> (bucket, item)``: which bucket of ``table`` (a ``make_buckets``
    table of the NumPy array ``inp``) reads ``dout[b, t, c]``, and at which item of the bucket; both must be
    integers. The ids, shapes and picks are drawn now. The bucket table is built on the CPU in the package
    too, so this exercise is NumPy only.
    """
    import gpt2enc_edu as enc

    from ..tokens import make_ids

    rng = np.random.default_rng()
    cases = [(np.array([[5, 2, 5], [2, 9, 5]], dtype=np.int32), 512, bfloat16)]
    for kind, dtype in (("zipf", bfloat16), ("uniform", np.float32), ("zipf", np.float32)):
        C = pack_size(dtype) * int(rng.integers(1, 100))
        cases.append((make_ids(kind, int(rng.integers(1, 5)), int(rng.integers(2, 40)),
                               V=int(rng.integers(5, 60)), seed=rng), C, dtype))

    def check():
        for inp, C, dtype in cases:
            table = enc.make_buckets(inp, C, dtype)
            B, T = inp.shape
            where = {}  # (bt, channel group) -> (bucket, item), read off the table as the kernel reads it
            for bucket, (start, size, _, group) in enumerate(table.info.tolist()):
                for item, bt in enumerate(table.bt_list[start : start + size].tolist()):
                    where[(bt, group)] = (bucket, item)
            picks = np.stack([rng.integers(0, B, samples), rng.integers(0, T, samples),
                              rng.integers(0, C, samples)], axis=1)
            for b, t, c in picks.tolist():
                answer = _call(fn, table, inp, b, t, c)
                want = where[(b * T + t, c // table.c_per_group)]
                if not isinstance(answer, (tuple, list)) or len(answer) != 2:
                    raise ExerciseError(f"Exercise 3: return (bucket, item) as two integers, got {answer!r}")
                got = (_as_int(answer[0], "bucket", 3), _as_int(answer[1], "item", 3))
                if got != want:
                    raise ExerciseError(f"Exercise 3: inp={inp.tolist() if inp.size <= 8 else inp.shape}, "
                                        f"C={C}, (b, t, c)=({b}, {t}, {c}): bucket {want[0]} item {want[1]} "
                                        f"reads it, your function gave {answer!r}")

    return _report(3, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 4 (notebook 04): the probability behind stochastic rounding.
def _every_dropped_pattern(rng) -> np.ndarray:
    """fp32 values with every one of the 65536 patterns of the 16 bits bf16 drops, under high halves drawn now
    (finite, both signs, small and large exponents)."""
    highs = [int(rng.integers(0x0080, 0x7F00)), int(rng.integers(0x8080, 0xFF00)), 0x3F80, 0xC040]
    low = np.arange(1 << 16, dtype=np.uint32)
    bits = np.concatenate([(np.uint32(high) << np.uint32(16)) | low for high in highs])
    return rng.permutation(bits).view(np.float32)


def check_away_from_zero_probability(fn, xp=None, draws: int = 1 << 14) -> bool:
    """Check ``fn(x) -> p``: for each fp32 value of the ``xp`` array ``x``, the probability that
    ``stochastic_round_bf16`` stores the bf16 neighbour farther from zero.

    The threshold is a uniform 16-bit integer, so every probability is a multiple of 1/65536 and is checked
    exactly, for all 65536 patterns of the dropped bits. Then, as a demonstration, the package's rounding is
    drawn ``draws`` times for a few values (seed drawn now) and the observed frequencies are printed.
    """
    from ..rounding import stochastic_round_bf16

    xp = _xp(xp)
    rng = np.random.default_rng()
    values = _every_dropped_pattern(rng)

    def check():
        p = _call(fn, xp.asarray(values))
        p = to_numpy(p)
        if p.shape != values.shape or p.dtype.kind != "f":
            raise ExerciseError(f"Exercise 4: return one float probability per value, shape {values.shape}, "
                                f"got {p.dtype} of shape {p.shape}")
        exact = (values.view(np.uint32) & np.uint32(0xFFFF)).astype(np.float64) / 65536.0
        wrong = np.flatnonzero(p.astype(np.float64) != exact)
        if wrong.size:
            i = int(wrong[0])
            raise ExerciseError(f"Exercise 4: x = {values[i]!r} (bits 0x{int(values.view(np.uint32)[i]):08x}): "
                                f"your probability {p[i]!r} is not the exact one ({len(wrong)} of {values.size} "
                                "values wrong; every answer is a multiple of 1/65536, so it must match exactly)")
        seed, elements = int(rng.integers(0, 2**32)), np.arange(draws, dtype=np.uint32)
        shown = values[rng.choice(values.size, 3, replace=False)]
        for value in shown.tolist():
            rounded = stochastic_round_bf16(np.full(draws, value, np.float32), elements, 0, seed)
            observed = float((np.abs(rounded.astype(np.float64)) > abs(value)).mean())
            p_value = float(p[np.flatnonzero(values == np.float32(value))[0]])
            print(f"x = {value:.6g}: you say {p_value:.5f}, the package rounded away from zero in {observed:.5f} "
                  f"of {draws} draws")

    return _report(4, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 5 (notebook 05): the floor of the deterministic backward.
def check_backward_bytes(fn, xp=None) -> bool:
    """Check ``fn(inp, C, itemsize) -> int``: the bytes the encoder backward cannot avoid moving for the
    ``xp`` ids ``inp`` (B, T), C channels and ``itemsize`` bytes per stored element (2 for bf16, 4 for fp32),
    against ``bench.floor.minimal_bytes("backward", ...)`` for uniform, Zipf and real ids of shapes drawn now.
    The answer must be an integer (a Python or NumPy int, not a float)."""
    from ..bench.floor import distinct_ids, minimal_bytes
    from ..tokens import make_ids

    xp = _xp(xp)
    rng = np.random.default_rng()
    cases = [(kind, int(rng.integers(1, 5)), int(rng.integers(1, 300)), 4 * int(rng.integers(1, 200)), itemsize)
             for kind, itemsize in (("uniform", 2), ("zipf", 2), ("real", 4), ("zipf", 4))]

    def check():
        for kind, B, T, C, itemsize in cases:
            inp = make_ids(kind, B, T, seed=rng)
            expected = minimal_bytes("backward", B=B, T=T, C=C, distinct=distinct_ids(inp), itemsize=itemsize)
            got = _as_int(_call(fn, xp.asarray(inp), C, itemsize), "the byte count", 5)
            if got != expected:
                raise ExerciseError(f"Exercise 5: {kind} ids, B={B}, T={T}, C={C}, itemsize={itemsize}: "
                                    f"expected {expected} bytes, got {got!r}")

    return _report(5, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 6 (notebook 06): reading the chunked method's unit list.
def check_locate_unit(fn, samples: int = 200) -> bool:
    """Check ``fn(table, inp, b, t, c) -> (unit, group, item)``: the warp of the chunk kernel that reads
    ``dout[b, t, c]`` for ``table`` (a ``make_buckets`` table of the NumPy array ``inp``): its row ``unit`` of
    ``table.units``, its channel group ``group`` (the warp's ``blockIdx.y``) and the ``item`` of the unit's chunk
    (0 to 31: the lane that loads that position). Three integers. The batches (each with tokens seen more than 32
    times, and two channel groups or more) and the picks are drawn now; NumPy only, as Exercise 3.
    """
    import gpt2enc_edu as enc

    from ..tokens import make_ids

    rng = np.random.default_rng()
    heavy = make_ids("zipf", 2, 48, V=int(rng.integers(5, 40)), seed=rng)
    heavy[:, ::2] = int(rng.integers(0, 5))  # one token at half of the 96 positions: two chunks
    cases = [(heavy, 512, bfloat16)]
    for kind, dtype in (("zipf", bfloat16), ("uniform", np.float32), ("zipf", np.float32)):
        cases.append((make_ids(kind, int(rng.integers(1, 5)), int(rng.integers(8, 80)), V=int(rng.integers(3, 30)),
                               seed=rng), pack_size(dtype) * int(rng.integers(33, 100)), dtype))

    def check():
        for inp, C, dtype in cases:
            table = enc.make_buckets(inp, C, dtype)
            B, T = inp.shape
            where = {}  # bt -> (unit, item), read off the unit list as the chunk kernel reads it
            for unit, (_, chunk, start, size) in enumerate(table.units.tolist()):
                first = start + chunk * CHUNK_ITEMS
                for item, bt in enumerate(table.bt_list[first : min(first + CHUNK_ITEMS, start + size)].tolist()):
                    where[bt] = (unit, item)
            picks = np.stack([rng.integers(0, B, samples), rng.integers(0, T, samples),
                              rng.integers(0, C, samples)], axis=1)
            for b, t, c in picks.tolist():
                answer = _call(fn, table, inp, b, t, c)
                if not isinstance(answer, (tuple, list)) or len(answer) != 3:
                    raise ExerciseError(f"Exercise 6: return (unit, group, item) as three integers, got {answer!r}")
                got = tuple(_as_int(v, name, 6) for v, name in zip(answer, ("unit", "group", "item")))
                unit, item = where[b * T + t]
                if got != (unit, c // table.c_per_group, item):
                    token, chunk = (int(v) for v in table.units[unit, :2])
                    raise ExerciseError(
                        f"Exercise 6: inp={inp.tolist() if inp.size <= 8 else inp.shape}, C={C} "
                        f"({np.dtype(dtype).name}), (b, t, c)=({b}, {t}, {c}): unit {unit} (token {token}, chunk "
                        f"{chunk}), channel group {c // table.c_per_group}, item {item} reads it, your function "
                        f"gave {answer!r}")

    return _report(6, check)
