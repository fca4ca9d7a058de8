"""The NumPy mirror: one function per CUDA kernel, with the kernel's name, to be read side by side with it.

Each function takes the same arguments as its kernel, builds the kernel's thread indices with
``np.arange`` (one row per thread, one column per element of its 128-bit pack, ``k``), and does the same
index math and the same fp32 operations in the same order (``fadd`` = the GPU's flush-to-zero add). Loops
that a kernel runs *inside* a thread (over ``b``, over a bucket's items, over warps, over chunks) stay Python
loops here, so the order of every sum is the kernel's order.

* ``encoder_forward`` <-> ``encoder_forward_kernel``
* ``encoder_backward_wpe`` <-> ``encoder_backward_wpe_kernel``, and its pipelined form
  (``..._pipelined_kernel``), which moves the rows through shared memory and adds the same rows in the same order
* ``encoder_backward_wte_bucketed`` <-> ``encoder_backward_wte_bucketed_kernel`` (llm.c's form) and
  ``encoder_backward_wte_bucketed_warps_kernel`` (the package's launch). In the warps form one warp sums a
  small bucket, and does so with the block's fp32 operations in the block's order (the kernel file says why
  the two agree); only which threads perform them differs, so one mirror serves both.
* ``encoder_backward_wte_chunked_kernel`` and ``encoder_backward_wte_chunk_combine_kernel`` <-> the two
  kernels of the same names, with the same flat fp32 ``partials`` layout; ``encoder_backward_wte_chunked``
  runs the pair as the launcher does. The chunk kernel's staged form (``..._chunked_staged_kernel``) has the
  same twin: it moves the rows through shared memory, and adds the same rows in the same order
* ``encoder_backward_small`` <-> ``encoder_backward_small_kernel`` (the chunked method's whole backward of at most
  1024 ids in one launch): its sort and segments, then the same sums as the chunk, combine and wpe kernels (the
  kernel file says why), which their mirrors do
* ``encoder_backward_atomic`` / ``encoder_backward_atomic_bf16`` <-> ``encoder_backward_atomic_fp32_kernel`` /
  ``..._bf16_kernel``
* the bucket table's kernels have their twins: the scatter route (``bucketing_scatter.cu``, five kernels) in
  ``buckets/mirror_scatter.py``, the cooperative ``bucketing_kernel`` phase by phase in
  ``buckets/mirror_cooperative.py``, the one-block ``bucketing_small_kernel`` in ``buckets/mirror_small.py``

Deterministic kernels (forward, wpe backward, bucketed and chunked wte backward) therefore give the GPU's
bits exactly. The atomic kernels' order is decided by the hardware at run time; their mirror draws a fresh
random order on every call, so it is nondeterministic in the same way.

Arguments are validated by the public API (``gpt2enc_edu.encoder_*``) before these run.
"""

from __future__ import annotations

import numpy as np

from .buckets import BucketTable
from .layout import (
    CHUNK_ITEMS,
    SMALL_POS_BITS,
    WARP_SIZE,
    WTE_WARPS,
    c_per_group,
    ceil_div,
    combine_slices,
    num_c_groups,
    pack_size,
)
from .methods import check_small_backward_batch
from .rounding import (
    NOISE_STREAM_DWPE,
    NOISE_STREAM_DWTE,
    bfloat16,
    fadd,
    round_to_storage,
    to_bf16_nearest,
    to_float,
)

#: How many buckets (units) the bucketed (chunked) wte mirror processes at once: bounds memory, not the result.
_BUCKETS_PER_STEP = 1024
_UNITS_PER_STEP = 2048


def _to_storage_nearest(value: np.ndarray, dtype) -> np.ndarray:
    """``(floatX)value``: round to nearest even for bf16, unchanged for fp32."""
    return to_bf16_nearest(value) if np.dtype(dtype) == bfloat16 else value


def _thread_starts(n_elements: int, size: int) -> np.ndarray:
    """``idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size`` for every thread with ``idx < n``."""
    return np.arange(0, n_elements, size, dtype=np.int64)


def encoder_forward(out, inp, wte, wpe, B: int, T: int, C: int) -> None:
    """Mirror of ``encoder_forward_v2_kernel``, a thread per pack: ``out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]``.
    Every version of the forward (``encoder_forward_kernel`` is version 3) gives its bits: one fp32 add per
    element, rounded to nearest, whichever thread does it."""
    size = pack_size(wte.dtype)
    k = np.arange(size)
    idx = _thread_starts(B * T * C, size)

    bt = idx // C
    b = bt // T
    t = bt % T
    c = idx % C

    ix = inp.reshape(-1)[b * T + t]

    wte128 = wte.reshape(-1)[(ix * C + c)[:, None] + k]
    wpe128 = wpe.reshape(-1)[(t * C + c)[:, None] + k]
    packed_out = _to_storage_nearest(fadd(to_float(wte128), to_float(wpe128)), out.dtype)
    out.reshape(-1)[(b * T * C + t * C + c)[:, None] + k] = packed_out


def encoder_backward_wpe(dwpe, dout, B: int, T: int, C: int, seed: int) -> None:
    """Mirror of ``encoder_backward_wpe_kernel``: ``dwpe[t,:] += sum over b of dout[b,t,:]``."""
    size = pack_size(dout.dtype)
    k = np.arange(size)
    idx = _thread_starts(T * C, size)

    t = idx // C
    c = idx % C

    dout_flat = dout.reshape(-1)
    accum = np.zeros((idx.size, size), dtype=np.float32)
    for b in range(B):  # the kernel's loop over b, in its order
        packed_dout = dout_flat[(b * T * C + t * C + c)[:, None] + k]
        accum = fadd(accum, to_float(packed_dout))

    dwpe_flat = dwpe.reshape(-1)
    dwpe_tc = (t * C + c)[:, None] + k  # also each element's noise position (idx + k)
    packed_dwpe = dwpe_flat[dwpe_tc]
    dwpe_flat[dwpe_tc] = round_to_storage(
        fadd(accum, to_float(packed_dwpe)), dwpe.dtype, dwpe_tc, NOISE_STREAM_DWPE, seed
    )


def encoder_backward_wte_bucketed(dwte, table: BucketTable, dout, C: int, seed: int) -> None:
    """Mirror of ``encoder_backward_wte_bucketed_kernel``: one block per bucket, 8 warps, warp 0 combines.

    It is also the mirror of ``encoder_backward_wte_bucketed_warps_kernel``: where that kernel gives a bucket one
    warp, the warp computes warp w's sum for w = 0, 1, ... and adds each to its total, as warp 0 adds the warps'
    sums here.

    Threads are vectorised as rows (bucket, lane) for each warp; buckets are taken a step at a time to
    bound memory. Threads whose channels lie past C (the last group when C is not a multiple of
    ``c_per_group``) have no row at all, as they do no work in the kernel.
    """
    size = pack_size(dout.dtype)
    k = np.arange(size)
    c_per_warp = WARP_SIZE * size
    dout_flat = dout.reshape(-1)
    dwte_flat = dwte.reshape(-1)
    bt_list = table.bt_list

    for first_bucket in range(0, table.num_buckets, _BUCKETS_PER_STEP):
        info = table.info[first_bucket : first_bucket + _BUCKETS_PER_STEP].astype(np.int64)
        bucket_start, bucket_size, bucket_ix, c_group = info.T

        # One row per thread of a warp: (bucket, lane_id), keeping only lanes that have channels.
        bucket, lane_id = np.divmod(np.arange(info.shape[0] * WARP_SIZE), WARP_SIZE)
        c = c_group[bucket] * c_per_warp + lane_id * size
        has_channels = c < C
        bucket, c = bucket[has_channels], c[has_channels]
        size_of_thread = bucket_size[bucket]
        start_of_thread = bucket_start[bucket]

        # Each warp's partial sum: warp w adds items w, w + 8, w + 16, ... of its bucket.
        warp_accum = []
        for warp_id in range(WTE_WARPS):
            accum = np.zeros((bucket.size, size), dtype=np.float32)
            for item in range(warp_id, int(bucket_size.max(initial=0)), WTE_WARPS):
                active = np.flatnonzero(item < size_of_thread)
                bt = bt_list[start_of_thread[active] + item].astype(np.int64)
                packed_dout = dout_flat[(bt * C + c[active])[:, None] + k]
                accum[active] = fadd(accum[active], to_float(packed_dout))
            warp_accum.append(accum)

        # Warp 0 adds the warps that had at least one item, in order 1, 2, ..., then the old value.
        accum = warp_accum[0]
        busy_warps = np.minimum(WTE_WARPS, size_of_thread)
        for w in range(1, WTE_WARPS):
            added = w < busy_warps
            accum[added] = fadd(accum[added], warp_accum[w][added])

        dwte_ix = (bucket_ix[bucket] * C + c)[:, None] + k  # also each element's noise position
        packed_dwte = dwte_flat[dwte_ix]
        dwte_flat[dwte_ix] = round_to_storage(
            fadd(accum, to_float(packed_dwte)), dwte.dtype, dwte_ix, NOISE_STREAM_DWTE, seed
        )


def encoder_backward_wte_chunked_kernel(dwte, units, bt_list, dout, partials, num_units: int, C: int,
                                        seed: int) -> None:
    """Mirror of ``encoder_backward_wte_chunked_kernel``: one warp per unit (token, chunk) and channel group.

    Each warp sums its chunk's items in order. A single-chunk token is finished here (its sum plus the old
    value, rounded into ``dwte``); a multi-chunk token's warps store their sums in ``partials`` (flat fp32),
    at ``unit * num_groups * c_per_warp + g * c_per_warp + lane_id * size``, for the combine kernel.
    Threads are rows (unit, g, lane_id), as the kernel's warps are (unit, group ``g = blockIdx.y``). Lanes past
    C have no row (they do no work). Units are taken a step at a time to bound memory.
    """
    size = pack_size(dout.dtype)
    k = np.arange(size)
    c_per_warp = WARP_SIZE * size
    num_groups = ceil_div(C, c_per_warp)
    dout_flat = dout.reshape(-1)
    dwte_flat = dwte.reshape(-1)

    for first_unit in range(0, num_units, _UNITS_PER_STEP):
        step = np.arange(first_unit, min(num_units, first_unit + _UNITS_PER_STEP))
        unit, g, lane_id = (a.reshape(-1) for a in np.meshgrid(step, np.arange(num_groups), np.arange(WARP_SIZE),
                                                                indexing="ij"))
        c = g * c_per_warp + lane_id * size
        has_channels = c < C
        unit, g, lane_id, c = unit[has_channels], g[has_channels], lane_id[has_channels], c[has_channels]

        ix, chunk, token_start, token_size = units[unit].astype(np.int64).T
        num_chunks = ceil_div(token_size, CHUNK_ITEMS)
        chunk_first = chunk * CHUNK_ITEMS
        chunk_size = np.minimum(CHUNK_ITEMS, token_size - chunk_first)

        # The chunk's items in order: accum = ((0 + d[item 0]) + d[item 1]) + ...
        accum = np.zeros((unit.size, size), dtype=np.float32)
        for item in range(CHUNK_ITEMS):
            active = np.flatnonzero(item < chunk_size)
            bt = bt_list[token_start[active] + chunk_first[active] + item].astype(np.int64)
            packed_dout = dout_flat[(bt * C + c[active])[:, None] + k]
            accum[active] = fadd(accum[active], to_float(packed_dout))

        # A single-chunk token: read-modify-write of dwte.
        single = np.flatnonzero(num_chunks == 1)
        dwte_ix = (ix[single] * C + c[single])[:, None] + k  # also each element's noise position
        packed_dwte = dwte_flat[dwte_ix]
        dwte_flat[dwte_ix] = round_to_storage(
            fadd(accum[single], to_float(packed_dwte)), dwte.dtype, dwte_ix, NOISE_STREAM_DWTE, seed
        )

        # A multi-chunk token: store the partial sums.
        multi = np.flatnonzero(num_chunks > 1)
        my_partials = unit[multi] * num_groups * c_per_warp
        partials[(my_partials + g[multi] * c_per_warp + lane_id[multi] * size)[:, None] + k] = accum[multi]


def encoder_backward_wte_chunk_combine_kernel(dwte, units, partials, num_units: int, C: int, seed: int) -> None:
    """Mirror of ``encoder_backward_wte_chunk_combine_kernel``: a multi-chunk token's unit blocks share its channels.

    The token's channels are cut into ``combine_slices`` slices of ``width`` columns of 4 channels; the block of the
    token's unit ``chunk`` takes slices ``chunk``, ``chunk + num_chunks``, ... and its thread ``col`` adds column
    ``slice * width + col``: the token's partials in chunk order (the first one taken as it is: ``total = p_0``,
    then ``total += p_1`` ...), then the old value, and rounds. A token's partials start at ``(unit - chunk) *
    c_padded`` (its units are consecutive, so chunk ``ch`` is ``ch * c_padded`` further). The kernel moves the
    partials through shared memory in stages first; which thread copies which pack changes no sum, so the mirror
    reads them where they lie.
    """
    c_padded = num_c_groups(C, dwte.dtype) * c_per_group(dwte.dtype)
    k = np.arange(4)
    dwte_flat = dwte.reshape(-1)
    work = units[:num_units].astype(np.int64)
    num_chunks = ceil_div(work[:, 3], CHUNK_ITEMS)
    chunk = work[:, 1]
    num_slices, width = combine_slices(num_chunks, C)
    # Blocks that do work: a multi-chunk token's units with a slice to take (the others return at once).
    blocks = np.flatnonzero((num_chunks > 1) & (chunk < num_slices))
    # Each block's slices, round by round: chunk, chunk + num_chunks, ...
    block_of, slice_of = [], []
    for round_ in range(int(ceil_div(num_slices[blocks] - chunk[blocks], num_chunks[blocks]).max(initial=0))):
        slices = chunk[blocks] + round_ * num_chunks[blocks]
        taken = slices < num_slices[blocks]
        block_of.append(blocks[taken])
        slice_of.append(slices[taken])
    block_of = np.concatenate(block_of) if block_of else np.zeros(0, np.int64)
    slice_of = np.concatenate(slice_of) if slice_of else np.zeros(0, np.int64)
    # Threads: one per column of each (block, slice), col = 0 .. cols - 1.
    q0 = slice_of * width[block_of]
    cols = np.minimum(width[block_of], C // 4 - q0)
    unit = np.repeat(block_of, cols)
    col = np.arange(int(cols.sum())) - np.repeat(np.cumsum(cols) - cols, cols)
    c = (np.repeat(q0, cols) + col) * 4
    ix = work[unit, 0]
    chunks_of_thread = num_chunks[unit]
    token_partials = (unit - chunk[unit]) * c_padded

    total = partials[(token_partials + c)[:, None] + k]  # chunk 0: total = p_0
    for ch in range(1, int(num_chunks.max(initial=1))):
        active = np.flatnonzero(ch < chunks_of_thread)
        loaded = partials[(token_partials[active] + ch * c_padded + c[active])[:, None] + k]
        total[active] = fadd(total[active], loaded)

    dwte_ix = (ix * C + c)[:, None] + k  # also each element's noise position
    dwte_flat[dwte_ix] = round_to_storage(
        fadd(total, to_float(dwte_flat[dwte_ix])), dwte.dtype, dwte_ix, NOISE_STREAM_DWTE, seed
    )


def encoder_backward_wte_chunked(dwte, table: BucketTable, dout, C: int, seed: int) -> None:
    """The chunk kernel, then the combine kernel, as ``cuda.encoder_backward_wte_chunked`` launches them.

    The result, for every channel: chunk partials ``p = ((0 + d[item 0]) + d[item 1]) + ...`` in bt order,
    token total ``s = ((p_0 + p_1) + p_2) + ...`` in chunk order (``s = p_0`` for one chunk), then
    ``dwte = round_to_storage(s + dwte_old)``. ``partials`` holds the multi-chunk tokens' units, a prefix
    of the unit list, as on the GPU (whose buffer is sized by a bound and may be longer).
    """
    units = table.units
    c_padded = num_c_groups(C, dout.dtype) * c_per_group(dout.dtype)
    num_multi_chunk_units = int(np.count_nonzero(units[:, 3] > CHUNK_ITEMS))
    partials = np.zeros(num_multi_chunk_units * c_padded, dtype=np.float32)
    encoder_backward_wte_chunked_kernel(dwte, units, table.bt_list, dout, partials, table.num_units, C, seed)
    encoder_backward_wte_chunk_combine_kernel(dwte, units, partials, table.num_units, C, seed)


def encoder_backward_small(dwte, dwpe, dout, inp, B: int, T: int, C: int, seed: int) -> None:
    """Mirror of ``encoder_backward_small_kernel``: the chunked method's backward of at most 1024 ids, one launch.

    Phases 1-2 as the kernel's blocks do them: the keys ``(id << 10) | bt`` sorted (so each token's positions come
    in bt order) and cut into segments, one per distinct token. Phase 4 sums each token by chunks of
    ``CHUNK_ITEMS`` positions, the partials in chunk order: a block token's threads do so pass by pass, a warp task
    (a single chunk) in registers. Which threads do it is all that differs from the chunk and combine kernels, so
    the tokens' chunks become units (token, chunk, start, count) in segment order and those kernels' mirrors do the
    sums; phase 5 is the wpe kernel's sum, and its mirror does it.
    """
    check_small_backward_batch(B, T)
    pos_bits = SMALL_POS_BITS  # the key's low bits hold any position
    # 1. The positions sorted by token id (bt ascending inside a token: bt is the key's low bits).
    key = np.sort((inp.reshape(-1).astype(np.int64) << pos_bits) | np.arange(B * T))
    token, bt = key >> pos_bits, key & ((1 << pos_bits) - 1)
    # 2. Segments: slot p starts one where its id differs from slot p - 1's.
    seg_start = np.flatnonzero(np.concatenate(([True], token[1:] != token[:-1])))
    count = np.diff(np.append(seg_start, B * T))
    # 4. The tokens' chunks as units, then the chunk kernel's and the combine kernel's sums.
    num_chunks = ceil_div(count, CHUNK_ITEMS)
    seg = np.repeat(np.arange(seg_start.size), num_chunks)
    chunk = np.arange(seg.size) - np.repeat(np.cumsum(num_chunks) - num_chunks, num_chunks)
    units = np.stack([token[seg_start[seg]], chunk, seg_start[seg], count[seg]], axis=1).astype(np.int32)
    c_padded = num_c_groups(C, dout.dtype) * c_per_group(dout.dtype)
    partials = np.zeros(units.shape[0] * c_padded, dtype=np.float32)
    encoder_backward_wte_chunked_kernel(dwte, units, bt.astype(np.int32), dout, partials, units.shape[0], C, seed)
    encoder_backward_wte_chunk_combine_kernel(dwte, units, partials, units.shape[0], C, seed)
    # 5. dwpe.
    encoder_backward_wpe(dwpe, dout, B, T, C, seed)


def encoder_backward_atomic(dwte, dwpe, dout, inp, B: int, T: int, C: int, *, rng=None) -> None:
    """Mirror of ``cuda.encoder_backward_atomic`` (fp32 accumulation); see ``atomic_adds``."""
    atomic_adds(dwte, dwpe, dout, inp, B, T, C, bf16_atomics=False, rng=rng)


def encoder_backward_atomic_bf16(dwte, dwpe, dout, inp, B: int, T: int, C: int, *, rng=None) -> None:
    """Mirror of ``cuda.encoder_backward_atomic_bf16`` (every add rounded to bf16); see ``atomic_adds``."""
    atomic_adds(dwte, dwpe, dout, inp, B, T, C, bf16_atomics=True, rng=rng)


def atomic_adds(dwte, dwpe, dout, inp, B: int, T: int, C: int, *, bf16_atomics: bool, rng=None):
    """Mirror of the atomic backward: every (b, t) row is added into dwte and dwpe in a random order.

    ``bf16_atomics=False`` mirrors ``encoder_backward_atomic_fp32_kernel``: adds in fp32 (into copies, for
    bf16 storage, rounded back to nearest once at the end). ``bf16_atomics=True`` mirrors
    ``encoder_backward_atomic_bf16_kernel``: every single add is rounded to bf16. The order is a fresh
    random permutation on every call (or drawn from ``rng``), like the order in which GPU threads happen
    to reach the memory system.
    """
    rng = np.random.default_rng() if rng is None else rng
    arrival = rng.permutation(B * T)  # thread arrival order at the atomics
    ix = inp.reshape(-1)[arrival]
    t = arrival % T
    rows = dout.reshape(B * T, C)[arrival]
    if bf16_atomics:
        # ufunc.at is unbuffered: repeated indices are applied one after another, in the given order,
        # each add computed in fp32 and rounded to bf16 like the hardware's bf16 atomicAdd.
        with np.errstate(over="ignore", invalid="ignore"):  # the GPU is silent on Inf and NaN too
            np.add.at(dwte, ix, rows)
            np.add.at(dwpe, t, rows)
        return
    # Only the rows the batch touches (and dwpe's first T) are widened and rounded back, as on the GPU: the others
    # keep their bits, NaN payloads included.
    touched, row_of = np.unique(ix, return_inverse=True)
    dwte32, dwpe32 = to_float(dwte[touched]), to_float(dwpe[:T])
    rows32 = to_float(rows)
    with np.errstate(over="ignore", invalid="ignore"):
        np.add.at(dwte32, row_of, rows32)
        np.add.at(dwpe32, t, rows32)
        dwte[touched] = _to_storage_nearest(dwte32, dwte.dtype)
        dwpe[:T] = _to_storage_nearest(dwpe32, dwpe.dtype)
