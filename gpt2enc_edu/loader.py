"""Find, compile (CuPy/NVRTC) and launch the CUDA source in ``kernels/``.

* Kernels are found next to the package in a checkout (``<repo>/kernels``) or inside it in an installed
  wheel (``gpt2enc_edu/kernels``, where the build puts them).
* Each kernel file is compiled once per process and storage dtype (``-DENC_FP32`` selects fp32), for the
  current device's architecture (CuPy's default), and cached. A failed compilation raises
  ``KernelCompileError`` with NVRTC's log; a missing CuPy or GPU raises ``CudaUnavailableError`` saying why.
* ``compile_source`` compiles any source text with the same options (the course compiles a learner's
  kernel through it, so it sees exactly the headers and flags of the real one).
* Every launch goes through ``launch``, which refuses an empty grid and surfaces launch errors as
  ``RuntimeError``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .layout import dtype_name
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


def launch(kernel, grid, block: int, args: tuple, *, shared_mem: int = 0) -> None:
    """Launch with a checked configuration; launch failures become RuntimeError naming the kernel.

    ``grid`` is a number of blocks, or a tuple ``(x, y)`` for a 2-D grid.

    (Errors inside a running kernel surface at the next synchronising call, as CUDA reports them. Kernels
    of ``COOPERATIVE_FILES`` are launched cooperatively, which fails here if the grid cannot be co-resident.)
    """
    name = getattr(kernel, "name", kernel)
    grid = tuple(int(g) for g in grid) if isinstance(grid, tuple) else (int(grid),)
    if min(grid) <= 0 or block <= 0:
        raise RuntimeError(f"refusing to launch {name} with grid={grid}, block={block}")
    try:
        kernel(grid, (block,), args, shared_mem=shared_mem)
    except Exception as exc:  # cupy.cuda.driver.CUDADriverError and friends
        raise RuntimeError(f"launch of {name} failed (grid={grid}, block={block}): {exc}") from exc
