"""Torch tensors as NumPy / CuPy arrays with no copies, and CuPy running on torch's stream and allocator: what
``gpt2enc_edu.torch`` stands on (it re-exports ``as_array``, ``from_array`` and ``on_torch_stream``).

Imported only by ``gpt2enc_edu.torch``; needs torch.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import torch

from .rounding import bfloat16

__all__ = ["as_array", "from_array", "on_torch_stream", "view"]


def as_array(t: torch.Tensor):
    """A zero-copy view of ``t``: a CuPy array for a CUDA tensor, a NumPy array for a CPU tensor.

    bf16 travels as ``int16`` and is reinterpreted as ``ml_dtypes.bfloat16``. For CUDA tensors call this
    inside ``on_torch_stream(t.device)``, so the DLPack exchange needs no synchronisation.
    """
    t = t.detach()
    bf16 = t.dtype == torch.bfloat16
    if bf16:
        t = t.view(torch.int16)
    if t.is_cuda:
        import cupy

        array = cupy.from_dlpack(t)
    else:
        array = t.numpy()
    return array.view(bfloat16) if bf16 else array


#: NumPy dtypes of the torch dtypes the adapter views (bf16 travels as int16).
_NUMPY_OF = {torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


def view(t: torch.Tensor):
    """``as_array(t)`` for the adapter's own calls, which run inside ``on_torch_stream``: for a contiguous CUDA tensor,
    a CuPy array over its memory built directly (the array holds ``t``, so the memory outlives it), without the
    DLPack exchange and its stream bookkeeping, which cost the adapter more host time than the rest of a call
    (docs/experiments.md, host overhead). Other tensors take ``as_array``."""
    t = t.detach()
    bf16 = t.dtype == torch.bfloat16
    raw = t.view(torch.int16) if bf16 else t
    if not (raw.is_cuda and raw.is_contiguous() and raw.numel() and raw.dtype in _NUMPY_OF):
        return as_array(t)
    import cupy

    memory = cupy.cuda.UnownedMemory(raw.data_ptr(), raw.numel() * raw.element_size(), raw, raw.device.index)
    array = cupy.ndarray(tuple(raw.shape), _NUMPY_OF[raw.dtype], cupy.cuda.MemoryPointer(memory, 0))
    return array.view(bfloat16) if bf16 else array


def from_array(array) -> torch.Tensor:
    """A zero-copy torch tensor of a NumPy or CuPy array (the inverse of ``as_array``)."""
    bf16 = array.dtype == bfloat16
    if bf16:
        array = array.view(np.int16)
    t = torch.from_numpy(array) if isinstance(array, np.ndarray) else torch.from_dlpack(array)
    return t.view(torch.bfloat16) if bf16 else t


#: CuPy's views of torch's streams, by (device, stream address); at most ``_MAX_STREAMS``, the oldest forgotten first.
_streams: dict = {}
_MAX_STREAMS = 16


def _cupy_stream(cupy, stream, index: int):
    """torch's ``stream`` as a CuPy ``ExternalStream``, made once per stream (CuPy 14 calls it deprecated in favour of
    ``Stream.from_external``; the warning is silenced here, the older call is the one checked on the H200)."""
    key = (index, stream.cuda_stream)
    external = _streams.get(key)
    if external is None:
        if len(_streams) >= _MAX_STREAMS:
            del _streams[next(iter(_streams))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            external = _streams[key] = cupy.cuda.ExternalStream(stream.cuda_stream, index)
    return external


def _torch_malloc(nbytes: int):
    """CuPy's allocator inside ``on_torch_stream``: memory from torch's caching allocator, on torch's current stream
    (inside a CUDA-graph capture, from the graph's pool), returned to it when CuPy drops the memory."""
    import cupy

    index = cupy.cuda.Device().id
    t = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", index))
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(t.data_ptr(), nbytes, t, index), 0)


@contextlib.contextmanager
def on_torch_stream(device: torch.device):
    """For a CUDA ``device``: make it CuPy's current device, torch's current stream CuPy's current stream, and
    torch's caching allocator CuPy's allocator (so whatever a call allocates for itself lives in torch's pool; the
    package's kept scratch is made in CuPy's own pool, ``gpt2enc_edu.caches``)."""
    if device.type != "cuda":
        yield
        return
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _cupy_stream(cupy, torch.cuda.current_stream(index), index)
    with cupy.cuda.Device(index), stream, cupy.cuda.using_allocator(_torch_malloc):
        yield
