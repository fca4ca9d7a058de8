"""Which backend runs a call, and why.

The rule is simple and has no hidden fallback: NumPy arrays run the CPU mirror, CuPy arrays run the CUDA
kernels, and a call that mixes the two is refused. ``gpu_status()`` tells whether CUDA could run here at
all (and why not), ``array_module()`` picks the array library a notebook or demo should allocate with,
and ``last_backend()`` reports what the previous public call actually ran on.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

#: Environment variable that pins ``array_module()``: "auto" (default), "numpy" or "cuda".
BACKEND_ENV = "GPT2ENC_BACKEND"


@dataclass(frozen=True)
class Backend:
    """A backend and the reason it was (or would be) used."""

    name: str  #: "cuda" or "numpy"
    reason: str  #: a sentence a person can read
    device: str | None = None  #: the GPU's name for "cuda"

    def __str__(self) -> str:
        where = f" on {self.device}" if self.device else ""
        return f"{self.name}{where}: {self.reason}"


_last: Backend | None = None


def is_cupy_array(x) -> bool:
    """True for a ``cupy.ndarray``, found without importing CuPy (so NumPy-only machines never need it)."""
    return type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "__cuda_array_interface__")


def gpu_status() -> Backend:
    """Whether the CUDA backend can run in this process, and why (never raises)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        return Backend("numpy", f"CuPy is not importable ({type(exc).__name__}: {exc})")
    if not cupy.cuda.is_available():
        return Backend("numpy", "CuPy is installed but no CUDA GPU is visible")
    try:
        name, arch = _describe_device(cupy.cuda.Device().id)
    except Exception as exc:
        return Backend("numpy", f"a CUDA GPU is visible but could not be queried ({exc})")
    return Backend("cuda", f"CuPy sees a CUDA GPU ({arch})", device=name)


@functools.lru_cache(maxsize=None)
def _describe_device(device_id: int) -> tuple[str, str]:
    """(name, 'sm_XY') of a device; cached, because querying the properties takes about a millisecond."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return name, f"sm_{props['major']}{props['minor']}"


def array_module():
    """The array library to allocate inputs with: ``cupy`` where a GPU is usable, else ``numpy``.

    ``GPT2ENC_BACKEND=numpy`` forces NumPy (to try the CPU mirror on a GPU machine); ``=cuda`` demands the
    GPU and raises ``RuntimeError`` with the reason when there is none, instead of quietly using NumPy.
    """
    wanted = os.environ.get(BACKEND_ENV, "auto").strip().lower()
    if wanted not in ("auto", "numpy", "cuda"):
        raise ValueError(f"{BACKEND_ENV} must be 'auto', 'numpy' or 'cuda', not {wanted!r}")
    if wanted == "numpy":
        return np
    status = gpu_status()
    if status.name == "cuda":
        import cupy

        return cupy
    if wanted == "cuda":
        raise RuntimeError(f"{BACKEND_ENV}=cuda but the CUDA backend is unavailable: {status.reason}")
    return np


def backend_of(**arrays) -> str:
    """"cuda" if every named argument is a CuPy array, "numpy" if every one is a NumPy array.

    Raises ``TypeError`` naming the offending argument for anything else, or for a mix of the two.
    """
    kinds = {}
    for name, value in arrays.items():
        if isinstance(value, np.ndarray):
            kinds[name] = "numpy"
        elif is_cupy_array(value):
            kinds[name] = "cuda"
        else:
            raise TypeError(f"{name} must be a numpy.ndarray or cupy.ndarray, not {type(value).__name__}")
    if len(set(kinds.values())) > 1:
        on_gpu = [n for n, k in kinds.items() if k == "cuda"]
        on_cpu = [n for n, k in kinds.items() if k == "numpy"]
        raise TypeError(
            f"arguments mix CuPy ({', '.join(on_gpu)}) and NumPy ({', '.join(on_cpu)}) arrays; "
            "put all of them on one side (cupy.asarray / cupy.asnumpy)"
        )
    return next(iter(kinds.values()))


def record(name: str) -> Backend:
    """Remember the backend a public call is about to run on (see ``last_backend``)."""
    global _last
    if name == "cuda":
        import cupy

        device, arch = _describe_device(cupy.cuda.Device().id)
        _last = Backend("cuda", f"the arguments are CuPy arrays, so the CUDA kernels ran ({arch})", device)
    else:
        _last = Backend("numpy", "the arguments are NumPy arrays, so the NumPy mirror ran")
    return _last


def last_backend() -> Backend | None:
    """The backend the most recent public call ran on, with the reason; ``None`` before any call."""
    return _last


def to_numpy(x) -> np.ndarray:
    """A NumPy copy (or view) of a NumPy or CuPy array."""
    if is_cupy_array(x):
        return x.get()
    return np.asarray(x)
