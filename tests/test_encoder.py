"""Every kernel against the float64 reference, on each backend (NumPy mirror always, CUDA with a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, reference
from gpt2enc_edu.problems import count_poison, poisoned, random_problem
from gpt2enc_edu.rounding import bfloat16

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]
SHAPES = [  # (B, T, C, V, maxT)
    pytest.param((2, 16, 64, 40, 20), id="small"),
    pytest.param((1, 1, 8, 3, 1), id="B1-T1-C8"),
    pytest.param((3, 7, 776, 30, 9), id="C776"),
]


def _methods(dtype):
    return ["bucketed", "chunked", "atomic"] + (["atomic_bf16"] if np.dtype(dtype) == np.dtype(bfloat16) else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_reference(xp, rng, dtype, shape):
    B, T, C, V, maxT = shape
    if C % (16 // np.dtype(dtype).itemsize):
        pytest.skip("C not a multiple of this dtype's pack")
    p = random_problem(B, T, C, V, maxT, dtype=dtype, rng=rng)
    on = p.on(xp)
    out = poisoned((B, T, C), dtype, xp)
    enc.encoder_forward(on.inp, on.wte, on.wpe, out=out)
    assert count_poison(out) == 0
    ref = reference.forward(p.inp, p.wte, p.wpe)
    magnitude = np.abs(p.wte.astype(np.float64))[p.inp] + np.abs(p.wpe.astype(np.float64))[None, :T]
    assert compare.within_bound(out, ref, compare.error_bound(dtype, magnitude, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ids", ["uniform", "zipf"])
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_matches_reference(xp, rng, dtype, ids, shape):
    B, T, C, V, maxT = shape
    p = random_problem(B, T, C, V, maxT, dtype=dtype, ids=ids, rng=rng)
    ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
    for method in _methods(dtype):
        on = p.on(xp)
        enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=int(rng.integers(2**32)), method=method)
        per_add = method == "atomic_bf16"
        assert compare.within_bound(on.dwte, ref.dwte, compare.error_bound(dtype, ref.dwte_abs, ref.max_terms,
                                                                           rounding_per_add=per_add)), method
        assert compare.within_bound(on.dwpe, ref.dwpe, compare.error_bound(dtype, ref.dwpe_abs, ref.max_terms,
                                                                           rounding_per_add=per_add)), method


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["bucketed", "chunked"])
def test_deterministic_backward_is_deterministic(xp, rng, dtype, method):
    p = random_problem(4, 64, 256, 20, 64, dtype=dtype, ids="zipf", rng=rng)  # buckets of many chunks
    seed = int(rng.integers(2**32))
    results = []
    for _ in range(2):
        on = p.on(xp)
        enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=seed, method=method)
        results.append((on.dwte, on.dwpe))
    assert compare.bitwise_equal(results[0][0], results[1][0])
    assert compare.bitwise_equal(results[0][1], results[1][1])


def test_gradient_accumulation_adds_up(xp, rng):
    """Two backward calls accumulate: the result stays within bound of old + 2 * sum."""
    p = random_problem(2, 8, 64, 10, 8, dtype=np.float32, rng=rng)
    on = p.on(xp)
    for seed in (1, 2):
        enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=seed)
    once = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
    twice = reference.backward(once.dwte, once.dwpe, p.dout, p.inp)
    bound = compare.error_bound(np.float32, twice.dwte_abs + once.dwte_abs, 2 * twice.max_terms)
    assert compare.within_bound(on.dwte, twice.dwte, bound)


def test_stochastic_rounding_depends_on_seed(xp, rng):
    p = random_problem(8, 16, 64, 4, 16, dtype=bfloat16, rng=rng, grad_scale=1e-3)
    results = []
    for seed in (11, 12):
        on = p.on(xp)
        enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=seed)
        results.append(on.dwte)
    assert not compare.bitwise_equal(results[0], results[1])


def test_atomic_bf16_loses_precision_against_fp32(xp, rng):
    """Many small updates to one row: bf16 atomics round every add and drift far more than fp32 ones."""
    B, T, C = 8, 256, 64
    p = random_problem(B, T, C, 1, T, dtype=bfloat16, rng=rng, grad_scale=1e-2)  # V = 1: one token
    ones = np.ones_like(p.dwte)
    ref = reference.backward(ones, p.dwpe, p.dout, p.inp).dwte
    errors = {}
    for method in ("atomic", "atomic_bf16"):
        on = p.on(xp)
        dwte = xp.asarray(ones)
        enc.encoder_backward(dwte, on.dwpe, on.dout, on.inp, seed=0, method=method)
        errors[method] = np.abs(enc.backend.to_numpy(dwte).astype(np.float64) - ref).mean()
    assert errors["atomic_bf16"] > 4 * errors["atomic"]


def test_atomic_fp32_order_changes_the_bits(xp, rng):
    """One token repeated many times: different arrival orders of the adds change the low bits."""
    p = random_problem(16, 128, 64, 1, 128, dtype=np.float32, rng=rng)
    results = []
    for _ in range(4):
        on = p.on(xp)
        enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=0, method="atomic")
        results.append(on.dwte)
    assert any(not compare.bitwise_equal(results[0], r) for r in results[1:])


def test_signed_zeros_follow_the_kernels(xp):
    """Sums start from +0.0 in the kernels, so all-(-0.0) gradients come out as +0.0 on both backends."""
    for dtype in (bfloat16, np.float32):
        inp = xp.asarray(np.array([[0, 0, 0, 1]], dtype=np.int32))  # a 3-item and a 1-item bucket
        dwte = xp.asarray(np.full((2, 256), -0.0, np.float32).astype(dtype))
        dwpe = xp.asarray(np.full((4, 256), -0.0, np.float32).astype(dtype))
        dout = xp.asarray(np.full((1, 4, 256), -0.0, np.float32).astype(dtype))
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=3)
        for grad in (dwte, dwpe):
            bits = enc.backend.to_numpy(grad).view(np.uint16 if grad.dtype.itemsize == 2 else np.uint32)
            assert (bits == 0).all()


def test_last_backend_reports_what_ran(xp, rng):
    p = random_problem(1, 2, 8, 4, 2, rng=rng).on(xp)
    enc.encoder_forward(p.inp, p.wte, p.wpe)
    expected = "numpy" if xp is np else "cuda"
    assert enc.last_backend().name == expected
