"""A short demonstration: every kernel on whatever backend is present, each result checked.

    python -m gpt2enc_edu.demo            # the active backend (CUDA if CuPy sees a GPU, else the NumPy mirror)
    GPT2ENC_BACKEND=numpy python -m gpt2enc_edu.demo

On a GPU it also runs the NumPy mirror on the same numbers and says whether the bits agree.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from . import compare, reference
from .backend import array_module, gpu_status, last_backend
from .encoder import encoder_backward, encoder_forward, make_buckets
from .problems import random_problem
from .rounding import bfloat16

DETERMINISTIC = ("bucketed", "chunked")


def _line(ok: bool, what: str) -> bool:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    return ok


def run_demo(B: int = 4, T: int = 64, C: int = 768, V: int = 50257, ids: str = "real", seed: int = 0) -> bool:
    """Run forward and every backward method in bf16 and fp32; return True if every check passed."""
    xp = array_module()
    print(f"backend: {gpu_status()}")
    print(f"problem: B={B} T={T} C={C} V={V}, {ids} token ids, seed {seed}")
    rng = np.random.default_rng(seed)
    all_ok = True
    for dtype in (bfloat16, np.float32):
        name = np.dtype(dtype).name
        print(f"{name}:")
        p = random_problem(B, T, C, V, T, dtype=dtype, ids=ids, rng=rng)
        on = p.on(xp)
        out = encoder_forward(on.inp, on.wte, on.wpe)
        ref = reference.forward(p.inp, p.wte, p.wpe)
        magnitude = np.abs(p.wte.astype(np.float64))[p.inp] + np.abs(p.wpe.astype(np.float64))[None, :T]
        all_ok &= _line(compare.within_bound(out, ref, compare.error_bound(dtype, magnitude, 1)),
                        f"forward on {last_backend().name} within one {name} rounding of the float64 reference")
        if xp is not np:
            all_ok &= _line(compare.bitwise_equal(out, encoder_forward(p.inp, p.wte, p.wpe)),
                            "forward: GPU bits == NumPy mirror bits")
        grads = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
        methods = DETERMINISTIC + ("atomic",) + (("atomic_bf16",) if name == "bfloat16" else ())
        for method in methods:
            g = p.on(xp)
            encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed + 1, method=method)
            per_add = method == "atomic_bf16"
            ok = compare.within_bound(g.dwte, grads.dwte, compare.error_bound(dtype, grads.dwte_abs, grads.max_terms,
                                                                            rounding_per_add=per_add))
            ok &= compare.within_bound(g.dwpe, grads.dwpe, compare.error_bound(dtype, grads.dwpe_abs, grads.max_terms,
                                                                             rounding_per_add=per_add))
            all_ok &= _line(ok, f"backward method={method!r}: dwte and dwpe within bound of the float64 reference")
            if method in DETERMINISTIC:
                again = p.on(xp)
                encoder_backward(again.dwte, again.dwpe, again.dout, again.inp, seed=seed + 1, method=method)
                all_ok &= _line(compare.bitwise_equal(g.dwte, again.dwte) and compare.bitwise_equal(g.dwpe, again.dwpe),
                                f"backward method={method!r}: two runs bitwise equal")
                if xp is not np:
                    cpu = p.on(np)
                    encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=seed + 1, method=method)
                    all_ok &= _line(compare.bitwise_equal(g.dwte, cpu.dwte) and compare.bitwise_equal(g.dwpe, cpu.dwpe),
                                    f"backward method={method!r}: GPU bits == NumPy mirror bits")
        table = make_buckets(p.inp, C, dtype)
        print(f"  bucket table: {table.num_buckets} buckets, {table.num_units} chunk units, "
              f"largest bucket {int(table.sizes.max())} positions")
    print("all checks passed" if all_ok else "SOME CHECKS FAILED")
    return all_ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--T", type=int, default=64)
    parser.add_argument("--C", type=int, default=768)
    parser.add_argument("--ids", choices=("uniform", "zipf", "real"), default="real")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return 0 if run_demo(args.B, args.T, args.C, ids=args.ids, seed=args.seed) else 1


if __name__ == "__main__":
    sys.exit(main())
