"""Performance probe of issue 11: times kernel variants in one GPU run and checks their bits.

For each batch size and id kind it checks, then times (bench GpuTimer: L2 flushed, host overhead hidden):
forward versions and variants against the floor; the GPU bucket table (new dispatch, cooperative grid sizes,
per-phase costs); the wte kernels with a ready table (old source vs new); the deterministic backward end to
end; the fp32 atomic backward (old full-copy route vs touched rows) against PyTorch's index_add_.

    python scripts/perf_probe.py [--old DIR] [--quick]     # DIR: old kernel sources to compare with

Bits: new forward versions == old forward; GPU table == NumPy table; new wte kernels == old ones == mirror
(mirror at B <= 8). Prints one summary line per measurement; writes probe.json next to --out.
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
from gpt2enc_edu import buckets, cuda, gpu_buckets, loader, mirror  # noqa: E402
from gpt2enc_edu.bench.floor import distinct_ids, minimal_bytes  # noqa: E402
from gpt2enc_edu.bench.timer import GpuTimer, measure_copy_rate  # noqa: E402
from gpt2enc_edu.layout import BLOCK_SIZE, ceil_div  # noqa: E402
from gpt2enc_edu.problems import random_problem  # noqa: E402

T, C, V = 1024, 768, 50257
RESULTS: list[dict] = []
FAILURES: list[str] = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", default=str(ROOT / ".probe_old"))
    parser.add_argument("--out", default=".")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--kinds", default="uniform,zipf,real")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import cupy as cp

    old = Path(args.old)
    stream = cp.cuda.Stream(non_blocking=True)
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    timer = GpuTimer(cp, flush_bytes=2 * l2)
    copy_rate, _ = measure_copy_rate(cp, timer)
    print(f"copy rate {copy_rate / 1e9:.0f} GB/s", flush=True)

    def t_us(fn, repeats=args.repeats):
        fn()
        samples, _ = timer.time(fn, stream, warmup=3, repeats=repeats)
        return float(np.median(samples)) * 1e6

    def record(B, kind, name, us, op=None, distinct=None):
        row = {"B": B, "ids": kind, "name": name, "us": us}
        text = f"B={B:<3} {kind:<8} {name:<44} {us:9.1f} us"
        if op is not None:
            floor_us = minimal_bytes(op, B=B, T=T, C=C, distinct=distinct) / copy_rate * 1e6
            row.update(floor_us=floor_us, pct=100 * floor_us / us)
            text += f"  floor {floor_us:6.1f} us = {100 * floor_us / us:5.1f}%"
        RESULTS.append(row)
        print(text, flush=True)

    def module(source, label):
        return loader.compile_source(source, enc.bfloat16, label=label, cooperative="grid.sync" in source)

    fwd_src = loader.kernel_source("encoder_forward.cu")
    fwd_variants = {}
    for rows in (4, 8):
        for cs in (True,):
            src = fwd_src.replace("#define FORWARD_ROWS 8", f"#define FORWARD_ROWS {rows}")
            if not cs:
                src = src.replace("store128cs(out", "store128(out")
            fwd_variants[(rows, cs)] = module(src, f"fwd rows={rows} cs={cs}").get_function("encoder_forward_kernel")
    old_fwd = module((old / "encoder_forward.cu").read_text(), "old fwd").get_function("encoder_forward_kernel")
    old_bucketed = module((old / "encoder_backward_wte_bucketed.cu").read_text(), "old bucketed").get_function(
        "encoder_backward_wte_bucketed_kernel")
    old_chunk_mod = module((old / "encoder_backward_wte_chunked.cu").read_text(), "old chunked")
    old_coop = module((old / "bucketing.cu").read_text(), "old bucketing").get_function("bucketing_kernel")
    ch_src = loader.kernel_source("encoder_backward_wte_chunked.cu")
    chunk_variants = {}
    for groups, unroll, mb in ((3, 2, 2),):
        src = (ch_src.replace("#define CHUNK_GROUPS 3", f"#define CHUNK_GROUPS {groups}")
               .replace("#define CHUNK_UNROLL 1", f"#define CHUNK_UNROLL {unroll}")
               .replace("#define CHUNKED_MIN_BLOCKS 3", f"#define CHUNKED_MIN_BLOCKS {mb}"))
        chunk_variants[(groups, unroll, mb)] = module(src, f"chunked {groups}/{unroll}/{mb}")

    bk_src = loader.kernel_source("encoder_backward_wte_bucketed.cu")
    bucketed_variants = {
        "no prefetch": bk_src.replace("if (warp_id == 0 && has_channels) { packed_dwte = load128(dwte_ix); }", "")
        .replace("    for (int k = 0; k < x128::size; k++) {\n        // Noise position",
                 "    packed_dwte = load128(dwte_ix);\n"
                 "    for (int k = 0; k < x128::size; k++) {\n        // Noise position"),
        "bounds 8": bk_src.replace("__launch_bounds__(WTE_BLOCK_SIZE)", "__launch_bounds__(WTE_BLOCK_SIZE, 8)"),
    }
    bucketed_variants = {k: module(v, k).get_function("encoder_backward_wte_bucketed_kernel")
                         for k, v in bucketed_variants.items()}
    empty = module('extern "C" __global__ void empty_kernel() {}', "empty").get_function("empty_kernel")
    record(0, "-", "empty kernel (timer floor)", t_us(lambda: empty((1,), (32,), ())))

    try:
        import torch
        has_torch = torch.cuda.is_available()
    except Exception:
        has_torch = False

    for B in [int(b) for b in args.batches.split(",")]:
        for kind in args.kinds.split(","):
            host = random_problem(B, T, C, V, T, ids=kind, rng=np.random.default_rng(1234))
            g = host.on(cp)
            distinct = distinct_ids(host.inp)
            out = cp.empty((B, T, C), dtype=enc.bfloat16)
            with stream:
                # ---------------- forward: bits, then times
                ref = cp.empty_like(out)
                n2 = B * T * C // 8
                loader.launch(old_fwd, ceil_div(n2, BLOCK_SIZE), BLOCK_SIZE,
                              (ref, g.inp, g.wte, g.wpe, np.int32(B), np.int32(T), np.int32(C)))
                for v in (1, 2, 3):
                    out.fill(0)
                    cuda.encoder_forward_version(v, out, g.inp, g.wte, g.wpe, B, T, C)
                    same = bool((out.view(cp.uint16) == ref.view(cp.uint16)).all())
                    check(same, f"B={B} {kind} forward v{v} == old")
                for v in (1, 2, 3):
                    record(B, kind, f"forward v{v}", t_us(lambda v=v: cuda.encoder_forward_version(
                        v, out, g.inp, g.wte, g.wpe, B, T, C)), "forward", distinct)
                for (rows, cs), kern in fwd_variants.items():
                    grid = ceil_div(ceil_div(B, rows) * T * C // 8, BLOCK_SIZE)
                    label = f"forward v3 rows={rows} cs={int(cs)}"
                    record(B, kind, label, t_us(lambda kern=kern, grid=grid: loader.launch(
                        kern, grid, BLOCK_SIZE, (out, g.inp, g.wte, g.wpe, np.int32(B), np.int32(T), np.int32(C)))),
                        "forward", distinct)

                record(B, kind, "out.fill (writes only)", t_us(lambda: out.fill(1)))

                # ---------------- bucket table: bits, dispatch, phases, grid sizes
                table_np = buckets.build_bucket_table(host.inp, C, enc.bfloat16)
                dev = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)
                got = dev.to_host()
                same = (np.array_equal(got.info, table_np.info) and np.array_equal(got.bt_list, table_np.bt_list)
                        and np.array_equal(got.units, table_np.units))
                check(same, f"B={B} {kind} GPU table == NumPy table (small={gpu_buckets.uses_small_kernel(B * T, V)})")
                record(B, kind, "gpu table (dispatch)", t_us(lambda: gpu_buckets.build_bucket_table_gpu(
                    g.inp, C, enc.bfloat16, V)))
                phases = gpu_buckets.phase_times_us(g.inp, C, enc.bfloat16, V)
                print(f"B={B} {kind} phases: " + ", ".join(
                    f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in phases.items()), flush=True)
                RESULTS.append({"B": B, "ids": kind, "name": "phases", "phases": phases})
                if B <= 8:
                    gpu_buckets.SMALL_MAX_BT = 0  # force the cooperative kernel
                    got = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V).to_host()
                    check(np.array_equal(got.bt_list, table_np.bt_list), f"B={B} {kind} cooperative table (forced)")
                    record(B, kind, "cooperative table (forced)", t_us(lambda: gpu_buckets.build_bucket_table_gpu(
                        g.inp, C, enc.bfloat16, V)))
                    record(B, kind, "backward chunked e2e, cooperative table", t_us(lambda: enc.encoder_backward(
                        g.dwte, g.dwpe, g.dout, g.inp, seed=5, method="chunked", bucketing="gpu", check_ids=False)),
                        "backward", distinct)
                    gpu_buckets.SMALL_MAX_BT = 8192
                if B > 8:
                    saved = gpu_buckets.COOPERATIVE_MAX_BLOCKS
                    for blocks in (8, 16, 32, 66, 132):
                        gpu_buckets.COOPERATIVE_MAX_BLOCKS = blocks
                        gpu_buckets.release_workspaces()
                        dev = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)
                        got = dev.to_host()
                        check(np.array_equal(got.bt_list, table_np.bt_list) and np.array_equal(got.info, table_np.info),
                              f"B={B} {kind} cooperative grid {blocks} table")
                        record(B, kind, f"cooperative table, {blocks} blocks", t_us(
                            lambda: gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)))
                        record(B, kind, f"backward chunked e2e, {blocks} blocks", t_us(lambda: enc.encoder_backward(
                            g.dwte, g.dwpe, g.dout, g.inp, seed=5, method="chunked", bucketing="gpu",
                            check_ids=False)), "backward", distinct)
                    gpu_buckets.COOPERATIVE_MAX_BLOCKS = saved
                    gpu_buckets.release_workspaces()
                old_grid = min(132, ceil_div(max(V, B * T), 1024))
                n, i32 = max(V, B * T), np.int32
                old_args = (g.inp, i32(B * T), i32(V), i32(3), cp.empty(V, i32), cp.empty(B * T + 1, i32),
                            cp.empty(n, np.uint32), cp.empty(n, i32), cp.empty(n, np.uint32), cp.empty(n, i32),
                            cp.empty(256 * old_grid, i32), cp.empty(V, i32), cp.empty(V, i32), cp.empty(V, i32),
                            cp.zeros((min(V, B * T) * 3, 4), i32), cp.zeros((gpu_buckets.unit_rows(
                                gpu_buckets.max_units(B * T, V)), 4), i32), cp.empty(B * T, i32), cp.zeros(8, i32))
                record(B, kind, f"old cooperative table, {old_grid} blocks", t_us(lambda: loader.launch(
                    old_coop, old_grid, 1024, old_args)))

                # ---------------- wte kernels, table ready: bits old vs new vs mirror, times
                dev_table = gpu_buckets.to_device(table_np)
                seed = 77
                results = {}
                dwte_start = g.dwte.get()  # the calls above updated g.dwte: the mirror starts from what is there
                for name, fn in (
                    ("bucketed new", lambda d: cuda.encoder_backward_wte_bucketed(d, dev_table, g.dout, C, seed)),
                    ("bucketed old", lambda d: loader.launch(old_bucketed, dev_table.max_buckets, 256, (
                        d, dev_table.info, dev_table.bt_list, g.dout, dev_table.num_buckets_device, np.int32(C),
                        np.uint32(seed)))),
                    ("chunked new", lambda d: cuda.encoder_backward_wte_chunked(d, dev_table, g.dout, C, seed)),
                ):
                    d = g.dwte.copy()
                    fn(d)
                    results[name] = d
                old_ch = _chunked_with(old_chunk_mod, cuda, gpu_buckets, dev_table, g, C, seed, B * T)
                results["chunked old"] = old_ch
                for vname, kern in bucketed_variants.items():
                    d = g.dwte.copy()
                    loader.launch(kern, dev_table.max_buckets, 256, (
                        d, dev_table.info, dev_table.bt_list, g.dout, dev_table.num_buckets_device, np.int32(C),
                        np.uint32(seed)))
                    results[f"bucketed {vname}"] = d
                for (groups, unroll, mb), mod in chunk_variants.items():
                    results[f"chunked {groups}/{unroll}/{mb}"] = _chunked_with(mod, cuda, gpu_buckets, dev_table, g, C,
                                                                               seed, B * T)
                eq = lambda a, b: bool((a.view(cp.uint16) == b.view(cp.uint16)).all())  # noqa: E731
                for name in results:
                    if name.startswith("bucketed") and name != "bucketed old":
                        check(eq(results[name], results["bucketed old"]), f"B={B} {kind} {name} == bucketed old")
                for name in results:
                    if name.startswith("chunked") and name != "chunked old":
                        check(eq(results[name], results["chunked old"]), f"B={B} {kind} {name} == chunked old")
                if B <= 8:
                    m = dwte_start.copy()
                    mirror.encoder_backward_wte_bucketed(m, table_np, host.dout, C, seed)
                    check(np.array_equal(m.view(np.uint16), results["bucketed new"].get().view(np.uint16)),
                          f"B={B} {kind} bucketed == mirror")
                record(B, kind, "wte bucketed new", t_us(lambda: cuda.encoder_backward_wte_bucketed(
                    g.dwte, dev_table, g.dout, C, seed)), "backward_wte", distinct)
                record(B, kind, "wte bucketed old", t_us(lambda: loader.launch(
                    old_bucketed, dev_table.max_buckets, 256, (
                    g.dwte, dev_table.info, dev_table.bt_list, g.dout, dev_table.num_buckets_device, np.int32(C),
                    np.uint32(seed)))), "backward_wte", distinct)
                for vname, kern in bucketed_variants.items():
                    record(B, kind, f"wte bucketed {vname}", t_us(lambda kern=kern: loader.launch(
                        kern, dev_table.max_buckets, 256, (g.dwte, dev_table.info, dev_table.bt_list, g.dout,
                                                           dev_table.num_buckets_device, np.int32(C),
                                                           np.uint32(seed)))), "backward_wte", distinct)
                record(B, kind, "wte chunked new", t_us(lambda: cuda.encoder_backward_wte_chunked(
                    g.dwte, dev_table, g.dout, C, seed)), "backward_wte", distinct)
                record(B, kind, "wte chunked old", t_us(lambda: _chunked_with(
                    old_chunk_mod, cuda, gpu_buckets, dev_table, g, C, seed, B * T, inplace=True)), "backward_wte",
                    distinct)
                for key, mod in chunk_variants.items():
                    record(B, kind, "wte chunked %d/%d/%d" % key, t_us(lambda mod=mod: _chunked_with(
                        mod, cuda, gpu_buckets, dev_table, g, C, seed, B * T, inplace=True)), "backward_wte", distinct)
                record(B, kind, "wpe kernel", t_us(lambda: cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C, seed)),
                       "backward_wpe", distinct)

                # ---------------- end to end
                for method in ("chunked", "bucketed"):
                    record(B, kind, f"backward {method} gpu e2e", t_us(lambda method=method: enc.encoder_backward(
                        g.dwte, g.dwpe, g.dout, g.inp, seed=5, method=method, bucketing="gpu", check_ids=False)),
                        "backward", distinct)

                # ---------------- atomic fp32: bits sanity, times, torch
                d_new, p_new = g.dwte.copy(), g.dwpe.copy()
                cuda.encoder_backward_atomic(d_new, p_new, g.dout, g.inp, B, T, C, bf16_atomics=False)
                d32, p32 = g.dwte.astype(cp.float32), g.dwpe.astype(cp.float32)
                kern = loader.get_kernel("encoder_backward_atomic.cu", "encoder_backward_atomic_fp32_kernel",
                                         enc.bfloat16)

                def old_atomic():
                    a32, b32 = g.dwte.astype(cp.float32), g.dwpe.astype(cp.float32)
                    loader.launch(kern, ceil_div(B * T * C // 8, BLOCK_SIZE), BLOCK_SIZE,
                                  (a32, b32, g.dout, g.inp, np.int32(B), np.int32(T), np.int32(C)))
                    return a32.astype(g.dwte.dtype), b32.astype(g.dwpe.dtype)

                d_old, p_old = old_atomic()
                diff = float(cp.abs(d_new.astype(cp.float32) - d_old.astype(cp.float32)).max())
                scale = float(cp.abs(d_old.astype(cp.float32)).max())
                untouched = cp.ones(V, dtype=bool)
                untouched[g.inp.ravel()] = False
                check(bool((d_new.view(cp.uint16)[untouched] == g.dwte.view(cp.uint16)[untouched]).all()),
                      f"B={B} {kind} atomic: untouched rows unchanged")
                check(diff <= 0.02 * scale, f"B={B} {kind} atomic new vs old: max diff {diff:.3g} (scale {scale:.3g})")
                record(B, kind, "atomic fp32 new", t_us(lambda: cuda.encoder_backward_atomic(
                    g.dwte, g.dwpe, g.dout, g.inp, B, T, C, bf16_atomics=False)), "backward", distinct)
                record(B, kind, "atomic fp32 old (full copies)", t_us(old_atomic), "backward", distinct)
                record(B, kind, "atomic fp32 kernel alone", t_us(lambda: loader.launch(
                    kern, ceil_div(B * T * C // 8, BLOCK_SIZE), BLOCK_SIZE,
                    (d32, p32, g.dout, g.inp, np.int32(B), np.int32(T), np.int32(C)))), "backward", distinct)
            if has_torch:
                ts = torch.cuda.Stream()
                ids = torch.from_dlpack(g.inp).reshape(-1).long()
                dout32 = torch.from_dlpack(g.dout.astype(cp.float32)).reshape(B * T, C)
                dw32 = torch.zeros((V, C), device="cuda", dtype=torch.float32)
                dp32 = torch.zeros((T, C), device="cuda", dtype=torch.float32)
                tstream = cp.cuda.ExternalStream(ts.cuda_stream)

                def torch_index_add():
                    with torch.cuda.stream(ts):
                        dw32.index_add_(0, ids, dout32)
                        dp32.add_(dout32.view(B, T, C).sum(0))

                def torch_index_add_only():
                    with torch.cuda.stream(ts):
                        dw32.index_add_(0, ids, dout32)

                for name, fn in (("torch index_add_ fp32 + dwpe sum", torch_index_add),
                                 ("torch index_add_ fp32 only", torch_index_add_only)):
                    fn()
                    samples, _ = timer.time(fn, tstream, warmup=3, repeats=args.repeats)
                    record(B, kind, name, float(np.median(samples)) * 1e6, "backward", distinct)
            g = out = None  # free the arrays before the next configuration
            cp.get_default_memory_pool().free_all_blocks()

    Path(args.out, "probe.json").write_text(json.dumps(RESULTS, indent=1))
    print(f"{len(FAILURES)} failures" + (": " + "; ".join(FAILURES) if FAILURES else ""))
    return 1 if FAILURES else 0


_PARTIALS: dict = {}


def _chunked_with(mod, cuda, gpu_buckets, table, g, C, seed, BT, inplace=False):
    """Run a chunked kernel pair from module ``mod`` like cuda.encoder_backward_wte_chunked does."""
    from gpt2enc_edu import loader
    from gpt2enc_edu.layout import WARP_SIZE, c_per_group, num_c_groups

    d = g.dwte if inplace else g.dwte.copy()
    key = (BT, C)
    if key not in _PARTIALS:
        import cupy as cp

        _PARTIALS[key] = cp.empty(gpu_buckets.max_multi_chunk_units(BT) * num_c_groups(C, d.dtype)
                                  * c_per_group(d.dtype), dtype=np.float32)
    partials = _PARTIALS[key]
    loader.launch(mod.get_function("encoder_backward_wte_chunked_kernel"), ceil_div(table.max_units, 8), WARP_SIZE * 8,
                  (d, table.units, table.bt_list, g.dout, partials, table.num_units_device, np.int32(C),
                   np.uint32(seed)))
    loader.launch(mod.get_function("encoder_backward_wte_chunk_combine_kernel"),
                  min(table.max_units, gpu_buckets.max_multi_chunk_units(BT)), 128,
                  (d, table.units, partials, table.num_units_device, np.int32(C), np.uint32(seed)))
    return d


if __name__ == "__main__":
    sys.exit(main())
