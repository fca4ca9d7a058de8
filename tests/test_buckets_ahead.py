"""A bucket table built ahead of the backward: ``encoder_backward(..., buckets=make_buckets(...))``.

The deterministic methods read the table and nothing else of the ids' grouping, so a table built earlier (in a
training step: right after the forward) must give the very bits of a call that builds its own. The refusals
(wrong sizes, another method, a table of other ids) are in ``test_validation.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import buckets, compare
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]


def _backward(p, xp, method, seed, **options):
    """dwte, dwpe of one call on a fresh copy of problem ``p`` on backend ``xp``."""
    g = p.on(xp)
    enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method=method, **options)
    return g.dwte, g.dwpe


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
@pytest.mark.parametrize("method", ["chunked", "bucketed"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_table_built_ahead_gives_the_same_bits(xp, rng, dtype, method, kind):
    C = 264 if dtype == bfloat16 else 132  # a last channel group with idle lanes
    p = random_problem(3, 96, C, 400, maxT=100, dtype=dtype, ids=kind, rng=rng)
    seed = int(rng.integers(2**32))
    V = {} if xp is np else {"V": p.V}
    table = enc.make_buckets(xp.asarray(p.inp), C, dtype, **V)
    expected = _backward(p, np, method, seed)  # the mirror, building its own table
    calls = {"own table": {}, "built ahead": {"buckets": table},
             "built ahead, unchecked": {"buckets": table, "check_ids": False}}
    if xp is not np:
        calls["host table built ahead"] = {"buckets": table.to_host()}
    for name, options in calls.items():
        dwte, dwpe = _backward(p, xp, method, seed, **options)
        assert compare.bitwise_equal(dwte, expected[0]), name
        assert compare.bitwise_equal(dwpe, expected[1]), name


def test_make_buckets_without_the_id_check_builds_the_same_table(rng):
    inp = random_problem(2, 64, 32, 50, rng=rng, ids="zipf").inp
    checked, unchecked = (enc.make_buckets(inp, 32, bfloat16, check_ids=flag) for flag in (True, False))
    assert buckets.same_table(checked, unchecked)


@pytest.mark.gpu
def test_a_table_from_make_buckets_outlives_the_next_table(rng):
    """``make_buckets`` copies the table out of its stream's workspace, which the next table of that size on that
    stream overwrites (``build_bucket_table_gpu``'s own tables do not survive it)."""
    import cupy

    from gpt2enc_edu.buckets.gpu import build_bucket_table_gpu

    first, second = (random_problem(2, 512, 768, 50257, ids=kind, rng=rng) for kind in ("zipf", "uniform"))
    host_tables = [enc.make_buckets(p.inp, 768, bfloat16) for p in (first, second)]
    in_workspace = build_bucket_table_gpu(cupy.asarray(first.inp), 768, bfloat16, 50257)
    owned = enc.make_buckets(cupy.asarray(first.inp), 768, bfloat16, V=50257)
    build_bucket_table_gpu(cupy.asarray(second.inp), 768, bfloat16, 50257)
    assert buckets.same_table(owned.to_host(), host_tables[0])
    assert buckets.same_table(in_workspace.to_host(), host_tables[1])  # overwritten by the second table
    seed = int(rng.integers(2**32))
    for method in ("chunked", "bucketed"):
        ahead = _backward(first, cupy, method, seed, buckets=owned, check_ids=False)
        expected = _backward(first, np, method, seed)
        assert compare.bitwise_equal(ahead[0], expected[0]) and compare.bitwise_equal(ahead[1], expected[1])


def test_same_table_compares_every_array(rng):
    inp = random_problem(2, 40, 32, 30, rng=rng, ids="zipf").inp
    table = enc.make_buckets(inp, 32, bfloat16)
    other = inp.copy()
    other[1, 3] = (other[1, 3] + 1) % 30
    assert buckets.same_table(table, enc.make_buckets(inp.copy(), 32, bfloat16))
    assert not buckets.same_table(table, enc.make_buckets(other, 32, bfloat16))
    assert not buckets.same_table(table, enc.make_buckets(inp, 64, bfloat16))
    assert not buckets.same_table(table, enc.make_buckets(inp, 32, np.float32))
    reordered = buckets.reorder_buckets(table, "reversed")
    assert not buckets.same_table(table, reordered)
    assert buckets.same_table(table, reordered, bucket_rows=False)  # the rows are all that differ


def test_reorder_buckets_moves_only_the_bucket_rows(rng):
    table = enc.make_buckets(random_problem(3, 64, 64, 40, rng=rng, ids="zipf").inp, 64, bfloat16)
    rows = rng.permutation(table.num_buckets)
    reordered = buckets.reorder_buckets(table, rows)
    assert np.array_equal(reordered.info, table.info[rows]) and reordered.info.flags.c_contiguous
    assert reordered.bt_list is table.bt_list and reordered.units is table.units
    reversed_ = buckets.reorder_buckets(table, "reversed")
    assert np.array_equal(reversed_.info, table.info[::-1]) and reversed_.info.flags.c_contiguous
    assert np.array_equal(buckets.reorder_buckets(table, "built").info, table.info)
    shuffled = buckets.reorder_buckets(table, "shuffled", rng=np.random.default_rng(3))
    assert np.array_equal(shuffled.info, table.info[np.random.default_rng(3).permutation(table.num_buckets)])
    with pytest.raises(ValueError, match="needs rng"):
        buckets.reorder_buckets(table, "shuffled")
    with pytest.raises(ValueError, match="order must be one of"):
        buckets.reorder_buckets(table, "sorted")
