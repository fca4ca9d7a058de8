"""Tests for gpt2enc_edu.tokens: the token-id generators and the real sample."""

from __future__ import annotations

import hashlib
import importlib.resources

import numpy as np
import pytest

from gpt2enc_edu import tokens
from gpt2enc_edu.tokens import (
    GPT2_VOCAB_SIZE,
    gpt2_sample_ids,
    make_ids,
    real_ids,
    uniform_ids,
    zipf_ids,
)

GENERATORS = {
    "uniform": lambda B, T, seed: uniform_ids(B, T, seed=seed),
    "zipf": lambda B, T, seed: zipf_ids(B, T, seed=seed),
    "real": lambda B, T, seed: real_ids(B, T, seed=seed),
}

# Documented in docs/token_sample.md; regenerate with scripts/make_token_sample.py.
SAMPLE_SHA256 = "fce532c013e74616712c76e175eb6a42d4361b6f4d681da21abf14e37519b08a"
SAMPLE_LEN = 82249
EOT = 50256


def test_vocab_constant():
    assert GPT2_VOCAB_SIZE == 50257


# ---------------------------------------------------------------- shapes etc.
@pytest.mark.parametrize("kind", sorted(GENERATORS))
@pytest.mark.parametrize("B,T", [(1, 1), (2, 3), (4, 1024), (64, 1024)])
def test_shape_dtype_range(kind, B, T):
    ids = GENERATORS[kind](B, T, 0)
    assert isinstance(ids, np.ndarray)
    assert ids.shape == (B, T)
    assert ids.dtype == np.int32
    assert ids.flags.c_contiguous and ids.flags.writeable
    assert ids.min() >= 0 and ids.max() < GPT2_VOCAB_SIZE


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_make_ids_matches_generator(kind):
    np.testing.assert_array_equal(make_ids(kind, 3, 17, seed=5), GENERATORS[kind](3, 17, 5))


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
@pytest.mark.parametrize("V", [1, 2, 7, 1000])
def test_small_vocab_range(kind, V):
    ids = make_ids(kind, 8, 256, seed=3, V=V)
    assert ids.dtype == np.int32 and ids.shape == (8, 256)
    assert ids.min() >= 0 and ids.max() < V
    if V <= 7:
        assert set(np.unique(ids).tolist()) == set(range(V))


def test_uniform_is_roughly_flat():
    ids = uniform_ids(64, 1024, V=16, seed=0)
    counts = np.bincount(ids.ravel(), minlength=16)
    expected = ids.size / 16
    assert np.all(np.abs(counts - expected) < 0.05 * expected)


def test_numpy_integer_arguments_accepted():
    ids = make_ids("zipf", np.int64(2), np.int32(8), seed=0, V=np.int64(100))
    assert ids.shape == (2, 8)


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_deterministic_by_seed(kind):
    a = make_ids(kind, 8, 128, seed=1234)
    b = make_ids(kind, 8, 128, seed=1234)
    c = make_ids(kind, 8, 128, seed=1235)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_generator_seed_accepted(kind):
    a = make_ids(kind, 2, 16, seed=np.random.default_rng(9))
    b = make_ids(kind, 2, 16, seed=9)
    np.testing.assert_array_equal(a, b)


def test_returned_arrays_are_independent():
    a = real_ids(2, 8, seed=0)
    a[:] = 0  # must not touch the cached sample
    b = real_ids(2, 8, seed=0)
    assert b.any()


# ---------------------------------------------------------------- Zipf
def test_zipf_is_skewed():
    B, T = 64, 1024
    ids = zipf_ids(B, T, seed=0)
    counts = np.bincount(ids.ravel(), minlength=GPT2_VOCAB_SIZE)
    uniform_expectation = ids.size / GPT2_VOCAB_SIZE  # ~1.3
    assert counts.max() > 1000 * uniform_expectation
    # The most frequent id has the rank-1 probability 1 / sum_r r**-1.1 (~0.139).
    p1 = 1.0 / np.sum(np.arange(1, GPT2_VOCAB_SIZE + 1, dtype=np.float64) ** -1.1)
    assert abs(counts.max() / ids.size - p1) < 0.01
    # Many fewer distinct ids than a uniform draw of the same size.
    assert (counts > 0).sum() < (np.bincount(uniform_ids(B, T, seed=0).ravel()) > 0).sum() / 2


def test_zipf_frequent_ids_are_scattered_and_fixed():
    a = zipf_ids(16, 1024, seed=1)
    b = zipf_ids(16, 1024, seed=2)
    top_a = np.argsort(np.bincount(a.ravel(), minlength=GPT2_VOCAB_SIZE))[::-1][:5]
    top_b = np.argsort(np.bincount(b.ravel(), minlength=GPT2_VOCAB_SIZE))[::-1][:5]
    # The most frequent id is the same whatever the seed (fixed permutation) ...
    assert top_a[0] == top_b[0]
    # ... and frequent ids are not simply the first rows of the table.
    assert top_a.max() > 1000


def test_zipf_permutation_documented():
    perm = np.random.default_rng(tokens.ZIPF_PERMUTATION_SEED).permutation(GPT2_VOCAB_SIZE)
    ids = zipf_ids(64, 1024, seed=0)
    counts = np.bincount(ids.ravel(), minlength=GPT2_VOCAB_SIZE)
    assert counts.argmax() == perm[0]


def test_zipf_exponent_controls_skew():
    lo = zipf_ids(16, 1024, s=0.5, seed=0)
    hi = zipf_ids(16, 1024, s=2.0, seed=0)
    assert np.bincount(hi.ravel()).max() > np.bincount(lo.ravel()).max()
    flat = zipf_ids(16, 1024, V=16, s=0, seed=0)
    counts = np.bincount(flat.ravel(), minlength=16)
    assert counts.min() > 0.8 * flat.size / 16


def test_zipf_fast_at_64k():
    import time

    zipf_ids(64, 1024, seed=0)  # warm the table cache
    t0 = time.perf_counter()
    zipf_ids(64, 1024, seed=1)
    assert time.perf_counter() - t0 < 0.5


# ---------------------------------------------------------------- real sample
def test_sample_is_int32_in_range_with_many_distinct_ids():
    s = gpt2_sample_ids()
    assert s.ndim == 1 and s.dtype == np.int32
    assert s.shape == (SAMPLE_LEN,)
    assert 20_000 <= s.size <= 100_000
    assert s.min() >= 0 and s.max() < GPT2_VOCAB_SIZE
    assert np.unique(s).size > 5000


def test_sample_is_cached_and_read_only():
    s = gpt2_sample_ids()
    assert gpt2_sample_ids() is s
    assert not s.flags.writeable
    with pytest.raises(ValueError):
        s[0] = 1


def test_sample_layout_and_known_tokens():
    s = gpt2_sample_ids()
    eot_pos = np.flatnonzero(s == EOT)
    # Two documents, each preceded by <|endoftext|>.
    assert eot_pos.tolist()[0] == 0 and eot_pos.size == 2
    counts = np.bincount(s, minlength=GPT2_VOCAB_SIZE)
    # '\n' (198) is the most frequent token, ' the' (262) the most frequent word.
    assert counts.argmax() == 198
    assert counts[262] > 2000


def test_sample_file_packaged_and_matches_doc():
    res = importlib.resources.files("gpt2enc_edu.data").joinpath("gpt2_sample_ids.npy")
    data = res.read_bytes()
    assert len(data) < 400_000
    assert hashlib.sha256(data).hexdigest() == SAMPLE_SHA256


def test_real_windows_are_consecutive_runs_of_the_sample():
    s = gpt2_sample_ids()
    ids = real_ids(16, 64, seed=7)
    for row in ids:
        starts = np.flatnonzero(s[: s.size - 63] == row[0])
        assert any(np.array_equal(s[i : i + 64], row) for i in starts)


def test_real_full_length_window_is_the_sample():
    s = gpt2_sample_ids()
    ids = real_ids(3, s.size, seed=0)
    for row in ids:
        np.testing.assert_array_equal(row, s)


def test_real_wraps_cyclically_when_T_exceeds_sample():
    s = gpt2_sample_ids()
    n = s.size
    T = 2 * n + 10
    ids = real_ids(2, T, seed=3)
    assert ids.shape == (2, T)
    for row in ids:
        # row[k] == s[(off + k) % n] for some offset off in [0, n).
        offsets = [
            int(i) for i in np.flatnonzero(s == row[0])
            if np.array_equal(s[(i + np.arange(64)) % n], row[:64])
        ]
        assert offsets
        np.testing.assert_array_equal(row, s[(offsets[0] + np.arange(T)) % n])


# ---------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("kind", sorted(GENERATORS))
@pytest.mark.parametrize(
    "B,T,bad,exc",
    [(0, 4, "B", ValueError), (-1, 4, "B", ValueError), (2.0, 4, "B", TypeError), (True, 4, "B", TypeError),
     ("2", 4, "B", TypeError), (2, 0, "T", ValueError), (2, -3, "T", ValueError), (2, 1.5, "T", TypeError),
     (2, None, "T", TypeError)],
)
def test_bad_shape_raises_naming_argument(kind, B, T, bad, exc):
    """Not an integer: TypeError; an integer out of range: ValueError (the package's one rule)."""
    with pytest.raises(exc, match=rf"\b{bad}\b"):
        GENERATORS[kind](B, T, 0)
    with pytest.raises(exc, match=rf"\b{bad}\b"):
        make_ids(kind, B, T, seed=0)


@pytest.mark.parametrize("kind", [None, "", "Uniform", "zipfian", "random", 3])
def test_unknown_kind_raises_naming_kind(kind):
    with pytest.raises(ValueError, match=r"\bkind\b"):
        make_ids(kind, 2, 2, seed=0)


@pytest.mark.parametrize("V, exc", [(0, ValueError), (-5, ValueError), (2.5, TypeError), (True, TypeError),
                                    (None, TypeError), (2**31, ValueError)])
@pytest.mark.parametrize("kind", ["uniform", "zipf", "real"])
def test_bad_vocab_raises_naming_V(kind, V, exc):
    with pytest.raises(exc, match=r"\bV\b"):
        make_ids(kind, 2, 2, seed=0, V=V)


@pytest.mark.parametrize("fn", [uniform_ids, zipf_ids])
def test_bad_vocab_direct(fn):
    with pytest.raises(ValueError, match=r"\bV\b"):
        fn(2, 2, 0, seed=0)


@pytest.mark.parametrize("V", [1, 50000, GPT2_VOCAB_SIZE - 1])
def test_real_requires_full_gpt2_vocab(V):
    with pytest.raises(ValueError, match=r"\bV\b"):
        make_ids("real", 2, 2, seed=0, V=V)


def test_real_accepts_padded_vocab():
    # llm.c pads the vocabulary to 50304 for the kernels; real ids still fit.
    ids = make_ids("real", 2, 8, seed=0, V=50304)
    assert ids.max() < GPT2_VOCAB_SIZE


@pytest.mark.parametrize("s, exc", [(-0.1, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                    ("1.1", TypeError), (None, TypeError), (True, TypeError)])
def test_bad_zipf_exponent_raises_naming_s(s, exc):
    with pytest.raises(exc, match=r"\bs\b"):
        zipf_ids(2, 2, s=s, seed=0)
