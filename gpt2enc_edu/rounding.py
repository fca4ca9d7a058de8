"""The GPU's float arithmetic and rounding, in NumPy.

Three things decide whether a CPU mirror matches a CUDA kernel bit for bit, and all of them live here so
that every mirror calls the same code:

* ``fadd``: fp32 addition as CuPy compiles it. NVRTC always gets ``-ftz=true``, so the GPU flushes
  subnormal inputs and results of fp32 arithmetic to zero (keeping the sign). NumPy does not, so we do.
* ``squirrel_noise5`` / ``noise_2d``: the stateless integer hash behind stochastic rounding, in wrapping
  uint32 arithmetic exactly as ``kernels/common.cuh`` writes it.
* ``round_to_storage``: fp32 -> storage dtype. bf16 uses stochastic rounding keyed by the element's flat
  index; fp32 is a plain store. ``to_bf16_nearest`` is round-to-nearest-even (``__float2bfloat16_rn``),
  which ml_dtypes implements exactly (only NaN payloads differ: the GPU writes 0x7FFF).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .sources import kernel_constants

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)

#: The second noise coordinate of each gradient tensor (``NOISE_STREAM_*`` in ``kernels/constants.cuh``).
NOISE_STREAM_DWTE = kernel_constants()["NOISE_STREAM_DWTE"]
NOISE_STREAM_DWPE = kernel_constants()["NOISE_STREAM_DWPE"]

_SQ5_BIT_NOISE1 = np.uint32(0xD2A80A3F)
_SQ5_BIT_NOISE2 = np.uint32(0xA884F197)
_SQ5_BIT_NOISE3 = np.uint32(0x6C736F4B)
_SQ5_BIT_NOISE4 = np.uint32(0xB79F3ABB)
_SQ5_BIT_NOISE5 = np.uint32(0x1B56C4F5)
_PRIME_NUMBER = np.uint32(198491317)

_F32_EXPONENT_MASK = np.uint32(0x7F800000)
_F32_SIGN_MASK = np.uint32(0x80000000)


def ftz(x: np.ndarray) -> np.ndarray:
    """Flush fp32 subnormals to zero, keeping the sign, as the GPU does under ``-ftz=true``."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    subnormal = (bits & _F32_EXPONENT_MASK) == 0
    if not subnormal.any():
        return x
    return np.where(subnormal, (bits & _F32_SIGN_MASK).view(np.float32), x)


def fadd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` in fp32 with flush-to-zero on inputs and result: one CUDA ``fadd.ftz.f32``.

    Like the GPU, it is silent on overflow (to Inf) and on Inf - Inf (NaN).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add(ftz(a), ftz(b), dtype=np.float32)
    return ftz(total)


def to_float(x: np.ndarray) -> np.ndarray:
    """Storage dtype -> fp32, the kernels' ``(float)x`` (exact: bf16 is the top half of an fp32)."""
    return np.asarray(x).astype(np.float32)


def to_bf16_nearest(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16, round to nearest even: ``__float2bfloat16_rn``."""
    return np.asarray(x, dtype=np.float32).astype(bfloat16)


def squirrel_noise5(position, seed) -> np.ndarray:
    """SquirrelNoise5 hash of ``position`` under ``seed``, in wrapping uint32 arithmetic (vectorised)."""
    mangled = np.asarray(position, dtype=np.uint32).copy()
    seed = np.uint32(seed)
    with np.errstate(over="ignore"):
        mangled *= _SQ5_BIT_NOISE1
        mangled += seed
        mangled ^= mangled >> np.uint32(9)
        mangled += _SQ5_BIT_NOISE2
        mangled ^= mangled >> np.uint32(11)
        mangled *= _SQ5_BIT_NOISE3
        mangled ^= mangled >> np.uint32(13)
        mangled += _SQ5_BIT_NOISE4
        mangled ^= mangled >> np.uint32(15)
        mangled *= _SQ5_BIT_NOISE5
        mangled ^= mangled >> np.uint32(17)
    return mangled


def noise_2d(x, y, seed) -> np.ndarray:
    """SquirrelNoise5 of a 2-D position ``(x, y)``, folded with a large prime (``noise_2d`` in common.cuh)."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        position = x + _PRIME_NUMBER * np.uint32(y)
    return squirrel_noise5(position, seed)


def stochastic_round_bf16(value: np.ndarray, element, stream: int, seed: int) -> np.ndarray:
    """fp32 -> bf16 with stochastic rounding, bit for bit as ``round_to_storage`` on the GPU.

    ``element`` is each value's flat index in its tensor and ``stream`` names the tensor; together with
    ``seed`` they pick a 16-bit threshold. If the 16 bits that bf16 drops exceed it, they are all set to 1
    (round-to-nearest then rounds up), otherwise cleared (it truncates): the value rounds up with
    probability (dropped bits) / 65536, so on average the rounding error is zero.
    """
    value = np.asarray(value, dtype=np.float32)
    threshold = noise_2d(element, stream, seed) & np.uint32(0xFFFF)
    bits = value.view(np.uint32)
    dropped = bits & np.uint32(0xFFFF)
    bits = np.where(dropped > threshold, bits | np.uint32(0xFFFF), bits & np.uint32(0xFFFF0000))
    return to_bf16_nearest(bits.astype(np.uint32).view(np.float32))


def round_to_storage(value: np.ndarray, dtype, element, stream: int, seed: int) -> np.ndarray:
    """fp32 -> ``dtype``: stochastic rounding for bf16, the value itself for fp32 (``round_to_storage``)."""
    dtype = np.dtype(dtype)
    if dtype == bfloat16:
        return stochastic_round_bf16(value, element, stream, seed)
    if dtype == float32:
        return np.asarray(value, dtype=np.float32)
    raise TypeError(f"round_to_storage: unsupported storage dtype {dtype}")
