"""Token-id generators for exercising the GPT-2 encoder kernels.

The encoder forward pass of llm.c (``encoder_forward``) gathers one row of the
token-embedding table ``wte`` per input id, so *which* ids appear -- and how
often the same id repeats -- changes the memory-access pattern (cache reuse in
the forward gather, atomic/bucket contention in the backward scatter-add into
``dwte``). This module produces int32 ``(B, T)`` id batches with three
distributions:

``"uniform"``
    Every id in ``[0, V)`` equally likely: the friendliest case for the
    backward pass (few collisions), the worst for cache reuse.
``"zipf"``
    Rank-``r`` token drawn with probability proportional to ``r**-s``, ranks
    scattered over the vocabulary by a fixed permutation: a synthetic stand-in
    for natural text, where a handful of ids (``" the"``, ``","``,
    ``"\\n"``) dominate.
``"real"``
    Windows of a shipped sample of *real* GPT-2 BPE ids (Alice's Adventures
    in Wonderland and As You Like It; see ``docs/token_sample.md`` and
    ``scripts/make_token_sample.py``).

All generators are deterministic functions of their ``seed`` (anything
:func:`numpy.random.default_rng` accepts) and return fresh, writable, C-contiguous
``numpy.int32`` arrays.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import numbers

import numpy as np

__all__ = [
    "GPT2_VOCAB_SIZE",
    "ZIPF_PERMUTATION_SEED",
    "KINDS",
    "uniform_ids",
    "zipf_ids",
    "gpt2_sample_ids",
    "real_ids",
    "make_ids",
]

#: Number of GPT-2 token ids: 50,000 BPE merges + 256 byte tokens + ``<|endoftext|>``.
GPT2_VOCAB_SIZE = 50257

#: Seed of the fixed permutation that maps Zipf ranks to token ids
#: (``np.random.default_rng(ZIPF_PERMUTATION_SEED).permutation(V)``).
ZIPF_PERMUTATION_SEED = 50257

#: The kinds understood by :func:`make_ids`.
KINDS = ("uniform", "zipf", "real")

_SAMPLE_PACKAGE = "gpt2enc_edu.data"
_SAMPLE_FILE = "gpt2_sample_ids.npy"
_INT32_MAX = int(np.iinfo(np.int32).max)


# --------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------
def _check_int(name: str, value, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` as a Python int, or raise ``ValueError`` naming ``name``.

    Parameters
    ----------
    name : str
        Argument name used in the error message.
    value : object
        Candidate value; must be an integer (``bool`` is rejected).
    minimum, maximum : int, optional
        Inclusive bounds.

    Returns
    -------
    int
        The validated value.

    Raises
    ------
    ValueError
        If ``value`` is not an integer or is out of bounds.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def _check_shape(B, T) -> tuple[int, int]:
    """Validate the batch size ``B`` and sequence length ``T`` (both ints >= 1).

    Parameters
    ----------
    B, T : int
        Batch size and sequence length.

    Returns
    -------
    tuple of int
        ``(B, T)`` as Python ints.

    Raises
    ------
    ValueError
        If either is not an integer >= 1 (the message names the argument), or
        if ``B * T`` would not fit an int32 index.
    """
    B = _check_int("B", B)
    T = _check_int("T", T)
    if B * T > _INT32_MAX:
        raise ValueError(f"B*T must be <= {_INT32_MAX}, got B={B}, T={T}")
    return B, T


def _check_vocab(V) -> int:
    """Validate a vocabulary size ``V`` (int, ``1 <= V <= 2**31 - 1``).

    Parameters
    ----------
    V : int
        Vocabulary size.

    Returns
    -------
    int
        ``V`` as a Python int.

    Raises
    ------
    ValueError
        If ``V`` is not an integer in range (the message names ``V``).
    """
    return _check_int("V", V, minimum=1, maximum=_INT32_MAX)


# --------------------------------------------------------------------------
# uniform
# --------------------------------------------------------------------------
def uniform_ids(B, T, V=GPT2_VOCAB_SIZE, *, seed) -> np.ndarray:
    """Draw token ids uniformly from ``[0, V)``.

    Parameters
    ----------
    B : int
        Batch size, ``>= 1``.
    T : int
        Sequence length, ``>= 1``.
    V : int, default ``GPT2_VOCAB_SIZE``
        Vocabulary size, ``>= 1``.
    seed : int or numpy.random.SeedSequence or numpy.random.Generator
        Passed to :func:`numpy.random.default_rng`; same seed, same ids.

    Returns
    -------
    numpy.ndarray
        ``int32`` array of shape ``(B, T)`` with values in ``[0, V)``.

    Raises
    ------
    ValueError
        If ``B``, ``T`` or ``V`` is invalid; the message names the argument.

    Examples
    --------
    >>> ids = uniform_ids(2, 4, seed=0)
    >>> ids.shape, ids.dtype
    ((2, 4), dtype('int32'))
    """
    B, T = _check_shape(B, T)
    V = _check_vocab(V)
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, size=(B, T), dtype=np.int32)


# --------------------------------------------------------------------------
# Zipf
# --------------------------------------------------------------------------
def _check_exponent(s) -> float:
    """Validate the Zipf exponent ``s`` (finite real, ``>= 0``).

    Parameters
    ----------
    s : float
        Exponent; ``0`` degenerates to the uniform distribution.

    Returns
    -------
    float
        ``s`` as a Python float.

    Raises
    ------
    ValueError
        If ``s`` is not a finite real number ``>= 0`` (the message names ``s``).
    """
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Real):
        raise ValueError(f"s must be a real number, got {s!r}")
    s = float(s)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"s must be finite and >= 0, got {s}")
    return s


@functools.lru_cache(maxsize=16)
def _zipf_tables(V: int, s: float) -> tuple[np.ndarray, np.ndarray]:
    """Build (and cache) the Zipf sampling tables for ``(V, s)``.

    Parameters
    ----------
    V : int
        Vocabulary size (number of ranks).
    s : float
        Zipf exponent.

    Returns
    -------
    cdf : numpy.ndarray
        ``float64`` array of length ``V``: ``cdf[r-1] = P(rank <= r)``, with
        ``cdf[-1] == 1.0`` exactly. Read-only.
    rank_to_id : numpy.ndarray
        ``int32`` permutation of ``range(V)``; rank ``r`` (1-based) is token
        id ``rank_to_id[r-1]``. Made from ``ZIPF_PERMUTATION_SEED``. Read-only.
    """
    ranks = np.arange(1, V + 1, dtype=np.float64)
    weights = ranks ** (-s)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    cdf[-1] = 1.0
    rank_to_id = (
        np.random.default_rng(ZIPF_PERMUTATION_SEED).permutation(V).astype(np.int32)
    )
    cdf.setflags(write=False)
    rank_to_id.setflags(write=False)
    return cdf, rank_to_id


def zipf_ids(B, T, V=GPT2_VOCAB_SIZE, *, s=1.1, seed) -> np.ndarray:
    """Draw token ids from a truncated Zipf law scattered over the vocabulary.

    The token of rank ``r`` (``1 <= r <= V``) is drawn with probability
    ``r**-s / sum_{k=1..V} k**-s``. Ranks are mapped to ids through a fixed
    permutation of ``range(V)``, ``np.random.default_rng(ZIPF_PERMUTATION_SEED)
    .permutation(V)`` (``ZIPF_PERMUTATION_SEED = 50257``), so the frequent
    ids are scattered over the embedding table like real frequent tokens are,
    rather than packed into its first rows. The permutation depends only on
    ``V``, never on ``seed``: the *same* ids are frequent in every batch.

    Sampling is by inverse CDF: uniform variates are looked up with
    :func:`numpy.searchsorted` in a cumulative table cached per ``(V, s)``.

    Parameters
    ----------
    B : int
        Batch size, ``>= 1``.
    T : int
        Sequence length, ``>= 1``.
    V : int, default ``GPT2_VOCAB_SIZE``
        Vocabulary size (number of ranks), ``>= 1``.
    s : float, default 1.1
        Zipf exponent, finite and ``>= 0``; larger is more skewed, ``0`` is
        uniform. Natural-language token frequencies are close to ``s ~ 1``.
    seed : int or numpy.random.SeedSequence or numpy.random.Generator
        Passed to :func:`numpy.random.default_rng`; same seed, same ids.

    Returns
    -------
    numpy.ndarray
        ``int32`` array of shape ``(B, T)`` with values in ``[0, V)``.

    Raises
    ------
    ValueError
        If ``B``, ``T``, ``V`` or ``s`` is invalid; the message names the
        argument.

    Examples
    --------
    >>> ids = zipf_ids(8, 1024, seed=0)
    >>> ids.shape, ids.dtype
    ((8, 1024), dtype('int32'))
    """
    B, T = _check_shape(B, T)
    V = _check_vocab(V)
    s = _check_exponent(s)
    cdf, rank_to_id = _zipf_tables(V, s)
    rng = np.random.default_rng(seed)
    u = rng.random(B * T)
    rank0 = np.searchsorted(cdf, u, side="right")
    np.minimum(rank0, V - 1, out=rank0)  # guard against rounding at the top
    return rank_to_id[rank0].reshape(B, T)


# --------------------------------------------------------------------------
# real GPT-2 ids
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def gpt2_sample_ids() -> np.ndarray:
    """Return the shipped sample of real GPT-2 token ids.

    The sample is ``gpt2enc_edu/data/gpt2_sample_ids.npy``: two public-domain
    texts (Lewis Carroll's *Alice's Adventures in Wonderland* and
    Shakespeare's *As You Like It*, from the Canterbury corpus), each preceded
    by ``<|endoftext|>`` (id 50256) and tokenized with the real GPT-2 BPE by
    ``scripts/make_token_sample.py``; see ``docs/token_sample.md``. It is
    loaded once with :mod:`importlib.resources` (so it works from an installed
    wheel) and cached.

    Returns
    -------
    numpy.ndarray
        Read-only 1-D ``int32`` array, values in ``[0, GPT2_VOCAB_SIZE)``.
        The same object is returned on every call; copy it before modifying.

    Raises
    ------
    RuntimeError
        If the packaged file is not a 1-D integer array of valid GPT-2 ids.
    """
    resource = importlib.resources.files(_SAMPLE_PACKAGE).joinpath(_SAMPLE_FILE)
    with resource.open("rb") as f:
        arr = np.load(f, allow_pickle=False)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise RuntimeError(
            f"{_SAMPLE_FILE}: expected a non-empty 1-D integer array, "
            f"got shape {arr.shape} dtype {arr.dtype}"
        )
    arr = np.ascontiguousarray(arr, dtype=np.int32)
    if int(arr.min()) < 0 or int(arr.max()) >= GPT2_VOCAB_SIZE:
        raise RuntimeError(f"{_SAMPLE_FILE}: ids outside [0, {GPT2_VOCAB_SIZE})")
    arr.setflags(write=False)
    return arr


def real_ids(B, T, *, seed) -> np.ndarray:
    """Take ``B`` windows of ``T`` consecutive real GPT-2 ids from the sample.

    Each row is a run of consecutive ids from :func:`gpt2_sample_ids` starting
    at an offset drawn from ``np.random.default_rng(seed)``:

    * if ``T <= N`` (``N`` = sample length, 82,249), the offset is uniform in
      ``[0, N - T]`` and the window never wraps;
    * if ``T > N``, the offset is uniform in ``[0, N)`` and the window wraps
      around cyclically (id ``k`` of the row is ``sample[(offset + k) % N]``),
      so the row repeats the sample.

    Parameters
    ----------
    B : int
        Batch size (number of windows), ``>= 1``.
    T : int
        Sequence length (window length), ``>= 1``.
    seed : int or numpy.random.SeedSequence or numpy.random.Generator
        Passed to :func:`numpy.random.default_rng`; same seed, same ids.

    Returns
    -------
    numpy.ndarray
        Writable ``int32`` array of shape ``(B, T)`` with values in
        ``[0, GPT2_VOCAB_SIZE)``.

    Raises
    ------
    ValueError
        If ``B`` or ``T`` is invalid; the message names the argument.
    """
    B, T = _check_shape(B, T)
    sample = gpt2_sample_ids()
    n = sample.shape[0]
    rng = np.random.default_rng(seed)
    if T <= n:
        offsets = rng.integers(0, n - T + 1, size=B)
        idx = offsets[:, None] + np.arange(T)[None, :]
    else:
        offsets = rng.integers(0, n, size=B)
        idx = (offsets[:, None] + np.arange(T)[None, :]) % n
    return sample[idx]  # fancy indexing: a fresh, writable int32 copy


# --------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------
def make_ids(kind, B, T, *, seed, V=GPT2_VOCAB_SIZE) -> np.ndarray:
    """Make a ``(B, T)`` int32 batch of token ids of the given ``kind``.

    Parameters
    ----------
    kind : {"uniform", "zipf", "real"}
        Distribution: :func:`uniform_ids`, :func:`zipf_ids` (default exponent)
        or :func:`real_ids`.
    B : int
        Batch size, ``>= 1``.
    T : int
        Sequence length, ``>= 1``.
    seed : int or numpy.random.SeedSequence or numpy.random.Generator
        Passed to :func:`numpy.random.default_rng`; same seed, same ids.
    V : int, default ``GPT2_VOCAB_SIZE``
        Vocabulary size. For ``"real"`` it only has to be large enough to hold
        every GPT-2 id, i.e. ``V >= 50257`` (ids stay in ``[0, 50257)``).

    Returns
    -------
    numpy.ndarray
        ``int32`` array of shape ``(B, T)`` with values in ``[0, V)``.

    Raises
    ------
    ValueError
        If ``kind`` is unknown, or ``B``, ``T`` or ``V`` is invalid (including
        ``V < 50257`` for ``"real"``); the message names the argument.

    Examples
    --------
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
        raise ValueError(
            f"V must be >= {GPT2_VOCAB_SIZE} for kind='real' (real GPT-2 ids), got {V}"
        )
    return real_ids(B, T, seed=seed)
