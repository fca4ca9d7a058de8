"""Argument checks of a bucket table built ahead (``encoder_backward(..., buckets=...)``), beside ``validate``'s
checks of the arrays: that it fits the call (``check_buckets``) and, for a host table, that its contents lie in
range (``check_table_contents``), so the wte kernels and the mirror read and write only inside their arrays.
As in ``validate``, a bad table raises ``TypeError`` or ``ValueError`` naming what is wrong before anything is
launched or written.
"""

from __future__ import annotations

import numpy as np

from .backend import is_cupy_array
from .buckets import BucketTable, DeviceBucketTable, max_multi_chunk_units
from .checks import check_int
from .layout import CHUNK_ITEMS, ceil_div, num_c_groups
from .methods import METHODS
from .validate import DETERMINISTIC_METHODS, Dims, check_device


def check_buckets(buckets, dims: Dims, method: str, bucketing: str) -> None:
    """A bucket table built ahead (``encoder_backward(..., buckets=...)``) fits this call.

    It must be a ``BucketTable`` of NumPy arrays (copied to the GPU for CuPy arrays) or, for CuPy arrays, a
    ``DeviceBucketTable`` on the current device; its arrays int32 and C-contiguous, ``info`` and ``units`` of 4
    columns (the kernels read them as ``int4``); built for this ``C``, dtype and ``B*T``; with its bucket rows where
    the method reads them. Whether it is the table *of these ids* is checked by ``encoder_backward`` when
    ``check_ids`` is on (that builds the table again).
    """
    if not METHODS[method].needs_table:
        raise ValueError(f"buckets is read by the deterministic methods {DETERMINISTIC_METHODS}, not by "
                         f"method={method!r}; leave it out")
    if bucketing != "auto":
        raise ValueError(f"buckets is a table built already, bucketing={bucketing!r} says where to build one; "
                         "give one of them")
    device_table = isinstance(buckets, DeviceBucketTable)
    if not (isinstance(buckets, BucketTable) or device_table):
        raise TypeError(f"buckets must be a bucket table from make_buckets, not {type(buckets).__name__}")
    arrays = {"info": buckets.info, "bt_list": buckets.bt_list, "units": buckets.units}
    on_gpu = [name for name, array in arrays.items() if is_cupy_array(array)]
    if device_table and dims.backend != "cuda":
        raise TypeError("buckets is a table in GPU memory (DeviceBucketTable) and the arrays are NumPy; "
                        "pass buckets.to_host()")
    if not device_table and on_gpu:
        raise TypeError(f"buckets is a BucketTable whose {on_gpu[0]} is a CuPy array; a BucketTable holds NumPy "
                        "arrays (make_buckets on CuPy ids gives a DeviceBucketTable)")
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray) and not is_cupy_array(array):
            raise TypeError(f"buckets.{name} must be an array, not {type(array).__name__}")
        if array.dtype != np.int32:
            raise TypeError(f"buckets.{name} must be int32, not {array.dtype}")
        if array.ndim != (1 if name == "bt_list" else 2) or (name != "bt_list" and array.shape[1] != 4):
            raise ValueError(f"buckets.{name} has shape {array.shape}, not "
                             f"{'(B*T,)' if name == 'bt_list' else '(rows, 4)'}")
        if not array.flags.c_contiguous:
            raise ValueError(f"buckets.{name} must be C-contiguous")
    if device_table:
        check_device({"buckets": buckets.bt_list})
    if check_int("buckets.C", buckets.C, minimum=1) != dims.C:
        raise ValueError(f"buckets was built for C = {buckets.C}, but dout has C = {dims.C}")
    try:
        np.dtype(buckets.dtype)
    except TypeError as exc:
        raise TypeError(f"buckets.dtype must be a dtype, not {buckets.dtype!r}") from exc
    if np.dtype(buckets.dtype) != dims.dtype:
        raise ValueError(f"buckets was built for dtype {np.dtype(buckets.dtype)}, but the gradients are {dims.dtype}")
    positions = int(buckets.bt_list.shape[0])
    if positions != dims.B * dims.T:
        raise ValueError(f"buckets holds {positions} positions, but inp has B*T = {dims.B * dims.T}")
    if device_table and METHODS[method].bucket_rows:
        buckets.require_bucket_rows(f"method={method!r}")


def _refuse_rows(name: str, rows: np.ndarray, ok: np.ndarray, why: str) -> None:
    """ValueError naming the first row of ``buckets.<name>`` where ``ok`` is False, its values, and ``why``."""
    bad = np.flatnonzero(~ok)
    if bad.size:
        row = int(bad[0])
        raise ValueError(f"buckets.{name}[{row}] = {tuple(int(x) for x in rows[row])}: {why}; build the table with "
                         "make_buckets(inp, C, dtype, V=V)")


def check_table_contents(table, dims: Dims, method: str) -> None:
    """A host ``BucketTable``'s contents lie in range, so the wte kernels (and the mirror) read and write only
    inside their arrays. One pass over the table's small arrays on the host, no GPU sync; run with or without
    ``check_ids`` (a ``DeviceBucketTable`` is not read: that would need a sync).

    * every position of ``bt_list`` in ``[0, B*T)``;
    * every bucket row ``(start, size, ix, c_group)`` and unit ``(ix, chunk, start, size)``: ``ix`` in ``[0, V)``,
      ``size >= 1`` and ``bt_list[start : start + size]`` inside ``bt_list``; a bucket's ``c_group`` in
      ``[0, num_c_groups)``, a unit's ``chunk`` below its token's number of chunks;
    * the units of tokens of more than one chunk come first (a prefix of the list, no longer than
      ``max_multi_chunk_units(B*T)``, the room the kernels have for their partial sums), and each one's token has
      all its chunks inside that prefix, from ``chunk`` rows up (where the combine kernel finds them);
    * the sizes add up: the buckets of each channel group hold B*T positions in all, and so do the tokens' first
      units; a table without bucket rows (``to_host(bucket_rows=False)``) only for a method that does not read them.

    Whether it is the table *of these ids* is ``check_ids``'s part (``encoder_backward`` builds it again).
    """
    BT = dims.B * dims.T
    bt_list = table.bt_list
    if bt_list.size and (int(bt_list.min()) < 0 or int(bt_list.max()) >= BT):
        bad = int(bt_list.min()) if int(bt_list.min()) < 0 else int(bt_list.max())
        raise ValueError(f"buckets.bt_list holds position {bad}, outside [0, B*T) = [0, {BT}); build the table "
                         "with make_buckets(inp, C, dtype, V=V)")
    columns = {"info": (2, 0, 1), "units": (0, 2, 3)}  # where (ix, start, size) sit in a bucket row and in a unit
    for name, rows in (("info", table.info), ("units", table.units)):
        ix_col, start_col, size_col = columns[name]
        wide = rows.astype(np.int64)
        ix, start, size = wide[:, ix_col], wide[:, start_col], wide[:, size_col]
        _refuse_rows(name, rows, (ix >= 0) & (ix < dims.V), f"its token lies outside [0, V) = [0, {dims.V})")
        _refuse_rows(name, rows, (size >= 1) & (start >= 0) & (start + size <= BT),
                     f"its positions bt_list[start : start + size] are empty or not within bt_list's {BT} entries")
    groups = num_c_groups(dims.C, dims.dtype)
    c_group = table.info[:, 3]
    _refuse_rows("info", table.info, (c_group >= 0) & (c_group < groups),
                 f"its channel group lies outside [0, {groups}) (C = {dims.C})")
    units = table.units.astype(np.int64)
    chunk, num_chunks = units[:, 1], ceil_div(units[:, 3], CHUNK_ITEMS)
    _refuse_rows("units", table.units, (chunk >= 0) & (chunk < num_chunks), "its chunk lies outside [0, number of "
                 f"chunks of its size) (chunks of {CHUNK_ITEMS} items)")
    multi = num_chunks > 1
    prefix = int(multi.sum())
    _refuse_rows("units", table.units, multi[:prefix], "the units of tokens of more than one chunk must come first")
    if prefix > max_multi_chunk_units(BT):
        raise ValueError(f"buckets.units has {prefix} units of tokens of more than one chunk, more than B*T = {BT} "
                         f"positions allow ({max_multi_chunk_units(BT)}); build the table with "
                         "make_buckets(inp, C, dtype, V=V)")
    first = np.arange(units.shape[0]) - chunk
    _refuse_rows("units", table.units, ~multi | ((first >= 0) & (first + num_chunks <= prefix)),
                 f"its token's chunks would lie outside the first {prefix} units (those of tokens of more than one "
                 "chunk)")
    if table.info.shape[0] == 0 and METHODS[method].bucket_rows:
        raise ValueError(f"method={method!r} reads the bucket rows, and buckets.info has none (a table built without "
                         "them); build the table with make_buckets(inp, C, dtype, V=V)")
    in_groups = np.bincount(c_group, weights=table.info[:, 1].astype(np.float64), minlength=groups)
    if table.info.shape[0] and (in_groups != BT).any():
        g = int(np.flatnonzero(in_groups != BT)[0])
        raise ValueError(f"buckets.info's buckets of channel group {g} hold {int(in_groups[g])} positions, but inp has "
                         f"B*T = {BT}; build the table with make_buckets(inp, C, dtype, V=V)")
    in_units = int(units[chunk == 0, 3].sum())
    if in_units != BT:
        raise ValueError(f"buckets.units's tokens hold {in_units} positions, but inp has B*T = {BT}; build the "
                         "table with make_buckets(inp, C, dtype, V=V)")
