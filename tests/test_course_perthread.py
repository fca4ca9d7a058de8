"""The package's kernels in per-thread Python form give the mirror's bits (small problems, drawn fresh)."""

from __future__ import annotations

import numpy as np
import pytest

from gpt2enc_edu import compare, mirror, reference
from gpt2enc_edu.buckets import build_bucket_table, reorder_buckets
from gpt2enc_edu.course import perthread
from gpt2enc_edu.problems import poisoned, random_problem
from gpt2enc_edu.rounding import bfloat16

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]


def _problem(rng, dtype, ids="zipf", C=None, B=2, T=20, V=9):
    C = C or 3 * (16 // np.dtype(dtype).itemsize)
    return random_problem(B, T, C, V, maxT=T + 3, dtype=dtype, ids=ids, rng=rng)


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward(rng, dtype):
    p = _problem(rng, dtype)
    got, want = poisoned((p.B, p.T, p.C), dtype), poisoned((p.B, p.T, p.C), dtype)
    perthread.launch_forward(perthread.encoder_forward, got, p.inp, p.wte, p.wpe, rng=rng)
    mirror.encoder_forward(want, p.inp, p.wte, p.wpe, p.B, p.T, p.C)
    assert compare.bitwise_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_wpe(rng, dtype):
    p = _problem(rng, dtype)
    seed = int(rng.integers(2**32))
    got, want = p.dwpe.copy(), p.dwpe.copy()
    perthread.launch_backward_wpe(perthread.encoder_backward_wpe, got, p.dout, seed, rng=rng)
    mirror.encoder_backward_wpe(want, p.dout, p.B, p.T, p.C, seed)
    assert compare.bitwise_equal(got, want)


@pytest.mark.parametrize("dtype, C", [(bfloat16, 24), (np.float32, 12), (bfloat16, 264)])
def test_wte_bucketed_with_its_shared_memory_combine(rng, dtype, C):
    p = _problem(rng, dtype, C=C, T=30)
    table = build_bucket_table(p.inp, p.C, dtype)
    seed = int(rng.integers(2**32))
    got, want = p.dwte.copy(), p.dwte.copy()
    perthread.launch_backward_wte_bucketed(perthread.encoder_backward_wte_bucketed, got, table, p.dout, seed, rng=rng)
    mirror.encoder_backward_wte_bucketed(want, table, p.dout, p.C, seed)
    assert compare.bitwise_equal(got, want)


@pytest.mark.parametrize("dtype, C", [(bfloat16, 264), (np.float32, 12)])
@pytest.mark.parametrize("order", ["built", "reversed", "shuffled"])
@pytest.mark.parametrize("V", [3, 40])  # big buckets only, several per block; a few big among many small
def test_wte_bucketed_warps_form_in_any_bucket_order(rng, dtype, C, order, V):
    """The warps form, per thread, gives the mirror's bits: small buckets a warp each, big ones a block each
    wherever the table lists them (found through the ballot over each block's candidates)."""
    p = _problem(rng, dtype, C=C, B=3, T=30, V=V)
    table = build_bucket_table(p.inp, p.C, dtype)
    table = reorder_buckets(table, order, rng=rng)
    assert (table.info[:, 1] > 8).any() and (V == 3 or (table.info[:, 1] <= 8).any())
    seed = int(rng.integers(2**32))
    got, want = p.dwte.copy(), p.dwte.copy()
    perthread.launch_backward_wte_bucketed_warps(perthread.encoder_backward_wte_bucketed_warps, got, table, p.dout,
                                                 seed, rng=rng)
    mirror.encoder_backward_wte_bucketed(want, table, p.dout, p.C, seed)
    assert compare.bitwise_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [
    pytest.param(dict(B=3, T=60, V=4), id="4-tokens"),  # 180 positions over 4 ids: tokens of several chunks
    pytest.param(dict(B=1, T=500, V=1, C=64), id="16-chunks-2-slices"),  # a slice per block, blocks left over
    pytest.param(dict(B=2, T=30, V=1, C=1200), id="C1200-2-chunks-3-slices"),  # block 0 takes slices 0 and 2
])
def test_wte_chunked_and_combine_with_multi_chunk_tokens(rng, dtype, shape):
    p = _problem(rng, dtype, **shape)
    table = build_bucket_table(p.inp, p.C, dtype)
    assert (table.units[:, 1] > 0).any()
    seed = int(rng.integers(2**32))
    got, want = p.dwte.copy(), p.dwte.copy()
    perthread.launch_backward_wte_chunked(perthread.encoder_backward_wte_chunked,
                                          perthread.encoder_backward_wte_chunk_combine, got, table, p.dout, seed,
                                          rng=rng)
    mirror.encoder_backward_wte_chunked(want, table, p.dout, p.C, seed)
    assert compare.bitwise_equal(got, want)


def test_atomic_within_the_bound_and_not_deterministic(rng):
    p = _problem(rng, np.float32, B=4, T=30, V=3)
    ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
    results = []
    for _ in range(4):
        dwte, dwpe = p.dwte.copy(), p.dwpe.copy()
        perthread.launch_backward_atomic(perthread.encoder_backward_atomic_fp32, dwte, dwpe, p.dout, p.inp, rng=rng)
        assert compare.within_bound(dwte, ref.dwte, compare.error_bound(np.float32, ref.dwte_abs, ref.max_terms))
        assert compare.within_bound(dwpe, ref.dwpe, compare.error_bound(np.float32, ref.dwpe_abs, ref.max_terms))
        results.append(dwte)
    assert any(not compare.bitwise_equal(results[0], r) for r in results[1:])
