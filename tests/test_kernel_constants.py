"""The Python side restates some #defines of the kernels (block sizes, chunk size, counter slots).
If one side changes without the other, launches and mirrors go wrong silently; this test makes it loud."""

from __future__ import annotations

import re

import pytest

from gpt2enc_edu import layout, loader


def _defines(file_name: str) -> dict[str, int]:
    text = loader.kernel_source(file_name)
    return {name: value for name, value in
            ((m.group(1), m.group(2)) for m in re.finditer(r"^#define\s+(\w+)\s+(\d+)u?\s*$", text, re.M))
            for value in [int(value)]}


@pytest.mark.parametrize("file_name, name, python_value", [
    ("common.cuh", "WARP_SIZE", layout.WARP_SIZE),
    ("encoder_backward_wte_bucketed.cu", "WTE_BLOCK_SIZE", layout.WTE_BLOCK_SIZE),
    ("encoder_backward_wte_chunked.cu", "CHUNK_ITEMS", layout.CHUNK_ITEMS),
    ("encoder_backward_wte_chunked.cu", "CHUNKED_WARPS_PER_BLOCK", layout.CHUNKED_WARPS_PER_BLOCK),
    ("encoder_backward_wte_chunked.cu", "COMBINE_THREADS", layout.COMBINE_THREADS),
    ("encoder_backward_wte_chunked.cu", "COMBINE_STAGE_PACKS", layout.COMBINE_STAGE_PACKS),
    ("encoder_backward_wte_chunked.cu", "COMBINE_MIN_COLUMNS", layout.COMBINE_MIN_COLUMNS),
    ("bucketing.cu", "CHUNK_ITEMS", layout.CHUNK_ITEMS),
    ("bucketing.cu", "BUCKETING_THREADS", layout.BUCKETING_THREADS),
    ("bucketing.cu", "NUM_COUNTERS", layout.NUM_COUNTERS),
    ("bucketing.cu", "COUNTER_NUM_BUCKETS", layout.COUNTER_NUM_BUCKETS),
    ("bucketing.cu", "COUNTER_NUM_UNITS", layout.COUNTER_NUM_UNITS),
    ("bucketing_small.cu", "SMALL_THREADS", layout.SMALL_THREADS),
    ("encoder_backward_small.cu", "SMALL_BACKWARD_THREADS", layout.SMALL_BACKWARD_THREADS),
    ("encoder_backward_small.cu", "SMALL_BACKWARD_MAX_BT", layout.SMALL_BACKWARD_MAX_BT),
    ("encoder_backward_small.cu", "CHUNK_ITEMS", layout.CHUNK_ITEMS),
    ("bucketing_scatter.cu", "SCATTER_THREADS", layout.SCATTER_THREADS),
    ("bucketing_scatter.cu", "SCATTER_SMALL_BLOCK", layout.SCATTER_SMALL_BLOCK),
    ("bucketing_scatter.cu", "SCATTER_MAX_BT", layout.SCATTER_MAX_BT),
    ("bucketing_scatter.cu", "CHUNK_ITEMS", layout.CHUNK_ITEMS),
    ("bucketing_scatter.cu", "COUNTER_NUM_DISTINCT", layout.COUNTER_NUM_DISTINCT),
    ("bucketing_scatter.cu", "COUNTER_MAX_COUNT", layout.COUNTER_MAX_COUNT),
    ("bucketing_scatter.cu", "COUNTER_NUM_BUCKETS", layout.COUNTER_NUM_BUCKETS),
    ("bucketing_scatter.cu", "COUNTER_NUM_UNITS", layout.COUNTER_NUM_UNITS),
    ("bucketing_scatter.cu", "COUNTER_NUM_BIG", layout.COUNTER_NUM_BIG),
    ("bucketing_scatter.cu", "COUNTER_BIG_ITEMS", layout.COUNTER_BIG_ITEMS),
    ("bucketing_scatter.cu", "COUNTER_BIG_UNITS", layout.COUNTER_BIG_UNITS),
    ("encoder_forward.cu", "FORWARD_ROWS", layout.FORWARD_ROWS),
    ("encoder_backward_atomic.cu", "ATOMIC_ROWS", layout.ATOMIC_ROWS),
    ("common.cuh", "NOISE_STREAM_DWTE", 0),
    ("common.cuh", "NOISE_STREAM_DWPE", 1),
])
def test_python_constants_match_kernel_defines(file_name, name, python_value):
    defines = _defines(file_name)
    assert name in defines, f"#define {name} not found in kernels/{file_name}"
    assert defines[name] == python_value, f"kernels/{file_name}: {name} = {defines[name]}, Python says {python_value}"


def test_radix_digits_match():
    defines = _defines("bucketing.cu")
    assert 1 << defines["RADIX_BITS"] == layout.RADIX_DIGITS


def test_noise_streams_match_rounding():
    from gpt2enc_edu import rounding

    defines = _defines("common.cuh")
    assert (defines["NOISE_STREAM_DWTE"], defines["NOISE_STREAM_DWPE"]) == (rounding.NOISE_STREAM_DWTE,
                                                                            rounding.NOISE_STREAM_DWPE)


def test_small_bucketing_constants_match():
    defines = _defines("bucketing_small.cu")
    assert defines["SMALL_KEYS"] == layout.SMALL_KEYS
    assert defines["SMALL_MAX_BT"] == layout.SMALL_MAX_BT == layout.SMALL_THREADS * layout.SMALL_KEYS
    assert 1 << defines["SMALL_POS_BITS"] == layout.SMALL_MAX_BT  # a position fits the key's low bits
    assert defines["SMALL_MAX_V"] == layout.SMALL_MAX_V == 1 << (32 - defines["SMALL_POS_BITS"])  # an id the rest
    assert (layout.SMALL_MAX_BT + 1) << defines["SMALL_FIELD_BITS"] < 2**31  # phase 4's packed scan fits an int
    assert defines["SMALL_CHUNK_ITEMS"] == layout.CHUNK_ITEMS
    for slot in ("NUM_DISTINCT", "MAX_COUNT", "NUM_CLASSES", "NUM_BUCKETS", "NUM_UNITS"):
        assert defines[f"SMALL_COUNTER_{slot}"] == getattr(layout, f"COUNTER_{slot}")


def test_small_backward_constants_match():
    defines = _defines("encoder_backward_small.cu")
    assert defines["SMALL_BACKWARD_MAX_BT"] == layout.SMALL_BACKWARD_THREADS * defines["SMALL_BACKWARD_KEYS"]
    assert 1 << defines["SMALL_BACKWARD_POS_BITS"] == layout.SMALL_BACKWARD_MAX_BT  # a position fits the key
    assert layout.SMALL_MAX_V == 1 << (32 - defines["SMALL_BACKWARD_POS_BITS"])  # and an id the rest (cuda's check)
