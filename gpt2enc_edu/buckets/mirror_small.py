"""Phase-by-phase NumPy twin of ``kernels/bucketing_small.cu``: the one-block bucket table of one sequence.

Read it beside the kernel. Each function is one phase (the stretch that ``stop_after`` can end on) and works on
the kernel's elements ``p`` (slots, segments or ranks; thread ``p // SMALL_KEYS`` holds element ``p``, except in
phase 3), vectorised with ``np.arange``. Where the kernel splits a scan into a per-thread part and a block part,
the twin takes the one prefix sum that the two add up to.

1. ``sort_positions``: keys ``(id << POS_BITS) | bt`` sorted by ``block_bitonic_sort``.
2. ``find_segments``: one segment per distinct token; its first slot; each slot's segment.
3. ``rank_tokens``: each segment's rank by count classes (no sort); element r gets the key
   ``((SMALL_MAX_BT - count) << POS_BITS) | segment`` of the token of rank r.
4. ``write_buckets``: each rank's start in ``bt_list`` and first unit (one scan of two packed fields), then
   its buckets and units.
5. ``write_bt_list``: every sorted slot to its token's new start plus its place in the segment.

``bucketing_small_kernel(inp, C, dtype, V)`` runs them and returns the ``BucketTable``, which equals
``buckets.build_bucket_table`` (``tests/test_mirror_bucketing_small.py`` checks that on many inputs).
"""

from __future__ import annotations

import numpy as np

from ..layout import CHUNK_ITEMS, SMALL_MAX_BT, SMALL_MAX_V, SMALL_POS_BITS, WARP_SIZE, ceil_div, num_c_groups
from .host import BucketTable

#: ``SMALL_POS_BITS`` (constants.cuh), ``SMALL_FIELD_BITS`` and ``SMALL_NO_KEY`` of the kernel.
POS_BITS = SMALL_POS_BITS
POS_MASK = np.uint32((1 << POS_BITS) - 1)
FIELD_BITS = 16
NO_KEY = np.uint32(0xFFFFFFFF)
#: ``SMALL_BIG_CLASS`` and ``SMALL_NO_CLASS``: the class of a token seen more than CHUNK_ITEMS times, and of no token.
BIG_CLASS = 0
NO_CLASS = -1


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


def token_keys(seg_start: np.ndarray) -> np.ndarray:
    """Each segment's key ``((SMALL_MAX_BT - count) << POS_BITS) | segment``, in segment order: sorted ascending,
    these keys give the bucket order (count descending, then id)."""
    count = np.diff(seg_start).astype(np.uint32)
    return ((np.uint32(SMALL_MAX_BT) - count) << np.uint32(POS_BITS)) | np.arange(count.size, dtype=np.uint32)


def rank_tokens(seg_start: np.ndarray) -> np.ndarray:
    """Phase 3: element r's token key after ranking: the token of rank r (count descending, then id).

    Segment s is slot s // SMALL_THREADS of thread s % SMALL_THREADS: lane ``s % 32`` of group ``s // 32``
    (group = slot * SMALL_WARPS + warp: the groups in segment order). Class c = count for counts up to CHUNK_ITEMS,
    ``BIG_CLASS`` above. Ranks: the big tokens first, by comparison; then classes 32, 31, ..., 1, each in
    segment order: the class's first rank + its tokens in the groups before + its lanes below in the group.
    """
    num_distinct = seg_start.size - 1
    s = np.arange(SMALL_MAX_BT)
    group = s // WARP_SIZE
    token_count = np.zeros(SMALL_MAX_BT, dtype=np.int64)
    token_count[:num_distinct] = np.diff(seg_start)
    cls = np.where(token_count == 0, NO_CLASS, np.where(token_count > CHUNK_ITEMS, BIG_CLASS, token_count))
    # __match_any_sync over a group's 32 lanes: peers = the lanes of the same class; below = those of lower lanes.
    by_group = cls.reshape(-1, WARP_SIZE)
    peers = by_group[:, :, None] == by_group[:, None, :]  # [group, lane, other lane]
    below = (peers & (np.arange(WARP_SIZE)[None, :] < np.arange(WARP_SIZE)[:, None])).sum(-1).reshape(-1)
    class_count = np.zeros((SMALL_MAX_BT // WARP_SIZE, CHUNK_ITEMS + 1), dtype=np.int64)  # [group][class]
    leader = (cls != NO_CLASS) & (below == 0)
    class_count[group[leader], cls[leader]] = peers.sum(-1).reshape(-1)[leader]
    # Per class, an exclusive scan over the groups; the totals; each class's first rank (big ones, then 32..1).
    class_total = class_count.sum(axis=0)
    class_count = np.cumsum(class_count, axis=0) - class_count
    descending = np.arange(CHUNK_ITEMS, 0, -1)
    class_base = np.zeros(CHUNK_ITEMS + 1, dtype=np.int64)
    class_base[descending] = class_total[BIG_CLASS] + np.cumsum(class_total[descending]) - class_total[descending]
    big = cls == BIG_CLASS
    big_list = np.empty(class_total[BIG_CLASS], dtype=np.int64)
    big_list[class_count[group[big], BIG_CLASS] + below[big]] = s[big]
    rank = np.zeros(SMALL_MAX_BT, dtype=np.int64)
    small = cls > 0
    rank[small] = class_base[cls[small]] + class_count[group[small], cls[small]] + below[small]
    # A big token: the big tokens that come before it (more items, or as many and a lower segment).
    other_count = token_count[big_list][None, :]
    mine = token_count[big][:, None]
    rank[big] = ((other_count > mine) | ((other_count == mine) & (big_list[None, :] < s[big][:, None]))).sum(-1)
    buf = np.full(SMALL_MAX_BT, NO_KEY, dtype=np.uint32)
    buf[rank[:num_distinct]] = token_keys(seg_start)  # the real segments are 0 .. num_distinct - 1
    return buf


def write_buckets(key, seg_start, token_key, groups: int):
    """Phase 4: ``seg_new_start`` per segment, the bucket and unit lists, and the counters (as a dict).

    (The kernel writes the bucket rows only when asked, ``write_bucket_rows``: the chunked method does not read
    them. The twin always builds them, since the table it returns is the whole table.)
    """
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
    token_key = rank_tokens(seg_start)
    seg_new_start, info, units, _ = write_buckets(key, seg_start, token_key, num_c_groups(C, dtype))
    bt_list = write_bt_list(key, seg_start, seg, seg_new_start, BT)
    return BucketTable(info=info, bt_list=bt_list, units=units, C=C, dtype=np.dtype(dtype))
