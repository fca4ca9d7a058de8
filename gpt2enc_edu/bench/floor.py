"""The memory floor: the bytes an ideal kernel must move, and how close a measured time comes to moving them.

Pure arithmetic (no GPU needed; the course and the CPU tests use it). A kernel that reads each input byte once
and writes each output byte once, at the device-to-device copy rate, takes ``floor_seconds``; a measured time
is ``percent_of_floor`` of that, and moves ``achieved_bytes_per_s`` (the roofline plot's y axis).
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import to_numpy
from ..validate import check_int

#: What the floor is computed for: the whole forward and backward, and the backward's two kernels on their own.
OPS = ("forward", "backward")
PIECE_OPS = ("backward_wpe", "backward_wte")
ALL_OPS = OPS + PIECE_OPS
ID_BYTES = 4  #: token ids are int32


def distinct_ids(inp) -> int:
    """How many different token ids a (B, T) batch holds (NumPy or CuPy): the wte rows the encoder touches."""
    return int(np.unique(to_numpy(inp)).size)


def minimal_bytes(op: str, *, B: int, T: int, C: int, distinct: int, itemsize: int = 2,
                  id_itemsize: int = ID_BYTES) -> int:
    """The bytes an ideal kernel must move: each input byte read once, each output byte written once.

    * ``"forward"``: write ``out`` (B*T*C), read the ``distinct`` wte rows used, the T wpe rows, the ids;
    * ``"backward"``: read ``dout`` (B*T*C), read and write the ``distinct`` dwte rows and the T dwpe
      rows (the gradients are accumulated into), read the ids;
    * ``"backward_wpe"`` (the wpe kernel alone): read ``dout``, read and write the T dwpe rows;
    * ``"backward_wte"`` (the wte kernel alone, table ready): read ``dout``, read and write the ``distinct``
      dwte rows, read the ids. The two pieces each read ``dout``, so together they need one ``dout`` more
      than ``"backward"``.

    ``itemsize`` is the bytes of one stored element (2 for bf16), ``id_itemsize`` of one id (4 for int32).
    Non-integers raise ``TypeError``, sizes below 1 ``ValueError`` (``validate.check_int``).
    """
    B, T, C = check_int("B", B, minimum=1), check_int("T", T, minimum=1), check_int("C", C, minimum=1)
    distinct = check_int("distinct", distinct, minimum=1)
    itemsize = check_int("itemsize", itemsize, minimum=1)
    id_itemsize = check_int("id_itemsize", id_itemsize, minimum=1)
    if distinct > B * T:
        raise ValueError(f"distinct ({distinct}) cannot exceed the number of ids B*T = {B * T}")
    activations = B * T * C * itemsize
    token_rows = distinct * C * itemsize
    position_rows = T * C * itemsize
    ids = B * T * id_itemsize
    if op == "forward":
        return activations + token_rows + position_rows + ids
    if op == "backward":
        return activations + 2 * token_rows + 2 * position_rows + ids
    if op == "backward_wpe":
        return activations + 2 * position_rows
    if op == "backward_wte":
        return activations + 2 * token_rows + ids
    raise ValueError(f"op must be one of {ALL_OPS}, got {op!r}")


def _check_rate(copy_rate: float) -> None:
    if not copy_rate > 0 or not math.isfinite(copy_rate):
        raise ValueError(f"copy_rate must be a positive number of bytes per second, got {copy_rate!r}")


def _check_seconds(seconds: float) -> None:
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"seconds must be a positive time, got {seconds!r}")


def floor_seconds(nbytes: int, copy_rate: float) -> float:
    """The time to move ``nbytes`` at ``copy_rate`` bytes/s (a copy's bytes read + written per second)."""
    _check_rate(copy_rate)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return nbytes / copy_rate


def percent_of_floor(seconds: float, nbytes: int, copy_rate: float) -> float:
    """How close a measured time is to the floor: ``100 * floor / seconds`` (100 means at the floor)."""
    _check_seconds(seconds)
    return 100.0 * floor_seconds(nbytes, copy_rate) / seconds


def achieved_bytes_per_s(seconds: float, nbytes: int) -> float:
    """The bandwidth a measured time amounts to: ``nbytes / seconds`` (the minimal bytes, not what it moved).

    Against the copy rate it is the same ratio as ``percent_of_floor``: ``achieved / copy_rate * 100``.
    """
    _check_seconds(seconds)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return nbytes / seconds


def copy_rate_of(rows, meta: dict | None = None) -> float | None:
    """A run's copy rate in bytes/s: ``meta["copy_rate_GBps"]``, else recovered from a result row's floor
    (``minimal_bytes / floor_us``); None when neither is there."""
    if meta and meta.get("copy_rate_GBps"):
        return float(meta["copy_rate_GBps"]) * 1e9
    for r in rows:
        if r.get("minimal_bytes") and r.get("floor_us"):
            return r["minimal_bytes"] / (r["floor_us"] * 1e-6)
    return None
