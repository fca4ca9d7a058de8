"""A benchmark run: its configuration, the arrays it times on, the loop over (id kind, B) x cases, its metadata.

``run_benchmark(config)`` needs CuPy and a CUDA GPU. It measures the copy rate once (``timer.measure_copy_rate``,
the floor of every row), makes one set of weights and gradients, then for each id kind and batch size makes the
ids and times every case of ``config`` (``cases.CASES``), the ``step`` cases of a workload in turn
(``time_steps``). A case that raises is reported, not hidden, and the run goes on.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..backend import gpu_status
from ..problems import random_problem
from ..rounding import bfloat16
from ..tokens import GPT2_VOCAB_SIZE, make_ids
from ..validate import check_int
from .cases import C_GPT2, CASE_NAMES, CASES_BY_NAME, ID_KINDS, T_GPT2, TORCH_FAMILIES, Case, Timed, TorchSide, Workload
from .floor import distinct_ids
from .report import Results, make_row
from .timer import (
    COPY_BYTES,
    STEP_TIMING_IN_TURN,
    GpuTimer,
    Summary,
    measure_copy_rate,
    summarize,
    time_make_buckets,
    time_synchronised_in_turn,
)

BATCH_SIZES = (1, 4, 8, 16, 32, 64)
QUICK_BATCH_SIZES = (1, 64)
DEFAULT_OUT = Path("docs/bench")
QUICK_OUT = DEFAULT_OUT / "quick"
#: (repeats, warmup, host_repeats) of a full and of a quick run.
FULL_REPEATS = (100, 10, 20)
QUICK_REPEATS = (10, 3, 3)


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
        if not self.batch_sizes or not self.kinds or not self.cases:
            raise ValueError("batch_sizes, kinds and cases must not be empty")
        for b in self.batch_sizes:
            check_int("batch size", b, minimum=1)
        for name in ("repeats", "host_repeats", "T", "C", "V"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("warmup", self.warmup, minimum=0)
        check_int("seed", self.seed, minimum=0)
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


@dataclass
class Session:
    """What every configuration of a run shares: CuPy, the timer, the copy rate, the arrays, PyTorch."""

    cp: object
    device: object
    timer: GpuTimer
    copy_rate: float
    copy_summary: Summary
    base: object  #: a ``problems.Problem`` on the GPU at the largest B (weights, gradients, dout)
    out_all: object
    stream: object
    torch: object = None
    torch_note: str = "not requested"
    torch_weights: tuple | None = None  #: (wte, wpe, dout) as torch tensors sharing the CuPy arrays
    torch_stream: object = None


def start_session(cp, config: BenchConfig, torch, torch_note: str) -> Session:
    """Measure the copy rate, make the run's arrays (B-independent weights; dout and out at the largest B)."""
    device = cp.cuda.Device()
    l2 = int(device.attributes.get("L2CacheSize", 0))
    timer = GpuTimer(cp, flush_bytes=max(2 * l2, 128 << 20))
    copy_rate, copy_summary = measure_copy_rate(cp, timer)
    b_max = max(config.batch_sizes)
    base = random_problem(b_max, config.T, config.C, config.V, dtype=bfloat16, ids="uniform",
                          rng=np.random.default_rng(config.seed)).on(cp)
    session = Session(cp=cp, device=device, timer=timer, copy_rate=copy_rate, copy_summary=copy_summary, base=base,
                      out_all=cp.empty((b_max, config.T, config.C), dtype=bfloat16),
                      stream=cp.cuda.get_current_stream(), torch=torch, torch_note=torch_note)
    if torch is not None:
        torch.cuda.set_device(device.id)
        session.torch_weights = tuple(_torch_bf16(torch, a) for a in (base.wte, base.wpe, base.dout))
        session.torch_stream = _cupy_stream_of_torch(cp, torch)
    cp.cuda.runtime.deviceSynchronize()
    return session


def make_workload(s: Session, config: BenchConfig, kind: str, B: int) -> Workload:
    """The ids of one configuration (seeded by the run's seed, the kind and B) and views of the run's arrays."""
    T, C, V = config.T, config.C, config.V
    inp_host = make_ids(kind, B, T, V=V, seed=np.random.SeedSequence([config.seed, ID_KINDS.index(kind), B]))
    w = Workload(kind=kind, B=B, T=T, C=C, V=V, inp_host=inp_host, inp=s.cp.asarray(inp_host), wte=s.base.wte,
                 wpe=s.base.wpe, dwte=s.base.dwte, dwpe=s.base.dwpe, dout=s.base.dout[:B], out=s.out_all[:B],
                 stream=s.stream, distinct=distinct_ids(inp_host))
    if s.torch is not None:
        import torch.nn.functional as F

        wte_t, wpe_t, dout_t = s.torch_weights
        w.torch_side = TorchSide(torch=s.torch, F=F, stream=s.torch_stream, wte=wte_t, wpe=wpe_t, dout=dout_t[:B],
                                 ids=s.torch.from_dlpack(w.inp).long(),
                                 out=s.torch.empty((B, T, C), dtype=s.torch.bfloat16, device="cuda"))
    return w


def _common(s: Session, w: Workload) -> dict:
    return dict(ids=w.kind, B=w.B, T=w.T, C=w.C, V=w.V, dtype_name="bf16", distinct=w.distinct, copy_rate=s.copy_rate)


def time_case(s: Session, config: BenchConfig, case: Case, w: Workload) -> dict:
    """Time one case on one workload (any family but ``step``: ``time_steps``); its result row."""
    if case.family == "host":
        samples = time_make_buckets(w.inp_host, w.C, bfloat16, repeats=config.host_repeats)
        return make_row(case, seconds=summarize(samples), timer="perf_counter", host_gap_frac=None, **_common(s, w))
    if case.family == "step":
        raise ValueError(f"{case.name} is a step case: time_steps times the steps of a workload together")
    s.cp.cuda.runtime.deviceSynchronize()
    timed = case.setup(w)
    try:
        samples, gap = s.timer.time(timed.fn, timed.stream, warmup=config.warmup, repeats=config.repeats,
                                    host_sync=case.host_sync)
    finally:
        if timed.teardown is not None:
            timed.teardown()
    s.cp.cuda.runtime.deviceSynchronize()
    return make_row(case, seconds=summarize(samples), timer="cuda-events", host_gap_frac=gap, **_common(s, w))


def time_steps(s: Session, config: BenchConfig, steps: list[Case], w: Workload, *,
               while_live: Callable[[dict[str, Timed]], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Time the ``step`` cases of one workload in turn (``timer.time_synchronised_in_turn``: host time around
    synchronised calls, no GPU timer, no L2 flush), so that their medians compare; (their rows, a failure for each
    case whose setup or calls raised). ``while_live``, given the steps that were set up, runs after their timing
    and before their teardown (a caller's own measurement of a live step); what it raises is raised."""
    timed, failures = {}, []

    def failed(case: Case, exc: Exception) -> None:
        failures.append(dict(case=case.name, ids=w.kind, B=w.B, error=f"{type(exc).__name__}: {exc}"))

    s.cp.cuda.runtime.deviceSynchronize()
    samples = {}
    try:
        for case in steps:
            try:
                timed[case.name] = case.setup(w)
            except Exception as exc:  # reported, and the other steps are still timed
                failed(case, exc)
        calls = {name: t.fn for name, t in timed.items()}
        try:
            if calls:
                samples = time_synchronised_in_turn(calls, s.cp.cuda.runtime.deviceSynchronize, warmup=config.warmup,
                                                    repeats=config.repeats)
        except Exception as exc:  # the steps were timed together: each is reported
            for name in timed:
                failed(CASES_BY_NAME[name], exc)
        if while_live is not None and samples:
            while_live(timed)
    finally:
        for t in reversed(list(timed.values())):  # in reverse: each teardown restores what its setup found
            if t.teardown is not None:
                t.teardown()
    s.cp.cuda.runtime.deviceSynchronize()
    rows = [make_row(case, seconds=summarize(samples[case.name]), timer="perf_counter", host_gap_frac=None,
                     **_common(s, w)) for case in steps if case.name in samples]
    return rows, failures


def _package_version() -> str:
    from .. import __version__

    return __version__


def run_meta(s: Session, config: BenchConfig, cases, *, device_name: str, command: str | None, elapsed_s: float,
             failures: list[dict]) -> dict:
    """What ``meta.json`` records about a run."""
    cp = s.cp
    return dict(
        device=device_name,
        step_timing=STEP_TIMING_IN_TURN if any(c.family == "step" for c in cases) else None,
        compute_capability=f"sm_{s.device.compute_capability}",
        l2_cache_bytes=int(s.device.attributes.get("L2CacheSize", 0)),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=command if command is not None else " ".join([Path(sys.executable).name] + sys.argv),
        quick=config.quick,
        shape=dict(T=config.T, C=config.C, V=config.V, dtype="bf16"),
        batch_sizes=list(config.batch_sizes),
        kinds=list(config.kinds),
        cases=[c.name for c in cases],
        repeats=config.repeats,
        warmup=config.warmup,
        host_repeats=config.host_repeats,
        seed=config.seed,
        copy_rate_GBps=s.copy_rate / 1e9,
        copy_bytes=COPY_BYTES,
        copy_median_us=s.copy_summary.median * 1e6,
        l2_flush_bytes=s.timer.flush_bytes,
        spin_us=s.timer.spin_us,
        versions=dict(gpt2enc_edu=_package_version(), cupy=cp.__version__, numpy=np.__version__,
                      torch=None if s.torch is None else s.torch.__version__, python=platform.python_version(),
                      cuda_runtime=cp.cuda.runtime.runtimeGetVersion(),
                      cuda_driver=cp.cuda.runtime.driverGetVersion()),
        torch=s.torch_note,
        host_cpu=_cpu_name(),
        elapsed_s=round(elapsed_s, 1),
        failures=failures,
    )


def run_benchmark(config: BenchConfig = BenchConfig(), *, progress: bool = True, command: str | None = None,
                  log: Callable[[str], object] = print) -> Results:
    """Time every case of ``config`` on the GPU. Needs CuPy and a CUDA GPU (``RuntimeError`` otherwise).

    A case that raises is reported in ``Results.failures`` (and printed) and the run goes on.
    """
    status = gpu_status()
    if status.name != "cuda":
        raise RuntimeError(f"the benchmark needs a CUDA GPU: {status.reason}")
    import cupy as cp

    started = time.perf_counter()
    cases = [CASES_BY_NAME[name] for name in config.cases]
    want_torch = config.use_torch and any(c.family in TORCH_FAMILIES for c in cases)
    torch, torch_note = torch_status(want_torch) if want_torch else (None, "not requested")
    if torch is None:
        cases = [c for c in cases if c.family not in TORCH_FAMILIES]
    session = start_session(cp, config, torch, torch_note)

    rows, failures = [], []
    configs = [(kind, B) for kind in config.kinds for B in config.batch_sizes]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(configs, unit="config", desc="bench")
    say = bar.write if bar is not None else log
    steps = [c for c in cases if c.family == "step"]
    for kind, B in (bar if bar is not None else configs):
        w = make_workload(session, config, kind, B)
        for case in cases:
            if case.family == "step":
                continue
            if bar is not None:
                bar.set_postfix_str(f"{kind} B={B} {case.name}")
            try:
                rows.append(time_case(session, config, case, w))
            except Exception as exc:  # reported, not hidden: printed now, listed in meta.json and results.md
                failures.append(dict(case=case.name, ids=kind, B=B, error=f"{type(exc).__name__}: {exc}"))
                say(f"FAILED {case.name} ({kind}, B={B}): {type(exc).__name__}: {exc}")
        if steps:
            if bar is not None:
                bar.set_postfix_str(f"{kind} B={B} steps")
            step_rows, step_failures = time_steps(session, config, steps, w)
            rows.extend(step_rows)
            failures.extend(step_failures)
            for f in step_failures:
                say(f"FAILED {f['case']} ({kind}, B={B}): {f['error']}")
        del w
    if bar is not None:
        bar.close()
    meta = run_meta(session, config, cases, device_name=status.device, command=command,
                    elapsed_s=time.perf_counter() - started, failures=failures)
    return Results(rows=rows, meta=meta, failures=failures)
