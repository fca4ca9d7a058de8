"""The bucket table in GPU memory (``DeviceBucketTable``), the bounds it is sized by, and ``to_device``.

The host cannot know a GPU-built table's exact size without waiting for the GPU, so a ``DeviceBucketTable`` carries
upper bounds (``max_buckets``, ``max_units``) for launch grids plus the exact sizes in device memory (``counters``),
which the wte kernels read. ``to_host()`` waits, trims, and returns an ordinary ``BucketTable`` (for tests and plots).
A table built with ``bucket_rows=False`` (``gpu.build_bucket_table_gpu``) says it has no bucket rows
(``has_bucket_rows``), and the readers of those rows refuse it. ``to_device`` gives the wte launchers a table they can
read from either kind.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import plans
from ..layout import (
    CHUNK_ITEMS,
    CHUNKED_WARPS_PER_BLOCK,
    COUNTER_NUM_BUCKETS,
    COUNTER_NUM_UNITS,
    NUM_COUNTERS,
    ceil_div,
)
from ..loader import cupy_module
from .host import BucketTable, rows_of


def max_units(BT: int, V: int) -> int:
    """Most units a table of BT positions can have.

    The sum over tokens of ceil(count / CHUNK_ITEMS) is at most BT (each chunk holds an item) and at most
    BT / CHUNK_ITEMS + (number of distinct tokens) <= BT // CHUNK_ITEMS + 1 + min(V, BT).
    """
    return min(BT, BT // CHUNK_ITEMS + 1 + min(V, BT))


def unit_rows(num_units: int) -> int:
    """Rows of a device unit list: the chunked kernel's grid reads a row for each of its warps, so the list
    is padded (with initialised rows) to whole blocks of ``CHUNKED_WARPS_PER_BLOCK`` warps."""
    return ceil_div(max(num_units, 1), CHUNKED_WARPS_PER_BLOCK) * CHUNKED_WARPS_PER_BLOCK


def max_multi_chunk_units(BT: int) -> int:
    """Most units that belong to tokens of more than one chunk (they need room for partial sums).

    Such a token occurs at least CHUNK_ITEMS + 1 times, so there are at most BT // (CHUNK_ITEMS + 1) of
    them, and their chunks number at most BT / CHUNK_ITEMS + one per token.
    """
    return BT // CHUNK_ITEMS + BT // (CHUNK_ITEMS + 1) + 1


@dataclass(frozen=True)
class DeviceBucketTable:
    """A bucket table in GPU memory, sized by bounds; the exact sizes are in ``counters`` on the device."""

    info: object  # cupy (max_buckets, 4) int32
    bt_list: object  # cupy (BT,) int32
    units: object  # cupy (max_units, 4) int32
    counters: object  # cupy (NUM_COUNTERS,) int32
    C: int
    dtype: np.dtype
    has_bucket_rows: bool = True  # False: ``info`` was not written (built with ``bucket_rows=False``)

    max_buckets = rows_of("info", "A bound on the buckets (rows of ``info``), for launch grids.")
    max_units = rows_of("units", "A bound on the units (rows of ``units``), for launch grids.")
    num_positions = rows_of("bt_list", "B*T: the length of ``bt_list`` (exact, unlike the bounds above).")

    @property
    def num_buckets_device(self):
        """A one-element device view of the bucket count (for kernels)."""
        return self.counters[COUNTER_NUM_BUCKETS : COUNTER_NUM_BUCKETS + 1]

    @property
    def num_units_device(self):
        return self.counters[COUNTER_NUM_UNITS : COUNTER_NUM_UNITS + 1]

    def require_bucket_rows(self, reader: str) -> None:
        """Refuse (ValueError) a table built without its bucket rows, for ``reader``, which reads them."""
        if not self.has_bucket_rows:
            raise ValueError(f"{reader} reads the bucket rows, and this table was built without them "
                             "(build_bucket_table_gpu(..., bucket_rows=False)); build it with bucket_rows=True")

    def copy(self) -> "DeviceBucketTable":
        """The same table in device memory of its own, copied on the current stream.

        A table from ``build_bucket_table_gpu`` lives in its stream's workspace, which the next table of its size
        on that stream overwrites; a copy stays valid as long as it is referenced (a table built ahead of the
        backward, ``encoder_backward(..., buckets=table)``). Rows past the table's size are copied too: the
        wte kernels read them (and skip them).
        """
        return replace(self, info=self.info.copy(), bt_list=self.bt_list.copy(), units=self.units.copy(),
                       counters=self.counters.copy())

    def to_host(self, *, bucket_rows: bool = True) -> BucketTable:
        """Wait for the GPU and return the table as NumPy arrays, trimmed to its real size.

        ``bucket_rows=False`` leaves the bucket rows out (``info`` then has no rows), which a table built without
        them allows; with ``True`` such a table is refused (ValueError).
        """
        if bucket_rows:
            self.require_bucket_rows("to_host()")
        counters = self.counters.get()
        num_buckets, num_units = int(counters[COUNTER_NUM_BUCKETS]), int(counters[COUNTER_NUM_UNITS])
        info = self.info[:num_buckets].get() if bucket_rows else np.empty((0, 4), np.int32)
        return BucketTable(info=info, bt_list=self.bt_list.get(), units=self.units[:num_units].get(), C=self.C,
                           dtype=np.dtype(self.dtype))


def to_device(table) -> DeviceBucketTable:
    """A table the wte kernels can read: a ``DeviceBucketTable`` as it is; a host ``BucketTable`` copied over.

    A host table's sizes are exact, so its ``counters`` hold them and its bounds equal them (llm.c's route:
    the table was built on the CPU and travels to the GPU); its unit list gains zero rows up to ``unit_rows``.
    """
    if isinstance(table, DeviceBucketTable):
        return table
    plans.refuse("a host table is copied over: its contents and the grid it sets belong to this call")
    cupy = cupy_module()
    counters = np.zeros(NUM_COUNTERS, dtype=np.int32)
    counters[COUNTER_NUM_BUCKETS], counters[COUNTER_NUM_UNITS] = table.num_buckets, table.num_units
    units = np.zeros((unit_rows(table.num_units), 4), dtype=np.int32)
    units[: table.num_units] = table.units
    return DeviceBucketTable(info=cupy.asarray(table.info), bt_list=cupy.asarray(table.bt_list),
                             units=cupy.asarray(units), counters=cupy.asarray(counters), C=table.C,
                             dtype=np.dtype(table.dtype))
