"""Nothing half-written on the NumPy path (docs/reliability.md, "All or nothing on the NumPy path").

The mirror computes a call's results into private buffers and copies them into the outputs only when everything is
computed, with ``KeyboardInterrupt`` held back during the copies. So:

* with ``check_ids=False`` an id of V or above, or below 0, is still refused by the mirror (ValueError naming inp,
  every output as it was), not left to NumPy's indexing, which raises a raw ``IndexError`` once dwpe is written or
  wraps a negative id to a row counted from the end;
* an interrupt at any moment of a call leaves every output as it was or entirely written (many interrupts, at
  random moments, through the real SIGINT machinery: ``_thread.interrupt_main``).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, memory, validate
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

BF16 = np.dtype(bfloat16)
B, T, C, V = 2, 8, 32, 16


def _dtype(method):
    return BF16 if method == "atomic_bf16" else np.float32


@pytest.mark.parametrize("bad_id", [V, V + 1000, -1, -3])
@pytest.mark.parametrize("method", validate.METHODS)
def test_backward_bad_ids_without_check_refused_by_the_mirror(rng, method, bad_id):
    p = random_problem(B, T, C, V, T, dtype=_dtype(method), rng=rng)
    inp = p.inp.copy()
    inp[1, T - 1] = bad_id
    dwte, dwpe = p.dwte.copy(), p.dwpe.copy()
    with pytest.raises(ValueError, match=rf"inp holds token id {bad_id}, outside \[0, V\)"):
        enc.encoder_backward(dwte, dwpe, p.dout, inp, seed=4, method=method, check_ids=False)
    assert compare.bitwise_equal(dwte, p.dwte) and compare.bitwise_equal(dwpe, p.dwpe)


@pytest.mark.parametrize("bad_id", [V, -1])
def test_forward_bad_ids_without_check_refused_by_the_mirror(rng, bad_id):
    p = random_problem(B, T, C, V, T, dtype=np.float32, rng=rng)
    inp = p.inp.copy()
    inp[0, 0] = bad_id
    out = np.full((B, T, C), np.nan, dtype=np.float32)
    with pytest.raises(ValueError, match=rf"inp holds token id {bad_id}"):
        enc.encoder_forward(inp, p.wte, p.wpe, out=out, check_ids=False)
    assert np.isnan(out).all()


def test_deferred_interrupt_delivers_after_the_block():
    """SIGINT inside ``memory.deferred_interrupt`` is raised as KeyboardInterrupt once the block is done."""
    steps, handler = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with memory.deferred_interrupt():
            signal.raise_signal(signal.SIGINT)
            steps.append("after the signal")
    assert steps == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is handler


def _integer_problem(rng, dtype):
    """Small-integer gradients: every method's result is exact, so the result of an undisturbed call is one."""
    Vb, Tb, Bb, Cb = 256, 128, 4, 256
    return (rng.integers(-4, 5, (Vb, Cb)).astype(dtype), rng.integers(-4, 5, (Tb, Cb)).astype(dtype),
            rng.integers(-2, 3, (Bb, Tb, Cb)).astype(dtype), rng.integers(0, Vb, (Bb, Tb), dtype=np.int32))


def _duration(call) -> float:
    """The shortest of three runs of ``call``, in seconds."""
    times = []
    for _ in range(3):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return min(times)


@pytest.mark.parametrize("method", validate.METHODS)
def test_interrupt_anywhere_leaves_outputs_whole(rng, method):
    """40 calls, each interrupted (SIGINT) at a random moment in and around it: both outputs as they were, or both
    the result of an undisturbed call."""
    dwte0, dwpe0, dout, inp = _integer_problem(rng, _dtype(method))
    expected_te, expected_tp = dwte0.copy(), dwpe0.copy()
    enc.encoder_backward(expected_te, expected_tp, dout, inp, seed=7, method=method)
    duration = _duration(lambda: enc.encoder_backward(dwte0.copy(), dwpe0.copy(), dout, inp, seed=7, method=method))
    seen = {"as it was": 0, "written": 0}
    for i in range(40):
        dwte, dwpe = dwte0.copy(), dwpe0.copy()
        timer = threading.Timer(duration * (i + 0.5) / 36, _thread.interrupt_main)  # spread over the call and after
        interrupted = False
        try:
            timer.start()
            enc.encoder_backward(dwte, dwpe, dout, inp, seed=7, method=method)
            timer.join()
            time.sleep(0.002)  # the interrupt, if it came after the call, is raised here
        except KeyboardInterrupt:
            interrupted = True
        timer.join()
        as_it_was = compare.bitwise_equal(dwte, dwte0) and compare.bitwise_equal(dwpe, dwpe0)
        written = compare.bitwise_equal(dwte, expected_te) and compare.bitwise_equal(dwpe, expected_tp)
        assert as_it_was or written, f"call {i} (interrupted: {interrupted}) left the outputs half-written"
        seen["written" if written else "as it was"] += 1
    assert seen["as it was"] > 0, seen  # interrupts landed inside calls (those late in the spread land after them)


def test_interrupt_anywhere_leaves_forward_out_whole(rng):
    p = random_problem(4, 64, 256, 512, 64, dtype=BF16, rng=rng)
    expected = enc.encoder_forward(p.inp, p.wte, p.wpe)
    duration = _duration(lambda: enc.encoder_forward(p.inp, p.wte, p.wpe, out=np.empty_like(expected)))
    for i in range(30):
        out = np.full_like(expected, np.nan)
        timer = threading.Timer(duration * (i + 0.5) / 26, _thread.interrupt_main)
        try:
            timer.start()
            enc.encoder_forward(p.inp, p.wte, p.wpe, out=out)
            timer.join()
            time.sleep(0.002)
        except KeyboardInterrupt:
            pass
        timer.join()
        assert np.isnan(out.astype(np.float32)).all() or compare.bitwise_equal(out, expected), f"call {i}"
