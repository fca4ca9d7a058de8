"""Time the encoder kernels on a GPU, next to PyTorch and next to the memory-bandwidth floor.

    python -m gpt2enc_edu.bench             # full run (about 1-2 minutes on an H200), writes docs/bench/
    python -m gpt2enc_edu.bench --quick     # B in {1, 64}, few repeats, writes docs/bench/quick/
    python -m gpt2enc_edu.bench --help

What is timed, at T=1024, C=768, V=50257, bf16, for every batch size B and token-id kind
(``tokens.make_ids``: uniform, Zipf, real GPT-2 text) -- see ``CASES``:

* ours: the forward; the atomic backward (fp32 accumulation, and bf16 atomics); the deterministic backward
  with the bucket table built on the CPU (llm.c's route: ids to the host, NumPy, table back to the GPU,
  a host sync included) and built on the GPU, and the chunked deterministic backward (GPU bucketing) --
  each end to end through the public API; the GPU bucket table alone;
* PyTorch, when ``import torch`` works and it sees the GPU: ``F.embedding`` + the position add, and the
  embedding backward (``embedding_dense_backward`` + the dwpe sum) with deterministic algorithms off and on;
* on the host: building the bucket table alone (``make_buckets``, NumPy), with ``time.perf_counter``.

Method (``GpuTimer``): every repeat first writes a buffer twice the size of the L2 cache (so the inputs are
read from HBM, not from L2), then queues a short spin kernel so that the GPU is busy while Python enqueues
the call (the time is the GPU's, not Python's launch overhead), then records a CUDA event, makes the call,
records a second event. Warm-up calls first, then the median and the 10th/90th percentiles of the repeats.
If the spin ran out before the call was fully enqueued, the repeat is counted in ``host_gap_frac``: its
time may include host work (a call that synchronizes with the host, like the CPU-bucketing route, always
does; for it the time is end to end, host work and copies included, by design).

The floor (``minimal_bytes``, ``percent_of_floor``): each input byte read once and each output byte
written once, divided by the device-to-device copy rate measured in the same run.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import importlib
import itertools
import json
import math
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..backend import gpu_status, to_numpy
from ..encoder import encoder_backward, encoder_forward, make_buckets
from ..problems import random_problem
from ..rounding import bfloat16
from ..tokens import GPT2_VOCAB_SIZE, KINDS, make_ids

# ----------------------------------------------------------------------------------------------------------
# The configuration space
# ----------------------------------------------------------------------------------------------------------
T_GPT2 = 1024  #: sequence length of GPT-2 (124M)
C_GPT2 = 768  #: channels of GPT-2 (124M)
BATCH_SIZES = (1, 4, 8, 16, 32, 64)
QUICK_BATCH_SIZES = (1, 64)
ID_KINDS = KINDS  #: ("uniform", "zipf", "real")
ID_BYTES = 4  #: token ids are int32
DEFAULT_OUT = Path("docs/bench")
QUICK_OUT = DEFAULT_OUT / "quick"

#: (repeats, warmup, host_repeats) of a full and of a quick run.
FULL_REPEATS = (100, 10, 20)
QUICK_REPEATS = (10, 3, 3)

#: Files a run writes into its output folder.
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
META_JSON = "meta.json"

#: The device-to-device copy that sets the floor: bytes copied (read once, written once).
COPY_BYTES = 1 << 30

# ----------------------------------------------------------------------------------------------------------
# Pure arithmetic: minimal bytes, the floor, summaries (no GPU needed; unit-tested on the CPU)
# ----------------------------------------------------------------------------------------------------------
OPS = ("forward", "backward")


def distinct_ids(inp) -> int:
    """How many different token ids a (B, T) batch holds (NumPy or CuPy): the wte rows the encoder touches."""
    return int(np.unique(to_numpy(inp)).size)


def _positive_int(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def minimal_bytes(op: str, *, B: int, T: int, C: int, distinct: int, itemsize: int = 2,
                  id_itemsize: int = ID_BYTES) -> int:
    """The bytes an ideal kernel must move: each input byte read once, each output byte written once.

    * ``"forward"``: write ``out`` (B*T*C), read the ``distinct`` wte rows used, the T wpe rows, the ids;
    * ``"backward"``: read ``dout`` (B*T*C), read and write the ``distinct`` dwte rows and the T dwpe
      rows (the gradients are accumulated into), read the ids.

    ``itemsize`` is the bytes of one stored element (2 for bf16), ``id_itemsize`` of one id (4 for int32).
    """
    B, T, C = _positive_int("B", B), _positive_int("T", T), _positive_int("C", C)
    distinct = _positive_int("distinct", distinct)
    itemsize, id_itemsize = _positive_int("itemsize", itemsize), _positive_int("id_itemsize", id_itemsize)
    if distinct > B * T:
        raise ValueError(f"distinct ({distinct}) cannot exceed the number of ids B*T = {B * T}")
    activations = B * T * C * itemsize
    token_rows = distinct * C * itemsize
    position_rows = T * C * itemsize
    ids = B * T * id_itemsize
    if op == "forward":
        return activations + token_rows + position_rows + ids
    if op == "backward":
        return activations + 2 * token_rows + 2 * position_rows + ids
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def floor_seconds(nbytes: int, copy_rate: float) -> float:
    """The time to move ``nbytes`` at ``copy_rate`` bytes/s (a copy's bytes read + written per second)."""
    if not copy_rate > 0 or not math.isfinite(copy_rate):
        raise ValueError(f"copy_rate must be a positive number of bytes per second, got {copy_rate!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return nbytes / copy_rate


def percent_of_floor(seconds: float, nbytes: int, copy_rate: float) -> float:
    """How close a measured time is to the floor: ``100 * floor / seconds`` (100 means at the floor)."""
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"seconds must be a positive time, got {seconds!r}")
    return 100.0 * floor_seconds(nbytes, copy_rate) / seconds


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


# ----------------------------------------------------------------------------------------------------------
# The cases: one named setup function each (setup -> Timed callable)
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timed:
    """What a case's setup returns: the call to time, the CUDA stream it runs on, what to undo after."""

    fn: Callable[[], object]
    stream: object  #: a cupy.cuda.Stream (for PyTorch: torch's current stream seen from CuPy)
    teardown: Callable[[], object] | None = None


@dataclass(frozen=True)
class Case:
    """One timed thing. ``family``: "ours", "torch" or "host"; ``op``: what the floor is computed for."""

    name: str
    label: str
    family: str
    op: str | None
    setup: Callable[["Workload"], Timed] | None
    host_sync: bool = False  #: the call waits for the GPU by design (its time is end to end)


@dataclass
class TorchSide:
    """PyTorch tensors sharing the benchmark's CuPy arrays (DLPack), for one configuration."""

    torch: object
    F: object
    stream: object
    wte: object
    wpe: object
    dout: object
    ids: object  #: int64 copy of the ids (the usual dtype of PyTorch indices)
    out: object


@dataclass
class Workload:
    """The arrays of one configuration (id kind, B) on the GPU; the cases read them."""

    kind: str
    B: int
    T: int
    C: int
    V: int
    inp_host: np.ndarray
    inp: object
    wte: object
    wpe: object
    dwte: object
    dwpe: object
    dout: object
    out: object
    stream: object
    seeds: object = field(default_factory=lambda: itertools.count(1))
    torch_side: TorchSide | None = None

    def next_seed(self) -> int:
        """A fresh stochastic-rounding seed for every backward call, as in training."""
        return next(self.seeds) % 2**32

    def need_torch(self) -> TorchSide:
        if self.torch_side is None:
            raise RuntimeError("this case needs PyTorch with CUDA, which this run does not have")
        return self.torch_side


def case_forward(w: Workload) -> Timed:
    """``encoder_forward`` into a preallocated ``out`` (ids checked once here, not in the timed calls)."""
    encoder_forward(w.inp, w.wte, w.wpe, out=w.out, check_ids=True)
    return Timed(lambda: encoder_forward(w.inp, w.wte, w.wpe, out=w.out, check_ids=False), w.stream)


def _backward(w: Workload, **options) -> Timed:
    """``encoder_backward`` with ``options``; one validated call first (checks the ids, compiles)."""
    encoder_backward(w.dwte, w.dwpe, w.dout, w.inp, seed=w.next_seed(), check_ids=True, **options)

    def call():
        encoder_backward(w.dwte, w.dwpe, w.dout, w.inp, seed=w.next_seed(), check_ids=False, **options)

    return Timed(call, w.stream)


def case_atomic_fp32(w: Workload) -> Timed:
    """Atomic backward accumulating in fp32 copies of the gradients, rounded back to bf16 (nondeterministic)."""
    return _backward(w, method="atomic")


def case_atomic_bf16(w: Workload) -> Timed:
    """Atomic backward with bf16 atomics on the gradients themselves (nondeterministic, lossy)."""
    return _backward(w, method="atomic_bf16")


def case_bucketed_cpu(w: Workload) -> Timed:
    """Deterministic backward, bucket table built on the CPU: ids to the host, NumPy, table back (a sync)."""
    return _backward(w, method="bucketed", bucketing="cpu")


def case_bucketed_gpu(w: Workload) -> Timed:
    """Deterministic backward, bucket table built on the GPU (no host sync)."""
    return _backward(w, method="bucketed", bucketing="gpu")


def case_chunked_gpu(w: Workload) -> Timed:
    """Deterministic backward with the chunked wte kernel (one warp per 32-item chunk), GPU bucketing."""
    return _backward(w, method="chunked", bucketing="gpu")


def case_gpu_buckets(w: Workload) -> Timed:
    """The GPU bucket table alone (one kernel). ``make_buckets`` checks the ids (a sync) once here; the
    timed calls launch the kernel behind it directly, as ``encoder_backward(bucketing="gpu")`` does."""
    from ..gpu_buckets import build_bucket_table_gpu

    make_buckets(w.inp, w.C, bfloat16, V=w.V)
    return Timed(lambda: build_bucket_table_gpu(w.inp, w.C, bfloat16, w.V), w.stream)


def case_torch_forward(w: Workload) -> Timed:
    """PyTorch: ``F.embedding(ids, wte) + wpe[:T]``, written into a preallocated tensor."""
    t = w.need_torch()
    wpe_rows = t.wpe[: w.T]

    def call():
        t.torch.add(t.F.embedding(t.ids, t.wte), wpe_rows, out=t.out)

    return Timed(call, t.stream)


def _torch_backward(w: Workload, deterministic: bool) -> Timed:
    """PyTorch's embedding backward (a fresh dwte, as autograd computes it) and the dwpe sum over the batch."""
    t = w.need_torch()
    torch = t.torch
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(deterministic)
    embedding_backward = torch.ops.aten.embedding_dense_backward

    def call():
        embedding_backward(t.dout, t.ids, w.V, -1, False)
        t.dout.sum(0)

    def restore():
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])

    return Timed(call, t.stream, teardown=restore)


def case_torch_backward(w: Workload) -> Timed:
    """PyTorch embedding backward + dwpe sum, ``torch.use_deterministic_algorithms(False)``."""
    return _torch_backward(w, deterministic=False)


def case_torch_backward_det(w: Workload) -> Timed:
    """PyTorch embedding backward + dwpe sum, ``torch.use_deterministic_algorithms(True)``."""
    return _torch_backward(w, deterministic=True)


#: Everything the benchmark times, in report order.
CASES = (
    Case("forward", "forward", "ours", "forward", case_forward),
    Case("atomic_fp32", "backward, atomic (fp32 accumulation)", "ours", "backward", case_atomic_fp32),
    Case("atomic_bf16", "backward, atomic (bf16 atomics)", "ours", "backward", case_atomic_bf16),
    Case("bucketed_cpu", "backward, deterministic, CPU bucketing", "ours", "backward", case_bucketed_cpu,
         host_sync=True),
    Case("bucketed_gpu", "backward, deterministic, GPU bucketing", "ours", "backward", case_bucketed_gpu),
    Case("chunked_gpu", "backward, deterministic chunked, GPU bucketing", "ours", "backward", case_chunked_gpu),
    Case("torch_forward", "PyTorch F.embedding + wpe", "torch", "forward", case_torch_forward),
    Case("torch_backward", "PyTorch embedding backward + dwpe sum", "torch", "backward", case_torch_backward),
    Case("torch_backward_det", "PyTorch embedding backward + dwpe sum, deterministic", "torch", "backward",
         case_torch_backward_det),
    Case("make_buckets", "make_buckets alone (NumPy, host)", "host", None, None),
    Case("gpu_buckets", "GPU bucket table alone (one kernel)", "ours", None, case_gpu_buckets),
)
CASE_NAMES = tuple(c.name for c in CASES)
CASES_BY_NAME = {c.name: c for c in CASES}


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------
_SPIN_SOURCE = r"""
extern "C" __global__ void gpt2enc_bench_spin(unsigned long long ns) {
    // Keeps the stream busy for ns nanoseconds of the GPU's global timer, so that the host can enqueue
    // the timed call behind it: the CUDA events then time the GPU's work, not Python's launch overhead.
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


class GpuTimer:
    """CUDA-event timing of one callable on one stream: cold L2, host overhead hidden, warm-up, repeats.

    Each repeat, on ``stream``: write ``flush_bytes`` (evicts L2) -> spin ``spin_us`` -> event -> call ->
    event. During warm-up, if the spin ran out before the call was enqueued, the spin doubles (up to
    ``max_spin_us``), unless the case synchronizes with the host by design (``host_sync``: no spin; the
    stream is drained before the first event, so the time is end to end from the start of the call).
    """

    def __init__(self, cp, *, flush_bytes: int, spin_us: float = 500.0, max_spin_us: float = 8000.0):
        self.cp = cp
        self.flush_bytes = int(flush_bytes)
        self.spin_us = float(spin_us)
        self.max_spin_us = float(max_spin_us)
        self._flush = cp.empty(self.flush_bytes, dtype=cp.uint8)
        self._spin = cp.RawKernel(_SPIN_SOURCE, "gpt2enc_bench_spin")
        self._start, self._end = cp.cuda.Event(), cp.cuda.Event()

    def _repeat(self, fn, stream, index: int, spin_ns: int) -> tuple[float, bool]:
        """One timed call: (seconds between the events, whether the GPU may have waited for the host)."""
        with stream:
            self._flush.fill(index % 255 + 1)
            if spin_ns:
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


def time_make_buckets(inp_host: np.ndarray, C: int = C_GPT2, dtype=bfloat16, *, warmup: int = 1,
                      repeats: int = 5) -> list[float]:
    """Seconds per ``make_buckets`` call (NumPy, on the host), by ``time.perf_counter``. Runs anywhere."""
    for _ in range(warmup):
        make_buckets(inp_host, C, dtype)
    samples = []
    for _ in range(_positive_int("repeats", repeats)):
        start = time.perf_counter()
        make_buckets(inp_host, C, dtype)
        samples.append(time.perf_counter() - start)
    return samples


def measure_copy_rate(cp, timer: GpuTimer, *, nbytes: int = COPY_BYTES, warmup: int = 3,
                      repeats: int = 20) -> tuple[float, Summary]:
    """Device-to-device ``cudaMemcpyAsync`` of ``nbytes``: (bytes read + written per second, time summary)."""
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


# ----------------------------------------------------------------------------------------------------------
# Rows, CSV, markdown, meta
# ----------------------------------------------------------------------------------------------------------
COLUMNS = ("case", "label", "family", "op", "ids", "B", "T", "C", "V", "dtype", "distinct_ids",
           "median_us", "p10_us", "p90_us", "repeats", "timer", "host_gap_frac",
           "minimal_bytes", "floor_us", "pct_of_floor")
_INT_COLUMNS = {"B", "T", "C", "V", "distinct_ids", "repeats", "minimal_bytes"}
_FLOAT_COLUMNS = {"median_us", "p10_us", "p90_us", "host_gap_frac", "floor_us", "pct_of_floor"}


def make_row(case: Case, *, ids: str, B: int, T: int, C: int, V: int, dtype_name: str, distinct: int,
             seconds: Summary, timer: str, host_gap_frac: float | None, copy_rate: float | None,
             itemsize: int = 2) -> dict:
    """One result row (``COLUMNS``). The floor columns are filled for cases with an ``op``, else None."""
    us = seconds.scaled(1e6)
    row = dict(case=case.name, label=case.label, family=case.family, op=case.op, ids=ids, B=B, T=T, C=C, V=V,
               dtype=dtype_name, distinct_ids=distinct, median_us=us.median, p10_us=us.p10, p90_us=us.p90,
               repeats=us.n, timer=timer, host_gap_frac=host_gap_frac,
               minimal_bytes=None, floor_us=None, pct_of_floor=None)
    if case.op is not None and copy_rate is not None:
        nbytes = minimal_bytes(case.op, B=B, T=T, C=C, distinct=distinct, itemsize=itemsize)
        row.update(minimal_bytes=nbytes, floor_us=floor_seconds(nbytes, copy_rate) * 1e6,
                   pct_of_floor=percent_of_floor(seconds.median, nbytes, copy_rate))
    return row


def write_csv(rows, path) -> Path:
    """Write rows (dicts with the ``COLUMNS`` keys) as CSV; None becomes an empty field."""
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row[k] is None else row[k]) for k in COLUMNS})
    return path


def read_csv(path) -> list[dict]:
    """Read a ``results.csv`` back into rows with numbers as numbers and empty fields as None."""
    rows = []
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not a benchmark results file (missing columns {sorted(missing)})")
        for raw in reader:
            row = {}
            for key in COLUMNS:
                value = raw[key]
                if value == "":
                    row[key] = None
                elif key in _INT_COLUMNS:
                    row[key] = int(value)
                elif key in _FLOAT_COLUMNS:
                    row[key] = float(value)
                else:
                    row[key] = value
            rows.append(row)
    return rows


def format_time_us(us: float) -> str:
    """``12.3 us``, ``456 us``, ``4.56 ms``: three significant figures."""
    if us < 1000:
        return f"{us:.3g} us" if us < 100 else f"{us:.0f} us"
    return f"{us / 1000:.3g} ms"


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    text = format_time_us(row["median_us"])
    if row["pct_of_floor"] is not None:
        text += f" ({row['pct_of_floor']:.0f}%)"
    return text


def markdown_report(rows, meta: dict | None = None) -> str:
    """A markdown summary: per id kind, a table of kernels x B (median, % of floor), then every row."""
    rows = list(rows)
    meta = meta or {}
    lines = []
    title = meta.get("device") or "unknown device"
    lines.append(f"# Encoder benchmark on {title}")
    lines.append("")
    if meta:
        shape = meta.get("shape", {})
        lines.append(f"- date: {meta.get('date', '?')}; command: `{meta.get('command', '?')}`")
        lines.append(f"- T={shape.get('T', '?')}, C={shape.get('C', '?')}, V={shape.get('V', '?')}, "
                     f"{shape.get('dtype', '?')}; GPU times are medians of {meta.get('repeats', '?')} repeats "
                     f"(CUDA events, L2 flushed before each), host times medians of "
                     f"{meta.get('host_repeats', '?')} (perf_counter)")
        if meta.get("copy_rate_GBps") is not None:
            lines.append(f"- device-to-device copy rate: {meta['copy_rate_GBps']:.0f} GB/s (read + write); "
                         "floor = minimal bytes / copy rate; (NN%) = floor / median")
        if meta.get("torch"):
            lines.append(f"- PyTorch: {meta['torch']}")
    lines.append("")
    kinds = [k for k in ID_KINDS if any(r["ids"] == k for r in rows)]
    batch_sizes = sorted({r["B"] for r in rows})
    present = [c for c in CASES if any(r["case"] == c.name for r in rows)]
    by_key = {(r["case"], r["ids"], r["B"]): r for r in rows}
    header = "| kernel | " + " | ".join(f"B={b}" for b in batch_sizes) + " |"
    rule = "|---|" + "---|" * len(batch_sizes)
    for kind in kinds:
        lines += [f"## {kind} ids", "", header, rule]
        for case in present:
            cells = [_cell(by_key.get((case.name, kind, b))) for b in batch_sizes]
            lines.append(f"| {case.label} | " + " | ".join(cells) + " |")
        for op in OPS:
            floors = []
            for b in batch_sizes:
                floor = next((r["floor_us"] for r in rows if r["ids"] == kind and r["B"] == b and r["op"] == op
                              and r["floor_us"] is not None), None)
                floors.append("-" if floor is None else format_time_us(floor))
            if any(f != "-" for f in floors):
                lines.append(f"| floor, {op} | " + " | ".join(floors) + " |")
        lines.append("")
    lines += ["## Every row", "", "<details><summary>median, p10, p90, % of floor, host-gap share</summary>", "",
              "| kernel | ids | B | distinct ids | median | p10 | p90 | % of floor | host gap |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pct = "-" if r["pct_of_floor"] is None else f"{r['pct_of_floor']:.1f}%"
        gap = "-" if r["host_gap_frac"] is None else f"{r['host_gap_frac']:.2f}"
        lines.append(f"| {r['label']} | {r['ids']} | {r['B']} | {r['distinct_ids']} | "
                     f"{format_time_us(r['median_us'])} | {format_time_us(r['p10_us'])} | "
                     f"{format_time_us(r['p90_us'])} | {pct} | {gap} |")
    lines += ["", "</details>", ""]
    failures = meta.get("failures") or []
    if failures:
        lines += ["## Failures", ""]
        lines += [f"- {f['case']} ({f['ids']}, B={f['B']}): {f['error']}" for f in failures]
        lines.append("")
    return "\n".join(lines)


def load_results(folder) -> tuple[list[dict], dict]:
    """(rows, meta) of a finished run in ``folder``; ``FileNotFoundError`` saying what is missing."""
    folder = Path(folder)
    csv_path, meta_path = folder / RESULTS_CSV, folder / META_JSON
    missing = [p.name for p in (csv_path, meta_path) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no benchmark results in {folder} (missing {', '.join(missing)}); "
                                "run `python -m gpt2enc_edu.bench` on a GPU machine to make them")
    return read_csv(csv_path), json.loads(meta_path.read_text())


# ----------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    """What to time and how often."""

    batch_sizes: tuple[int, ...] = BATCH_SIZES
    kinds: tuple[str, ...] = ID_KINDS
    cases: tuple[str, ...] = CASE_NAMES
    repeats: int = FULL_REPEATS[0]
    warmup: int = FULL_REPEATS[1]
    host_repeats: int = FULL_REPEATS[2]
    use_torch: bool = True
    T: int = T_GPT2
    C: int = C_GPT2
    V: int = GPT2_VOCAB_SIZE
    seed: int = 0
    quick: bool = False

    def __post_init__(self):
        for b in self.batch_sizes:
            _positive_int("batch size", b)
        for name in ("repeats", "host_repeats", "T", "C", "V"):
            _positive_int(name, getattr(self, name))
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if not self.batch_sizes or not self.kinds or not self.cases:
            raise ValueError("batch_sizes, kinds and cases must not be empty")
        bad = [k for k in self.kinds if k not in ID_KINDS] + [c for c in self.cases if c not in CASES_BY_NAME]
        if bad:
            raise ValueError(f"unknown id kinds or cases {bad}; kinds: {ID_KINDS}, cases: {CASE_NAMES}")

    @classmethod
    def quick_config(cls, **overrides) -> "BenchConfig":
        """A smoke-test run: B in {1, 64}, few repeats."""
        repeats, warmup, host_repeats = QUICK_REPEATS
        base = dict(batch_sizes=QUICK_BATCH_SIZES, repeats=repeats, warmup=warmup, host_repeats=host_repeats,
                    quick=True)
        base.update(overrides)
        return cls(**base)


@dataclass
class Results:
    """The outcome of ``run_benchmark``: rows (``COLUMNS``), meta (for ``meta.json``), failures."""

    rows: list[dict]
    meta: dict
    failures: list[dict]


def torch_status(wanted: bool = True):
    """(torch module or None, a sentence saying which PyTorch is used or why none)."""
    if not wanted:
        return None, "skipped (--no-torch)"
    try:
        torch = importlib.import_module("torch")
    except Exception as exc:
        return None, f"not compared: `import torch` failed ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return None, f"not compared: torch {torch.__version__} does not see a CUDA GPU"
    return torch, f"torch {torch.__version__} (CUDA {torch.version.cuda})"


def _cupy_stream_of_torch(cp, torch):
    """torch's current CUDA stream as a CuPy stream, so CuPy events and the L2 flush go on that stream."""
    stream = torch.cuda.current_stream()
    if hasattr(cp.cuda.Stream, "from_external") and hasattr(stream, "__cuda_stream__"):
        return cp.cuda.Stream.from_external(stream)
    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream in favour of from_external
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(stream.cuda_stream)


def _torch_bf16(torch, array):
    """A torch.bfloat16 tensor sharing a CuPy bf16 array's memory (DLPack through an int16 view)."""
    if array.dtype != np.dtype(bfloat16):
        raise TypeError(f"expected a bf16 array, got {array.dtype}")
    return torch.from_dlpack(array.view(np.int16)).view(torch.bfloat16)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_benchmark(config: BenchConfig = BenchConfig(), *, progress: bool = True, command: str | None = None,
                  log: Callable[[str], object] = print) -> Results:
    """Time every case of ``config`` on the GPU. Needs CuPy and a CUDA GPU (``RuntimeError`` otherwise).

    A case that raises is reported in ``Results.failures`` (and printed) and the run goes on.
    """
    status = gpu_status()
    if status.name != "cuda":
        raise RuntimeError(f"the benchmark needs a CUDA GPU: {status.reason}")
    import cupy as cp

    if progress:
        from tqdm.auto import tqdm
    started = time.perf_counter()
    cases = [CASES_BY_NAME[name] for name in config.cases]
    want_torch = config.use_torch and any(c.family == "torch" for c in cases)
    torch, torch_note = torch_status(want_torch) if want_torch else (None, "not requested")
    if torch is None:
        cases = [c for c in cases if c.family != "torch"]
    T, C, V = config.T, config.C, config.V
    device = cp.cuda.Device()
    l2 = int(device.attributes.get("L2CacheSize", 0))
    timer = GpuTimer(cp, flush_bytes=max(2 * l2, 128 << 20))
    copy_rate, copy_summary = measure_copy_rate(cp, timer)

    # One set of weights and gradients for the whole run (B-independent); dout and out at the largest B,
    # sliced per configuration. ``random_problem`` is the package's shared generator of such arrays.
    b_max = max(config.batch_sizes)
    base = random_problem(b_max, T, C, V, dtype=bfloat16, ids="uniform",
                          rng=np.random.default_rng(config.seed)).on(cp)
    out_all = cp.empty((b_max, T, C), dtype=bfloat16)
    stream = cp.cuda.get_current_stream()
    torch_weights = None
    if torch is not None:
        torch.cuda.set_device(device.id)
        torch_weights = (_torch_bf16(torch, base.wte), _torch_bf16(torch, base.wpe), _torch_bf16(torch, base.dout))
        torch_stream = _cupy_stream_of_torch(cp, torch)
        import torch.nn.functional as F
    cp.cuda.runtime.deviceSynchronize()

    rows, failures = [], []
    configs = [(kind, B) for kind in config.kinds for B in config.batch_sizes]
    bar = tqdm(configs, unit="config", desc="bench") if progress else None
    say = bar.write if bar is not None else log
    for kind, B in (bar if bar is not None else configs):
        inp_host = make_ids(kind, B, T, V=V, seed=np.random.SeedSequence([config.seed, ID_KINDS.index(kind), B]))
        distinct = distinct_ids(inp_host)
        w = Workload(kind=kind, B=B, T=T, C=C, V=V, inp_host=inp_host, inp=cp.asarray(inp_host),
                     wte=base.wte, wpe=base.wpe, dwte=base.dwte, dwpe=base.dwpe, dout=base.dout[:B],
                     out=out_all[:B], stream=stream)
        if torch is not None:
            wte_t, wpe_t, dout_t = torch_weights
            w.torch_side = TorchSide(torch=torch, F=F, stream=torch_stream, wte=wte_t, wpe=wpe_t,
                                     dout=dout_t[:B], ids=torch.from_dlpack(w.inp).long(),
                                     out=torch.empty((B, T, C), dtype=torch.bfloat16, device="cuda"))
        common = dict(ids=kind, B=B, T=T, C=C, V=V, dtype_name="bf16", distinct=distinct, copy_rate=copy_rate)
        for case in cases:
            if bar is not None:
                bar.set_postfix_str(f"{kind} B={B} {case.name}")
            try:
                if case.family == "host":
                    samples = time_make_buckets(inp_host, C, bfloat16, repeats=config.host_repeats)
                    rows.append(make_row(case, seconds=summarize(samples), timer="perf_counter",
                                         host_gap_frac=None, **common))
                    continue
                cp.cuda.runtime.deviceSynchronize()
                timed = case.setup(w)
                try:
                    samples, gap = timer.time(timed.fn, timed.stream, warmup=config.warmup,
                                              repeats=config.repeats, host_sync=case.host_sync)
                finally:
                    if timed.teardown is not None:
                        timed.teardown()
                cp.cuda.runtime.deviceSynchronize()
                rows.append(make_row(case, seconds=summarize(samples), timer="cuda-events", host_gap_frac=gap,
                                     **common))
            except Exception as exc:  # reported, not hidden: printed now, listed in meta.json and results.md
                failures.append(dict(case=case.name, ids=kind, B=B, error=f"{type(exc).__name__}: {exc}"))
                say(f"FAILED {case.name} ({kind}, B={B}): {type(exc).__name__}: {exc}")
        del w
    if bar is not None:
        bar.close()

    meta = dict(
        device=status.device,
        compute_capability=f"sm_{device.compute_capability}",
        l2_cache_bytes=l2,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=command if command is not None else " ".join([Path(sys.executable).name] + sys.argv),
        quick=config.quick,
        shape=dict(T=T, C=C, V=V, dtype="bf16"),
        batch_sizes=list(config.batch_sizes),
        kinds=list(config.kinds),
        cases=[c.name for c in cases],
        repeats=config.repeats,
        warmup=config.warmup,
        host_repeats=config.host_repeats,
        seed=config.seed,
        copy_rate_GBps=copy_rate / 1e9,
        copy_bytes=COPY_BYTES,
        copy_median_us=copy_summary.median * 1e6,
        l2_flush_bytes=timer.flush_bytes,
        spin_us=timer.spin_us,
        versions=dict(gpt2enc_edu=_package_version(), cupy=cp.__version__, numpy=np.__version__,
                      torch=None if torch is None else torch.__version__, python=platform.python_version(),
                      cuda_runtime=cp.cuda.runtime.runtimeGetVersion(),
                      cuda_driver=cp.cuda.runtime.driverGetVersion()),
        torch=torch_note,
        host_cpu=_cpu_name(),
        elapsed_s=round(time.perf_counter() - started, 1),
        failures=failures,
    )
    return Results(rows=rows, meta=meta, failures=failures)


def _package_version() -> str:
    from .. import __version__

    return __version__


def write_results(results: Results, out_dir) -> list[Path]:
    """Write ``results.csv``, ``results.md``, ``meta.json`` and the PNG plots into ``out_dir``."""
    from . import plots as bench_plots

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_csv(results.rows, out_dir / RESULTS_CSV)]
    md = out_dir / RESULTS_MD
    md.write_text(markdown_report(results.rows, results.meta))
    meta = out_dir / META_JSON
    meta.write_text(json.dumps(results.meta, indent=2) + "\n")
    paths += [md, meta]
    paths += bench_plots.save_plots(results.rows, out_dir, meta=results.meta)
    return paths


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------
def _arg_int_at_least(minimum: int):
    """An argparse ``type`` that accepts integers >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


_arg_positive_int = _arg_int_at_least(1)
_arg_nonnegative_int = _arg_int_at_least(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpt2enc_edu.bench",
        description="Time the GPT-2 encoder kernels (and PyTorch) on the GPU against the memory floor "
                    f"(T={T_GPT2}, C={C_GPT2}, V={GPT2_VOCAB_SIZE}, bf16).")
    parser.add_argument("--batch-sizes", type=_arg_positive_int, nargs="+", metavar="B",
                        help=f"batch sizes (default {' '.join(map(str, BATCH_SIZES))}; "
                             f"--quick: {' '.join(map(str, QUICK_BATCH_SIZES))})")
    parser.add_argument("--ids", nargs="+", choices=ID_KINDS, metavar="KIND",
                        help=f"token-id kinds, of {', '.join(ID_KINDS)} (default: all)")
    parser.add_argument("--cases", nargs="+", choices=CASE_NAMES, metavar="CASE",
                        help=f"what to time, of {', '.join(CASE_NAMES)} (default: all)")
    parser.add_argument("--repeats", type=_arg_positive_int,
                        help=f"timed GPU repeats per case (default {FULL_REPEATS[0]}; --quick: {QUICK_REPEATS[0]})")
    parser.add_argument("--warmup", type=_arg_nonnegative_int,
                        help=f"untimed calls first (default {FULL_REPEATS[1]}; --quick: {QUICK_REPEATS[1]})")
    parser.add_argument("--host-repeats", type=_arg_positive_int,
                        help=f"repeats of make_buckets on the host (default {FULL_REPEATS[2]}; "
                             f"--quick: {QUICK_REPEATS[2]})")
    parser.add_argument("--out", type=Path, help=f"output folder (default {DEFAULT_OUT}; --quick: {QUICK_OUT})")
    parser.add_argument("--quick", action="store_true", help="smoke test: B in {1, 64}, few repeats")
    parser.add_argument("--no-torch", action="store_true", help="do not time PyTorch")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def config_from_args(args: argparse.Namespace) -> tuple[BenchConfig, Path]:
    """The run's configuration and output folder from parsed arguments (explicit options beat --quick)."""
    repeats, warmup, host_repeats = QUICK_REPEATS if args.quick else FULL_REPEATS
    config = BenchConfig(
        batch_sizes=tuple(args.batch_sizes or (QUICK_BATCH_SIZES if args.quick else BATCH_SIZES)),
        kinds=tuple(args.ids or ID_KINDS),
        cases=tuple(args.cases or CASE_NAMES),
        repeats=args.repeats or repeats,
        warmup=warmup if args.warmup is None else args.warmup,
        host_repeats=args.host_repeats or host_repeats,
        use_torch=not args.no_torch,
        seed=args.seed,
        quick=args.quick,
    )
    out = args.out if args.out is not None else (QUICK_OUT if args.quick else DEFAULT_OUT)
    return config, out


def _require(module: str, why: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise SystemExit(f"the benchmark needs {module} {why}: pip install {module} ({exc})") from None


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status (0 also when there is no GPU: nothing to do)."""
    args = build_parser().parse_args(argv)
    config, out = config_from_args(args)
    status = gpu_status()
    if status.name != "cuda":
        print(f"No GPU: {status.reason}.\nThe benchmark times CUDA kernels, so nothing was measured and nothing "
              "was written. Committed results (if any) are in docs/bench/; notebooks/05_timings shows them.")
        return 0
    if not args.no_progress:
        _require("tqdm", "for its progress bar")
    _require("matplotlib", "for its plots")
    command = " ".join(["python -m gpt2enc_edu.bench", *(sys.argv[1:] if argv is None else argv)])
    results = run_benchmark(config, progress=not args.no_progress, command=command)
    paths = write_results(results, out)
    print(markdown_report(results.rows, results.meta))
    print(f"wrote {', '.join(str(p) for p in paths)} in {results.meta['elapsed_s']} s")
    if results.failures:
        print(f"{len(results.failures)} case(s) failed; see above and meta.json", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
