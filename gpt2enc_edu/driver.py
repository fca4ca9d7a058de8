"""The CUDA driver calls CuPy does not offer, through ``ctypes``: ``cuLaunchKernelEx`` (a programmatic dependent
launch, or any launch of a kernel by its address) and the occupancy calculator. ``loader.launch`` and
``loader.blocks_per_sm`` call them, and ``plans`` replays recorded work through them (with ``cuEventRecord`` and
``cuStreamWaitEvent``); nothing else in the package needs the driver directly.
"""

from __future__ import annotations

import ctypes
import functools
import struct

import numpy as np

from .caches import BoundedCache

# cuLaunchKernelEx's structures (cuda.h): CUlaunchAttribute is a 4-byte id, 4 bytes of padding and a 64-byte
# union; CUlaunchConfig is the grid, the block, the dynamic shared memory, the stream and the attributes.
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def _attribute(attribute_id: int) -> LaunchAttribute:
    attribute = LaunchAttribute(id=attribute_id)
    attribute.value[0] = 1  # programmaticStreamSerializationAllowed / cooperative: on
    return attribute


#: The launch attributes the package sets, each alone (cuLaunchKernelEx copies them): a programmatic dependent launch,
#: and a cooperative one (the kernels of ``loader.COOPERATIVE_FILES``, replayed by a plan).
LAUNCH_ATTRIBUTES = {CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: _attribute(
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION),
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE: _attribute(CU_LAUNCH_ATTRIBUTE_COOPERATIVE)}


def launch_config(grid: tuple, block: int, shared_mem: int, stream_ptr: int,
                  attribute: int | None = None) -> LaunchConfig:
    """A ``CUlaunchConfig`` for a 1-D block, a grid of up to 3 dimensions and at most one attribute (a key of
    ``LAUNCH_ATTRIBUTES``)."""
    grid3 = (tuple(grid) + (1, 1))[:3]
    attrs = None if attribute is None else ctypes.pointer(LAUNCH_ATTRIBUTES[attribute])
    return LaunchConfig((ctypes.c_uint * 3)(*grid3), (ctypes.c_uint * 3)(block, 1, 1), shared_mem, stream_ptr,
                        attrs, 0 if attribute is None else 1)


#: Scalar kernel arguments the launcher takes, by NumPy type: their ``struct`` format in an 8-byte slot (the
#: package passes sizes as int32 and seeds as uint32).
SCALAR_FORMATS = {np.int32: "i4x", np.uint32: "I4x", np.float32: "f4x", np.int64: "q", np.uint64: "Q"}


def kernel_params(args: tuple):
    """cuLaunchKernelEx's ``void* params[]`` in one buffer: the arguments' values, one 8-byte slot each (a device
    address, or a scalar's bytes at the start of its slot), then the slots' addresses. Returns the buffer (keep it
    alive until the launch call returns: the driver copies the values then) and the address of ``params``."""
    formats, values = ["<"], []
    for arg in args:
        scalar_format = SCALAR_FORMATS.get(type(arg))
        if scalar_format is not None:
            formats.append(scalar_format)
            values.append(arg)
            continue
        try:
            values.append(arg.data.ptr)  # a CuPy array: its device address
        except AttributeError:
            names = sorted(t.__name__ for t in SCALAR_FORMATS)
            raise TypeError(f"cannot pass a {type(arg).__name__} to a kernel launched after another; give a CuPy "
                            f"array or a NumPy scalar of one of {names}") from None
        formats.append("Q")
    count = len(args)
    buffer = ctypes.create_string_buffer(16 * max(count, 1))
    base = ctypes.addressof(buffer)
    formats.append(f"{count}Q")
    struct.pack_into("".join(formats), buffer, 0, *values, *range(base, base + 8 * count, 8))
    return buffer, base + 8 * count


@functools.lru_cache(maxsize=None)
def libcuda():
    """libcuda's cuLaunchKernelEx, cuEventRecord, cuStreamWaitEvent, cuOccupancyMaxActiveBlocksPerMultiprocessor and
    cuGetErrorString (CuPy has loaded the library already)."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cuEventRecord.restype = ctypes.c_int
    lib.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    lib.cuStreamWaitEvent.restype = ctypes.c_int
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorString.restype = ctypes.c_int
    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                                ctypes.c_int, ctypes.c_size_t]
    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.restype = ctypes.c_int
    return lib


def check(status: int, call: str) -> None:
    """RuntimeError with the driver's words for a failed ``call``."""
    if status != 0:
        text = ctypes.c_char_p()
        libcuda().cuGetErrorString(status, ctypes.byref(text))
        raise RuntimeError(f"{call} returned {status} ({(text.value or b'unknown error').decode()})")


def max_active_blocks(function_ptr: int, block: int, shared_mem: int) -> int:
    """The occupancy calculator's blocks per SM of the loaded ``CUfunction`` at ``function_ptr``."""
    count = ctypes.c_int()
    check(libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(count), function_ptr, block, shared_mem),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return count.value


_configs = BoundedCache("launch configurations", 64)  # a launch copies its configuration: none is pinned


def launch_programmatic(function_ptr: int, grid: tuple, block: int, args: tuple, shared_mem: int,
                        stream_ptr: int) -> None:
    """The loaded ``CUfunction`` at ``function_ptr`` on ``stream_ptr``, with the programmatic-stream-serialization
    attribute set (configurations kept by shape)."""
    config = _configs.get((grid, block, shared_mem, stream_ptr),
                          lambda: launch_config(grid, block, shared_mem, stream_ptr,
                                                CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION))
    buffer, params = kernel_params(args)  # buffer: alive until this function returns
    check(libcuda().cuLaunchKernelEx(ctypes.byref(config), function_ptr, params, None), "cuLaunchKernelEx")
