"""Random encoder problems and output poisoning, shared by tests, notebooks, the demo and the benchmark.

A ``Problem`` holds the inputs of one forward and one backward call as NumPy arrays; ``.on(xp)`` gives a
copy on the GPU (``xp=cupy``) or the CPU (``xp=numpy``), so both backends can run the very same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from .backend import is_cupy_array
from .rounding import bfloat16
from .tokens import make_ids

#: Bits written into an output before a kernel runs: a huge finite value (bf16 0x7F7F, fp32 0x7F7F7F7F)
#: that no kernel produces from the small random inputs used here, so an unwritten element shows up.
POISON_BITS = {2: 0x7F7F, 4: 0x7F7F7F7F}


@dataclass(frozen=True)
class Problem:
    inp: np.ndarray  #: (B, T) int32
    wte: np.ndarray  #: (V, C)
    wpe: np.ndarray  #: (maxT, C)
    dout: np.ndarray  #: (B, T, C)
    dwte: np.ndarray  #: (V, C), the gradient before this step
    dwpe: np.ndarray  #: (maxT, C)

    #: The sizes, read from the arrays: (B, T) of ``inp``, (V, C) of ``wte``.
    B, T = (property(lambda self, i=i: self.inp.shape[i]) for i in range(2))
    V, C = (property(lambda self, i=i: self.wte.shape[i]) for i in range(2))

    @property
    def dtype(self) -> np.dtype:
        return self.wte.dtype

    def on(self, xp) -> "Problem":
        """A copy whose arrays live in ``xp`` (numpy or cupy); gradients are fresh copies either way."""
        return replace(self, **{f.name: xp.array(getattr(self, f.name)) for f in fields(self)})


def random_problem(B: int, T: int, C: int, V: int = 50257, maxT: int | None = None, *, dtype=bfloat16,
                   ids: str = "uniform", rng=None, grad_scale: float = 1.0) -> Problem:
    """Normal(0, 1) embeddings and gradients (dwte, dwpe start non-zero, as in gradient accumulation).

    ``ids`` is "uniform", "zipf" or "real" (``tokens.make_ids``); ``rng`` a ``numpy.random.Generator``
    (a fresh unseeded one by default, so every call draws new numbers).
    """
    rng = np.random.default_rng() if rng is None else rng
    maxT = T if maxT is None else maxT
    inp = make_ids(ids, B, T, V=V, seed=rng)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)

    return Problem(inp=inp, wte=normal(V, C), wpe=normal(maxT, C), dout=normal(B, T, C, scale=grad_scale),
                   dwte=normal(V, C, scale=grad_scale), dwpe=normal(maxT, C, scale=grad_scale))


def poisoned(shape, dtype, xp=np):
    """A new array of ``shape`` and ``dtype`` in ``xp`` filled with ``POISON_BITS``."""
    dtype = np.dtype(dtype)
    bits_dtype = np.uint16 if dtype.itemsize == 2 else np.uint32
    return xp.full(shape, POISON_BITS[dtype.itemsize], dtype=bits_dtype).view(dtype)


def count_poison(x) -> int:
    """How many elements of ``x`` still hold the poison bits."""
    bits_dtype = np.uint16 if x.dtype.itemsize == 2 else np.uint32
    bits = x.view(bits_dtype)
    count = (bits == POISON_BITS[x.dtype.itemsize]).sum()
    return int(count.get() if is_cupy_array(count) else count)
