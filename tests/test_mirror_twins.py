"""The mirror's kernel twins, step by step: the chunked pair (chunk kernel, combine kernel) and the bucketing
kernel's phase-by-phase twin. On the CPU against plain oracles; on the GPU (``gpu`` mark) against the kernels
themselves, intermediate buffers included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2enc_edu as enc
from gpt2enc_edu import buckets, compare, layout, loader, mirror
from gpt2enc_edu.buckets import mirror_cooperative as twin
from gpt2enc_edu.layout import CHUNK_ITEMS, c_per_group, ceil_div, num_c_groups
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import NOISE_STREAM_DWTE, bfloat16, fadd, round_to_storage, to_float
from gpt2enc_edu.tokens import make_ids

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]


def _ids(kind, B, T, V, rng):
    """make_ids' kinds, plus "repeated" (one token everywhere) and "distinct" (every id once, B*T == V)."""
    if kind == "repeated":
        return np.full((B, T), V - 1, dtype=np.int32)
    if kind == "distinct":
        return rng.permutation(V).astype(np.int32).reshape(B, T)
    return make_ids(kind, B, T, V=V, seed=rng)


# ----------------------------------------------------------------------------------------------------------
# The chunked pair.


def _chunk_sums(positions, dout_rows):
    """The fixed order of the kernel header: each chunk's items in bt order, from 0."""
    sums = []
    for first in range(0, positions.size, CHUNK_ITEMS):
        p = np.zeros(dout_rows.shape[1], dtype=np.float32)
        for bt in positions[first : first + CHUNK_ITEMS]:
            p = fadd(p, to_float(dout_rows[bt]))
        sums.append(p)
    return sums


def _chunked_in_fixed_order(dwte, inp, dout, C, seed):
    """The oracle, a plain loop over tokens: ``s = ((p_0 + p_1) + ...)``, ``dwte = round(s + dwte_old)``."""
    flat, rows, out = inp.reshape(-1), dout.reshape(-1, C), dwte.copy()
    for ix in np.unique(flat):
        sums = _chunk_sums(np.flatnonzero(flat == ix), rows)
        s = sums[0]
        for p in sums[1:]:
            s = fadd(s, p)
        element = ix * C + np.arange(C)
        out[ix] = round_to_storage(fadd(s, to_float(dwte[ix])), dwte.dtype, element, NOISE_STREAM_DWTE, seed)
    return out


CHUNKED_CASES = [  # (B, T, C, V, ids): random and skewed, C past a group boundary
    pytest.param((4, 64, 264, 500, "uniform"), id="uniform-C264"),
    pytest.param((4, 128, 776, 2000, "zipf"), id="zipf-C776"),
    pytest.param((1, 3000, 72, 5, "repeated"), id="one-token-3000x"),
    pytest.param((8, 256, 136, 2, "uniform"), id="V2-1000x"),
    pytest.param((1, 1, 8, 3, "uniform"), id="B1-T1"),
    pytest.param((8, 1024, 768, 3, "repeated"), id="one-token-8192x-C768"),  # combine: 24 slices, 2 stages each
    pytest.param((2, 1024, 1600, 40, "uniform"), id="C1600-2-chunks"),  # combine: 4 slices, 2 per block
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CHUNKED_CASES)
def test_chunked_mirror_equals_fixed_order_loop(rng, dtype, case):
    B, T, C, V, ids = case
    p = random_problem(B, T, C, V, dtype=dtype, rng=rng)
    inp = _ids(ids, B, T, V, rng)
    seed = int(rng.integers(2**32))
    dwte = p.dwte.copy()
    mirror.encoder_backward_wte_chunked(dwte, enc.make_buckets(inp, C, dtype), p.dout, C, seed)
    assert compare.bitwise_equal(dwte, _chunked_in_fixed_order(p.dwte, inp, p.dout, C, seed))


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_kernel_partials_layout_then_combine(rng, dtype):
    """After the chunk kernel: single-chunk tokens are final, multi-chunk tokens untouched, and unit u's
    partial sums sit at ``partials[u * c_padded + c]`` (padding untouched). The combine kernel finishes."""
    B, T, C, V = 4, 200, 264, 12  # C spans two channel groups, the second one partly
    p = random_problem(B, T, C, V, dtype=dtype, rng=rng)
    inp = rng.integers(0, V - 2, (B, T)).astype(np.int32)  # ten tokens, ~80 times each: multi-chunk
    inp[0, :3] = [V - 1, V - 2, V - 2]  # two rare tokens: single-chunk
    seed = int(rng.integers(2**32))
    table = enc.make_buckets(inp, C, dtype)
    c_padded = num_c_groups(C, dtype) * c_per_group(dtype)
    multi = table.units[:, 3] > CHUNK_ITEMS
    assert multi.any() and not multi.all()
    partials = np.zeros(int(multi.sum()) * c_padded, dtype=np.float32)

    dwte = p.dwte.copy()
    mirror.encoder_backward_wte_chunked_kernel(dwte, table.units, table.bt_list, p.dout, partials, table.num_units,
                                               C, seed)
    expected = _chunked_in_fixed_order(p.dwte, inp, p.dout, C, seed)
    rows = p.dout.reshape(-1, C)
    for u, (ix, chunk, start, size) in enumerate(table.units.tolist()):
        if size > CHUNK_ITEMS:
            stored = partials[u * c_padded : (u + 1) * c_padded]
            chunk_sum = _chunk_sums(table.bt_list[start : start + size], rows)[chunk]
            assert compare.bitwise_equal(stored[:C], chunk_sum), (u, ix, chunk)
            assert not stored[C:].any()
            assert compare.bitwise_equal(dwte[ix], p.dwte[ix])  # left for the combine kernel
        else:
            assert compare.bitwise_equal(dwte[ix], expected[ix])  # finished in place

    mirror.encoder_backward_wte_chunk_combine_kernel(dwte, table.units, partials, table.num_units, C, seed)
    assert compare.bitwise_equal(dwte, expected)


@settings(max_examples=300, deadline=None)
@given(num_chunks=st.integers(2, 5000), columns=st.integers(1, 3000))
def test_combine_slices_give_every_column_one_thread(num_chunks, columns):
    """The combine kernel's slices of a token: each column of 4 channels in exactly one slice, no slice empty or
    wider than a block's threads, no more slices than the chunks or COMBINE_MIN_COLUMNS allow; arrays as ints do."""
    num_slices, width = layout.combine_slices(num_chunks, 4 * columns)
    assert (num_slices - 1) * width < columns <= num_slices * width
    assert 1 <= width <= layout.COMBINE_THREADS
    assert num_slices <= ceil_div(columns, layout.COMBINE_MIN_COLUMNS)
    assert num_slices <= max(num_chunks, ceil_div(columns, layout.COMBINE_THREADS))  # no more than the chunks ask
    as_array = layout.combine_slices(np.array([num_chunks, num_chunks]), 4 * columns)
    assert [a.tolist() for a in as_array] == [[num_slices] * 2, [width] * 2]


# ----------------------------------------------------------------------------------------------------------
# The bucketing twin on the CPU.

BUCKETING_CASES = [  # (B, T, V, ids)
    pytest.param((4, 64, 50257, "uniform"), id="uniform"),
    pytest.param((8, 256, 50257, "zipf"), id="zipf"),
    pytest.param((2, 128, 50257, "real"), id="real"),
    pytest.param((1, 1, 5, "uniform"), id="B1-T1"),
    pytest.param((3, 1, 1000, "uniform"), id="T1"),
    pytest.param((1, 3000, 7, "repeated"), id="one-token-3000x"),
    pytest.param((4, 300, 1200, "distinct"), id="all-distinct"),
    pytest.param((8, 1024, 2, "uniform"), id="V2"),
    pytest.param((1, 1, 1, "uniform"), id="V1"),
]


@pytest.mark.parametrize("num_blocks", [1, 3, 132])
@pytest.mark.parametrize("dtype, C", [(bfloat16, 768), (np.float32, 776), (bfloat16, 8)], ids=["bf16", "fp32", "C8"])
@pytest.mark.parametrize("case", BUCKETING_CASES)
def test_bucketing_twin_equals_make_buckets(rng, case, dtype, C, num_blocks):
    B, T, V, ids = case
    inp = _ids(ids, B, T, V, rng)
    table = twin.bucketing_kernel(inp, C, dtype, V, num_blocks=num_blocks)
    assert buckets.same_table(table, enc.make_buckets(inp, C, dtype))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(1, 300), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_bucketing_twin_equals_make_buckets_property(BT, V, num_blocks, seed):
    inp = np.random.default_rng(seed).integers(0, V, (1, BT)).astype(np.int32)
    assert buckets.same_table(twin.bucketing_kernel(inp, 264, bfloat16, V, num_blocks=num_blocks),
                              enc.make_buckets(inp, 264, bfloat16))


@pytest.mark.parametrize("reversed_", [False, True])
@pytest.mark.parametrize("n, num_blocks", [(0, 3), (1, 1), (5, 3), (3, 5), (2500, 7), (2048, 2)])
def test_grid_scan_inplace(rng, n, num_blocks, reversed_):
    data = rng.integers(0, 50, n).astype(np.int32)
    original = data.copy()
    block_sums = np.zeros(num_blocks, dtype=np.int32)
    total = twin.grid_scan_inplace(data, n, reversed_, block_sums, num_blocks)
    order = original[::-1] if reversed_ else original
    expected = (np.cumsum(order) - order)[::-1] if reversed_ else np.cumsum(order) - order
    assert total == original.sum() and np.array_equal(data, expected)
    lo, hi = twin.block_ranges(n, num_blocks)
    for b in range(num_blocks):
        assert block_sums[b] == order[lo[b] : hi[b]].sum()


@pytest.mark.parametrize("n, max_key, num_blocks", [(1, 0, 1), (3000, 255, 4), (5000, 70000, 3), (777, 2**32 - 1, 9)])
def test_radix_sort_is_a_stable_sort_with_block_histograms(rng, n, max_key, num_blocks):
    keys = rng.integers(0, max_key, n, endpoint=True).astype(np.uint32)
    keys0, vals0 = keys.copy(), np.arange(n, dtype=np.int32)
    keys1, vals1 = np.zeros_like(keys0), np.zeros_like(vals0)
    hist = np.zeros(layout.RADIX_DIGITS * num_blocks, dtype=np.int32)
    in_one = twin.radix_sort(keys0, vals0, keys1, vals1, n, max_key, hist, num_blocks)
    passes = max(1, ceil_div(int(max_key).bit_length(), layout.RADIX_BITS))
    assert in_one == (passes % 2 == 1)
    out_keys, out_vals = (keys1, vals1) if in_one else (keys0, vals0)
    order = np.argsort(keys, kind="stable")
    assert np.array_equal(out_vals, order) and np.array_equal(out_keys, keys[order])
    # hist holds the last pass's per-block digit histograms, block-major.
    last_input = (keys0 if in_one else keys1) >> np.uint32(layout.RADIX_BITS * (passes - 1))
    lo, hi = twin.block_ranges(n, num_blocks)
    for b in range(num_blocks):
        digits = last_input[lo[b] : hi[b]] & np.uint32(layout.RADIX_DIGITS - 1)
        assert np.array_equal(hist.reshape(num_blocks, -1)[b], np.bincount(digits, minlength=layout.RADIX_DIGITS))


def test_bucketing_twin_phases_by_hand():
    """The intermediate buffers on a small example a learner can check by eye."""
    inp = np.array([[5, 2, 5], [2, 9, 5]], dtype=np.int32)
    ws = twin.make_workspace(6, 10, num_blocks=2, fill=-1)
    table = twin.bucketing_kernel(inp, 512, bfloat16, 10, num_blocks=2, workspace=ws)
    assert ws.counts.tolist() == [0, 0, 2, 0, 0, 3, 0, 0, 0, 1]
    assert ws.presence.tolist() == [0, 2, 1, 0, 0, 0, 0]  # counts 1, 2, 3 -> classes 2, 1, 0
    assert ws.rank_of_ix[[5, 2, 9]].tolist() == [0, 1, 2]
    assert ws.token_starts[:3].tolist() == [0, 3, 5] and ws.unit_starts[:3].tolist() == [0, 1, 2]
    counters = ws.counters.tolist()
    assert counters[layout.COUNTER_NUM_DISTINCT] == 3 and counters[layout.COUNTER_MAX_COUNT] == 3
    assert counters[layout.COUNTER_NUM_BUCKETS] == 6 and counters[layout.COUNTER_NUM_UNITS] == 3
    assert table.bt_list.tolist() == [0, 2, 5, 1, 3, 4]


# ----------------------------------------------------------------------------------------------------------
# On the GPU: the kernels themselves, launched here so that their buffers can be read.

GPU_CASES = [  # (B, T, C, V, ids)
    pytest.param((4, 64, 768, 5000, "zipf"), id="zipf-C768"),
    pytest.param((1, 37, 776, 300, "uniform"), id="C776"),
    pytest.param((8, 1024, 64, 2, "uniform"), id="thousands-per-token"),
    pytest.param((1, 3000, 264, 7, "repeated"), id="one-token-3000x"),
    pytest.param((4, 300, 72, 1200, "distinct"), id="all-distinct"),
    pytest.param((1, 1, 8, 5, "uniform"), id="B1-T1"),
    *CHUNKED_CASES[-2:],  # the combine kernel's stages and slices
]
POISON = 0x5A5A5A5A


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_chunked_kernels_equal_their_twins(rng, dtype, case):
    """dwte after each of the two kernels, and the partials between them, bit for bit."""
    import cupy

    B, T, C, V, ids = case
    if C % (16 // np.dtype(dtype).itemsize):
        pytest.skip("C not a multiple of this dtype's pack")
    p = random_problem(B, T, C, V, dtype=dtype, rng=rng)
    inp = _ids(ids, B, T, V, rng)
    seed = int(rng.integers(2**32))
    table = enc.make_buckets(inp, C, dtype)
    c_padded = num_c_groups(C, dtype) * c_per_group(dtype)
    partials = np.zeros(max(1, int((table.units[:, 3] > CHUNK_ITEMS).sum())) * c_padded, dtype=np.float32)
    dwte = p.dwte.copy()

    # Every warp of the chunk kernel's grid reads its unit row before it checks num_units: pad with zero rows.
    # The grid has a row per channel group (the kernel's group is its blockIdx.y).
    grid = ceil_div(table.num_units, layout.CHUNKED_WARPS_PER_BLOCK)
    g_units = cupy.zeros((grid * layout.CHUNKED_WARPS_PER_BLOCK, 4), dtype=np.int32)
    g_units[: table.num_units] = cupy.asarray(table.units)
    g_bt_list, g_num_units = cupy.asarray(table.bt_list), cupy.asarray([table.num_units], dtype=np.int32)
    g_dwte, g_dout, g_partials = cupy.asarray(p.dwte), cupy.asarray(p.dout), cupy.asarray(partials)
    file_name = "encoder_backward_wte_chunked.cu"
    chunk_kernel = loader.get_kernel(file_name, "encoder_backward_wte_chunked_kernel", dtype)
    combine_kernel = loader.get_kernel(file_name, "encoder_backward_wte_chunk_combine_kernel", dtype)
    args = (np.int32(C), np.uint32(seed))

    mirror.encoder_backward_wte_chunked_kernel(dwte, table.units, table.bt_list, p.dout, partials, table.num_units,
                                               C, seed)
    loader.launch(chunk_kernel, (grid, num_c_groups(C, dtype)), layout.WARP_SIZE * layout.CHUNKED_WARPS_PER_BLOCK,
                  (g_dwte, g_units, g_bt_list, g_dout, g_partials, g_num_units) + args)
    assert compare.bitwise_equal(g_partials, partials)
    assert compare.bitwise_equal(g_dwte, dwte)

    mirror.encoder_backward_wte_chunk_combine_kernel(dwte, table.units, partials, table.num_units, C, seed)
    loader.launch(combine_kernel, table.num_units, layout.COMBINE_THREADS,
                  (g_dwte, g_units, g_partials, g_num_units) + args)
    assert compare.bitwise_equal(g_dwte, dwte)
    assert not compare.bitwise_equal(dwte, p.dwte)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GPU_CASES + [pytest.param((64, 1024, 768, 50257, "zipf"), id="B64-zipf")])
def test_gpu_bucketing_kernel_equals_its_twin(rng, dtype, case):
    """The table, and every workspace buffer (poisoned alike first), for several grid sizes."""
    import cupy

    from gpt2enc_edu.buckets.gpu import max_units

    B, T, C, V, ids = case
    inp = _ids(ids, B, T, V, rng)
    BT, groups = B * T, num_c_groups(C, dtype)
    g_inp = cupy.asarray(inp)
    assert buckets.same_table(twin.bucketing_kernel(inp, C, dtype, V), enc.make_buckets(g_inp, C, dtype, V=V).to_host())

    sms = loader.device_facts().sm_count
    kernel = loader.get_kernel("bucketing.cu", "bucketing_kernel", dtype)
    for num_blocks in sorted({1, 2, layout.cooperative_grid_blocks(BT, V, sms)}):
        ws = twin.make_workspace(BT, V, num_blocks, fill=POISON)
        g_ws = twin.make_workspace(BT, V, num_blocks, fill=POISON)
        g_buffers = {name: cupy.asarray(getattr(g_ws, name)) for name in
                     ("counts", "presence", "keys0", "vals0", "keys1", "vals1", "hist", "rank_of_ix", "token_starts",
                      "unit_starts", "counters")}
        g_info = cupy.full((min(V, BT) * groups, 4), POISON, dtype=np.int32)
        g_units = cupy.full((max_units(BT, V), 4), POISON, dtype=np.int32)
        g_bt_list = cupy.full(BT, POISON, dtype=np.int32)
        b = g_buffers
        loader.launch(kernel, num_blocks, layout.BUCKETING_THREADS,
                      (g_inp, np.int32(BT), np.int32(V), np.int32(groups), b["counts"], b["presence"], b["keys0"],
                       b["vals0"], b["keys1"], b["vals1"], b["hist"], b["rank_of_ix"], b["token_starts"],
                       b["unit_starts"], g_info, g_units, g_bt_list, b["counters"], np.int32(0)))  # 0: all phases
        table = twin.bucketing_kernel(inp, C, dtype, V, num_blocks=num_blocks, workspace=ws)
        for name, g_array in g_buffers.items():
            assert np.array_equal(g_array.get(), getattr(ws, name)), f"{name} differs with {num_blocks} blocks"
        assert np.array_equal(g_info[: table.num_buckets].get(), table.info)
        assert np.array_equal(g_units[: table.num_units].get(), table.units)
        assert np.array_equal(g_bt_list.get(), table.bt_list)
