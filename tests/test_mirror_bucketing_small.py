"""The phase-by-phase twin of kernels/bucketing_small.cu builds the documented bucket table (CPU only)."""

from __future__ import annotations

import numpy as np
import pytest

from gpt2enc_edu import buckets
from gpt2enc_edu import mirror_bucketing_small as twin
from gpt2enc_edu.rounding import bfloat16
from gpt2enc_edu.tokens import make_ids


@pytest.mark.parametrize("B, T, V, ids", [(1, 1, 1, "uniform"), (1, 1, 5, "uniform"), (1, 1000, 2, "uniform"),
                                          (1, 1024, 50257, "zipf"), (1, 1024, 50257, "real"),
                                          (2, 1000, 65536, "uniform"), (8, 1024, 50257, "uniform"),
                                          (8, 1024, 50257, "zipf"), (3, 333, 17, "uniform")])
@pytest.mark.parametrize("dtype, C", [(bfloat16, 776), (np.float32, 768)])
def test_twin_builds_the_numpy_table(B, T, V, ids, dtype, C):
    rng = np.random.default_rng(B * 1000 + T + V)
    inp = make_ids(ids, B, T, seed=rng) if ids == "real" else make_ids(ids, B, T, V=V, seed=rng)
    got, want = twin.bucketing_small_kernel(inp, C, dtype, V), buckets.build_bucket_table(inp, C, dtype)
    assert np.array_equal(got.info, want.info)
    assert np.array_equal(got.bt_list, want.bt_list)
    assert np.array_equal(got.units, want.units)


def test_one_pass_is_a_stable_sort_by_its_digit():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**32, 3 * 1024, dtype=np.uint64).astype(np.uint32)
    digit = (keys >> np.uint32(4)) & np.uint32(15)
    assert np.array_equal(twin.sort_pass(keys, 3, 4), keys[np.argsort(digit, kind="stable")])


def test_refuses_what_the_kernel_does_not_take():
    with pytest.raises(ValueError):
        twin.bucketing_small_kernel(np.zeros(8193, dtype=np.int32), 64, bfloat16, 10)
    with pytest.raises(ValueError):
        twin.bucketing_small_kernel(np.zeros(4, dtype=np.int32), 64, bfloat16, 70000)
