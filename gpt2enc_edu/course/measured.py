"""Timings the notebooks plot: measured now on a GPU, or read from a committed H200 run on a CPU.

Each function returns a plain dict with a ``"source"`` sentence that says which of the two it is, so a
notebook never passes off old numbers as live ones. The committed files live in ``docs/walkthrough/`` of
the repository (``COMMITTED``); ``python -m gpt2enc_edu.course.measured --out DIR`` on a GPU writes them.

``committed_dir`` finds committed results wherever the package is: a wheel carries the files the notebooks read
in ``gpt2enc_edu/committed/`` (copied from ``docs/`` when the wheel is built: pyproject's force-include, so
``docs/`` stays their one home), a checkout or an editable install reads ``docs/`` itself. ``bench_dir`` is the
benchmark's folder the notebooks read (``GPT2ENC_BENCH_DIR`` names another).

* ``forward_versions``: versions 1, 2 and 3 of the forward kernel (``cuda.encoder_forward_version``) at
  a few batch sizes, with the memory floor (minimal bytes over a device copy rate measured in the same run);
* ``bucketing_phases``: the GPU bucketing kernel's cost split by phase at B=1 and B=64
  (``buckets.gpu.phase_times_us``: runs stopped after each phase, differences taken).

Timing: CUDA events around each call, median of ``repeats``; before every repeat a buffer of twice the L2
size is overwritten so that inputs come from HBM.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from ..buckets import gpu as gpu_buckets
from ..rounding import bfloat16
from ..tokens import make_ids

#: The checkout's docs/ folder (absent in an installed wheel), where the GPU runs write their results.
CHECKOUT_DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Where a wheel carries the committed results the notebooks read (``docs/<name>/<file>`` at
#: ``gpt2enc_edu/committed/<name>/<file>``; the list is pyproject.toml's force-include).
PACKAGED = Path(__file__).resolve().parents[1] / "committed"
#: Where the committed walkthrough numbers are written in a checkout.
COMMITTED = CHECKOUT_DOCS / "walkthrough"
T, C, V = 1024, 768, 50257
FORWARD_BATCHES = (8, 64)


def committed_dir(name: str) -> Path:
    """The folder of committed results ``name`` (``"bench"``, ``"walkthrough"``): the copy inside an installed
    wheel, else the checkout's ``docs/<name>`` (also when it does not exist: reading it then says what is missing).

    The wheel's copy comes first: an installed package's ``parents[2]`` is ``site-packages``, not a checkout.
    """
    packaged = PACKAGED / name
    return packaged if packaged.is_dir() else CHECKOUT_DOCS / name


def bench_dir() -> Path:
    """The benchmark run the notebooks draw: ``$GPT2ENC_BENCH_DIR`` if set, else the committed one."""
    override = os.environ.get("GPT2ENC_BENCH_DIR")
    return Path(override) if override else committed_dir("bench")


def _committed(name: str) -> dict | None:
    path = committed_dir("walkthrough") / name
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["source"] = (f"committed numbers from {data.get('device', 'a GPU')} ({data.get('date', '?')}), "
                      f"docs/walkthrough/{name}: no GPU here")
    return data


def _is_cupy(xp) -> bool:
    return xp is not np and xp.__name__ == "cupy"


def _timer(cupy, repeats: int):
    """``time(fn) -> median microseconds`` with an L2 flush before every repeat."""
    l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 64 << 20)
    flush = cupy.empty(2 * l2, dtype=cupy.uint8)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    def time(fn) -> float:
        fn()  # compile and warm up
        samples = []
        for _ in range(repeats):
            flush.fill(1)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
        return float(np.median(samples))

    return time


def copy_rate(cupy) -> float:
    """Device-to-device copy rate in bytes (read + written) per second, measured by the benchmark's own
    ``measure_copy_rate``: one definition of the copy rate behind every floor in the project."""
    from ..bench.timer import GpuTimer, measure_copy_rate

    l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 64 << 20)
    rate, _ = measure_copy_rate(cupy, GpuTimer(cupy, flush_bytes=2 * l2))
    return rate


def forward_floor_bytes(inp, C: int, itemsize: int) -> int:
    """Minimal bytes of the forward: write out, read each distinct wte row once, the T wpe rows, the ids."""
    inp = np.asarray(inp)
    B, T = inp.shape
    return (B * T * C + np.unique(inp).size * C + T * C) * itemsize + inp.size * 4


def measure_forward_versions(cupy, batches=FORWARD_BATCHES, repeats: int = 50) -> dict:
    """Time every forward version that ``cuda`` has, bf16, real ids; checks each result against version 3."""
    from .. import cuda

    rate = copy_rate(cupy)
    time = _timer(cupy, repeats)
    rng = np.random.default_rng(0)
    wte = cupy.asarray(rng.standard_normal((V, C), dtype=np.float32).astype(bfloat16))
    wpe = cupy.asarray(rng.standard_normal((T, C), dtype=np.float32).astype(bfloat16))
    versions = [v for v in (1, 2, 3) if hasattr(cuda, "encoder_forward_version")] or [3]
    rows = []
    for B in batches:
        ids = make_ids("real", B, T, seed=B)
        inp = cupy.asarray(ids)
        want = cupy.empty((B, T, C), dtype=wte.dtype)
        cuda.encoder_forward(want, inp, wte, wpe, B, T, C)
        for version in versions:
            out = cupy.empty_like(want)

            def call(version=version, out=out):
                if hasattr(cuda, "encoder_forward_version"):
                    cuda.encoder_forward_version(version, out, inp, wte, wpe, B, T, C)
                else:
                    cuda.encoder_forward(out, inp, wte, wpe, B, T, C)

            us = time(call)
            same = bool((out.view(cupy.uint16) == want.view(cupy.uint16)).all())
            rows.append({"version": version, "B": B, "median_us": us, "bitwise_equal_to_v3": same,
                         "floor_us": forward_floor_bytes(ids, C, 2) / rate * 1e6})
    return {"T": T, "C": C, "V": V, "dtype": "bf16", "ids": "real", "copy_rate_GBps": rate / 1e9,
            "repeats": repeats, "rows": rows}


def measure_bucketing_phases(cupy, runs=((1, "small"), (1, "scatter"), (64, "scatter"), (64, "cooperative")),
                             repeats: int = 20) -> dict:
    """The GPU bucket table, phase by phase (``buckets.gpu.phase_times_us``), for each (batch size, route): the
    default routes (the one-block kernel for one sequence, the scatter route up to 65,536 ids) and, for
    comparison, the scatter route at B = 1 and the cooperative kernel at B = 64."""
    measured = []
    for B, route in runs:
        inp = cupy.asarray(make_ids("real", B, T, seed=0))
        times = dict(gpu_buckets.phase_times_us(inp, C, bfloat16, V, repeats=repeats, route=route))
        kernel, route, total = times.pop("kernel"), times.pop("route"), times.pop("total")
        if route == "scatter":
            times.pop("launch")  # each of its phases is a kernel of its own, launch included
        measured.append({"B": B, "route": route, "kernel": kernel,
                         "phases_us": {k: float(v) for k, v in times.items()}, "total_us": float(total)})
    return {"T": T, "C": C, "V": V, "ids": "real", "repeats": repeats, "runs": measured}


def _device_meta(cupy) -> dict:
    import datetime

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"device": name, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def _live_or_committed(xp, measure, file_name: str) -> dict | None:
    """``measure(xp)`` on a GPU (``xp`` is CuPy), with the device and the date, else the committed H200 numbers of
    ``file_name`` (``None`` if there are none)."""
    if _is_cupy(xp):
        data = {**_device_meta(xp), **measure(xp)}
        data["source"] = f"measured now on this GPU ({data['device']})"
        return data
    return _committed(file_name)


def forward_versions(xp) -> dict | None:
    """Live on a GPU (``xp`` is CuPy), else the committed H200 numbers (``None`` if there are none)."""
    return _live_or_committed(xp, measure_forward_versions, "forward_versions.json")


def bucketing_phases(xp) -> dict | None:
    """Live on a GPU, else the committed H200 numbers (``None`` if there are none)."""
    return _live_or_committed(xp, measure_bucketing_phases, "bucketing_phases.json")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Measure the walkthrough's committed numbers (needs a GPU).")
    parser.add_argument("--out", type=Path, default=COMMITTED)
    args = parser.parse_args(argv)
    from ..backend import gpu_status

    status = gpu_status()
    if status.name != "cuda":
        print(f"nothing measured: {status.reason}")
        return 0
    import cupy

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {**_device_meta(cupy), "command": "python -m gpt2enc_edu.course.measured"}
    for name, measure in (("forward_versions.json", measure_forward_versions),
                          ("bucketing_phases.json", measure_bucketing_phases)):
        data = {**meta, **measure(cupy)}
        (args.out / name).write_text(json.dumps(data, indent=1) + "\n")
        print(name, json.dumps(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
