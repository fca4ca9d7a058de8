"""The bucket table built on the GPU (``kernels/bucketing.cu``), with no host round trip and no sync.

``build_bucket_table_gpu(inp, C, dtype, V)`` launches one cooperative kernel that writes the same table as
``buckets.build_bucket_table`` (NumPy) into device buffers. The host cannot know the table's exact size
without waiting for the GPU, so a ``DeviceBucketTable`` carries upper bounds (``max_buckets``,
``max_units``) for launch grids plus the exact sizes in device memory (``counters``), which the wte
kernels read. ``to_host()`` waits, trims, and returns an ordinary ``BucketTable`` (for tests and plots).

Buffers come from a per-(device, stream, size) workspace that is reused from call to call, so a table is
valid until the next GPU bucketing of the same size on the same stream; ``to_host()`` copies it out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .buckets import BucketTable
from .layout import (
    BUCKETING_THREADS,
    CHUNK_ITEMS,
    COUNTER_NUM_BUCKETS,
    COUNTER_NUM_UNITS,
    NUM_COUNTERS,
    RADIX_DIGITS,
    ceil_div,
    num_c_groups,
)
from .loader import cupy_module, get_kernel, launch


def max_units(BT: int, V: int) -> int:
    """Most units a table of BT positions can have.

    The sum over tokens of ceil(count / CHUNK_ITEMS) is at most BT (each chunk holds an item) and at most
    BT / CHUNK_ITEMS + (number of distinct tokens) <= BT // CHUNK_ITEMS + 1 + min(V, BT).
    """
    return min(BT, BT // CHUNK_ITEMS + 1 + min(V, BT))


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

    @property
    def max_buckets(self) -> int:
        return int(self.info.shape[0])

    @property
    def max_units(self) -> int:
        return int(self.units.shape[0])

    @property
    def num_buckets_device(self):
        """A one-element device view of the bucket count (for kernels)."""
        return self.counters[COUNTER_NUM_BUCKETS : COUNTER_NUM_BUCKETS + 1]

    @property
    def num_units_device(self):
        return self.counters[COUNTER_NUM_UNITS : COUNTER_NUM_UNITS + 1]

    def to_host(self) -> BucketTable:
        """Wait for the GPU and return the table as NumPy arrays, trimmed to its real size."""
        counters = self.counters.get()
        num_buckets, num_units = int(counters[COUNTER_NUM_BUCKETS]), int(counters[COUNTER_NUM_UNITS])
        return BucketTable(info=self.info[:num_buckets].get(), bt_list=self.bt_list.get(),
                           units=self.units[:num_units].get(), C=self.C, dtype=np.dtype(self.dtype))


def to_device(table) -> DeviceBucketTable:
    """A table the wte kernels can read: a ``DeviceBucketTable`` as it is; a host ``BucketTable`` copied over.

    A host table's sizes are exact, so its ``counters`` hold them and its bounds equal them (llm.c's route:
    the table was built on the CPU and travels to the GPU).
    """
    if isinstance(table, DeviceBucketTable):
        return table
    cupy = cupy_module()
    counters = np.zeros(NUM_COUNTERS, dtype=np.int32)
    counters[COUNTER_NUM_BUCKETS], counters[COUNTER_NUM_UNITS] = table.num_buckets, table.num_units
    return DeviceBucketTable(info=cupy.asarray(table.info), bt_list=cupy.asarray(table.bt_list),
                             units=cupy.asarray(table.units), counters=cupy.asarray(counters), C=table.C,
                             dtype=np.dtype(table.dtype))


class _Workspace:
    """Every buffer the bucketing kernel needs, allocated once per problem size."""

    def __init__(self, cupy, BT: int, V: int, groups: int, grid: int):
        n = max(V, BT)
        i32 = np.int32
        self.counts = cupy.empty(V, i32)
        self.presence = cupy.empty(BT + 1, i32)
        self.keys0, self.keys1 = cupy.empty(n, np.uint32), cupy.empty(n, np.uint32)
        self.vals0, self.vals1 = cupy.empty(n, i32), cupy.empty(n, i32)
        self.hist = cupy.empty(RADIX_DIGITS * grid, i32)
        self.rank_of_ix = cupy.empty(V, i32)
        self.token_starts = cupy.empty(V, i32)
        self.unit_starts = cupy.empty(V, i32)
        self.info = cupy.empty((min(V, BT) * groups, 4), i32)
        self.units = cupy.empty((max_units(BT, V), 4), i32)
        self.bt_list = cupy.empty(BT, i32)
        self.counters = cupy.empty(NUM_COUNTERS, i32)
        self.grid = grid


_workspaces: dict = {}


def _grid_size(cupy, BT: int, V: int) -> int:
    """Blocks of the cooperative launch: one per SM at most (always co-resident), none idle on small inputs."""
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    return max(1, min(sms, ceil_div(max(V, BT), BUCKETING_THREADS)))


def build_bucket_table_gpu(inp, C: int, dtype, V: int) -> DeviceBucketTable:
    """Launch ``bucketing_kernel`` on the current stream for validated (B, T) int32 CuPy ids in [0, V)."""
    cupy = cupy_module()
    BT = int(inp.size)
    groups = num_c_groups(C, dtype)
    device = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream().ptr
    key = (device, stream, BT, V, groups)
    ws = _workspaces.get(key)
    if ws is None:
        ws = _workspaces[key] = _Workspace(cupy, BT, V, groups, _grid_size(cupy, BT, V))
    kernel = get_kernel("bucketing.cu", "bucketing_kernel", dtype)
    launch(kernel, ws.grid, BUCKETING_THREADS,
           (inp, np.int32(BT), np.int32(V), np.int32(groups), ws.counts, ws.presence, ws.keys0, ws.vals0,
            ws.keys1, ws.vals1, ws.hist, ws.rank_of_ix, ws.token_starts, ws.unit_starts, ws.info, ws.units,
            ws.bt_list, ws.counters))
    return DeviceBucketTable(info=ws.info, bt_list=ws.bt_list, units=ws.units, counters=ws.counters, C=C,
                             dtype=np.dtype(dtype))
