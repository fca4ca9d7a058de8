"""A short demonstration: every kernel on whatever backend is present, each result checked.

    python -m gpt2enc_edu.demo            # the active backend (CUDA if CuPy sees a GPU, else the NumPy mirror)
    GPT2ENC_BACKEND=numpy python -m gpt2enc_edu.demo

On a GPU it also runs the NumPy mirror on the same numbers and says whether the bits agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

from . import compare, reference
from .backend import array_module, gpu_status, last_backend, to_numpy
from .encoder import encoder_backward, encoder_forward, make_buckets
from .methods import METHODS
from .problems import random_problem
from .rounding import bfloat16


def _line(ok: bool, what: str) -> bool:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    return ok


def _same_bits(a, b, where=None) -> bool:
    """Bitwise equality without ``compare.bitwise_equal``'s float64 NaN test (the inputs hold no NaN), so
    that comparing two (V, C) tables costs a boolean array, not two float64 copies."""
    a, b = to_numpy(a), to_numpy(b)
    bits = np.uint16 if a.dtype.itemsize == 2 else np.uint32
    same = a.view(bits) == b.view(bits)
    return bool((same if where is None else same[where]).all())


def _rows_reference(p, rows: np.ndarray) -> reference.Gradients:
    """The float64 reference on the touched dwte rows only (the full (V, C) table in float64 is 300 MB)."""
    compact = np.searchsorted(rows, p.inp).astype(np.int32)
    return reference.backward(p.dwte[rows], p.dwpe, p.dout, compact)


def run_demo(B: int = 4, T: int = 64, C: int = 768, V: int = 50257, ids: str = "real", seed: int = 0) -> bool:
    """Run forward and every backward method in bf16 and fp32; return True if every check passed.

    Only the dwte rows the batch touches are compared with the float64 reference; the other rows must keep
    their bits. That keeps the demo under 1 GB of memory with GPT-2's full vocabulary.
    """
    xp = array_module()
    print(f"backend: {gpu_status()}")
    print(f"problem: B={B} T={T} C={C} V={V}, {ids} token ids, seed {seed}")
    rng = np.random.default_rng(seed)
    all_ok = True
    for dtype in (bfloat16, np.float32):
        name = np.dtype(dtype).name
        print(f"{name}:")
        p = random_problem(B, T, C, V, T, dtype=dtype, ids=ids, rng=rng)
        inp, dout, wte, wpe = (xp.asarray(a) for a in (p.inp, p.dout, p.wte, p.wpe))
        out = encoder_forward(inp, wte, wpe)
        ref = reference.forward(p.inp, p.wte, p.wpe)
        magnitude = np.abs(p.wte[p.inp].astype(np.float64)) + np.abs(p.wpe.astype(np.float64))[None, :T]
        all_ok &= _line(compare.within_bound(out, ref, compare.error_bound(dtype, magnitude, 1)),
                        f"forward on {last_backend().name} within one {name} rounding of the float64 reference")
        if xp is not np:
            all_ok &= _line(compare.bitwise_equal(out, encoder_forward(p.inp, p.wte, p.wpe)),
                            "forward: GPU bits == NumPy mirror bits")
        del out, wte, wpe
        p = dataclasses.replace(p, wte=None)  # the backward does not need the embedding table
        rows = np.unique(p.inp)
        untouched = np.ones(V, dtype=bool)
        untouched[rows] = False
        grads = _rows_reference(p, rows)
        methods = [m for m in METHODS.values() if m.takes(dtype)]

        def backward(module, method):
            dwte, dwpe = module.array(p.dwte), module.array(p.dwpe)
            args = (dout, inp) if module is xp else (p.dout, p.inp)
            encoder_backward(dwte, dwpe, *args, seed=seed + 1, method=method.name)
            return dwte, dwpe

        for method in methods:
            dwte, dwpe = backward(xp, method)
            per_add = method.rounds_every_add
            host = to_numpy(dwte)
            ok = compare.within_bound(host[rows], grads.dwte, compare.error_bound(
                dtype, grads.dwte_abs, grads.max_terms, rounding_per_add=per_add))
            ok &= compare.within_bound(dwpe, grads.dwpe, compare.error_bound(
                dtype, grads.dwpe_abs, grads.max_terms, rounding_per_add=per_add))
            ok &= _same_bits(host, p.dwte, untouched)
            del host
            all_ok &= _line(ok, f"backward method={method.name!r}: dwte and dwpe within bound of the float64 reference")
            if method.deterministic:
                again = backward(xp, method)
                all_ok &= _line(_same_bits(dwte, again[0]) and _same_bits(dwpe, again[1]),
                                f"backward method={method.name!r}: two runs bitwise equal")
                del again
                if xp is not np:
                    cpu = backward(np, method)
                    all_ok &= _line(_same_bits(dwte, cpu[0]) and _same_bits(dwpe, cpu[1]),
                                    f"backward method={method.name!r}: GPU bits == NumPy mirror bits")
                    del cpu
            del dwte, dwpe
        table = make_buckets(p.inp, C, dtype)
        print(f"  bucket table: {table.num_buckets} buckets, {table.num_units} chunk units, "
              f"largest bucket {int(table.sizes.max())} positions")
        p = None  # free the tables before the next dtype draws its own
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
