"""The NumPy twin of ``kernels/bucketing.cu``: the GPU's bucket table, built phase by phase.

Read it beside the kernel. Each phase of ``bucketing_kernel`` (the parts between two ``grid.sync()``) is one
function here with the kernel's name or comment, working on the same buffers (``BucketingWorkspace``, the
kernel's workspace arguments by name), vectorised over the kernel's threads:

0. ``clear_workspace``: zero what accumulates (counts, presence, counters).
1. ``count_tokens``: ``counts[ix]`` and the number of distinct tokens.
2. ``mark_count_values``: ``presence[count] = 1`` for every count that occurs, and the largest count.
3. ``count_classes``: class of a count value = how many larger values occur (a reversed ``grid_scan_inplace``).
4. ``sort_tokens_by_class``: a stable ``radix_sort`` of the tokens 0..V-1 by class: the bucket order.
5. ``rank_tokens``: each token's rank, and each rank's start in ``bt_list`` and in the unit list (two scans).
6. ``sort_positions_by_rank``: a stable ``radix_sort`` of the positions bt by their token's rank: ``bt_list``.
7. ``write_table``: ``bucket_info`` and ``units``, per rank.

A radix pass is three steps, as in the kernel: ``radix_histogram`` (one digit histogram per block, stored
block-major), ``radix_offsets`` (where each block's items of each digit go) and ``radix_scatter`` (the stable
scatter). The grid's blocks are emulated where the kernel's buffers depend on them: each block owns one
contiguous stretch of the input (``block_ranges``), so the histograms and scan block sums in ``hist`` equal
the kernel's for the same number of blocks. The table itself does not depend on it.

``bucketing_kernel(inp, C, dtype, V)`` runs every phase and returns the ``BucketTable`` that
``buckets.build_bucket_table`` builds (and the GPU kernel writes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import (
    CHUNK_ITEMS,
    COUNTER_MAX_COUNT,
    COUNTER_NUM_BUCKETS,
    COUNTER_NUM_DISTINCT,
    COUNTER_NUM_UNITS,
    NUM_COUNTERS,
    RADIX_BITS,
    RADIX_DIGITS,
    ceil_div,
    num_c_groups,
)
from .host import BucketTable

__all__ = [
    "BucketingWorkspace",
    "block_ranges",
    "bucketing_kernel",
    "clear_workspace",
    "count_classes",
    "count_tokens",
    "grid_scan_inplace",
    "make_workspace",
    "mark_count_values",
    "radix_histogram",
    "radix_offsets",
    "radix_pass",
    "radix_scatter",
    "radix_sort",
    "rank_tokens",
    "sort_positions_by_rank",
    "sort_tokens_by_class",
    "write_table",
]


@dataclass
class BucketingWorkspace:
    """The kernel's workspace arguments, by name and size (int32; ``keys*`` uint32), and the grid's size.

    ``counts`` [V], ``presence`` [BT + 1], ``keys0``/``vals0``/``keys1``/``vals1`` [max(V, BT)],
    ``hist`` [RADIX_DIGITS * num_blocks] (also the scans' block sums), ``rank_of_ix``, ``token_starts``,
    ``unit_starts`` [V], ``counters`` [NUM_COUNTERS].
    """

    counts: np.ndarray
    presence: np.ndarray
    keys0: np.ndarray
    vals0: np.ndarray
    keys1: np.ndarray
    vals1: np.ndarray
    hist: np.ndarray
    rank_of_ix: np.ndarray
    token_starts: np.ndarray
    unit_starts: np.ndarray
    counters: np.ndarray
    num_blocks: int


def make_workspace(BT: int, V: int, num_blocks: int, fill: int = 0) -> BucketingWorkspace:
    """Buffers as ``gpu`` allocates them; ``fill`` stands for what uninitialised memory holds."""
    n = max(V, BT)

    def ints(size):
        return np.full(size, fill, dtype=np.int32)

    return BucketingWorkspace(
        counts=ints(V), presence=ints(BT + 1), keys0=ints(n).view(np.uint32), vals0=ints(n),
        keys1=ints(n).view(np.uint32), vals1=ints(n), hist=ints(RADIX_DIGITS * num_blocks), rank_of_ix=ints(V),
        token_starts=ints(V), unit_starts=ints(V), counters=ints(NUM_COUNTERS), num_blocks=num_blocks)


def block_ranges(n: int, num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Each block's stretch ``[lo, hi)`` of ``n`` items: ``per = CEIL_DIV(n, G)``, ``lo = min(n, b * per)``."""
    per = ceil_div(n, num_blocks)
    lo = np.minimum(n, np.arange(num_blocks) * per)
    return lo, np.minimum(n, lo + per)


def _block_of(n: int, num_blocks: int) -> np.ndarray:
    """The block that owns each of items 0..n-1 (the stretches are contiguous, in block order)."""
    lo, hi = block_ranges(n, num_blocks)
    return np.repeat(np.arange(num_blocks), hi - lo)


# ----------------------------------------------------------------------------------------------------------
# Grid-wide helpers: the scan and the radix sort.


def grid_scan_inplace(data: np.ndarray, n: int, reversed: bool, block_sums: np.ndarray, num_blocks: int) -> int:
    """In-place exclusive prefix sum of ``data[0..n)``; returns the total. ``reversed`` scans from the end.

    As the kernel: every block sums its stretch into ``block_sums[block]`` (pass 1), then rewrites the
    stretch with running prefixes that start at the sum of the blocks before it (pass 2).
    """
    order = np.arange(n)
    j = n - 1 - order if reversed else order  # the scan's i-th element is data[j]
    values = data[j].astype(np.int64)
    block = _block_of(n, num_blocks)
    # Pass 1: stretch sums.
    stretch_sum = np.bincount(block, weights=values, minlength=num_blocks).astype(np.int64)
    block_sums[:num_blocks] = stretch_sum
    # Pass 2: every block starts at the sum of the blocks before it, then adds its own running prefix.
    before = np.cumsum(stretch_sum) - stretch_sum
    within = np.cumsum(values) - values - before[block]  # block_exclusive_sum over the block's tiles
    data[j] = before[block] + within
    return int(stretch_sum.sum())


def radix_histogram(keys_in: np.ndarray, n: int, shift: int, hist: np.ndarray, num_blocks: int) -> np.ndarray:
    """Step 1 of a pass: each block's digit histogram, block-major ``hist[block * RADIX_DIGITS + digit]``."""
    digit = ((keys_in[:n] >> np.uint32(shift)) & np.uint32(RADIX_DIGITS - 1)).astype(np.int64)
    block = _block_of(n, num_blocks)
    hist[: num_blocks * RADIX_DIGITS] = np.bincount(block * RADIX_DIGITS + digit, minlength=num_blocks * RADIX_DIGITS)
    return digit


def radix_offsets(hist: np.ndarray, num_blocks: int) -> np.ndarray:
    """Step 2: ``running[block, digit]``, where a block's first item of a digit goes.

    After all smaller digits of every block (``digit_base``, an exclusive scan of the digit totals), and
    after the same digit in earlier blocks (``digit_before``). Every block reads the whole histogram.
    """
    counts = hist[: num_blocks * RADIX_DIGITS].reshape(num_blocks, RADIX_DIGITS).astype(np.int64)
    digit_total = counts.sum(axis=0)
    digit_base = np.cumsum(digit_total) - digit_total
    digit_before = np.cumsum(counts, axis=0) - counts
    return digit_base[None, :] + digit_before


def radix_scatter(keys_in, vals_in, keys_out, vals_out, n: int, digit: np.ndarray, running: np.ndarray,
                  num_blocks: int) -> None:
    """Step 3: the stable scatter. An item goes to ``running[block, digit]`` plus its rank among the items of
    the same digit before it in its block's stretch (the kernel ranks inside a warp with
    ``__match_any_sync``, across warps and tiles with shared counters: the same number)."""
    block = _block_of(n, num_blocks)
    group = block * RADIX_DIGITS + digit
    order = np.argsort(group, kind="stable")  # items grouped by (block, digit), in input order inside
    sorted_group = group[order]
    first_of_group = np.searchsorted(sorted_group, sorted_group, side="left")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - first_of_group
    position = running[block, digit] + rank
    keys_out[position] = keys_in[:n]
    vals_out[position] = vals_in[:n]


def radix_pass(keys_in, vals_in, keys_out, vals_out, n: int, shift: int, hist, num_blocks: int) -> None:
    """One stable counting-sort pass by the digit ``(key >> shift) & 0xFF``: histogram, offsets, scatter."""
    digit = radix_histogram(keys_in, n, shift, hist, num_blocks)
    running = radix_offsets(hist, num_blocks)
    radix_scatter(keys_in, vals_in, keys_out, vals_out, n, digit, running, num_blocks)


def radix_sort(keys0, vals0, keys1, vals1, n: int, max_key: int, hist, num_blocks: int) -> bool:
    """Radix-sort n pairs with keys ``<= max_key``, ping-ponging buffers 0 and 1; True if it ended in 1.

    Passes run while the keys still have non-zero higher digits (the first pass always runs).
    """
    in_one = False
    shift = 0
    while shift == 0 or (shift < 32 and (max_key >> shift) != 0):
        if in_one:
            radix_pass(keys1, vals1, keys0, vals0, n, shift, hist, num_blocks)
        else:
            radix_pass(keys0, vals0, keys1, vals1, n, shift, hist, num_blocks)
        in_one = not in_one
        shift += RADIX_BITS
    return in_one


# ----------------------------------------------------------------------------------------------------------
# The phases of bucketing_kernel, in order.


def clear_workspace(ws: BucketingWorkspace) -> None:
    """Phase 0: clear what accumulates."""
    ws.counts[:] = 0
    ws.presence[:] = 0
    ws.counters[:] = 0


def count_tokens(ws: BucketingWorkspace, inp: np.ndarray) -> None:
    """Phase 1: count each token (``atomicAdd``); a token's first occurrence also counts a distinct token."""
    ws.counts += np.bincount(inp, minlength=ws.counts.size).astype(np.int32)
    ws.counters[COUNTER_NUM_DISTINCT] += np.count_nonzero(ws.counts)


def mark_count_values(ws: BucketingWorkspace) -> None:
    """Phase 2: which count values occur (``presence[count] = 1``), and the largest one (``atomicMax``)."""
    present = ws.counts[ws.counts > 0]
    ws.presence[present] = 1
    ws.counters[COUNTER_MAX_COUNT] = max(int(ws.counters[COUNTER_MAX_COUNT]), int(present.max(initial=0)))


def count_classes(ws: BucketingWorkspace) -> int:
    """Phase 3: ``presence[count]`` becomes the class of that count (how many larger counts occur).

    A reversed exclusive scan of ``presence[1 .. max_count]``; returns the number of classes.
    """
    max_count = int(ws.counters[COUNTER_MAX_COUNT])
    return grid_scan_inplace(ws.presence[1:], max_count, True, ws.hist, ws.num_blocks)


def sort_tokens_by_class(ws: BucketingWorkspace, num_classes: int) -> bool:
    """Phase 4: tokens 0..V-1 stably sorted by class (absent tokens get class ``num_classes``, sort last).

    Tokens end by count descending, ties by id ascending: the bucket order. True if it ended in buffer 1.
    """
    V = ws.counts.size
    ws.keys0[:V] = np.where(ws.counts > 0, ws.presence[ws.counts], num_classes).astype(np.uint32)
    ws.vals0[:V] = np.arange(V)
    return radix_sort(ws.keys0, ws.vals0, ws.keys1, ws.vals1, V, num_classes, ws.hist, ws.num_blocks)


def rank_tokens(ws: BucketingWorkspace, tokens_in_one: bool, num_c_groups: int) -> None:
    """Phase 5: ranks, each rank's start in ``bt_list`` and in the unit list (two grid-wide exclusive scans),
    and the table's sizes in ``counters``."""
    token_of_rank = ws.vals1 if tokens_in_one else ws.vals0
    num_distinct = int(ws.counters[COUNTER_NUM_DISTINCT])
    ix = token_of_rank[:num_distinct]
    count = ws.counts[ix]
    ws.rank_of_ix[ix] = np.arange(num_distinct)
    ws.token_starts[:num_distinct] = count
    ws.unit_starts[:num_distinct] = ceil_div(count, CHUNK_ITEMS)
    grid_scan_inplace(ws.token_starts, num_distinct, False, ws.hist, ws.num_blocks)
    num_units = grid_scan_inplace(ws.unit_starts, num_distinct, False, ws.hist, ws.num_blocks)
    ws.counters[COUNTER_NUM_UNITS] = num_units
    ws.counters[COUNTER_NUM_BUCKETS] = num_distinct * num_c_groups


def sort_positions_by_rank(ws: BucketingWorkspace, inp: np.ndarray, tokens_in_one: bool) -> np.ndarray:
    """Phase 6: positions bt stably sorted by their token's rank (so bt stays ascending inside a token).

    The keys go into the buffer pair the token sort did not leave its result in. Returns the sorted bt.
    """
    BT = inp.size
    pair0 = (ws.keys0, ws.vals0)
    pair1 = (ws.keys1, ws.vals1)
    (keys0, vals0), (keys1, vals1) = (pair0, pair1) if tokens_in_one else (pair1, pair0)
    keys0[:BT] = ws.rank_of_ix[inp].astype(np.uint32)
    vals0[:BT] = np.arange(BT)
    num_distinct = int(ws.counters[COUNTER_NUM_DISTINCT])
    items_in_one = radix_sort(keys0, vals0, keys1, vals1, BT, num_distinct - 1, ws.hist, ws.num_blocks)
    return (vals1 if items_in_one else vals0)[:BT]


def write_table(ws: BucketingWorkspace, inp: np.ndarray, sorted_bt: np.ndarray, num_c_groups: int):
    """Phase 7: ``bt_list`` is the sorted positions; ``bucket_info`` and ``units`` are written per rank.

    A rank's token is read back from one of its positions (the token sort's buffer was reused), its count
    from the distance to the next rank's start. Returns ``(bucket_info, units, bt_list)``.
    """
    BT = inp.size
    bt_list = sorted_bt.copy()
    num_distinct = int(ws.counters[COUNTER_NUM_DISTINCT])
    start = ws.token_starts[:num_distinct]
    count = np.append(start[1:], BT) - start
    ix = inp[sorted_bt[start]]
    groups = np.arange(num_c_groups)
    bucket_info = np.empty((num_distinct * num_c_groups, 4), dtype=np.int32)
    bucket_info[:, 0] = np.repeat(start, num_c_groups)
    bucket_info[:, 1] = np.repeat(count, num_c_groups)
    bucket_info[:, 2] = np.repeat(ix, num_c_groups)
    bucket_info[:, 3] = np.tile(groups, num_distinct)
    chunks = ceil_div(count, CHUNK_ITEMS)
    units = np.empty((int(ws.counters[COUNTER_NUM_UNITS]), 4), dtype=np.int32)
    unit_rank = np.repeat(np.arange(num_distinct), chunks)
    slot = np.arange(units.shape[0])  # = unit_starts[rank] + chunk, the rank's units being consecutive
    units[:, 0] = ix[unit_rank]
    units[:, 1] = slot - ws.unit_starts[unit_rank]
    units[:, 2] = start[unit_rank]
    units[:, 3] = count[unit_rank]
    return bucket_info, units, bt_list


def bucketing_kernel(inp: np.ndarray, C: int, dtype, V: int, *, num_blocks: int = 1,
                     workspace: BucketingWorkspace | None = None) -> BucketTable:
    """Every phase of ``bucketing_kernel`` in order; returns the table ``buckets.build_bucket_table`` builds.

    ``inp``: (B, T) int32 ids in ``[0, V)`` (validated by the caller). ``num_blocks`` is the cooperative
    grid's size (``layout.cooperative_grid_blocks``); the table does not depend on it, ``hist`` does. Pass a
    ``workspace``
    (``make_workspace``) to keep the intermediate buffers and look at them afterwards.
    """
    flat = np.ascontiguousarray(inp).reshape(-1)
    ws = make_workspace(flat.size, V, num_blocks) if workspace is None else workspace
    groups = num_c_groups(C, dtype)
    clear_workspace(ws)  # phase 0
    count_tokens(ws, flat)  # phase 1
    mark_count_values(ws)  # phase 2
    num_classes = count_classes(ws)  # phase 3
    tokens_in_one = sort_tokens_by_class(ws, num_classes)  # phase 4
    rank_tokens(ws, tokens_in_one, groups)  # phase 5
    sorted_bt = sort_positions_by_rank(ws, flat, tokens_in_one)  # phase 6
    info, units, bt_list = write_table(ws, flat, sorted_bt, groups)  # phase 7
    return BucketTable(info=info, bt_list=bt_list, units=units, C=C, dtype=np.dtype(dtype))
