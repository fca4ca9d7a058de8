"""The messages between the checker and the grading process: a JSON header and arrays in NumPy's ``.npz`` format.

No pickle in either direction: the checker reads what the grading process (which ran the learner's code)
sends with ``json`` and ``numpy.load(..., allow_pickle=False)``, so a message cannot run code in the checker.
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np

_LENGTH = struct.Struct("<Q")

#: How long the kernel's process may run one check, by the form of the kernel (a CUDA check compiles first).
TIMEOUT_S = {"per-thread Python": 120, "CUDA": 300}


def pack(header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """One message: ``header`` (JSON) and ``arrays`` (name -> array; bf16 travels as its 16-bit pattern)."""
    buffer = io.BytesIO()
    plain, dtypes = {}, {}
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        if array.dtype.kind == "V" or array.dtype.name == "bfloat16":
            dtypes[name] = array.dtype.name
            array = array.view(np.uint16)
        plain[name] = array
    np.savez(buffer, **plain)
    text = json.dumps({**header, "_dtypes": dtypes}).encode()
    data = buffer.getvalue()
    return _LENGTH.pack(len(text)) + text + _LENGTH.pack(len(data)) + data


def unpack(message: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """``(header, arrays)`` of one message from ``pack``; ValueError for anything malformed."""
    try:
        (n,) = _LENGTH.unpack_from(message, 0)
        header = json.loads(message[8 : 8 + n].decode())
        (m,) = _LENGTH.unpack_from(message, 8 + n)
        data = message[16 + n : 16 + n + m]
        if len(data) != m or not isinstance(header, dict):
            raise ValueError("truncated message")
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError, OSError, KeyError) as exc:
        raise ValueError(f"malformed message from the grading process: {exc}") from exc
    from ..rounding import bfloat16

    for name, dtype in header.pop("_dtypes", {}).items():
        if dtype != "bfloat16" or name not in arrays:
            raise ValueError(f"unexpected dtype {dtype!r} for {name!r}")
        arrays[name] = arrays[name].view(bfloat16)
    return header, arrays
