"""Worked solutions to the exercises of notebooks 01-06 (try them first!).

Each function can be handed to its check in ``gpt2enc_edu.course.exercises``::

    from gpt2enc_edu.course import exercises
    import solutions.exercises as solutions  # from the repository root
    exercises.check_element_to_thread(solutions.element_to_thread)
"""

from __future__ import annotations

import numpy as np

from gpt2enc_edu.backend import is_cupy_array
from gpt2enc_edu.layout import CHUNK_ITEMS, pack_size


def _xp(x):
    """The array module ``x`` belongs to (numpy or cupy)."""
    if is_cupy_array(x):
        import cupy

        return cupy
    return np


def element_to_thread(b, t, c, T: int, C: int, dtype):
    """Exercise 1: the forward kernel's thread that writes ``out[b, t, c]`` and the element's place ``k`` in
    that thread's pack. Thread ``i`` starts at flat element ``i * size``, so divide the flat index."""
    size = pack_size(dtype)
    flat = (b * T + t) * C + c
    return flat // size, flat % size


def rows_that_can_differ(inp, V: int):
    """Exercise 2: with dwte starting at zero, a row that receives one add has one result, and so does a row
    with two: ``(0 + a) + b == (0 + b) + a`` (addition is commutative, and ``0 + a`` is exactly ``a``). From
    three adds on the order shows: ``(a + b) + c`` and ``(a + c) + b`` may round differently."""
    xp = _xp(inp)
    return xp.bincount(inp.reshape(-1), minlength=V) >= 3


def locate(table, inp, b: int, t: int, c: int):
    """Exercise 3: the bucket that reads ``dout[b, t, c]`` and the item of that bucket that holds it."""
    T = inp.shape[1]
    token, group = int(inp[b, t]), c // table.c_per_group
    bucket = int(np.flatnonzero((table.token_ids == token) & (table.c_groups == group))[0])
    start, size = (int(v) for v in table.info[bucket, :2])
    item = int(np.flatnonzero(table.bt_list[start : start + size] == b * T + t)[0])
    return bucket, item


def away_from_zero_probability(x):
    """Exercise 4: bf16 keeps the top 16 bits of an fp32 value; the kernel sets the 16 dropped bits to ones
    (so round-to-nearest moves the magnitude up) when they exceed a threshold drawn uniformly from 0..65535,
    which happens with probability ``dropped / 65536`` (0 when bf16 holds the value exactly)."""
    xp = _xp(x)
    dropped = xp.asarray(x, dtype=xp.float32).view(xp.uint32) & xp.uint32(0xFFFF)
    return dropped.astype(xp.float64) / 65536.0


def backward_bytes(inp, C: int, itemsize: int):
    """Exercise 5: read dout once; read and write every touched dwte row (one per distinct id) and the T dwpe
    rows, because the backward adds into the gradients; read the int32 ids."""
    xp = _xp(inp)
    B, T = inp.shape
    distinct = int(xp.unique(inp).size)
    return B * T * C * itemsize + 2 * distinct * C * itemsize + 2 * T * C * itemsize + B * T * 4


def locate_unit(table, inp, b: int, t: int, c: int):
    """Exercise 6: the chunk kernel's warp that reads ``dout[b, t, c]``, as (unit, channel group, item). The token's
    units are consecutive rows of ``table.units``, one per chunk in chunk order, and each holds the token's whole
    range of ``bt_list``, ascending: the position's place in that range, divided by 32, is its chunk (the row
    among the token's units), and the remainder its item in the chunk."""
    T = inp.shape[1]
    rows = np.flatnonzero(table.units[:, 0] == int(inp[b, t]))
    start, size = (int(v) for v in table.units[rows[0], 2:])
    place = int(np.flatnonzero(table.bt_list[start : start + size] == b * T + t)[0])
    chunk, item = divmod(place, CHUNK_ITEMS)
    return int(rows[chunk]), c // table.c_per_group, item
