"""The scatter route (kernels/bucketing_scatter.cu): its NumPy twin builds the documented bucket table (CPU), and
on a GPU the five kernels leave every workspace buffer as the twin does (mark ``gpu``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2enc_edu import buckets, layout
from gpt2enc_edu.buckets import mirror_scatter as twin
from gpt2enc_edu.rounding import bfloat16
from gpt2enc_edu.tokens import make_ids

DTYPES = [pytest.param((bfloat16, 776), id="bf16-C776"), pytest.param((np.float32, 768), id="fp32-C768")]
CASES = [  # (B, T, V, ids)
    (1, 1, 1, "uniform"), (1, 1, 5, "uniform"), (1, 1000, 2, "uniform"),
    (1, 1024, 50257, "zipf"), (1, 1024, 50257, "real"), (3, 700, 70000, "uniform"),
    *[(B, 1024, 50257, ids) for B in (8, 64) for ids in ("uniform", "zipf")],
    (64, 1024, 50257, "repeated"), (2, 999, 1030, "zipf"),
]


def _ids(kind, B, T, V, rng):
    if kind == "repeated":  # one token everywhere: one big token of B*T items, the bitmap full
        return np.full((B, T), V - 1, dtype=np.int32)
    return make_ids(kind, B, T, seed=rng) if kind == "real" else make_ids(kind, B, T, V=V, seed=rng)


def _class_edges(rng) -> np.ndarray:
    """Tokens seen 1, 31, 32 (the largest small class), 33 (the smallest big count) and 34 times, shuffled."""
    counts = {3: 1, 8: 31, 5: 32, 7: 33, 2: 34, 1030: 32, 1031: 33}
    ids = np.concatenate([np.full(n, ix, dtype=np.int32) for ix, n in counts.items()])
    return rng.permutation(ids)[None, :]


@pytest.mark.parametrize("B, T, V, ids", CASES)
@pytest.mark.parametrize("dtype_c", DTYPES)
def test_twin_builds_the_numpy_table(B, T, V, ids, dtype_c):
    dtype, C = dtype_c
    rng = np.random.default_rng(B * 100003 + T * 7 + V)
    inp = _ids(ids, B, T, V, rng)
    assert buckets.same_table(twin.bucketing_scatter(inp, C, dtype, V), buckets.build_bucket_table(inp, C, dtype))


def test_twin_at_the_class_edges():
    inp = _class_edges(np.random.default_rng(1))
    table = twin.bucketing_scatter(inp, 768, bfloat16, 1100)
    assert buckets.same_table(table, buckets.build_bucket_table(inp, 768, bfloat16))
    # big tokens (34, 33, 33 items) first, then the class of 32 by id, then 31, then 1
    assert table.sizes[:: table.num_c_groups].tolist() == [34, 33, 33, 32, 32, 31, 1]
    assert table.token_ids[:: table.num_c_groups].tolist() == [2, 7, 1031, 5, 1030, 8, 3]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300).flatmap(
        lambda V: st.tuples(st.just(V), st.lists(st.integers(0, V - 1), min_size=1, max_size=400))
    )
)
def test_twin_on_any_ids(case):
    V, ids = case
    inp = np.asarray(ids, dtype=np.int32)[None, :]
    ws = twin.make_workspace(inp, 520, bfloat16, V)
    table = twin.bucketing_scatter(inp, 520, bfloat16, V, workspace=ws)
    assert buckets.same_table(table, buckets.build_bucket_table(inp, 520, bfloat16))
    counts = np.bincount(inp.ravel(), minlength=V)  # the sizes, with and without big tokens
    assert ws.counters[layout.COUNTER_NUM_DISTINCT] == np.count_nonzero(counts)
    assert ws.counters[layout.COUNTER_MAX_COUNT] == counts.max()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=layout.CHUNK_ITEMS, max_size=layout.CHUNK_ITEMS),
    st.integers(0, 60), st.integers(0, 5000), st.integers(0, 200),
)
def test_class_bases_scan_is_the_running_sum_in_class_order(class_totals, num_big, big_items, big_units):
    """Every block of kernel 3 finds the class bases with a warp's two scans (lane l: class 32 - l); they are the
    running sums over the classes 32, 31, ..., 1 after the big tokens, and the ballot says which classes have
    tokens."""
    counters = np.zeros(layout.NUM_COUNTERS, dtype=np.int32)
    big_slots = [layout.COUNTER_NUM_BIG, layout.COUNTER_BIG_ITEMS, layout.COUNTER_BIG_UNITS]
    counters[big_slots] = num_big, big_items, big_units
    base, has_tokens = twin.class_bases_warp(np.asarray(class_totals), counters)
    rank, item, unit = num_big, big_items, big_units
    for c in range(layout.CHUNK_ITEMS, 0, -1):
        assert base[:, c - 1].tolist() == [rank, item, unit], c
        n = class_totals[c - 1]
        rank, item, unit = rank + n, item + n * c, unit + n
        assert bool(has_tokens >> (layout.CHUNK_ITEMS - c) & 1) == (n > 0)


def test_twin_workspace_after_a_table():
    """What the kernels leave besides the table: counts back at zero, the class bases, the sizes."""
    inp = _class_edges(np.random.default_rng(2))
    ws = twin.make_workspace(inp, 768, bfloat16, 1100)
    twin.bucketing_scatter(inp, 768, bfloat16, 1100, workspace=ws)
    assert not ws.counts.any()
    counters = ws.counters
    assert counters[layout.COUNTER_NUM_BIG] == 3 and counters[layout.COUNTER_NUM_DISTINCT] == 7
    assert counters[layout.COUNTER_MAX_COUNT] == 34 and counters[layout.COUNTER_NUM_UNITS] == 2 + 2 + 2 + 4
    assert counters[layout.COUNTER_NUM_BUCKETS] == 7 * 3
    # class 32 starts at rank 3, after the 34 + 33 + 33 items of the big tokens, after their 6 units
    assert ws.class_bases[:, 31].tolist() == [3, 100, 6]
    assert ws.class_bases[:, 0].tolist() == [6, 100 + 64 + 31, 9]  # class 1: after classes 32 and 31
    assert ws.big_sorted[:3].tolist() == [2, 7, 1031] and ws.big_unit_starts[:3].tolist() == [0, 2, 4]
    # kernel 2's sums over the big tokens, from which every block of kernel 3 finds the class bases
    assert counters[layout.COUNTER_BIG_ITEMS] == 100 and counters[layout.COUNTER_BIG_UNITS] == 6


@pytest.mark.parametrize("B, T, V, ids", [(1, 110, 1100, "edges"), (8, 1024, 50257, "zipf"),
                                         (64, 1024, 50257, "uniform"), (4, 256, 500, "repeated")])
def test_twin_without_bucket_rows(B, T, V, ids):
    """The chunked method's table (``bucket_rows=False``): kernel 3 writes the big tokens' bucket rows only (kernel 5
    reads those), kernel 5 finds every small token's range from the class bases, and bt_list and the units are the
    whole table's."""
    rng = np.random.default_rng(B + T + V)
    inp = _class_edges(rng) if ids == "edges" else _ids(ids, B, T, V, rng)
    ws = twin.make_workspace(inp, 768, bfloat16, V, bucket_rows=False)
    ws.bucket_info[:] = -1  # poison: what the kernels leave alone stays so
    table = twin.bucketing_scatter(inp, 768, bfloat16, V, workspace=ws)
    want = buckets.build_bucket_table(inp, 768, bfloat16)
    assert buckets.same_table(table, want, bucket_rows=False) and table.num_buckets == 0
    big_rows = int(ws.counters[layout.COUNTER_NUM_BIG]) * want.num_c_groups
    assert np.array_equal(ws.bucket_info[:big_rows], want.info[:big_rows])
    assert (ws.bucket_info[big_rows:] == -1).all()


def test_refuses_what_the_kernels_do_not_take():
    with pytest.raises(ValueError, match="scatter route"):
        twin.make_workspace(np.zeros(layout.SCATTER_MAX_BT + 1, dtype=np.int32), 64, bfloat16, 10)


def test_rank_among_equal_counts_earlier_equal_keys():
    keys = np.array([5, 3, 5, 5, 3, 9])
    assert twin.rank_among_equal(keys).tolist() == [0, 0, 1, 2, 1, 0]


GPU_BUFFERS = ("tile_totals", "class_bases", "counts")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "B, T, V, ids", [c for c in CASES if c[3] != "real"] + [(1, 1024, 50257, "real"), (1, 110, 1100, "edges")]
)
@pytest.mark.parametrize("dtype_c", DTYPES)
def test_gpu_scatter_route_equals_its_twin(B, T, V, ids, dtype_c):
    """The table (written over poison) and the workspace the kernels leave, against the twin's."""
    import cupy

    from gpt2enc_edu.buckets import gpu as gpu_buckets

    dtype, C = dtype_c
    rng = np.random.default_rng(B * 31 + T + V)
    inp = _class_edges(rng) if ids == "edges" else _ids(ids, B, T, V, rng)
    g_inp = cupy.asarray(inp)
    gpu_buckets.release_workspaces()  # a fresh workspace; poisoned below, so it is dropped again at the end
    try:
        _check_against_twin(gpu_buckets, inp, g_inp, C, dtype, V)
    finally:
        gpu_buckets.release_workspaces()


@pytest.mark.gpu
@pytest.mark.parametrize("B, T, V, ids", [(1, 110, 1100, "edges"), (8, 1024, 50257, "zipf"),
                                         (64, 1024, 50257, "uniform"), (64, 1024, 50257, "repeated")])
def test_gpu_scatter_route_without_bucket_rows_equals_its_twin(B, T, V, ids):
    """The chunked method's table (``bucket_rows=False``): the small tokens' bucket rows stay as they were (poison),
    the big tokens' rows, bt_list, the units and the workspace are the twin's; the table says it has no rows."""
    import cupy

    from gpt2enc_edu.buckets import gpu as gpu_buckets

    rng = np.random.default_rng(B * 37 + T + V)
    inp = _class_edges(rng) if ids == "edges" else _ids(ids, B, T, V, rng)
    g_inp = cupy.asarray(inp)
    gpu_buckets.release_workspaces()
    try:
        _check_against_twin(gpu_buckets, inp, g_inp, 768, bfloat16, V, bucket_rows=False)
        table = gpu_buckets.build_bucket_table_gpu(g_inp, 768, bfloat16, V, route="scatter", bucket_rows=False)
        assert not table.has_bucket_rows
        assert buckets.same_table(table.to_host(bucket_rows=False), buckets.build_bucket_table(inp, 768, bfloat16),
                                  bucket_rows=False)
    finally:
        gpu_buckets.release_workspaces()


def _check_against_twin(gpu_buckets, inp, g_inp, C, dtype, V, bucket_rows=True):
    # allocates, builds once
    ws = gpu_buckets.build_in_workspace(g_inp, C, dtype, V, route="scatter", bucket_rows=bucket_rows)
    for name in (
        "info",
        "units",
        "bt_list",
        "tile_totals",
        "class_bases",
        "big_sorted",
        "big_unit_starts",
        "token_starts",
    ):
        getattr(ws, name).fill(-0x5A5A5A5A)  # poison: every value the twin compares must be written again
    ws.counters.fill(-7)
    gpu_buckets.build_in_workspace(g_inp, C, dtype, V, route="scatter", bucket_rows=bucket_rows)
    t_ws = twin.make_workspace(inp, C, dtype, V, bucket_rows=bucket_rows)
    table = twin.bucketing_scatter(inp, C, dtype, V, workspace=t_ws)
    assert buckets.same_table(table, buckets.build_bucket_table(inp, C, dtype), bucket_rows=bucket_rows)
    if bucket_rows:
        assert np.array_equal(ws.info[: table.num_buckets].get(), table.info)
    else:  # only the big tokens' rows are written (kernel 5 reads them); the rest stays poison
        big_rows = int(t_ws.counters[layout.COUNTER_NUM_BIG]) * t_ws.num_c_groups
        num_buckets = int(t_ws.counters[layout.COUNTER_NUM_BUCKETS])
        info = ws.info[:num_buckets].get()
        assert np.array_equal(info[:big_rows], t_ws.bucket_info[:big_rows])
        assert (info[big_rows:] == -0x5A5A5A5A).all()
    assert np.array_equal(ws.units[: table.num_units].get(), table.units)
    assert np.array_equal(ws.bt_list.get(), table.bt_list)
    assert np.array_equal(ws.tile_totals.get(), t_ws.tile_totals.reshape(-1))
    assert np.array_equal(ws.class_bases.get(), t_ws.class_bases.reshape(-1))
    assert not ws.counts.get().any()  # counted back down to zero
    num_big = int(t_ws.counters[layout.COUNTER_NUM_BIG])
    assert np.array_equal(ws.big_sorted[:num_big].get(), t_ws.big_sorted[:num_big])
    assert np.array_equal(ws.big_unit_starts[:num_big].get(), t_ws.big_unit_starts[:num_big])
    present = np.unique(inp)
    assert np.array_equal(ws.token_starts.get()[present], t_ws.token_starts[present])
    slots = [
        layout.COUNTER_NUM_DISTINCT,
        layout.COUNTER_MAX_COUNT,
        layout.COUNTER_NUM_BUCKETS,
        layout.COUNTER_NUM_UNITS,
        layout.COUNTER_NUM_BIG,
        layout.COUNTER_BIG_ITEMS,
        layout.COUNTER_BIG_UNITS,
    ]
    assert np.array_equal(ws.counters.get()[slots], t_ws.counters[slots])


@pytest.mark.gpu
@pytest.mark.parametrize("B, V", [(1, 50257), (8, 300)])
def test_gpu_scatter_route_replays_its_copy_graph_with_new_buffers(B, V):
    """Call 1 launches the kernels one by one, call 2 captures the copy graph, calls 3+ replay it: every call's ids
    are in a buffer of their own (all kept alive, so no address comes back), and every table is its own ids' table
    (the graph reads the ids the call copied in), on two streams."""
    import cupy

    from gpt2enc_edu.buckets import gpu as gpu_buckets

    rng = np.random.default_rng(B + V)
    gpu_buckets.release_workspaces()
    try:
        for stream in (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream.null):
            with stream:
                kept = []
                for call in range(4):
                    inp = _ids("zipf" if call % 2 else "uniform", B, 1024, V, rng)
                    kept.append(cupy.asarray(inp))
                    got = gpu_buckets.build_bucket_table_gpu(kept[-1], 768, bfloat16, V, route="scatter").to_host()
                    assert buckets.same_table(got, buckets.build_bucket_table(inp, 768, bfloat16)), f"call {call}"
                ws = next(w for k, w in gpu_buckets.workspaces.items() if k[1] == stream.ptr)
                assert ws.graph is not None and not ws.graphs_in_place  # the copy graph, no buffer seen twice
                assert not ws.counts.get().any()  # counted back down to zero: the next table needs no memset
    finally:
        gpu_buckets.release_workspaces()


@pytest.mark.gpu
def test_gpu_scatter_route_reads_a_known_buffer_in_place():
    """A buffer met before gets a graph that reads it in place: new ids written into the same buffer (as a training
    loop's memory pool hands the same block back) give their own table. More recurring buffers than
    ``SCATTER_GRAPHS`` take the copy graph, and are right too."""
    import cupy

    from gpt2enc_edu.buckets import gpu as gpu_buckets

    rng = np.random.default_rng(11)
    B, T, V = 4, 512, 3000
    gpu_buckets.release_workspaces()
    try:
        buffers = [cupy.empty((B, T), np.int32) for _ in range(gpu_buckets.SCATTER_GRAPHS + 2)]
        for sweep in range(3):
            for i, buffer in enumerate(buffers):
                inp = _ids(("uniform", "zipf", "repeated")[(sweep + i) % 3], B, T, V, rng)
                buffer.set(inp)  # new ids, same address
                got = gpu_buckets.build_bucket_table_gpu(buffer, 768, bfloat16, V, route="scatter").to_host()
                assert buckets.same_table(got, buckets.build_bucket_table(inp, 768, bfloat16)), f"sweep {sweep}, {i}"
        ws = next(iter(gpu_buckets.workspaces.values()))
        assert len(ws.graphs_in_place) == gpu_buckets.SCATTER_GRAPHS
        assert set(ws.graphs_in_place) <= {b.data.ptr for b in buffers} and ws.graph is not None
    finally:
        gpu_buckets.release_workspaces()


@pytest.mark.gpu
def test_gpu_scatter_route_clears_counts_only_after_a_stopped_run():
    """A complete table leaves ``counts`` at zero (no memset before the next one); a run stopped after kernel 2
    leaves them dirty, and the next table clears them first and is right."""
    import cupy

    from gpt2enc_edu.buckets import gpu as gpu_buckets

    rng = np.random.default_rng(12)
    inp = _ids("zipf", 8, 1024, 50257, rng)
    g_inp = cupy.asarray(inp)
    want = buckets.build_bucket_table(inp, 768, bfloat16)
    gpu_buckets.release_workspaces()
    try:
        for stopped in (False, True, False, True):
            if stopped:
                ws = gpu_buckets.build_in_workspace(g_inp, 768, bfloat16, 50257, stop_after=2, route="scatter")
                assert ws.counts_dirty and ws.counts.get().any()
            got = gpu_buckets.build_bucket_table_gpu(g_inp, 768, bfloat16, 50257, route="scatter").to_host()
            assert buckets.same_table(got, want)
            ws = next(iter(gpu_buckets.workspaces.values()))
            assert not ws.counts_dirty and not ws.counts.get().any()
    finally:
        gpu_buckets.release_workspaces()


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [(1, 1), (2, 3)])
def test_gpu_scatter_sort_kernel_takes_any_pool(monkeypatch, blocks):
    """Kernel 6's grid is a parameter of the launch, not of the result: one block for the big tokens and one for
    all the small ones (each warp walking hundreds of tokens) give the same table."""
    import cupy

    from gpt2enc_edu.buckets import gpu as gpu_buckets

    monkeypatch.setattr(gpu_buckets, "scatter_sort_blocks", lambda BT, V: blocks)
    rng = np.random.default_rng(13)
    gpu_buckets.release_workspaces()
    try:
        for kind in ("uniform", "zipf", "real"):
            inp = _ids(kind, 16, 1024, 50257, rng)
            got = gpu_buckets.build_bucket_table_gpu(cupy.asarray(inp), 768, bfloat16, 50257,
                                                     route="scatter").to_host()
            assert buckets.same_table(got, buckets.build_bucket_table(inp, 768, bfloat16)), kind
    finally:
        gpu_buckets.release_workspaces()


@pytest.mark.gpu
def test_gpu_scatter_route_one_graph_per_dtype():
    """bf16 with C=256 and fp32 with C=128 both have one channel group: the same sizes, two workspaces (a graph
    holds one dtype's kernels). Each call's table is right, the fp32 ones after the bf16 graph exists too."""
    import cupy

    from gpt2enc_edu.buckets import gpu as gpu_buckets

    rng = np.random.default_rng(5)
    gpu_buckets.release_workspaces()
    try:
        for dtype, C in ((bfloat16, 256), (bfloat16, 256), (np.float32, 128), (np.float32, 128), (np.float32, 128)):
            inp = _ids("zipf", 2, 500, 700, rng)
            got = gpu_buckets.build_bucket_table_gpu(cupy.asarray(inp), C, dtype, 700, route="scatter").to_host()
            assert buckets.same_table(got, buckets.build_bucket_table(inp, C, dtype))
        assert len(gpu_buckets.workspaces) == 2
    finally:
        gpu_buckets.release_workspaces()
