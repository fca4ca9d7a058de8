"""Token ids as the encoder kernels read them: contiguous int32, checked against ``[0, V)`` in their own type.

``token_ids(out, ids, V, check=...)`` writes ``out[i] = ids[i]`` (int32) from int64 or int32 ``ids``. CuPy arrays run
``kernels/token_ids.cu`` on the current stream; NumPy arrays run ``token_ids_twin``, its NumPy twin. The PyTorch
adapter calls it for ids that are int64 (PyTorch's default), or int32 at an address the kernels cannot take, and
for every id check of a forward on the GPU: the check then needs no host sync (the kernel's header says what an id
outside the range does: the launch fails and nothing after it runs). The twin raises ``ValueError`` at once, as the
package's NumPy calls do.
"""

from __future__ import annotations

import re

import numpy as np

from .backend import is_cupy_array
from .layout import ceil_div
from .loader import get_kernel, launch
from .rounding import bfloat16
from .sources import kernel_dir

#: The kernel file, and its threads per block, read from its ``#define TOKEN_IDS_BLOCK`` (its one home).
KERNEL_FILE = "token_ids.cu"
TOKEN_IDS_BLOCK = int(re.search(r"^#define\s+TOKEN_IDS_BLOCK\s+(\d+)", (kernel_dir() / KERNEL_FILE).read_text(),
                                re.M).group(1))
#: The kernel for each id dtype.
KERNELS = {np.dtype(np.int64): "token_ids_i64_kernel", np.dtype(np.int32): "token_ids_i32_kernel"}


def _check(out, ids) -> None:
    if np.dtype(ids.dtype) not in KERNELS:
        raise TypeError(f"ids must be int32 or int64, not {ids.dtype}")
    if out.dtype != np.int32 or out.shape != ids.shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous int32 array of the ids' shape {ids.shape}")
    if not ids.flags.c_contiguous:
        raise ValueError("ids must be contiguous")


def token_ids(out, ids, V: int, *, check: bool) -> None:
    """``out[...] = ids`` as int32; with ``check``, every id first lies in ``[0, V)`` (see the module docstring)."""
    _check(out, ids)
    if is_cupy_array(ids):
        n = int(ids.size)
        if n:
            # The source has no floatX: any storage dtype compiles it (one module, cached like the others).
            kernel = get_kernel(KERNEL_FILE, KERNELS[np.dtype(ids.dtype)], bfloat16)
            launch(kernel, ceil_div(n, TOKEN_IDS_BLOCK), TOKEN_IDS_BLOCK,
                   (out, ids, np.int32(n), np.int32(V), np.int32(bool(check))))
        return
    token_ids_twin(out, ids, V, check=check)


def token_ids_twin(out, ids, V: int, *, check: bool) -> None:
    """The NumPy twin of ``kernels/token_ids.cu``: the same ids in the same int32 bits; an id outside ``[0, V)`` (with
    ``check``) raises ``ValueError`` naming it and its position, before anything is written."""
    flat = ids.reshape(-1)
    if check and flat.size:
        bad = np.flatnonzero((flat < 0) | (flat >= V))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"inp holds token id {int(flat[i])} at position {i}, outside [0, V) = [0, {V})")
    out.reshape(-1)[...] = flat.astype(np.int32, casting="unsafe")  # the low 32 bits, as the kernel's (int) cast
