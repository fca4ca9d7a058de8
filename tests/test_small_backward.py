"""The chunked method's backward of one short batch in one launch (``kernels/encoder_backward_small.cu``).

For at most 1024 ids, a chunked call on the GPU launches one kernel whose every block sorts the ids itself, instead
of a bucket table, the chunk and combine kernels and the wpe kernel (``cuda.encoder_backward_small``). It must give
those kernels' bits, which the NumPy mirror gives, for any grid, and its own mirror (``mirror.encoder_backward_small``)
must too. Cases: tokens seen once, a few times (warp tasks, at most 8 positions), more (block tasks), and so often
that a block needs several passes of 8 chunks; channel groups with idle lanes; positions past T left alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, cuda, methods, mirror
from gpt2enc_edu.layout import CHUNK_ITEMS, SMALL_BACKWARD_MAX_BT, SMALL_BACKWARD_THREADS
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]
#: (B, T, maxT, ids, positions given one token): a whole sequence; a token in 19 chunks (three passes of a block);
#: several sequences; one position.
SHAPES = {
    "sequence": (1, 1024, 1024, "zipf", 0),
    "nineteen-chunks": (1, 1024, 1030, "real", 600),
    "batch": (3, 300, 301, "uniform", 40),
    "one-position": (1, 1, 2, "uniform", 0),
}


def _problem(rng, shape: str, dtype):
    B, T, maxT, ids, repeated = SHAPES[shape]
    C = 264 if dtype == bfloat16 else 132  # a last channel group with idle lanes
    p = random_problem(B, T, C, 50257, maxT=maxT, dtype=dtype, ids=ids, rng=rng)
    p.inp.reshape(-1)[rng.permutation(B * T)[:repeated]] = int(rng.integers(50257))  # one token at random places
    return p


def _mirror_of_the_call(p, seed):
    """dwte, dwpe of the public chunked call on NumPy arrays (a table built on the host, the chunked mirrors)."""
    g = p.on(np)
    enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method="chunked")
    return g.dwte, g.dwpe


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernels_mirror_gives_the_chunked_bits(rng, dtype, shape):
    p = _problem(rng, shape, dtype)
    seed = int(rng.integers(2**32))
    g = p.on(np)
    B, T = g.inp.shape
    mirror.encoder_backward_small(g.dwte, g.dwpe, g.dout, g.inp, B, T, g.dout.shape[2], seed)
    expected = _mirror_of_the_call(p, seed)
    assert compare.bitwise_equal(g.dwte, expected[0])
    assert compare.bitwise_equal(g.dwpe, expected[1])
    assert not compare.bitwise_equal(g.dwte, p.dwte)  # it did write


def test_the_kernel_takes_one_sequence():
    assert SMALL_BACKWARD_MAX_BT == 2 * SMALL_BACKWARD_THREADS == 32 * CHUNK_ITEMS
    assert methods.small_backward_fits(1024, 50257)
    assert not methods.small_backward_fits(1025, 50257)
    assert not methods.small_backward_fits(1, 1 << 23)  # its ids must fit the key beside a 10-bit position
    p = random_problem(1, 1025, 8, 10)
    before = p.dwte.copy(), p.dwpe.copy()
    with pytest.raises(ValueError, match="at most 1024 ids"):
        mirror.encoder_backward_small(p.dwte, p.dwpe, p.dout, p.inp, 1, 1025, 8, 0)
    assert compare.bitwise_equal(p.dwte, before[0]) and compare.bitwise_equal(p.dwpe, before[1])  # nothing written


def test_one_launch_is_decided_in_one_place():
    """``methods.one_launch_backward``, which the dispatch, the adapter, the bench and the sanitizer driver ask: the
    chunked method, its table left to the GPU in the call, and a batch the kernel takes."""
    assert methods.one_launch_backward("chunked", "auto", SMALL_BACKWARD_MAX_BT, 50257)
    assert methods.one_launch_backward("chunked", "gpu", 1, 50257)
    assert not methods.one_launch_backward("chunked", "gpu", SMALL_BACKWARD_MAX_BT + 1, 50257)  # too many ids
    assert not methods.one_launch_backward("chunked", "gpu", 1, 1 << 23)  # ids too large for its keys
    assert not methods.one_launch_backward("chunked", "cpu", 1, 50257)  # the table comes from the host
    assert not methods.one_launch_backward("chunked", "auto", 1, 50257, buckets_given=True)  # the table is given
    for method in ("bucketed", "atomic", "atomic_bf16"):
        assert not methods.one_launch_backward(method, "gpu", 1, 50257)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_gives_the_mirrors_bits_for_any_grid(rng, dtype, shape):
    import cupy

    from gpt2enc_edu.loader import device_facts, get_kernel, launch

    p = _problem(rng, shape, dtype)
    seed = int(rng.integers(2**32))
    expected = _mirror_of_the_call(p, seed)
    kernel = get_kernel("encoder_backward_small.cu", "encoder_backward_small_kernel", dtype)
    B, T = p.inp.shape
    for grid in (1, 7, device_facts().sm_count, 300):
        g = p.on(cupy)
        launch(kernel, grid, SMALL_BACKWARD_THREADS,
               (g.dwte, g.dwpe, g.inp, g.dout, np.int32(B), np.int32(T), np.int32(p.dout.shape[2]), np.uint32(seed)))
        assert compare.bitwise_equal(g.dwte, expected[0]), grid
        assert compare.bitwise_equal(g.dwpe, expected[1]), grid


@pytest.mark.gpu
def test_a_short_chunked_call_launches_only_the_one_kernel(rng, monkeypatch):
    """At 1024 ids the chunked call builds no table and runs no wpe kernel; at 1025 it does both, as before."""
    import cupy

    def refuse(*args, **kwargs):
        raise AssertionError("a short chunked call should launch encoder_backward_small only")

    for T in (SMALL_BACKWARD_MAX_BT, SMALL_BACKWARD_MAX_BT + 1):
        p = random_problem(1, T, 64, 500, dtype=bfloat16, ids="zipf", rng=rng)
        seed = int(rng.integers(2**32))
        expected = _mirror_of_the_call(p, seed)
        with monkeypatch.context() as patch:
            built = []
            if T <= SMALL_BACKWARD_MAX_BT:
                patch.setattr(cuda, "build_bucket_table_gpu", refuse)
                patch.setattr(cuda, "encoder_backward_wpe", refuse)
            else:
                real = cuda.build_bucket_table_gpu
                patch.setattr(cuda, "build_bucket_table_gpu", lambda *a, **k: built.append(1) or real(*a, **k))
                patch.setattr(cuda, "encoder_backward_small", refuse)
            g = p.on(cupy)
            enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method="chunked")
            assert built == ([] if T <= SMALL_BACKWARD_MAX_BT else [1])
        assert compare.bitwise_equal(g.dwte, expected[0]) and compare.bitwise_equal(g.dwpe, expected[1])
