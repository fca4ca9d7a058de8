"""The public calls: validate, pick the backend from the arrays, run the kernel or its mirror.

    user call (NumPy or CuPy arrays)
      -> validate  (everything, before anything is written)
      -> dispatch  (NumPy -> mirror.py, CuPy -> cuda.py)
      -> bucket table, for method="bucketed" (buckets.py; the same order on both backends)
      -> kernel | mirror
"""

from __future__ import annotations

import numpy as np

from . import backend, buckets, mirror, validate


def _runner(name: str):
    """The module that runs kernels for backend ``name``, recorded for ``last_backend()``."""
    backend.record(name)
    if name == "cuda":
        from . import cuda

        return cuda
    return mirror


def encoder_forward(inp, wte, wpe, *, out=None, check_ids: bool = True):
    """Token plus position embedding: ``out[b, t, :] = wte[inp[b, t], :] + wpe[t, :]``.

    Parameters
    ----------
    inp : (B, T) int32 array of token ids in ``[0, V)``.
    wte : (V, C) token embedding, ``ml_dtypes.bfloat16`` or ``float32``.
    wpe : (maxT, C) position embedding, same dtype, ``maxT >= T``.
    out : optional (B, T, C) array of that dtype to write into; allocated when omitted.
    check_ids : verify ``0 <= inp < V`` first (a reduction and, on the GPU, a sync).

    Returns ``out``. NumPy arguments run the NumPy mirror, CuPy arguments the CUDA kernel; the result is
    the same bits either way (fp32 add, rounded to nearest).
    """
    dims = validate.forward_args(inp, wte, wpe, out, check_ids)
    run = _runner(dims.backend)
    if out is None:
        xp = np if dims.backend == "numpy" else run._cupy()
        out = xp.empty((dims.B, dims.T, dims.C), dtype=dims.dtype)
    run.encoder_forward(out, inp, wte, wpe, dims.B, dims.T, dims.C)
    return out


def make_buckets(inp, C: int, dtype) -> buckets.BucketTable:
    """The bucket table the deterministic wte kernel consumes, built on the CPU.

    ``inp`` is a (B, T) int32 NumPy array, ``C`` the channel count, ``dtype`` the storage dtype (it sets
    the channel-group width: 256 for bf16, 128 for fp32). See ``gpt2enc_edu.buckets`` for the order.
    """
    validate.bucket_args(inp, C, dtype)
    if backend.is_cupy_array(inp):
        raise TypeError("make_buckets builds the table on the CPU: pass inp as a NumPy array (cupy.asnumpy)")
    return buckets.build_bucket_table(inp, int(C), dtype)


def encoder_backward(dwte, dwpe, dout, inp, *, seed, method: str = "bucketed", check_ids: bool = True) -> None:
    """Accumulate the encoder's gradients in place: ``dwte[inp[b,t]] += dout[b,t]``, ``dwpe[t] += dout[b,t]``.

    Parameters
    ----------
    dwte : (V, C) token-embedding gradient, updated in place (bf16 or fp32).
    dwpe : (maxT, C) position-embedding gradient, updated in place (rows ``T..maxT`` untouched).
    dout : (B, T, C) gradient of the encoder's output, same dtype.
    inp : (B, T) int32 token ids.
    seed : int in ``[0, 2**32)``, the stochastic-rounding seed (use a fresh one every step).
    method : ``"bucketed"`` (deterministic: wpe kernel + bucketed wte kernel, stochastic rounding for
        bf16), ``"atomic"`` (atomicAdd in fp32, rounded back to nearest once: nondeterministic), or
        ``"atomic_bf16"`` (atomicAdd on bf16 itself: nondeterministic and lossy; bf16 only).
    check_ids : verify ``0 <= inp < V`` first.

    The old contents of ``dwte``/``dwpe`` are added to, so gradient accumulation over calls works.
    With ``method="bucketed"`` the result is bitwise reproducible and identical on both backends.
    """
    dims, seed = validate.backward_args(dwte, dwpe, dout, inp, seed, method, check_ids)
    run = _runner(dims.backend)
    B, T, C = dims.B, dims.T, dims.C
    if method == "bucketed":
        run.encoder_backward_wpe(dwpe, dout, B, T, C, seed)
        host_inp = backend.to_numpy(inp)
        table = buckets.build_bucket_table(host_inp, C, dims.dtype)
        run.encoder_backward_wte_bucketed(dwte, table, dout, C, seed)
    else:
        run.encoder_backward_atomic(dwte, dwpe, dout, inp, B, T, C, bf16_atomics=(method == "atomic_bf16"))
