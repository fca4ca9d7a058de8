"""Experiment: can the wpe kernel read dout faster per SM? (Run on an H100; the result: docs/experiments.md.)

Beside the bucket table built in the call, the package's wpe kernel runs on 3/8 of the SMs (49 of an H200's 132,
``layout.WPE_SM_SHARE_BESIDE_TABLE``) and alone there took 40.9 us at B=64 against 32.5 on its full grid: about
50 GB/s per SM. Without the wpe kernel the chunked backward at B=64 on uniform ids took 91.0 us, with it 103-104
(H200, 2026-12-04; docs/experiments.md, wpe kernel). This probe times the two forms of ``wpe_bulk_copy.cu`` (the copy
engine's bulk copies, and per-thread cp.async pipelines) against the package's kernel:

1. **Bits.** Every form and grid against the package's kernel on the same dout and dwpe (bf16 and fp32; B*T*C from
   8 to 64x1024x768; grids of 1, 3, 49 and a block per tile). A mismatch stops the probe before any timing (exit 1).
2. **Alone** (uniform ids: the kernel does not read them), B = 8 and 64: each form on its full grid, on 49 blocks
   and on one block per SM, with the bench's ``GpuTimer`` (L2 flushed, CUDA events, median).
3. **In the call**: the chunked backward (``encoder_backward(method="chunked", bucketing="gpu")``) and the same with
   the table built ahead, at B = 8, 32, 64 and the three id kinds, with ``gpt2enc_edu.cuda.encoder_backward_wpe``
   replaced by each form (beside the table built in the call on 49 blocks, on one block per SM, or on its full
   grid), two interleaved rounds. Every replaced call's dwte and dwpe are first checked against the package's call.

Run it on the GPU machine from the repository root (about two minutes; ``timeout`` guards against a form that
hangs, which would be a bug in its barriers):

    timeout 400 python3 scripts/experiments/probe_wpe_bulk_copy.py --out /tmp/wpe_probe

It prints one line per measurement and writes ``probe.json`` into ``--out``. Nothing in the package uses these
kernels; if a form wins, it would move into ``kernels/encoder_backward_wpe.cu`` as a second form with its tests,
the sanitizers and the bench, as the chunk kernel's staged form did.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from probe_common import (
    ProbeRecord,
    bench_session,
    compare_in_calls,
    interleaved_times,
    probe_arguments,
    replaced,
    same_bits,
)

import gpt2enc_edu.cuda as package_cuda
from gpt2enc_edu.layout import ceil_div, pack_size, wpe_blocks_beside_table
from gpt2enc_edu.loader import compile_options, cupy_module, device_facts, launch
from gpt2enc_edu.rounding import bfloat16, float32

SOURCE = Path(__file__).with_name("wpe_bulk_copy.cu")
PACKAGE_WPE = package_cuda.encoder_backward_wpe
#: (kernel, threads, stages, evict_first): the forms timed. Threads are the consumers (the bulk form adds a warp).
FORMS = (("bulk", 256, 16, 1), ("bulk", 256, 32, 1), ("bulk", 512, 16, 1), ("bulk", 256, 16, 0),
         ("cpasync", 1024, 8, 1), ("cpasync", 512, 16, 1))
#: The forms also tried inside the backward call (the others only alone and in the bits check).
CALL_FORMS = (("bulk", 256, 16, 1), ("bulk", 512, 16, 1), ("cpasync", 1024, 8, 1))
BITS_SHAPES = ((1, 1024, 768), (8, 1024, 768), (64, 1024, 768), (3, 5, 8), (7, 37, 24), (2, 1, 8), (13, 100, 1600))

_compiled: dict = {}


def runnable(forms) -> list:
    """The forms this GPU can run: the bulk form needs sm_90 (its body is empty below), the cp.async form sm_80."""
    cc = device_facts().compute_capability
    return [f for f in forms if cc >= (90 if f[0] == "bulk" else 80)]


def form_name(form) -> str:
    kernel, threads, stages, evict_first = form
    return f"{kernel}{threads}x{stages}" + ("" if evict_first else "-noevict")


def _kernel(form, dtype):
    """The compiled kernel of one form for storage ``dtype``, with its dynamic shared memory allowed."""
    cp = cupy_module()
    key = (form, np.dtype(dtype).name)
    if key not in _compiled:
        kernel, threads, stages, evict_first = form
        prefix = "BULK" if kernel == "bulk" else "CPASYNC"
        options = compile_options(dtype) + (f"-D{prefix}_THREADS={threads}", f"-D{prefix}_STAGES={stages}",
                                            f"-DBULK_EVICT_FIRST={evict_first}")
        module = cp.RawModule(code=SOURCE.read_text(), options=options)
        function = module.get_function(f"wpe_{kernel}_kernel")
        function.max_dynamic_shared_size_bytes = stages * threads * 16
        _compiled[key] = function
    return _compiled[key]


def full_grid(form, T: int, C: int, dtype) -> int:
    """A block per tile (bulk) or per CPASYNC_THREADS packs (cp.async): every pack in one pass."""
    return ceil_div(T * C // pack_size(dtype), form[1])


def launch_form(form, dwpe, dout, B: int, T: int, C: int, seed: int, grid: int) -> None:
    kernel, threads, stages, _ = form
    block = threads + 32 if kernel == "bulk" else threads
    launch(_kernel(form, dout.dtype), grid, block,
           (dwpe, dout, np.int32(B), np.int32(T), np.int32(C), np.uint32(seed)), shared_mem=stages * threads * 16)


def replacement(form, beside_table: str):
    """A stand-in for ``cuda.encoder_backward_wpe``: the full grid where the package passes no ``blocks``; beside the
    table (``blocks`` given) the package's 49 blocks ("given"), a block per SM ("sm") or the full grid ("full")."""
    def wpe(dwpe, dout, B, T, C, seed, *, blocks=None):
        grid = full_grid(form, T, C, dout.dtype)
        if blocks is not None:
            grid = min(grid, {"given": blocks, "sm": device_facts().sm_count, "full": grid}[beside_table])
        launch_form(form, dwpe, dout, B, T, C, seed, grid)
    return wpe


def check_bits(rng) -> list[str]:
    """Every form, dtype, shape and grid against the package's kernel; the failures' descriptions."""
    cp = cupy_module()
    failures = []
    for dtype in (bfloat16, float32):
        for B, T, C in BITS_SHAPES:
            dout = cp.asarray(rng.standard_normal((B, T, C)).astype(np.float32).astype(dtype))
            dwpe_before = cp.asarray(rng.standard_normal((T + 3, C)).astype(np.float32).astype(dtype))
            expected = dwpe_before.copy()
            PACKAGE_WPE(expected, dout, B, T, C, 77)
            for form in runnable(FORMS):
                for grid in sorted({1, 3, 49, full_grid(form, T, C, dtype)}):
                    got = dwpe_before.copy()
                    launch_form(form, got, dout, B, T, C, 77, grid)
                    if not same_bits(got, expected):
                        failures.append(f"{form_name(form)} {np.dtype(dtype).name} B={B} T={T} C={C} grid={grid}")
    cp.cuda.runtime.deviceSynchronize()
    return failures


def swap_in(form, beside_table: str):
    """A swap for ``probe_common``: the form in place of the package's wpe kernel."""
    return lambda: replaced(package_cuda, "encoder_backward_wpe", replacement(form, beside_table))


def main(argv=None) -> int:
    args = probe_arguments(__doc__, "probe_wpe_bulk_copy", argv)
    from gpt2enc_edu.bench.run import make_workload

    record = ProbeRecord(args.out, forms=[form_name(f) for f in runnable(FORMS)], alone=[])
    skipped = [form_name(f) for f in FORMS if f not in runnable(FORMS)]
    if skipped:
        print(f"skipped on compute capability {device_facts().compute_capability}: {', '.join(skipped)}")
    # 1. Bits, before any timing.
    if not record.bits(check_bits(np.random.default_rng(1))):
        return 1

    s, config = bench_session((8, 32, 64), ("wpe_kernel", "chunked_gpu", "chunked_ahead"), args.repeats)
    sms = device_facts().sm_count
    narrow = wpe_blocks_beside_table(sms)
    record.data["copy_rate_GBps"] = s.copy_rate / 1e9
    print(f"copy rate {s.copy_rate / 1e9:.0f} GB/s, {sms} SMs, beside the table {narrow} blocks", flush=True)

    # 2. Alone: the bench's wpe case (it calls cuda.encoder_backward_wpe without blocks) with a fixed grid swapped in.
    for B in (8, 64):
        w = make_workload(s, config, "uniform", B)
        runs = [("package", grid, None) for grid in (None, narrow, sms)]
        runs += [(form_name(f), grid, f) for f in runnable(FORMS) for grid in (None, narrow, sms)]
        for label, grid, form in runs:
            def fixed_grid(dwpe, dout, B_, T, C, seed, *, blocks=None, grid=grid, form=form):
                if form is None:
                    PACKAGE_WPE(dwpe, dout, B_, T, C, seed, blocks=grid)
                else:
                    launch_form(form, dwpe, dout, B_, T, C, seed, grid or full_grid(form, T, C, dout.dtype))
            times = interleaved_times(s, config, "wpe_kernel", w, [
                (label, lambda fn=fixed_grid: replaced(package_cuda, "encoder_backward_wpe", fn))], rounds=1)
            us = times[label][0]
            blocks = grid or (full_grid(form, w.T, w.C, w.dout.dtype) if form else
                              ceil_div(w.T * w.C // pack_size(w.dout.dtype), package_cuda.WPE_BLOCK_SIZE))
            gbps = w.dout.nbytes / (us * 1e-6) / 1e9
            record.data["alone"].append(dict(B=B, form=label, blocks=blocks, us=us))
            print(f"alone B={B:<3d} {label:22s} {blocks:4d} blocks: {us:6.1f} us, {gbps:5.0f} GB/s of dout "
                  f"({gbps / min(blocks, sms):5.1f} per SM it holds)", flush=True)
    record.save()

    # 3. In the call: each variant's bits against the package's call first, then two interleaved rounds.
    variants = [("package", None)]
    variants += [(f"{form_name(f)} beside={where}", swap_in(f, where)) for f in runnable(CALL_FORMS)
                 for where in ("given", "sm", "full")]
    if not compare_in_calls(s, config, record, variants, ("chunked_gpu", "chunked_ahead")):
        return 1
    print(f"written {record.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
