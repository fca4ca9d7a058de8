"""The bucket table that the deterministic wte kernel consumes.

Why buckets: dwte[ix] receives one gradient row from every position where token ``ix`` occurs. Letting
each position add its row with atomics is fast but the order of the adds (and so the low bits of the
result) changes from run to run. Instead we first *group the positions by token*, then give each group
to one thread block that adds them in a fixed order.

A bucket is one token id ``ix`` times one channel group of ``c_per_group(dtype)`` channels (256 for bf16,
128 for fp32: a warp of 128-bit packs). Splitting a row into groups gives long rows several blocks.

The table, in a documented order that does not depend on the platform or on hashing:

* ``info[bucket] = (start, size, ix, c_group)``, int32;
* buckets sorted by size descending (the GPU starts the longest work first), ties broken by token id
  ascending, then channel group ascending;
* ``bt_list[start : start + size]`` lists the positions ``bt = b*T + t`` of token ``ix`` in ascending
  order. All channel groups of one token share the same range, so ``bt_list`` has exactly B*T entries.
* ``units[u] = (ix, chunk, start, size)``, int32: the work list of the chunked wte kernel. Each token's
  positions are cut into chunks of ``CHUNK_ITEMS`` consecutive items (the last one shorter); a unit is
  one chunk of one token, over all channel groups. Tokens come in bucket order, chunks ascending, and
  ``start``/``size`` repeat the token's range in ``bt_list``. Tokens with more than one chunk come first
  (they are the most frequent), so their units are a prefix of the list: only those need room for
  partial sums.

Both the NumPy route (``build_bucket_table``) and the GPU route (``gpu.build_bucket_table_gpu``)
produce exactly this table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..backend import is_cupy_array
from ..layout import CHUNK_ITEMS, c_per_group, ceil_div, num_c_groups


def rows_of(field: str, doc: str) -> property:
    """A property: the number of rows of the table's array ``field`` (host and device tables alike)."""
    return property(lambda self: int(getattr(self, field).shape[0]), doc=doc)


@dataclass(frozen=True)
class BucketTable:
    """A bucket table: ``info`` (num_buckets, 4), ``bt_list`` (B*T,) and ``units`` (num_units, 4), int32.

    The arrays are NumPy arrays from ``make_buckets``; tables built on the GPU hold CuPy arrays.
    """

    info: np.ndarray
    bt_list: np.ndarray
    units: np.ndarray
    C: int
    dtype: np.dtype

    num_buckets = rows_of("info", "Buckets (token, channel group) in the table.")
    num_units = rows_of("units", "Units (token, chunk) in the table.")

    #: The columns of ``info``: each bucket's start in ``bt_list``, its items (occurrences of its token, descending),
    #: its token and its channel group.
    starts, sizes, token_ids, c_groups = (property(lambda self, i=i: self.info[:, i]) for i in range(4))

    @property
    def num_c_groups(self) -> int:
        return num_c_groups(self.C, self.dtype)

    @property
    def c_per_group(self) -> int:
        return c_per_group(self.dtype)

    def __repr__(self) -> str:
        return (
            f"BucketTable({self.num_buckets} buckets of {self.c_per_group} channels, {self.num_units} units, "
            f"{self.bt_list.shape[0]} positions, C={self.C}, dtype={self.dtype.name})"
        )


def build_bucket_table(inp: np.ndarray, C: int, dtype) -> BucketTable:
    """Group positions by token and order the buckets (NumPy; arguments already validated)."""
    flat = inp.reshape(-1)
    # 1. The key of a position is its token id. A stable sort by it lists each token's positions in
    #    ascending bt order, which fixes the order in which the kernel will add them.
    by_token = np.argsort(flat, kind="stable").astype(np.int32)
    token_ids, first, counts = np.unique(flat[by_token], return_index=True, return_counts=True)
    # 2. Largest first, ties by token id (np.lexsort sorts by the last key first).
    token_order = np.lexsort((token_ids, -counts))
    token_ids, first, counts = token_ids[token_order], first[token_order], counts[token_order]
    # 3. Lay the groups out in that order: new_start is where each token's positions go in bt_list.
    new_start = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=new_start[1:])
    gather = np.arange(flat.size) + np.repeat(first - new_start, counts)
    bt_list = by_token[gather]
    # 4. One bucket per (token, channel group), the groups of a token next to each other.
    groups = num_c_groups(C, dtype)
    info = np.empty((token_ids.size * groups, 4), dtype=np.int32)
    info[:, 0] = np.repeat(new_start, groups)
    info[:, 1] = np.repeat(counts, groups)
    info[:, 2] = np.repeat(token_ids, groups)
    info[:, 3] = np.tile(np.arange(groups), token_ids.size)
    # 5. Cut every token's positions into chunks of CHUNK_ITEMS items: one unit of work per (token, chunk).
    chunks = ceil_div(counts, CHUNK_ITEMS)
    first_unit = np.zeros_like(chunks)
    np.cumsum(chunks[:-1], out=first_unit[1:])
    units = np.empty((int(chunks.sum()), 4), dtype=np.int32)
    units[:, 0] = np.repeat(token_ids, chunks)
    units[:, 1] = np.arange(units.shape[0]) - np.repeat(first_unit, chunks)
    units[:, 2] = np.repeat(new_start, chunks)
    units[:, 3] = np.repeat(counts, chunks)
    return BucketTable(info=info, bt_list=np.ascontiguousarray(bt_list, dtype=np.int32), units=units, C=C,
                       dtype=np.dtype(dtype))


def same_table(a: BucketTable, b: BucketTable, *, bucket_rows: bool = True) -> bool:
    """Whether host tables ``a`` and ``b`` are the same table, array for array (``bucket_rows=False``: leave the
    bucket rows ``info`` out, for a table built without them)."""
    fields = ("info", "bt_list", "units") if bucket_rows else ("bt_list", "units")
    return (a.C == b.C and np.dtype(a.dtype) == np.dtype(b.dtype)
            and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields))


#: The bucket orders ``reorder_buckets`` names.
BUCKET_ORDERS = ("built", "reversed", "shuffled")


def reorder_buckets(table, order, *, rng=None):
    """``table`` with its bucket rows in another order, for NumPy or CuPy tables; the other arrays are shared.

    ``order``: ``"built"`` (as they are), ``"reversed"`` (smallest bucket first), ``"shuffled"`` (a permutation
    drawn from ``rng``, a ``numpy.random.Generator``), or an index array of rows. The bucketed wte kernels must sum
    every bucket wherever it sits in the list (the size order only makes them faster); the tests, the sanitizer
    and the course's per-thread forms check that on reordered tables.
    """
    n = int(table.info.shape[0])
    if isinstance(order, str):
        if order not in BUCKET_ORDERS:
            raise ValueError(f"order must be one of {BUCKET_ORDERS} or an index array, not {order!r}")
        if order == "shuffled" and rng is None:
            raise ValueError("order='shuffled' needs rng, a numpy.random.Generator")
        order = {"built": lambda: np.arange(n), "reversed": lambda: np.arange(n)[::-1],
                 "shuffled": lambda: rng.permutation(n)}[order]()
    info = table.info[order]
    return replace(table, info=info.copy() if is_cupy_array(info) else np.ascontiguousarray(info))
