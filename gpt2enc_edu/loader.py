"""Find, compile (CuPy/NVRTC) and launch the CUDA source in ``kernels/``.

* Kernels are found next to the package in a checkout (``<repo>/kernels``) or inside it in an installed
  wheel (``gpt2enc_edu/kernels``, where the build puts them).
* Each kernel file is compiled once per process and storage dtype (``-DENC_FP32`` selects fp32), for the
  current device's architecture (CuPy's default), and cached. A failed compilation raises
  ``KernelCompileError`` with NVRTC's log; a missing CuPy or GPU raises ``CudaUnavailableError`` saying why.
* ``compile_source`` compiles any source text with the same options (the course compiles a learner's
  kernel through it, so it sees exactly the headers and flags of the real one).
* ``device_facts`` reads what launch choices depend on (compute capability, SMs, L2 size) once per device.
* Every launch goes through ``launch``, which refuses an empty grid, opts a kernel in to more than 48 KB of dynamic
  shared memory where it asks for that, and surfaces launch errors as ``RuntimeError``; every event that orders two
  streams goes through ``record_event`` and ``wait_event``. All three tell a recording ``plans.Recorder`` what they
  did, so that a call's work can be replayed.
  ``launch(..., after_kernel=True)`` launches a kernel as a *programmatic dependent* of the kernel before it on the
  stream (sm_90 and newer; see ``launch``), through the driver's ``cuLaunchKernelEx``, which CuPy does not expose
  (``driver.py`` calls it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from . import driver, plans
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
    shared_per_block_optin: int  # the most shared memory a block may ask for (dynamic, once a kernel opts in)


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
                                               l2_cache_bytes=int(attributes["L2CacheSize"]),
                                               shared_per_block_optin=int(attributes["MaxSharedMemoryPerBlockOptin"]))
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

    ``shared_mem`` beyond ``SHARED_WITHOUT_OPT_IN`` (48 KB) opts the kernel in to that much first, once per loaded
    function, or raises RuntimeError where the device cannot give it.

    (Errors inside a running kernel surface at the next synchronising call, as CUDA reports them. Kernels
    of ``COOPERATIVE_FILES`` are launched cooperatively, which fails here if the grid cannot be co-resident.)
    """
    name = getattr(kernel, "name", kernel)
    grid = tuple(int(g) for g in grid) if isinstance(grid, tuple) else (int(grid),)
    if min(grid) <= 0 or block <= 0:
        raise RuntimeError(f"refusing to launch {name} with grid={grid}, block={block}")
    if shared_mem > SHARED_WITHOUT_OPT_IN:
        _opt_in_shared(kernel, shared_mem)
    programmatic = after_kernel and PROGRAMMATIC_LAUNCH and programmatic_launch_supported()
    try:
        if programmatic:
            # kernel.kernel: the RawKernel's loaded cupy.cuda.function.Function; .ptr is its CUfunction
            driver.launch_programmatic(kernel.kernel.ptr, grid, block, args, shared_mem,
                                       cupy_module().cuda.get_current_stream().ptr)
        else:
            kernel(grid, (block,), args, shared_mem=shared_mem)
    except Exception as exc:  # cupy.cuda.driver.CUDADriverError and friends
        raise RuntimeError(f"launch of {name} failed (grid={grid}, block={block}): {exc}") from exc
    recorder = plans.active()
    if recorder is not None:
        attribute = (driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION if programmatic
                     else driver.CU_LAUNCH_ATTRIBUTE_COOPERATIVE if kernel.enable_cooperative_groups else None)
        recorder.kernel(kernel, grid, block, shared_mem, args, cupy_module().cuda.get_current_stream().ptr, attribute)


#: The dynamic shared memory a block may ask for without its kernel opting in (every GPU CUDA 13 targets); beyond it,
#: up to ``DeviceFacts.shared_per_block_optin``, the kernel must first raise its own limit.
SHARED_WITHOUT_OPT_IN = 48 * 1024
#: The shared memory each loaded kernel has opted in to, by (device, CUfunction): the attribute is set once.
_shared_opted_in: dict = {}


def _opt_in_shared(kernel, shared_mem: int) -> None:
    """Let ``kernel`` ask for ``shared_mem`` bytes of dynamic shared memory a block (once per loaded function and
    device); RuntimeError, before anything is launched, where the device cannot give that much."""
    key = (cupy_module().cuda.Device().id, kernel.kernel.ptr)
    if _shared_opted_in.get(key, 0) >= shared_mem:
        return
    most = device_facts().shared_per_block_optin
    if shared_mem > most:
        raise RuntimeError(f"{kernel.name} needs {shared_mem} bytes of shared memory a block; this GPU gives at most "
                           f"{most}")
    kernel.max_dynamic_shared_size_bytes = shared_mem
    _shared_opted_in[key] = shared_mem


def record_event(event, stream) -> None:
    """``event.record(stream)``, told to a recording plan (``plans``): every GPU step of a call that orders two streams
    goes through here or ``wait_event``."""
    event.record(stream)
    recorder = plans.active()
    if recorder is not None:
        recorder.record_event(event, stream)


def wait_event(stream, event) -> None:
    """``stream.wait_event(event)``, told to a recording plan (``plans``)."""
    stream.wait_event(event)
    recorder = plans.active()
    if recorder is not None:
        recorder.wait_event(stream, event)


def programmatic_launch_supported() -> bool:
    """Whether the current device runs programmatic dependent launches (compute capability 9.0 and newer)."""
    return device_facts().compute_capability >= 90


_blocks_per_sm: dict = {}


def blocks_per_sm(file_name: str, kernel_name: str, dtype, block: int, shared_mem: int = 0) -> int:
    """How many blocks of ``block`` threads of a package kernel one SM of the current device holds at once (the
    driver's occupancy calculator: registers, shared memory, thread limits), read once per kernel and device.

    A question about the kernel, not a launch: it compiles the kernel if need be, but does not go through
    ``get_kernel`` (which the sanitizer driver watches to learn what a case launched)."""
    key = (cupy_module().cuda.Device().id, file_name, kernel_name, dtype_name(dtype), block, shared_mem)
    if key not in _blocks_per_sm:
        function = _module(file_name, dtype_name(dtype)).get_function(kernel_name).kernel  # the loaded CUfunction
        _blocks_per_sm[key] = driver.max_active_blocks(function.ptr, block, shared_mem)
    return _blocks_per_sm[key]
