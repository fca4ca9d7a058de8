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
from gpt2enc_edu.problems import random_problem  # noqa: E402

T, C, V = 1024, 768, 50257
RESULTS: list[dict] = []
FAILURES: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


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

    stream = cp.cuda.Stream(non_blocking=True)
    timer = GpuTimer(cp, flush_bytes=2 * cp.cuda.Device().attributes["L2CacheSize"])
    copy_rate, _ = measure_copy_rate(cp, timer)
    print(f"copy rate {copy_rate / 1e9:.0f} GB/s", flush=True)

    def t_us(fn) -> float:
        with stream:
            fn()
            samples, _ = timer.time(fn, stream, warmup=3, repeats=args.repeats)
        return float(np.median(samples)) * 1e6

    def wall_us(fn, calls: int = 300) -> float:
        """Host wall time per call of ``fn`` called back to back (GPU work included where it is longer)."""
        import time

        fn()
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        stream.synchronize()
        return (time.perf_counter() - start) / calls * 1e6

    def record(B, kind, name, us, op=None, distinct=None):
        row = {"B": B, "ids": kind, "name": name, "us": us}
        text = f"B={B:<3} {kind:<8} {name:<48} {us:9.1f} us"
        if op is not None:
            floor_us = minimal_bytes(op, B=B, T=T, C=C, distinct=distinct) / copy_rate * 1e6
            row.update(floor_us=floor_us, pct=100 * floor_us / us)
            text += f"  floor {floor_us:6.1f} us = {100 * floor_us / us:5.1f}%"
        RESULTS.append(row)
        print(text, flush=True)

    auto_route = gpu_buckets.bucketing_route

    def upload(problem):
        """The problem's arrays on the GPU, the copies finished (they run on the null stream, the probe's
        kernels on ``stream``, which does not wait for it)."""
        arrays = problem.on(cp)
        cp.cuda.Device().synchronize()
        return arrays
    def chunk_kernel_only(dwte, table, dout):
        """The first of ``cuda.encoder_backward_wte_chunked``'s two kernels, launched as it launches it."""
        cuda._launch_chunk_kernel(dwte, table, dout, C, 5)

    #: Lower numbers mean higher priority; CUDA clamps a number below the device's range to its highest priority.
    highest_priority = -(2**31)
    side, side_done, wpe_done = (cp.cuda.Stream(non_blocking=True, priority=highest_priority),
                                 cp.cuda.Event(), cp.cuda.Event())
    start_side = cp.cuda.Event()

    def table_beside_wpe(g, B, seed):
        """The table on a side stream of the highest priority beside the wpe kernel on the caller's stream, which
        then waits for the table (the first half of a schedule the package no longer uses: docs/experiments.md,
        schedule, streams and launches); returns the table."""
        start_side.record(stream)
        side.wait_event(start_side)
        with side:
            table = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)
            side_done.record(side)
        cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C, seed)
        stream.wait_event(side_done)
        return table

    def table_beside_wpe_then_wte(g, B, seed, method="chunked"):
        """Another schedule (one the package no longer uses): ``table_beside_wpe``, then the wte kernel(s) on the
        caller's stream."""
        table = table_beside_wpe(g, B, seed)
        wte = cuda.encoder_backward_wte_chunked if method == "chunked" else cuda.encoder_backward_wte_bucketed
        wte(g.dwte, table, g.dout, C, seed)

    def table_first(g, B, seed):
        """Another schedule of the chunked backward: the table alone first, then the wpe kernel beside the wte
        kernels."""
        start_side.record(stream)
        side.wait_event(start_side)
        with side:
            table = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)
            side_done.record(side)
        stream.wait_event(side_done)
        with side:
            cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C, seed)
            wpe_done.record(side)
        cuda.encoder_backward_wte_chunked(g.dwte, table, g.dout, C, seed)
        stream.wait_event(wpe_done)

    def set_programmatic(on: bool) -> None:
        """Turn programmatic dependent launch on or off (the table's workspaces, and so the scatter route's graph,
        are kept per setting: buckets.gpu._launch)."""
        cp.cuda.Device().synchronize()
        loader.PROGRAMMATIC_LAUNCH = on

    for B in [int(b) for b in args.batches.split(",")]:
        for kind in args.kinds.split(","):
            host = random_problem(B, T, C, V, T, ids=kind, rng=np.random.default_rng(1234))
            g = upload(host)
            distinct = distinct_ids(host.inp)
            table_np = buckets.build_bucket_table(host.inp, C, enc.bfloat16)
            print(
                f"B={B} {kind}: {distinct} distinct tokens, largest count {int(table_np.sizes.max())}; "
                f"auto route {auto_route(B * T, V)}",
                flush=True,
            )
            # ---------------- overlap: the table and the wpe kernel alone, then side by side (the older schedule)
            record(B, kind, "overlap: table alone", t_us(lambda: gpu_buckets.build_bucket_table_gpu(
                g.inp, C, enc.bfloat16, V)))
            record(B, kind, "overlap: wpe kernel alone", t_us(lambda: cuda.encoder_backward_wpe(
                g.dwpe, g.dout, B, T, C, 5)))
            record(B, kind, "overlap: table beside the wpe kernel", t_us(lambda: table_beside_wpe(g, B, 5)))
            record(B, kind, "overlap: chunked backward end to end", t_us(lambda: enc.encoder_backward(
                g.dwte, g.dwpe, g.dout, g.inp, seed=5, method="chunked", bucketing="gpu", check_ids=False)))
            if args.overlap_only:
                continue
            # ---------------- the table, route by route
            for route in gpu_buckets.routes_for(B * T, V):
                with stream:
                    got = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V, route=route).to_host()
                check(buckets.same_table(got, table_np), f"B={B} {kind} {route} table == NumPy table")
                record(
                    B,
                    kind,
                    f"table, {route}",
                    t_us(
                        lambda route=route: gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V, route=route)
                    ),
                )
                if route == "small":  # the chunked method's table: no bucket rows
                    units_only = lambda: gpu_buckets.build_bucket_table_gpu(  # noqa: E731
                        g.inp, C, enc.bfloat16, V, route="small", bucket_rows=False)
                    with stream:
                        lean = units_only()
                        num_units = int(lean.counters[layout.COUNTER_NUM_UNITS].get())
                        check(np.array_equal(lean.units[:num_units].get(), table_np.units)
                              and np.array_equal(lean.bt_list.get(), table_np.bt_list),
                              f"B={B} {kind} small table without bucket rows: units and bt_list == NumPy's")
                    record(B, kind, "table, small, no bucket rows", t_us(units_only))
                with stream:
                    phases = gpu_buckets.phase_times_us(g.inp, C, enc.bfloat16, V, route=route)
                print(
                    f"B={B} {kind} {route} phases: "
                    + ", ".join(f"{k}={v:.1f}" for k, v in phases.items() if isinstance(v, float)),
                    flush=True,
                )
                RESULTS.append({"B": B, "ids": kind, "name": f"phases, {route}", "phases": phases})
            # ---------------- the scatter route's wall time per call, back to back: one graph or five launches
            if B * T <= layout.SCATTER_MAX_BT:
                with stream:
                    ws = gpu_buckets._launch(g.inp, C, enc.bfloat16, V, route="scatter")
                    groups = layout.num_c_groups(C, enc.bfloat16)
                    record(B, kind, "table, scatter, wall per call (graph)", wall_us(
                        lambda: gpu_buckets._launch(g.inp, C, enc.bfloat16, V, route="scatter")))
                    launches = len(gpu_buckets.SCATTER_PHASES)
                    record(B, kind, f"table, scatter, wall per call ({launches} launches)", wall_us(
                        lambda: gpu_buckets._launch_scatter(cp, g.inp, B * T, V, groups, enc.bfloat16, ws, 0)))

            # ---------------- the parts alone
            table_dev = buckets.to_device(table_np)
            record(B, kind, "wpe kernel alone", t_us(lambda: cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C, 5)))
            record(
                B,
                kind,
                "chunked wte kernels, table ready",
                t_us(lambda: cuda.encoder_backward_wte_chunked(g.dwte, table_dev, g.dout, C, 5)),
            )
            record(B, kind, "chunked wte: the chunk kernel alone (no combine)", t_us(
                lambda: chunk_kernel_only(g.dwte, table_dev, g.dout)))
            # the chunk kernel's two forms by name (the package picks one: cuda.chunk_walk), same bits
            walked = {}
            for walk in sorted(cuda.CHUNK_WALKS):
                walked[walk] = upload(host)
                with stream:
                    cuda.encoder_backward_wte_chunked(walked[walk].dwte, table_dev, walked[walk].dout, C, 99, walk=walk)
                stream.synchronize()
                record(B, kind, f"chunked wte kernels, table ready, {walk} walk", t_us(
                    lambda walk=walk: cuda.encoder_backward_wte_chunked(g.dwte, table_dev, g.dout, C, 5, walk=walk)))
            check(compare.bitwise_equal(walked["registers"].dwte, walked["staged"].dwte),
                  f"B={B} {kind} chunked wte: staged walk == register walk (the package picks "
                  f"{cuda.chunk_walk(table_dev.max_units, C, enc.bfloat16)})")
            record(
                B,
                kind,
                "bucketed wte kernel, table ready",
                t_us(lambda: cuda.encoder_backward_wte_bucketed(g.dwte, table_dev, g.dout, C, 5)),
            )

            # ---------------- another schedule: the table first, then the wpe kernel beside the wte kernels
            want, got = upload(host), upload(host)
            with stream:
                enc.encoder_backward(want.dwte, want.dwpe, want.dout, want.inp, seed=99, method="chunked",
                                     bucketing="gpu")
                table_first(got, B, 99)
            stream.synchronize()
            check(compare.bitwise_equal(got.dwte, want.dwte) and compare.bitwise_equal(got.dwpe, want.dwpe),
                  f"B={B} {kind} table-first schedule == the package's")
            record(B, kind, "backward chunked e2e, table first then wpe beside wte", t_us(
                lambda: table_first(g, B, 5)), "backward", distinct)
            for method in ("chunked", "bucketed"):
                want, got = upload(host), upload(host)
                with stream:
                    enc.encoder_backward(want.dwte, want.dwpe, want.dout, want.inp, seed=99, method=method,
                                         bucketing="gpu")
                    table_beside_wpe_then_wte(got, B, 99, method)
                stream.synchronize()
                check(compare.bitwise_equal(got.dwte, want.dwte) and compare.bitwise_equal(got.dwpe, want.dwpe),
                      f"B={B} {kind} {method}: table-beside-wpe schedule == the package's")
                record(B, kind, f"backward {method} e2e, table beside wpe, then wte", t_us(
                    lambda method=method: table_beside_wpe_then_wte(g, B, 5, method)), "backward", distinct)

            # ---------------- plain launches: the package's schedule without programmatic dependent launch
            for method in ("chunked", "bucketed"):
                want, got = upload(host), upload(host)
                with stream:
                    enc.encoder_backward(want.dwte, want.dwpe, want.dout, want.inp, seed=99, method=method,
                                         bucketing="gpu")
                stream.synchronize()
                set_programmatic(False)
                try:
                    with stream:
                        enc.encoder_backward(got.dwte, got.dwpe, got.dout, got.inp, seed=99, method=method,
                                             bucketing="gpu")
                    stream.synchronize()
                    check(compare.bitwise_equal(got.dwte, want.dwte) and compare.bitwise_equal(got.dwpe, want.dwpe),
                          f"B={B} {kind} {method}: plain launches == the package's")
                    backward = lambda method=method: enc.encoder_backward(  # noqa: E731
                        g.dwte, g.dwpe, g.dout, g.inp, seed=5, method=method, bucketing="gpu", check_ids=False)
                    record(B, kind, f"backward {method} e2e, plain launches", t_us(backward), "backward", distinct)
                    if method == "chunked":
                        record(B, kind, "table, plain launches", t_us(
                            lambda: gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)))
                finally:
                    set_programmatic(True)

            # ---------------- end to end, each route forced; bits against the CPU-built table
            for method in ("chunked", "bucketed"):
                want = upload(host)
                with stream:
                    enc.encoder_backward(
                        want.dwte, want.dwpe, want.dout, want.inp, seed=99, method=method, bucketing="cpu"
                    )
                stream.synchronize()  # the comparisons below run on another stream
                for route in gpu_buckets.routes_for(B * T, V):
                    gpu_buckets.bucketing_route = lambda BT, V, route=route: route
                    try:
                        got = upload(host)
                        with stream:
                            enc.encoder_backward(
                                got.dwte, got.dwpe, got.dout, got.inp, seed=99, method=method, bucketing="gpu"
                            )
                        stream.synchronize()
                        check(
                            compare.bitwise_equal(got.dwte, want.dwte) and compare.bitwise_equal(got.dwpe, want.dwpe),
                            f"B={B} {kind} {method} e2e with the {route} table == with the CPU table",
                        )
                        record(
                            B,
                            kind,
                            f"backward {method} e2e, {route} table",
                            t_us(
                                lambda method=method: enc.encoder_backward(
                                    g.dwte,
                                    g.dwpe,
                                    g.dout,
                                    g.inp,
                                    seed=5,
                                    method=method,
                                    bucketing="gpu",
                                    check_ids=False,
                                )
                            ),
                            "backward",
                            distinct,
                        )
                    finally:
                        gpu_buckets.bucketing_route = auto_route

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(
        json.dumps({"copy_rate": copy_rate, "results": RESULTS, "failures": FAILURES}, indent=1)
    )
    print(f"{len(FAILURES)} checks failed" + (": " + "; ".join(FAILURES) if FAILURES else ""), flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
