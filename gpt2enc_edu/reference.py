"""The encoder's math in float64, with no kernel structure: what every kernel is checked against.

``forward`` and ``backward`` accept NumPy or CuPy arrays (copied to the host) and return float64 NumPy
arrays. ``backward`` also returns, per element, the sum of absolute values of the terms that were added
(``*_abs``): the scale that rounding errors are measured against (see ``compare.error_bound``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import to_numpy


def forward(inp, wte, wpe) -> np.ndarray:
    """``out[b, t, :] = wte[inp[b, t], :] + wpe[t, :]`` in float64, shape (B, T, C)."""
    inp = to_numpy(inp)
    wte64 = to_numpy(wte).astype(np.float64)
    wpe64 = to_numpy(wpe).astype(np.float64)
    T = inp.shape[1]
    return wte64[inp] + wpe64[None, :T]


@dataclass(frozen=True)
class Gradients:
    """Reference gradients after one backward: old value plus the exact sums."""

    dwte: np.ndarray
    dwpe: np.ndarray
    dwte_abs: np.ndarray  #: |old| + sum of |dout| terms added into each dwte element
    dwpe_abs: np.ndarray
    max_terms: int  #: the most terms any one element received (its rounding-error growth)


def backward(dwte, dwpe, dout, inp) -> Gradients:
    """``dwte[ix] += sum of dout rows with that token``, ``dwpe[t] += sum over b``, in float64."""
    inp = to_numpy(inp)
    dout64 = to_numpy(dout).astype(np.float64)
    B, T, C = dout64.shape
    dwte64 = to_numpy(dwte).astype(np.float64)
    dwpe64 = to_numpy(dwpe).astype(np.float64)
    dwte_abs, dwpe_abs = np.abs(dwte64), np.abs(dwpe64)
    rows = dout64.reshape(B * T, C)
    np.add.at(dwte64, inp.reshape(-1), rows)
    np.add.at(dwte_abs, inp.reshape(-1), np.abs(rows))
    dwpe64[:T] += dout64.sum(axis=0)
    dwpe_abs[:T] += np.abs(dout64).sum(axis=0)
    max_terms = max(int(np.bincount(inp.reshape(-1)).max()), B) + 1
    return Gradients(dwte64, dwpe64, dwte_abs, dwpe_abs, max_terms)
