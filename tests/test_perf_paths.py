"""The fast paths of performance round 2, on a GPU (skipped without one).

Forward versions 1-3 give the mirror's bits; the bucketed wte kernel (idle warps leave, a named barrier counts
the busy ones) gives the mirror's bits for buckets of every size, in both its forms and in any bucket order;
both bucketing kernels (one block for small batches, the cooperative one) give the NumPy table;
``phase_times_us`` accounts for the whole kernel; the chunked method gives the mirror's bits with either form of
its chunk kernel (rows in registers or staged in shared memory), on every channel group of a C whose last group is
partial, and both
deterministic methods with and without programmatic dependent launch (the one-block and scatter routes of the
table); the fp32 atomic backward touches only the batch's rows and stays within the fp32 error bound over
repeated calls.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import buckets, compare, cuda, layout, loader, mirror
from gpt2enc_edu.buckets import gpu as gpu_buckets
from gpt2enc_edu.problems import count_poison, poisoned, random_problem
from gpt2enc_edu.rounding import bfloat16
from gpt2enc_edu.tokens import make_ids

pytestmark = pytest.mark.gpu

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]
#: Terms per element in the atomic test's error bound (a generous count of the rows added per call).
B_T_TERMS = 64


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, T, C", [(1, 1, 8), (3, 37, 776), (9, 64, 768), (17, 5, 64)])
@pytest.mark.parametrize("version", [1, 2, 3])
def test_forward_versions_bitwise(rng, dtype, B, T, C, version):
    import cupy

    p = random_problem(B, T, C, 300, T + 2, dtype=dtype, rng=rng)
    expected = np.empty((B, T, C), dtype=dtype)
    mirror.encoder_forward(expected, p.inp, p.wte, p.wpe, B, T, C)
    g = p.on(cupy)
    out = poisoned((B, T, C), dtype, cupy)
    cuda.encoder_forward_version(version, out, g.inp, g.wte, g.wpe, B, T, C)
    assert count_poison(out) == 0
    assert compare.bitwise_equal(out, expected)


def test_forward_version_refuses_unknown():
    with pytest.raises(ValueError, match="version"):
        cuda.encoder_forward_version(4, None, None, None, None, 1, 1, 8)


def assert_gpu_backward_gives_the_mirrors_bits(p, method: str, rng) -> None:
    """``method`` with the GPU-built table on CuPy copies of ``p``, against the mirror on NumPy copies, same seed."""
    import cupy

    seed = int(rng.integers(2**32))
    cpu, gpu = p.on(np), p.on(cupy)
    enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=seed, method=method)
    enc.encoder_backward(gpu.dwte, gpu.dwpe, gpu.dout, gpu.inp, seed=seed, method=method, bucketing="gpu")
    assert compare.bitwise_equal(gpu.dwte, cpu.dwte)
    assert compare.bitwise_equal(gpu.dwpe, cpu.dwpe)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [1, 3, 9, 300])  # buckets of thousands, of 1..8+ items, of one item
def test_bucketed_method_bitwise(rng, dtype, V):
    p = random_problem(4, 64, 776 if dtype == bfloat16 else 132, V, 64, dtype=dtype, rng=rng)
    assert_gpu_backward_gives_the_mirrors_bits(p, "bucketed", rng)


def assert_wte_kernel_gives_the_mirrors_bits(name: str, p, table, rng, **choice) -> None:
    """``cuda.<name>`` (with ``choice``, e.g. a kernel form) on a CuPy copy of ``p.dwte`` against ``mirror.<name>``
    on a NumPy copy, the same host ``table`` and seed (``compare.wte_launcher_and_mirror``)."""
    got, want = compare.wte_launcher_and_mirror(name, p, table, int(rng.integers(2**32)), **choice)
    assert compare.bitwise_equal(got, want)


def _bucketed_test_ids(kind: str, rng, B: int, T: int) -> np.ndarray:
    """Ids of two kinds. "mixed": a few tokens of many positions (buckets of more than 8 items) among many tokens
    seen once. "nine_each": every token seen 9 times, so every bucket is big and the warps form's blocks hold
    several."""
    if kind == "nine_each":
        return rng.permutation(np.repeat(np.arange(B * T // 9), 9)).astype(np.int32).reshape(B, T)
    ids = rng.permutation(np.arange(1000, 1000 + B * T)).astype(np.int32)
    frequent = rng.random(B * T) < 0.4
    ids[frequent] = rng.integers(0, 6, int(frequent.sum()))
    return ids.reshape(B, T)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", sorted(cuda.BUCKETED_FORMS))
@pytest.mark.parametrize("order", ["built", "shuffled", "reversed"])
@pytest.mark.parametrize("ids", ["mixed", "nine_each"])
def test_bucketed_forms_give_the_mirrors_bits_in_any_bucket_order(rng, dtype, form, order, ids):
    """Both forms of the bucketed wte kernel against the mirror, on the table as built and with its buckets
    shuffled or reversed (the warps form gives each small bucket a warp and each big one to a block wherever it
    sits), and on a table of big buckets only (several per block of the warps form)."""
    C = 776 if dtype == bfloat16 else 132  # a last channel group with lanes past C
    B, T = 3, 99
    p = random_problem(B, T, C, 2000, T, dtype=dtype, rng=rng)
    table = enc.make_buckets(_bucketed_test_ids(ids, rng, B, T), C, dtype)
    table = buckets.reorder_buckets(table, order, rng=rng)
    big = int((table.info[:, 1] > layout.WTE_WARPS).sum())
    assert big > (layout.bucketed_warps_grid(table.num_buckets) if ids == "nine_each" else 0)
    assert_wte_kernel_gives_the_mirrors_bits("encoder_backward_wte_bucketed", p, table, rng, form=form)


def test_bucketed_form_refuses_unknown():
    with pytest.raises(ValueError, match="form"):
        cuda.encoder_backward_wte_bucketed(None, None, None, 8, 1, form="grid")


def test_default_method_is_chunked(rng):
    import cupy

    p = random_problem(2, 32, 64, 50, 32, rng=rng)
    a, b = p.on(cupy), p.on(cupy)
    enc.encoder_backward(a.dwte, a.dwpe, a.dout, a.inp, seed=3)
    enc.encoder_backward(b.dwte, b.dwpe, b.dout, b.inp, seed=3, method="chunked")
    assert compare.bitwise_equal(a.dwte, b.dwte)


@pytest.mark.parametrize("route", [None, *gpu_buckets.ROUTES])
@pytest.mark.parametrize("B, T, V, ids", [(1, 1, 5, "uniform"), (1, 1000, 2, "uniform"), (1, 1024, 50257, "zipf"),
                                          (1, 1025, 50257, "uniform"), (2, 512, 4194304, "uniform"),
                                          (1, 1024, 4194305, "uniform"), (8, 1024, 50257, "real"),
                                          (8, 1024, 65536, "uniform"), (3, 700, 70000, "uniform"),
                                          (64, 1024, 50257, "zipf"), (65, 1024, 50257, "uniform")])
def test_every_bucketing_route_builds_the_numpy_table(rng, route, B, T, V, ids):
    import cupy

    BT = B * T
    if route is not None and route not in gpu_buckets.routes_for(BT, V):
        pytest.skip(f"route {route!r} does not take {BT} ids of {V}")
    inp = make_ids(ids, B, T, V=V, seed=rng) if ids != "real" else make_ids(ids, B, T, seed=rng)
    g_inp = cupy.asarray(inp)
    for dtype, C in ((bfloat16, 776), (np.float32, 768)):
        host = enc.make_buckets(inp, C, dtype)
        device = gpu_buckets.build_bucket_table_gpu(g_inp, C, dtype, V, route=route).to_host()
        assert np.array_equal(device.info, host.info)
        assert np.array_equal(device.bt_list, host.bt_list)
        assert np.array_equal(device.units, host.units)


@pytest.mark.parametrize("route", gpu_buckets.ROUTES)
@pytest.mark.parametrize("B, T, ids", [(1, 1024, "zipf"), (1, 300, "uniform"), (2, 1024, "real")])
def test_table_without_bucket_rows(rng, route, B, T, ids):
    """``bucket_rows=False`` (the chunked method's table): the same units, bt_list and sizes as the whole table; the
    one-block route leaves the bucket rows as they were (poisoned here), the scatter route writes only the big tokens'
    (its kernel 5 reads them), the cooperative route writes them all."""
    import cupy

    if route not in gpu_buckets.routes_for(B * T, 50257):
        pytest.skip(f"route {route!r} does not take {B * T} ids")
    inp = cupy.asarray(make_ids(ids, B, T, seed=rng) if ids == "real" else make_ids(ids, B, T, V=50257, seed=rng))
    whole = gpu_buckets.build_bucket_table_gpu(inp, 776, bfloat16, 50257, route=route)
    want = whole.to_host()
    want_counters = whole.counters.get()
    lean = gpu_buckets.build_bucket_table_gpu(inp, 776, bfloat16, 50257, route=route, bucket_rows=False)
    for buffer in (lean.info, lean.units, lean.bt_list, lean.counters):
        buffer.fill(-7)  # poison: what the second build leaves alone stays so
    lean = gpu_buckets.build_bucket_table_gpu(inp, 776, bfloat16, 50257, route=route, bucket_rows=False)
    num_units = want.units.shape[0]
    assert np.array_equal(lean.units[:num_units].get(), want.units)
    assert np.array_equal(lean.bt_list.get(), want.bt_list)
    read = [layout.COUNTER_NUM_BUCKETS, layout.COUNTER_NUM_UNITS]  # the counters the wte kernels read
    assert np.array_equal(lean.counters.get()[read], want_counters[read])
    if route == "cooperative":
        assert lean.has_bucket_rows and np.array_equal(lean.to_host().info, want.info)
        return
    written = int(want_counters[layout.COUNTER_NUM_BIG]) * want.num_c_groups if route == "scatter" else 0
    info = lean.info[: want.num_buckets].get()
    assert np.array_equal(info[:written], want.info[:written]) and bool((info[written:] == -7).all())
    assert not lean.has_bucket_rows
    with pytest.raises(ValueError, match="bucket_rows"):
        lean.to_host()
    with pytest.raises(ValueError, match="bucketed wte kernel"):
        cuda.encoder_backward_wte_bucketed(cupy.zeros((50257, 776), bfloat16), lean,
                                           cupy.zeros((B, T, 776), bfloat16), 776, 1)


def test_dispatch_and_route_checks():
    import cupy

    assert gpu_buckets.bucketing_route(1024, 50257) == "small"
    assert gpu_buckets.bucketing_route(1024, layout.SMALL_MAX_V + 1) == "scatter"
    assert gpu_buckets.bucketing_route(1025, 50257) == "scatter"
    assert gpu_buckets.bucketing_route(layout.SCATTER_MAX_BT, 50257) == "scatter"
    assert gpu_buckets.bucketing_route(layout.SCATTER_MAX_BT + 1, 50257) == "cooperative"
    inp = cupy.zeros((1, layout.SCATTER_MAX_BT + 1), dtype=np.int32)
    with pytest.raises(ValueError, match="scatter"):
        gpu_buckets.build_bucket_table_gpu(inp, 768, bfloat16, 5, route="scatter")
    with pytest.raises(ValueError, match="small"):
        gpu_buckets.build_bucket_table_gpu(inp, 768, bfloat16, 5, route="small")
    with pytest.raises(ValueError, match="route"):
        gpu_buckets.build_bucket_table_gpu(inp[:, :8], 768, bfloat16, 5, route="fast")


@pytest.mark.parametrize("route", gpu_buckets.ROUTES)
@pytest.mark.parametrize("B", [1, 16])
def test_phase_times_cover_the_route(rng, route, B):
    import cupy

    if route not in gpu_buckets.routes_for(B * 1024, 50257):
        pytest.skip(f"route {route!r} does not take {B * 1024} ids")
    inp = cupy.asarray(make_ids("zipf", B, 1024, seed=rng))
    times = gpu_buckets.phase_times_us(inp, 768, bfloat16, 50257, repeats=3, route=route)
    phases = gpu_buckets.PHASES[route]
    assert times["kernel"] == gpu_buckets.KERNEL_NAMES[route] and times["route"] == route
    assert list(times)[2:-1] == ["launch", *phases]
    assert times["total"] > 0 and (times["launch"] > 0) == (route != "scatter")
    assert times["launch"] + sum(times[p] for p in phases) == pytest.approx(times["total"])
    # the table is still right after the truncated runs
    table = gpu_buckets.build_bucket_table_gpu(inp, 768, bfloat16, 50257, route=route).to_host()
    assert np.array_equal(table.bt_list, enc.make_buckets(inp.get(), 768, bfloat16).bt_list)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("walk", sorted(cuda.CHUNK_WALKS))
@pytest.mark.parametrize("B, T, V, ids", [(1, 1024, 50257, "zipf"), (1, 1000, 3, "uniform"), (4, 512, 4000, "zipf"),
                                          (2, 300, 50257, "uniform")])
def test_both_chunk_walks_give_the_mirrors_bits(rng, dtype, walk, B, T, V, ids):
    """The chunk kernel's two forms (rows in registers, rows staged in shared memory 8 at a time) add the same rows
    in the same order: each gives the mirror's bits whichever the package would choose, on chunks of every length
    (1 to 32 items, V = 3: hundreds of chunks per token), and C with a partial last channel group (776 bf16)."""
    C = 776 if dtype == bfloat16 else 132
    p = random_problem(B, T, C, V, T, dtype=dtype, ids=ids, rng=rng)
    assert_wte_kernel_gives_the_mirrors_bits("encoder_backward_wte_chunked", p, enc.make_buckets(p.inp, C, dtype), rng,
                                             walk=walk)


def test_chunk_walk_stages_rows_only_where_the_grid_fits_in_one_wave():
    """On this GPU: a one-sequence table gets the staged walk (sm_80 and newer), a B=64 table the register walk."""
    facts = loader.device_facts()
    small, large = gpu_buckets.max_units(1024, 50257), gpu_buckets.max_units(64 * 1024, 50257)
    assert cuda.chunk_walk(small, 768, bfloat16) == ("staged" if facts.compute_capability >= 80 else "registers")
    assert cuda.chunk_walk(large, 768, bfloat16) == "registers"
    staged = loader.blocks_per_sm("encoder_backward_wte_chunked.cu", cuda.CHUNK_WALKS["staged"], bfloat16, 256)
    registers = loader.blocks_per_sm("encoder_backward_wte_chunked.cu", cuda.CHUNK_WALKS["registers"], bfloat16, 256)
    assert 1 <= staged <= registers


@pytest.fixture
def programmatic(request, monkeypatch):
    """Set ``loader.PROGRAMMATIC_LAUNCH`` for one test, whose table workspaces start fresh (so that its three calls
    go through all three stages of the scatter route: step by step, capture, replay)."""
    gpu_buckets.release_workspaces()
    monkeypatch.setattr(loader, "PROGRAMMATIC_LAUNCH", request.param)
    yield request.param
    gpu_buckets.release_workspaces()


@pytest.mark.parametrize("programmatic", [True, False], indirect=True, ids=["programmatic", "plain"])
@pytest.mark.parametrize("method", ["chunked", "bucketed"])
@pytest.mark.parametrize("B, T, ids", [(1, 1024, "zipf"), (1, 700, "uniform"), (6, 512, "zipf"), (3, 512, "uniform")])
def test_same_bits_with_and_without_programmatic_launch(rng, programmatic, method, B, T, ids):
    """Three calls per shape: the scatter route (B > 1) launches its steps one by one, then captures them as a graph,
    then replays it. Each call gives the mirror's bits. (V = 4000: Zipf ids give tokens of many chunks.)"""
    V = 4000
    for _ in range(3):
        p = random_problem(B, T, 264, V, T, dtype=bfloat16, ids=ids, rng=rng)
        assert_gpu_backward_gives_the_mirrors_bits(p, method, rng)


def test_launch_method_has_its_own_table_workspace(monkeypatch):
    """The scatter route's graph keeps the launches it was captured with: turning programmatic launches off (or
    on) must give a workspace of its own, whose graph is captured with the new setting, not replay the old one."""
    import cupy

    inp = cupy.asarray(make_ids("uniform", 2, 512, V=3000, seed=5))
    monkeypatch.setattr(loader, "PROGRAMMATIC_LAUNCH", True)
    programmatic_ws = gpu_buckets.build_in_workspace(inp, 264, bfloat16, 3000, route="scatter")
    monkeypatch.setattr(loader, "PROGRAMMATIC_LAUNCH", False)
    plain_ws = gpu_buckets.build_in_workspace(inp, 264, bfloat16, 3000, route="scatter")
    assert plain_ws is not programmatic_ws
    assert gpu_buckets.build_in_workspace(inp, 264, bfloat16, 3000, route="scatter") is plain_ws
    cupy.cuda.get_current_stream().synchronize()


def test_prefetch_rows_up_to_a_quarter_of_l2():
    l2 = 60 * 2**20  # an H200's L2
    gpt2 = lambda B: B * 1024 * 768 * 2  # noqa: E731  (bf16 dout of B GPT-2 sequences)
    assert cuda.prefetch_rows(gpt2(1), l2) and cuda.prefetch_rows(gpt2(8), l2)
    assert not cuda.prefetch_rows(gpt2(64), l2)
    assert cuda.prefetch_rows(l2 // 4, l2) and not cuda.prefetch_rows(l2 // 4 + 1, l2)
    # the bucketed kernel's prefetching form follows the same rule
    assert cuda.bucketed_form(gpt2(8), l2) == "warps_prefetch" and cuda.bucketed_form(gpt2(64), l2) == "warps"


def test_the_bucketed_launcher_takes_the_form_of_dout_size(rng, monkeypatch):
    """``form=None`` launches ``bucketed_form``'s choice (the prefetch form for a small dout on any GPU of >= 4 MB
    of L2), a named form that one."""
    import cupy

    fetched = []
    real_get_kernel = cuda.get_kernel

    def get_kernel(file_name, name, dtype):
        fetched.append(name)
        return real_get_kernel(file_name, name, dtype)

    monkeypatch.setattr(cuda, "get_kernel", get_kernel)
    p = random_problem(2, 64, 256, 50, 64, ids="zipf", rng=rng).on(cupy)
    table = enc.make_buckets(p.inp, 256, bfloat16, V=50)
    for form in (None, "warps", "block"):
        cuda.encoder_backward_wte_bucketed(p.dwte, table, p.dout, 256, 1, form=form)
    assert fetched == [cuda.BUCKETED_FORMS[f] for f in ("warps_prefetch", "warps", "block")]


def test_atomic_fp32_touches_only_the_batch_rows(rng):
    import cupy

    V, C, T = 400, 64, 16
    p = random_problem(3, T, C, V, T + 4, rng=rng)
    g = p.on(cupy)
    dwte_before = g.dwte.copy()
    expected_dwte = p.dwte.astype(np.float64)
    expected_dwpe = p.dwpe.astype(np.float64)
    magnitude_dwte = np.abs(expected_dwte)
    magnitude_dwpe = np.abs(expected_dwpe)
    rows = p.dout.reshape(-1, C).astype(np.float64)
    for _ in range(3):  # repeated calls on the same scratch buffers: a new stamp each time
        enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=0, method="atomic")
        np.add.at(expected_dwte, p.inp.reshape(-1), rows)
        np.add.at(magnitude_dwte, p.inp.reshape(-1), np.abs(rows))
        expected_dwpe[:T] += rows.reshape(3, T, C).sum(0)
        magnitude_dwpe[:T] += np.abs(rows).reshape(3, T, C).sum(0)
        # each call rounds once: allow one bf16 ulp per call plus the fp32 sums
        bound_dwte = 3 * compare.error_bound(bfloat16, magnitude_dwte, terms=B_T_TERMS)
        bound_dwpe = 3 * compare.error_bound(bfloat16, magnitude_dwpe, terms=B_T_TERMS)
        assert compare.within_bound(g.dwte, expected_dwte, bound_dwte)
        assert compare.within_bound(g.dwpe, expected_dwpe, bound_dwpe)
    untouched = np.ones(V, dtype=bool)
    untouched[p.inp.reshape(-1)] = False
    assert untouched.any()
    assert compare.bitwise_equal(g.dwte.get()[untouched], dwte_before.get()[untouched])
    assert compare.bitwise_equal(g.dwpe.get()[T:], p.dwpe[T:])

