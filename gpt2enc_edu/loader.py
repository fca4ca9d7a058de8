"""Find, compile (CuPy/NVRTC) and launch the CUDA source in ``kernels/``.

* Kernels are found next to the package in a checkout (``<repo>/kernels``) or inside it in an installed
  wheel (``gpt2enc_edu/kernels``, where the build puts them).
* Each kernel file is compiled once per process and storage dtype (``-DENC_FP32`` selects fp32), for the
  current device's architecture (CuPy's default), and cached. A failed compilation raises
  ``KernelCompileError`` with NVRTC's log; a missing CuPy or GPU raises ``CudaUnavailableError`` saying why.
* ``compile_source`` compiles any source text with the same options (the course compiles a learner's
  kernel through it, so it sees exactly the headers and flags of the real one).
* ``device_facts`` reads what launch choices depend on (compute capability, SMs, L2 size) once per device.
* Every launch goes through ``launch``, which refuses an empty grid and surfaces launch errors as
  ``RuntimeError``. ``launch(..., after_kernel=True)`` launches a kernel as a *programmatic dependent* of the
  kernel before it on the stream (sm_90 and newer; see ``launch``), through the driver's ``cuLaunchKernelEx``,
  which CuPy does not expose.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .layout import dtype_name
from .rounding import bfloat16, float32
from .sources import kernel_dir


class CudaUnavailableError(RuntimeError):
    """The CUDA backend cannot run here (no CuPy, no GPU)."""


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel file; the message carries the compiler log."""


def kernel_source(name: str) -> str:
    """The text of ``kernels/<name>`` (for notebooks that display a kernel)."""
    return (kernel_dir() / name).read_text()


def cupy_module():
    """CuPy, once it is known to import and to see a GPU; else ``CudaUnavailableError`` saying why."""
    try:
        import cupy
    except Exception as exc:
        raise CudaUnavailableError(f"the CUDA backend needs CuPy, which failed to import: {exc}") from exc
    if not cupy.cuda.is_available():
        raise CudaUnavailableError("the CUDA backend needs a CUDA GPU, and CuPy sees none")
    return cupy


def _cuda_include_dirs() -> list[str]:
    """Folders that hold ``cuda_bf16.h``, for NVRTC (CuPy passes its own, not always the toolkit's)."""
    dirs = []
    candidates = []
    try:
        import cupy

        path = cupy.cuda.get_cuda_path()
        if path:
            candidates.append(Path(path) / "include")
    except Exception:
        pass
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            candidates.append(Path(found))
    except Exception:
        pass
    for folder in candidates:
        if (folder / "cuda_bf16.h").is_file() and str(folder) not in dirs:
            dirs.append(str(folder))
    return dirs


def compile_options(dtype) -> tuple[str, ...]:
    """NVRTC options for one storage dtype. CuPy adds ``-arch`` for the current device and ``-ftz=true``."""
    options = ["-std=c++17", f"-I{kernel_dir()}"]
    options += [f"-I{d}" for d in _cuda_include_dirs()]
    if dtype_name(dtype) == "fp32":
        options.append("-DENC_FP32")
    return tuple(options)


#: Kernel files whose kernels use grid-wide synchronisation (cooperative launch).
COOPERATIVE_FILES = frozenset({"bucketing.cu"})


def compile_source(source: str, dtype, *, label: str, cooperative: bool = False):
    """A compiled ``cupy.RawModule`` of ``source`` with the package's options for storage ``dtype``.

    ``label`` names the source in a ``KernelCompileError``. Kernels that synchronise the whole grid must be
    launched cooperatively; CuPy sets that per module (``cooperative``).
    """
    cupy = cupy_module()
    module = cupy.RawModule(code=source, options=compile_options(dtype), enable_cooperative_groups=cooperative)
    try:
        module.compile()
    except cupy.cuda.compiler.CompileException as exc:
        raise KernelCompileError(f"NVRTC failed to compile {label} ({dtype_name(dtype)}):\n{exc}") from exc
    return module


@functools.lru_cache(maxsize=None)
def _module(file_name: str, dtype_key: str):
    dtype = {"fp32": float32, "bf16": bfloat16}[dtype_key]
    return compile_source(kernel_source(file_name), dtype, label=f"kernels/{file_name}",
                          cooperative=file_name in COOPERATIVE_FILES)


def get_kernel(file_name: str, kernel_name: str, dtype):
    """The compiled ``kernel_name`` from ``kernels/<file_name>`` for storage ``dtype`` (cached)."""
    return _module(file_name, dtype_name(dtype)).get_function(kernel_name)


@dataclass(frozen=True)
class DeviceFacts:
    """What the package's launch choices need to know about a device."""

    compute_capability: int  # major * 10 + minor: 90 for an H100 or H200
    sm_count: int
    l2_cache_bytes: int


_device_facts: dict = {}


def device_facts() -> DeviceFacts:
    """The current device's ``DeviceFacts``, read once per device: CuPy's ``Device.attributes`` queries every
    attribute the driver has, which costs host time a launch should not pay each call."""
    cupy = cupy_module()
    device = cupy.cuda.Device()
    if device.id not in _device_facts:
        attributes = device.attributes
        _device_facts[device.id] = DeviceFacts(compute_capability=int(device.compute_capability),
                                               sm_count=int(attributes["MultiProcessorCount"]),
                                               l2_cache_bytes=int(attributes["L2CacheSize"]))
    return _device_facts[device.id]


#: Launch kernels marked ``after_kernel`` as programmatic dependents where the GPU can (sm_90 and newer). Tests
#: and the probe turn it off to check that the bits do not depend on it and to time what it gains.
PROGRAMMATIC_LAUNCH = True


def launch(kernel, grid, block: int, args: tuple, *, shared_mem: int = 0, after_kernel: bool = False) -> None:
    """Launch with a checked configuration; launch failures become RuntimeError naming the kernel.

    ``grid`` is a number of blocks, or a tuple ``(x, y)`` for a 2-D grid.

    ``after_kernel=True`` (for a kernel that follows another kernel on the same stream and calls
    ``wait_for_previous_grid()`` from ``common.cuh`` before it reads anything that kernel wrote): launch it as a
    programmatic dependent (CUDA's programmatic dependent launch). Its blocks may then be scheduled as soon as
    every block of the kernel before it has called ``allow_next_grid()`` (or exited), and they wait inside, so the
    usual gap of about a microsecond between two kernels is spent while the first still runs. The order of every
    read and write stays as with a plain launch, so the bits do too. Below sm_90, or with ``PROGRAMMATIC_LAUNCH``
    off, it is a plain launch (and the two device calls do nothing).

    (Errors inside a running kernel surface at the next synchronising call, as CUDA reports them. Kernels
    of ``COOPERATIVE_FILES`` are launched cooperatively, which fails here if the grid cannot be co-resident.)
    """
    name = getattr(kernel, "name", kernel)
    grid = tuple(int(g) for g in grid) if isinstance(grid, tuple) else (int(grid),)
    if min(grid) <= 0 or block <= 0:
        raise RuntimeError(f"refusing to launch {name} with grid={grid}, block={block}")
    try:
        if after_kernel and PROGRAMMATIC_LAUNCH and _programmatic_launch_supported():
            _launch_programmatic(kernel, grid, block, args, shared_mem)
        else:
            kernel(grid, (block,), args, shared_mem=shared_mem)
    except Exception as exc:  # cupy.cuda.driver.CUDADriverError and friends
        raise RuntimeError(f"launch of {name} failed (grid={grid}, block={block}): {exc}") from exc


def _programmatic_launch_supported() -> bool:
    """Whether the current device runs programmatic dependent launches (compute capability 9.0 and newer)."""
    return device_facts().compute_capability >= 90


# cuLaunchKernelEx's structures (cuda.h): CUlaunchAttribute is a 4-byte id, 4 bytes of padding and a 64-byte
# union; CUlaunchConfig is the grid, the block, the dynamic shared memory, the stream and the attributes.
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


#: Scalar kernel arguments the launcher takes, by NumPy type: their ``struct`` format in an 8-byte slot (the
#: package passes sizes as int32 and seeds as uint32).
_SCALAR_FORMATS = {np.int32: "i4x", np.uint32: "I4x", np.float32: "f4x", np.int64: "q", np.uint64: "Q"}


def _kernel_params(args: tuple):
    """cuLaunchKernelEx's ``void* params[]`` in one buffer: the arguments' values, one 8-byte slot each (a device
    address, or a scalar's bytes at the start of its slot), then the slots' addresses. Returns the buffer (keep it
    alive until the launch call returns: the driver copies the values then) and the address of ``params``."""
    formats, values = ["<"], []
    for arg in args:
        scalar_format = _SCALAR_FORMATS.get(type(arg))
        if scalar_format is not None:
            formats.append(scalar_format)
            values.append(arg)
            continue
        try:
            values.append(arg.data.ptr)  # a CuPy array: its device address
        except AttributeError:
            names = sorted(t.__name__ for t in _SCALAR_FORMATS)
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
def _driver():
    """libcuda's cuLaunchKernelEx, cuOccupancyMaxActiveBlocksPerMultiprocessor and cuGetErrorString (CuPy has
    loaded the library already)."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorString.restype = ctypes.c_int
    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                                ctypes.c_int, ctypes.c_size_t]
    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.restype = ctypes.c_int
    return lib


def _check_driver(status: int, call: str) -> None:
    if status != 0:
        lib = _driver()
        text = ctypes.c_char_p()
        lib.cuGetErrorString(status, ctypes.byref(text))
        raise RuntimeError(f"{call} returned {status} ({(text.value or b'unknown error').decode()})")


_blocks_per_sm: dict = {}


def blocks_per_sm(file_name: str, kernel_name: str, dtype, block: int, shared_mem: int = 0) -> int:
    """How many blocks of ``block`` threads of a package kernel one SM of the current device holds at once (the
    driver's occupancy calculator: registers, shared memory, thread limits), read once per kernel and device.

    A question about the kernel, not a launch: it compiles the kernel if need be, but does not go through
    ``get_kernel`` (which the sanitizer driver watches to learn what a case launched)."""
    key = (cupy_module().cuda.Device().id, file_name, kernel_name, dtype_name(dtype), block, shared_mem)
    if key not in _blocks_per_sm:
        function = _module(file_name, dtype_name(dtype)).get_function(kernel_name).kernel  # the loaded CUfunction
        count = ctypes.c_int()
        _check_driver(_driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(count), function.ptr,
                                                                            block, shared_mem),
                      "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        _blocks_per_sm[key] = count.value
    return _blocks_per_sm[key]


#: The one attribute of every programmatic launch (cuLaunchKernelEx copies it), and configurations by shape.
_PROGRAMMATIC = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
_PROGRAMMATIC.value[0] = 1  # programmaticStreamSerializationAllowed
_configs: dict = {}


def _launch_programmatic(kernel, grid: tuple, block: int, args: tuple, shared_mem: int) -> None:
    """``kernel`` on the current stream with the programmatic-stream-serialization attribute set."""
    key = (grid, block, shared_mem, cupy_module().cuda.get_current_stream().ptr)
    config = _configs.get(key)
    if config is None:
        grid3 = (grid + (1, 1))[:3]
        config = _configs[key] = _LaunchConfig((ctypes.c_uint * 3)(*grid3), (ctypes.c_uint * 3)(block, 1, 1),
                                               shared_mem, key[3], ctypes.pointer(_PROGRAMMATIC), 1)
    buffer, params = _kernel_params(args)  # buffer: alive until this function returns
    function = kernel.kernel  # the RawKernel's loaded cupy.cuda.function.Function; .ptr is its CUfunction
    _check_driver(_driver().cuLaunchKernelEx(ctypes.byref(config), function.ptr, params, None), "cuLaunchKernelEx")
