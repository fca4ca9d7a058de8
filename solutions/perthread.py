"""Worked solutions to the per-thread Python build-it exercises of notebooks 01-03 (try them first!).

Written one element at a time (the ``for k`` loops of the CUDA kernels), where the package's own per-thread
forms (``gpt2enc_edu.course.perthread``) add whole packs: both give the mirror's bits. Hand one to its check::

    from gpt2enc_edu.course import buildit
    import solutions.perthread as solutions  # from the repository root
    buildit.check_forward(solutions.encoder_forward)
"""

from __future__ import annotations

import numpy as np

from gpt2enc_edu.course.grid import fadd, round_to_storage, to_float, to_storage_nearest
from gpt2enc_edu.layout import WARP_SIZE, WTE_BLOCK_SIZE, WTE_WARPS, pack_size
from gpt2enc_edu.rounding import NOISE_STREAM_DWPE, NOISE_STREAM_DWTE


def encoder_forward(cuda, out, inp, wte, wpe, B, T, C):
    """Forward: thread i owns the pack of out that starts at flat element i * size."""
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    b, t, c = idx // (T * C), idx // C % T, idx % C
    ix = int(inp[b * T + t])
    for k in range(size):
        total = fadd(to_float(wte[ix * C + c + k]), to_float(wpe[t * C + c + k]))
        out[idx + k] = to_storage_nearest(total, out.dtype)


def encoder_backward_atomic_fp32(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    """Atomic backward: the forward's thread map, every element added into its two rows with atomics."""
    size = pack_size(dout.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    t, c = idx // C % T, idx % C
    ix = int(inp[idx // C])
    for k in range(size):
        d = to_float(dout[idx + k])
        cuda.atomic_add(dwte32, ix * C + c + k, d)
        cuda.atomic_add(dwpe32, t * C + c + k, d)


def encoder_backward_wpe(cuda, dwpe, dout, B, T, C, seed):
    """wpe backward: one owner per dwpe element; sum over b in order, then the old value, then round."""
    size = pack_size(dout.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= T * C:
        return
    for k in range(size):
        accum = np.float32(0.0)
        for b in range(B):
            accum = fadd(accum, to_float(dout[b * T * C + idx + k]))
        value = fadd(accum, to_float(dwpe[idx + k]))
        dwpe[idx + k] = round_to_storage(value, dwpe.dtype, idx + k, NOISE_STREAM_DWPE, seed)


def encoder_backward_wte_bucketed(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    """Bucketed wte backward: warps take items w, w + 8, ...; warp 0 adds the busy warps in order."""
    size = pack_size(dout.dtype)
    shared = cuda.shared_array("partials", (WTE_WARPS, WARP_SIZE, size), np.float32)
    bucket = cuda.blockIdx.x
    if bucket >= num_buckets[0]:
        return
    warp, lane = divmod(cuda.threadIdx.x, WARP_SIZE)
    start, count, ix, group = (int(v) for v in bucket_info[4 * bucket : 4 * bucket + 4])
    c = group * WARP_SIZE * size + lane * size
    accum = [np.float32(0.0)] * size
    if c < C:
        for item in range(warp, count, WTE_WARPS):
            bt = int(bt_list[start + item])
            accum = [fadd(accum[k], to_float(dout[bt * C + c + k])) for k in range(size)]
    shared[warp, lane] = accum
    yield cuda.syncthreads()  # every thread, even those without channels
    if warp != 0 or c >= C:
        return
    for w in range(1, min(WTE_WARPS, count)):
        accum = [fadd(accum[k], shared[w, lane, k]) for k in range(size)]
    for k in range(size):
        element = ix * C + c + k
        dwte[element] = round_to_storage(fadd(accum[k], to_float(dwte[element])), dwte.dtype, element,
                                         NOISE_STREAM_DWTE, seed)


assert WTE_BLOCK_SIZE == WTE_WARPS * WARP_SIZE
