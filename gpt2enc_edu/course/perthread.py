"""The package's kernels in per-thread Python form (tier 2): the CUDA body as a function of one thread.

Each ``encoder_*`` function here reads line by line like its kernel in ``kernels/``: the same index math,
the same fp32 adds in the same order (``fadd`` flushes subnormals to zero as the GPU does), the same
barriers and shuffles. ``grid.launch`` runs it over the grid, and the ``launch_*`` functions (from
``launchers``, reachable here too) do that with the real kernel's launch shape (the grid and block math of
``gpt2enc_edu/cuda.py``) on NumPy arrays, so the result can be compared bit for bit with the mirror
(``tests/test_course_perthread.py`` does). The launchers live apart because the graded build-it checks run
a learner's kernel through them in a process that cannot import this module.

A pack of 128 bits (8 bf16 or 4 fp32 elements) is a small NumPy array here; adding two packs adds element
by element, as the kernels' ``for k`` loops do.
"""

from __future__ import annotations

import numpy as np

from ..layout import (
    CHUNK_ITEMS,
    CHUNKED_WARPS_PER_BLOCK,
    COMBINE_STAGE_PACKS,
    COMBINE_THREADS,
    WARP_SIZE,
    WTE_BLOCK_SIZE,
    WTE_WARPS,
    ceil_div,
    combine_slices,
    pack_size,
)
from ..rounding import NOISE_STREAM_DWPE, NOISE_STREAM_DWTE
from .grid import fadd, load128, round_to_storage, store128, to_float, to_storage_nearest
from .launchers import (  # noqa: F401 (the launchers are used through this module too)
    launch_backward_atomic,
    launch_backward_wpe,
    launch_backward_wte_bucketed,
    launch_backward_wte_bucketed_warps,
    launch_backward_wte_chunked,
    launch_forward,
)


# ------------------------------------------------------------------------------------------------------
# The kernels, one thread each.
def encoder_forward(cuda, out, inp, wte, wpe, B, T, C):
    """``encoder_forward_v2_kernel``: one thread per 128-bit pack of ``out``."""
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return

    bt = idx // C
    b = bt // T
    t = bt % T
    c = idx % C

    ix = int(inp[b * T + t])

    wte128 = load128(wte, ix * C + c, cuda)
    wpe128 = load128(wpe, t * C + c, cuda)
    packed_out = to_storage_nearest(fadd(to_float(wte128), to_float(wpe128)), out.dtype)
    store128(out, b * T * C + t * C + c, packed_out, cuda)


def encoder_backward_atomic_fp32(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    """``encoder_backward_atomic_fp32_kernel``: every thread adds its pack into dwte and dwpe with atomics."""
    size = pack_size(dout.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return

    bt = idx // C
    b = bt // T
    t = bt % T
    c = idx % C

    ix = int(inp[b * T + t])

    packed_dout = to_float(load128(dout, b * T * C + t * C + c, cuda))
    for k in range(size):
        cuda.atomic_add(dwte32, ix * C + c + k, packed_dout[k])
        cuda.atomic_add(dwpe32, t * C + c + k, packed_dout[k])


def encoder_backward_wpe(cuda, dwpe, dout, B, T, C, seed):
    """``encoder_backward_wpe_kernel``: each thread owns packs of dwpe (pack i, i + the grid's threads, ...) and
    sums each over b in order."""
    size = pack_size(dout.dtype)
    packs = T * C // size
    pack = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while pack < packs:  # a grid with fewer threads than packs walks the rest in turn
        idx = pack * size
        t = idx // C
        c = idx % C

        accum = np.zeros(size, dtype=np.float32)
        for b in range(B):  # b = 0, 1, ..., B-1 (the kernel's unrolled loop adds in this order too)
            accum = fadd(accum, to_float(load128(dout, b * T * C + t * C + c, cuda)))

        packed_dwpe = load128(dwpe, t * C + c, cuda)
        element = idx + np.arange(size)  # the noise position: each element's flat index in dwpe
        packed_dwpe = round_to_storage(fadd(accum, to_float(packed_dwpe)), dwpe.dtype, element, NOISE_STREAM_DWPE,
                                       seed)
        store128(dwpe, t * C + c, packed_dwpe, cuda)
        pack += cuda.gridDim.x * cuda.blockDim.x


def encoder_backward_wte_bucketed(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    """``encoder_backward_wte_bucketed_kernel``: one block of 8 warps per bucket, warp 0 combines.

    ``bucket_info`` is the table's ``info`` flattened (4 ints per bucket); ``num_buckets`` a 1-element array.
    """
    size = pack_size(dout.dtype)
    accum_shared = cuda.shared_array("accum_shared", size * WTE_BLOCK_SIZE, np.float32)

    bucket = cuda.blockIdx.x
    if bucket >= num_buckets[0]:
        return  # uniform across the block: no thread reaches the barrier
    warp_id = cuda.threadIdx.x // WARP_SIZE
    lane_id = cuda.threadIdx.x % WARP_SIZE
    c_per_warp = WARP_SIZE * size

    bucket_start, bucket_size, bucket_ix, c_group = (int(v) for v in bucket_info[4 * bucket : 4 * bucket + 4])
    c = c_group * c_per_warp + lane_id * size
    has_channels = c < C  # lanes past C do no work but still reach the barrier

    accum = np.zeros(size, dtype=np.float32)
    if has_channels:
        for item in range(warp_id, bucket_size, WTE_WARPS):
            bt = int(bt_list[bucket_start + item])
            accum = fadd(accum, to_float(load128(dout, bt * C + c, cuda)))

    # Warps 1..7 hand their partial sums to warp 0 through shared memory, layout [k][thread].
    k_stride = np.arange(size) * WTE_BLOCK_SIZE
    if warp_id != 0:
        accum_shared[cuda.threadIdx.x + k_stride] = accum
    yield cuda.syncthreads()
    if warp_id != 0 or not has_channels:
        return

    packed_dwte = load128(dwte, bucket_ix * C + c, cuda)
    busy_warps = min(WTE_WARPS, bucket_size)
    for w in range(1, busy_warps):
        accum = fadd(accum, accum_shared[w * WARP_SIZE + lane_id + k_stride])

    element = bucket_ix * C + c + np.arange(size)
    packed_dwte = round_to_storage(fadd(accum, to_float(packed_dwte)), dwte.dtype, element, NOISE_STREAM_DWTE, seed)
    store128(dwte, bucket_ix * C + c, packed_dwte, cuda)


def encoder_backward_wte_bucketed_warps(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    """``encoder_backward_wte_bucketed_warps_kernel``: warp w of block b sums bucket 8b + w alone when it has at
    most 8 items; block b sums the bigger ones among b, b + G, ..., b + 7G (G = the grid) as llm.c's form does.

    The kernel has four of a big bucket's items in flight per warp; here they are loaded one by one, which adds them
    in the same order.
    """
    size = pack_size(dout.dtype)
    accum_shared = cuda.shared_array("accum_shared", size * WTE_BLOCK_SIZE, np.float32)
    table_size = int(num_buckets[0])
    warp_id = cuda.threadIdx.x // WARP_SIZE
    lane_id = cuda.threadIdx.x % WARP_SIZE
    c_per_warp = WARP_SIZE * size

    # The block's candidates b + k*G, k = 0..7: lane k reads one size; the ballot gives every warp the same mask.
    big = False
    if lane_id < WTE_WARPS:
        candidate = cuda.blockIdx.x + lane_id * cuda.gridDim.x
        big = candidate < table_size and int(bucket_info[4 * candidate + 1]) > WTE_WARPS
    big_mask = yield cuda.ballot_sync(big)

    # First the warp's own bucket, unless it is past the table or big (then a block sums it).
    own_bucket = cuda.blockIdx.x * WTE_WARPS + warp_id
    info = bucket_info[4 * own_bucket : 4 * own_bucket + 4] if own_bucket < table_size else (0, 0, 0, 0)
    start, count, ix, c_group = (int(v) for v in info)
    c = c_group * c_per_warp + lane_id * size
    if own_bucket < table_size and count <= WTE_WARPS and c < C:
        packed_dwte = load128(dwte, ix * C + c, cuda)
        accum = np.zeros(size, dtype=np.float32)
        for item in range(count):
            accum = fadd(accum, to_float(load128(dout, int(bt_list[start + item]) * C + c, cuda)))
        element = ix * C + c + np.arange(size)
        packed_dwte = round_to_storage(fadd(accum, to_float(packed_dwte)), dwte.dtype, element, NOISE_STREAM_DWTE,
                                       seed)
        store128(dwte, ix * C + c, packed_dwte, cuda)

    # Then the block's big buckets, each as llm.c's form sums it (every warp has items).
    k_stride = np.arange(size) * WTE_BLOCK_SIZE
    while big_mask:
        k = (big_mask & -big_mask).bit_length() - 1  # the lowest set bit, as __ffs(mask) - 1
        big_mask &= big_mask - 1
        big_bucket = cuda.blockIdx.x + k * cuda.gridDim.x
        start, count, ix, c_group = (int(v) for v in bucket_info[4 * big_bucket : 4 * big_bucket + 4])
        c = c_group * c_per_warp + lane_id * size
        has_channels = c < C
        if warp_id == 0 and has_channels:
            packed_dwte = load128(dwte, ix * C + c, cuda)
        accum = np.zeros(size, dtype=np.float32)
        if has_channels:
            for item in range(warp_id, count, WTE_WARPS):
                accum = fadd(accum, to_float(load128(dout, int(bt_list[start + item]) * C + c, cuda)))
            if warp_id != 0:
                accum_shared[cuda.threadIdx.x + k_stride] = accum
        yield cuda.syncthreads()  # the warps' sums are in shared memory
        if warp_id == 0 and has_channels:
            for w in range(1, WTE_WARPS):
                accum = fadd(accum, accum_shared[w * WARP_SIZE + lane_id + k_stride])
            element = ix * C + c + np.arange(size)
            packed_dwte = round_to_storage(fadd(accum, to_float(packed_dwte)), dwte.dtype, element,
                                           NOISE_STREAM_DWTE, seed)
            store128(dwte, ix * C + c, packed_dwte, cuda)
        yield cuda.syncthreads()  # warp 0 has read them: shared memory is free for the next big bucket


def encoder_backward_wte_chunked(cuda, dwte, units, bt_list, dout, partials, num_units, C, seed):
    """``encoder_backward_wte_chunked_kernel``: one warp per unit (token, chunk of 32 items) and channel group
    (``blockIdx.y``: the grid has a row per group).

    A single-chunk token is finished here; a multi-chunk token's warps leave their partial sums in
    ``partials`` for the combine kernel. ``units`` is flattened (4 ints per unit).
    """
    size = pack_size(dout.dtype)
    warp_id = cuda.threadIdx.x // WARP_SIZE
    lane_id = cuda.threadIdx.x % WARP_SIZE
    unit = cuda.blockIdx.x * CHUNKED_WARPS_PER_BLOCK + warp_id
    if unit >= num_units[0]:
        return  # the whole warp leaves together
    c_per_warp = WARP_SIZE * size
    num_groups = ceil_div(C, c_per_warp)

    ix, chunk, token_start, token_size = (int(v) for v in units[4 * unit : 4 * unit + 4])
    num_chunks = ceil_div(token_size, CHUNK_ITEMS)
    chunk_first = chunk * CHUNK_ITEMS
    chunk_size = min(CHUNK_ITEMS, token_size - chunk_first)
    single_chunk = num_chunks == 1
    # Lane i loads item i's position; shuffles hand each position to every lane.
    my_bt = int(bt_list[token_start + chunk_first + lane_id]) if lane_id < chunk_size else 0

    g = cuda.blockIdx.y
    c = g * c_per_warp + lane_id * size
    has_channels = c < C
    accum = np.zeros(size, dtype=np.float32)
    for item in range(chunk_size):
        bt = yield cuda.shfl_sync(my_bt, item)  # every lane takes part, even those without channels
        if has_channels:
            accum = fadd(accum, to_float(load128(dout, bt * C + c, cuda)))
    if not has_channels:
        return
    if single_chunk:
        packed_dwte = load128(dwte, ix * C + c, cuda)
        element = ix * C + c + np.arange(size)
        packed_dwte = round_to_storage(fadd(accum, to_float(packed_dwte)), dwte.dtype, element,
                                       NOISE_STREAM_DWTE, seed)
        store128(dwte, ix * C + c, packed_dwte, cuda)
    else:
        start = (unit * num_groups + g) * c_per_warp + lane_id * size
        partials[start : start + size] = accum


def encoder_backward_wte_chunk_combine(cuda, dwte, units, partials, num_units, C, seed):
    """``encoder_backward_wte_chunk_combine_kernel``: the blocks of a multi-chunk token's units share its channels
    (``combine_slices``). A block copies its slice's partials into shared memory a stage at a time, and thread
    ``col`` adds column ``col`` (4 channels) in chunk order, then the old value, and rounds once. (The CUDA kernel
    keeps two stages in flight with cp.async; here a copy is done once it is written, so one stage serves.)"""
    stage = cuda.shared_array("stage", (COMBINE_STAGE_PACKS, 4), np.float32)
    size = pack_size(dwte.dtype)
    unit = cuda.blockIdx.x
    if unit >= num_units[0]:
        return
    ix, chunk, _, token_size = (int(v) for v in units[4 * unit : 4 * unit + 4])
    num_chunks = ceil_div(token_size, CHUNK_ITEMS)
    if num_chunks == 1:
        return  # single-chunk tokens are done already
    num_slices, width = (int(v) for v in combine_slices(num_chunks, C))
    if chunk >= num_slices:
        return  # the whole block leaves together
    c_padded = ceil_div(C, WARP_SIZE * size) * WARP_SIZE * size
    token_partials = (unit - chunk) * c_padded  # the token's units are consecutive

    for slice_ in range(chunk, num_slices, num_chunks):
        q0 = slice_ * width
        cols = min(width, C // 4 - q0)
        rows_per_stage = COMBINE_STAGE_PACKS // cols
        col = cuda.threadIdx.x  # the column this thread adds (threads past cols only copy)
        adder = col < cols
        c = (q0 + col) * 4
        total = None
        for first in range(0, num_chunks, rows_per_stage):
            rows = min(rows_per_stage, num_chunks - first)
            for e in range(cuda.threadIdx.x, rows * cols, COMBINE_THREADS):  # every thread copies some packs
                row, q = divmod(e, cols)
                start = token_partials + (first + row) * c_padded + (q0 + q) * 4
                stage[e] = partials[start : start + 4]
            yield cuda.syncthreads()  # the stage is full
            if adder:
                for row in range(rows):
                    loaded = stage[row * cols + col]
                    total = loaded.copy() if first + row == 0 else fadd(total, loaded)  # chunk 0: total = p_0
            yield cuda.syncthreads()  # the stage is read: the next one may overwrite it
        if adder:
            for k in range(4):
                element = ix * C + c + k
                dwte[element] = round_to_storage(fadd(total[k], to_float(dwte[element])), dwte.dtype, element,
                                                 NOISE_STREAM_DWTE, seed)
