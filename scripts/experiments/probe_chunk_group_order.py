"""Experiment: a chunk kernel's channel groups side by side (run on an H100; the result: docs/experiments.md).

The package launches the chunk kernel on a grid (unit blocks, channel groups), so at B=64 the blocks of group 0 run
first, then those of group 1, then group 2: the three 512-byte pieces of a dout row and of a dwte row are read some
20 us apart. ``chunk_groups_side_by_side.cu`` is the same kernel on the grid with its two dimensions swapped, so
that a unit block's groups start together (same warps, same work, same bits; only the order in which blocks start
changes). At B=64 on uniform ids the chunk kernel is the largest part of the chunked backward, and the furthest from
its floor of the backward's kernels (docs/performance.md, wte kernels). This probe asks whether the order matters:

1. **Bits.** The chunk and combine kernels with the swapped launch against the package's, dwte bit for bit, on tables
   built on the GPU: bf16 and fp32, B*T from 37 to 65,536, C from 40 (one partial group) to 1600, the three id kinds,
   and 1,024 ids over a vocabulary of 7 (tokens of about five chunks). Then the whole chunked backward with the swap
   in place against the package's call (dwte and dwpe). A mismatch stops the probe before any timing (exit 1).
2. **Alone**: the bench's case "wte kernel alone, chunked (table ready)" at B = 8, 32, 64 and the three id kinds,
   the package's launch and the swapped one in turn, two rounds (``GpuTimer``: L2 flushed, CUDA events, median).
3. **In the call**: the chunked backward with the table in the call and with it built ahead, the same way.

Run it on the GPU machine from the repository root (about a minute):

    PYTHONPATH=$PWD timeout 300 python3 scripts/experiments/probe_chunk_group_order.py --out /tmp/chunk_probe

It prints one line per measurement and writes ``probe.json`` into ``--out``. If the swapped order wins, the change
in the package is the grid of ``cuda._chunk_grid`` and the two index reads at the top of the chunk kernel (with its
GPU tests, sanitizer cases and a bench run); the mirror would not change.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from probe_common import ProbeRecord, bench_session, compare_in_calls, probe_arguments, replaced, same_bits

import gpt2enc_edu.cuda as package_cuda
from gpt2enc_edu.encoder import make_buckets
from gpt2enc_edu.layout import CHUNKED_WARPS_PER_BLOCK, WARP_SIZE, c_per_group
from gpt2enc_edu.loader import compile_options, cupy_module, launch
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16, float32

SOURCE = Path(__file__).with_name("chunk_groups_side_by_side.cu")
#: (B, T, C, V, dtype, ids) of the bits check.
BITS_SHAPES = ((1, 37, 768, 50257, bfloat16, "zipf"), (8, 1024, 768, 50257, bfloat16, "uniform"),
               (64, 1024, 768, 50257, bfloat16, "uniform"), (64, 1024, 768, 50257, bfloat16, "real"),
               (64, 1024, 768, 50257, bfloat16, "zipf"), (4, 64, 1600, 1000, bfloat16, "zipf"),
               (8, 1024, 40, 50257, bfloat16, "uniform"), (3, 37, 24, 50, float32, "uniform"),
               (16, 1024, 768, 50257, float32, "real"), (4, 256, 768, 7, bfloat16, "uniform"))

_compiled: dict = {}


def _kernel(dtype):
    """The package's chunk kernel (register form) compiled from the swapped-index file, for storage ``dtype``."""
    key = np.dtype(dtype).name
    if key not in _compiled:
        module = cupy_module().RawModule(code=SOURCE.read_text(), options=compile_options(dtype))
        _compiled[key] = module.get_function("encoder_backward_wte_chunked_kernel")
    return _compiled[key]


def launch_side_by_side(dwte, table, dout, C: int, seed: int, walk=None):
    """A stand-in for ``cuda._launch_chunk_kernel``: the same kernel, arguments and partials, on the grid (groups,
    unit blocks). ``walk`` is ignored: always the register form (the package's choice at B >= 4 on an H200)."""
    unit_blocks, groups = package_cuda._chunk_grid(table.max_units, C, dout.dtype)
    partials = package_cuda._chunk_partials(table.num_positions, groups * c_per_group(dout.dtype))
    launch(_kernel(dout.dtype), (groups, unit_blocks), WARP_SIZE * CHUNKED_WARPS_PER_BLOCK,
           (dwte, table.units, table.bt_list, dout, partials, table.num_units_device, np.int32(C), np.uint32(seed)),
           after_kernel=True)
    return partials


def swap():
    return replaced(package_cuda, "_launch_chunk_kernel", launch_side_by_side)


def check_bits(rng) -> list[str]:
    """The chunked wte kernels with the swapped launch against the package's (register form), on GPU-built tables."""
    cp = cupy_module()
    failures = []
    for B, T, C, V, dtype, ids in BITS_SHAPES:
        p = random_problem(B, T, C, V, dtype=dtype, ids=ids, rng=rng).on(cp)
        table = make_buckets(p.inp, C, dtype, V=V)
        results = []
        for context in (nullcontext, swap):
            with context():
                dwte = p.dwte.copy()
                package_cuda.encoder_backward_wte_chunked(dwte, table, p.dout, C, 11, walk="registers")
                results.append(dwte)
        if not same_bits(*results):
            failures.append(f"{np.dtype(dtype).name} B={B} T={T} C={C} V={V} {ids}")
    cp.cuda.runtime.deviceSynchronize()
    return failures


def main(argv=None) -> int:
    args = probe_arguments(__doc__, "probe_chunk_group_order", argv)
    record = ProbeRecord(args.out)
    if not record.bits(check_bits(np.random.default_rng(2))):
        return 1
    cases = ("wte_chunked_kernel", "chunked_gpu", "chunked_ahead")
    s, config = bench_session((8, 32, 64), cases, args.repeats)
    record.data["copy_rate_GBps"] = s.copy_rate / 1e9
    print(f"copy rate {s.copy_rate / 1e9:.0f} GB/s", flush=True)
    if not compare_in_calls(s, config, record, [("package", None), ("groups side by side", swap)], cases):
        return 1
    print(f"written {record.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
