"""Token ids to feed the encoder: uniform, Zipf-distributed, and real GPT-2 text.

Which ids appear, and how often one repeats, changes the kernels' memory traffic: the forward gathers one
``wte`` row per id (repeats hit in cache), the backward adds into one ``dwte`` row per id (repeats collide
for atomics and make long buckets). Three kinds (``KINDS``), each a deterministic function of ``seed``
(anything ``numpy.random.default_rng`` accepts), each returning a fresh, writable, C-contiguous int32 (B, T)
array:

* ``"uniform"``: every id in ``[0, V)`` equally likely; few repeats.
* ``"zipf"``: rank ``r`` drawn with probability proportional to ``r**-s``, the ranks scattered over the
  vocabulary by a fixed permutation (``ZIPF_PERMUTATION_SEED``), so frequent ids land anywhere in the table
  as real frequent tokens do. A synthetic stand-in for text, where " the", "," and "\\n" dominate.
* ``"real"``: windows of a shipped sample of real GPT-2 BPE ids (Alice's Adventures in Wonderland and As
  You Like It; ``docs/token_sample.md`` and ``scripts/make_token_sample.py`` say how it was made).

Bad sizes raise ``TypeError`` (not an integer) or ``ValueError`` (out of range) naming the argument, as
everywhere in the package (``validate.check_int``).
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import numbers

import numpy as np

from .layout import INT32_LIMIT
from .validate import check_int

__all__ = ["GPT2_VOCAB_SIZE", "KINDS", "ZIPF_PERMUTATION_SEED", "gpt2_sample_ids", "make_ids", "real_ids",
           "uniform_ids", "zipf_ids"]

#: Number of GPT-2 token ids: 50,000 BPE merges + 256 byte tokens + ``<|endoftext|>``.
GPT2_VOCAB_SIZE = 50257
#: Seed of the fixed permutation that maps Zipf ranks to token ids.
ZIPF_PERMUTATION_SEED = 50257
#: The kinds understood by ``make_ids``.
KINDS = ("uniform", "zipf", "real")

_SAMPLE_PACKAGE = "gpt2enc_edu.data"
_SAMPLE_FILE = "gpt2_sample_ids.npy"


def _check_shape(B, T) -> tuple[int, int]:
    """(B, T) as ints >= 1 whose product fits a 32-bit index."""
    B, T = check_int("B", B, minimum=1), check_int("T", T, minimum=1)
    if B * T > INT32_LIMIT:
        raise ValueError(f"B*T must be <= {INT32_LIMIT}, got B={B}, T={T}")
    return B, T


def _check_vocab(V) -> int:
    return check_int("V", V, minimum=1, maximum=INT32_LIMIT)


def uniform_ids(B, T, V=GPT2_VOCAB_SIZE, *, seed) -> np.ndarray:
    """(B, T) int32 ids drawn uniformly from ``[0, V)``.

    >>> uniform_ids(2, 4, seed=0).shape
    (2, 4)
    """
    B, T = _check_shape(B, T)
    V = _check_vocab(V)
    return np.random.default_rng(seed).integers(0, V, size=(B, T), dtype=np.int32)


def _check_exponent(s) -> float:
    """The Zipf exponent: a finite real ``>= 0`` (``0`` is uniform)."""
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Real):
        raise TypeError(f"s must be a real number, not {type(s).__name__}")
    s = float(s)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"s must be finite and >= 0, got {s}")
    return s


@functools.lru_cache(maxsize=16)
def _zipf_tables(V: int, s: float) -> tuple[np.ndarray, np.ndarray]:
    """Read-only (cdf, rank_to_id) for ``(V, s)``: ``cdf[r-1] = P(rank <= r)``, ending at exactly 1.0."""
    cdf = np.cumsum(np.arange(1, V + 1, dtype=np.float64) ** (-s))
    cdf /= cdf[-1]
    cdf[-1] = 1.0
    rank_to_id = np.random.default_rng(ZIPF_PERMUTATION_SEED).permutation(V).astype(np.int32)
    cdf.setflags(write=False)
    rank_to_id.setflags(write=False)
    return cdf, rank_to_id


def zipf_ids(B, T, V=GPT2_VOCAB_SIZE, *, s=1.1, seed) -> np.ndarray:
    """(B, T) int32 ids from a Zipf law over ``V`` ranks, scattered over the vocabulary.

    Rank ``r`` (1-based) has probability ``r**-s / sum(k**-s)``; ``s`` near 1 is what natural text shows. The
    rank-to-id permutation depends only on ``V``, never on ``seed``: the same ids are frequent in every batch.
    Sampling is by inverse CDF (``np.searchsorted`` in a table cached per ``(V, s)``).

    >>> zipf_ids(8, 1024, seed=0).dtype
    dtype('int32')
    """
    B, T = _check_shape(B, T)
    V = _check_vocab(V)
    cdf, rank_to_id = _zipf_tables(V, _check_exponent(s))
    rank0 = np.searchsorted(cdf, np.random.default_rng(seed).random(B * T), side="right")
    np.minimum(rank0, V - 1, out=rank0)  # guard against rounding at the top
    return rank_to_id[rank0].reshape(B, T)


@functools.lru_cache(maxsize=1)
def gpt2_sample_ids() -> np.ndarray:
    """The shipped sample of real GPT-2 ids: a read-only, cached 1-D int32 array (copy before changing it).

    Two public-domain texts (Canterbury corpus), each preceded by ``<|endoftext|>`` (50256), tokenized with
    GPT-2's own BPE. Loaded through ``importlib.resources``, so it works from an installed wheel too.
    ``RuntimeError`` if the packaged file is not a 1-D array of valid GPT-2 ids.
    """
    with importlib.resources.files(_SAMPLE_PACKAGE).joinpath(_SAMPLE_FILE).open("rb") as f:
        arr = np.load(f, allow_pickle=False)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise RuntimeError(f"{_SAMPLE_FILE}: expected a non-empty 1-D integer array, got {arr.shape} {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int32)
    if int(arr.min()) < 0 or int(arr.max()) >= GPT2_VOCAB_SIZE:
        raise RuntimeError(f"{_SAMPLE_FILE}: ids outside [0, {GPT2_VOCAB_SIZE})")
    arr.setflags(write=False)
    return arr


def real_ids(B, T, *, seed) -> np.ndarray:
    """``B`` windows of ``T`` consecutive real GPT-2 ids, each starting at a random offset in the sample.

    With ``T`` up to the sample's length N (82,249) the offset is uniform in ``[0, N - T]`` and a window never
    wraps; with a longer ``T`` the offset is uniform in ``[0, N)`` and the window wraps around the sample.
    """
    B, T = _check_shape(B, T)
    sample = gpt2_sample_ids()
    n = sample.shape[0]
    rng = np.random.default_rng(seed)
    if T <= n:
        idx = rng.integers(0, n - T + 1, size=B)[:, None] + np.arange(T)[None, :]
    else:
        idx = (rng.integers(0, n, size=B)[:, None] + np.arange(T)[None, :]) % n
    return sample[idx]  # fancy indexing: a fresh, writable copy


def make_ids(kind, B, T, *, seed, V=GPT2_VOCAB_SIZE) -> np.ndarray:
    """A (B, T) int32 batch of ``kind`` ids (``"uniform"``, ``"zipf"`` with s=1.1, or ``"real"``).

    For ``"real"``, ``V`` only has to hold every GPT-2 id (``V >= 50257``; llm.c pads to 50304).

    >>> make_ids("real", 4, 64, seed=1).shape
    (4, 64)
    """
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    B, T = _check_shape(B, T)
    V = _check_vocab(V)
    if kind == "uniform":
        return uniform_ids(B, T, V, seed=seed)
    if kind == "zipf":
        return zipf_ids(B, T, V, seed=seed)
    if V < GPT2_VOCAB_SIZE:
        raise ValueError(f"V must be >= {GPT2_VOCAB_SIZE} for kind='real' (real GPT-2 ids), got {V}")
    return real_ids(B, T, seed=seed)
