"""What the experiment probes in this folder share: the GPU check at their start, the ``probe.json`` they keep, a
function swapped for one call, bit comparison, a bench session, and interleaved timings of package calls with and
without a swap.

The probes run as scripts (``python3 scripts/experiments/probe_<name>.py``), so this folder is first on their path
and they import this module by name.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

from gpt2enc_edu.backend import gpu_status
from gpt2enc_edu.loader import cupy_module

#: The exit status of a probe started where the CUDA backend cannot run (a probe measures nothing without a GPU).
NO_GPU_EXIT = 2


def probe_arguments(doc: str, probe: str, argv=None) -> argparse.Namespace:
    """A probe's command line (``--out``, ``--repeats``); then ``require_gpu``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    require_gpu(probe)
    return args


def require_gpu(probe: str) -> None:
    """Exit with ``NO_GPU_EXIT`` and one line saying why, unless the CUDA backend can run here."""
    status = gpu_status()
    if status.name != "cuda":
        print(f"{probe} needs a CUDA GPU and measures nothing without one: {status.reason}", file=sys.stderr)
        sys.exit(NO_GPU_EXIT)


@contextmanager
def replaced(module, name: str, value):
    """``module.name`` is ``value`` inside the block (the package looks its functions up at call time)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


class ProbeRecord:
    """What a probe found, in ``<out>/probe.json``, written again after every step (so a probe stopped by its timeout
    leaves what it had). ``data`` starts as ``fields`` and an empty list of bit-check failures."""

    def __init__(self, out: Path, **fields):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "probe.json"
        self.data: dict = {"bits": [], **fields}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1))

    def bits(self, failures: list[str]) -> bool:
        """Record and print a bit check's failures; whether there were none (a probe times nothing otherwise)."""
        self.data["bits"] = failures
        print(f"bits: {'ok' if not failures else 'FAIL'} ({len(failures)} mismatches)", *failures, sep="\n  ",
              flush=True)
        self.save()
        return not failures


def same_bits(a, b) -> bool:
    """Whether two device arrays hold the same bytes (NaNs compare as their bits)."""
    cp = cupy_module()
    return a.shape == b.shape and a.dtype == b.dtype and bool(cp.array_equal(a.view(cp.uint8), b.view(cp.uint8)))


def bench_session(batch_sizes: tuple[int, ...], cases: tuple[str, ...], repeats: int):
    """The bench's session (copy rate, arrays) and configuration for these batch sizes and cases, without torch."""
    from gpt2enc_edu.bench.run import BenchConfig, start_session

    config = BenchConfig(batch_sizes=batch_sizes, cases=cases, repeats=repeats, warmup=5, use_torch=False)
    return start_session(cupy_module(), config, None, ""), config


def interleaved_times(s, config, case_name: str, w, variants: list[tuple[str, Callable | None]],
                      rounds: int = 2) -> dict[str, list[float]]:
    """Median µs of the bench case ``case_name`` on workload ``w`` for each variant, the variants taken in turn,
    ``rounds`` times. A variant is (label, None) for the package as it is, or (label, swap), where ``swap()`` returns
    the context manager that puts the variant in place."""
    from gpt2enc_edu.bench.cases import CASES_BY_NAME
    from gpt2enc_edu.bench.run import time_case

    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, swap in variants:
            with nullcontext() if swap is None else swap():
                times.setdefault(label, []).append(time_case(s, config, CASES_BY_NAME[case_name], w)["median_us"])
    return times


def spread(times: dict[str, list[float]]) -> str:
    """One line: each variant's fastest and slowest median."""
    return " | ".join(f"{label} {min(us):.1f}-{max(us):.1f}" for label, us in times.items())


def call_bits_equal(w, swap: Callable, **options) -> bool:
    """``encoder_backward`` on workload ``w`` (the chunked method with the table built on the GPU, unless ``options``
    say otherwise) with the package as it is and with ``swap()`` in place: whether dwte and dwpe agree bit for bit."""
    from gpt2enc_edu.encoder import encoder_backward

    options = {"method": "chunked", "bucketing": "gpu", **options}
    results = []
    for context in (nullcontext, swap):
        with context():
            dwte, dwpe = w.dwte.copy(), w.dwpe.copy()
            encoder_backward(dwte, dwpe, w.dout, w.inp, seed=5, **options)
            results.append((dwte, dwpe))
    return all(same_bits(a, b) for a, b in zip(*results))


def compare_in_calls(s, config, record: ProbeRecord, variants: list[tuple[str, Callable | None]],
                     cases: tuple[str, ...], batch_sizes: tuple[int, ...] = (8, 32, 64)) -> bool:
    """For each batch size and id kind: every swapped variant's ``call_bits_equal`` first, then each bench case's
    ``interleaved_times``, into ``record.data["call"]`` (saved after each workload). False at the first mismatch,
    which is recorded and timed no further."""
    from gpt2enc_edu.bench.cases import ID_KINDS
    from gpt2enc_edu.bench.run import make_workload

    record.data.setdefault("call", [])
    for B in batch_sizes:
        for kind in ID_KINDS:
            w = make_workload(s, config, kind, B)
            for label, swap in variants:
                if swap is not None and not call_bits_equal(w, swap):
                    print(f"call bits FAIL: {label} B={B} {kind}", flush=True)
                    record.data["call_bits_fail"] = f"{label} B={B} {kind}"
                    record.save()
                    return False
            for case_name in cases:
                times = interleaved_times(s, config, case_name, w, variants)
                record.data["call"].append(dict(case=case_name, B=B, ids=kind, us=times))
                print(f"{case_name:18s} B={B:<3d} {kind:8s} {spread(times)}", flush=True)
            record.save()
    return True
