"""Kernel-level timings at one batch size (GPU only): each piece of the deterministic backward alone.

The benchmark (`python -m gpt2enc_edu.bench`) times whole public calls; this probe times the pieces the
closing numbers in docs/benchmarks.md were split into: the wpe kernel, the GPU bucket table, the chunked wte
kernel with a ready table, and the whole chunked backward. Back-to-back launches between two CUDA events
(so launch overhead overlaps GPU work), no L2 flush: for orientation, not for the committed tables.

    python scripts/probe_kernels.py [B]        # default B=64, T=1024, C=768, V=50257, bf16
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's package, also when run as scripts/probe_kernels.py

import numpy as np  # noqa: E402

import gpt2enc_edu as enc  # noqa: E402
from gpt2enc_edu.problems import random_problem  # noqa: E402


def main(argv: list[str]) -> int:
    status = enc.gpu_status()
    if status.name != "cuda":
        print(f"No GPU: {status.reason}. Nothing to probe.")
        return 0
    import cupy as cp

    from gpt2enc_edu import cuda, gpu_buckets

    B, T, C, V = (int(argv[0]) if argv else 64), 1024, 768, 50257

    def per_call_us(fn, n=30):
        for _ in range(3):
            fn()
        cp.cuda.Device().synchronize()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(n):
            fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) * 1000 / n

    for ids in ("uniform", "zipf"):
        g = random_problem(B, T, C, V, T, ids=ids, rng=np.random.default_rng(0)).on(cp)
        out = cp.empty((B, T, C), dtype=enc.bfloat16)
        table = gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)
        results = {
            "forward kernel": per_call_us(lambda: cuda.encoder_forward(out, g.inp, g.wte, g.wpe, B, T, C)),
            "wpe kernel": per_call_us(lambda: cuda.encoder_backward_wpe(g.dwpe, g.dout, B, T, C, 1)),
            "GPU bucket table": per_call_us(lambda: gpu_buckets.build_bucket_table_gpu(g.inp, C, enc.bfloat16, V)),
            "chunked wte (table ready)": per_call_us(lambda: cuda.encoder_backward_wte_chunked(g.dwte, table, g.dout, C, 1)),
            "chunked backward, end to end": per_call_us(lambda: enc.encoder_backward(
                g.dwte, g.dwpe, g.dout, g.inp, seed=1, method="chunked", bucketing="gpu", check_ids=False)),
        }
        print(f"B={B} {ids}: " + " | ".join(f"{k}: {v:.1f} us" for k, v in results.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
