"""Phase-by-phase NumPy twin of ``kernels/bucketing_small.cu``: the one-block bucket table of one sequence.

Read it beside the kernel. Each function is one phase (the stretch that ``stop_after`` can end on) and works on
the kernel's elements ``p`` (slots, segments or ranks; thread ``p // SMALL_KEYS`` holds element ``p``),
vectorised with ``np.arange``. Where the kernel splits a scan into a per-thread part and a block part, the twin
takes the one prefix sum that the two add up to.

1. ``sort_positions``: keys ``(id << POS_BITS) | bt`` sorted by ``block_bitonic_sort``.
2. ``find_segments``: one segment per distinct token; its first slot; each slot's segment.
3. ``sort_tokens``: keys ``((SMALL_MAX_BT - count) << POS_BITS) | segment``, sorted the same way.
4. ``write_buckets``: each rank's start in ``bt_list`` and first unit (one scan of two packed fields), then
   its buckets and units.
5. ``write_bt_list``: every sorted slot to its token's new start plus its place in the segment.

``bucketing_small_kernel(inp, C, dtype, V)`` runs them and returns the ``BucketTable``, which equals
``buckets.build_bucket_table`` (``tests/test_mirror_bucketing_small.py`` checks that on many inputs).
"""

from __future__ import annotations

import numpy as np

from .buckets import BucketTable
from .layout import CHUNK_ITEMS, SMALL_MAX_BT, SMALL_MAX_V, ceil_div, num_c_groups

#: ``SMALL_POS_BITS``, ``SMALL_FIELD_BITS`` and ``SMALL_NO_KEY`` of the kernel.
POS_BITS = 10
POS_MASK = np.uint32((1 << POS_BITS) - 1)
FIELD_BITS = 16
NO_KEY = np.uint32(0xFFFFFFFF)


def block_bitonic_sort(key: np.ndarray) -> np.ndarray:
    """``block_bitonic_sort``: ``key[p]`` is element p's key (SMALL_MAX_BT of them); every compare-exchange step of
    the network, in order.

    (The kernel finds the partner ``p ^ j`` in the same thread's registers for j < SMALL_KEYS, through a shuffle
    for j < 32 * SMALL_KEYS and through shared memory above: the same ``key[p ^ j]`` each time.)
    """
    p = np.arange(key.size)
    k = 2
    while k <= key.size:
        ascending = (p & k) == 0
        j = k >> 1
        while j > 0:
            other = key[p ^ j]
            lower = (p & j) == 0
            key = np.where(lower == ascending, np.minimum(key, other), np.maximum(key, other))
            j >>= 1
        k <<= 1
    return key


def sort_positions(inp: np.ndarray) -> np.ndarray:
    """Phase 1: element p's key after the sort (slot p), padding keys last."""
    flat = inp.reshape(-1).astype(np.uint32)
    BT = flat.size
    key = np.full(SMALL_MAX_BT, NO_KEY, dtype=np.uint32)
    key[:BT] = (flat << np.uint32(POS_BITS)) | np.arange(BT, dtype=np.uint32)
    return block_bitonic_sort(key)


def find_segments(key: np.ndarray, BT: int) -> tuple[np.ndarray, np.ndarray]:
    """Phase 2: ``seg_start`` (with ``seg_start[num_distinct] = BT``) and the segment of every slot < BT."""
    p = np.arange(BT)
    ids = key[:BT] >> np.uint32(POS_BITS)
    head = (p == 0) | (ids != np.roll(ids, 1))
    seg = np.cumsum(head) - 1  # heads up to and including slot p, less one
    seg_start = np.append(p[head], BT)
    return seg_start, seg


def sort_tokens(seg_start: np.ndarray) -> np.ndarray:
    """Phase 3: element r's token key after the sort: the token of rank r (count descending, then id)."""
    num_distinct = seg_start.size - 1
    count = np.diff(seg_start).astype(np.uint32)
    token_key = np.full(SMALL_MAX_BT, NO_KEY, dtype=np.uint32)
    token_key[:num_distinct] = ((np.uint32(SMALL_MAX_BT) - count) << np.uint32(POS_BITS)) | np.arange(
        num_distinct, dtype=np.uint32)
    return block_bitonic_sort(token_key)


def write_buckets(key, seg_start, token_key, groups: int):
    """Phase 4: ``seg_new_start`` per segment, the bucket and unit lists, and the counters (as a dict)."""
    num_distinct = seg_start.size - 1
    ranked = token_key[:num_distinct]
    s = (ranked & POS_MASK).astype(np.int64)
    count = SMALL_MAX_BT - (ranked >> np.uint32(POS_BITS)).astype(np.int64)
    chunks = ceil_div(count, CHUNK_ITEMS)
    field = count | (chunks << FIELD_BITS)
    packed = np.cumsum(field) - field  # block_exclusive_sum of the packed fields
    start, unit = packed & ((1 << FIELD_BITS) - 1), packed >> FIELD_BITS
    ix = (key[seg_start[s]] >> np.uint32(POS_BITS)).astype(np.int64)
    seg_new_start = np.empty(num_distinct, dtype=np.int64)
    seg_new_start[s] = start
    row = np.arange(num_distinct * groups)
    info = np.stack([start[row // groups], count[row // groups], ix[row // groups], row % groups], axis=1)
    units = np.empty((int(chunks.sum()), 4), dtype=np.int32)  # rank r writes rows unit[r] ... + chunks[r] - 1
    units[:, 0], units[:, 2], units[:, 3] = np.repeat(ix, chunks), np.repeat(start, chunks), np.repeat(count, chunks)
    units[:, 1] = np.arange(units.shape[0]) - np.repeat(unit, chunks)
    class_head = np.concatenate(([True], count[1:] != count[:-1]))
    counters = {"num_distinct": num_distinct, "max_count": int(count[0]), "num_classes": int(class_head.sum()),
                "num_buckets": num_distinct * groups, "num_units": int(field.sum() >> FIELD_BITS)}
    return seg_new_start, info.astype(np.int32), units, counters


def write_bt_list(key, seg_start, seg, seg_new_start, BT: int) -> np.ndarray:
    """Phase 5: ``bt_list[seg_new_start[seg] + (p - seg_start[seg])] = bt of slot p``."""
    p = np.arange(BT)
    bt_list = np.empty(BT, dtype=np.int32)
    bt_list[seg_new_start[seg] + (p - seg_start[seg])] = key[:BT] & POS_MASK
    return bt_list


def bucketing_small_kernel(inp: np.ndarray, C: int, dtype, V: int) -> BucketTable:
    """All five phases for (B, T) ids in [0, V), B*T <= SMALL_MAX_BT, V <= SMALL_MAX_V: the bucket table."""
    BT = int(inp.size)
    if not 1 <= BT <= SMALL_MAX_BT or V > SMALL_MAX_V:
        raise ValueError(f"the one-block kernel takes 1..{SMALL_MAX_BT} ids and V <= {SMALL_MAX_V}")
    key = sort_positions(inp)
    seg_start, seg = find_segments(key, BT)
    token_key = sort_tokens(seg_start)
    seg_new_start, info, units, _ = write_buckets(key, seg_start, token_key, num_c_groups(C, dtype))
    bt_list = write_bt_list(key, seg_start, seg, seg_new_start, BT)
    return BucketTable(info=info, bt_list=bt_list, units=units, C=C, dtype=np.dtype(dtype))
