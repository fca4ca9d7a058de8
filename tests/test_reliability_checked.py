"""What is validated is what runs (docs/reliability.md, "What a call checks is what it runs on").

A public call takes ``memory.SPAN_LOCK`` on the memory it writes and reads *before* it validates, so no other call
can change its ids, or flip an output's ``writeable`` flag, between the check and the run. The tests park a call on
the lock (the test holds the memory, as another call would), change what the call will read while it waits, release
the lock, and check that the call refuses what it finds (a ``ValueError`` naming the argument) with every output as
it was. The copies into the outputs go through views of the call's own, so a flag flipped while the call runs leaves
the outputs as they were or entirely written, never half (a race, run many times).
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, memory, validate
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

BF16 = np.dtype(bfloat16)
B, T, C, V = 2, 8, 32, 16


def wait_until(predicate, timeout: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.0005)


class Call(threading.Thread):
    """``function(**kwargs)`` on a thread of its own; ``error`` is what it raised, if anything."""

    def __init__(self, function, **kwargs):
        super().__init__(daemon=True)
        self.function, self.kwargs, self.error = function, kwargs, None

    def run(self):
        try:
            self.function(**self.kwargs)
        except Exception as exc:  # handed to the test thread
            self.error = exc


def parked(function, **kwargs) -> Call:
    """Start ``function(**kwargs)`` while the test holds some of its memory; return once the call waits for it."""
    call = Call(function, **kwargs)
    call.start()
    wait_until(lambda: memory.SPAN_LOCK.waiting == 1)
    return call


@pytest.mark.parametrize("method", validate.METHODS)
def test_ids_written_while_the_call_waits_are_checked(xp, rng, method):
    """The ids are the bytes of a forward's ``out``, written while the backward waits.

    The ids were zeros (valid) when the call started; the "forward" writes -3 into them before it lets go. The
    call must check the ids it runs on: a ValueError naming inp, and row V-3 (where -3 would wrap) untouched.
    """
    p = random_problem(B, T, C, V, T, dtype=BF16 if method == "atomic_bf16" else np.float32, rng=rng)
    forward_out = xp.zeros((B, T, C), dtype=np.float32)
    ids = forward_out.reshape(-1).view(np.int32)[: B * T].reshape(B, T)  # ids viewing the forward's output
    dwte, dwpe = xp.asarray(p.dwte), xp.asarray(p.dwpe)
    with memory.SPAN_LOCK.hold(writes=(forward_out,)):
        call = parked(enc.encoder_backward, dwte=dwte, dwpe=dwpe, dout=xp.asarray(p.dout), inp=ids, seed=1,
                      method=method)
        ids[0, 1] = -3  # the forward writes while the backward waits (on the GPU: on the same, default stream)
    call.join(timeout=30)
    assert isinstance(call.error, ValueError) and "inp" in str(call.error) and "-3" in str(call.error), call.error
    assert compare.bitwise_equal(to_numpy(dwte), p.dwte) and compare.bitwise_equal(to_numpy(dwpe), p.dwpe)


def test_forward_ids_written_while_the_call_waits_are_checked(xp, rng):
    """The same for the forward: an id of V written while it waits is refused; ``out`` keeps its bits."""
    p = random_problem(B, T, C, V, T, dtype=np.float32, rng=rng)
    ids = xp.asarray(p.inp)
    out = xp.full((B, T, C), np.nan, dtype=np.float32)
    with memory.SPAN_LOCK.hold(writes=(ids,)):
        call = parked(enc.encoder_forward, inp=ids, wte=xp.asarray(p.wte), wpe=xp.asarray(p.wpe), out=out)
        ids[1, 2] = V
    call.join(timeout=30)
    assert isinstance(call.error, ValueError) and f"token id {V}" in str(call.error), call.error
    assert np.isnan(to_numpy(out)).all()


@pytest.mark.parametrize("flipped", ["dwte", "dwpe"])
@pytest.mark.parametrize("method", validate.METHODS)
def test_output_made_read_only_while_the_call_waits(rng, method, flipped):
    """An output's ``writeable`` flag cleared while the call waits: refused by name, and the other output unchanged.

    (Checked only before the wait, the call would write dwpe and then fail on dwte with NumPy's read-only error.)
    """
    p = random_problem(B, T, C, V, T, dtype=BF16 if method == "atomic_bf16" else np.float32, rng=rng)
    arrays = {"dwte": p.dwte.copy(), "dwpe": p.dwpe.copy()}
    with memory.SPAN_LOCK.hold(writes=(arrays[flipped],)):
        call = parked(enc.encoder_backward, **arrays, dout=p.dout, inp=p.inp, seed=1, method=method)
        arrays[flipped].flags.writeable = False
    call.join(timeout=30)
    assert isinstance(call.error, ValueError) and f"{flipped} is read-only" in str(call.error), call.error
    assert compare.bitwise_equal(arrays["dwte"], p.dwte) and compare.bitwise_equal(arrays["dwpe"], p.dwpe)


@pytest.fixture
def often_switching_threads():
    """Switch threads every 10 us instead of 5 ms, so that a flip can land anywhere in a call."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


@pytest.mark.usefixtures("often_switching_threads")
@pytest.mark.parametrize("method", ["chunked", "atomic"])
def test_flag_flipped_during_the_call_gives_all_or_nothing(rng, method):
    """50 calls, each with a thread that clears dwte's ``writeable`` flag at a random moment of the call.

    Each call either completes (both outputs hold the result of an undisturbed call) or is refused by name with
    both outputs as they were. Small-integer gradients make every method's result exact, so "the result" is one.
    """
    dwte0 = rng.integers(-4, 5, (V, C)).astype(np.float32)
    dwpe0 = rng.integers(-4, 5, (T, C)).astype(np.float32)
    dout = rng.integers(-2, 3, (B, T, C)).astype(np.float32)
    inp = rng.integers(0, V, (B, T), dtype=np.int32)
    expected_te, expected_tp = dwte0.copy(), dwpe0.copy()
    began = time.perf_counter()
    enc.encoder_backward(expected_te, expected_tp, dout, inp, seed=3, method=method)
    duration = time.perf_counter() - began
    outcomes = set()
    for _ in range(50):
        dwte, dwpe = dwte0.copy(), dwpe0.copy()
        flipper = threading.Timer(rng.uniform(0, 1.2 * duration), lambda d=dwte: setattr(d.flags, "writeable", False))
        flipper.start()
        try:
            enc.encoder_backward(dwte, dwpe, dout, inp, seed=3, method=method)
            outcome = "written"
        except ValueError as exc:
            assert "dwte is read-only" in str(exc), exc
            outcome = "refused"
        flipper.join()
        expected = (expected_te, expected_tp) if outcome == "written" else (dwte0, dwpe0)
        assert compare.bitwise_equal(dwte, expected[0]) and compare.bitwise_equal(dwpe, expected[1]), outcome
        outcomes.add(outcome)
    assert outcomes  # at least one call ran; which outcomes occur depends on timing
