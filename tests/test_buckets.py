"""Invariants of the bucket table, as properties over random id arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import gpt2enc_edu as enc
from gpt2enc_edu.layout import CHUNK_ITEMS, c_per_group
from gpt2enc_edu.rounding import bfloat16

id_arrays = st.tuples(st.integers(1, 6), st.integers(1, 80), st.integers(1, 60)).flatmap(
    lambda btv: arrays(np.int32, (btv[0], btv[1]), elements=st.integers(0, btv[2] - 1))
)
dtypes = st.sampled_from([bfloat16, np.float32])
channel_packs = st.integers(1, 120)  # C = packs * pack width


@settings(max_examples=150, deadline=None)
@given(id_arrays, dtypes, channel_packs)
def test_bucket_table_invariants(inp, dtype, packs):
    C = packs * (16 // np.dtype(dtype).itemsize)
    table = enc.make_buckets(inp, C, dtype)
    flat = inp.reshape(-1)
    start, size, ix, group = (table.info[:, j].astype(np.int64) for j in range(4))
    groups = -(-C // c_per_group(dtype))

    # Every position appears exactly once in bt_list, and the table has one bucket per (token, group).
    assert np.array_equal(np.sort(table.bt_list), np.arange(flat.size))
    tokens, counts = np.unique(flat, return_counts=True)
    assert table.num_buckets == tokens.size * groups
    assert table.info.dtype == np.int32 and table.bt_list.dtype == np.int32

    # Order: size descending, then token id, then channel group (lexicographic on (-size, ix, group)).
    key = np.stack([-size, ix, group], axis=1)
    assert all(tuple(key[i]) < tuple(key[i + 1]) for i in range(len(key) - 1))

    # Units: every token cut into CHUNK_ITEMS-item chunks, tokens in bucket order, chunks ascending.
    first_group = group == 0
    expected_units = [(ix[b], j, start[b], size[b]) for b in np.flatnonzero(first_group)
                      for j in range(-(-size[b] // CHUNK_ITEMS))]
    assert [tuple(u) for u in table.units.tolist()] == expected_units
    multi = table.units[:, 3] > CHUNK_ITEMS  # units of multi-chunk tokens form a prefix
    assert not (np.diff(multi.astype(int)) > 0).any()

    for b in range(table.num_buckets):
        items = table.bt_list[start[b] : start[b] + size[b]]
        assert (flat[items] == ix[b]).all()  # the bucket holds its own token's positions
        assert (np.diff(items) > 0).all()  # in ascending bt order
        assert size[b] == counts[np.searchsorted(tokens, ix[b])]
        assert 0 <= group[b] < groups


def test_bucket_table_example():
    inp = np.array([[5, 2, 5], [2, 9, 5]], dtype=np.int32)
    table = enc.make_buckets(inp, 512, bfloat16)  # two channel groups of 256
    assert table.info.tolist() == [
        [0, 3, 5, 0], [0, 3, 5, 1],   # token 5 at bt 0, 2, 5
        [3, 2, 2, 0], [3, 2, 2, 1],   # token 2 at bt 1, 3
        [5, 1, 9, 0], [5, 1, 9, 1],   # token 9 at bt 4
    ]
    assert table.bt_list.tolist() == [0, 2, 5, 1, 3, 4]
    assert table.sizes.tolist() == [3, 3, 2, 2, 1, 1]


def test_bucket_table_is_independent_of_hashing_and_platform():
    inp = np.random.default_rng().integers(0, 50, (4, 32)).astype(np.int32)
    a, b = enc.make_buckets(inp, 768, bfloat16), enc.make_buckets(inp.copy(), 768, bfloat16)
    assert np.array_equal(a.info, b.info) and np.array_equal(a.bt_list, b.bt_list)


def test_a_device_table_without_bucket_rows_refuses_to_be_read_whole():
    """``build_bucket_table_gpu(..., bucket_rows=False)`` marks its table; whatever reads the bucket rows refuses it
    before it touches a device (so this runs anywhere: NumPy arrays stand in for the device buffers)."""
    from gpt2enc_edu import cuda
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    rows = np.zeros((4, 4), dtype=np.int32)
    lean = gpu_buckets.DeviceBucketTable(info=rows, bt_list=np.zeros(4, np.int32), units=rows,
                                         counters=np.zeros(8, np.int32), C=64, dtype=np.dtype(bfloat16),
                                         has_bucket_rows=False)
    with pytest.raises(ValueError, match="bucket_rows=False"):
        lean.to_host()
    with pytest.raises(ValueError, match="the bucketed wte kernel reads the bucket rows"):
        cuda.encoder_backward_wte_bucketed(None, lean, None, 64, 1)
