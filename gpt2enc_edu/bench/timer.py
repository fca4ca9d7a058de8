"""How a call is timed: CUDA events around it on a cold L2, host overhead hidden; the copy rate; host timing.

``GpuTimer`` (method): every repeat first writes a buffer twice the size of the L2 cache (so the inputs are
read from HBM, not from L2), then queues a short spin kernel (``kernels/bench_spin.cu``) so that the GPU is
busy while Python enqueues the call (the time is the GPU's, not Python's launch overhead), then records a CUDA
event, makes the call, records a second event. Warm-up calls first, then the repeats. If the spin ran out
before the call was fully enqueued, the repeat is counted in ``host_gap_frac``: its time may include host
work (a call that synchronizes with the host, like the CPU-bucketing route, always does; for it the time is
end to end, host work and copies included, by design).

``measure_copy_rate`` is the one place the device-to-device copy rate is measured; every floor of a run, and
every copy rate the docs quote, is that run's number (``meta.json``: ``copy_rate_GBps``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..encoder import make_buckets
from ..loader import get_kernel
from ..rounding import bfloat16
from ..validate import check_int

#: The device-to-device copy that sets the floor: bytes copied (read once, written once).
COPY_BYTES = 1 << 30
#: The spin kernel (file, kernel name).
SPIN_KERNEL = ("bench_spin.cu", "bench_spin_kernel")


@dataclass(frozen=True)
class Summary:
    """Median and 10th/90th percentiles (linear interpolation) of ``n`` samples, in the samples' unit."""

    median: float
    p10: float
    p90: float
    n: int

    def scaled(self, factor: float) -> "Summary":
        """The same summary in another unit (e.g. ``factor=1e6`` for seconds to microseconds)."""
        return Summary(self.median * factor, self.p10 * factor, self.p90 * factor, self.n)


def summarize(samples) -> Summary:
    """Summarize repeated timings; raises ``ValueError`` for no samples or a non-finite one."""
    values = np.asarray(list(samples), dtype=np.float64)
    if values.size == 0:
        raise ValueError("summarize needs at least one sample")
    if not np.all(np.isfinite(values)):
        raise ValueError("samples must be finite numbers")
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return Summary(float(median), float(p10), float(p90), int(values.size))


class GpuTimer:
    """CUDA-event timing of one callable on one stream: cold L2, host overhead hidden, warm-up, repeats.

    Each repeat, on ``stream``: write ``flush_bytes`` (evicts L2) -> spin ``spin_us`` -> event -> call ->
    event. During warm-up, if the spin ran out before the call was enqueued, the spin doubles (up to
    ``max_spin_us``), unless the case synchronizes with the host by design (``host_sync``: no spin; the
    stream is drained before the first event, so the time is end to end from the start of the call).
    """

    def __init__(self, cp, *, flush_bytes: int, spin_us: float = 500.0, max_spin_us: float = 8000.0):
        self.cp = cp
        self.flush_bytes = check_int("flush_bytes", flush_bytes, minimum=1)
        self.spin_us = float(spin_us)
        self.max_spin_us = float(max_spin_us)
        self._flush = cp.empty(self.flush_bytes, dtype=cp.uint8)
        self._spin = get_kernel(*SPIN_KERNEL, bfloat16)  # any storage dtype: the source does not use it
        self._start, self._end = cp.cuda.Event(), cp.cuda.Event()

    def _repeat(self, fn, stream, index: int, spin_ns: int) -> tuple[float, bool]:
        """One timed call: (seconds between the events, whether the GPU may have waited for the host)."""
        with stream:
            self._flush.fill(index % 255 + 1)
            if spin_ns:
                # launched directly, not through loader.launch: its grid is fixed and it must cost nothing
                self._spin((1,), (1,), (np.uint64(spin_ns),))
            else:  # end to end: the GPU is idle when the call starts, so its host work is inside the events
                stream.synchronize()
            self._start.record(stream)
            fn()
            self._end.record(stream)
            ran_dry = self._start.done  # the spin was over before the call had been fully enqueued
        self._end.synchronize()
        return self.cp.cuda.get_elapsed_time(self._start, self._end) * 1e-3, bool(ran_dry)

    def time(self, fn, stream, *, warmup: int, repeats: int, host_sync: bool = False) -> tuple[list[float], float]:
        """Seconds of each of ``repeats`` calls after ``warmup`` calls, and the share that ran dry."""
        warmup = check_int("warmup", warmup, minimum=0)
        repeats = check_int("repeats", repeats, minimum=1)
        spin_ns = 0 if host_sync else int(self.spin_us * 1000)
        for i in range(warmup):
            _, ran_dry = self._repeat(fn, stream, i, spin_ns)
            if ran_dry and spin_ns and spin_ns < self.max_spin_us * 1000:
                spin_ns *= 2
        samples, dry = [], 0
        for i in range(repeats):
            seconds, ran_dry = self._repeat(fn, stream, warmup + i, spin_ns)
            samples.append(seconds)
            dry += ran_dry
        return samples, dry / repeats


def measure_copy_rate(cp, timer: GpuTimer, *, nbytes: int = COPY_BYTES, warmup: int = 3,
                      repeats: int = 20) -> tuple[float, Summary]:
    """Device-to-device ``cudaMemcpyAsync`` of ``nbytes``: (bytes read + written per second, time summary)."""
    nbytes = check_int("nbytes", nbytes, minimum=1)
    stream = cp.cuda.get_current_stream()
    buffers = [cp.empty(nbytes, dtype=cp.uint8), cp.empty(nbytes, dtype=cp.uint8)]
    buffers[0].fill(1)

    def copy():
        buffers[1].data.copy_from_device_async(buffers[0].data, nbytes, stream)

    samples, _ = timer.time(copy, stream, warmup=warmup, repeats=repeats)
    summary = summarize(samples)
    buffers.clear()
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / summary.median, summary


def time_make_buckets(inp_host: np.ndarray, C: int = 768, dtype=bfloat16, *, warmup: int = 1,
                      repeats: int = 5) -> list[float]:
    """Seconds per ``make_buckets`` call (NumPy, on the host), by ``time.perf_counter``. Runs anywhere."""
    repeats = check_int("repeats", repeats, minimum=1)
    for _ in range(check_int("warmup", warmup, minimum=0)):
        make_buckets(inp_host, C, dtype)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        make_buckets(inp_host, C, dtype)
        samples.append(time.perf_counter() - start)
    return samples


def time_synchronised(fn, synchronize, *, warmup: int, repeats: int) -> list[float]:
    """Seconds per call of ``fn`` by ``time.perf_counter``, each call between two ``synchronize()`` calls: the GPU is
    idle when it starts and done when the clock stops, so the time is the host's work and the GPU's together, as a
    training loop sees a step (the bench's ``step`` cases)."""
    return time_synchronised_in_turn({"fn": fn}, synchronize, warmup=warmup, repeats=repeats)["fn"]


#: ``meta.json``'s ``step_timing`` for a run whose ``step`` cases were timed in turn (``time_synchronised_in_turn``);
#: runs without the key timed each step in a block of its own, and their step rows compare less well.
STEP_TIMING_IN_TURN = "in turn"


def time_synchronised_in_turn(fns: dict, synchronize, *, warmup: int, repeats: int) -> dict[str, list[float]]:
    """``time_synchronised`` for several calls (name -> call) at once, taken in turn: each repeat times every call
    once, starting one further along at each repeat. A host's speed drifts from one stretch of time to the next (its
    clock, other processes, the allocator's state) by more than the difference between two steps; in turn, every
    call meets the same stretches, so their medians compare. The bench's ``step`` cases of one workload are timed
    so. Returns each call's samples, in seconds."""
    repeats = check_int("repeats", repeats, minimum=1)
    warmup = check_int("warmup", warmup, minimum=0)
    names = list(fns)
    if not names:
        raise ValueError("time_synchronised_in_turn needs at least one call to time")
    for name in names:
        for _ in range(warmup):
            fns[name]()
    synchronize()
    samples = {name: [] for name in names}
    for r in range(repeats):
        first = r % len(names)
        for name in names[first:] + names[:first]:
            start = time.perf_counter()
            fns[name]()
            synchronize()
            samples[name].append(time.perf_counter() - start)
    return samples
