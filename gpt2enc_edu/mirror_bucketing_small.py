"""Phase-by-phase NumPy twin of ``kernels/bucketing_small.cu``: the one-block bucket table of small batches.

Read it beside the kernel. Each function is one phase (the stretch between two ``__syncthreads`` that
``stop_after`` can end on) and keeps the kernel's data layout: the keys in shared memory, padded to whole
tiles of ``SMALL_THREADS``; the count table of a radix pass in (digit, tile, warp) order; the blocked
arrangement of the scans (thread i owns items ``i * items ...``). Threads are vectorised with ``np.arange``.

1. ``sort_positions``: keys ``(id << POS_BITS) | bt`` sorted by their id bits, 4 bits per ``sort_pass``.
2. ``find_segments``: one segment per distinct token; its first slot; the largest count.
3. ``sort_tokens``: keys ``((max_count - count) << POS_BITS) | segment`` sorted by their count bits.
4. ``write_buckets``: each rank's start in ``bt_list`` and first unit (scans), then its buckets and units.
5. ``write_bt_list``: every sorted slot to its token's new start plus its place in the segment.

``bucketing_small_kernel(inp, C, dtype, V)`` runs them and returns the ``BucketTable``, which equals
``buckets.build_bucket_table`` (``tests/test_mirror_bucketing_small.py`` checks that on many inputs).
"""

from __future__ import annotations

import numpy as np

from .buckets import BucketTable
from .layout import CHUNK_ITEMS, SMALL_MAX_BT, SMALL_MAX_V, SMALL_THREADS, WARP_SIZE, ceil_div, num_c_groups

#: ``SMALL_POS_BITS``, ``SMALL_DIGIT_BITS``, ``SMALL_MAX_ITEMS`` of the kernel.
POS_BITS = 13
DIGIT_BITS = 4
MAX_ITEMS = SMALL_MAX_BT // SMALL_THREADS
NO_KEY = np.uint32(0xFFFFFFFF)
WARPS = SMALL_THREADS // WARP_SIZE


def bits_for(max_value: int) -> int:
    """``bits_for``: bits needed to write 0 .. max_value (``32 - __clz``)."""
    return int(max_value).bit_length()


def sort_pass(keys: np.ndarray, items: int, shift: int) -> np.ndarray:
    """One stable pass by the digit ``(key >> shift) & 15``: thread t holds keys t, t + 1024, ... (tile i)."""
    n = items * SMALL_THREADS
    key = keys[:n]
    digit = ((key >> np.uint32(shift)) & np.uint32((1 << DIGIT_BITS) - 1)).astype(np.int64)
    element = np.arange(n)
    tile, thread = np.divmod(element, SMALL_THREADS)
    warp = thread // WARP_SIZE
    # Rank among the lanes of the same warp and tile with the same digit (the ballots' popcount).
    same = digit.reshape(-1, WARP_SIZE)[:, :, None] == digit.reshape(-1, WARP_SIZE)[:, None, :]
    earlier = np.tril(np.ones((WARP_SIZE, WARP_SIZE), dtype=bool), -1)  # [lane, other lane < lane]
    rank = (same & earlier).sum(axis=2).reshape(-1)
    # cnt[(digit * MAX_ITEMS + tile) * WARPS + warp], then its exclusive scan in that flat order.
    cnt = np.zeros((1 << DIGIT_BITS) * MAX_ITEMS * WARPS, dtype=np.int64)
    np.add.at(cnt, (digit * MAX_ITEMS + tile) * WARPS + warp, 1)
    offsets = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    position = offsets[(digit * MAX_ITEMS + tile) * WARPS + warp] + rank
    out = keys.copy()
    out[position] = key
    return out


def sort_bits(keys: np.ndarray, items: int, low_bit: int, bits: int) -> np.ndarray:
    for shift in range(low_bit, low_bit + bits, DIGIT_BITS):
        keys = sort_pass(keys, items, shift)
    return keys


def sort_positions(inp: np.ndarray, V: int) -> tuple[np.ndarray, int]:
    """Phase 1: the padded key array, sorted by token id (bt ascending inside a token); and ``items``."""
    flat = inp.reshape(-1).astype(np.uint32)
    BT = flat.size
    items = ceil_div(BT, SMALL_THREADS)
    keys = np.full(items * SMALL_THREADS, NO_KEY, dtype=np.uint32)
    keys[:BT] = (flat << np.uint32(POS_BITS)) | np.arange(BT, dtype=np.uint32)
    return sort_bits(keys, items, POS_BITS, bits_for(V - 1)), items


def _heads(keys: np.ndarray, BT: int) -> np.ndarray:
    ids = keys[:BT] >> np.uint32(POS_BITS)
    return np.concatenate(([True], ids[1:] != ids[:-1]))


def find_segments(keys: np.ndarray, BT: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Phase 2: ``seg_start`` (with ``seg_start[D] = BT``), the segment of every slot, and the largest count."""
    heads = _heads(keys, BT)
    seg_of = np.cumsum(heads) - 1
    seg_start = np.append(np.flatnonzero(heads), BT)
    return seg_start, seg_of, int(np.diff(seg_start).max())


def sort_tokens(seg_start: np.ndarray, max_count: int) -> np.ndarray:
    """Phase 3: segments sorted by count descending, ties by id (the keys start in id order)."""
    D = seg_start.size - 1
    token_items = ceil_div(D, SMALL_THREADS)
    token_keys = np.full(token_items * SMALL_THREADS, NO_KEY, dtype=np.uint32)
    count = np.diff(seg_start).astype(np.uint32)
    token_keys[:D] = ((np.uint32(max_count) - count) << np.uint32(POS_BITS)) | np.arange(D, dtype=np.uint32)
    return sort_bits(token_keys, token_items, POS_BITS, bits_for(max_count - 1))


def write_buckets(keys, seg_start, token_keys, max_count: int, groups: int):
    """Phase 4: ``seg_new_start`` per segment and the bucket and unit lists in rank order."""
    D = seg_start.size - 1
    ranked = token_keys[:D]
    seg = (ranked & np.uint32((1 << POS_BITS) - 1)).astype(np.int64)
    count = max_count - (ranked >> np.uint32(POS_BITS)).astype(np.int64)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))  # the blocked scans add up to the same prefixes
    chunks = ceil_div(count, CHUNK_ITEMS)
    first_unit = np.concatenate(([0], np.cumsum(chunks)[:-1]))
    seg_new_start = np.empty(D, dtype=np.int64)
    seg_new_start[seg] = start
    ix = (keys[seg_start[seg]] >> np.uint32(POS_BITS)).astype(np.int64)
    info = np.empty((D * groups, 4), dtype=np.int32)
    info[:, 0], info[:, 1] = np.repeat(start, groups), np.repeat(count, groups)
    info[:, 2], info[:, 3] = np.repeat(ix, groups), np.tile(np.arange(groups), D)
    units = np.empty((int(chunks.sum()), 4), dtype=np.int32)
    units[:, 0] = np.repeat(ix, chunks)
    units[:, 1] = np.arange(units.shape[0]) - np.repeat(first_unit, chunks)
    units[:, 2], units[:, 3] = np.repeat(start, chunks), np.repeat(count, chunks)
    return seg_new_start, info, units


def write_bt_list(keys, seg_start, seg_of, seg_new_start, BT: int) -> np.ndarray:
    """Phase 5: ``bt_list[seg_new_start[s] + (j - seg_start[s])] = bt of slot j``."""
    j = np.arange(BT)
    bt_list = np.empty(BT, dtype=np.int32)
    bt_list[seg_new_start[seg_of] + (j - seg_start[seg_of])] = keys[:BT] & np.uint32((1 << POS_BITS) - 1)
    return bt_list


def bucketing_small_kernel(inp: np.ndarray, C: int, dtype, V: int) -> BucketTable:
    """All five phases for (B, T) ids in [0, V), B*T <= SMALL_MAX_BT, V <= SMALL_MAX_V: the bucket table."""
    BT = int(inp.size)
    if not 1 <= BT <= SMALL_MAX_BT or V > SMALL_MAX_V:
        raise ValueError(f"the one-block kernel takes 1..{SMALL_MAX_BT} ids and V <= {SMALL_MAX_V}")
    keys, _ = sort_positions(inp, V)
    seg_start, seg_of, max_count = find_segments(keys, BT)
    token_keys = sort_tokens(seg_start, max_count)
    seg_new_start, info, units = write_buckets(keys, seg_start, token_keys, max_count, num_c_groups(C, dtype))
    bt_list = write_bt_list(keys, seg_start, seg_of, seg_new_start, BT)
    return BucketTable(info=info, bt_list=bt_list, units=units, C=C, dtype=np.dtype(dtype))
