"""Which backend runs a call, and why.

The rule is simple and has no hidden fallback: NumPy arrays run the CPU mirror, CuPy arrays run the CUDA
kernels, and a call that mixes the two is refused. ``gpu_status()`` tells whether CUDA could run here at
all (and why not), ``array_module()`` picks the array library a notebook or demo should allocate with,
and ``last_backend()`` reports what the previous public call actually ran on.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import numpy as np

#: What runs when CUDA cannot: named in every reason string.
MIRROR = "NumPy mirror of the kernels"

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
    except ModuleNotFoundError:
        return Backend("numpy", f"CuPy is not installed: running the {MIRROR}")
    except Exception as exc:  # a CuPy built for another CUDA, a broken install
        return Backend("numpy", f"CuPy is installed but does not load ({exc}): running the {MIRROR}")
    try:
        visible = cupy.cuda.is_available()
    except Exception:
        visible = False
    if not visible:
        return Backend("numpy", f"CuPy is installed but sees no CUDA GPU: running the {MIRROR}")
    try:
        name, arch = _describe_device(cupy.cuda.Device().id)
    except Exception as exc:
        return Backend("numpy", f"a CUDA GPU is visible but could not be queried ({exc}): running the {MIRROR}")
    return Backend("cuda", f"CuPy sees a CUDA GPU ({arch}): running the CUDA kernels", device=name)


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

    Only plain arrays pass: ``numpy.ndarray`` itself (and ``numpy.memmap``, whose data is an ordinary
    buffer mapped from a file) or ``cupy.ndarray`` itself. Subclasses are refused, because they change
    what indexing, ``min``/``max`` or reshaping mean (``np.matrix`` stays 2-D, a masked array's ``min``
    skips masked ids that the kernels would still read). Raises ``TypeError`` naming the offending
    argument for anything else, or for a mix of the two.
    """
    kinds = {}
    for name, value in arrays.items():
        kinds[name] = array_kind(name, value)
    if len(set(kinds.values())) > 1:
        on_gpu = [n for n, k in kinds.items() if k == "cuda"]
        on_cpu = [n for n, k in kinds.items() if k == "numpy"]
        raise TypeError(
            f"arguments mix CuPy ({', '.join(on_gpu)}) and NumPy ({', '.join(on_cpu)}) arrays; "
            "put all of them on one side (cupy.asarray / cupy.asnumpy)"
        )
    return next(iter(kinds.values()))


#: The NumPy array types that reach a kernel: plain arrays, and memory maps (a plain buffer from a file).
PLAIN_NUMPY_TYPES = (np.ndarray, np.memmap)


def array_kind(name: str, value) -> str:
    """"numpy" or "cuda" for a plain array; ``TypeError`` naming ``name`` for anything else (subclasses too)."""
    if type(value) in PLAIN_NUMPY_TYPES:
        return "numpy"
    cupy = sys.modules.get("cupy")  # a CuPy array means CuPy is imported already
    if cupy is not None and isinstance(value, cupy.ndarray):
        if type(value) is cupy.ndarray:
            return "cuda"
        raise TypeError(f"{name} must be a plain cupy.ndarray, not the subclass {type(value).__name__}; "
                        f"pass {name}.view(cupy.ndarray) if nothing is lost by that")
    if isinstance(value, np.ndarray):
        hint = ("; a masked array's mask would be ignored by the kernels, pass np.ma.filled or .data deliberately"
                if isinstance(value, np.ma.MaskedArray) else f"; pass np.asarray({name}) if nothing is lost by that")
        raise TypeError(f"{name} must be a plain numpy.ndarray, not the subclass {type(value).__name__}{hint}")
    if type(value).__module__.split(".")[0] == "cupy" or hasattr(value, "__cuda_array_interface__"):
        raise TypeError(f"{name} must be a plain cupy.ndarray, not {type(value).__name__}")
    raise TypeError(f"{name} must be a numpy.ndarray or cupy.ndarray, not {type(value).__name__}")


def record(name: str) -> Backend:
    """Remember the backend a public call is about to run on (see ``last_backend``)."""
    global _last
    if name == "cuda":
        import cupy

        device, arch = _describe_device(cupy.cuda.Device().id)
        _last = Backend("cuda", f"the arguments are CuPy arrays: the CUDA kernels ran ({arch})", device)
    else:
        _last = Backend("numpy", f"the arguments are NumPy arrays: the {MIRROR} ran")
    return _last


def last_backend() -> Backend | None:
    """The backend the most recent public call ran on, with the reason; ``None`` before any call."""
    return _last


def to_numpy(x) -> np.ndarray:
    """A NumPy copy (or view) of a NumPy or CuPy array."""
    if is_cupy_array(x):
        return x.get()
    return np.asarray(x)
