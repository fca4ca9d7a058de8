"""Launch shapes of the per-thread kernels: the real kernels' grids (``gpt2enc_edu/cuda.py``) and the warm-ups'.

Each ``launch_*`` runs any per-thread kernel of the right signature through ``grid.launch`` on NumPy arrays,
naming its arguments and saying which of them it may write (the rest are its inputs, which it cannot). The
notebooks run the package's per-thread forms (``perthread``) through them, and the graded checks run a
learner's kernel through them in a separate process (``grade_child``), which is why they live apart from the
package's kernels. A bucket table is anything with a ``BucketTable``'s fields (``info``, ``bt_list``, ...).
"""

from __future__ import annotations

import numpy as np

from ..layout import (
    BLOCK_SIZE,
    CHUNKED_WARPS_PER_BLOCK,
    COMBINE_THREADS,
    WARP_SIZE,
    WTE_BLOCK_SIZE,
    bucketed_warps_grid,
    ceil_div,
    pack_size,
)
from .grid import launch, read_only, to_float, to_storage_nearest

#: Threads per block of the warm-up kernels (four warps).
WARMUP_BLOCK = 128


# ------------------------------------------------------------------------------------------------------
# The encoder kernels.
def launch_forward(kernel, out, inp, wte, wpe, *, rng=None) -> None:
    B, T = inp.shape
    C = wte.shape[1]
    threads = B * T * C // pack_size(wte.dtype)
    launch(kernel, ceil_div(threads, BLOCK_SIZE), BLOCK_SIZE,
           (out.reshape(-1), inp.reshape(-1), wte.reshape(-1), wpe.reshape(-1), B, T, C), rng=rng,
           names=("out", "inp", "wte", "wpe", "B", "T", "C"), writes={"out"})


def launch_backward_wpe(kernel, dwpe, dout, seed: int, *, rng=None, blocks: int | None = None) -> None:
    """A thread per pack of dwpe, or ``blocks`` blocks whose threads walk the packs in turn (the package's grid
    beside the bucket table; a learner's kernel of one pack per thread needs the full grid)."""
    B, T, C = dout.shape
    grid = ceil_div(T * C // pack_size(dout.dtype), BLOCK_SIZE)
    launch(kernel, grid if blocks is None else min(grid, blocks), BLOCK_SIZE,
           (dwpe.reshape(-1), dout.reshape(-1), B, T, C, seed), rng=rng,
           names=("dwpe", "dout", "B", "T", "C", "seed"), writes={"dwpe"})


def launch_backward_atomic(kernel, dwte, dwpe, dout, inp, *, rng=None) -> None:
    """The fp32 atomic kernel; for bf16 storage into fp32 copies, rounded back to nearest once (as cuda.py)."""
    B, T, C = dout.shape
    threads = B * T * C // pack_size(dout.dtype)
    dwte32, dwpe32 = to_float(dwte).copy(), to_float(dwpe).copy()
    launch(kernel, ceil_div(threads, BLOCK_SIZE), BLOCK_SIZE,
           (read_only(dwte32), read_only(dwpe32), dout.reshape(-1), inp.reshape(-1), B, T, C), rng=rng,
           names=("dwte32", "dwpe32", "dout", "inp", "B", "T", "C"), writes=())
    dwte[...] = to_storage_nearest(dwte32, dwte.dtype)
    dwpe[...] = to_storage_nearest(dwpe32, dwpe.dtype)


_WTE_NAMES = ("dwte", "bucket_info", "bt_list", "dout", "num_buckets", "C", "seed")


def launch_backward_wte_bucketed(kernel, dwte, table, dout, seed: int, *, rng=None) -> None:
    C = dout.shape[-1]
    num_buckets = np.array([table.num_buckets], dtype=np.int32)
    launch(kernel, max(table.num_buckets, 1), WTE_BLOCK_SIZE,
           (dwte.reshape(-1), table.info.reshape(-1), table.bt_list, dout.reshape(-1), num_buckets, C, seed), rng=rng,
           names=_WTE_NAMES, writes={"dwte"})


def launch_backward_wte_bucketed_warps(kernel, dwte, table, dout, seed: int, *, rng=None) -> None:
    """The warps form's launch: ``bucketed_warps_grid`` blocks for the table's buckets (a host table's bound is
    its size)."""
    C = dout.shape[-1]
    num_buckets = np.array([table.num_buckets], dtype=np.int32)
    launch(kernel, max(bucketed_warps_grid(table.num_buckets), 1), WTE_BLOCK_SIZE,
           (dwte.reshape(-1), table.info.reshape(-1), table.bt_list, dout.reshape(-1), num_buckets, C, seed), rng=rng,
           names=_WTE_NAMES, writes={"dwte"})


def launch_backward_wte_chunked(chunk_kernel, combine_kernel, dwte, table, dout, seed: int, *, rng=None) -> None:
    C = dout.shape[-1]
    size = pack_size(dout.dtype)
    c_padded = ceil_div(C, WARP_SIZE * size) * WARP_SIZE * size
    partials = np.full(max(table.num_units, 1) * c_padded, np.nan, dtype=np.float32)
    num_units = np.array([table.num_units], dtype=np.int32)
    units = table.units.reshape(-1)
    launch(chunk_kernel, (max(ceil_div(table.num_units, CHUNKED_WARPS_PER_BLOCK), 1), ceil_div(C, WARP_SIZE * size)),
           WARP_SIZE * CHUNKED_WARPS_PER_BLOCK,
           (dwte.reshape(-1), units, table.bt_list, dout.reshape(-1), partials, num_units, C, seed), rng=rng,
           names=("dwte", "units", "bt_list", "dout", "partials", "num_units", "C", "seed"),
           writes={"dwte", "partials"})
    launch(combine_kernel, max(table.num_units, 1), COMBINE_THREADS,
           (dwte.reshape(-1), units, partials, num_units, C, seed), rng=rng,
           names=("dwte", "units", "partials", "num_units", "C", "seed"), writes={"dwte"})


# ------------------------------------------------------------------------------------------------------
# The warm-ups (notebook 00): blocks of WARMUP_BLOCK threads.
def launch_add_bias(kernel, out, x, bias, *, rng=None) -> None:
    """One thread per element of the (R, C) array ``x``: ``kernel(cuda, out, x, bias, n, C)``, n = R * C."""
    n, C = x.size, bias.size
    launch(kernel, ceil_div(n, WARMUP_BLOCK), WARMUP_BLOCK, (out.reshape(-1), x.reshape(-1), bias, n, C), rng=rng,
           names=("out", "x", "bias", "n", "C"), writes={"out"})


def launch_warp_sum(kernel, out, x, *, rng=None) -> None:
    """One warp per 32 values of ``x`` (n a multiple of 32): ``kernel(cuda, out, x, n)``."""
    n = x.size
    launch(kernel, ceil_div(n, WARMUP_BLOCK), WARMUP_BLOCK, (out, x, n), rng=rng, names=("out", "x", "n"),
           writes={"out"})


def launch_block_sum(kernel, out, x, *, rng=None) -> None:
    """One block per WARMUP_BLOCK values of ``x`` (n a multiple of it): ``kernel(cuda, out, x, n)``."""
    n = x.size
    launch(kernel, n // WARMUP_BLOCK, WARMUP_BLOCK, (out, x, n), rng=rng, names=("out", "x", "n"), writes={"out"})
