"""The NumPy twin of ``kernels/bucketing_scatter.cu``: the scatter route's bucket table, kernel by kernel.

Read it beside the kernels. Each function has the name of one kernel, works on the same buffers (a
``ScatterWorkspace``, the kernels' arguments by name) and is vectorised over that kernel's threads:

0. ``clear_counts``: the zeros ``counts`` must hold when kernel 1 starts (a fresh workspace's; kernel 4 leaves
   them so for the next table, and the package clears them only after a run stopped early).
1. ``scatter_count_kernel``: ``counts[ix]``, one add per (warp, id) as the warp-aggregated atomics do.
2. ``scatter_classify_kernel``: per tile of 1024 tokens the number of tokens of each class (class c = seen
   exactly c <= 32 times); the big tokens (seen more often) listed, their items and units added up.
3. ``scatter_rows_kernel``: where each class starts in rank order, in ``bt_list`` and in the unit list, from the
   class totals and the big tokens' three numbers (``class_bases_warp``, in every block). Block 0
   (``big_token_rows``): big tokens ranked by their keys (count, then id); their starts, buckets and first units;
   the class bases and the sizes written out. The other blocks (``small_token_rows``, a tile of token ids each):
   each small token's place in its class (earlier tiles + earlier warps of its tile + earlier lanes of its warp),
   its start (arithmetic: the class's tokens all have c items), buckets (unless ``write_bucket_rows`` is off: the
   chunked method's table), unit.
4. ``scatter_positions_kernel``: every position into its token's range at the slot the atomics give.
5. ``scatter_sort_kernel``: each range sorted: big tokens through a bitmap of all positions, small ones (their
   ranges found from the class bases) by counting smaller neighbours (a pool of warps takes them in turn; the twin
   takes them in rank order); the big tokens' units.

Two steps of the GPU depend on timing, not on the data: the order in which kernel 2 lists the big tokens and the
slots kernel 4's atomics hand out. Neither reaches the table (kernel 3 ranks by keys alone; kernel 5 sorts every
range). The twin lists big tokens by id and takes the warps of kernel 4 in order (so every range comes out in
descending bt before kernel 5). ``bucketing_scatter(inp, C, dtype, V)`` runs all of it and returns the
``BucketTable`` that ``buckets.build_bucket_table`` builds (``tests/test_mirror_bucketing_scatter.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import (
    CHUNK_ITEMS,
    COUNTER_BIG_ITEMS,
    COUNTER_BIG_UNITS,
    COUNTER_MAX_COUNT,
    COUNTER_NUM_BIG,
    COUNTER_NUM_BUCKETS,
    COUNTER_NUM_DISTINCT,
    COUNTER_NUM_UNITS,
    NUM_COUNTERS,
    SCATTER_MAX_BT,
    SCATTER_THREADS,
    WARP_SIZE,
    ceil_div,
    num_c_groups,
    scatter_max_big,
)
from .host import BucketTable

#: Rows of ``class_bases`` (``BASE_RANK``, ``BASE_ITEM``, ``BASE_UNIT`` in the kernel file).
BASE_RANK, BASE_ITEM, BASE_UNIT = 0, 1, 2


@dataclass
class ScatterWorkspace:
    """The buffers of the scatter route, named as the kernels' arguments (int32, like the GPU's)."""

    inp: np.ndarray  # (BT,) the ids, flat
    V: int
    num_c_groups: int
    counts: np.ndarray  # (V,)
    tile_totals: np.ndarray  # (num_tiles, CHUNK_ITEMS): [tile, class - 1]
    big_list: np.ndarray  # (scatter_max_big(BT),)
    big_sorted: np.ndarray
    big_unit_starts: np.ndarray
    class_bases: np.ndarray  # (3, CHUNK_ITEMS): [BASE_*, class - 1]
    token_starts: np.ndarray  # (V,)
    bucket_info: np.ndarray  # (min(V, BT) * groups, 4)
    units: np.ndarray  # (BT, 4): enough rows for any table
    bt_list: np.ndarray  # (BT,)
    counters: np.ndarray  # (NUM_COUNTERS,)
    write_bucket_rows: bool = True  # False: kernel 3 writes only the big tokens' rows (kernel 5 reads those)

    @property
    def BT(self) -> int:
        return int(self.inp.size)

    @property
    def num_tiles(self) -> int:
        return ceil_div(self.V, SCATTER_THREADS)


def make_workspace(inp: np.ndarray, C: int, dtype, V: int, *, bucket_rows: bool = True) -> ScatterWorkspace:
    """Buffers for (B, T) ids in [0, V); B*T <= SCATTER_MAX_BT, as the kernels require. ``bucket_rows=False``: the
    chunked method's table (``write_bucket_rows``: the small tokens' bucket rows are left as they are)."""
    flat = np.ascontiguousarray(inp, dtype=np.int32).reshape(-1)
    BT = flat.size
    if not 1 <= BT <= SCATTER_MAX_BT:
        raise ValueError(f"the scatter route takes 1..{SCATTER_MAX_BT} ids, not {BT}")
    groups = num_c_groups(C, dtype)
    i32 = np.int32
    big = scatter_max_big(BT)
    return ScatterWorkspace(
        inp=flat,
        V=int(V),
        num_c_groups=groups,
        counts=np.zeros(V, i32),
        tile_totals=np.zeros((ceil_div(V, SCATTER_THREADS), CHUNK_ITEMS), i32),
        big_list=np.zeros(big, i32),
        big_sorted=np.zeros(big, i32),
        big_unit_starts=np.zeros(big, i32),
        class_bases=np.zeros((3, CHUNK_ITEMS), i32),
        token_starts=np.zeros(V, i32),
        bucket_info=np.zeros((min(V, BT) * groups, 4), i32),
        units=np.zeros((BT, 4), i32),
        bt_list=np.zeros(BT, i32),
        counters=np.zeros(NUM_COUNTERS, i32),
        write_bucket_rows=bool(bucket_rows),
    )


def token_class(count: np.ndarray) -> np.ndarray:
    """``token_class``: the count itself if 1..CHUNK_ITEMS, else 0 (absent or big)."""
    return np.where((count >= 1) & (count <= CHUNK_ITEMS), count, 0)


def rank_among_equal(keys: np.ndarray) -> np.ndarray:
    """For each element: how many earlier elements have the same key (a ballot's popcount of lower lanes)."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    first = np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1]))
    group_start = np.maximum.accumulate(np.where(first, np.arange(keys.size), 0))
    rank = np.empty(keys.size, dtype=np.int64)
    rank[order] = np.arange(keys.size) - group_start
    return rank


def clear_counts(ws: ScatterWorkspace) -> None:
    ws.counts[:] = 0


def scatter_count_kernel(ws: ScatterWorkspace) -> None:
    """One thread per position; per warp, the lowest lane of each id adds the number of its peers."""
    bt = np.arange(ws.BT)
    ix = ws.inp
    ws.counters[[COUNTER_NUM_BIG, COUNTER_BIG_ITEMS, COUNTER_BIG_UNITS]] = 0
    warp = bt // WARP_SIZE
    _, leader, peers = np.unique(warp.astype(np.int64) * ws.V + ix, return_index=True, return_counts=True)
    np.add.at(ws.counts, ix[leader], peers.astype(np.int32))  # the leader = the lowest lane of its id


def scatter_classify_kernel(ws: ScatterWorkspace) -> None:
    """One thread per token id (tiles of SCATTER_THREADS): the class totals of each tile; big tokens listed."""
    ix = np.arange(ws.num_tiles * SCATTER_THREADS)
    count = np.where(ix < ws.V, ws.counts[np.minimum(ix, ws.V - 1)], 0)
    cls = token_class(count)
    tile = ix // SCATTER_THREADS
    ws.tile_totals[:] = 0
    np.add.at(ws.tile_totals, (tile[cls > 0], cls[cls > 0] - 1), 1)
    big = ix[count > CHUNK_ITEMS]  # the GPU appends them in whatever order its atomics run; here by id
    ws.big_list[: big.size] = big
    ws.counters[COUNTER_NUM_BIG] = big.size
    ws.counters[COUNTER_BIG_ITEMS] = count[big].sum()  # integer atomics: the order of the adds does not matter
    ws.counters[COUNTER_BIG_UNITS] = (-(-count[big] // CHUNK_ITEMS)).sum()


def big_key(counts: np.ndarray, ix: np.ndarray) -> np.ndarray:
    """A big token's key: larger comes earlier (count descending, then id ascending)."""
    return (counts[ix].astype(np.uint64) << np.uint64(32)) | (~ix.astype(np.uint32)).astype(np.uint64)


def sum_tile_totals(ws: ScatterWorkspace, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """Warp w sums class w + 1 over all tiles, and over the tiles before ``tile``: (class_totals, tiles_before),
    both indexed [class - 1]."""
    return ws.tile_totals.sum(axis=0), ws.tile_totals[:tile].sum(axis=0)


def class_bases_warp(class_totals: np.ndarray, counters: np.ndarray) -> tuple[np.ndarray, int]:
    """Warp 0, lane l holding class CHUNK_ITEMS - l: two scans over the classes in the order 32, 31, ..., 1, offset
    by the big tokens' three numbers. Returns (base[BASE_*, class - 1], the ballot of lanes whose class has tokens).
    """
    c = CHUNK_ITEMS - np.arange(WARP_SIZE)  # lane -> class
    n = class_totals[c - 1].astype(np.int64)
    tokens_before = np.cumsum(n) - n  # warp_inclusive_sum(n) - n
    items_before = np.cumsum(n * c) - n * c
    base = np.zeros((3, CHUNK_ITEMS), dtype=np.int64)
    base[BASE_RANK, c - 1] = counters[COUNTER_NUM_BIG] + tokens_before
    base[BASE_ITEM, c - 1] = counters[COUNTER_BIG_ITEMS] + items_before
    base[BASE_UNIT, c - 1] = counters[COUNTER_BIG_UNITS] + tokens_before
    has_tokens = int(np.sum((n > 0).astype(np.int64) << np.arange(WARP_SIZE)))  # __ballot_sync(n > 0)
    return base, has_tokens


def big_token_rows(ws: ScatterWorkspace) -> None:
    """Kernel 3's block 0: big tokens ranked (how many keys are larger), their rows; the class bases; the sizes."""
    groups = ws.num_c_groups
    num_big = int(ws.counters[COUNTER_NUM_BIG])
    class_totals, _ = sum_tile_totals(ws, 0)
    big = ws.big_list[:num_big].astype(np.int64)
    keys = big_key(ws.counts, big)
    rank = (keys[None, :] > keys[:, None]).sum(axis=1)
    ws.big_sorted[rank] = big
    # Big tokens in rank order: starts and first units are running (exclusive) sums.
    ix = ws.big_sorted[:num_big].astype(np.int64)
    count = ws.counts[ix].astype(np.int64)
    start = np.cumsum(count) - count
    chunks = -(-count // CHUNK_ITEMS)
    ws.big_unit_starts[:num_big] = np.cumsum(chunks) - chunks
    ws.token_starts[ix] = start
    for g in range(groups):
        ws.bucket_info[np.arange(num_big) * groups + g] = np.stack([start, count, ix, np.full(num_big, g)], axis=1)
    # The classes, and the sizes: class 1 comes last, so its base plus its tokens is the end of the table.
    base, has_tokens = class_bases_warp(class_totals, ws.counters)
    ws.class_bases[:] = base
    distinct = int(base[BASE_RANK, 0] + class_totals[0])
    largest_class = CHUNK_ITEMS - ((has_tokens & -has_tokens).bit_length() - 1) if has_tokens else 0  # __ffs
    ws.counters[COUNTER_NUM_DISTINCT] = distinct
    ws.counters[COUNTER_MAX_COUNT] = int(count[0]) if num_big else largest_class
    ws.counters[COUNTER_NUM_BUCKETS] = distinct * groups
    ws.counters[COUNTER_NUM_UNITS] = int(base[BASE_UNIT, 0] + class_totals[0])


def small_token_rows(ws: ScatterWorkspace, tile: int) -> None:
    """Kernel 3's block ``tile + 1``, one thread per token id of the tile: a small token's place in its class (earlier
    tiles + earlier warps of its tile + earlier lanes of its warp), then its start, buckets (if asked) and unit."""
    groups = ws.num_c_groups
    ix = np.arange(tile * SCATTER_THREADS, min((tile + 1) * SCATTER_THREADS, ws.V))
    cls = token_class(ws.counts[ix])
    warp = (ix % SCATTER_THREADS) // WARP_SIZE
    # warp_counts[warp, class - 1], scanned over the tile's warps (exclusive)
    warp_counts = np.zeros((SCATTER_THREADS // WARP_SIZE, CHUNK_ITEMS), dtype=np.int64)
    small = cls > 0
    np.add.at(warp_counts, (warp[small], cls[small] - 1), 1)
    warp_counts = np.cumsum(warp_counts, axis=0) - warp_counts
    class_totals, tiles_before = sum_tile_totals(ws, tile)
    base, _ = class_bases_warp(class_totals, ws.counters)
    rank_in_warp = rank_among_equal(warp.astype(np.int64) * (CHUNK_ITEMS + 1) + cls)  # among its warp's lanes
    ix, cls, warp, rank_in_warp = ix[small], cls[small], warp[small], rank_in_warp[small]
    place = tiles_before[cls - 1] + warp_counts[warp, cls - 1] + rank_in_warp
    rank = base[BASE_RANK, cls - 1] + place
    start = base[BASE_ITEM, cls - 1] + place * cls
    unit = base[BASE_UNIT, cls - 1] + place
    ws.token_starts[ix] = start
    if ws.write_bucket_rows:
        for g in range(groups):
            ws.bucket_info[rank * groups + g] = np.stack([start, cls, ix, np.full(ix.size, g)], axis=1)
    ws.units[unit] = np.stack([ix, np.zeros_like(ix), start, cls], axis=1)


def scatter_rows_kernel(ws: ScatterWorkspace) -> None:
    """Block 0 ranks the big tokens; blocks 1 .. num_tiles write the small tokens' rows, a tile each. Neither reads
    what the other writes (both take the class bases from the same scan), so the twin runs them in turn."""
    big_token_rows(ws)
    for tile in range(ws.num_tiles):
        small_token_rows(ws, tile)


def scatter_positions_kernel(ws: ScatterWorkspace) -> None:
    """One thread per position: the slot its warp's leader took with atomicSub (warps taken in order here)."""
    bt = np.arange(ws.BT)
    ix = ws.inp
    seen_before = rank_among_equal(ix.astype(np.int64))  # earlier positions of the same token = earlier subtracts
    left = ws.counts[ix] - seen_before  # what atomicSub returned for this lane's share
    ws.bt_list[ws.token_starts[ix] + left - 1] = bt
    ws.counts[:] = 0  # every token counted back down


def scatter_sort_kernel(ws: ScatterWorkspace) -> None:
    """Big tokens: mark every position in a bitmap, read the set bits out in order, write the units.
    Small tokens: the range of rank r from the class bases alone (its class: the smallest c whose first rank is
    <= r, a ballot over the lanes; c positions from the class's first slot + (r - first rank) * c); each position
    moves to ``start`` + how many of its range are smaller."""
    groups = ws.num_c_groups
    num_big = int(ws.counters[COUNTER_NUM_BIG])
    words = ceil_div(ws.BT, WARP_SIZE)
    for rank in range(num_big):
        start, count, ix, _ = ws.bucket_info[rank * groups]
        bitmap = np.zeros(words, dtype=np.uint32)
        bt = ws.bt_list[start : start + count]
        np.bitwise_or.at(bitmap, bt // WARP_SIZE, np.left_shift(np.uint32(1), (bt % WARP_SIZE).astype(np.uint32)))
        bits = np.unpackbits(bitmap.view(np.uint8), bitorder="little")  # bit b of word w at w * 32 + b
        ws.bt_list[start : start + count] = np.flatnonzero(bits)
        chunk = np.arange(ceil_div(int(count), CHUNK_ITEMS))
        ws.units[ws.big_unit_starts[rank] + chunk] = np.stack(
            [np.full(chunk.size, ix), chunk, np.full(chunk.size, start), np.full(chunk.size, count)], axis=1
        )
    end = int(ws.class_bases[BASE_RANK, 0])  # class 1's first rank: its single positions are sorted already
    class_rank = ws.class_bases[BASE_RANK].astype(np.int64)  # lane l: class l + 1
    class_item = ws.class_bases[BASE_ITEM].astype(np.int64)
    rank = np.arange(num_big, end)  # the pool's ranks (a warp each, in turn)
    at_or_before = class_rank[None, :] <= rank[:, None]  # the ballot of each rank's warp
    count = at_or_before.argmax(axis=1) + 1  # __ffs: its class, the lowest lane whose class starts at or before it
    start = class_item[count - 1] + (rank - class_rank[count - 1]) * count
    for first, n in zip(start, count):
        bt = ws.bt_list[first : first + n].copy()
        place = (bt[None, :] < bt[:, None]).sum(axis=1)  # lane i: how many lanes hold a smaller position
        ws.bt_list[first + place] = bt


KERNELS = (
    clear_counts,
    scatter_count_kernel,
    scatter_classify_kernel,
    scatter_rows_kernel,
    scatter_positions_kernel,
    scatter_sort_kernel,
)


def bucketing_scatter(
    inp: np.ndarray, C: int, dtype, V: int, *, workspace: ScatterWorkspace | None = None
) -> BucketTable:
    """All steps for (B, T) ids in [0, V), B*T <= SCATTER_MAX_BT: the bucket table (``buckets.BucketTable``). A
    ``workspace`` made with ``bucket_rows=False`` gives the chunked method's table: no bucket rows (``info`` empty)."""
    ws = workspace if workspace is not None else make_workspace(inp, C, dtype, V)
    for kernel in KERNELS:
        kernel(ws)
    num_buckets, num_units = int(ws.counters[COUNTER_NUM_BUCKETS]), int(ws.counters[COUNTER_NUM_UNITS])
    return BucketTable(
        info=ws.bucket_info[:num_buckets].copy() if ws.write_bucket_rows else np.empty((0, 4), np.int32),
        bt_list=ws.bt_list.copy(),
        units=ws.units[:num_units].copy(),
        C=int(C),
        dtype=np.dtype(dtype),
    )


__all__ = [
    "KERNELS",
    "ScatterWorkspace",
    "big_key",
    "big_token_rows",
    "class_bases_warp",
    "small_token_rows",
    "sum_tile_totals",
    "bucketing_scatter",
    "make_workspace",
    "rank_among_equal",
    "token_class",
    *(k.__name__ for k in KERNELS),
]
