"""The phase-by-phase twin of kernels/bucketing_small.cu builds the documented bucket table (CPU only)."""

from __future__ import annotations

import numpy as np
import pytest

from gpt2enc_edu import buckets
from gpt2enc_edu.buckets import mirror_small as twin
from gpt2enc_edu.rounding import bfloat16
from gpt2enc_edu.tokens import make_ids


@pytest.mark.parametrize("B, T, V, ids", [(1, 1, 1, "uniform"), (1, 1, 5, "uniform"), (1, 1000, 2, "uniform"),
                                          (1, 1024, 50257, "uniform"), (1, 1024, 50257, "zipf"),
                                          (1, 1024, 50257, "real"), (2, 512, 4194304, "uniform"),
                                          (4, 256, 50257, "zipf"), (3, 333, 17, "uniform"), (1, 33, 1, "uniform")])
@pytest.mark.parametrize("dtype, C", [(bfloat16, 776), (np.float32, 768)])
def test_twin_builds_the_numpy_table(B, T, V, ids, dtype, C):
    rng = np.random.default_rng(B * 1000 + T + V)
    inp = make_ids(ids, B, T, seed=rng) if ids == "real" else make_ids(ids, B, T, V=V, seed=rng)
    got, want = twin.bucketing_small_kernel(inp, C, dtype, V), buckets.build_bucket_table(inp, C, dtype)
    assert np.array_equal(got.info, want.info)
    assert np.array_equal(got.bt_list, want.bt_list)
    assert np.array_equal(got.units, want.units)


@pytest.mark.parametrize("n", [1, 2, 32, 64, 512, 1024])
def test_the_bitonic_network_sorts(n):
    rng = np.random.default_rng(n)
    key = np.full(1024, twin.NO_KEY, dtype=np.uint32)
    key[:n] = rng.permutation(2**20)[:n]
    assert np.array_equal(twin.block_bitonic_sort(key), np.sort(key))


@pytest.mark.parametrize("V, ids", [(50257, "uniform"), (50257, "zipf"), (None, "real"), (2, "uniform"),
                                   (40, "uniform"), (300, "zipf"), (3, "uniform")])
@pytest.mark.parametrize("BT", [1, 5, 37, 700, 1000, 1024])
def test_ranks_by_class_equal_a_sort_of_the_token_keys(rng, V, ids, BT):
    """Phase 3's count classes give the order a bitonic sort of the keys (1024 - count, segment) gives: every
    class size, big tokens (more than 32 items, ranked by comparison) and none."""
    inp = make_ids(ids, 1, BT, seed=rng) if ids == "real" else make_ids(ids, 1, BT, V=V, seed=rng)
    seg_start, _ = twin.find_segments(twin.sort_positions(inp), BT)
    keys = np.full(twin.SMALL_MAX_BT, twin.NO_KEY, dtype=np.uint32)
    keys[: seg_start.size - 1] = twin.token_keys(seg_start)
    assert np.array_equal(twin.rank_tokens(seg_start), twin.block_bitonic_sort(keys))


def test_counters_describe_the_table():
    inp = np.array([[5, 3, 5, 9, 5, 3]], dtype=np.int32)
    key = twin.sort_positions(inp)
    seg_start, _ = twin.find_segments(key, inp.size)
    _, info, units, counters = twin.write_buckets(key, seg_start, twin.rank_tokens(seg_start), 3)
    assert counters == {"num_distinct": 3, "max_count": 3, "num_classes": 3, "num_buckets": 9, "num_units": 3}
    assert info[:, 2].tolist() == [5, 5, 5, 3, 3, 3, 9, 9, 9]
    assert units.tolist() == [[5, 0, 0, 3], [3, 0, 3, 2], [9, 0, 5, 1]]


def test_refuses_what_the_kernel_does_not_take():
    with pytest.raises(ValueError):
        twin.bucketing_small_kernel(np.zeros(1025, dtype=np.int32), 64, bfloat16, 10)
    with pytest.raises(ValueError):
        twin.bucketing_small_kernel(np.zeros(4, dtype=np.int32), 64, bfloat16, 2**22 + 1)


def test_routes_for_lists_the_routes_that_take_a_batch():
    """``buckets.gpu.routes_for`` (no GPU needed): the one-block kernel only for one sequence of ids that fit its
    keys, the scatter route up to its limit, the cooperative kernel always; the default is the first."""
    from gpt2enc_edu import layout
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    assert gpu_buckets.routes_for(1, 1) == ("small", "scatter", "cooperative")
    assert gpu_buckets.routes_for(1024, layout.SMALL_MAX_V) == ("small", "scatter", "cooperative")
    assert gpu_buckets.routes_for(1024, layout.SMALL_MAX_V + 1) == ("scatter", "cooperative")
    assert gpu_buckets.routes_for(1025, 50257) == ("scatter", "cooperative")
    assert gpu_buckets.routes_for(layout.SCATTER_MAX_BT + 1, 50257) == ("cooperative",)
    assert [gpu_buckets.bucketing_route(bt, 50257) for bt in (1024, 1025, 65537)] == ["small", "scatter", "cooperative"]
