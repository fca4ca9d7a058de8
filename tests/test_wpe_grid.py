"""The wpe kernel on any grid: a thread per pack, or fewer threads that walk the packs in turn (the grid the
package gives it beside the scatter route's bucket table built in the same call), in either of its forms (the
pipelined one for small batches beside that table). Same bits as the mirror every way."""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, cuda, mirror
from gpt2enc_edu.course import perthread
from gpt2enc_edu.layout import (
    BLOCK_SIZE,
    WPE_BLOCK_SIZE,
    WPE_PIPELINED_MAX_B,
    WPE_SM_SHARE_BESIDE_TABLE,
    pack_size,
    wpe_blocks_beside_table,
)
from gpt2enc_edu.loader import DeviceFacts
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


def test_the_pipelined_form_goes_beside_the_table_for_small_batches_on_gpus_that_have_it():
    hopper = DeviceFacts(90, 132, 50 * 2**20, 227 * 2**10)
    assert cuda.WPE_PIPELINED_SHARED == 8 * WPE_BLOCK_SIZE * 16  # a 16-byte slot per stage and thread
    assert [cuda.wpe_form(B, True, hopper) for B in (1, WPE_PIPELINED_MAX_B, WPE_PIPELINED_MAX_B + 1, 64)] == [
        "pipelined", "pipelined", "loads", "loads"]
    assert cuda.wpe_form(1, False, hopper) == "loads"  # the full grid: a thread has one pack to walk
    assert cuda.wpe_form(1, True, DeviceFacts(75, 40, 4 * 2**20, 64 * 2**10)) == "loads"  # no cp.async
    assert cuda.wpe_form(1, True, DeviceFacts(89, 128, 72 * 2**20, 99 * 2**10)) == "loads"  # too little shared memory
    assert cuda.wpe_form(1, True, DeviceFacts(80, 108, 40 * 2**20, 163 * 2**10)) == "pipelined"


def test_an_unknown_wpe_form_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="form must be one of 'loads', 'pipelined'"):
        cuda.encoder_backward_wpe(None, None, 1, 1, 8, 0, form="bulk")


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(cuda.WPE_FORMS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 64, 768), (1, 37, 776), (3, 5, 64), (13, 7, 72)],
                         ids=["ordinary", "C776", "few-packs", "more-rows-than-stages"])
def test_the_kernel_gives_the_mirrors_bits_on_any_grid(rng, dtype, shape, form):
    import cupy

    from gpt2enc_edu.loader import device_facts

    B, T, C = shape
    if C % pack_size(dtype):
        pytest.skip("C is not a whole number of packs")
    if form == "pipelined" and device_facts().shared_per_block_optin < cuda.WPE_PIPELINED_SHARED:
        pytest.skip("this GPU cannot give the pipelined form its shared memory")
    p = random_problem(B, T, C, 1000, maxT=T + 3, dtype=dtype, ids="uniform", rng=rng)
    seed = int(rng.integers(2**32))
    want = _mirror(p, seed)
    full = -(-T * C // pack_size(dtype) // WPE_BLOCK_SIZE)
    for blocks in (1, 3, wpe_blocks_beside_table(device_facts().sm_count), None):
        got = cupy.asarray(p.dwpe)
        cuda.encoder_backward_wpe(got, cupy.asarray(p.dout), B, T, C, seed, blocks=blocks, form=form)
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

    forms = []
    real_get_kernel = cuda.get_kernel

    def fetching(file_name, kernel_name, dtype):
        forms.extend(form for form, name in cuda.WPE_FORMS.items() if name == kernel_name)
        return real_get_kernel(file_name, kernel_name, dtype)

    monkeypatch.setattr(cuda, "encoder_backward_wpe", recording)
    monkeypatch.setattr(cuda, "get_kernel", fetching)
    for B, T, want_in_call in ((2, 1024, narrow), (1, 1000, None)):  # 2048 ids: the scatter route; 1000: one block
        assert bucketing_route(B * T, 500) == ("scatter" if want_in_call else "small")
        p = random_problem(B, T, 64, 500, dtype=bfloat16, ids="zipf", rng=rng)
        seed = int(rng.integers(2**32))
        cpu = p.on(np)
        enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=seed, method=method)
        grids.clear()
        forms.clear()
        g = p.on(cupy)
        enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method=method, bucketing="gpu")
        ahead = p.on(cupy)
        table = enc.make_buckets(ahead.inp, p.C, bfloat16, V=500)
        enc.encoder_backward(ahead.dwte, ahead.dwpe, ahead.dout, ahead.inp, seed=seed, method=method, buckets=table)
        one_launch = chunked and want_in_call is None  # the chunked call of one sequence runs no wpe kernel
        assert grids == ([None] if one_launch else [want_in_call, None]), (B, T)
        in_call = [] if one_launch else [cuda.wpe_form(B, True, device_facts()) if want_in_call else "loads"]
        assert forms == in_call + ["loads"], (B, T)  # the table built ahead: the full grid, the loads form
        for got in (g, ahead):
            assert compare.bitwise_equal(got.dwte, cpu.dwte) and compare.bitwise_equal(got.dwpe, cpu.dwpe)
