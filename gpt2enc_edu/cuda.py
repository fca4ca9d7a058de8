"""Launchers: one function per CUDA kernel, taking already-validated CuPy arrays.

The public calls (``gpt2enc_edu.encoder_*``) validate first and then call these, as they call the functions
of the same names in ``mirror.py`` for NumPy arrays. Compiling and launching is ``loader.py``'s job; the bucket
table on the GPU is ``buckets.gpu``'s. Launch shapes come from ``layout.py``.
"""

from __future__ import annotations

import numpy as np

from . import plans
from .buckets import DeviceBucketTable, bucketing_route, build_bucket_table_gpu, max_multi_chunk_units, to_device
from .caches import BoundedCache
from .checks import check_choice
from .layout import (
    ATOMIC_ROWS,
    BLOCK_SIZE,
    CHUNKED_WARPS_PER_BLOCK,
    COMBINE_THREADS,
    FORWARD_ROWS,
    SMALL_BACKWARD_THREADS,
    WARP_SIZE,
    WPE_BLOCK_SIZE,
    WPE_PIPELINE_STAGES,
    WPE_PIPELINED_MAX_B,
    WTE_BLOCK_SIZE,
    bucketed_warps_grid,
    c_per_group,
    ceil_div,
    num_c_groups,
    pack_size,
    wpe_blocks_beside_table,
)
from .loader import blocks_per_sm, cupy_module, device_facts, get_kernel, launch, record_event, wait_event
from .methods import check_small_backward_batch, one_launch_backward

#: The forward's versions (kernels/encoder_forward.cu): kernel name, and threads for (B, T, C, pack size).
FORWARD_VERSIONS = {
    1: ("encoder_forward_v1_kernel", lambda B, T, C, pack: B * T * C),
    2: ("encoder_forward_v2_kernel", lambda B, T, C, pack: B * T * C // pack),
    3: ("encoder_forward_kernel", lambda B, T, C, pack: ceil_div(B, FORWARD_ROWS) * T * C // pack),
}


def encoder_forward_version(version: int, out, inp, wte, wpe, B: int, T: int, C: int) -> None:
    """Launch version 1 (one element per thread), 2 (one pack per thread) or 3 (the fastest: a pack column
    of one t for FORWARD_ROWS batch rows per thread) of the forward; all three write the same bits."""
    if version not in FORWARD_VERSIONS:
        raise ValueError(f"forward version must be one of {sorted(FORWARD_VERSIONS)}, not {version!r}")
    name, threads = FORWARD_VERSIONS[version]
    kernel = get_kernel("encoder_forward.cu", name, wte.dtype)
    launch(kernel, ceil_div(threads(B, T, C, pack_size(wte.dtype)), BLOCK_SIZE), BLOCK_SIZE,
           (out, inp, wte, wpe, np.int32(B), np.int32(T), np.int32(C)))


def encoder_forward(out, inp, wte, wpe, B: int, T: int, C: int) -> None:
    encoder_forward_version(3, out, inp, wte, wpe, B, T, C)


#: The wpe kernel's forms (kernels/encoder_backward_wpe.cu): the same arguments, owners and sums, so the same bits on
#: any grid. "loads" holds a thread's rows in registers, a pack at a time; "pipelined" streams them through the
#: thread's shared-memory slots with cp.async, ``WPE_PIPELINE_STAGES`` in flight from one pack into the next.
WPE_FORMS = {"loads": "encoder_backward_wpe_kernel", "pipelined": "encoder_backward_wpe_pipelined_kernel"}
#: The pipelined form's dynamic shared memory: a 16-byte slot per stage and thread.
WPE_PIPELINED_SHARED = WPE_PIPELINE_STAGES * WPE_BLOCK_SIZE * 16


def wpe_form(B: int, beside_table: bool, facts) -> str:
    """Which form of the wpe kernel the package launches: ``"pipelined"`` beside the scatter route's table built in
    the call (the narrow grid, ``blocks`` given) for at most ``layout.WPE_PIPELINED_MAX_B`` sequences, on a GPU with
    cp.async (sm_80 and newer) and room for its shared memory; else ``"loads"``."""
    pipelined = (beside_table and B <= WPE_PIPELINED_MAX_B and facts.compute_capability >= 80
                 and facts.shared_per_block_optin >= WPE_PIPELINED_SHARED)
    return "pipelined" if pipelined else "loads"


def encoder_backward_wpe(dwpe, dout, B: int, T: int, C: int, seed: int, *, blocks: int | None = None,
                         form: str | None = None) -> None:
    """The wpe kernel: a thread per pack of dwpe's first T rows, or ``blocks`` blocks (at most that many) whose
    threads walk the packs in turn. Any grid and either form give the same bits (each element has one owner, which
    adds in b order). ``form``: a key of ``WPE_FORMS``, or None for ``wpe_form``'s choice (with ``blocks`` given
    meaning beside the table)."""
    if form is not None:
        form = check_choice("form", form, tuple(WPE_FORMS))
    form = wpe_form(B, blocks is not None, device_facts()) if form is None else form
    kernel = get_kernel("encoder_backward_wpe.cu", WPE_FORMS[form], dout.dtype)
    grid = ceil_div(T * C // pack_size(dout.dtype), WPE_BLOCK_SIZE)
    if blocks is not None:
        grid = min(grid, blocks)
    shared = WPE_PIPELINED_SHARED if form == "pipelined" else 0
    launch(kernel, grid, WPE_BLOCK_SIZE, (dwpe, dout, np.int32(B), np.int32(T), np.int32(C), np.uint32(seed)),
           shared_mem=shared)


#: The bucketed kernel's "warps_prefetch" form asks L2 for the dout rows of a big bucket before summing them; the
#: package takes it when dout takes at most this share of the L2 cache: where dout fits easily the prefetch saves
#: round trips, where it does not the prefetched lines push each other out (docs/experiments.md, wte kernels:
#: "a big bucket's rows asked of L2 first"). The chunk kernel does not prefetch: on its current form it only cost.
PREFETCH_MAX_L2_SHARE = 0.25


def prefetch_rows(dout_nbytes: int, l2_bytes: int) -> bool:
    """Whether the bucketed wte kernel takes its prefetching form: dout is at most ``PREFETCH_MAX_L2_SHARE`` of the
    L2 cache."""
    return dout_nbytes <= PREFETCH_MAX_L2_SHARE * l2_bytes


#: The bucketed wte kernel's forms (kernels/encoder_backward_wte_bucketed.cu): the same arguments and bits. "block"
#: is llm.c's form, one block per bucket (the course builds it); "warps" gives a block to each bucket of more than 8
#: items and a warp to every other one, in a grid of about an eighth of the blocks; "warps_prefetch" is "warps" whose
#: blocks first ask L2 for all the rows of their big bucket.
BUCKETED_FORMS = {"warps": "encoder_backward_wte_bucketed_warps_kernel",
                  "warps_prefetch": "encoder_backward_wte_bucketed_warps_prefetch_kernel",
                  "block": "encoder_backward_wte_bucketed_kernel"}


def bucketed_form(dout_nbytes: int, l2_bytes: int) -> str:
    """The form of the bucketed wte kernel the package launches: ``"warps_prefetch"`` where dout fits easily in L2
    (``prefetch_rows``: B <= 8 at GPT-2 shapes on an H200), else ``"warps"``. The prefetch helps skewed ids, whose
    big buckets wait on chains of row reads, and nothing on uniform ids, whose buckets are small
    (docs/experiments.md, wte kernels: "a big bucket's rows asked of L2 first")."""
    return "warps_prefetch" if prefetch_rows(dout_nbytes, l2_bytes) else "warps"


def encoder_backward_wte_bucketed(dwte, table, dout, C: int, seed: int, *, form: str | None = None) -> None:
    """llm.c's bucketed wte scheme; ``table`` is a ``BucketTable`` (copied over, llm.c's route) or a device one.

    ``form`` picks the kernel (``BUCKETED_FORMS``; None: ``bucketed_form``'s choice, the package's): "block" is
    llm.c's one block per bucket. Every form gives the same bits for any table, in any bucket order; the warps
    form does not hold a block of 8 warps for a bucket of one or two items (docs/performance.md, wte kernels)."""
    if form is not None:
        check_choice("form", form, tuple(BUCKETED_FORMS))
    table = to_device(table)
    table.require_bucket_rows("the bucketed wte kernel")
    if form is None:
        form = bucketed_form(dout.nbytes, device_facts().l2_cache_bytes)
    kernel = get_kernel("encoder_backward_wte_bucketed.cu", BUCKETED_FORMS[form], dout.dtype)
    grid = table.max_buckets if form == "block" else bucketed_warps_grid(table.max_buckets)
    launch(kernel, grid, WTE_BLOCK_SIZE,
           (dwte, table.info, table.bt_list, dout, table.num_buckets_device, np.int32(C), np.uint32(seed)),
           after_kernel=True)


#: Per-stream scratch of the CUDA calls, each cache bounded (``caches``: least recently used dropped, entries a
#: captured graph uses kept).
_partials_cache = BoundedCache("chunk partials", 8)
_side_streams = BoundedCache("side streams", 16)
_fp32_scratch = BoundedCache("atomic fp32 rows", 4)  # dwte-sized: the largest scratch, so the fewest kept


def _chunk_partials(BT: int, C_padded: int):
    """Room for the partial sums of multi-chunk tokens, reused across calls on one stream."""
    cupy = cupy_module()
    stream = cupy.cuda.get_current_stream()
    return _partials_cache.get((cupy.cuda.Device().id, stream.ptr, BT, C_padded),
                               lambda: cupy.empty(max_multi_chunk_units(BT) * C_padded, dtype=np.float32),
                               stream=stream)


#: The chunk kernel's two forms (kernels/encoder_backward_wte_chunked.cu): the same grid, arguments and bits. The
#: staged one has a chunk's rows in flight 8 at a time (cp.async into shared memory), and fewer blocks per SM.
CHUNK_WALKS = {"registers": "encoder_backward_wte_chunked_kernel",
               "staged": "encoder_backward_wte_chunked_staged_kernel"}


def _chunk_grid(max_units: int, C: int, dtype) -> tuple[int, int]:
    """(units, channel groups): the kernel takes its channel group from its grid row, so it needs all of them."""
    return ceil_div(max_units, CHUNKED_WARPS_PER_BLOCK), num_c_groups(C, dtype)


def chunk_walk(max_units: int, C: int, dtype) -> str:
    """Which form of the chunk kernel the package launches for a table of ``max_units`` unit rows (a device
    table's bound, ``DeviceBucketTable.max_units``): ``"staged"`` where its grid fits on the
    GPU in one wave of the staged form (so that its fewer blocks per SM cost nothing) and the GPU has cp.async
    (sm_80 and newer), else ``"registers"``.

    On an H200 at GPT-2 shapes with the GPU-built table that is B <= 2. Staging saves the latency of a frequent
    token's row walk, but where the grid takes several waves the blocks an SM loses cost more than that
    (docs/experiments.md, wte kernels: "a chunk's rows staged in shared memory")."""
    return _walk_for_grid(_chunk_grid(max_units, C, dtype), dtype, device_facts())


def _walk_for_grid(grid: tuple[int, int], dtype, facts) -> str:
    """``chunk_walk``'s choice for a chunk grid already computed (the launcher needs the grid too)."""
    if facts.compute_capability < 80:
        return "registers"
    per_sm = blocks_per_sm("encoder_backward_wte_chunked.cu", CHUNK_WALKS["staged"], dtype,
                           WARP_SIZE * CHUNKED_WARPS_PER_BLOCK)
    return "staged" if grid[0] * grid[1] <= per_sm * facts.sm_count else "registers"


def _launch_chunk_kernel(dwte, table, dout, C: int, seed: int, walk: str | None = None):
    """The first of the chunked method's two kernels (it finishes single-chunk tokens); returns the partials.
    ``walk``: a key of ``CHUNK_WALKS`` (checked by the caller), or None for ``chunk_walk``'s choice."""
    grid = _chunk_grid(table.max_units, C, dout.dtype)
    facts = device_facts()
    walk = _walk_for_grid(grid, dout.dtype, facts) if walk is None else walk
    kernel = get_kernel("encoder_backward_wte_chunked.cu", CHUNK_WALKS[walk], dout.dtype)
    partials = _chunk_partials(table.num_positions, grid[1] * c_per_group(dout.dtype))
    launch(kernel, grid, WARP_SIZE * CHUNKED_WARPS_PER_BLOCK,
           (dwte, table.units, table.bt_list, dout, partials, table.num_units_device, np.int32(C), np.uint32(seed)),
           after_kernel=True)
    return partials


def encoder_backward_wte_chunked(dwte, table, dout, C: int, seed: int, *, walk: str | None = None) -> None:
    """The chunk kernel (finishes single-chunk tokens), then the combine kernel (multi-chunk tokens).

    ``walk`` picks the chunk kernel's form (``CHUNK_WALKS``; None: ``chunk_walk``'s choice). Both give the same
    bits; the choice is for speed only, and tests and the probe use it to run both on the same input."""
    if walk is not None:
        check_choice("walk", walk, tuple(CHUNK_WALKS))
    table = to_device(table)
    partials = _launch_chunk_kernel(dwte, table, dout, C, seed, walk)
    combine_kernel = get_kernel("encoder_backward_wte_chunked.cu", "encoder_backward_wte_chunk_combine_kernel",
                                dout.dtype)
    launch(combine_kernel, min(table.max_units, max_multi_chunk_units(table.num_positions)), COMBINE_THREADS,
           (dwte, table.units, partials, table.num_units_device, np.int32(C), np.uint32(seed)), after_kernel=True)


def encoder_backward_small(dwte, dwpe, dout, inp, B: int, T: int, C: int, seed: int) -> None:
    """The chunked method's whole backward (dwte and dwpe) for at most 1024 ids, in one launch: every block sorts
    the ids itself, so no bucket table is built and no other kernel runs (``kernels/encoder_backward_small.cu``).
    Same bits as the wpe kernel and the chunked wte kernels on the GPU-built table.

    The grid is as many blocks as the GPU holds at once (any grid gives the same bits). One launch instead of four
    removes the launch gaps and the one-block table's sort on one SM while the others idle (docs/performance.md,
    "one launch for one sequence")."""
    check_small_backward_batch(B, T)
    file_name, kernel_name = "encoder_backward_small.cu", "encoder_backward_small_kernel"
    grid = blocks_per_sm(file_name, kernel_name, dout.dtype, SMALL_BACKWARD_THREADS) * device_facts().sm_count
    launch(get_kernel(file_name, kernel_name, dout.dtype), grid, SMALL_BACKWARD_THREADS,
           (dwte, dwpe, inp, dout, np.int32(B), np.int32(T), np.int32(C), np.uint32(seed)))


def _launcher(name: str):
    """The launcher of this module that a method's row names (``methods.Method.launcher`` / ``one_launch``)."""
    return globals()[name]


def _side_stream(main):
    """A second stream (and two events) paired with ``main``, for the wpe kernel to run beside the table and the
    wte kernels. Its priority is the default one, as the caller's stream's usually is: the wpe kernel is not on
    the critical path, and a higher priority would let its blocks go before the wte kernel's."""
    cupy = cupy_module()
    return _side_streams.get((cupy.cuda.Device().id, main.ptr),
                             lambda: (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Event(disable_timing=True),
                                      cupy.cuda.Event(disable_timing=True)))


def encoder_backward_deterministic_gpu_bucketing(dwte, dwpe, dout, inp, B: int, T: int, C: int, V: int,
                                                 seed: int, method, *, table=None) -> None:
    """A deterministic ``method`` (a row of ``methods.METHODS``): the GPU bucketing and then the method's wte
    launcher on the caller's stream, the wpe kernel beside them on a side stream: no host round trip, no host sync.
    ``table``: a table of these ids built ahead (``make_buckets``; a host table is copied over), which the wte kernel
    reads instead of building one. Where ``methods.one_launch_backward`` says so (the chunked method, at most 1024 ids
    and no table), the method's ``one_launch`` kernel does it all instead.

    The wte kernel needs the table, the wpe kernel needs neither: the chain table -> wte is the critical path,
    and it runs on the caller's stream with no event between its kernels (on sm_90 and newer each wte kernel is
    launched as a programmatic dependent of the kernel before it, ``loader.launch(..., after_kernel=True)``).
    Events order the rest without the host: the side stream starts after all work already queued on the caller's
    stream (dout is ready, and an earlier call's wpe kernel is done), and the caller's stream waits for the wpe
    kernel at the end, so that whatever it runs next sees dwpe. The wpe kernel's blocks are 1024 threads wide
    (``WPE_BLOCK_SIZE``), so that it leaves SMs free for the table's one-block kernels; beside the scatter route's
    table built in this call it takes only ``layout.WPE_SM_SHARE_BESIDE_TABLE`` of the SMs, whose threads walk
    dwpe's packs in turn, so that the table's kernels are not kept waiting for SMs (docs/experiments.md, schedule,
    streams and launches).
    """
    if one_launch_backward(method, "gpu", B * T, V, buckets_given=table is not None):
        _launcher(method.one_launch)(dwte, dwpe, dout, inp, B, T, C, seed)  # one launch, its own sort: no table
        return
    cupy = cupy_module()
    main = cupy.cuda.get_current_stream()
    side, inputs_ready, wpe_done = _side_stream(main)
    record_event(inputs_ready, main)
    wait_event(side, inputs_ready)
    with side:
        # Beside the scatter route's kernels (a table built here for more than one sequence), the wpe kernel takes
        # a share of the SMs only, so that they find room (layout.WPE_SM_SHARE_BESIDE_TABLE); beside the one-block
        # table, or a table built ahead, the whole grid.
        narrow = table is None and bucketing_route(B * T, V) == "scatter"
        blocks = wpe_blocks_beside_table(device_facts().sm_count) if narrow else None
        encoder_backward_wpe(dwpe, dout, B, T, C, seed, blocks=blocks)
        record_event(wpe_done, side)
    if table is None:
        table = build_bucket_table_gpu(inp, C, dout.dtype, V, bucket_rows=method.bucket_rows)
    _launcher(method.launcher)(dwte, table, dout, C, seed)
    wait_event(main, wpe_done)


def _fp32_scratch_for(dwte, dwpe, T: int):
    """fp32 buffers shaped like dwte and dwpe's first T rows, the per-token stamps and a call counter, reused
    across calls on one stream. Only the rows a batch touches are written (then read): no initialisation."""
    cupy = cupy_module()
    stream = cupy.cuda.get_current_stream()
    scratch = _fp32_scratch.get((cupy.cuda.Device().id, stream.ptr, dwte.shape, T, dwpe.shape[1]),
                                lambda: [cupy.empty(dwte.shape, np.float32), cupy.empty((T, dwpe.shape[1]), np.float32),
                                         cupy.zeros(dwte.shape[0], np.int32), 0], stream=stream)
    scratch[3] = scratch[3] % (2**31 - 1) + 1  # a stamp no earlier call on these buffers used (1, 2, ...)
    plans.refuse("the atomic method's fp32 rows take a new stamp every call")
    return scratch


def encoder_backward_atomic_bf16(dwte, dwpe, dout, inp, B: int, T: int, C: int) -> None:
    """The atomic backward with bf16 atomics on the gradients themselves (``encoder_backward_atomic_bf16_kernel``)."""
    kernel = get_kernel("encoder_backward_atomic.cu", "encoder_backward_atomic_bf16_kernel", dout.dtype)
    launch(kernel, ceil_div(B * T * C // pack_size(dout.dtype), BLOCK_SIZE), BLOCK_SIZE,
           (dwte, dwpe, dout, inp, np.int32(B), np.int32(T), np.int32(C)))


def encoder_backward_atomic(dwte, dwpe, dout, inp, B: int, T: int, C: int) -> None:
    """The atomic backward accumulating in fp32 (``encoder_backward_atomic_fp32_rows_kernel``): into the gradients
    themselves in fp32, or for bf16 into fp32 copies of the rows the batch touches, rounded back to nearest once."""
    file_name = "encoder_backward_atomic.cu"
    sizes = (np.int32(B), np.int32(T), np.int32(C))
    kernel = get_kernel(file_name, "encoder_backward_atomic_fp32_rows_kernel", dout.dtype)
    grid = ceil_div(ceil_div(B, ATOMIC_ROWS) * T * C // pack_size(dout.dtype), BLOCK_SIZE)
    if dwte.dtype == np.float32:
        launch(kernel, grid, BLOCK_SIZE, (dwte, dwpe, dout, inp, *sizes))
        return
    # bf16 storage: widen the rows the batch touches to fp32, add there, round them back to nearest once.
    dwte32, dwpe32, stamps, call = _fp32_scratch_for(dwte, dwpe, T)
    row_grid = ceil_div(B * T, BLOCK_SIZE // WARP_SIZE)
    launch(get_kernel(file_name, "encoder_backward_atomic_widen_kernel", dout.dtype), row_grid, BLOCK_SIZE,
           (dwte32, dwpe32, dwte, dwpe, inp, stamps, np.uint32(call), *sizes))
    launch(kernel, grid, BLOCK_SIZE, (dwte32, dwpe32, dout, inp, *sizes))
    launch(get_kernel(file_name, "encoder_backward_atomic_narrow_kernel", dout.dtype), row_grid, BLOCK_SIZE,
           (dwte, dwpe, dwte32, dwpe32, inp, stamps, np.uint32(call), *sizes))


__all__ = [
    "DeviceBucketTable",
    "encoder_backward_atomic",
    "encoder_backward_atomic_bf16",
    "encoder_backward_deterministic_gpu_bucketing",
    "encoder_backward_small",
    "encoder_backward_wpe",
    "encoder_backward_wte_bucketed",
    "encoder_backward_wte_chunked",
    "encoder_forward",
    "encoder_forward_version",
]
