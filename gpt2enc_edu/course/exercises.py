"""Checks for the exercises in notebooks 01-05.

Each notebook has a function stub for the learner to fill in; it raises ``NotImplementedError`` until
then. The notebook's next cell hands the function to a ``check_*`` function here, which

* prints ``Exercise N (...): not done yet - hint: ...`` and returns ``False`` while the stub still raises
  ``NotImplementedError`` (so the notebook runs cleanly from top to bottom with the exercises open);
* raises ``ExerciseError`` (an ``AssertionError``) naming the first wrong case when an answer is wrong;
* prints ``Exercise N (...): correct`` and returns ``True`` when every case agrees with the package.

The answers are compared with what the package itself computes (``plots.thread_of_element``, the atomic
kernel, ``make_buckets``, ``rounding.stochastic_round_bf16``, ``bench.minimal_bytes``), on the active backend where the exercise
takes arrays (pass ``xp=numpy`` or ``xp=cupy``; the default is ``gpt2enc_edu.array_module()``).
Worked solutions live in ``gpt2enc_edu.solutions``, apart from the checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import array_module, to_numpy
from ..buckets import BucketTable
from ..layout import pack_size
from ..rounding import bfloat16, stochastic_round_bf16


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
                "first find the element's flat index in the (B, T, C) tensor; a thread owns "
                "layout.pack_size(dtype) consecutive elements."),
    2: Exercise(2, "which dwte rows can change between atomic runs",
                "a row that receives one add (or none) has only one possible order. Count each token's "
                "occurrences with xp.bincount(inp.ravel(), minlength=V)."),
    3: Exercise(3, "find the bucket and item of dout[b, t, c]",
                "the bucket's token is inp[b, t] and its channel group is c // table.c_per_group; look for "
                "that (token, group) pair in table.token_ids / table.c_groups, then find b*T + t in the "
                "bucket's slice of table.bt_list."),
    4: Exercise(4, "probability that stochastic rounding moves away from zero",
                "view the fp32 values as uint32: the 16 bits that bf16 drops are bits & 0xFFFF, and the "
                "kernel rounds away from zero when they exceed a uniform 16-bit threshold."),
    5: Exercise(5, "the minimal bytes of the backward",
                "dout is read once (B*T*C elements); each distinct token's dwte row and each of the T dwpe rows is "
                "read and written (gradients accumulate); the ids are read once (4 bytes each). Count the "
                "distinct ids with xp.unique(inp).size."),
}


class _NotDone(Exception):
    """The learner's function raised NotImplementedError: the exercise is still open."""


def _call(fn, *args):
    """Call the learner's function; its ``NotImplementedError`` means "not done", anything else propagates."""
    try:
        return fn(*args)
    except NotImplementedError as exc:
        raise _NotDone() from exc


def _report(number: int, check) -> bool:
    """Run ``check()``; print whether exercise ``number`` is open or correct and return True when correct."""
    exercise = EXERCISES[number]
    try:
        check()
    except _NotDone:
        print(f"Exercise {number} ({exercise.title}): not done yet - hint: {exercise.hint}")
        return False
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


# ------------------------------------------------------------------------------------------------------
# Exercise 1 (notebook 01): the forward kernel's thread map, backwards.
def check_element_to_thread(fn, xp=None) -> bool:
    """Check ``fn(b, t, c, T, C, dtype) -> (thread, k)``: which thread of the forward kernel writes
    ``out[b, t, c]``, and at which place ``k`` of its 128-bit pack.

    ``b``, ``t``, ``c`` are ``xp`` int64 arrays listing every element of a (B, T, C) tensor. The answer is
    compared with the package's thread map (``plots.thread_of_element``) and the pack width
    (``layout.pack_size``).
    """
    from .plots import thread_of_element

    xp = _xp(xp)
    cases = [(2, 3, 16, bfloat16), (2, 3, 16, np.float32), (1, 1, 8, bfloat16), (3, 5, 776, bfloat16),
             (4, 64, 768, np.float32)]

    def check():
        for B, T, C, dtype in cases:
            size = pack_size(dtype)
            b, t, c = (xp.asarray(a.reshape(-1)) for a in np.indices((B, T, C), dtype=np.int64))
            answer = _call(fn, b, t, c, T, C, dtype)
            if not isinstance(answer, tuple) or len(answer) != 2:
                raise ExerciseError("Exercise 1: return a tuple (thread, k) of two arrays")
            thread, k = (_as_int_array(a, name, 1, b.shape) for a, name in zip(answer, ("thread", "k")))
            want_thread = thread_of_element(B, T, C, dtype).reshape(-1)
            want_k = to_numpy(c) % size
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
def _can_differ_cases(xp):
    from ..tokens import make_ids

    hand = np.array([[5, 2, 5], [2, 9, 5]], dtype=np.int32)
    return [(xp.asarray(hand), 12), (xp.asarray(make_ids("zipf", 4, 64, V=50, seed=2)), 50),
            (xp.asarray(make_ids("uniform", 2, 16, V=64, seed=3)), 64)]


def check_rows_that_can_differ(fn, xp=None, runs: int = 4) -> bool:
    """Check ``fn(inp, V) -> mask``: a (V,) boolean array, True for the dwte rows whose bits can depend on
    the order of the atomic adds (fp32 storage).

    The expected mask comes from the token counts. As a demonstration, the package's atomic backward
    (fp32) is then run ``runs`` times on the Zipf case, and every row that changed bits must be in the mask.
    """
    import gpt2enc_edu as enc

    from ..problems import random_problem

    xp = _xp(xp)

    def check():
        for inp, V in _can_differ_cases(xp):
            mask = to_numpy(_call(fn, inp, V))
            if mask.shape != (V,) or mask.dtype != np.bool_:
                raise ExerciseError(f"Exercise 2: return a boolean array of shape ({V},), "
                                    f"got {mask.dtype} of shape {mask.shape}")
            counts = np.bincount(to_numpy(inp).reshape(-1), minlength=V)
            wrong = np.flatnonzero(mask != (counts >= 2))
            if wrong.size:
                row = int(wrong[0])
                raise ExerciseError(f"Exercise 2: token {row} occurs {counts[row]} times in inp "
                                    f"{to_numpy(inp).tolist() if inp.size <= 8 else f'(shape {inp.shape})'}, "
                                    f"so its row {'can' if counts[row] >= 2 else 'cannot'} change, "
                                    f"your mask says {bool(mask[row])}")
        # The demonstration, on the Zipf case: run the real thing and look.
        inp, V = _can_differ_cases(xp)[1]
        B, T = inp.shape
        p = random_problem(B, T, 64, V, dtype=np.float32, ids="uniform", rng=np.random.default_rng(4))
        results = []
        for _ in range(runs):
            on = p.on(xp)
            enc.encoder_backward(on.dwte, on.dwpe, on.dout, inp, seed=0, method="atomic")
            results.append(to_numpy(on.dwte))
        changed = np.zeros(V, dtype=bool)
        for r in results[1:]:
            changed |= (r.view(np.uint32) != results[0].view(np.uint32)).any(axis=1)
        mask = to_numpy(_call(fn, inp, V))
        if (changed & ~mask).any():
            raise ExerciseError(f"Exercise 2: rows {np.flatnonzero(changed & ~mask).tolist()} changed although "
                                "they get at most one add: please report this, it is a bug in the package")
        print(f"In {runs} runs of the atomic kernel ({enc.last_backend().name}), {int(changed.sum())} rows "
              f"changed bits, all among the {int(mask.sum())} rows you predicted.")

    return _report(2, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 3 (notebook 03): reading the bucket table.
def _where_each_item_is(table: BucketTable, T: int) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(bt, c_group): (bucket, item)}`` for every item of every bucket of ``table``."""
    where = {}
    for bucket, (start, size, _, group) in enumerate(table.info.tolist()):
        for item, bt in enumerate(table.bt_list[start : start + size].tolist()):
            where[(bt, group)] = (bucket, item)
    return where


def check_locate(fn, samples: int = 200) -> bool:
    """Check ``fn(table, inp, b, t, c) -> (bucket, item)``: which bucket of ``table`` (a ``make_buckets``
    table of the NumPy array ``inp``) reads ``dout[b, t, c]``, and at which item of the bucket.

    The bucket table is built on the CPU in the package too, so this exercise is NumPy only.
    """
    import gpt2enc_edu as enc

    from ..tokens import make_ids

    cases = [(np.array([[5, 2, 5], [2, 9, 5]], dtype=np.int32), 512, bfloat16),
             (make_ids("zipf", 4, 32, V=40, seed=5), 776, bfloat16),
             (make_ids("uniform", 3, 16, V=10, seed=6), 260, np.float32)]
    rng = np.random.default_rng(7)

    def check():
        for inp, C, dtype in cases:
            table = enc.make_buckets(inp, C, dtype)
            B, T = inp.shape
            where = _where_each_item_is(table, T)
            picks = np.stack([rng.integers(0, B, samples), rng.integers(0, T, samples),
                              rng.integers(0, C, samples)], axis=1)
            for b, t, c in picks.tolist():
                answer = _call(fn, table, inp, b, t, c)
                want = where[(b * T + t, c // table.c_per_group)]
                try:
                    got = tuple(int(v) for v in answer)
                except (TypeError, ValueError):
                    raise ExerciseError(f"Exercise 3: return (bucket, item) as two integers, got {answer!r}")
                if got != want:
                    raise ExerciseError(f"Exercise 3: inp={inp.tolist() if inp.size <= 8 else inp.shape}, "
                                        f"C={C}, (b, t, c)=({b}, {t}, {c}): bucket {want[0]} item {want[1]} "
                                        f"reads it, your function gave {answer!r}")

    return _report(3, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 4 (notebook 04): the probability behind stochastic rounding.
#: fp32 test values: exactly representable in bf16, and between two bf16 neighbours at several fractions.
_SR_VALUES = np.array([1.0, -2.5, 1.0 + 2**-9, 1.0 + 0.1 * 2**-7, -(3.0 + 0.75 * 2**-6), 1e-3, -123.456,
                       2.0**-100 * 1.3, 65504.0 + 7.0, 0.1], dtype=np.float32)


def check_away_from_zero_probability(fn, xp=None, draws: int = 1 << 16) -> bool:
    """Check ``fn(x) -> p``: for each fp32 value of the ``xp`` array ``x``, the probability that
    ``stochastic_round_bf16`` stores the bf16 neighbour farther from zero.

    The package's rounding is drawn ``draws`` times per value (one element index each, a fixed seed) and
    the observed frequency must lie within 5 standard deviations of the answer; values that bf16 holds
    exactly must get probability 0.
    """
    xp = _xp(xp)

    def check():
        x = xp.asarray(_SR_VALUES)
        p = to_numpy(_call(fn, x)).astype(np.float64)
        if p.shape != _SR_VALUES.shape:
            raise ExerciseError(f"Exercise 4: return one probability per value, shape {_SR_VALUES.shape}, "
                                f"got {p.shape}")
        elements = np.arange(draws, dtype=np.uint32)
        for value, prob in zip(_SR_VALUES.tolist(), p.tolist()):
            rounded = stochastic_round_bf16(np.full(draws, value, np.float32), elements, 0, 2024)
            away = np.abs(rounded.astype(np.float64)) > abs(value)
            observed = float(away.mean())
            exact = float(np.float32(value).astype(bfloat16)) == value
            tolerance = 5 * np.sqrt(max(prob * (1 - prob), 1.0 / draws) / draws)
            if not 0.0 <= prob <= 1.0 or (exact and prob != 0.0) or abs(observed - prob) > tolerance:
                raise ExerciseError(f"Exercise 4: x = {value!r}: the package rounded it away from zero in "
                                    f"{observed:.4f} of {draws} draws{' (bf16 holds it exactly)' if exact else ''}; "
                                    f"your probability is {prob!r}")

    return _report(4, check)


# ------------------------------------------------------------------------------------------------------
# Exercise 5 (notebook 05): the floor of the deterministic backward.
def check_backward_bytes(fn, xp=None) -> bool:
    """Check ``fn(inp, C, itemsize) -> int``: the bytes the encoder backward cannot avoid moving for the
    ``xp`` ids ``inp`` (B, T), C channels and ``itemsize`` bytes per stored element (2 for bf16, 4 for fp32),
    against ``bench.minimal_bytes("backward", ...)`` for uniform, Zipf and real ids of several shapes."""
    from ..bench.floor import distinct_ids, minimal_bytes
    from ..tokens import make_ids

    xp = _xp(xp)
    cases = [("uniform", 2, 64, 768, 2), ("zipf", 4, 256, 768, 2), ("real", 1, 1024, 64, 4), ("uniform", 3, 5, 8, 4)]

    def check():
        for kind, B, T, C, itemsize in cases:
            inp = make_ids(kind, B, T, seed=B * T + C)
            expected = minimal_bytes("backward", B=B, T=T, C=C, distinct=distinct_ids(inp), itemsize=itemsize)
            got = _call(fn, xp.asarray(inp), C, itemsize)
            if int(got) != expected:
                raise ExerciseError(f"Exercise 5: {kind} ids, B={B}, T={T}, C={C}, itemsize={itemsize}: "
                                    f"expected {expected} bytes, got {got!r}")

    return _report(5, check)
