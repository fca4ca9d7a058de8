"""Compile the kernels in ``kernels/`` with CuPy (NVRTC) and launch them.

* Kernels are found next to the package in a checkout (``<repo>/kernels``) or inside it in an installed
  wheel (``gpt2enc_edu/kernels``, where the build puts them).
* Each kernel file is compiled once per process and storage dtype (``-DENC_FP32`` selects fp32), for the
  current device's architecture (CuPy's default), and cached. A failed compilation raises
  ``KernelCompileError`` with NVRTC's log; a missing CuPy or GPU raises ``CudaUnavailableError`` saying why.
* Launchers take already-validated CuPy arrays (``gpt2enc_edu.encoder_*`` validate first). Every launch
  goes through ``_launch``, which refuses an empty grid and surfaces launch errors as ``RuntimeError``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .layout import (
    BLOCK_SIZE,
    CHUNKED_WARPS_PER_BLOCK,
    WARP_SIZE,
    WTE_BLOCK_SIZE,
    c_per_group,
    dtype_name,
    num_c_groups,
    pack_size,
)
from .rounding import bfloat16, float32


class CudaUnavailableError(RuntimeError):
    """The CUDA backend cannot run here (no CuPy, no GPU)."""


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel file; the message carries the compiler log."""


def kernel_dir() -> Path:
    """The folder holding the ``.cu`` files: inside the installed package, else the checkout's ``kernels/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"kernel sources not found in {here / 'kernels'} or {here.parent / 'kernels'}")


def kernel_source(name: str) -> str:
    """The text of ``kernels/<name>`` (for notebooks that display a kernel)."""
    return (kernel_dir() / name).read_text()


def _cupy():
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


@functools.lru_cache(maxsize=None)
def _module(file_name: str, dtype_key: str):
    cupy = _cupy()
    dtype = {"fp32": float32, "bf16": bfloat16}[dtype_key]
    source = kernel_source(file_name)
    # Kernels that synchronise the whole grid must be launched cooperatively; CuPy sets that per module.
    cooperative = file_name in COOPERATIVE_FILES
    module = cupy.RawModule(code=source, options=compile_options(dtype), enable_cooperative_groups=cooperative)
    try:
        module.compile()
    except cupy.cuda.compiler.CompileException as exc:
        raise KernelCompileError(f"NVRTC failed to compile kernels/{file_name} ({dtype_key}):\n{exc}") from exc
    return module


def get_kernel(file_name: str, kernel_name: str, dtype):
    """The compiled ``kernel_name`` from ``kernels/<file_name>`` for storage ``dtype`` (cached)."""
    return _module(file_name, dtype_name(dtype)).get_function(kernel_name)


def _launch(kernel, grid: int, block: int, args: tuple) -> None:
    """Launch with a checked configuration; launch failures become RuntimeError naming the kernel.

    (Errors inside a running kernel surface at the next synchronising call, as CUDA reports them. Kernels
    of ``COOPERATIVE_FILES`` are launched cooperatively, which fails here if the grid cannot be co-resident.)
    """
    name = getattr(kernel, "name", kernel)
    if grid <= 0 or block <= 0:
        raise RuntimeError(f"refusing to launch {name} with grid={grid}, block={block}")
    try:
        kernel((grid,), (block,), args)
    except Exception as exc:  # cupy.cuda.driver.CUDADriverError and friends
        raise RuntimeError(f"launch of {name} failed (grid={grid}, block={block}): {exc}") from exc


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def encoder_forward(out, inp, wte, wpe, B: int, T: int, C: int) -> None:
    kernel = get_kernel("encoder_forward.cu", "encoder_forward_kernel", wte.dtype)
    threads = B * T * C // pack_size(wte.dtype)
    _launch(kernel, _ceil_div(threads, BLOCK_SIZE), BLOCK_SIZE,
            (out, inp, wte, wpe, np.int32(B), np.int32(T), np.int32(C)))


def encoder_backward_wpe(dwpe, dout, B: int, T: int, C: int, seed: int) -> None:
    kernel = get_kernel("encoder_backward_wpe.cu", "encoder_backward_wpe_kernel", dout.dtype)
    threads = T * C // pack_size(dout.dtype)
    _launch(kernel, _ceil_div(threads, BLOCK_SIZE), BLOCK_SIZE,
            (dwpe, dout, np.int32(B), np.int32(T), np.int32(C), np.uint32(seed)))


def _device_table(table):
    """(bucket_info, units, bt_list, num_buckets, num_units, max_buckets, max_units) on the device.

    A ``BucketTable`` from the CPU is copied over (llm.c's route); a ``DeviceBucketTable`` is already there.
    """
    from .gpu_buckets import DeviceBucketTable

    cupy = _cupy()
    if isinstance(table, DeviceBucketTable):
        return (table.info, table.units, table.bt_list, table.num_buckets_device, table.num_units_device,
                table.max_buckets, table.max_units)
    sizes = cupy.asarray(np.array([table.num_buckets, table.num_units], dtype=np.int32))
    return (cupy.asarray(table.info), cupy.asarray(table.units), cupy.asarray(table.bt_list), sizes[0:1], sizes[1:2],
            table.num_buckets, table.num_units)


def encoder_backward_wte_bucketed(dwte, table, dout, C: int, seed: int) -> None:
    kernel = get_kernel("encoder_backward_wte_bucketed.cu", "encoder_backward_wte_bucketed_kernel", dout.dtype)
    bucket_info, _, bt_list, num_buckets, _, max_buckets, _ = _device_table(table)
    _launch(kernel, max_buckets, WTE_BLOCK_SIZE,
            (dwte, bucket_info, bt_list, dout, num_buckets, np.int32(C), np.uint32(seed)))


_partials_cache: dict = {}

#: Threads per block of the chunk-combine kernel (``COMBINE_THREADS``).
COMBINE_THREADS = 128


def _chunk_partials(BT: int, C_padded: int):
    """Room for the partial sums of multi-chunk tokens, reused across calls on one stream."""
    from .gpu_buckets import max_multi_chunk_units

    cupy = _cupy()
    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, BT, C_padded)
    if key not in _partials_cache:
        _partials_cache[key] = cupy.empty(max_multi_chunk_units(BT) * C_padded, dtype=np.float32)
    return _partials_cache[key]


def encoder_backward_wte_chunked(dwte, table, dout, C: int, seed: int) -> None:
    """The chunk kernel (finishes single-chunk tokens), then the combine kernel (multi-chunk tokens)."""
    from .gpu_buckets import max_multi_chunk_units

    file_name = "encoder_backward_wte_chunked.cu"
    chunk_kernel = get_kernel(file_name, "encoder_backward_wte_chunked_kernel", dout.dtype)
    combine_kernel = get_kernel(file_name, "encoder_backward_wte_chunk_combine_kernel", dout.dtype)
    _, units, bt_list, _, num_units, _, max_units = _device_table(table)
    BT = int(bt_list.shape[0])
    partials = _chunk_partials(BT, num_c_groups(C, dout.dtype) * c_per_group(dout.dtype))
    _launch(chunk_kernel, _ceil_div(max_units, CHUNKED_WARPS_PER_BLOCK), WARP_SIZE * CHUNKED_WARPS_PER_BLOCK,
            (dwte, units, bt_list, dout, partials, num_units, np.int32(C), np.uint32(seed)))
    _launch(combine_kernel, min(max_units, max_multi_chunk_units(BT)), COMBINE_THREADS,
            (dwte, units, partials, num_units, np.int32(C), np.uint32(seed)))


_side_streams: dict = {}


def _side_stream(main):
    """A second stream (and two events) paired with ``main``, for the GPU bucketing to run beside the wpe kernel."""
    cupy = _cupy()
    key = (cupy.cuda.Device().id, main.ptr)
    if key not in _side_streams:
        _side_streams[key] = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Event(disable_timing=True),
                              cupy.cuda.Event(disable_timing=True))
    return _side_streams[key]


def encoder_backward_deterministic_gpu_bucketing(dwte, dwpe, dout, inp, B: int, T: int, C: int, V: int,
                                                 seed: int, *, chunked: bool) -> None:
    """wpe kernel and GPU bucketing side by side, then the wte kernel: no host round trip, no host sync.

    The bucketing kernel uses one block per SM and spends most of its time in grid-wide barriers, while
    the wpe kernel streams dout: on two streams they overlap. Events order everything without the host:
    the side stream starts after all work already queued on the caller's stream (the ids are ready, and
    the previous call's wte kernel is done with the reused table buffers), and the wte kernel waits for
    the table.
    """
    from .gpu_buckets import build_bucket_table_gpu

    cupy = _cupy()
    main = cupy.cuda.get_current_stream()
    side, inputs_ready, table_ready = _side_stream(main)
    inputs_ready.record(main)
    side.wait_event(inputs_ready)
    with side:
        table = build_bucket_table_gpu(inp, C, dout.dtype, V)
        table_ready.record(side)
    encoder_backward_wpe(dwpe, dout, B, T, C, seed)
    main.wait_event(table_ready)
    (encoder_backward_wte_chunked if chunked else encoder_backward_wte_bucketed)(dwte, table, dout, C, seed)


def encoder_backward_atomic(dwte, dwpe, dout, inp, B: int, T: int, C: int, *, bf16_atomics: bool) -> None:
    cupy = _cupy()
    threads = B * T * C // pack_size(dout.dtype)
    grid = _ceil_div(threads, BLOCK_SIZE)
    file_name = "encoder_backward_atomic.cu"
    if bf16_atomics:
        kernel = get_kernel(file_name, "encoder_backward_atomic_bf16_kernel", dout.dtype)
        _launch(kernel, grid, BLOCK_SIZE, (dwte, dwpe, dout, inp, np.int32(B), np.int32(T), np.int32(C)))
        return
    kernel = get_kernel(file_name, "encoder_backward_atomic_fp32_kernel", dout.dtype)
    if dwte.dtype == np.float32:
        _launch(kernel, grid, BLOCK_SIZE, (dwte, dwpe, dout, inp, np.int32(B), np.int32(T), np.int32(C)))
        return
    # bf16 storage: accumulate in fp32 copies, round back to nearest once.
    dwte32, dwpe32 = dwte.astype(cupy.float32), dwpe.astype(cupy.float32)
    _launch(kernel, grid, BLOCK_SIZE, (dwte32, dwpe32, dout, inp, np.int32(B), np.int32(T), np.int32(C)))
    dwte[...] = dwte32.astype(dwte.dtype)
    dwpe[...] = dwpe32.astype(dwpe.dtype)
