"""Sizes and launch constants the kernels are built around, defined once for the Python side.

The mirror, the validator, the launchers and the GPU bucketing read them from here. The numbers the kernels use too
are read from ``kernels/constants.cuh``, which every kernel includes (``sources.kernel_constants``): each is written
once, there, so the two sides cannot disagree. What only the Python side decides (grids, shares) is written here.
"""

from __future__ import annotations

import numpy as np

from .rounding import bfloat16, float32
from .sources import kernel_constants

_KERNEL = kernel_constants()

WARP_SIZE = _KERNEL["WARP_SIZE"]
#: Threads per block of the elementwise kernels (forward, atomic backward).
BLOCK_SIZE = 256
#: Threads per block of the wpe backward kernel. It runs beside the GPU bucket table on a side stream; with fewer
#: blocks than SMs, the table's one-block kernels find an SM at once instead of waiting for the wpe blocks to end
#: (docs/experiments.md, schedule: "a faster table that made the backward slower"). Any size gives the same bits.
WPE_BLOCK_SIZE = 1024
#: Beside the scatter route's table built in the same call, the wpe kernel gets this share of the SMs (a block
#: each): a block of it leaves no room for the table's 1024-thread kernels on its SM. Elsewhere it keeps the full grid.
#: Why this share: docs/experiments.md, wpe kernel: "the wpe kernel on a share of the SMs beside the table".
WPE_SM_SHARE_BESIDE_TABLE = 3 / 8


#: Beside that table the wpe kernel takes its pipelined form for batches of at most this many sequences (the form
#: keeps a thread's reads in flight from one pack into the next); at B=64 it made the call slower. Why this bound:
#: docs/experiments.md, wpe kernel: "the pipelined form beside the table".
WPE_PIPELINED_MAX_B = 32
#: The pipelined form's cp.async copies in flight per thread, and so its shared-memory slots.
WPE_PIPELINE_STAGES = _KERNEL["WPE_PIPELINE_STAGES"]


def wpe_blocks_beside_table(sm_count: int) -> int:
    """Blocks of the wpe kernel beside the scatter route's table built in the same call:
    ``WPE_SM_SHARE_BESIDE_TABLE`` of the SMs, at least one (49 of an H200's 132)."""
    return max(1, int(sm_count * WPE_SM_SHARE_BESIDE_TABLE))


#: Threads per block of the bucketed wte kernels (``WTE_BLOCK_SIZE``): 8 warps share one bucket.
WTE_BLOCK_SIZE = _KERNEL["WTE_BLOCK_SIZE"]
WTE_WARPS = WTE_BLOCK_SIZE // WARP_SIZE

#: The storage dtypes the kernels are compiled for.
STORAGE_DTYPES = (bfloat16, float32)

#: Largest element count that 32-bit signed index arithmetic in the kernels can address.
INT32_LIMIT = 2**31 - 1


def ceil_div(a: int, b: int) -> int:
    """``CEIL_DIV(a, b)`` of ``common.cuh`` for non-negative ints (works elementwise on integer arrays too)."""
    return -(-a // b)


def dtype_name(dtype) -> str:
    """'bf16' or 'fp32' for a storage dtype; TypeError for anything else."""
    dtype = np.dtype(dtype)
    if dtype == bfloat16:
        return "bf16"
    if dtype == float32:
        return "fp32"
    raise TypeError(f"storage dtype must be ml_dtypes.bfloat16 or numpy.float32, not {dtype}")


def pack_size(dtype) -> int:
    """Elements in one 128-bit pack (``x128::size``): 8 for bf16, 4 for fp32."""
    dtype_name(dtype)
    return 16 // np.dtype(dtype).itemsize


def c_per_group(dtype) -> int:
    """Channels in one bucket's channel group: a warp of packs (256 for bf16, 128 for fp32)."""
    return WARP_SIZE * pack_size(dtype)


def num_c_groups(C: int, dtype) -> int:
    """Channel groups needed to cover C channels (the last one may be partly empty)."""
    return ceil_div(C, c_per_group(dtype))


def bucketed_warps_grid(max_buckets: int) -> int:
    """Blocks of ``encoder_backward_wte_bucketed_warps_kernel`` for a table of at most ``max_buckets`` buckets.

    Warp w of block b sums bucket 8b + w when it is small, and block b sums the big ones among b, b + grid, ...,
    b + 7 * grid: either way every bucket below 8 * grid is reached, so the grid is ``CEIL_DIV(max_buckets, 8)``.
    """
    return ceil_div(max_buckets, WTE_WARPS)


#: Items per chunk of the chunked wte kernel (``CHUNK_ITEMS``): one warp sums one chunk, and a bucket with more
#: items is split into chunks whose partial sums are added in order.
CHUNK_ITEMS = _KERNEL["CHUNK_ITEMS"]
#: Warps per block of the chunked wte kernel: each warp handles its own unit (bucket, chunk).
CHUNKED_WARPS_PER_BLOCK = _KERNEL["CHUNKED_WARPS_PER_BLOCK"]
#: Threads per block of the chunk-combine kernel (``COMBINE_THREADS``): a token's unit blocks share its channels.
COMBINE_THREADS = _KERNEL["COMBINE_THREADS"]
#: 16-byte packs of partial sums in one of the combine kernel's two shared-memory stages (``COMBINE_STAGE_PACKS``).
COMBINE_STAGE_PACKS = _KERNEL["COMBINE_STAGE_PACKS"]
#: About the narrowest channel slice of the combine kernel, in columns of 4 channels (``COMBINE_MIN_COLUMNS``).
COMBINE_MIN_COLUMNS = _KERNEL["COMBINE_MIN_COLUMNS"]


def combine_slices(num_chunks, C: int):
    """``(num_slices, width)``: how the combine kernel cuts a token of ``num_chunks`` chunks (an int or an integer
    array) into channel slices of ``width`` columns of 4 channels (the last slice may be narrower).

    As many slices as chunks, so that each of the token's unit blocks takes one, but at least enough that a slice
    fits a block's ``COMBINE_THREADS`` threads (one column each) and at most ``CEIL_DIV(columns,
    COMBINE_MIN_COLUMNS)``, so that a slice is not much narrower than ``COMBINE_MIN_COLUMNS`` columns (128 bytes of
    a partial row; a little narrower only where the columns do not divide evenly). The width is then the even
    split, and the count what that width needs. The block of the token's unit ``chunk`` takes slices
    ``chunk``, ``chunk + num_chunks``, ... below ``num_slices``.
    """
    columns = C // 4
    fewest, most = ceil_div(columns, COMBINE_THREADS), ceil_div(columns, COMBINE_MIN_COLUMNS)
    wanted = np.minimum(np.maximum(num_chunks, fewest), most)
    width = ceil_div(columns, wanted)
    return ceil_div(columns, width), width

#: Threads per block of the cooperative bucketing kernel (``BUCKETING_THREADS`` in bucketing.cu).
BUCKETING_THREADS = _KERNEL["BUCKETING_THREADS"]
def cooperative_grid_blocks(BT: int, V: int, num_sms: int) -> int:
    """Blocks of the cooperative bucketing launch: one per SM at most (so all are co-resident), none idle.

    (Capping it at 32 SMs, to leave the others to the wpe kernel queued beside it, made the table slower and the wpe
    kernel still did not run beside a cooperative launch: docs/experiments.md, bucket table: "the first GPU tables".)
    """
    return max(1, min(num_sms, ceil_div(max(V, BT), BUCKETING_THREADS)))


#: Bits of the key one radix-sort pass sorts by, and its buckets (``1 << RADIX_BITS``).
RADIX_BITS = _KERNEL["RADIX_BITS"]
RADIX_DIGITS = 1 << RADIX_BITS
#: Size of the bucketing kernels' counter array, and the slots where they leave the table's sizes.
NUM_COUNTERS = _KERNEL["NUM_COUNTERS"]
COUNTER_NUM_DISTINCT = _KERNEL["COUNTER_NUM_DISTINCT"]
COUNTER_MAX_COUNT = _KERNEL["COUNTER_MAX_COUNT"]
COUNTER_NUM_CLASSES = _KERNEL["COUNTER_NUM_CLASSES"]
COUNTER_NUM_BUCKETS = _KERNEL["COUNTER_NUM_BUCKETS"]
COUNTER_NUM_UNITS = _KERNEL["COUNTER_NUM_UNITS"]
#: The scatter route's number of big tokens (seen more than ``CHUNK_ITEMS`` times), ``COUNTER_NUM_BIG``.
COUNTER_NUM_BIG = _KERNEL["COUNTER_NUM_BIG"]
#: The scatter route's big tokens' positions and chunks, all together (kernel 2 adds them up, kernel 3 reads them).
COUNTER_BIG_ITEMS = _KERNEL["COUNTER_BIG_ITEMS"]
COUNTER_BIG_UNITS = _KERNEL["COUNTER_BIG_UNITS"]

#: The scatter route (``kernels/bucketing_scatter.cu``): blocks of its per-token and sorting kernels, blocks of its
#: per-position kernels, and the most ids it buckets (its bitmap of all positions is static shared memory).
SCATTER_THREADS = _KERNEL["SCATTER_THREADS"]
SCATTER_SMALL_BLOCK = _KERNEL["SCATTER_SMALL_BLOCK"]
SCATTER_MAX_BT = _KERNEL["SCATTER_MAX_BT"]


def scatter_max_big(BT: int) -> int:
    """Most big tokens (seen more than ``CHUNK_ITEMS`` times) that BT ids can hold: the big-token lists' size."""
    return BT // (CHUNK_ITEMS + 1) + 1

#: The one-block bucketing kernel of one sequence (``kernels/bucketing_small.cu``): its block, the elements each
#: thread holds (``SMALL_KEYS``), the most ids it sorts (``SMALL_MAX_BT``) and the largest vocabulary whose ids
#: fit its 32-bit keys beside a 10-bit position (``SMALL_MAX_V``).
SMALL_THREADS = _KERNEL["SMALL_THREADS"]
SMALL_KEYS = _KERNEL["SMALL_KEYS"]
SMALL_MAX_BT = _KERNEL["SMALL_MAX_BT"]
SMALL_MAX_V = _KERNEL["SMALL_MAX_V"]
#: Low bits of a one-block sort key that hold the position (``SMALL_POS_BITS``): the id sits above them.
SMALL_POS_BITS = _KERNEL["SMALL_POS_BITS"]

#: The one-launch backward of one short batch (``kernels/encoder_backward_small.cu``): its block and the most ids
#: it takes (its keys are the one-block table's: ids below ``SMALL_MAX_V``).
SMALL_BACKWARD_THREADS = _KERNEL["SMALL_BACKWARD_THREADS"]
SMALL_BACKWARD_MAX_BT = _KERNEL["SMALL_BACKWARD_MAX_BT"]


#: Batch rows per thread of the fp32 atomic backward's rows kernel (``ATOMIC_ROWS``).
ATOMIC_ROWS = _KERNEL["ATOMIC_ROWS"]
#: Batch rows per thread of the fast forward kernel (``FORWARD_ROWS``).
FORWARD_ROWS = _KERNEL["FORWARD_ROWS"]
