"""Properties of the CPU side (the NumPy mirror behind the public API), over random shapes, dtypes and ids.

Hypothesis draws the sizes, the dtype, the id distribution (uniform, Zipf, a single token, or ids chosen one
by one by Hypothesis, which shrinks well), the magnitude of the gradients and the seeds; the values come
from ``problems.random_problem`` with a drawn generator seed, so a failure replays exactly.

* forward and every backward method stay within ``compare.error_bound`` of the float64 reference;
* the deterministic methods are bitwise reproducible;
* the seed changes only the rounding: fp32 results ignore it, bf16 results are always one of the two bf16
  values around the exact fp32 sum (computed by the same method on fp32 copies of the inputs);
* locality: the bits of a token's gradient row depend only on that token's positions, not on which other
  tokens are present; changing the other tokens reshuffles the bucket table (sizes, order, count) and must
  not move a bit of that row. dwpe does not depend on the ids at all.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import gpt2enc_edu as enc
from gpt2enc_edu import compare, reference, validate
from gpt2enc_edu.layout import pack_size
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16
from gpt2enc_edu.tokens import make_ids

BF16 = np.dtype(bfloat16)
FP32 = np.dtype(np.float32)
DETERMINISTIC = [m for m in ("bucketed", "chunked") if m in validate.METHODS]
SETTINGS = settings(max_examples=60, deadline=None)

seeds = st.integers(0, 2**32 - 1)


@st.composite
def problems(draw, dtypes=(BF16, FP32)):
    """A small random ``Problem`` (NumPy)."""
    dtype = draw(st.sampled_from(dtypes))
    B, T, V = draw(st.integers(1, 4)), draw(st.integers(1, 12)), draw(st.integers(1, 40))
    C = draw(st.integers(1, 40)) * pack_size(dtype)
    maxT = T + draw(st.integers(0, 3))
    kind = draw(st.sampled_from(["uniform", "zipf", "one-token", "drawn"]))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**63 - 1)))
    p = random_problem(B, T, C, V, maxT, dtype=dtype, rng=rng, grad_scale=scale)
    if kind in ("uniform", "zipf"):
        ids = make_ids(kind, B, T, V=V, seed=rng)
    elif kind == "one-token":
        ids = np.full((B, T), draw(st.integers(0, V - 1)), dtype=np.int32)
    else:
        ids = draw(arrays(np.int32, (B, T), elements=st.integers(0, V - 1)))
    return replace(p, inp=np.ascontiguousarray(ids, dtype=np.int32))


def methods_for(dtype):
    return [m for m in validate.METHODS if not (m == "atomic_bf16" and np.dtype(dtype) != BF16)]


def backward(p, method, seed, dtype=None):
    """Run one backward on fresh copies (cast to ``dtype`` if given); returns (dwte, dwpe)."""
    cast = (lambda a: a.astype(dtype)) if dtype is not None else (lambda a: a.copy())
    dwte, dwpe = cast(p.dwte), cast(p.dwpe)
    enc.encoder_backward(dwte, dwpe, cast(p.dout), p.inp, seed=seed, method=method)
    return dwte, dwpe


@SETTINGS
@given(problems())
def test_forward_within_bound_of_reference(p):
    out = enc.encoder_forward(p.inp, p.wte, p.wpe)
    ref = reference.forward(p.inp, p.wte, p.wpe)
    magnitude = np.abs(p.wte.astype(np.float64))[p.inp] + np.abs(p.wpe.astype(np.float64))[None, : p.T]
    assert compare.within_bound(out, ref, compare.error_bound(p.dtype, magnitude, 1))


@SETTINGS
@given(problems(), seeds)
def test_backward_within_bound_of_reference(p, seed):
    ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
    for method in methods_for(p.dtype):
        dwte, dwpe = backward(p, method, seed)
        per_add = method == "atomic_bf16"
        for got, exact, magnitude in ((dwte, ref.dwte, ref.dwte_abs), (dwpe, ref.dwpe, ref.dwpe_abs)):
            bound = compare.error_bound(p.dtype, magnitude, ref.max_terms, rounding_per_add=per_add)
            assert compare.within_bound(got, exact, bound), method


@SETTINGS
@given(problems(), seeds)
def test_deterministic_methods_are_bitwise_reproducible(p, seed):
    for method in DETERMINISTIC:
        first, second = backward(p, method, seed), backward(p, method, seed)
        assert compare.bitwise_equal(first[0], second[0]) and compare.bitwise_equal(first[1], second[1]), method


@SETTINGS
@given(problems(dtypes=(FP32,)), seeds, seeds)
def test_fp32_results_ignore_the_seed(p, seed_a, seed_b):
    for method in DETERMINISTIC:
        a, b = backward(p, method, seed_a), backward(p, method, seed_b)
        assert compare.bitwise_equal(a[0], b[0]) and compare.bitwise_equal(a[1], b[1]), method


def _bracket(exact32: np.ndarray):
    """The two bf16 values around each fp32 value (equal when it is a bf16 value itself)."""
    nearest = exact32.astype(BF16)
    up = np.nextafter(nearest, np.full_like(nearest, np.inf))
    down = np.nextafter(nearest, np.full_like(nearest, -np.inf))
    nearest_is_below = nearest.astype(np.float32) <= exact32
    exact = nearest.astype(np.float32) == exact32
    lo = np.where(nearest_is_below, nearest, down)
    hi = np.where(exact, nearest, np.where(nearest_is_below, up, nearest))
    return lo, hi


@SETTINGS
@given(problems(dtypes=(BF16,)), seeds, seeds)
def test_bf16_seed_only_picks_a_neighbour_of_the_fp32_sum(p, seed_a, seed_b):
    """The same method on fp32 copies sums in the same order, so it gives the exact fp32 value s that the bf16
    run rounds; with any seed the bf16 result is s itself (if representable) or one of its two neighbours."""
    for method in DETERMINISTIC:
        exact = backward(p, method, 0, dtype=np.float32)
        for seed in (seed_a, seed_b):
            for got, s in zip(backward(p, method, seed), exact):
                lo, hi = _bracket(s)
                assert ((got == lo) | (got == hi)).all(), method
        a, b = backward(p, method, seed_a), backward(p, method, seed_b)
        for x, y in zip(a, b):
            assert np.abs(compare.ulp_difference(x, y)).max(initial=0) <= 1


@SETTINGS
@given(problems(), seeds, st.data())
def test_a_tokens_row_ignores_the_other_tokens(p, seed, data):
    """Redraw some positions' ids: rows of tokens that neither lose nor gain a position keep their bits.

    The bucket table changes (bucket sizes, their order, their number) but the rounding noise is keyed by the
    element and the sum order by the token's own positions, so those rows are unaffected. Rows of tokens
    absent from both batches keep their old value; dwpe does not depend on the ids.
    """
    flat = p.inp.reshape(-1)
    changed = data.draw(st.lists(st.integers(0, flat.size - 1), min_size=1, max_size=flat.size, unique=True))
    new_ids = data.draw(st.lists(st.integers(0, p.V - 1), min_size=len(changed), max_size=len(changed)))
    other = flat.copy()
    other[changed] = new_ids
    q = replace(p, inp=other.reshape(p.inp.shape))
    affected = np.union1d(flat[changed], other[changed])
    stable = np.setdiff1d(np.arange(p.V), affected)
    absent = np.setdiff1d(stable, flat)
    for method in DETERMINISTIC:
        a, b = backward(p, method, seed), backward(q, method, seed)
        assert compare.bitwise_equal(a[0][stable], b[0][stable]), method
        assert compare.bitwise_equal(a[0][absent], p.dwte[absent]), method
        assert compare.bitwise_equal(a[1], b[1]), method
