"""How results are compared, shared by the tests, the notebooks, the demo and the benchmark.

* ``bitwise_equal``: the same bits, except that any NaN equals any NaN (the GPU writes the canonical
  NaN 0x7FFF / 0x7FFFFFFF, NumPy keeps payloads; a NaN is a NaN).
* ``error_bound``: how far a result may be from the float64 reference. Three sources of error:
  the fp32 sums (each add errs by at most half an fp32 ulp of the running magnitude, bounded by
  ``terms * eps32 * sum|terms|``), the final rounding to the storage dtype (at most one ulp of that
  dtype: ``eps * |value|``; stochastic rounding can go either way, so a full ulp, not half), and
  flush-to-zero (CuPy compiles with ``-ftz=true``, the mirror does the same): every fp32 add may flush its
  two operands and its result to zero when they lie below the smallest normal number, 2**-126 (bf16 has
  the same exponent range), so an absolute floor of ``FTZ_FLOOR_PER_TERM * terms`` is added. For atomics
  on bf16 every add rounds, so the bf16 epsilon multiplies the terms too. The bound holds while
  ``sum|terms|`` stays below the largest finite value of the storage dtype (past it, Inf is a result).
"""

from __future__ import annotations

import numpy as np

from .backend import to_numpy
from .rounding import bfloat16

EPS = {np.dtype(bfloat16): float(2.0**-7), np.dtype(np.float32): float(np.finfo(np.float32).eps)}


def eps(dtype) -> float:
    """Machine epsilon of a storage dtype (bf16: 2**-7, fp32: 2**-23)."""
    return EPS[np.dtype(dtype)]


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(_UNSIGNED[x.dtype.itemsize])


def _isnan(x: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        return np.zeros(x.shape, dtype=bool)
    return np.isnan(x.astype(np.float64))


def bitwise_equal(a, b) -> bool:
    """True if ``a`` and ``b`` (NumPy or CuPy) have the same dtype, shape and bits, NaN matching NaN."""
    a, b = to_numpy(a), to_numpy(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    same = (_bits(a) == _bits(b)) | (_isnan(a) & _isnan(b))
    return bool(same.all())


def count_bit_differences(a, b) -> int:
    """How many elements differ in their bits (NaN matching NaN)."""
    a, b = to_numpy(a), to_numpy(b)
    return int((~((_bits(a) == _bits(b)) | (_isnan(a) & _isnan(b)))).sum())


def ulp_difference(a, b) -> np.ndarray:
    """Signed distance in units in the last place between two arrays of one dtype (finite values)."""
    a, b = to_numpy(a), to_numpy(b)
    signed = np.int32 if a.dtype.itemsize == 2 else np.int64

    def ordered(x):
        bits = _bits(x).astype(signed)
        top = 1 << (8 * x.dtype.itemsize - 1)
        return np.where(bits & top, top - bits, bits)  # monotone map of the float line onto integers

    return ordered(a) - ordered(b)


#: The smallest normal fp32 (and bf16) number: fp32 values below it are flushed to zero on the GPU.
MIN_NORMAL = float(2.0**-126)
#: Absolute error flush-to-zero may add per term: an element's sum of ``terms`` terms (the old value
#: included) takes at most ``2 * terms`` fp32 adds (the items, the warp or chunk combines, the old value),
#: and each add may flush two operands and its result, each smaller than ``MIN_NORMAL``.
FTZ_FLOOR_PER_TERM = 6 * MIN_NORMAL


def error_bound(dtype, magnitude, terms: int, *, rounding_per_add: bool = False) -> np.ndarray:
    """Largest allowed |result - reference| for values built from ``terms`` additions of size ``magnitude``.

    ``magnitude`` is the sum of absolute values of everything added (``reference.Gradients.*_abs``, or
    ``|a| + |b|`` for one add). fp32 accumulation errs by at most ``terms * eps32 * magnitude``; the final
    rounding to ``dtype`` by one ulp, at most ``eps(dtype) * magnitude``; with ``rounding_per_add`` (bf16
    atomics) every add rounds to ``dtype``. Flush-to-zero adds the absolute floor
    ``terms * FTZ_FLOOR_PER_TERM`` (about ``7e-38 * terms``): results whose exact value lies in the
    subnormal range may come out as zero. Valid while ``magnitude`` stays below the dtype's largest value.
    """
    magnitude = np.asarray(magnitude, dtype=np.float64)
    per_add = eps(dtype) if rounding_per_add else eps(np.float32)
    return (terms * per_add + eps(dtype)) * magnitude + terms * FTZ_FLOOR_PER_TERM


def within_bound(result, reference, bound) -> bool:
    """``|result - reference| <= bound`` everywhere, with NaN only where the reference is NaN."""
    result = to_numpy(result).astype(np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    both_nan = np.isnan(result) & np.isnan(reference)
    ok = np.abs(result - reference) <= bound
    return bool((ok | both_nan).all())


def checksum(x) -> str:
    """A short, platform-independent fingerprint of an array's bits (NaNs folded to one pattern).

    Used in notebooks to print a value that must be identical on the GPU and in the CPU mirror.
    """
    import hashlib

    x = np.ascontiguousarray(to_numpy(x))
    bits = _bits(x).copy()
    bits[_isnan(x)] = 0x7FFF if x.dtype.itemsize == 2 else 0x7FFFFFFF
    return hashlib.sha256(bits.astype(bits.dtype.newbyteorder("<")).tobytes()).hexdigest()[:16]


def wte_launcher_and_mirror(name: str, p, table, seed: int, *, mirror: bool = True, **choice):
    """``(got, want)``: the wte launcher ``gpt2enc_edu.cuda.<name>`` (``choice``: e.g. its ``form``) run on a CuPy
    copy of problem ``p``'s ``dwte``, and ``gpt2enc_edu.mirror.<name>`` on a NumPy copy, with the same host
    ``table``, ``dout`` and ``seed`` (``mirror=False``: the launcher only, ``want`` None). GPU only; the GPU tests
    and the sanitizer compare the two with ``bitwise_equal``."""
    import cupy

    from . import cuda
    from . import mirror as mirrors

    got = cupy.asarray(p.dwte)
    getattr(cuda, name)(got, table, cupy.asarray(p.dout), p.C, seed, **choice)
    if not mirror:
        return got, None
    want = np.array(p.dwte, copy=True)
    getattr(mirrors, name)(want, table, p.dout, p.C, seed)
    return got, want
