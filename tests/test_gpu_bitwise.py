"""The CUDA kernels against the NumPy mirror, bit for bit (run on a GPU; skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare
from gpt2enc_edu.methods import deterministic_methods
from gpt2enc_edu.problems import count_poison, poisoned, random_problem
from gpt2enc_edu.rounding import bfloat16

pytestmark = pytest.mark.gpu

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]
CASES = [  # (B, T, C, V, maxT, ids)
    pytest.param((4, 64, 768, 50257, 64, "uniform"), id="gpt2-uniform"),
    pytest.param((4, 64, 768, 50257, 64, "zipf"), id="gpt2-zipf"),
    pytest.param((2, 128, 768, 50257, 128, "real"), id="gpt2-real"),
    pytest.param((1, 1, 8, 5, 1, "uniform"), id="B1-T1-C8"),
    pytest.param((1, 37, 776, 300, 40, "uniform"), id="B1-C776"),
    pytest.param((3, 1, 64, 1000, 4, "uniform"), id="T1"),
    pytest.param((8, 1024, 64, 2, 1024, "uniform"), id="thousands-per-bucket"),
    pytest.param((2, 3, 264, 50257, 3, "uniform"), id="one-item-buckets"),
]


def _pack_ok(C, dtype):
    return C % (16 // np.dtype(dtype).itemsize) == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_forward_bitwise(rng, dtype, case):
    import cupy

    B, T, C, V, maxT, ids = case
    p = random_problem(B, T, C, V, maxT, dtype=dtype, ids=ids, rng=rng)
    cpu = enc.encoder_forward(p.inp, p.wte, p.wpe)
    g = p.on(cupy)
    gpu = poisoned((B, T, C), dtype, cupy)
    enc.encoder_forward(g.inp, g.wte, g.wpe, out=gpu)
    assert count_poison(gpu) == 0
    assert compare.bitwise_equal(gpu, cpu)


def test_thousand_item_bucket_exists():
    from gpt2enc_edu.tokens import make_ids

    inp = make_ids("uniform", 8, 1024, V=2, seed=0)
    assert enc.make_buckets(inp, 64, bfloat16).sizes.max() > 3000


@pytest.mark.parametrize("dtype, method", [(bfloat16, "atomic_bf16"), (np.float32, "atomic")], ids=["bf16", "fp32"])
def test_atomic_gpu_varies_between_runs(rng, dtype, method):
    """Heavy contention on a few rows: the hardware's order of atomics changes the bits between runs.

    (fp32 accumulation into bf16 storage mostly hides the order: the final rounding to bf16 erases the
    fp32 low bits. Rounding every add, as bf16 atomics do, exposes it at once.)
    """
    import cupy

    p = random_problem(32, 1024, 768, 4, 1024, dtype=dtype, rng=rng)
    distinct = set()
    for _ in range(6):
        g = p.on(cupy)
        enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=0, method=method)
        distinct.add(compare.checksum(g.dwte))
    assert len(distinct) > 1


def test_cupy_bf16_cast_is_round_to_nearest(rng):
    """CuPy's fp32 -> bf16 astype (used by the fp32-accumulator atomic route) equals ml_dtypes' RNE."""
    import cupy

    x = rng.standard_normal(1 << 20, dtype=np.float32) * np.float32(1000)
    assert compare.bitwise_equal(cupy.asarray(x).astype(bfloat16), x.astype(bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", deterministic_methods())
def test_deterministic_backward_bitwise_and_routes_agree(rng, dtype, case, method):
    """Each deterministic method's kernels equal their mirror, with the table built on the CPU or on the GPU."""
    import cupy

    B, T, C, V, maxT, ids = case
    p = random_problem(B, T, C, V, maxT, dtype=dtype, ids=ids, rng=rng)
    seed = int(rng.integers(2**32))
    cpu = p.on(np)
    enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=seed, method=method)
    for bucketing in ("cpu", "gpu"):
        gpu = p.on(cupy)
        enc.encoder_backward(gpu.dwte, gpu.dwpe, gpu.dout, gpu.inp, seed=seed, method=method, bucketing=bucketing)
        for name in ("dwpe", "dwte"):
            got, want = getattr(gpu, name), getattr(cpu, name)
            assert compare.bitwise_equal(got, want), (
                f"{bucketing}: {name}: {compare.count_bit_differences(got, want)} elements differ")
    # Something really changed (the gradient is not the input returned untouched).
    assert not compare.bitwise_equal(gpu.dwte, p.dwte)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bucketed_backward_with_gpu_table(rng, dtype):
    import cupy

    p = random_problem(4, 256, 768, 50257, 256, dtype=dtype, ids="zipf", rng=rng)
    cpu = p.on(np)
    enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=9)
    gpu = p.on(cupy)
    enc.encoder_backward(gpu.dwte, gpu.dwpe, gpu.dout, gpu.inp, seed=9, bucketing="gpu")
    assert compare.bitwise_equal(gpu.dwte, cpu.dwte)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES + [pytest.param((64, 1024, 768, 50257, 1024, "zipf"), id="B64-zipf"),
                                          pytest.param((64, 1024, 768, 50257, 1024, "uniform"), id="B64-uniform")])
def test_gpu_bucket_table_equals_cpu_table(rng, dtype, case):
    import cupy

    B, T, C, V, _, ids = case
    from gpt2enc_edu.tokens import make_ids

    inp = make_ids(ids, B, T, V=V, seed=rng)
    host = enc.make_buckets(inp, C, dtype)
    device = enc.make_buckets(cupy.asarray(inp), C, dtype, V=V).to_host()
    assert np.array_equal(device.info, host.info)
    assert np.array_equal(device.bt_list, host.bt_list)
    assert np.array_equal(device.units, host.units)
