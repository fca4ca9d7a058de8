"""Calls from several threads: the rule of docs/reliability.md ("Threads and streams"), tested.

* Calls that write the same memory serialize (``memory.SPAN_LOCK``): no update is lost. Tested with
  gradients of small integers, whose sums are exact in bf16 and fp32 whatever the order, so the result of
  many threads must be bitwise the serial result, for every method (the atomic ones included, which work on
  fp32 copies written back whole and lose updates without the lock); and with random values, whose sum must
  stay within the error bound of the float64 sum of every call.
* Calls on separate outputs run side by side and give the single-threaded bits.
* On the GPU (``gpu`` mark): threads on separate CuPy streams give the single-threaded bits (the per-stream
  bucket-table workspace and chunk partials included), threads sharing the default stream and the outputs
  serialize, and with two GPUs, one thread per device gives each device the mirror's bits.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, reference, validate
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.memory import SpanLock
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

BF16 = np.dtype(bfloat16)
FP32 = np.dtype(np.float32)
COMBOS = [pytest.param((dtype, method), id=f"{name}-{method}")
          for method in validate.METHODS for dtype, name in ((BF16, "bf16"), (FP32, "fp32"))
          if not (method == "atomic_bf16" and dtype == FP32)]
DETERMINISTIC = [m for m in ("bucketed", "chunked") if m in validate.METHODS]
THREADS, CALLS = 8, 3
B, T, C, V = 2, 16, 64, 9


@pytest.fixture(autouse=True)
def often_switching_threads():
    """Switch threads every 10 us instead of 5 ms, so that unserialized calls would interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def run_threads(work, n: int = THREADS):
    """``work(i)`` for i in 0..n-1 on n threads that start together; returns the results in order of i."""
    start = threading.Barrier(n)

    def task(i):
        start.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(task, range(n)))


def integer_calls(rng, dtype, n_calls: int):
    """Gradients of small integers: every partial sum below is exact in bf16 (|x| <= 256) and fp32."""
    dwte = rng.integers(-4, 5, (V, C)).astype(dtype)
    dwpe = rng.integers(-4, 5, (T, C)).astype(dtype)
    calls = [(rng.integers(-1, 2, (B, T, C)).astype(dtype), rng.integers(0, V, (B, T), dtype=np.int32), seed)
             for seed in range(n_calls)]
    terms_per_row = np.bincount(np.concatenate([inp.reshape(-1) for _, inp, _ in calls]), minlength=V)
    assert 4 + max(int(terms_per_row.max()), B * n_calls) <= 256  # every partial sum is an exact bf16 integer
    return dwte, dwpe, calls


def serial(dwte, dwpe, calls, method, xp=np):
    dwte, dwpe = xp.asarray(dwte).copy(), xp.asarray(dwpe).copy()
    for dout, inp, seed in calls:
        enc.encoder_backward(dwte, dwpe, xp.asarray(dout), xp.asarray(inp), seed=seed, method=method)
    return to_numpy(dwte), to_numpy(dwpe)


@pytest.mark.parametrize("combo", COMBOS)
def test_threads_sharing_outputs_lose_no_update(rng, combo):
    """8 threads x 3 calls into one dwte/dwpe: bitwise the serial result (exact integer sums)."""
    dtype, method = combo
    dwte0, dwpe0, calls = integer_calls(rng, dtype, THREADS * CALLS)
    expected = serial(dwte0, dwpe0, calls, method)
    dwte, dwpe = dwte0.copy(), dwpe0.copy()

    def work(i):
        for dout, inp, seed in calls[i::THREADS]:
            enc.encoder_backward(dwte, dwpe, dout, inp, seed=seed, method=method)

    run_threads(work)
    assert compare.bitwise_equal(dwte, expected[0]) and compare.bitwise_equal(dwpe, expected[1])


@pytest.mark.parametrize("method", validate.METHODS)
def test_threads_sharing_outputs_random_values_within_bound(rng, method):
    """Random bf16 gradients, 8 threads x 3 calls: within the error bound of the float64 sum of all 24 calls.

    A lost update would miss a whole call's contribution, far outside the bound. The bound grows with the
    number of roundings: 24 calls, each rounding to bf16 once, so 24 bf16 ulps of the magnitude, plus the
    fp32 sums.
    """
    p = random_problem(B, T, C, V, T, dtype=BF16, rng=rng)
    douts = [random_problem(B, T, C, V, T, dtype=BF16, rng=rng) for _ in range(THREADS * CALLS)]
    dwte, dwpe = p.dwte.copy(), p.dwpe.copy()

    def work(i):
        for k in range(i, len(douts), THREADS):
            enc.encoder_backward(dwte, dwpe, douts[k].dout, douts[k].inp, seed=k, method=method)

    run_threads(work)
    exact_te, exact_tp = p.dwte.astype(np.float64), p.dwpe.astype(np.float64)
    abs_te, abs_tp = np.abs(exact_te), np.abs(exact_tp)
    max_terms = 0
    for q in douts:
        ref = reference.backward(np.zeros((V, C)), np.zeros((T, C)), q.dout, q.inp)
        exact_te, exact_tp = exact_te + ref.dwte, exact_tp + ref.dwpe
        abs_te, abs_tp = abs_te + ref.dwte_abs, abs_tp + ref.dwpe_abs
        max_terms = max(max_terms, ref.max_terms)
    per_add = method == "atomic_bf16"
    calls = len(douts)
    for got, exact, magnitude in ((dwte, exact_te, abs_te), (dwpe, exact_tp, abs_tp)):
        bound = calls * compare.error_bound(BF16, magnitude, max_terms, rounding_per_add=per_add)
        assert compare.within_bound(got, exact, bound)


@pytest.mark.parametrize("combo", COMBOS)
def test_threads_on_separate_outputs_give_single_threaded_bits(rng, combo):
    """Each thread its own problem: the bits of the same calls made one after another on one thread.

    The atomic methods are nondeterministic, so they get integer gradients (exact in any order); the
    deterministic methods get random ones.
    """
    dtype, method = combo
    if method in DETERMINISTIC:
        problems = [random_problem(B, T, C, V, T, dtype=dtype, rng=rng) for _ in range(THREADS)]
        jobs = [(q.dwte, q.dwpe, [(q.dout, q.inp, 100 + i)]) for i, q in enumerate(problems)]
    else:
        jobs = [integer_calls(rng, dtype, CALLS) for _ in range(THREADS)]
    expected = [serial(dwte, dwpe, calls, method) for dwte, dwpe, calls in jobs]
    got = run_threads(lambda i: serial(*jobs[i], method))
    for (te, tp), (want_te, want_tp) in zip(got, expected):
        assert compare.bitwise_equal(te, want_te) and compare.bitwise_equal(tp, want_tp)


# ----------------------------------------------------------------------------------------------------------
# the lock itself


def _blocks(writes_a, reads_a, writes_b, reads_b) -> bool:
    """Whether a call holding (writes_a, reads_a) keeps one asking for (writes_b, reads_b) waiting."""
    lock, entered = SpanLock(), threading.Event()

    def second():
        with lock.hold(writes_b, reads_b):
            entered.set()

    with lock.hold(writes_a, reads_a):
        thread = threading.Thread(target=second)
        thread.start()
        blocked = not entered.wait(0.2)
    thread.join(5)
    assert entered.is_set(), "the second call never got the lock after the first released it"
    return blocked


def test_span_lock_rules():
    buffer = np.zeros(64, dtype=np.float32)
    left, right, other = buffer[:32], buffer[32:], np.zeros(8, dtype=np.float32)
    assert _blocks([buffer], [], [left], [])  # writer vs overlapping writer
    assert _blocks([left], [], [], [buffer])  # writer vs overlapping reader
    assert not _blocks([left], [], [right], [])  # disjoint writers run side by side
    assert not _blocks([other], [buffer], [], [left])  # readers share


def test_span_lock_sees_two_maps_of_one_file(tmp_path):
    path = tmp_path / "one.bin"
    np.zeros(1024, dtype=np.float32).tofile(path)
    a = np.memmap(path, dtype=np.float32, mode="r+", shape=(1024,))
    b = np.memmap(path, dtype=np.float32, mode="r+", shape=(512,), offset=2048)
    assert _blocks([a], [], [b], [])


# ----------------------------------------------------------------------------------------------------------
# GPU: streams, the shared default stream, two devices


def _cupy():
    import cupy

    return cupy


@pytest.mark.gpu
@pytest.mark.parametrize("method", DETERMINISTIC)
@pytest.mark.parametrize("dtype", [pytest.param(BF16, id="bf16"), pytest.param(FP32, id="fp32")])
def test_gpu_threads_on_separate_streams(rng, dtype, method):
    """One thread and one non-blocking stream per problem, all of one size (so the per-stream workspaces have
    the same shapes): each thread's result has the bits of the NumPy mirror, with the bucket table built on
    the GPU and on the CPU."""
    cupy = _cupy()
    problems = [random_problem(2, 128, 256, 50257, 128, dtype=dtype, ids="zipf", rng=rng) for _ in range(THREADS)]
    expected = []
    for i, q in enumerate(problems):
        cpu = q.on(np)
        for k in range(CALLS):
            enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=7 * i + k, method=method)
        expected.append((cpu.dwte, cpu.dwpe))
    for bucketing in ("gpu", "cpu"):

        def work(i):
            q, stream = problems[i], cupy.cuda.Stream(non_blocking=True)
            with stream:
                g = q.on(cupy)
                for k in range(CALLS):
                    enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=7 * i + k, method=method,
                                         bucketing=bucketing)
                stream.synchronize()
                return to_numpy(g.dwte), to_numpy(g.dwpe)

        for i, (te, tp) in enumerate(run_threads(work)):
            assert compare.bitwise_equal(te, expected[i][0]) and compare.bitwise_equal(tp, expected[i][1]), \
                (bucketing, i)


@pytest.mark.gpu
def test_gpu_streams_interleaved_from_one_thread(rng):
    """Calls queued alternately on two streams from one thread, without syncs: each stream's bits are the
    mirror's (the GPU bucketing workspace and chunk partials are per stream)."""
    cupy = _cupy()
    problems = [random_problem(4, 256, 768, 50257, 256, dtype=BF16, ids="zipf", rng=rng) for _ in range(2)]
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in problems]
    on_gpu = []
    for q, stream in zip(problems, streams):
        with stream:
            on_gpu.append(q.on(cupy))
    for k in range(CALLS):
        for g, stream in zip(on_gpu, streams):
            with stream:
                enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=k, method=DETERMINISTIC[-1])
    for q, g, stream in zip(problems, on_gpu, streams):
        stream.synchronize()
        cpu = q.on(np)
        for k in range(CALLS):
            enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=k, method=DETERMINISTIC[-1])
        assert compare.bitwise_equal(g.dwte, cpu.dwte) and compare.bitwise_equal(g.dwpe, cpu.dwpe)


@pytest.mark.gpu
@pytest.mark.parametrize("combo", COMBOS)
def test_gpu_threads_sharing_outputs_on_the_default_stream(rng, combo):
    """Threads on the (shared) default stream adding into one dwte/dwpe: bitwise the serial result."""
    cupy = _cupy()
    dtype, method = combo
    dwte0, dwpe0, calls = integer_calls(rng, dtype, THREADS * CALLS)
    expected = serial(dwte0, dwpe0, calls, method)
    dwte, dwpe = cupy.asarray(dwte0), cupy.asarray(dwpe0)
    on_gpu = [(cupy.asarray(dout), cupy.asarray(inp), seed) for dout, inp, seed in calls]

    def work(i):
        for dout, inp, seed in on_gpu[i::THREADS]:
            enc.encoder_backward(dwte, dwpe, dout, inp, seed=seed, method=method)

    run_threads(work)
    cupy.cuda.Device().synchronize()
    assert compare.bitwise_equal(dwte, expected[0]) and compare.bitwise_equal(dwpe, expected[1])


@pytest.mark.gpu
def test_two_gpus_one_thread_each(rng):
    """With two GPUs: one thread per device, each running the backward on its own arrays: the mirror's bits."""
    cupy = _cupy()
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    problems = [random_problem(4, 128, 768, 50257, 128, dtype=BF16, ids="zipf", rng=rng) for _ in range(2)]

    def work(i):
        with cupy.cuda.Device(i):
            g = problems[i].on(cupy)
            for method in DETERMINISTIC:
                enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=i, method=method)
            cupy.cuda.Device(i).synchronize()
            return to_numpy(g.dwte), to_numpy(g.dwpe)

    got = run_threads(work, 2)
    for q, (te, tp) in zip(problems, got):
        cpu = q.on(np)
        for method in DETERMINISTIC:
            enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=problems.index(q), method=method)
        assert compare.bitwise_equal(te, cpu.dwte) and compare.bitwise_equal(tp, cpu.dwpe)

