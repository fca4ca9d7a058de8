"""Performance probe of issue 11: the GPU bucket table's routes and the deterministic backward, checked then timed.

For each batch size and id kind, in one GPU run, with the bench's ``GpuTimer`` (L2 flushed, host overhead hidden):

* every bucketing route that takes the batch (``buckets.gpu.ROUTES``): its table against NumPy's, then its time
  and its per-phase costs (``buckets.gpu.phase_times_us``); the one-block route also without its bucket rows (the
  chunked method's table: its units and bt_list against NumPy's);
* the deterministic backward end to end (chunked and bucketed, ``bucketing="gpu"``) with each route forced, its
  dwte/dwpe bits against the same call with the table built on the CPU (the mirror's table);
* the parts alone: the wpe kernel, and each wte kernel with a ready table, to see what overlaps;
* other schedules of the backward (the table alone first, then the wpe kernel beside the wte kernels; the table
  beside the wpe kernel, then the wte kernels), their bits against the package's (which runs the table and the
  wte kernels on the caller's stream and the wpe kernel beside them);
* the package's schedule with plain launches (``loader.PROGRAMMATIC_LAUNCH`` off): the table and the backward end
  to end, their bits against the package's (which launches the wte kernels and the scatter route's later steps
  as programmatic dependents).

    python scripts/perf_probe.py --out DIR [--batches 1,8,64] [--kinds uniform,zipf,real] [--repeats 20]

Prints one line per measurement (``ok``/``FAIL`` for the checks) and writes DIR/probe.json. Exits 1 if a
check failed. docs/experiments.md quotes its output (dated).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import gpt2enc_edu as enc  # noqa: E402
from gpt2enc_edu import buckets, compare, cuda, layout, loader  # noqa: E402
from gpt2enc_edu.bench.floor import distinct_ids, minimal_bytes  # noqa: E402
from gpt2enc_edu.bench.timer import GpuTimer, measure_copy_rate  # noqa: E402
from gpt2enc_edu.buckets import gpu as gpu_buckets  # noqa: E402
from gpt2enc_edu.methods import CHUNKED, METHODS, deterministic_methods  # noqa: E402
from gpt2enc_edu.problems import random_problem  # noqa: E402

T, C, V = 1024, 768, 50257
RESULTS: list[dict] = []
FAILURES: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


class Probe:
    """One GPU run's clock, streams and checks; a method per part of the probe (see the module docstring)."""

    def __init__(self, cp, repeats: int):
        self.cp, self.repeats = cp, repeats
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.timer = GpuTimer(cp, flush_bytes=2 * cp.cuda.Device().attributes["L2CacheSize"])
        self.copy_rate, _ = measure_copy_rate(cp, self.timer)
        print(f"copy rate {self.copy_rate / 1e9:.0f} GB/s", flush=True)
        #: Lower numbers mean higher priority; CUDA clamps a number below the device's range to its highest priority.
        highest_priority = -(2**31)
        self.side = cp.cuda.Stream(non_blocking=True, priority=highest_priority)
        self.side_done, self.wpe_done, self.start_side = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
        self.auto_route = gpu_buckets.bucketing_route

    # ------------------------------------------------------------------------------------------ clocks and records
    def t_us(self, fn) -> float:
        with self.stream:
            fn()
            samples, _ = self.timer.time(fn, self.stream, warmup=3, repeats=self.repeats)
        return float(np.median(samples)) * 1e6

    def wall_us(self, fn, calls: int = 300) -> float:
        """Host wall time per call of ``fn`` called back to back (GPU work included where it is longer)."""
        fn()
        self.stream.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        self.stream.synchronize()
        return (time.perf_counter() - start) / calls * 1e6

    def record(self, B, kind, name, us, op=None, distinct=None):
        row = {"B": B, "ids": kind, "name": name, "us": us}
        text = f"B={B:<3} {kind:<8} {name:<48} {us:9.1f} us"
        if op is not None:
            floor_us = minimal_bytes(op, B=B, T=T, C=C, distinct=distinct) / self.copy_rate * 1e6
            row.update(floor_us=floor_us, pct=100 * floor_us / us)
            text += f"  floor {floor_us:6.1f} us = {100 * floor_us / us:5.1f}%"
        RESULTS.append(row)
        print(text, flush=True)

    def upload(self, problem):
        """The problem's arrays on the GPU, the copies finished (they run on the null stream, the probe's
        kernels on ``stream``, which does not wait for it)."""
        arrays = problem.on(self.cp)
        self.cp.cuda.Device().synchronize()
        return arrays

    def same_as_package(self, host, what: str, method: str, schedule, bucketing: str = "gpu") -> None:
        """Check that ``schedule(got)`` leaves the bits of the package's ``encoder_backward`` (``bucketing``)."""
        want, got = self.upload(host), self.upload(host)
        with self.stream:
            enc.encoder_backward(want.dwte, want.dwpe, want.dout, want.inp, seed=99, method=method,
                                 bucketing=bucketing)
        self.stream.synchronize()
        with self.stream:
            schedule(got)
        self.stream.synchronize()
        check(compare.bitwise_equal(got.dwte, want.dwte) and compare.bitwise_equal(got.dwpe, want.dwpe), what)

    def backward(self, g, method: str):
        """The package's call, as a training step makes it (ids checked already)."""
        return lambda: enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=5, method=method, bucketing="gpu",
                                            check_ids=False)

    # ------------------------------------------------------------------------------------------ other schedules
    def table_beside_wpe(self, g, B, seed):
        """The table on a side stream of the highest priority beside the wpe kernel on the caller's stream, which
        then waits for the table (the first half of a schedule the package no longer uses: docs/experiments.md,
        schedule, streams and launches); returns the table."""
        self.start_side.record(self.stream)
        self.side.wait_event(self.start_side)
        with self.side:
            table = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)
            self.side_done.record(self.side)
        cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C, seed)
        self.stream.wait_event(self.side_done)
        return table

    def table_beside_wpe_then_wte(self, g, B, seed, method):
        """Another schedule (one the package no longer uses): ``table_beside_wpe``, then the method's wte launcher on
        the caller's stream."""
        table = self.table_beside_wpe(g, B, seed)
        getattr(cuda, METHODS[method].launcher)(g.dwte, table, g.dout, C, seed)

    def table_first(self, g, B, seed):
        """Another schedule of the chunked backward: the table alone first, then the wpe kernel beside the wte
        kernels."""
        self.start_side.record(self.stream)
        self.side.wait_event(self.start_side)
        with self.side:
            table = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)
            self.side_done.record(self.side)
        self.stream.wait_event(self.side_done)
        with self.side:
            cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C, seed)
            self.wpe_done.record(self.side)
        cuda.encoder_backward_wte_chunked(g.dwte, table, g.dout, C, seed)
        self.stream.wait_event(self.wpe_done)

    def set_programmatic(self, on: bool) -> None:
        """Turn programmatic dependent launch on or off (the table's workspaces, and so the scatter route's graph,
        are kept per setting: buckets.gpu.build_in_workspace)."""
        self.cp.cuda.Device().synchronize()
        loader.PROGRAMMATIC_LAUNCH = on

    # ------------------------------------------------------------------------------------------ the parts
    def overlap(self, B, kind, g):
        """The table and the wpe kernel alone, then side by side (the older schedule), and the call."""
        self.record(B, kind, "overlap: table alone", self.t_us(lambda: gpu_buckets.build_bucket_table_gpu(
            g.inp, C, enc.bfloat16, V)))
        self.record(B, kind, "overlap: wpe kernel alone", self.t_us(lambda: cuda.encoder_backward_wpe(
            g.dwpe, g.dout, B, T, C, 5)))
        self.record(B, kind, "overlap: table beside the wpe kernel", self.t_us(lambda: self.table_beside_wpe(g, B, 5)))
        self.record(B, kind, "overlap: chunked backward end to end", self.t_us(self.backward(g, CHUNKED.name)))

    def routes(self, B, kind, g, table_np):
        """The table, route by route: against NumPy's, timed, phase by phase."""
        for route in gpu_buckets.routes_for(B * T, V):
            build = lambda route=route, rows=True: gpu_buckets.build_bucket_table_gpu(  # noqa: E731
                g.inp, C, enc.bfloat16, V, route=route, bucket_rows=rows)
            with self.stream:
                got = build().to_host()
            check(buckets.same_table(got, table_np), f"B={B} {kind} {route} table == NumPy table")
            self.record(B, kind, f"table, {route}", self.t_us(build))
            if route == "small":  # the chunked method's table: no bucket rows
                with self.stream:
                    lean = build(rows=False)
                    num_units = int(lean.counters[layout.COUNTER_NUM_UNITS].get())
                    check(np.array_equal(lean.units[:num_units].get(), table_np.units)
                          and np.array_equal(lean.bt_list.get(), table_np.bt_list),
                          f"B={B} {kind} small table without bucket rows: units and bt_list == NumPy's")
                self.record(B, kind, "table, small, no bucket rows", self.t_us(lambda: build(rows=False)))
            with self.stream:
                phases = gpu_buckets.phase_times_us(g.inp, C, enc.bfloat16, V, route=route)
            print(f"B={B} {kind} {route} phases: "
                  + ", ".join(f"{k}={v:.1f}" for k, v in phases.items() if isinstance(v, float)), flush=True)
            RESULTS.append({"B": B, "ids": kind, "name": f"phases, {route}", "phases": phases})

    def scatter_wall(self, B, kind, g):
        """The scatter route's wall time per call, back to back: one graph or five launches."""
        if B * T > layout.SCATTER_MAX_BT:
            return
        with self.stream:
            ws = gpu_buckets.build_in_workspace(g.inp, C, enc.bfloat16, V, route="scatter")
            groups = layout.num_c_groups(C, enc.bfloat16)
            self.record(B, kind, "table, scatter, wall per call (graph)", self.wall_us(
                lambda: gpu_buckets.build_in_workspace(g.inp, C, enc.bfloat16, V, route="scatter")))
            launches = len(gpu_buckets.SCATTER_PHASES)
            self.record(B, kind, f"table, scatter, wall per call ({launches} launches)", self.wall_us(
                lambda: gpu_buckets._launch_scatter(self.cp, g.inp, B * T, V, groups, enc.bfloat16, ws, 0)))

    def kernels_alone(self, B, kind, g, host, table_np):
        """The wpe kernel and each wte kernel with a ready table; the chunk kernel's two forms by name (the package
        picks one: cuda.chunk_walk), same bits."""
        table_dev = buckets.to_device(table_np)
        self.record(B, kind, "wpe kernel alone", self.t_us(lambda: cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C,
                                                                                            5)))
        self.record(B, kind, "chunked wte kernels, table ready", self.t_us(
            lambda: cuda.encoder_backward_wte_chunked(g.dwte, table_dev, g.dout, C, 5)))
        self.record(B, kind, "chunked wte: the chunk kernel alone (no combine)", self.t_us(
            lambda: cuda._launch_chunk_kernel(g.dwte, table_dev, g.dout, C, 5)))
        walked = {}
        for walk in sorted(cuda.CHUNK_WALKS):
            walked[walk] = self.upload(host)
            with self.stream:
                cuda.encoder_backward_wte_chunked(walked[walk].dwte, table_dev, walked[walk].dout, C, 99, walk=walk)
            self.stream.synchronize()
            self.record(B, kind, f"chunked wte kernels, table ready, {walk} walk", self.t_us(
                lambda walk=walk: cuda.encoder_backward_wte_chunked(g.dwte, table_dev, g.dout, C, 5, walk=walk)))
        check(compare.bitwise_equal(walked["registers"].dwte, walked["staged"].dwte),
              f"B={B} {kind} chunked wte: staged walk == register walk (the package picks "
              f"{cuda.chunk_walk(table_dev.max_units, C, enc.bfloat16)})")
        self.record(B, kind, "bucketed wte kernel, table ready", self.t_us(
            lambda: cuda.encoder_backward_wte_bucketed(g.dwte, table_dev, g.dout, C, 5)))

    def schedules(self, B, kind, g, host, distinct):
        """Other schedules: the table first, then the wpe kernel beside the wte kernels; the table beside the wpe
        kernel, then the wte kernels. Their bits against the package's, then their times."""
        self.same_as_package(host, f"B={B} {kind} table-first schedule == the package's", CHUNKED.name,
                             lambda got: self.table_first(got, B, 99))
        self.record(B, kind, "backward chunked e2e, table first then wpe beside wte", self.t_us(
            lambda: self.table_first(g, B, 5)), "backward", distinct)
        for method in deterministic_methods():
            self.same_as_package(host, f"B={B} {kind} {method}: table-beside-wpe schedule == the package's", method,
                                 lambda got, method=method: self.table_beside_wpe_then_wte(got, B, 99, method))
            self.record(B, kind, f"backward {method} e2e, table beside wpe, then wte", self.t_us(
                lambda method=method: self.table_beside_wpe_then_wte(g, B, 5, method)), "backward", distinct)

    def plain_launches(self, B, kind, g, host, distinct):
        """The package's schedule without programmatic dependent launch: bits, then times."""
        for method in deterministic_methods():
            def plain(got, method=method):
                self.set_programmatic(False)
                try:
                    enc.encoder_backward(got.dwte, got.dwpe, got.dout, got.inp, seed=99, method=method,
                                         bucketing="gpu")
                    self.stream.synchronize()
                finally:
                    self.set_programmatic(True)

            self.same_as_package(host, f"B={B} {kind} {method}: plain launches == the package's", method, plain)
            self.set_programmatic(False)
            try:
                self.record(B, kind, f"backward {method} e2e, plain launches", self.t_us(self.backward(g, method)),
                            "backward", distinct)
                if method == CHUNKED.name:
                    self.record(B, kind, "table, plain launches", self.t_us(
                        lambda: gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)))
            finally:
                self.set_programmatic(True)

    def routes_forced(self, B, kind, g, host, distinct):
        """End to end, each route forced; bits against the CPU-built table."""
        for method in deterministic_methods():
            for route in gpu_buckets.routes_for(B * T, V):
                gpu_buckets.bucketing_route = lambda BT, V, route=route: route
                try:
                    self.same_as_package(host, f"B={B} {kind} {method} e2e with the {route} table == with the CPU "
                                         "table", method, lambda got, method=method: enc.encoder_backward(
                                             got.dwte, got.dwpe, got.dout, got.inp, seed=99, method=method,
                                             bucketing="gpu"), bucketing="cpu")
                    self.record(B, kind, f"backward {method} e2e, {route} table", self.t_us(self.backward(g, method)),
                                "backward", distinct)
                finally:
                    gpu_buckets.bucketing_route = self.auto_route


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--kinds", default="uniform,zipf,real")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--overlap-only", action="store_true",
                        help="only the overlap measurement: table and wpe kernel alone, side by side, and end to end")
    args = parser.parse_args()
    import cupy as cp

    probe = Probe(cp, args.repeats)
    for B in [int(b) for b in args.batches.split(",")]:
        for kind in args.kinds.split(","):
            host = random_problem(B, T, C, V, T, ids=kind, rng=np.random.default_rng(1234))
            g = probe.upload(host)
            distinct = distinct_ids(host.inp)
            table_np = buckets.build_bucket_table(host.inp, C, enc.bfloat16)
            print(f"B={B} {kind}: {distinct} distinct tokens, largest count {int(table_np.sizes.max())}; "
                  f"auto route {probe.auto_route(B * T, V)}", flush=True)
            probe.overlap(B, kind, g)
            if args.overlap_only:
                continue
            probe.routes(B, kind, g, table_np)
            probe.scatter_wall(B, kind, g)
            probe.kernels_alone(B, kind, g, host, table_np)
            probe.schedules(B, kind, g, host, distinct)
            probe.plain_launches(B, kind, g, host, distinct)
            probe.routes_forced(B, kind, g, host, distinct)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(
        json.dumps({"copy_rate": probe.copy_rate, "results": RESULTS, "failures": FAILURES}, indent=1)
    )
    print(f"{len(FAILURES)} checks failed" + (": " + "; ".join(FAILURES) if FAILURES else ""), flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
