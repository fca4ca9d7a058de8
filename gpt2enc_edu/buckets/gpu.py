"""The bucket table built on the GPU, with no host round trip and no sync.

``build_bucket_table_gpu(inp, C, dtype, V)`` writes the same table as ``host.build_bucket_table`` (NumPy)
into device buffers, by one of three routes (``ROUTES``; ``bucketing_route`` says which one it takes):

* ``"small"`` (B*T <= ``SMALL_MAX_BT`` = 1024 ids, V <= ``SMALL_MAX_V``): ``bucketing_small_kernel``
  (``kernels/bucketing_small.cu``), one block, one launch, a bitonic sort of 1024 keys (two per thread), then
  ranks by count class;
* ``"scatter"`` (B*T <= ``SCATTER_MAX_BT`` ids): five short kernels of ``kernels/bucketing_scatter.cu``, no sort
  of the positions and no grid-wide barrier;
* ``"cooperative"`` (larger batches): one cooperative ``bucketing_kernel`` (``kernels/bucketing.cu``), one block
  per SM at most, two radix sorts separated by grid barriers.

``phase_times_us`` measures what each phase of a route costs. The table is a ``device.DeviceBucketTable``;
``build_bucket_table_gpu(..., bucket_rows=False)`` is for a caller that reads only the units and ``bt_list`` (the
chunked wte kernels): the one-block route then skips the bucket rows, the scatter route writes only the big tokens'
(its kernel 5 reads them), and the table says it has none (``has_bucket_rows``).

Buffers come from a per-(device, stream, size) workspace that is reused from call to call, so a table is
valid until the next GPU bucketing of the same size on the same stream; ``copy()`` gives it memory of its own
(``make_buckets`` returns such a copy), ``to_host()`` copies it out.
"""

from __future__ import annotations

import numpy as np

from .. import loader, plans
from ..caches import BoundedCache
from ..checks import check_choice
from ..layout import (
    BUCKETING_THREADS,
    CHUNK_ITEMS,
    NUM_COUNTERS,
    RADIX_DIGITS,
    SCATTER_MAX_BT,
    SCATTER_SMALL_BLOCK,
    SCATTER_THREADS,
    SMALL_MAX_BT,
    SMALL_MAX_V,
    SMALL_THREADS,
    WARP_SIZE,
    ceil_div,
    cooperative_grid_blocks,
    dtype_name,
    num_c_groups,
    scatter_max_big,
)
from ..loader import cupy_module, device_facts, get_kernel, launch
from .device import DeviceBucketTable, max_units, unit_rows

#: The ways to build the table on the GPU (``build_bucket_table_gpu``'s ``route``).
ROUTES = ("scatter", "cooperative", "small")


class _Workspace:
    """Every buffer a bucketing route needs, allocated once per problem size.

    The table's buffers start zeroed: the wte kernels read rows past the table's size (which they then
    skip), and those rows must hold initialised values. The one-block route needs no other buffers.
    """

    def __init__(self, cupy, BT: int, V: int, groups: int, grid: int, route: str, bucket_rows: bool = True):
        i32 = np.int32
        self.route, self.grid = route, grid
        self.bucket_rows = bool(bucket_rows)  # the scatter route: whether kernel 3 writes the small tokens' rows
        self.info = cupy.zeros((min(V, BT) * groups, 4), i32)
        self.units = cupy.zeros((unit_rows(max_units(BT, V)), 4), i32)
        self.bt_list = cupy.zeros(BT, i32)
        self.counters = cupy.zeros(NUM_COUNTERS, i32)
        if route == "small":
            return
        if route == "scatter":  # the buffers of kernels/bucketing_scatter.cu, by their names there
            self.counts = cupy.zeros(V, i32)
            self.tile_totals = cupy.empty(ceil_div(V, SCATTER_THREADS) * CHUNK_ITEMS, i32)
            big = scatter_max_big(BT)
            self.big_list, self.big_sorted, self.big_unit_starts = (cupy.empty(big, i32) for _ in range(3))
            self.class_bases = cupy.empty(3 * CHUNK_ITEMS, i32)
            self.token_starts = cupy.empty(V, i32)
            # counts are zero between tables (kernel 4 counts every token back down); a run stopped before kernel 4
            # leaves them dirty, and the next run clears them first (_launch_scatter).
            self.counts_dirty = False
            self.inp_copy = cupy.empty(BT, i32)  # the ids the copy graph reads (see _launch_scatter_graph)
            self.graph, self.warm = None, False
            self.graphs_in_place: dict = {}  # ids buffer address -> a graph that reads it in place
            self.buffers_seen: set = set()  # addresses of ids buffers met before (bounded)
            return
        n = max(V, BT)
        self.counts = cupy.empty(V, i32)
        self.presence = cupy.empty(BT + 1, i32)
        self.keys0, self.keys1 = cupy.empty(n, np.uint32), cupy.empty(n, np.uint32)
        self.vals0, self.vals1 = cupy.empty(n, i32), cupy.empty(n, i32)
        self.hist = cupy.empty(RADIX_DIGITS * grid, i32)
        self.rank_of_ix = cupy.empty(V, i32)
        self.token_starts = cupy.empty(V, i32)
        self.unit_starts = cupy.empty(V, i32)


#: The workspaces built so far, by (device, stream, BT, V, channel groups, route, dtype, launch kind, bucket rows):
#: each route's buffers, reused by every table of that size on that stream (``build_in_workspace``); bounded
#: (``caches``: the least recently used dropped, those a captured graph uses kept).
workspaces = BoundedCache("bucket table workspaces", 8)


def release_workspaces() -> None:
    """Forget every cached workspace (the next table allocates afresh; e.g. after changing the grid cap)."""
    workspaces.clear()


def _grid_size(BT: int, V: int) -> int:
    """Blocks of the cooperative launch on the current device (``layout.cooperative_grid_blocks``)."""
    return cooperative_grid_blocks(BT, V, device_facts().sm_count)


def small_kernel_fits(BT: int, V: int) -> bool:
    """Whether the one-block kernel takes BT ids of a vocabulary of V (at most 1024 ids, each id and its
    position in one 32-bit key; its 41 KB of static shared memory fit every supported GPU)."""
    return BT <= SMALL_MAX_BT and V <= SMALL_MAX_V


def routes_for(BT: int, V: int) -> tuple[str, ...]:
    """Every route that can build the table of BT ids of a vocabulary of V (``_check_route`` accepts them)."""
    return tuple(route for route, fits in (("small", small_kernel_fits(BT, V)), ("scatter", BT <= SCATTER_MAX_BT),
                                            ("cooperative", True)) if fits)


def bucketing_route(BT: int, V: int) -> str:
    """The route ``build_bucket_table_gpu`` takes by itself for BT ids of a vocabulary of V (see ``ROUTES``):
    the first of ``routes_for``, the fastest where it fits (one launch for one sequence, then the scatter route's
    five short kernels, then the cooperative kernel)."""
    return routes_for(BT, V)[0]


def _check_route(route, BT: int, V: int) -> str:
    if route is None:
        return bucketing_route(BT, V)
    route = check_choice("route", route, ROUTES)
    if route == "small" and not small_kernel_fits(BT, V):
        raise ValueError(f"route='small' takes at most {SMALL_MAX_BT} ids of a vocabulary of at most {SMALL_MAX_V}, "
                         f"not {BT} ids of {V}")
    if route == "scatter" and BT > SCATTER_MAX_BT:
        raise ValueError(f"route='scatter' takes at most {SCATTER_MAX_BT} ids, not {BT}")
    return route


def _launch_scatter(cupy, inp, BT: int, V: int, groups: int, dtype, ws, stop_after: int,
                    clear_counts: bool = False) -> None:
    """The scatter route: kernels 1-5 of bucketing_scatter.cu (``stop_after`` = k > 0: only the first k; < 0: none).

    Kernel 1 adds into ``counts``, which must be zero when it starts. They are, without a memset: a workspace starts
    with zeros and kernel 4 counts every token back down. Only a run stopped before kernel 4 (phase timing) leaves
    them dirty; the next run then clears them first, as does ``clear_counts=True``. (A memset would be one more
    dependent step of every table; docs/experiments.md, bucket table.)
    """
    steps = len(SCATTER_PHASES) if stop_after == 0 else max(stop_after, 0)
    stream = cupy.cuda.get_current_stream()
    if clear_counts or ws.counts_dirty:
        cupy.cuda.runtime.memsetAsync(ws.counts.data.ptr, 0, ws.counts.nbytes, stream.ptr)
        ws.counts_dirty = False
        plans.refuse("the scatter route's counts were cleared first (a memset outside the launches)")
    if steps < 1:
        return
    ws.counts_dirty = True  # until the scatter kernel is queued (a launch that fails on the way leaves it so)
    kernel = lambda name: get_kernel("bucketing_scatter.cu", name, dtype)  # noqa: E731
    num_tiles = ceil_div(V, SCATTER_THREADS)
    position_grid = ceil_div(BT, SCATTER_SMALL_BLOCK)
    big_blocks, small_blocks = scatter_sort_blocks(BT, V)
    launches = (
        ("scatter_count_kernel", position_grid, SCATTER_SMALL_BLOCK, (inp, np.int32(BT), ws.counts, ws.counters)),
        ("scatter_classify_kernel", num_tiles, SCATTER_THREADS,
         (ws.counts, np.int32(V), ws.tile_totals, ws.big_list, ws.counters)),
        ("scatter_rows_kernel", 1 + num_tiles, SCATTER_THREADS,
         (ws.counts, np.int32(V), ws.tile_totals, ws.big_list, np.int32(groups), ws.big_sorted, ws.big_unit_starts,
          ws.class_bases, ws.info, ws.units, ws.token_starts, ws.counters, np.int32(ws.bucket_rows))),
        ("scatter_positions_kernel", position_grid, SCATTER_SMALL_BLOCK,
         (inp, np.int32(BT), ws.counts, ws.token_starts, ws.bt_list)),
        ("scatter_sort_kernel", big_blocks + small_blocks, SCATTER_THREADS,
         (ws.bt_list, ws.info, np.int32(groups), ws.big_unit_starts, ws.class_bases, ws.units, ws.counters,
          np.int32(BT), np.int32(big_blocks))),
    )
    for step, (name, grid, block, args) in enumerate(launches[:steps]):
        launch(kernel(name), grid, block, args, after_kernel=step > 0)  # kernel 1: after whatever came before
    ws.counts_dirty = steps < SCATTER_COUNTS_CLEAN_AFTER
    recorder = plans.active()
    if recorder is not None:  # a replay that stops half-way leaves the counts dirty, as a run stopped here would
        recorder.on_failure(lambda: setattr(ws, "counts_dirty", True))
        if ws.counts_dirty:
            recorder.refuse("the scatter route stopped before its counts were clean")


def scatter_sort_blocks(BT: int, V: int) -> tuple[int, int]:
    """The grid of the scatter route's kernel 5 on the current device: (blocks that sort big tokens, blocks whose
    warps take the small tokens in turn).

    Big tokens: one block each, at most two per SM (a 1024-thread block with an 8 KiB bitmap; two fit an SM). Small
    tokens: a pool of at most one block per SM, whose warps walk the tokens in turn (fewer blocks if there are fewer
    tokens than the pool has warps). A warp per token in a grid sized for every token that may need one (about
    1,600 blocks at B=64, most of whose warps leave at once) holds SMs for warps that have nothing to do
    (docs/experiments.md, bucket table: "kernel 6's small tokens taken by a pool of one block per SM")."""
    facts = device_facts()
    big_blocks = max(1, min(scatter_max_big(BT), 2 * facts.sm_count))
    return big_blocks, min(ceil_div(min(V, BT), SCATTER_THREADS // WARP_SIZE), facts.sm_count)


#: How many ids buffers a scatter workspace keeps a graph for (each graph reads its buffer in place).
SCATTER_GRAPHS = 8


def _launch_scatter_graph(cupy, inp, BT: int, V: int, groups: int, dtype, ws) -> None:
    """The whole scatter route as one CUDA graph: its five kernels replayed with no launch gap between them.

    Launched one by one from the host, the steps leave about a microsecond between each other on the GPU (measured
    on an H200: the table took 34 us launched step by step, 26 us as a graph, at B=64). A graph's kernels keep the
    arguments they were captured with, the address of the ids among them. So there are two kinds of graph:

    * for an ids buffer met in an earlier call (the same array again, or a memory pool handing the same block
      back, as in a training loop), a graph that reads that buffer in place, captured on its second call; up to
      ``SCATTER_GRAPHS`` of them per workspace, kept for its lifetime (a graph reads whatever its buffer holds when it
      is replayed, and every call that replays it passes that very buffer);
    * for any other buffer, the copy graph: the call copies the ids into the workspace's ``inp_copy`` (device to
      device, on the current stream), then replays a graph that reads them there.

    The first call of a workspace launches step by step (which also compiles and loads the kernels outside any
    capture). A stream that is itself being captured (the caller records a graph of its own) gets the steps one by
    one, into the caller's graph, and so does a call recorded into a plan (``plans``: a replay launches the steps).
    """
    stream = cupy.cuda.get_current_stream()
    if stream.is_capturing() or plans.active() is not None:  # a graph or a plan of the caller's takes the steps
        _launch_scatter(cupy, inp, BT, V, groups, dtype, ws, 0)
        return
    if not ws.warm:
        ws.warm = True
        _launch_scatter(cupy, inp, BT, V, groups, dtype, ws, 0)
        ws.buffers_seen.add(inp.data.ptr)
        return
    if ws.counts_dirty:  # the graphs hold no memset: clear before the replay
        _launch_scatter(cupy, inp, BT, V, groups, dtype, ws, -1)
    address = inp.data.ptr
    graph = ws.graphs_in_place.get(address)
    if graph is None and address in ws.buffers_seen and len(ws.graphs_in_place) < SCATTER_GRAPHS:
        graph = ws.graphs_in_place[address] = _capture_scatter(cupy, inp, BT, V, groups, dtype, ws)
    if graph is not None:
        graph.launch(stream)
        return
    if len(ws.buffers_seen) < 4 * SCATTER_GRAPHS:
        ws.buffers_seen.add(address)
    if ws.graph is None:
        ws.graph = _capture_scatter(cupy, ws.inp_copy, BT, V, groups, dtype, ws)
    device_to_device = 3  # cudaMemcpyDeviceToDevice
    cupy.cuda.runtime.memcpyAsync(ws.inp_copy.data.ptr, address, BT * 4, device_to_device, stream.ptr)
    ws.graph.launch(stream)


def _capture_scatter(cupy, inp, BT: int, V: int, groups: int, dtype, ws):
    """A graph of the scatter route's five kernels reading the ids at ``inp`` (counts must be clean: no memset)."""
    capture = cupy.cuda.Stream(non_blocking=True)
    with capture:
        capture.begin_capture()
        try:
            _launch_scatter(cupy, inp, BT, V, groups, dtype, ws, 0)
        finally:
            graph = capture.end_capture()
    return graph


def build_in_workspace(inp, C: int, dtype, V: int, stop_after: int = 0, route: str | None = None,
                       bucket_rows: bool = True, clear_counts: bool = False):
    """Build the table for these ids by ``route`` (``stop_after`` > 0: only its first phases; ``bucket_rows`` as in
    ``build_bucket_table_gpu``; ``clear_counts``: the scatter route clears its counts first, step by step, whether
    they need it or not, as phase timing asks); the workspace."""
    cupy = cupy_module()
    BT = int(inp.size)
    groups = num_c_groups(C, dtype)
    route = _check_route(route, BT, V)
    # One workspace per dtype too: the scatter route's graph holds the kernels compiled for one dtype, and a
    # capture must not be the first call to compile and load another dtype's. And one per launch method: the graph
    # keeps the launches it was captured with, programmatic or plain (``loader.PROGRAMMATIC_LAUNCH``).
    # The scatter route's graphs also hold whether kernel 3 writes the small tokens' bucket rows: one workspace each.
    rows = bool(bucket_rows) or route != "scatter"
    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, BT, V, groups, route, dtype_name(dtype),
           loader.PROGRAMMATIC_LAUNCH, rows)
    ws = workspaces.get(key, lambda: _Workspace(cupy, BT, V, groups, _grid_size(BT, V) if route == "cooperative" else 1,
                                                route, rows), stream=cupy.cuda.get_current_stream())
    if route == "scatter" and stop_after == 0 and not clear_counts:
        _launch_scatter_graph(cupy, inp, BT, V, groups, dtype, ws)
    elif route == "scatter":
        _launch_scatter(cupy, inp, BT, V, groups, dtype, ws, stop_after, clear_counts)
    elif route == "small":
        launch(get_kernel("bucketing_small.cu", "bucketing_small_kernel", dtype), 1, SMALL_THREADS,
               (inp, np.int32(BT), np.int32(groups), ws.info, ws.units, ws.bt_list, ws.counters, np.int32(bucket_rows),
                np.int32(stop_after)))
    else:
        launch(get_kernel("bucketing.cu", "bucketing_kernel", dtype), ws.grid, BUCKETING_THREADS,
               (inp, np.int32(BT), np.int32(V), np.int32(groups), ws.counts, ws.presence, ws.keys0, ws.vals0,
                ws.keys1, ws.vals1, ws.hist, ws.rank_of_ix, ws.token_starts, ws.unit_starts, ws.info, ws.units,
                ws.bt_list, ws.counters, np.int32(stop_after)))
    return ws


def build_bucket_table_gpu(inp, C: int, dtype, V: int, *, route: str | None = None,
                           bucket_rows: bool = True) -> DeviceBucketTable:
    """Build the table on the current stream for validated (B, T) int32 CuPy ids in [0, V).

    ``route`` (one of ``ROUTES``) picks the kernels; ``None`` lets ``bucketing_route`` pick by size. Every
    route gives the same table.

    ``bucket_rows=False``: the caller reads only the units, ``bt_list`` and the counters (the chunked wte kernels
    do). The one-block route then does not write the bucket rows (one SM writing them is a visible share of its time
    at B=1), and the scatter route writes only the big tokens' rows, which its own kernel 5 reads (it finds a small
    token's range from its class); the cooperative route writes them all, since its later steps read them.
    The table's ``has_bucket_rows`` says which, and readers of the rows (``to_host``, the bucketed wte kernel)
    refuse a table without them.
    """
    ws = build_in_workspace(inp, C, dtype, V, route=route, bucket_rows=bucket_rows)
    return DeviceBucketTable(info=ws.info, bt_list=ws.bt_list, units=ws.units, counters=ws.counters, C=C,
                             dtype=np.dtype(dtype), has_bucket_rows=bool(bucket_rows) or ws.route == "cooperative")


#: The phases of each bucketing kernel, in order: ``stop_after = i + 1`` ends the kernel after phase ``i``.
SMALL_PHASES = ("sort positions by id", "distinct tokens", "rank tokens by count class", "starts, buckets, units",
                "bt_list")
COOPERATIVE_PHASES = ("clear", "count tokens", "count values present", "classes (scan)",
                      "sort tokens by class", "ranks and starts (2 scans)", "sort positions by rank",
                      "write the table")
#: The scatter route's steps: one kernel each.
SCATTER_PHASES = ("count tokens", "classify tokens", "rows (big tokens beside the tiles)", "scatter positions",
                  "sort each token's positions")
#: Steps after which the scatter route's counts are zero again: its "scatter positions" kernel counts every token
#: back down.
SCATTER_COUNTS_CLEAN_AFTER = SCATTER_PHASES.index("scatter positions") + 1
PHASES = {"small": SMALL_PHASES, "cooperative": COOPERATIVE_PHASES, "scatter": SCATTER_PHASES}
KERNEL_NAMES = {"small": "bucketing_small_kernel", "cooperative": "bucketing_kernel",
                "scatter": "bucketing_scatter.cu (5 kernels)"}


def phase_times_us(inp, C: int, dtype, V: int, *, repeats: int = 20, route: str | None = None) -> dict:
    """What the GPU bucket table costs, phase by phase, in microseconds (GPU only; ids validated).

    Times the route that ``build_bucket_table_gpu`` takes for these ids (or ``route``), stopped after phase
    1, 2, ... (``stop_after``), and whole; a phase's time is the difference between the runs that end after it
    and before it. ``"launch"`` is a run of the one-kernel routes that returns at once (the scatter route's
    phases are kernels of their own, each launch inside its phase: 0 there). A run of the scatter route stopped
    before kernel 4 leaves its counts dirty, so every timed run of it clears them first (a memset, which the table
    itself needs only after such a run): its baseline is a run of the memset alone, and its total is the five
    kernels. Each run is ``repeats`` launches
    captured in a CUDA graph (so host launch overhead stays out), timed with events; the median of 5 replays
    counts. Returns ``{"kernel": name, "route": route, "launch": us, <phase>: us, ..., "total": us}``.
    """
    cupy = cupy_module()
    route = _check_route(route, int(inp.size), V)
    phases = PHASES[route]
    stream = cupy.cuda.Stream(non_blocking=True)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    clear = route == "scatter"

    def per_launch_us(stop_after: int) -> float:
        with stream:
            build_in_workspace(inp, C, dtype, V, stop_after, route, clear_counts=clear)  # warm-up: compiles, allocates
            try:
                stream.begin_capture()
                for _ in range(repeats):
                    build_in_workspace(inp, C, dtype, V, stop_after, route, clear_counts=clear)
                graph = stream.end_capture()
                run = lambda: graph.launch(stream)  # noqa: E731
            except Exception:  # no graph capture of this launch here: back-to-back launches instead
                if stream.is_capturing():
                    stream.end_capture()
                run = lambda: [build_in_workspace(inp, C, dtype, V, stop_after, route, clear_counts=clear)  # noqa: E731
                               for _ in range(repeats)]
            samples = []
            for _ in range(5):
                start.record(stream)
                run()
                stop.record(stream)
                stop.synchronize()
                samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1000 / repeats)
        return float(np.median(samples))

    ends = [per_launch_us(-1)] + [per_launch_us(k) for k in range(1, len(phases))] + [per_launch_us(0)]
    result = {"kernel": KERNEL_NAMES[route], "route": route, "launch": 0.0 if clear else ends[0]}
    for k, name in enumerate(phases):
        result[name] = ends[k + 1] - ends[k]
    result["total"] = ends[-1] - (ends[0] if clear else 0.0)
    return result
