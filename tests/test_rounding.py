"""The GPU arithmetic in NumPy: flush-to-zero adds, SquirrelNoise5, stochastic rounding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2enc_edu import rounding
from gpt2enc_edu.rounding import bfloat16


def squirrel_noise5_python(position: int, seed: int) -> int:
    """An independent, scalar, arbitrary-precision transcription (mod 2**32) of SquirrelNoise5."""
    m = position & 0xFFFFFFFF
    m = (m * 0xD2A80A3F) & 0xFFFFFFFF
    m = (m + seed) & 0xFFFFFFFF
    m ^= m >> 9
    m = (m + 0xA884F197) & 0xFFFFFFFF
    m ^= m >> 11
    m = (m * 0x6C736F4B) & 0xFFFFFFFF
    m ^= m >> 13
    m = (m + 0xB79F3ABB) & 0xFFFFFFFF
    m ^= m >> 15
    m = (m * 0x1B56C4F5) & 0xFFFFFFFF
    m ^= m >> 17
    return m


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=16), st.integers(0, 2**32 - 1))
def test_squirrel_noise5_matches_scalar_transcription(positions, seed):
    got = rounding.squirrel_noise5(np.array(positions, dtype=np.uint32), seed)
    assert got.tolist() == [squirrel_noise5_python(p, seed) for p in positions]


def test_noise_2d_folds_with_the_prime():
    x = np.array([0, 1, 2**32 - 1], dtype=np.uint32)
    expected = [squirrel_noise5_python((int(v) + 198491317 * 5) & 0xFFFFFFFF, 9) for v in x]
    assert rounding.noise_2d(x, 5, 9).tolist() == expected


def _f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_fadd_flushes_subnormal_inputs_and_results():
    tiny = _f32([0x00000001, 0x80000001, 0x007FFFFF])  # subnormals
    out = rounding.fadd(tiny, np.zeros(3, np.float32))
    assert out.view(np.uint32).tolist() == [0, 0, 0]  # -subnormal + +0 = +0 after flushing
    # Two normals whose difference is subnormal: the result flushes to a zero of the result's sign.
    a, b = _f32([0x00800001]), _f32([0x80800000])
    assert rounding.fadd(a, b).view(np.uint32).tolist() == [0]
    assert rounding.fadd(-a, -b).view(np.uint32).tolist() == [0x80000000]
    # Normal values are untouched.
    assert rounding.fadd(np.float32([1.5]), np.float32([2.25])).tolist() == [3.75]


def test_stochastic_rounding_by_hand():
    element, stream, seed = np.arange(6, dtype=np.uint32), 0, 1234
    threshold = (rounding.noise_2d(element, stream, seed) & 0xFFFF).astype(np.uint32)
    base = np.uint32(0x3F810000)  # 1.0078125, exactly representable in bf16
    # dropped bits == threshold: not greater, so truncate to base; threshold + 1 (when possible): round up.
    at_threshold = rounding.stochastic_round_bf16(_f32(base | threshold), element, stream, seed)
    assert (at_threshold.view(np.uint16) == 0x3F81).all()
    can_go_up = threshold < 0xFFFF
    above = rounding.stochastic_round_bf16(_f32(base | (threshold + 1)), element, stream, seed)
    assert (above.view(np.uint16)[can_go_up] == 0x3F82).all()
    # Exact bf16 values never move; zero dropped bits can never exceed a threshold.
    exact = rounding.stochastic_round_bf16(_f32(np.full(6, base)), element, stream, seed)
    assert (exact.view(np.uint16) == 0x3F81).all()


def test_stochastic_rounding_keeps_inf_and_nan():
    values = np.array([np.inf, -np.inf, np.nan], dtype=np.float32)
    out = rounding.stochastic_round_bf16(values, np.arange(3), 0, 7).astype(np.float32)
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


def test_stochastic_rounding_is_unbiased():
    # One value a third of the way between two bf16 neighbours, rounded at a million different elements.
    lo = np.float32(1.0)
    step = np.float32(2.0**-7)
    x = np.full(1_000_000, lo + step / np.float32(3), dtype=np.float32)
    rounded = rounding.stochastic_round_bf16(x, np.arange(x.size), 0, 2024).astype(np.float64)
    assert set(np.unique(rounded)) == {1.0, 1.0 + 2.0**-7}
    p_up = (rounded > 1.0).mean()
    expected = float((x[0] - lo) / step)  # exact fraction of the step carried by the dropped bits
    sigma = np.sqrt(expected * (1 - expected) / x.size)
    assert abs(p_up - expected) < 5 * sigma
    # Round to nearest, by contrast, is biased by a third of a step for this value.
    assert rounding.to_bf16_nearest(x[:1]).astype(np.float32)[0] == lo


def test_round_to_storage_fp32_is_identity():
    x = np.random.default_rng().standard_normal(10, dtype=np.float32)
    assert rounding.round_to_storage(x, np.float32, np.arange(10), 0, 1).tobytes() == x.tobytes()


def test_round_to_storage_rejects_other_dtypes():
    with pytest.raises(TypeError):
        rounding.round_to_storage(np.zeros(2, np.float32), np.float16, np.arange(2), 0, 1)


def test_nearest_matches_ml_dtypes_round_half_even():
    # 1 + 2**-8 is exactly halfway between 1 and 1 + 2**-7: ties go to the even mantissa (1.0).
    assert rounding.to_bf16_nearest(np.float32([1 + 2**-8])).view(np.uint16)[0] == 0x3F80
    assert rounding.to_bf16_nearest(np.float32([1 + 3 * 2**-8])).view(np.uint16)[0] == 0x3F82
    assert bfloat16.itemsize == 2
