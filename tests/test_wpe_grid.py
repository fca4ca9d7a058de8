"""The wpe kernel on any grid: a thread per pack, or fewer threads that walk the packs in turn (the grid the
package gives it beside the scatter route's bucket table built in the same call). Same bits as the mirror either
way."""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, cuda, mirror
from gpt2enc_edu.course import perthread
from gpt2enc_edu.layout import BLOCK_SIZE, WPE_BLOCK_SIZE, WPE_SM_SHARE_BESIDE_TABLE, pack_size, wpe_blocks_beside_table
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]


def _mirror(p, seed):
    want = p.dwpe.copy()
    mirror.encoder_backward_wpe(want, p.dout, p.B, p.T, p.C, seed)
    return want


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_per_thread_form_walks_the_packs_of_a_small_grid(rng, dtype):
    """One block of BLOCK_SIZE threads for more packs than threads: the first threads take a second pack."""
    C = 8 * pack_size(dtype)
    T = BLOCK_SIZE // 8 + 5  # 8 packs a row: BLOCK_SIZE + 40 packs
    p = random_problem(2, T, C, 11, maxT=T + 2, dtype=dtype, ids="zipf", rng=rng)
    assert p.T * p.C // pack_size(dtype) > BLOCK_SIZE
    seed = int(rng.integers(2**32))
    want = _mirror(p, seed)
    for blocks in (1, None):
        got = p.dwpe.copy()
        perthread.launch_backward_wpe(perthread.encoder_backward_wpe, got, p.dout, seed, rng=rng, blocks=blocks)
        assert compare.bitwise_equal(got, want), blocks


def test_the_share_of_sms_beside_a_table():
    assert wpe_blocks_beside_table(132) == int(132 * WPE_SM_SHARE_BESIDE_TABLE) == 49  # an H200
    assert wpe_blocks_beside_table(1) == 1  # never an empty grid
    assert all(1 <= wpe_blocks_beside_table(n) < n for n in range(3, 300))  # a share, never the whole GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 64, 768), (1, 37, 776), (3, 5, 64)], ids=["ordinary", "C776", "few-packs"])
def test_the_kernel_gives_the_mirrors_bits_on_any_grid(rng, dtype, shape):
    import cupy

    from gpt2enc_edu.loader import device_facts

    B, T, C = shape
    if C % pack_size(dtype):
        pytest.skip("C is not a whole number of packs")
    p = random_problem(B, T, C, 1000, maxT=T + 3, dtype=dtype, ids="uniform", rng=rng)
    seed = int(rng.integers(2**32))
    want = _mirror(p, seed)
    full = -(-T * C // pack_size(dtype) // WPE_BLOCK_SIZE)
    for blocks in (1, 3, wpe_blocks_beside_table(device_facts().sm_count), None):
        got = cupy.asarray(p.dwpe)
        cuda.encoder_backward_wpe(got, cupy.asarray(p.dout), B, T, C, seed, blocks=blocks)
        assert compare.bitwise_equal(got.get(), want), (blocks, full)


@pytest.mark.gpu
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "bucketed"])
def test_the_narrow_grid_goes_beside_the_scatter_routes_table_only(rng, monkeypatch, chunked):
    """The scatter route's table built in the call: the wpe kernel gets its share of the SMs. A table built ahead,
    or the one-block table of one sequence (bucketed method; the chunked one is then a single launch): the whole
    grid. The bits are the mirror's every way."""
    import cupy

    from gpt2enc_edu.buckets.gpu import bucketing_route
    from gpt2enc_edu.loader import device_facts

    method = "chunked" if chunked else "bucketed"
    narrow = wpe_blocks_beside_table(device_facts().sm_count)
    real = cuda.encoder_backward_wpe
    grids = []

    def recording(*args, blocks=None):
        grids.append(blocks)
        real(*args, blocks=blocks)

    monkeypatch.setattr(cuda, "encoder_backward_wpe", recording)
    for B, T, want_in_call in ((2, 1024, narrow), (1, 1000, None)):  # 2048 ids: the scatter route; 1000: one block
        assert bucketing_route(B * T, 500) == ("scatter" if want_in_call else "small")
        p = random_problem(B, T, 64, 500, dtype=bfloat16, ids="zipf", rng=rng)
        seed = int(rng.integers(2**32))
        cpu = p.on(np)
        enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=seed, method=method)
        grids.clear()
        g = p.on(cupy)
        enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method=method, bucketing="gpu")
        ahead = p.on(cupy)
        table = enc.make_buckets(ahead.inp, p.C, bfloat16, V=500)
        enc.encoder_backward(ahead.dwte, ahead.dwpe, ahead.dout, ahead.inp, seed=seed, method=method, buckets=table)
        one_launch = chunked and want_in_call is None  # the chunked call of one sequence runs no wpe kernel
        assert grids == ([None] if one_launch else [want_in_call, None]), (B, T)
        for got in (g, ahead):
            assert compare.bitwise_equal(got.dwte, cpu.dwte) and compare.bitwise_equal(got.dwpe, cpu.dwpe)
